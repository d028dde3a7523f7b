//! Protobuf's wire format, as the encoder writes it: every field here has a one-byte key.

use prost::encoding::encoded_len_varint;

/// Wire types.
pub(super) const VARINT: u8 = 0;
pub(super) const FIXED64: u8 = 1;
pub(super) const LEN: u8 = 2;

/// `AggregationTemporality`.
pub(super) const DELTA: u64 = 1;
pub(super) const CUMULATIVE: u64 = 2;

pub(super) fn vlen(n: usize) -> usize {
    encoded_len_varint(n as u64)
}

/// Bytes of a length-delimited field (every field here has a one-byte key) of `n` bytes.
pub(super) fn field(n: usize) -> usize {
    1 + vlen(n) + n
}

/// A varint. Here nearly every one is a length or a key of one or two bytes; written inline
/// it costs a few instructions, where prost's `encode_varint` (generic over `BufMut`, not
/// inlined) was a call of about 26 (callgrind: 5.1 M of the 64-GPU request's 23.7 M).
#[inline]
pub(super) fn encode_varint(mut v: u64, buf: &mut Vec<u8>) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

#[inline]
pub(super) fn key(buf: &mut Vec<u8>, number: u8, wire: u8) {
    debug_assert!(number < 16);
    buf.push((number << 3) | wire);
}

#[inline]
pub(super) fn len(buf: &mut Vec<u8>, number: u8, n: usize) {
    key(buf, number, LEN);
    encode_varint(n as u64, buf);
}

#[inline]
pub(super) fn string(buf: &mut Vec<u8>, number: u8, s: &str) {
    len(buf, number, s.len());
    buf.extend_from_slice(s.as_bytes());
}

#[inline]
pub(super) fn fixed64(buf: &mut Vec<u8>, number: u8, v: u64) {
    key(buf, number, FIXED64);
    buf.extend_from_slice(&v.to_le_bytes());
}

#[inline]
pub(super) fn varint(buf: &mut Vec<u8>, number: u8, v: u64) {
    key(buf, number, VARINT);
    encode_varint(v, buf);
}

/// A `KeyValue` with a string `AnyValue`: its bytes.
pub(super) fn key_value_len(k: &str, v: &str) -> usize {
    field(k.len()) + field(field(v.len()))
}

/// Writes a `KeyValue` with a string value as field `number`.
#[inline]
pub(super) fn key_value(buf: &mut Vec<u8>, number: u8, k: &str, v: &str) {
    len(buf, number, key_value_len(k, v));
    string(buf, 1, k);
    len(buf, 2, field(v.len()));
    string(buf, 1, v);
}

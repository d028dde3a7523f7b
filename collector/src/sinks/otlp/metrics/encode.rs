//! The model's view as an OTLP `ExportMetricsServiceRequest`, written straight in protobuf's
//! wire format into a buffer kept across exports, the way the Prometheus sink writes text:
//! no per-series objects, no SDK aggregation tables. One pass adds up every message's
//! length (a length-delimited field's size comes before its bytes), a second writes — the
//! whole request, or (`encode_to`) pieces handed on as they fill, cut between data points.
//!
//! What is written (field numbers from `opentelemetry/proto/metrics/v1/metrics.proto`):
//! one `ResourceMetrics` (the resource, its schema URL) with one `ScopeMetrics` (scope
//! `junction` at this version, the schema URL), one `Metric` per registry metric with
//! samples (name, description, unit; a `Gauge`, or a `Sum` with its temporality and
//! monotonicity), one `NumberDataPoint` per sample (its attributes — `hw.id` first unless the
//! sample has its own, then the sample's, then the GPU's identity where the metric takes it —,
//! start time, time, the value as a double). Non-finite values are left out, as the
//! OpenTelemetry SDK leaves them out.
//!
//! Temporality: cumulative, every series' start time is the sink's start. Delta (counters
//! only, the SDK's rule): a counter's point is its increase since the previous export (its
//! whole value the first time; after a reset, the new value), and gauges' and counters'
//! start time is the previous export's time; up-down counters stay cumulative. What delta
//! keeps per series (the last value, by a hash of metric and attributes) holds only the
//! series of the last export.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use prost::encoding::encoded_len_varint;

use crate::model::registry::Kind;
use crate::model::view::{View, names_identity};
use crate::model::{REGISTRY, Sample};

/// Wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;

/// `AggregationTemporality`.
const DELTA: u64 = 1;
const CUMULATIVE: u64 = 2;

fn vlen(n: usize) -> usize {
    encoded_len_varint(n as u64)
}

/// Bytes of a length-delimited field (every field here has a one-byte key) of `n` bytes.
fn field(n: usize) -> usize {
    1 + vlen(n) + n
}

/// A varint. Here nearly every one is a length or a key of one or two bytes; written inline
/// it costs a few instructions, where prost's `encode_varint` (generic over `BufMut`, not
/// inlined) was a call of about 26 (callgrind: 5.1 M of the 64-GPU request's 23.7 M).
#[inline]
fn encode_varint(mut v: u64, buf: &mut Vec<u8>) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

#[inline]
fn key(buf: &mut Vec<u8>, number: u8, wire: u8) {
    debug_assert!(number < 16);
    buf.push((number << 3) | wire);
}

#[inline]
fn len(buf: &mut Vec<u8>, number: u8, n: usize) {
    key(buf, number, LEN);
    encode_varint(n as u64, buf);
}

#[inline]
fn string(buf: &mut Vec<u8>, number: u8, s: &str) {
    len(buf, number, s.len());
    buf.extend_from_slice(s.as_bytes());
}

#[inline]
fn fixed64(buf: &mut Vec<u8>, number: u8, v: u64) {
    key(buf, number, FIXED64);
    buf.extend_from_slice(&v.to_le_bytes());
}

#[inline]
fn varint(buf: &mut Vec<u8>, number: u8, v: u64) {
    key(buf, number, VARINT);
    encode_varint(v, buf);
}

/// A `KeyValue` with a string `AnyValue`: its bytes.
fn key_value_len(k: &str, v: &str) -> usize {
    field(k.len()) + field(field(v.len()))
}

/// Writes a `KeyValue` with a string value as field `number`.
#[inline]
fn key_value(buf: &mut Vec<u8>, number: u8, k: &str, v: &str) {
    len(buf, number, key_value_len(k, v));
    string(buf, 1, k);
    len(buf, 2, field(v.len()));
    string(buf, 1, v);
}

/// Whether a sample on GPU `gpu` carries `hw.id = gpu` (first): it has a GPU and no `hw.id`
/// of its own.
fn takes_hw_id(gpu: &str, s: &Sample) -> bool {
    !gpu.is_empty() && s.attr("hw.id").is_none()
}

/// The attributes of a sample of metric `i` on GPU `gpu` after `hw.id`: its own, then the
/// GPU's identity where the metric takes it.
fn attributes_after_hw_id<'a>(
    view: &View<'a>,
    i: usize,
    gpu: &'a str,
    s: &'a Sample,
) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
    own_then(view.extra(i, gpu, s), s)
}

/// A sample's own attributes, then those of `extra` (the GPU's identity) it does not name.
fn own_then<'a>(
    extra: &'a [(&'static str, crate::model::AttrValue)],
    s: &'a Sample,
) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
    s.attrs.iter().map(|(k, v)| (*k, v.as_ref())).chain(
        extra
            .iter()
            .filter(move |(k, _)| s.attr(k).is_none())
            .map(|(k, v)| (*k, v.as_ref())),
    )
}

/// The attributes of a sample of metric `i` on GPU `gpu`, in the order both sinks use.
fn attributes<'a>(
    view: &View<'a>,
    i: usize,
    gpu: &'a str,
    s: &'a Sample,
) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
    let hw = takes_hw_id(gpu, s).then_some(("hw.id", gpu));
    hw.into_iter()
        .chain(attributes_after_hw_id(view, i, gpu, s))
}

/// Slots of [`HwIds`].
const HW_SLOTS: usize = 128;

/// The `KeyValue` `hw.id = GPU` as written, per GPU: nearly every point carries one (16 576
/// of the 64-GPU node's 16 591), the same bytes for every point of a GPU, so each is
/// written once per export and copied after. Direct-mapped on the address of the view's
/// GPU string, which stays put for one export; emptied before the next.
struct HwIds {
    /// Per slot: the string's address and length, and where its bytes are in `bytes`.
    slots: [(usize, usize, usize, usize); HW_SLOTS],
    bytes: Vec<u8>,
}

impl HwIds {
    fn new() -> Self {
        Self {
            slots: [(0, 0, 0, 0); HW_SLOTS],
            bytes: Vec::new(),
        }
    }

    fn clear(&mut self) {
        self.slots = [(0, 0, 0, 0); HW_SLOTS];
        self.bytes.clear();
    }

    /// Appends `hw.id = gpu` as field 7 of a `NumberDataPoint` to `buf`.
    fn write(&mut self, buf: &mut Vec<u8>, gpu: &str) {
        let at = gpu.as_ptr() as usize;
        // Fibonacci hashing of the address: its top 7 bits.
        let slot = (at.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (usize::BITS - 7)) % HW_SLOTS;
        let (a, n, from, to) = self.slots[slot];
        if a == at && n == gpu.len() {
            buf.extend_from_slice(&self.bytes[from..to]);
            return;
        }
        let from = self.bytes.len();
        key_value(&mut self.bytes, 7, "hw.id", gpu);
        let to = self.bytes.len();
        self.slots[slot] = (at, gpu.len(), from, to);
        buf.extend_from_slice(&self.bytes[from..to]);
    }
}

/// A `NumberDataPoint`'s start time (when set), time and value.
fn times_len(start: u64) -> usize {
    (if start > 0 { 9 } else { 0 }) + 9 + 9
}

/// Each GPU's identity attributes as written (`KeyValue`s as field 7 of a `NumberDataPoint`),
/// once per export (the same bytes on every point of a GPU; callgrind, 8-GPU node: the
/// encode 2.16 -> 2.12 M instructions an export). Keyed by the address of the view's identity
/// slice, which stays put for one export; emptied before the next.
struct Identities {
    /// Per GPU seen: the slice's address, and where its bytes are in `bytes`.
    at: Vec<(usize, usize, usize)>,
    last: usize,
    bytes: Vec<u8>,
}

impl Identities {
    fn new() -> Self {
        Self {
            at: Vec::new(),
            last: 0,
            bytes: Vec::new(),
        }
    }

    fn clear(&mut self) {
        self.at.clear();
        self.last = 0;
        self.bytes.clear();
    }

    /// The bytes of the identity numbered `i` by [`Identities::index`].
    fn bytes(&self, i: u32) -> &[u8] {
        let (_, from, to) = self.at[i as usize];
        &self.bytes[from..to]
    }

    /// The number under which `attrs`' bytes are kept (written on first use).
    fn index(&mut self, attrs: &[(&'static str, crate::model::AttrValue)]) -> u32 {
        let key = attrs.as_ptr() as usize;
        let i = match self.at.get(self.last) {
            Some((k, _, _)) if *k == key => self.last,
            _ => match self.at.iter().position(|(k, _, _)| *k == key) {
                Some(i) => i,
                None => {
                    let from = self.bytes.len();
                    for (k, v) in attrs {
                        key_value(&mut self.bytes, 7, k, v);
                    }
                    self.at.push((key, from, self.bytes.len()));
                    self.at.len() - 1
                }
            },
        };
        self.last = i;
        i as u32
    }
}

/// At most this many constant attributes are kept (a few hundred: enum values, link and fan
/// indices); past it, attributes are written as any other.
const MAX_STATIC_ATTRIBUTES: usize = 4096;

/// The `KeyValue`s (field 7 of a `NumberDataPoint`) whose key and value are both
/// `&'static str`s (an enum value, an index name) as written, kept for the process: copied
/// instead of written field by field on every point (the Prometheus sink keeps their text
/// the same way).
struct Statics {
    /// By the key's and the value's address and length: where the bytes are in `bytes`.
    at: HashMap<(usize, usize, usize, usize), (u32, u32), foldhash::fast::FixedState>,
    bytes: Vec<u8>,
}

impl Statics {
    fn new() -> Self {
        Self {
            at: HashMap::with_hasher(foldhash::fast::FixedState::with_seed(0)),
            bytes: Vec::new(),
        }
    }

    /// Appends the attribute `k = v` as field 7 to `buf`.
    #[inline]
    fn write(&mut self, buf: &mut Vec<u8>, k: &'static str, v: &crate::model::AttrValue) {
        let std::borrow::Cow::Borrowed(v) = v else {
            key_value(buf, 7, k, v);
            return;
        };
        let id = (k.as_ptr() as usize, k.len(), v.as_ptr() as usize, v.len());
        let (from, to) = match self.at.get(&id) {
            Some(&(from, to)) => (from as usize, to as usize),
            None if self.at.len() >= MAX_STATIC_ATTRIBUTES => {
                key_value(buf, 7, k, v);
                return;
            }
            None => {
                let from = self.bytes.len();
                key_value(&mut self.bytes, 7, k, v);
                let to = self.bytes.len();
                self.at.insert(id, (from as u32, to as u32));
                (from, to)
            }
        };
        buf.extend_from_slice(&self.bytes[from..to]);
    }
}

/// A sample as pass 1 measured it, for pass 2.
#[derive(Clone, Copy)]
struct Point {
    /// Bytes of its `NumberDataPoint` (0: left out, its value not finite).
    n: u32,
    /// Whether it carries `hw.id` = its GPU first.
    hw_id: bool,
    /// After its own attributes: [`NO_IDENTITY`], [`SOME_IDENTITY`] (the GPU's identity
    /// attributes the sample does not name itself, written one by one), or the number of the
    /// GPU's whole identity in [`Identities`].
    identity: u32,
}

/// [`Point::identity`]: nothing after the sample's own attributes.
const NO_IDENTITY: u32 = u32::MAX;
/// [`Point::identity`]: the identity attributes the sample does not name.
const SOME_IDENTITY: u32 = u32::MAX - 1;

/// What a request is made of: the resource's attributes and schema URL, the scope.
pub struct Envelope {
    /// The resource's attributes (all strings).
    pub resource: Vec<(String, String)>,
    /// The schema URL, on the resource and on the scope.
    pub schema_url: String,
    /// The scope's name and version.
    pub scope: (String, String),
}

/// Writes requests, keeping its buffers (and for delta, each series' last value) between
/// exports.
pub struct Encoder {
    envelope: Envelope,
    delta: bool,
    /// When the sink started (Unix ns): cumulative series start here.
    start_ns: u64,
    /// The previous export's time (delta: where the next points start).
    last_ns: u64,
    /// Delta: each counter series' last value and the export that last saw it.
    previous: HashMap<u64, (f64, u64)>,
    generation: u64,
    /// Per metric of the view: (registry index, bytes of its `Metric` message, bytes of its
    /// data points).
    metrics: Vec<(usize, usize, usize)>,
    /// Per sample of the view, what pass 1 found (pass 2 writes from it).
    points: Vec<Point>,
    /// Each GPU's `hw.id` attribute, written once per export.
    hw_ids: HwIds,
    /// Each GPU's identity attributes, written once per export.
    identities: Identities,
    /// Constant attributes, written once for the process.
    statics: Statics,
    buf: Vec<u8>,
}

impl Encoder {
    /// An encoder for the sink started at `start_ns`.
    pub fn new(envelope: Envelope, delta: bool, start_ns: u64) -> Self {
        Self {
            envelope,
            delta,
            start_ns,
            last_ns: start_ns,
            previous: HashMap::new(),
            generation: 0,
            metrics: Vec::new(),
            points: Vec::new(),
            hw_ids: HwIds::new(),
            identities: Identities::new(),
            statics: Statics::new(),
            buf: Vec::new(),
        }
    }

    /// Series whose last value delta keeps (0 for cumulative).
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.previous.len()
    }

    /// Start time of a point of a metric of `kind`.
    fn start(&self, kind: Kind) -> u64 {
        if self.delta && kind != Kind::UpDownCounter {
            self.last_ns
        } else {
            self.start_ns
        }
    }

    /// The request for `view` at `now_ns` (Unix ns) and the number of data points in it; the
    /// bytes stay valid until the next call.
    pub fn encode(&mut self, view: &View<'_>, now_ns: u64) -> (&[u8], usize) {
        let count = self.write(view, now_ns, usize::MAX, &mut |_| {});
        (&self.buf, count)
    }

    /// The request for `view` at `now_ns` as a buffer of its own (the one the encoder keeps,
    /// lent: give it back with [`Encoder::give_back`] once sent) and the number of data
    /// points in it.
    pub fn encode_owned(&mut self, view: &View<'_>, now_ns: u64) -> (Vec<u8>, usize) {
        let count = self.write(view, now_ns, usize::MAX, &mut |_| {});
        (std::mem::take(&mut self.buf), count)
    }

    /// Takes back the buffer [`Encoder::encode_owned`] lent, when nothing else holds it
    /// (else the next request gets a new one).
    pub fn give_back(&mut self, sent: bytes::Bytes) {
        if let Ok(b) = sent.try_into_mut() {
            self.buf = b.into();
        }
    }

    /// The request for `view` at `now_ns` handed to `out` in pieces of about `piece` bytes
    /// (cut between data points), in order; the number of data points in it. The buffer kept
    /// between exports holds one piece, not the whole request (the 64-GPU node's is 2.4 MB):
    /// OTLP/HTTP with gzip compresses the pieces as they come.
    pub fn encode_to(
        &mut self,
        view: &View<'_>,
        now_ns: u64,
        piece: usize,
        out: &mut dyn FnMut(&[u8]),
    ) -> usize {
        let count = self.write(view, now_ns, piece.max(1), out);
        if !self.buf.is_empty() {
            out(&self.buf);
            self.buf.clear();
        }
        count
    }

    /// Both passes; pass 2 hands `buf` to `out` whenever it holds `piece` bytes or more, and
    /// leaves the rest in it.
    fn write(
        &mut self,
        view: &View<'_>,
        now_ns: u64,
        piece: usize,
        out: &mut dyn FnMut(&[u8]),
    ) -> usize {
        self.generation += 1;
        self.hw_ids.clear();
        self.identities.clear();
        self.metrics.clear();
        self.points.clear();
        // Pass 1: lengths.
        let mut scope_metrics = 0usize;
        let mut count = 0usize;
        for (i, samples) in view.iter() {
            let d = &REGISTRY[i];
            let start = self.start(d.kind);
            let mut data = 0usize;
            for (gpu, s) in samples {
                if !s.value.is_finite() {
                    self.points.push(Point {
                        n: 0,
                        hw_id: false,
                        identity: NO_IDENTITY,
                    });
                    continue;
                }
                let own_id = s.attr("hw.id").is_some();
                let hw_id = !gpu.is_empty() && !own_id;
                let extra = if own_id {
                    &[][..]
                } else {
                    view.identity_of(i, gpu)
                };
                let mut n: usize = s
                    .attrs
                    .iter()
                    .map(|(k, v)| field(key_value_len(k, v)))
                    .sum();
                if hw_id {
                    n += field(key_value_len("hw.id", gpu));
                }
                let identity = if extra.is_empty() {
                    NO_IDENTITY
                } else if !names_identity(s) {
                    // The GPU's identity, the same bytes on each of its points: measured once.
                    let at = self.identities.index(extra);
                    n += self.identities.bytes(at).len();
                    at
                } else {
                    n += extra
                        .iter()
                        .filter(|(k, _)| s.attr(k).is_none())
                        .map(|(k, v)| field(key_value_len(k, v)))
                        .sum::<usize>();
                    SOME_IDENTITY
                };
                n += times_len(start);
                self.points.push(Point {
                    n: u32::try_from(n).unwrap_or(u32::MAX),
                    hw_id,
                    identity,
                });
                data += field(n);
                count += 1;
            }
            if data == 0 {
                continue;
            }
            // Gauge { data_points = 1 } / Sum { data_points = 1, temporality = 2, monotonic = 3 }.
            let body = match d.kind {
                Kind::Gauge => data,
                Kind::Counter => data + 2 + 2,
                Kind::UpDownCounter => data + 2,
            };
            let m = field(d.name.len()) + field(d.help.len()) + field(d.unit.len()) + field(body);
            self.metrics.push((i, m, data));
            scope_metrics += field(m);
        }
        let (scope_name, scope_version) = &self.envelope.scope;
        let scope = field(scope_name.len()) + field(scope_version.len());
        let scope_metrics = field(scope) + scope_metrics + field(self.envelope.schema_url.len());
        let resource: usize = self
            .envelope
            .resource
            .iter()
            .map(|(k, v)| field(key_value_len(k, v)))
            .sum();
        let resource_metrics =
            field(resource) + field(scope_metrics) + field(self.envelope.schema_url.len());
        // Pass 2: bytes.
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        buf.reserve(field(resource_metrics).min(piece.saturating_add(4096)));
        // Bytes handed to `out` so far.
        let mut handed = 0usize;
        len(&mut buf, 1, resource_metrics);
        len(&mut buf, 1, resource);
        for (k, v) in &self.envelope.resource {
            key_value(&mut buf, 1, k, v);
        }
        len(&mut buf, 2, scope_metrics);
        len(&mut buf, 1, scope);
        string(&mut buf, 1, scope_name);
        string(&mut buf, 2, scope_version);
        let mut next_metric = 0usize;
        let mut p = 0usize;
        let points = std::mem::take(&mut self.points);
        for (i, samples) in view.iter() {
            let sizes = &points[p..p + samples.len()];
            p += samples.len();
            let Some(&(mi, m, data)) = self.metrics.get(next_metric).filter(|(mi, _, _)| *mi == i)
            else {
                continue;
            };
            next_metric += 1;
            let d = &REGISTRY[mi];
            let start = self.start(d.kind);
            len(&mut buf, 2, m);
            string(&mut buf, 1, d.name);
            string(&mut buf, 2, d.help);
            string(&mut buf, 3, d.unit);
            match d.kind {
                Kind::Gauge => len(&mut buf, 5, data),
                Kind::Counter => len(&mut buf, 7, data + 4),
                Kind::UpDownCounter => len(&mut buf, 7, data + 2),
            }
            for ((gpu, s), p) in samples.iter().zip(sizes) {
                if p.n == 0 {
                    continue;
                }
                let value = if self.delta && d.kind == Kind::Counter {
                    self.delta_of(view, i, gpu, s)
                } else {
                    s.value
                };
                len(&mut buf, 1, p.n as usize);
                if p.hw_id {
                    self.hw_ids.write(&mut buf, gpu);
                }
                for (k, v) in &s.attrs {
                    self.statics.write(&mut buf, k, v);
                }
                match p.identity {
                    NO_IDENTITY => {}
                    SOME_IDENTITY => {
                        for (k, v) in view.identity_of(i, gpu) {
                            if s.attr(k).is_none() {
                                key_value(&mut buf, 7, k, v);
                            }
                        }
                    }
                    at => buf.extend_from_slice(self.identities.bytes(at)),
                }
                if start > 0 {
                    fixed64(&mut buf, 2, start);
                }
                fixed64(&mut buf, 3, now_ns);
                fixed64(&mut buf, 4, value.to_bits());
                if buf.len() >= piece {
                    out(&buf);
                    handed += buf.len();
                    buf.clear();
                }
            }
            match d.kind {
                Kind::Gauge => {}
                Kind::Counter => {
                    varint(&mut buf, 2, if self.delta { DELTA } else { CUMULATIVE });
                    varint(&mut buf, 3, 1);
                }
                Kind::UpDownCounter => varint(&mut buf, 2, CUMULATIVE),
            }
        }
        self.points = points;
        // ScopeMetrics.schema_url, then ResourceMetrics.schema_url.
        string(&mut buf, 3, &self.envelope.schema_url);
        string(&mut buf, 3, &self.envelope.schema_url);
        debug_assert_eq!(
            handed + buf.len(),
            field(resource_metrics),
            "lengths agree with bytes"
        );
        if self.delta {
            let g = self.generation;
            self.previous.retain(|_, (_, seen)| *seen == g);
        }
        self.last_ns = now_ns;
        self.buf = buf;
        count
    }

    /// A counter's increase since the previous export (its value the first time, and after
    /// the counter went back, as on a driver reload).
    fn delta_of(&mut self, view: &View<'_>, i: usize, gpu: &str, s: &Sample) -> f64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        i.hash(&mut h);
        for (k, v) in attributes(view, i, gpu, s) {
            k.hash(&mut h);
            v.hash(&mut h);
        }
        let slot = self
            .previous
            .entry(h.finish())
            .or_insert((f64::NAN, self.generation));
        let prev = slot.0;
        *slot = (s.value, self.generation);
        if prev.is_finite() && s.value >= prev {
            s.value - prev
        } else {
            s.value
        }
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

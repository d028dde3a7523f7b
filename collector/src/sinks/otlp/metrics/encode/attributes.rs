//! A data point's attributes: which, in the order both sinks write them, and the bytes of
//! those that repeat (a GPU's `hw.id` and identity, constant attributes), written once and
//! copied onto each point.

use std::collections::HashMap;

use super::wire::key_value;
use crate::model::Sample;
use crate::model::view::View;

/// Whether a sample on GPU `gpu` carries `hw.id = gpu` (first): it has a GPU and no `hw.id`
/// of its own.
pub(super) fn takes_hw_id(gpu: &str, s: &Sample) -> bool {
    !gpu.is_empty() && s.attr("hw.id").is_none()
}

/// The attributes of a sample of metric `i` on GPU `gpu` after `hw.id`: its own, then the
/// GPU's identity where the metric takes it.
pub(super) fn attributes_after_hw_id<'a>(
    view: &View<'a>,
    i: usize,
    gpu: &'a str,
    s: &'a Sample,
) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
    own_then(view.extra(i, gpu, s), s)
}

/// A sample's own attributes, then those of `extra` (the GPU's identity) it does not name.
pub(super) fn own_then<'a>(
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
pub(super) fn attributes<'a>(
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
pub(super) struct HwIds {
    /// Per slot: the string's address and length, and where its bytes are in `bytes`.
    slots: [(usize, usize, usize, usize); HW_SLOTS],
    bytes: Vec<u8>,
}

impl HwIds {
    pub(super) fn new() -> Self {
        Self {
            slots: [(0, 0, 0, 0); HW_SLOTS],
            bytes: Vec::new(),
        }
    }

    pub(super) fn clear(&mut self) {
        self.slots = [(0, 0, 0, 0); HW_SLOTS];
        self.bytes.clear();
    }

    /// Appends `hw.id = gpu` as field 7 of a `NumberDataPoint` to `buf`.
    pub(super) fn write(&mut self, buf: &mut Vec<u8>, gpu: &str) {
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

/// Each GPU's identity attributes as written (`KeyValue`s as field 7 of a `NumberDataPoint`),
/// once per export (the same bytes on every point of a GPU; callgrind, 8-GPU node: the
/// encode 2.16 -> 2.12 M instructions an export). Keyed by the address of the view's identity
/// slice, which stays put for one export; emptied before the next.
pub(super) struct Identities {
    /// Per GPU seen: the slice's address, and where its bytes are in `bytes`.
    at: Vec<(usize, usize, usize)>,
    last: usize,
    bytes: Vec<u8>,
}

impl Identities {
    pub(super) fn new() -> Self {
        Self {
            at: Vec::new(),
            last: 0,
            bytes: Vec::new(),
        }
    }

    pub(super) fn clear(&mut self) {
        self.at.clear();
        self.last = 0;
        self.bytes.clear();
    }

    /// The bytes of the identity numbered `i` by [`Identities::index`].
    pub(super) fn bytes(&self, i: u32) -> &[u8] {
        let (_, from, to) = self.at[i as usize];
        &self.bytes[from..to]
    }

    /// The number under which `attrs`' bytes are kept (written on first use).
    pub(super) fn index(&mut self, attrs: &[(&'static str, crate::model::AttrValue)]) -> u32 {
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
pub(super) const MAX_STATIC_ATTRIBUTES: usize = 4096;

/// The `KeyValue`s (field 7 of a `NumberDataPoint`) whose key and value are both
/// `&'static str`s (an enum value, an index name) as written, kept for the process: copied
/// instead of written field by field on every point (the Prometheus sink keeps their text
/// the same way).
pub(super) struct Statics {
    /// By the key's and the value's address and length: where the bytes are in `bytes`.
    at: HashMap<(usize, usize, usize, usize), (u32, u32), foldhash::fast::FixedState>,
    bytes: Vec<u8>,
}

impl Statics {
    pub(super) fn new() -> Self {
        Self {
            at: HashMap::with_hasher(foldhash::fast::FixedState::with_seed(0)),
            bytes: Vec::new(),
        }
    }

    /// How many are kept.
    #[cfg(test)]
    pub(super) fn kept(&self) -> usize {
        self.at.len()
    }

    /// Appends the attribute `k = v` as field 7 to `buf`.
    #[inline]
    pub(super) fn write(
        &mut self,
        buf: &mut Vec<u8>,
        k: &'static str,
        v: &crate::model::AttrValue,
    ) {
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

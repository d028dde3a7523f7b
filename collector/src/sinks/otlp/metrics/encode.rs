//! The model's view as an OTLP `ExportMetricsServiceRequest`, written straight in protobuf's
//! wire format into buffers kept across exports, the way the Prometheus sink writes text: no
//! per-series objects, no SDK aggregation tables. One pass over the samples writes each data
//! point (its length is added up from its parts just before its bytes) into a body, metric
//! after metric; then the envelope and each metric's header and end (whose lengths need the
//! points' total) go around them — handed on in pieces (`encode_to`: the envelope and a
//! header, a metric's points, its end and the next header, ...), or put in place around the
//! points in the same buffer (`encode`).
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
//! series of the last export, but for series that outlive the host's boot ([`outlives_boot`]),
//! whose last values are kept whether seen or not, for `resume.rs` to keep across reboots.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use prost::encoding::encoded_len_varint;

use crate::model::registry::Kind;
use crate::model::view::{View, names_identity};
use crate::model::{Metric, REGISTRY, Sample};

/// Series that outlive the boot whose last values an encoder keeps, at most: a node has a
/// few hundred (two lifetime ECC counts a GPU, a BMC's energy counters).
pub(super) const MAX_LASTING: usize = 4096;

/// Of [`MAX_LASTING`], the slots only GPUs' lifetime ECC series take: a BMC's counters (up to
/// 4,096 readings a target) cannot crowd them out (a node's GPUs have a few hundred at most).
pub(super) const LIFETIME_RESERVE: usize = 1024;

/// Whether a counter series goes on counting across the host's reboot, so that its whole
/// value after a reboot was reported before it: a GPU's lifetime ECC count (kept in its
/// InfoROM) and a BMC's counters (`junction.target`: energy a BMC counts while the host
/// reboots; not Junction's own counts of its polls of a BMC). The driver's, the kernel's and
/// the NICs' counters start again at a boot.
pub(super) fn outlives_boot(s: &Sample) -> bool {
    s.metric == Metric::EccErrorsLifetime
        || (s.attr("junction.target").is_some()
            && !counted_by_the_agent(REGISTRY[s.metric as usize].name))
}

/// Whether a counter is counted by Junction itself from the agent's start (its own telemetry,
/// the eBPF probes' counts, the daemon restarts it saw), as against the hardware's counters
/// (the driver's since it loaded, the kernel's and the NICs' since the boot, the XIDs and
/// kernel signatures of this boot, which the kernel-log source keeps across restarts).
pub(super) fn counted_by_the_agent(name: &str) -> bool {
    name.starts_with("junction.")
        || name.starts_with("gpu.process.driver.")
        || name == "node.daemon.restarts"
}

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

/// One metric of the request as the pass over its samples left it.
struct Written {
    /// Its registry index.
    i: usize,
    /// Where its data points' bytes are in the body.
    from: usize,
    to: usize,
    /// Bytes of its `Metric` message.
    m: usize,
}

/// Bytes of the `Gauge` or `Sum` message of a metric of `kind` around `data` bytes of data
/// points: `Gauge { data_points = 1 }`, `Sum { data_points = 1, temporality = 2, monotonic =
/// 3 }`.
fn data_len(kind: Kind, data: usize) -> usize {
    match kind {
        Kind::Gauge => data,
        Kind::Counter => data + 2 + 2,
        Kind::UpDownCounter => data + 2,
    }
}

/// Bytes of the messages around the metrics (see [`Encoder::sizes`]).
struct Sizes {
    resource: usize,
    scope: usize,
    scope_metrics: usize,
    resource_metrics: usize,
}

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
    /// When the sink started (Unix ns): cumulative gauges and up-down counters start here.
    start_ns: u64,
    /// Where cumulative counters start (Unix ns): the agent's start for those it counts
    /// itself, the boot for the hardware's ([`Encoder::set_origins`]); those that outlive a
    /// boot have no start time (unknown).
    agent_ns: u64,
    boot_ns: u64,
    /// The previous export's time (delta: where the next points start).
    last_ns: u64,
    /// Delta: each counter series' last value and the export that last saw it.
    previous: HashMap<u64, (f64, u64)>,
    generation: u64,
    /// Delta: the last value of each series that outlives a boot ([`outlives_boot`]), kept
    /// whether the last export had it or not (up to [`MAX_LASTING`]), and whether one changed
    /// since [`Encoder::lasting_changed`] last said so.
    lasting: HashMap<u64, f64>,
    lasting_changed: bool,
    /// The metrics of the last request, in order.
    metrics: Vec<Written>,
    /// Each GPU's `hw.id` attribute, written once per export.
    hw_ids: HwIds,
    /// Each GPU's identity attributes, written once per export.
    identities: Identities,
    /// Constant attributes, written once for the process.
    statics: Statics,
    /// The data points of every metric, one after the other; made the whole request in place
    /// where it is asked for whole.
    body: Vec<u8>,
    /// The last request's data points, in bytes: what the body is sized for.
    last_len: usize,
    /// The envelope and the metrics' headers and ends, as they are handed on.
    head: Vec<u8>,
}

impl Encoder {
    /// An encoder for the sink started at `start_ns`.
    pub fn new(envelope: Envelope, delta: bool, start_ns: u64) -> Self {
        Self {
            envelope,
            delta,
            start_ns,
            agent_ns: start_ns,
            boot_ns: start_ns,
            last_ns: start_ns,
            previous: HashMap::new(),
            generation: 0,
            lasting: HashMap::new(),
            lasting_changed: false,
            metrics: Vec::new(),
            hw_ids: HwIds::new(),
            identities: Identities::new(),
            statics: Statics::new(),
            body: Vec::new(),
            last_len: 0,
            head: Vec::new(),
        }
    }

    /// Where cumulative counters start: `agent_ns` for those Junction counts itself, `boot_ns`
    /// for the hardware's (both the sink's start until this is called, and never later).
    /// A backend that takes the start time as the counter's (Prometheus' created-timestamp
    /// ingestion, the Collector's `cumulativetodelta`) sees the hardware's counters go on
    /// across restarts of the agent rather than start again from zero with their whole value.
    pub fn set_origins(&mut self, agent_ns: u64, boot_ns: Option<u64>) {
        self.agent_ns = agent_ns.min(self.start_ns);
        self.boot_ns = boot_ns.unwrap_or(self.agent_ns).min(self.agent_ns);
    }

    /// The start time of a cumulative point of the hardware's counter `s`: none (0) for a
    /// series that outlives a boot (a BMC's), whose start is not known.
    fn origin(&self, s: &Sample) -> u64 {
        if outlives_boot(s) { 0 } else { self.boot_ns }
    }

    /// Series whose last value delta keeps (0 for cumulative).
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.previous.len()
    }

    /// With delta temporality: the last export's time and each counter series' last value
    /// (by the hash [`Encoder::delta_of`] keys it by), for a restart to go on from.
    pub fn delta_state(&self) -> Option<(u64, Vec<(u64, f64)>)> {
        self.delta.then(|| {
            let series = self
                .previous
                .iter()
                .filter(|(_, (v, _))| v.is_finite())
                .map(|(h, (v, _))| (*h, *v))
                .collect();
            (self.last_ns, series)
        })
    }

    /// With delta temporality, goes on from a stopped encoder's [`Encoder::delta_state`]:
    /// the first export's counters report their increase since that encoder's last export,
    /// and its points start at that export's time (a series it did not have reports its
    /// whole value, as at any start). Nothing happens with cumulative temporality, or for a
    /// state from the future (a clock set back since: the sink's start is used). Whether it
    /// went on.
    pub fn resume(&mut self, last_ns: u64, series: &[(u64, f64)]) -> bool {
        if !self.delta || last_ns > self.start_ns {
            return false;
        }
        self.last_ns = last_ns;
        self.previous = series
            .iter()
            .map(|&(h, v)| (h, (v, self.generation)))
            .collect();
        true
    }

    /// With delta temporality, takes the last values of series that outlive a boot (a state
    /// kept across reboots: [`Encoder::lasting_changed`]): such a series with no value of its
    /// own in this encoder (none since its start or [`Encoder::resume`], or gone from the
    /// last export) reports its increase since that value (its whole value where it went
    /// back), not its whole value. At most [`MAX_LASTING`] are taken. How many were taken.
    pub fn prime_lasting(&mut self, series: &[(u64, f64)]) -> usize {
        if !self.delta {
            return 0;
        }
        let mut n = 0;
        for &(h, v) in series.iter().filter(|(_, v)| v.is_finite()) {
            if self.lasting.len() >= MAX_LASTING {
                break;
            }
            self.lasting.insert(h, v);
            n += 1;
        }
        n
    }

    /// The last values of the series that outlive a boot, when one has changed (or was first
    /// seen) since the last call; `None` when none has, and with cumulative temporality.
    pub fn lasting_changed(&mut self) -> Option<Vec<(u64, f64)>> {
        if !std::mem::take(&mut self.lasting_changed) {
            return None;
        }
        Some(self.lasting.iter().map(|(h, v)| (*h, *v)).collect())
    }

    /// Notes a series' value where it outlives a boot.
    fn note_lasting(&mut self, key: u64, value: f64, lifetime: bool) {
        let bound = if lifetime {
            MAX_LASTING
        } else {
            MAX_LASTING - LIFETIME_RESERVE
        };
        let full = self.lasting.len() >= bound;
        match self.lasting.entry(key) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                if e.get().to_bits() != value.to_bits() {
                    e.insert(value);
                    self.lasting_changed = true;
                }
            }
            std::collections::hash_map::Entry::Vacant(e) if !full => {
                e.insert(value);
                self.lasting_changed = true;
            }
            std::collections::hash_map::Entry::Vacant(_) => {}
        }
    }

    /// Start time of a point of a metric of `kind` (a cumulative counter's: [`Encoder::origin`]).
    /// None (0) for a gauge: OTLP ignores `start_time_unix_nano` on a gauge's points
    /// (`metrics.proto`, `Gauge`), and leaving it out saves 9 of a point's bytes (on the
    /// 8-GPU node 7.5 KB of the 305 KB request, before gzip).
    fn start(&self, kind: Kind) -> u64 {
        match kind {
            Kind::Gauge => 0,
            Kind::Counter if self.delta => self.last_ns,
            Kind::Counter | Kind::UpDownCounter => self.start_ns,
        }
    }

    /// The request for `view` at `now_ns` (Unix ns) and the number of data points in it; the
    /// bytes stay valid until the next call.
    pub fn encode(&mut self, view: &View<'_>, now_ns: u64) -> (&[u8], usize) {
        let count = self.points(view, now_ns);
        self.assemble();
        (&self.body, count)
    }

    /// The request for `view` at `now_ns` as a buffer of its own (the one the encoder keeps,
    /// lent: give it back with [`Encoder::give_back`] once sent) and the number of data
    /// points in it.
    pub fn encode_owned(&mut self, view: &View<'_>, now_ns: u64) -> (Vec<u8>, usize) {
        let count = self.points(view, now_ns);
        self.assemble();
        (std::mem::take(&mut self.body), count)
    }

    /// Takes back the buffer [`Encoder::encode_owned`] lent, when nothing else holds it
    /// (else the next request gets a new one).
    pub fn give_back(&mut self, sent: bytes::Bytes) {
        if let Ok(b) = sent.try_into_mut() {
            self.body = b.into();
        }
    }

    /// The request for `view` at `now_ns` handed to `out` in order, in pieces: the envelope
    /// with the first metric's header, then each metric's data points, then its end with the
    /// next metric's header (the last piece ends with the schema URLs); the number of data
    /// points in it. OTLP/HTTP with gzip compresses the pieces as they come.
    pub fn encode_to(&mut self, view: &View<'_>, now_ns: u64, out: &mut dyn FnMut(&[u8])) -> usize {
        let count = self.points(view, now_ns);
        let sizes = self.sizes();
        let mut head = std::mem::take(&mut self.head);
        head.clear();
        self.prefix(&mut head, &sizes);
        for w in &self.metrics {
            self.header(&mut head, w);
            out(&head);
            head.clear();
            out(&self.body[w.from..w.to]);
            self.tail(&mut head, REGISTRY[w.i].kind);
        }
        self.suffix(&mut head);
        out(&head);
        self.head = head;
        count
    }

    /// Writes every finite sample's `NumberDataPoint` (as field 1 of its metric's `Gauge` or
    /// `Sum`) into the body, metric after metric, and notes where each metric's are: one pass
    /// over the samples, each read once (on the 64-GPU node they do not stay in the cache
    /// between two passes; perf: the first loads of each sample in each of two passes took
    /// about half of the encode's samples). Returns the number of points.
    fn points(&mut self, view: &View<'_>, now_ns: u64) -> usize {
        self.generation += 1;
        self.hw_ids.clear();
        self.identities.clear();
        self.metrics.clear();
        let mut body = std::mem::take(&mut self.body);
        body.clear();
        // Sized once, about the last request's size (the first: about 160 bytes a point; a
        // point takes 140 to 145 on the simulated nodes). Grown by doubling, the 64-GPU
        // node's 2.3 MB went through a dozen copies, whose freed pages the allocator keeps
        // until their decay: 2 to 3 MiB more at the first export, the peak of the agent's RSS.
        body.reserve(if self.last_len > 0 {
            self.last_len + self.last_len / 8
        } else {
            view.iter().map(|(_, s)| s.len()).sum::<usize>() * 160
        });
        let mut count = 0usize;
        for (i, samples) in view.iter() {
            let d = &REGISTRY[i];
            // Cumulative counters start where they began counting: decided for the metric,
            // or for each series where a BMC's can be among them.
            let (metric_start, per_series) = if !self.delta && d.kind == Kind::Counter {
                if counted_by_the_agent(d.name) {
                    (self.agent_ns, false)
                } else if i == Metric::EccErrorsLifetime as usize {
                    (0, false)
                } else {
                    (self.boot_ns, d.attrs.contains(&"junction.target"))
                }
            } else {
                (self.start(d.kind), false)
            };
            let from = body.len();
            for (gpu, s) in samples {
                if !s.value.is_finite() {
                    continue;
                }
                let start = if per_series {
                    self.origin(s)
                } else {
                    metric_start
                };
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
                // The GPU's identity after the sample's own attributes: none, the whole
                // (the same bytes on each of its points: written once), or those the sample
                // does not name itself.
                let whole = if extra.is_empty() || names_identity(s) {
                    None
                } else {
                    Some(self.identities.index(extra))
                };
                match whole {
                    Some(at) => n += self.identities.bytes(at).len(),
                    None => {
                        n += extra
                            .iter()
                            .filter(|(k, _)| s.attr(k).is_none())
                            .map(|(k, v)| field(key_value_len(k, v)))
                            .sum::<usize>();
                    }
                }
                n += times_len(start);
                let value = if self.delta && d.kind == Kind::Counter {
                    self.delta_of(view, i, gpu, s)
                } else {
                    s.value
                };
                let at = body.len();
                len(&mut body, 1, n);
                if hw_id {
                    self.hw_ids.write(&mut body, gpu);
                }
                for (k, v) in &s.attrs {
                    self.statics.write(&mut body, k, v);
                }
                match whole {
                    Some(at) => body.extend_from_slice(self.identities.bytes(at)),
                    None => {
                        for (k, v) in extra {
                            if s.attr(k).is_none() {
                                key_value(&mut body, 7, k, v);
                            }
                        }
                    }
                }
                if start > 0 {
                    fixed64(&mut body, 2, start);
                }
                fixed64(&mut body, 3, now_ns);
                fixed64(&mut body, 4, value.to_bits());
                debug_assert_eq!(body.len() - at, field(n), "a point's length, its bytes");
                count += 1;
            }
            if body.len() == from {
                continue;
            }
            let data = body.len() - from;
            let m = field(d.name.len())
                + field(d.help.len())
                + field(d.unit.len())
                + field(data_len(d.kind, data));
            self.metrics.push(Written {
                i,
                from,
                to: body.len(),
                m,
            });
        }
        self.last_len = body.len();
        self.body = body;
        if self.delta {
            let g = self.generation;
            self.previous.retain(|_, (_, seen)| *seen == g);
        }
        self.last_ns = now_ns;
        count
    }

    /// Bytes of the resource, the scope, the `ScopeMetrics` and the `ResourceMetrics`
    /// messages of the request of [`Encoder::points`].
    fn sizes(&self) -> Sizes {
        let (scope_name, scope_version) = &self.envelope.scope;
        let scope = field(scope_name.len()) + field(scope_version.len());
        let metrics: usize = self.metrics.iter().map(|w| field(w.m)).sum();
        let scope_metrics = field(scope) + metrics + field(self.envelope.schema_url.len());
        let resource: usize = self
            .envelope
            .resource
            .iter()
            .map(|(k, v)| field(key_value_len(k, v)))
            .sum();
        let resource_metrics =
            field(resource) + field(scope_metrics) + field(self.envelope.schema_url.len());
        Sizes {
            resource,
            scope,
            scope_metrics,
            resource_metrics,
        }
    }

    /// What comes before the first metric: `ResourceMetrics` (field 1 of the request), its
    /// resource, `ScopeMetrics` and its scope.
    fn prefix(&self, buf: &mut Vec<u8>, sizes: &Sizes) {
        let (scope_name, scope_version) = &self.envelope.scope;
        len(buf, 1, sizes.resource_metrics);
        len(buf, 1, sizes.resource);
        for (k, v) in &self.envelope.resource {
            key_value(buf, 1, k, v);
        }
        len(buf, 2, sizes.scope_metrics);
        len(buf, 1, sizes.scope);
        string(buf, 1, scope_name);
        string(buf, 2, scope_version);
    }

    /// A metric's `Metric` message up to its data points: name, description, unit, and the
    /// `Gauge` or `Sum` they are in.
    fn header(&self, buf: &mut Vec<u8>, w: &Written) {
        let d = &REGISTRY[w.i];
        len(buf, 2, w.m);
        string(buf, 1, d.name);
        string(buf, 2, d.help);
        string(buf, 3, d.unit);
        let data = data_len(d.kind, w.to - w.from);
        match d.kind {
            Kind::Gauge => len(buf, 5, data),
            Kind::Counter | Kind::UpDownCounter => len(buf, 7, data),
        }
    }

    /// A metric's `Sum` after its data points: its temporality and monotonicity.
    fn tail(&self, buf: &mut Vec<u8>, kind: Kind) {
        match kind {
            Kind::Gauge => {}
            Kind::Counter => {
                varint(buf, 2, if self.delta { DELTA } else { CUMULATIVE });
                varint(buf, 3, 1);
            }
            Kind::UpDownCounter => varint(buf, 2, CUMULATIVE),
        }
    }

    /// What comes after the last metric: `ScopeMetrics.schema_url`, then
    /// `ResourceMetrics.schema_url`.
    fn suffix(&self, buf: &mut Vec<u8>) {
        string(buf, 3, &self.envelope.schema_url);
        string(buf, 3, &self.envelope.schema_url);
    }

    /// Makes the body (the data points of [`Encoder::points`]) the whole request in place:
    /// grown by the envelope and the metrics' headers and ends, each metric's points moved to
    /// where they go, last first (each goes at or past where it is, and past every earlier
    /// metric's points), so the request is never held twice.
    fn assemble(&mut self) {
        let sizes = self.sizes();
        let total = field(sizes.resource_metrics);
        let mut body = std::mem::take(&mut self.body);
        let mut head = std::mem::take(&mut self.head);
        body.resize(total, 0);
        let mut end = total;
        // Puts `head` just before `end`, and empties it.
        let put = |body: &mut Vec<u8>, head: &mut Vec<u8>, end: &mut usize| {
            *end -= head.len();
            body[*end..*end + head.len()].copy_from_slice(head);
            head.clear();
        };
        head.clear();
        self.suffix(&mut head);
        put(&mut body, &mut head, &mut end);
        for w in self.metrics.iter().rev() {
            self.tail(&mut head, REGISTRY[w.i].kind);
            put(&mut body, &mut head, &mut end);
            end -= w.to - w.from;
            debug_assert!(end >= w.from, "points move towards the end");
            body.copy_within(w.from..w.to, end);
            self.header(&mut head, w);
            put(&mut body, &mut head, &mut end);
        }
        self.prefix(&mut head, &sizes);
        put(&mut body, &mut head, &mut end);
        debug_assert_eq!(end, 0, "lengths agree with bytes");
        self.body = body;
        self.head = head;
    }

    /// A counter's increase since the previous export (its value the first time, and after
    /// the counter went back, as on a driver reload); for a series that outlives a boot, the
    /// first time is the first time it was kept ([`Encoder::prime_lasting`]).
    fn delta_of(&mut self, view: &View<'_>, i: usize, gpu: &str, s: &Sample) -> f64 {
        let key = series_key(REGISTRY[i].name, attributes(view, i, gpu, s));
        let slot = self
            .previous
            .entry(key)
            .or_insert((f64::NAN, self.generation));
        let mut prev = slot.0;
        *slot = (s.value, self.generation);
        if outlives_boot(s) {
            // Unknown here (new since the start, or back after a gap): its last value of any
            // run, kept across reboots.
            if prev.is_nan()
                && let Some(v) = self.lasting.get(&key)
            {
                prev = *v;
            }
            self.note_lasting(key, s.value, s.metric == Metric::EccErrorsLifetime);
        }
        if prev.is_finite() && s.value >= prev {
            s.value - prev
        } else {
            s.value
        }
    }
}

/// The key delta keeps a series' last value by (and a restart's saved state holds): a hash of
/// the metric's name, not its registry index (a state saved by another build, whose registry
/// may list metrics in another order, is matched by what the series are), and its attributes.
pub(super) fn series_key<'a>(
    name: &str,
    attrs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    for (k, v) in attrs {
        k.hash(&mut h);
        v.hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

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
//!
//! The parts: `wire.rs` (protobuf's wire format), `attributes.rs` (the attributes of a point,
//! and those written once and copied), `delta.rs` (what delta temporality keeps per series).

mod attributes;
mod delta;
mod wire;

use std::collections::HashMap;

use crate::model::registry::Kind;
use crate::model::view::{View, names_identity};
use crate::model::{Metric, REGISTRY, Sample};
use attributes::{HwIds, Identities, Statics};
pub(super) use delta::series_key;
use delta::{counted_by_the_agent, outlives_boot};
use wire::{CUMULATIVE, DELTA, field, fixed64, key_value, key_value_len, len, string, varint};

/// A `NumberDataPoint`'s start time (when set), time and value.
fn times_len(start: u64) -> usize {
    (if start > 0 { 9 } else { 0 }) + 9 + 9
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
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

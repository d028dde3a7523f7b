//! The sink's own telemetry, published to the model (so both sinks export it): exports
//! attempted and failed per signal, bytes sent, events queued and dropped, the time of the
//! last successful export; and the rate-limited log of failures.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use super::settings::Signal;
use crate::internal_events::{self, Key, Subject};
use crate::model::{Metric, Model, Sample, lock};

/// How an export ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Delivered.
    Ok,
    /// Not delivered; worth retrying (down, timeout, UNAVAILABLE, 429, 5xx).
    Retryable(String),
    /// Refused for good (400, INVALID_ARGUMENT, …): not retried.
    Rejected(String),
}

#[derive(Debug, Default)]
struct PerSignal {
    attempts: u64,
    failures: u64,
    bytes: u64,
    last_success: Option<SystemTime>,
    failing_since: Option<Instant>,
}

#[derive(Debug, Default)]
struct Inner {
    signals: BTreeMap<Signal, PerSignal>,
    queued: u64,
    dropped: u64,
}

/// Counters shared by the metric exporter, the event shipper and the HTTP client.
#[derive(Debug)]
pub struct Stats {
    model: Arc<Model>,
    inner: Mutex<Inner>,
}

impl Stats {
    /// Fresh counters that publish into `model`.
    pub fn new(model: Arc<Model>) -> Self {
        let s = Self {
            model,
            inner: Mutex::new(Inner::default()),
        };
        {
            let mut i = lock(&s.inner);
            i.signals.insert(Signal::Metrics, PerSignal::default());
            i.signals.insert(Signal::Logs, PerSignal::default());
        }
        s.publish();
        s
    }

    /// Counts bytes put on the wire for `signal` (HTTP: the request body as sent).
    pub fn sent(&self, signal: Signal, bytes: usize) {
        lock(&self.inner).signals.entry(signal).or_default().bytes += bytes as u64;
    }

    /// Records an export attempt and how it ended, logging failures at most once per kind
    /// every 10 minutes and saying when the receiver is back.
    pub fn export(&self, signal: Signal, outcome: &Outcome) {
        {
            let mut i = lock(&self.inner);
            let s = i.signals.entry(signal).or_default();
            s.attempts += 1;
            let now = Instant::now();
            // The shared limiter (the sink's failures are counted in its own series).
            let key = |kind: &'static str| Key {
                source: "otlp",
                stage: signal.as_str(),
                error_type: kind,
                subject: Subject::Node,
            };
            let may_log = |kind| internal_events::limit(&key(kind)).is_some();
            match outcome {
                Outcome::Ok => {
                    s.last_success = Some(SystemTime::now());
                    if let Some(since) = s.failing_since.take() {
                        tracing::info!(
                            signal = signal.as_str(),
                            after_secs = since.elapsed().as_secs(),
                            "OTLP receiver accepts exports again"
                        );
                    }
                    for kind in ["retryable", "rejected"] {
                        internal_events::recovered(&key(kind));
                    }
                }
                Outcome::Retryable(why) => {
                    s.failures += 1;
                    s.failing_since.get_or_insert(now);
                    if may_log("retryable") {
                        tracing::warn!(signal = signal.as_str(), error = %why, "OTLP export failed; retrying with backoff (further failures are counted in junction_sink_export_failures_total)");
                    }
                }
                Outcome::Rejected(why) => {
                    s.failures += 1;
                    if may_log("rejected") {
                        tracing::error!(signal = signal.as_str(), receiver_says = %why, "OTLP receiver rejected the export; not retried (logged once per 10 minutes)");
                    }
                }
            }
        }
        self.publish();
    }

    /// Events waiting for delivery now.
    pub fn queued(&self, n: u64) {
        lock(&self.inner).queued = n;
        self.publish();
    }

    /// Events lost: overwritten before delivery, or refused by the receiver.
    pub fn dropped(&self, n: u64) {
        if n > 0 {
            lock(&self.inner).dropped += n;
            self.publish();
        }
    }

    fn publish(&self) {
        let i = lock(&self.inner);
        let mut out = Vec::with_capacity(12);
        for (signal, s) in &i.signals {
            let tag = |x: Sample| {
                x.with("junction.sink", "otlp")
                    .with("junction.signal", signal.as_str())
            };
            out.push(tag(Sample::new(Metric::SinkExports, s.attempts as f64)));
            out.push(tag(Sample::new(
                Metric::SinkExportFailures,
                s.failures as f64,
            )));
            if s.bytes > 0 {
                out.push(tag(Sample::new(Metric::SinkSentBytes, s.bytes as f64)));
            }
            if let Some(t) = s.last_success {
                let secs = t
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                out.push(tag(Sample::new(Metric::SinkLastSuccess, secs.floor())));
            }
        }
        out.push(Sample::new(Metric::SinkQueue, i.queued as f64).with("junction.sink", "otlp"));
        out.push(
            Sample::new(Metric::SinkEventsDropped, i.dropped as f64).with("junction.sink", "otlp"),
        );
        drop(i);
        self.model.publish("otlp", "stats", out);
    }
}

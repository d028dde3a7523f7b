//! Self-telemetry of failed reads, in one place for every source: one struct per kind of
//! failure (`events.rs`), whose `emit()` bumps `junction_source_errors_total{junction.source,
//! junction.stage, error.type}` (and the `hw.id` or `junction.target` it concerns, where it
//! concerns one) and writes one log line through the shared limiter: the first occurrence of
//! a key, then at most one line per key every [`LOG_EVERY`], saying how many were not logged.
//! No source keeps a `warned` flag, a `last_error` or a window of its own.
//!
//! Bounded: every label but the subject is a `&'static str` from a closed set, and subjects
//! are GPUs of the inventory or configured targets; at most [`MAX_KEYS`] series all the same.

mod events;

use std::collections::BTreeMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use crate::model::{Metric, Model, Sample, lock};

pub use events::*;

/// One log line per key at most this often.
pub const LOG_EVERY: Duration = Duration::from_secs(600);
/// Error series kept at most (a bound that real sources never reach: they are closed sets
/// times the GPUs and the configured targets); past it, failures count under the source's
/// `other` stage.
pub const MAX_KEYS: usize = 4096;

/// What a failure concerns: the GPU (`hw.id`) or the target (`junction.target`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Subject {
    /// The node as a whole (the input, the socket).
    Node,
    /// A GPU, by `hw.id`.
    Gpu(String),
    /// A configured BMC target, by name.
    Target(String),
}

/// One series of `junction_source_errors_total`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// `junction.source`: nvml, kmsg, ebpf, redfish, ipmi, kubernetes, health.
    pub source: &'static str,
    /// `junction.stage`: what was being read (an NVML feature, `device`, `file`, `resource`,
    /// `poll`, `list`, …).
    pub stage: &'static str,
    /// `error.type`: the kind of failure, from a closed set per stage.
    pub error_type: &'static str,
    /// What it concerns.
    pub subject: Subject,
}

/// The counters.
#[derive(Debug, Default)]
pub struct Errors {
    counts: Mutex<BTreeMap<Key, u64>>,
}

impl Errors {
    /// Counts one failure.
    pub fn count(&self, mut key: Key) {
        let mut c = lock(&self.counts);
        if !c.contains_key(&key) && c.len() >= MAX_KEYS {
            key.stage = "other";
            key.error_type = "other";
            key.subject = Subject::Node;
        }
        *c.entry(key).or_insert(0) += 1;
    }

    /// The count of one series.
    pub fn get(&self, key: &Key) -> u64 {
        lock(&self.counts).get(key).copied().unwrap_or(0)
    }

    /// Failures of `source`, all series together.
    pub fn of_source(&self, source: &str) -> u64 {
        lock(&self.counts)
            .iter()
            .filter(|(k, _)| k.source == source)
            .map(|(_, n)| n)
            .sum()
    }

    /// Every series as samples.
    pub fn samples(&self) -> Vec<Sample> {
        lock(&self.counts)
            .iter()
            .map(|(k, n)| {
                let s = Sample::new(Metric::SourceErrors, *n as f64)
                    .with("junction.source", k.source)
                    .with("junction.stage", k.stage)
                    .with("error.type", k.error_type);
                match &k.subject {
                    Subject::Node => s,
                    Subject::Gpu(id) => s.with("hw.id", id.clone()),
                    Subject::Target(t) => s.with("junction.target", t.clone()),
                }
            })
            .collect()
    }
}

/// A failed read: what it counts under, and how it is said.
pub trait InternalEvent: Sized {
    /// The series it counts under.
    fn key(&self) -> Key;

    /// Writes its log line (called through the limiter; `suppressed`: lines of this key not
    /// written since the last one).
    fn log(&self, suppressed: u64);

    /// Counts it and logs it, rate-limited.
    fn emit(self, model: &Model) {
        let key = self.key();
        if let Some(suppressed) = limit(&key) {
            self.log(suppressed);
        }
        model.errors.count(key);
    }
}

/// The shared limiter: per key, when it last logged and how many it has held back since.
static LIMITER: LazyLock<Mutex<BTreeMap<Key, (Instant, u64)>>> =
    LazyLock::new(|| Mutex::new(BTreeMap::new()));

/// Whether a line for `key` may be written now: `Some(lines held back since the last)`.
pub fn limit(key: &Key) -> Option<u64> {
    let now = Instant::now();
    let mut l = lock(&LIMITER);
    match l.get_mut(key) {
        Some((at, held)) if now.duration_since(*at) < LOG_EVERY => {
            *held += 1;
            None
        }
        Some((at, held)) => {
            *at = now;
            Some(std::mem::take(held))
        }
        None => {
            if l.len() >= MAX_KEYS {
                return None;
            }
            l.insert(key.clone(), (now, 0));
            Some(0)
        }
    }
}

/// Forgets the limiter's memory of `key` (a source that recovered: its next failure is news).
pub fn recovered(key: &Key) {
    lock(&LIMITER).remove(key);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_every_time_logged_once_per_window() {
        let key = Key {
            source: "test",
            stage: "limiter",
            error_type: "io",
            subject: Subject::Target("t1".into()),
        };
        assert_eq!(limit(&key), Some(0), "the first is logged");
        assert_eq!(limit(&key), None);
        assert_eq!(limit(&key), None);
        recovered(&key);
        assert_eq!(limit(&key), Some(0), "after a recovery, news again");
        let e = Errors::default();
        for _ in 0..3 {
            e.count(key.clone());
        }
        assert_eq!(e.get(&key), 3);
        let s = e.samples();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].attr("junction.target"), Some("t1"));
        assert_eq!(s[0].attr("error.type"), Some("io"));
        for i in 0..MAX_KEYS + 10 {
            e.count(Key {
                subject: Subject::Gpu(format!("GPU-{i}")),
                ..key.clone()
            });
        }
        assert!(e.samples().len() <= MAX_KEYS + 1, "bounded");
    }
}

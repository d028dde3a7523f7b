//! The event log: one bounded ring of events (health transitions, XIDs, …) with a sequence
//! number each. Any source appends; each sink reads through a cursor of its own, so a slow
//! sink loses the oldest events (and knows how many), and never blocks a source.

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use super::{AttrValue, lock};

/// How bad an event is (OTLP severity numbers: INFO 9, WARN 13, ERROR 17, FATAL 21).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Informational (a GPU recovered).
    Info,
    /// Something degraded.
    Warn,
    /// Something failed.
    Error,
    /// The node needs an operator now.
    Fatal,
}

impl Severity {
    /// The OTLP `SeverityText`.
    pub fn text(self) -> &'static str {
        match self {
            Severity::Info => "INFO",
            Severity::Warn => "WARN",
            Severity::Error => "ERROR",
            Severity::Fatal => "FATAL",
        }
    }
}

/// One event.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Event {
    /// Position in the log; consecutive, never reused while the agent runs.
    pub seq: u64,
    /// When it happened.
    #[serde(with = "unix_nanos")]
    pub time: SystemTime,
    /// Severity.
    pub severity: Severity,
    /// What kind of event (`event.name`): `junction.health.change`, `gpu.xid`, …
    pub name: &'static str,
    /// The component it is about (`hw.id`), if any.
    pub hw_id: Option<String>,
    /// Further attributes (pid, process, XID, action, …).
    pub attrs: Vec<(&'static str, AttrValue)>,
    /// A sentence for a human.
    pub body: String,
}

mod unix_nanos {
    use std::time::SystemTime;

    pub fn serialize<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        let ns = t
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        s.serialize_u64(ns)
    }
}

/// An event before it has a place in the log.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// When it happened (defaults to now).
    pub time: SystemTime,
    /// Severity.
    pub severity: Severity,
    /// Event name.
    pub name: &'static str,
    /// The component it is about.
    pub hw_id: Option<String>,
    /// Further attributes.
    pub attrs: Vec<(&'static str, AttrValue)>,
    /// A sentence.
    pub body: String,
}

impl NewEvent {
    /// An event happening now.
    pub fn now(severity: Severity, name: &'static str, body: impl Into<String>) -> Self {
        Self {
            time: SystemTime::now(),
            severity,
            name,
            hw_id: None,
            attrs: Vec::new(),
            body: body.into(),
        }
    }

    /// About a component.
    pub fn about(mut self, hw_id: impl Into<String>) -> Self {
        self.hw_id = Some(hw_id.into());
        self
    }

    /// With an attribute.
    pub fn with(mut self, key: &'static str, value: impl Into<AttrValue>) -> Self {
        self.attrs.push((key, value.into()));
        self
    }
}

/// What a reader got.
#[derive(Debug, Default)]
pub struct Batch {
    /// Events from the cursor on, oldest first.
    pub events: Vec<Arc<Event>>,
    /// Events between the cursor and the oldest one still held: overwritten, lost to this
    /// reader.
    pub lost: u64,
    /// Where the next read starts.
    pub next: u64,
}

#[derive(Debug, Default)]
struct Ring {
    events: VecDeque<Arc<Event>>,
    next: u64,
    /// Events appended per name since start.
    counts: std::collections::BTreeMap<&'static str, u64>,
}

/// The bounded, sequence-numbered ring.
#[derive(Debug)]
pub struct EventLog {
    ring: Mutex<Ring>,
    grew: Condvar,
    capacity: std::sync::atomic::AtomicUsize,
}

impl Default for EventLog {
    fn default() -> Self {
        Self::new(EventLog::DEFAULT_CAPACITY)
    }
}

impl EventLog {
    /// Events held at most (the oldest are overwritten past it).
    pub const DEFAULT_CAPACITY: usize = 8192;
    /// Events held by `junction run` when no sink ships them: a short tail (they are
    /// counted in `junction_events_total` either way).
    pub const UNSHIPPED: usize = 256;

    /// An empty log holding at most `capacity` events.
    pub fn new(capacity: usize) -> Self {
        Self {
            ring: Mutex::new(Ring::default()),
            grew: Condvar::new(),
            capacity: std::sync::atomic::AtomicUsize::new(capacity.max(1)),
        }
    }

    /// Events held at most from now on (the OTLP sink's queue bound, or a short tail when
    /// nothing ships events); the oldest beyond it go now.
    pub fn set_capacity(&self, capacity: usize) {
        let capacity = capacity.max(1);
        self.capacity
            .store(capacity, std::sync::atomic::Ordering::Relaxed);
        let mut r = lock(&self.ring);
        while r.events.len() > capacity {
            r.events.pop_front();
        }
    }

    /// Forgets the events before `upto` (the reader has delivered them), so that what the
    /// log holds is what is still to be shipped, not the last `capacity` events ever made.
    pub fn release(&self, upto: u64) {
        let mut r = lock(&self.ring);
        while r.events.front().is_some_and(|e| e.seq < upto) {
            r.events.pop_front();
        }
        if r.events.is_empty() && r.events.capacity() > 64 {
            r.events.shrink_to(64);
        }
    }

    /// Events held now.
    pub fn len(&self) -> usize {
        lock(&self.ring).events.len()
    }

    /// Whether the log holds no event now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends an event; returns its sequence number.
    pub fn append(&self, e: NewEvent) -> u64 {
        let seq = {
            let mut r = lock(&self.ring);
            let seq = r.next;
            r.next += 1;
            *r.counts.entry(e.name).or_insert(0) += 1;
            while r.events.len() >= self.capacity.load(std::sync::atomic::Ordering::Relaxed) {
                r.events.pop_front();
            }
            r.events.push_back(Arc::new(Event {
                seq,
                time: e.time,
                severity: e.severity,
                name: e.name,
                hw_id: e.hw_id,
                attrs: e.attrs,
                body: e.body,
            }));
            seq
        };
        self.grew.notify_all();
        seq
    }

    /// Events appended per name since the agent started.
    pub fn counts(&self) -> Vec<(&'static str, u64)> {
        lock(&self.ring)
            .counts
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect()
    }

    /// The sequence number the next event will get.
    pub fn head(&self) -> u64 {
        lock(&self.ring).next
    }

    /// The sequence number of the oldest event the log still holds (the head when it holds
    /// none): where a reader that starts again (a restarted sink) begins, since what a reader
    /// has delivered is released.
    pub fn oldest(&self) -> u64 {
        let r = lock(&self.ring);
        r.events.front().map_or(r.next, |e| e.seq)
    }

    /// Up to `max` events from `from` on.
    pub fn read(&self, from: u64, max: usize) -> Batch {
        let r = lock(&self.ring);
        let oldest = r.events.front().map_or(r.next, |e| e.seq);
        let start = from.max(oldest);
        let skip = (start - oldest) as usize;
        let events: Vec<Arc<Event>> = r.events.iter().skip(skip).take(max).cloned().collect();
        let next = events.last().map_or(start, |e| e.seq + 1);
        Batch {
            events,
            lost: start - from.min(start),
            next,
        }
    }

    /// Waits until an event with a sequence number of at least `from` exists, `stop` is set
    /// (and [`EventLog::wake`] called), or `timeout`. Returns true if such an event exists.
    pub fn wait(&self, from: u64, stop: &AtomicBool, timeout: Duration) -> bool {
        let r = lock(&self.ring);
        let (r, _) = self
            .grew
            .wait_timeout_while(r, timeout, |r| {
                r.next <= from && !stop.load(std::sync::atomic::Ordering::Relaxed)
            })
            .unwrap_or_else(|e| e.into_inner());
        r.next > from
    }

    /// Wakes every waiter (at shutdown, once their `stop` flag is set). The log's lock is
    /// taken first: a waiter that read the flag before it was set is already waiting by then,
    /// and one that reads it after sees it set.
    pub fn wake(&self) {
        drop(lock(&self.ring));
        self.grew.notify_all();
    }
}

/// Whether status changes go out under the previous release's names (`hw.status.change`,
/// `hw.state.previous`; `[sinks] legacy_names`, set once at start).
static LEGACY_NAMES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Uses the previous release's event names for status changes (`[sinks] legacy_names`).
pub fn set_legacy_names(on: bool) {
    LEGACY_NAMES.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The event name and previous-state attribute of a component's status change: in Junction's
/// namespace (the conventions own `hw.*`), or the previous release's names.
pub fn status_change_names() -> (&'static str, &'static str) {
    if LEGACY_NAMES.load(std::sync::atomic::Ordering::Relaxed) {
        ("hw.status.change", "hw.state.previous")
    } else {
        ("junction.health.change", "junction.health.previous_state")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(n: u32) -> NewEvent {
        NewEvent::now(Severity::Info, "test", format!("event {n}"))
    }

    /// What a reader has delivered is freed; what it has not stays, up to the capacity.
    #[test]
    fn delivered_events_are_freed_and_the_capacity_bounds_the_rest() {
        let log = EventLog::new(100);
        for i in 0..10 {
            log.append(ev(i));
        }
        log.release(7);
        assert_eq!(log.len(), 3);
        // A reader that starts again (a restarted sink) begins at what is left, and has lost
        // nothing.
        assert_eq!(log.oldest(), 7);
        let b = log.read(log.oldest(), 10);
        assert_eq!(b.lost, 0);
        assert_eq!((b.events.len(), b.lost, b.next), (3, 0, 10));
        assert_eq!(b.events[0].seq, 7);
        log.release(10);
        assert!(log.is_empty());
        assert_eq!(log.head(), 10, "sequence numbers go on");
        assert_eq!(log.oldest(), 10, "nothing held: the head");
        log.set_capacity(2);
        for i in 10..15 {
            log.append(ev(i));
        }
        assert_eq!(log.len(), 2);
        let b = log.read(10, 10);
        assert_eq!((b.lost, b.events[0].seq), (3, 13));
    }

    #[test]
    fn readers_keep_their_own_cursor_and_count_what_they_lost() {
        let log = EventLog::new(4);
        for i in 0..3 {
            log.append(ev(i));
        }
        let b = log.read(0, 10);
        assert_eq!(b.events.len(), 3);
        assert_eq!((b.lost, b.next), (0, 3));
        for i in 3..10 {
            log.append(ev(i));
        }
        // A slow reader at 3: events 3..6 were overwritten (capacity 4 holds 6..10).
        let b = log.read(3, 2);
        assert_eq!(b.lost, 3);
        assert_eq!(b.events[0].seq, 6);
        assert_eq!(b.next, 8);
        let b = log.read(b.next, 10);
        assert_eq!(b.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [8, 9]);
        assert_eq!(b.lost, 0);
        assert_eq!(log.read(10, 10).events.len(), 0);
    }

    #[test]
    fn waiting_wakes_on_append() {
        let log = Arc::new(EventLog::new(8));
        let l2 = log.clone();
        let never = AtomicBool::new(false);
        let t = std::thread::spawn(move || l2.wait(0, &AtomicBool::new(false), LONG));
        std::thread::sleep(Duration::from_millis(20));
        let t0 = std::time::Instant::now();
        log.append(ev(1));
        assert!(t.join().expect("join"));
        // Woken by the append, not by the timeout (a lost notify would take 30 s).
        assert!(t0.elapsed() < LONG / 3, "woken after {:?}", t0.elapsed());
        assert!(!log.wait(1, &never, Duration::from_millis(10)));
    }

    /// A waiter with nothing to wait for sleeps until it is told to stop: set its flag, then
    /// wake it, however the two race with its going to sleep.
    #[test]
    fn waiting_ends_when_told_to_stop() {
        for pause in [0, 20] {
            let log = Arc::new(EventLog::new(8));
            let stop = Arc::new(AtomicBool::new(false));
            let (l2, s2) = (log.clone(), stop.clone());
            let t = std::thread::spawn(move || l2.wait(0, &s2, LONG));
            std::thread::sleep(Duration::from_millis(pause));
            let t0 = std::time::Instant::now();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            log.wake();
            // No event: false, and at once rather than after the timeout.
            assert!(!t.join().expect("join"));
            assert!(t0.elapsed() < LONG / 3, "woken after {:?}", t0.elapsed());
        }
    }

    /// Longer than any wait in these tests should take.
    const LONG: Duration = Duration::from_secs(30);
}

//! The threads that collect: one thread collects every GPU in turn, so that a node's cycle
//! wakes one thread, not one per GPU (each wake-up of a sleeping thread costs the kernel
//! tens of µs on a busy host, more than a GPU's own work in a 1 s cycle). A call that runs
//! past `call_timeout_ms` holds its thread: the watchdog marks that GPU stuck and starts
//! another thread for the other GPUs, one more for each GPU held, so that a hung GPU never
//! stops the rest. A held thread whose call returns finishes that GPU's cycle and ends if it
//! has been replaced. Each GPU's state sits behind its own lock, and a thread skips a GPU
//! another thread holds.
//!
//! The watchdog wakes every half deadline only while a call can be in flight: between rounds
//! of the one collecting thread it sleeps until half a deadline after the next round is due
//! (the thread says when before it sleeps). With the default intervals (5 s and more) it woke
//! once a second for rounds that came every 5 s, a quarter of an idle agent's CPU.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::{JoinHandle, Scope};
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;

use super::NvmlConfig;
use super::collect::V3Layout;
use super::report;
use super::seat::Seat;
use super::worker::{self, Busy, Watched};
use crate::model::{GpuSlot, Group, Model, lock};
use crate::shutdown::Shutdown;

/// The running collection.
pub struct Workers {
    handle: Option<JoinHandle<()>>,
    gpus: usize,
    done: Arc<(Mutex<usize>, Condvar)>,
    shutdown: Shutdown,
}

impl Workers {
    /// Waits until every GPU has had its first full cycle, or `limit`.
    pub fn wait_once(&self, limit: Duration) {
        let n = if self.handle.is_some() { self.gpus } else { 0 };
        let guard = lock(&self.done.0);
        let _ = self.done.1.wait_timeout_while(guard, limit, |d| *d < n);
    }

    /// Stops the threads and joins them if they finish within `deadline` (a thread stuck in
    /// an NVML call is left behind, and with it the thread that started it; the process exits
    /// anyway).
    pub fn stop(self, deadline: Duration) {
        self.shutdown.trigger();
        if let Some(h) = self.handle {
            crate::agent::join_by(h, Instant::now() + deadline);
        }
    }
}

/// What every collecting thread shares.
pub(super) struct Shared {
    pub nvml: Arc<Nvml>,
    pub model: Arc<Model>,
    pub schedule: Vec<(Group, Duration)>,
    pub max_processes: usize,
    pub retry_max: Duration,
    pub reprobe_every: Duration,
    timeout: Duration,
    pub layout: V3Layout,
    shutdown: Shutdown,
    pub once: bool,
    done: Arc<(Mutex<usize>, Condvar)>,
    pub reported: Arc<AtomicBool>,
}

impl Shared {
    /// One more GPU has had its first cycle (or has failed before it).
    pub fn finish(&self) {
        *lock(&self.done.0) += 1;
        self.done.1.notify_all();
    }
}

/// Starts the collection, the watchdog and the thread that, once every GPU has had its first
/// cycle (or `call_timeout_ms` × 8 + 5 s have passed), says the source is up and logs the
/// start-up report. With `once`, every GPU is collected once, each on its own thread (no
/// watchdog runs to hand a hung GPU's neighbours to another thread).
pub fn start(
    nvml: Arc<Nvml>,
    model: Arc<Model>,
    config: &NvmlConfig,
    layout: V3Layout,
    slots: Vec<Arc<Mutex<GpuSlot>>>,
    shutdown: Shutdown,
    once: bool,
) -> Workers {
    let shared = Arc::new(Shared {
        nvml,
        model,
        schedule: config.groups.schedule(),
        max_processes: config.max_processes_per_gpu as usize,
        retry_max: Duration::from_secs(config.lost_retry_max_secs.max(1)),
        reprobe_every: Duration::from_secs(config.reprobe_interval_secs.max(1)),
        timeout: Duration::from_millis(config.call_timeout_ms),
        layout,
        shutdown: shutdown.clone(),
        once,
        done: Arc::new((Mutex::new(0usize), Condvar::new())),
        reported: Arc::new(AtomicBool::new(once)),
    });
    let gpus = slots.len();
    let done = shared.done.clone();
    let sh = shared.clone();
    let crew_slots = slots.clone();
    let spawned = std::thread::Builder::new()
        .name(if once { "nvml-once" } else { "nvml-watchdog" }.into())
        .spawn(move || run(&sh, crew_slots));
    let handle = match spawned {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::error!(error = %e, "cannot start the NVML watchdog thread; NVML is not collected");
            None
        }
    };
    if !once && handle.is_some() {
        let limit = shared.timeout * 8 + Duration::from_secs(5);
        let model = shared.model.clone();
        let spawned = std::thread::Builder::new()
            .name("nvml-report".into())
            .spawn(move || {
                {
                    let guard = lock(&shared.done.0);
                    let _ = shared
                        .done
                        .1
                        .wait_timeout_while(guard, limit, |d| *d < gpus);
                }
                shared
                    .reported
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                // Up once every GPU has been read once: a scrape that /healthz lets through
                // has every GPU's first cycle, not the GPUs collected before the others.
                shared.model.set_source_up("nvml", true);
                report::startup(&slots);
            });
        if let Err(e) = spawned {
            // Without it nothing would say the source is up: say it now, unreported.
            tracing::error!(error = %e, "cannot start the NVML start-up report thread; no start-up report");
            model.set_source_up("nvml", true);
        }
    }
    Workers {
        handle,
        gpus,
        done,
        shutdown,
    }
}

/// The GPUs and the threads that collect them.
struct Crew<'n> {
    sh: &'n Shared,
    seats: Vec<Mutex<Seat<'n>>>,
    watched: Vec<Watched>,
    /// Collecting threads running.
    running: Mutex<usize>,
    /// When the collecting thread's next round is due, in ns since `base` ([`NOT_SAID`]
    /// before it first said).
    next_round: AtomicU64,
    base: Instant,
}

/// [`Crew::next_round`] before a collecting thread has said when its next round is.
const NOT_SAID: u64 = u64::MAX;

/// How long the watchdog sleeps after a round of its own, `period` apart while a call can be
/// in flight: while more than one collecting thread runs (one is held), while a call is in
/// flight or a GPU is marked stuck, or before the thread has said when its next round is.
/// Otherwise until `period` after that round (a call that hangs in it is first seen then, and
/// marked `period`s later: within the deadline and a half of its start, as at a steady
/// `period`).
fn watchdog_wait(
    period: Duration,
    running: usize,
    busy: bool,
    next_round: Option<Duration>,
) -> Duration {
    match next_round {
        Some(until) if running <= 1 && !busy => until + period,
        _ => period,
    }
}

/// The watchdog's thread: starts the collecting thread and, in steady running, watches the
/// calls, starting more collecting threads while GPUs are held; returns when all have ended.
fn run(sh: &Shared, slots: Vec<Arc<Mutex<GpuSlot>>>) {
    let mut watched = Vec::with_capacity(slots.len());
    let seats = slots
        .into_iter()
        .enumerate()
        .map(|(index, slot)| {
            let busy = Arc::new(Mutex::new(Busy::default()));
            watched.push((slot.clone(), busy.clone()));
            Mutex::new(Seat::closed(index as u32, slot, busy))
        })
        .collect();
    let crew = Crew {
        sh,
        seats,
        watched,
        running: Mutex::new(0),
        next_round: AtomicU64::new(NOT_SAID),
        base: Instant::now(),
    };
    std::thread::scope(|s| {
        if sh.once {
            // No watchdog: every GPU gets a thread of its own, each starting at its own GPU.
            for first in 0..crew.seats.len() {
                crew.spawn(s, first);
            }
            return;
        }
        crew.spawn(s, 0);
        // Half the deadline (50 ms to 1 s): a stuck call is reported within 1.5 deadlines.
        // At the default 2 s deadline this thread wakes once a second while a call can be in
        // flight, and otherwise once a round ([`watchdog_wait`]).
        let period = (sh.timeout / 2).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut wait = period;
        while !sh.shutdown.sleep(wait) {
            let busy = crew.watch(s);
            wait = crew.watchdog_wait(period, busy);
        }
    });
}

impl<'n> Crew<'n> {
    /// Starts another collecting thread, which begins its rounds at GPU `first`.
    fn spawn<'s>(&'s self, s: &'s Scope<'s, '_>, first: usize) {
        // Counted before it runs, so that it never finds itself surplus to a stale count.
        let number = {
            let mut running = lock(&self.running);
            *running += 1;
            *running
        };
        let spawned = std::thread::Builder::new()
            .name(if number == 1 {
                "nvml-collect".into()
            } else {
                format!("nvml-collect{number}")
            })
            .spawn_scoped(s, move || self.collect(first));
        if let Err(e) = spawned {
            *lock(&self.running) -= 1;
            tracing::error!(error = %e, "cannot start another NVML collection thread");
        }
    }

    /// Collects whatever is due on every GPU no other thread holds, then sleeps until the
    /// next is due; until shutdown, or until this thread was held past the deadline and has
    /// been replaced, or (with `once`) until every GPU it reached is done.
    fn collect(&self, first: usize) {
        let n = self.seats.len();
        loop {
            if self.sh.shutdown.is_triggered() {
                return;
            }
            let mut next: Option<Instant> = None;
            // One instant for the round: GPUs opened in one round keep one phase, so that
            // a cycle is one wake-up, not one a GPU a few µs apart.
            let now = Instant::now();
            for k in 0..n {
                let i = (first + k) % n;
                let mut seat = match self.seats[i].try_lock() {
                    Ok(g) => g,
                    Err(TryLockError::Poisoned(p)) => p.into_inner(),
                    // Another thread is collecting it (or is held in one of its calls).
                    Err(TryLockError::WouldBlock) => continue,
                };
                let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    seat.step(self.sh, now)
                }));
                let (at, held) = stepped.unwrap_or_else(|p| {
                    let why = crate::agent::panic_message(p);
                    seat.panicked(self.sh, i as u32, &self.watched[i], &why)
                });
                drop(seat);
                if let Some(at) = at {
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
                if held && self.replaced() {
                    return;
                }
            }
            if self.sh.once {
                if next.is_none() {
                    return;
                }
            } else if self.replaced() {
                return;
            }
            let due = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(1));
            // Said before the sleep: the round after it starts no earlier.
            let said = due.saturating_duration_since(self.base).as_nanos();
            self.next_round.store(
                u64::try_from(said).unwrap_or(NOT_SAID - 1),
                Ordering::Relaxed,
            );
            let wait = due.saturating_duration_since(Instant::now());
            if self.sh.shutdown.sleep(wait) {
                return;
            }
        }
    }

    /// GPUs whose call the watchdog has marked stuck.
    fn held(&self) -> usize {
        self.watched.iter().filter(|(_, b)| lock(b).stuck).count()
    }

    /// True (and counted out) if more threads run than the held GPUs and one free thread
    /// need: after a held call returned, or after a round.
    fn replaced(&self) -> bool {
        let held = self.held();
        let mut running = lock(&self.running);
        if *running > held + 1 {
            *running -= 1;
            return true;
        }
        false
    }

    /// How long the watchdog sleeps after its round ([`watchdog_wait`]), which found a call
    /// in flight or not (`busy`).
    fn watchdog_wait(&self, period: Duration, busy: bool) -> Duration {
        let running = *lock(&self.running);
        let next_round = match self.next_round.load(Ordering::Relaxed) {
            NOT_SAID => None,
            ns => Some(
                (self.base + Duration::from_nanos(ns)).saturating_duration_since(Instant::now()),
            ),
        };
        watchdog_wait(period, running, busy, next_round)
    }

    /// The watchdog's round: marks GPUs whose call has run past the deadline as stuck, and
    /// starts a thread for the others while every running thread is held. Whether a call
    /// was in flight.
    fn watch<'s>(&'s self, s: &'s Scope<'s, '_>) -> bool {
        let in_flight = worker::watchdog(&self.watched, self.sh.timeout, &self.sh.model);
        let want = (self.held() + 1).min(self.seats.len());
        let running = *lock(&self.running);
        if running < want {
            self.spawn(s, 0);
        }
        in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Between rounds of one thread, with no call in flight, the watchdog sleeps until half a
    /// deadline after the next round; otherwise every half deadline.
    #[test]
    fn the_watchdog_sleeps_through_idle_time_only() {
        let period = Duration::from_millis(250);
        let next = Some(Duration::from_secs(4));
        assert_eq!(
            watchdog_wait(period, 1, false, next),
            Duration::from_millis(4250)
        );
        // A round already due (or late): half a deadline from now.
        assert_eq!(
            watchdog_wait(period, 1, false, Some(Duration::ZERO)),
            period
        );
        // A call in flight or marked stuck, a second thread (one is held), or no round said.
        assert_eq!(watchdog_wait(period, 1, true, next), period);
        assert_eq!(watchdog_wait(period, 2, false, next), period);
        assert_eq!(watchdog_wait(period, 1, false, None), period);
    }
}

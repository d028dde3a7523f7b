//! The threads that collect: one thread collects every GPU in turn, so that a node's cycle
//! wakes one thread, not one per GPU (each wake-up of a sleeping thread costs the kernel
//! tens of µs on a busy host, more than a GPU's own work in a 1 s cycle). A call that runs
//! past `call_timeout_ms` holds its thread: the watchdog marks that GPU stuck and starts
//! another thread for the other GPUs, one more for each GPU held, so that a hung GPU never
//! stops the rest. A held thread whose call returns finishes that GPU's cycle and ends if it
//! has been replaced. Each GPU's state sits behind its own lock, and a thread skips a GPU
//! another thread holds.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::thread::{JoinHandle, Scope};
use std::time::{Duration, Instant};

use nvml_wrapper::Nvml;

use super::NvmlConfig;
use super::collect::{self, GpmState, V3Layout};
use super::report;
use super::worker::{self, Busy, Ctx, Start, Watched};
use crate::model::health::{Action, Code};
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
struct Shared {
    nvml: Arc<Nvml>,
    model: Arc<Model>,
    schedule: Vec<(Group, Duration)>,
    max_processes: usize,
    retry_max: Duration,
    reprobe_every: Duration,
    timeout: Duration,
    layout: V3Layout,
    shutdown: Shutdown,
    once: bool,
    done: Arc<(Mutex<usize>, Condvar)>,
    reported: Arc<AtomicBool>,
}

impl Shared {
    /// One more GPU has had its first cycle (or has failed before it).
    fn finish(&self) {
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

/// One GPU: not opened yet, being collected, or finished with.
enum Seat<'n> {
    Closed {
        index: u32,
        slot: Arc<Mutex<GpuSlot>>,
        busy: Arc<Mutex<Busy>>,
    },
    Open(Box<Gpu<'n>>),
    Done,
}

/// An open GPU's context and schedule.
struct Gpu<'n> {
    ctx: Ctx<'n>,
    /// When each group of the schedule is next due.
    due: Vec<Instant>,
    /// Each group's last sample count, to size the next batch without regrowing it.
    sizes: Vec<usize>,
    /// A group run again early (`Ctx::again_in`): when it is due after that, on its phase.
    resume: Vec<Option<Instant>>,
    next_reprobe: Instant,
    first_cycle: bool,
    /// While the GPU is failed: when to probe it next, and the wait that led there.
    recovery: Option<(Instant, Duration)>,
}

/// The GPUs and the threads that collect them.
struct Crew<'n> {
    sh: &'n Shared,
    seats: Vec<Mutex<Seat<'n>>>,
    watched: Vec<Watched>,
    /// Collecting threads running.
    running: Mutex<usize>,
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
            Mutex::new(Seat::Closed {
                index: index as u32,
                slot,
                busy,
            })
        })
        .collect();
    let crew = Crew {
        sh,
        seats,
        watched,
        running: Mutex::new(0),
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
        // At the default 2 s deadline this thread wakes once a second.
        let period = (sh.timeout / 2).clamp(Duration::from_millis(50), Duration::from_secs(1));
        while !sh.shutdown.sleep(period) {
            crew.watch(s);
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
                    // A defect of ours, not the GPU's: that GPU stops, the others go on, and
                    // its health is not touched.
                    let why = crate::agent::panic_message(p);
                    tracing::error!(gpu = i, panic = %why, "NVML collection panicked; this GPU is no longer collected");
                    // The call it was in is over: the watchdog must not take it for a hang.
                    match &mut *seat {
                        Seat::Open(gpu) => {
                            gpu.ctx.leave();
                            if gpu.first_cycle {
                                self.sh.finish();
                            }
                        }
                        Seat::Closed { slot, busy, .. } => {
                            worker::returned(busy, slot, &self.sh.model);
                            self.sh.finish();
                        }
                        Seat::Done => {}
                    }
                    *seat = Seat::Done;
                    (None, false)
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
            let wait = next.map_or(Duration::from_secs(1), |t| {
                t.saturating_duration_since(Instant::now())
            });
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

    /// The watchdog's round: marks GPUs whose call has run past the deadline as stuck, and
    /// starts a thread for the others while every running thread is held.
    fn watch<'s>(&'s self, s: &'s Scope<'s, '_>) {
        worker::watchdog(&self.watched, self.sh.timeout, &self.sh.model);
        let want = (self.held() + 1).min(self.seats.len());
        let running = *lock(&self.running);
        if running < want {
            self.spawn(s, 0);
        }
    }
}

impl<'n> Seat<'n> {
    /// Does what is due on this GPU now. Returns when it is next due (`None`: never again)
    /// and whether a call held this thread past the deadline.
    fn step(&mut self, sh: &'n Shared, now: Instant) -> (Option<Instant>, bool) {
        if let Seat::Closed { index, slot, busy } = self {
            match open(sh, *index, slot.clone(), busy.clone(), now) {
                Ok(gpu) => *self = Seat::Open(Box::new(gpu)),
                Err(held) => {
                    *self = Seat::Done;
                    sh.finish();
                    return (None, held);
                }
            }
        }
        let Seat::Open(gpu) = self else {
            return (None, false);
        };
        let next = gpu.step(sh, now);
        let held = std::mem::take(&mut gpu.ctx.held);
        if next.is_none() {
            *self = Seat::Done;
        }
        (next, held)
    }
}

/// Opens a GPU's handle. A GPU that cannot be opened is marked unreachable for good (`Err`,
/// with whether the call held the thread past the deadline).
fn open<'n>(
    sh: &'n Shared,
    index: u32,
    slot: Arc<Mutex<GpuSlot>>,
    busy: Arc<Mutex<Busy>>,
    now: Instant,
) -> Result<Gpu<'n>, bool> {
    worker::entered(&busy, "nvmlDeviceGetHandleByIndex");
    let dev = sh.nvml.device_by_index(index);
    let dev = match dev {
        Ok(d) => d,
        Err(e) => {
            let held = worker::returned(&busy, &slot, &sh.model);
            worker::mark_failed(
                &sh.model,
                &slot,
                (
                    Code::GpuUnreachable,
                    Action::DrainAndService,
                    format!("cannot open the GPU: {e}"),
                ),
            );
            return Err(held);
        }
    };
    let process_window = sh
        .schedule
        .iter()
        .find(|(g, _)| *g == Group::Processes)
        .map_or(Duration::from_secs(5), |(_, d)| *d);
    let mut ctx = Ctx::new(Start {
        nvml: &sh.nvml,
        model: &sh.model,
        dev,
        slot,
        busy,
        max_processes: sh.max_processes,
        process_window,
        layout: sh.layout,
        reported: sh.reported.clone(),
    });
    ctx.leave();
    Ok(Gpu {
        ctx,
        due: sh.schedule.iter().map(|_| now).collect(),
        sizes: sh.schedule.iter().map(|_| 16).collect(),
        resume: sh.schedule.iter().map(|_| None).collect(),
        next_reprobe: now + sh.reprobe_every,
        first_cycle: true,
        recovery: None,
    })
}

impl Gpu<'_> {
    /// Collects the groups that are due (or probes a failed GPU when its probe is due).
    /// Returns when something is next due; `None` once there is nothing more to do.
    fn step(&mut self, sh: &Shared, now: Instant) -> Option<Instant> {
        if let Some((at, wait)) = self.recovery {
            if at > now {
                return Some(at);
            }
            let again = (wait * 2).min(sh.retry_max);
            if !worker::answers_again(&mut self.ctx, again) {
                let at = Instant::now() + again;
                self.recovery = Some((at, again));
                return Some(at);
            }
            self.recovery = None;
            self.ctx.reprobe("the GPU answers again");
            self.due.iter_mut().for_each(|d| *d = now);
            self.resume.iter_mut().for_each(|r| *r = None);
        }
        if now >= self.next_reprobe {
            self.ctx
                .reprobe("periodic re-probe (sources.nvml.reprobe_interval_secs)");
            self.next_reprobe = now + sh.reprobe_every;
        }
        // A group asked to run again early: the GPU's first cycle is done after that.
        let mut early = false;
        for (i, (group, interval)) in sh.schedule.iter().enumerate() {
            if self.due[i] > now {
                early |= self.resume[i].is_some();
                continue;
            }
            let resume = self.resume[i].take();
            let mut out = Vec::with_capacity(self.sizes[i]);
            if let Err(halt) = collect::collect(*group, &mut self.ctx, &mut out) {
                self.ctx.gpm = GpmState::default();
                self.ctx.again_in = None;
                let (code, action, why) = halt.reason();
                worker::mark_failed(&sh.model, &self.ctx.slot, (code, action, why.into()));
                if self.first_cycle || sh.once {
                    self.first_cycle = false;
                    sh.finish();
                }
                if sh.once {
                    return None;
                }
                let wait = Duration::from_secs(1);
                self.recovery = Some((now + wait, wait));
                return Some(now + wait);
            }
            self.sizes[i] = out.len();
            worker::publish(&self.ctx.slot, *group, out);
            if let Some(gap) = self.ctx.again_in.take() {
                self.resume[i] = Some(resume.unwrap_or(self.due[i] + *interval));
                self.due[i] = now + gap;
                early = true;
                continue;
            }
            self.due[i] = resume.unwrap_or(self.due[i] + *interval);
            if self.due[i] <= now {
                self.due[i] = now + *interval;
            }
        }
        if self.first_cycle && !early {
            self.first_cycle = false;
            sh.finish();
            if sh.once {
                return None;
            }
        }
        let next = self
            .due
            .iter()
            .min()
            .copied()
            .unwrap_or(now + Duration::from_secs(1));
        Some(next.min(self.next_reprobe))
    }
}

//! One GPU's place in the crew ([`super::crew`]): opened on its first round, collected group
//! by group as each falls due, and opened again after a backoff if its collection panics.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::collect::{self, GpmState};
use super::crew::Shared;
use super::worker::{self, Busy, Ctx, Start, Watched};
use crate::internal_events::InternalEvent;
use crate::internal_events::NvmlCollectionPanicked;
use crate::model::health::{Action, Code};
use crate::model::{GpuSlot, Group, lock};

/// One GPU: not opened yet (or to be opened again), being collected, or finished with.
pub(super) enum Seat<'n> {
    Closed {
        index: u32,
        slot: Arc<Mutex<GpuSlot>>,
        busy: Arc<Mutex<Busy>>,
        /// After a panic in its collection: when it is opened again.
        again: Option<Again>,
    },
    Open(Box<Gpu<'n>>),
    Done,
}

/// When a GPU whose collection panicked is opened again, and the wait that led there.
#[derive(Clone, Copy)]
pub(super) struct Again {
    at: Instant,
    backoff: Duration,
}

/// An open GPU's context and schedule.
pub(super) struct Gpu<'n> {
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
    /// The wait before it was last opened again after a panic (zero: none yet).
    backoff: Duration,
}

impl<'n> Seat<'n> {
    /// A GPU not opened yet.
    pub(super) fn closed(index: u32, slot: Arc<Mutex<GpuSlot>>, busy: Arc<Mutex<Busy>>) -> Self {
        Seat::Closed {
            index,
            slot,
            busy,
            again: None,
        }
    }

    /// Does what is due on this GPU now. Returns when it is next due (`None`: never again)
    /// and whether a call held this thread past the deadline.
    pub(super) fn step(&mut self, sh: &'n Shared, now: Instant) -> (Option<Instant>, bool) {
        if let Seat::Closed {
            index,
            slot,
            busy,
            again,
        } = self
        {
            if let Some(a) = again
                && a.at > now
            {
                return (Some(a.at), false);
            }
            let again = *again;
            match open(sh, *index, slot.clone(), busy.clone(), now) {
                Ok(mut gpu) => {
                    if let Some(a) = again {
                        // Its first cycle was counted before the panic.
                        gpu.first_cycle = false;
                        gpu.backoff = a.backoff;
                    }
                    *self = Seat::Open(Box::new(gpu));
                }
                Err(held) => {
                    *self = Seat::Done;
                    if again.is_none() {
                        sh.finish();
                    }
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

    /// After a panic in this GPU's collection (a defect of Junction's, not the GPU's): counted
    /// and logged, and the GPU opened again after a backoff (1 s, doubling to a minute),
    /// with a context of its own; its readings stay as they were meanwhile and its health is
    /// not touched. With `once`, it is done. Returns what [`Seat::step`] would.
    pub(super) fn panicked(
        &mut self,
        sh: &Shared,
        index: u32,
        (slot, busy): &Watched,
        why: &str,
    ) -> (Option<Instant>, bool) {
        // The call it was in is over: the watchdog must not take it for a hang (and a thread
        // held past the deadline learns it, as after any held call).
        let (counted, backoff, held) = match self {
            Seat::Open(gpu) => {
                gpu.ctx.leave();
                let held = std::mem::take(&mut gpu.ctx.held);
                (!gpu.first_cycle, gpu.backoff, held)
            }
            Seat::Closed { again, .. } => {
                let held = worker::returned(busy, slot, &sh.model);
                let backoff = again.map_or(Duration::ZERO, |a| a.backoff);
                (again.is_some(), backoff, held)
            }
            Seat::Done => return (None, false),
        };
        if !counted {
            sh.finish();
        }
        let backoff = (backoff * 2).clamp(PANIC_BACKOFF.0, PANIC_BACKOFF.1);
        let gpu = lock(slot).info.uuid.clone();
        NvmlCollectionPanicked {
            gpu: &gpu,
            why,
            again: (!sh.once).then_some(backoff),
        }
        .emit(&sh.model);
        if sh.once {
            *self = Seat::Done;
            return (None, held);
        }
        let at = Instant::now() + backoff;
        *self = Seat::Closed {
            index,
            slot: slot.clone(),
            busy: busy.clone(),
            again: Some(Again { at, backoff }),
        };
        (Some(at), held)
    }
}

/// The first and the longest wait before a GPU whose collection panicked is opened again.
const PANIC_BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

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
        backoff: Duration::ZERO,
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
            #[cfg(debug_assertions)]
            failpoint(&self.ctx);
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

/// Debug builds only, for the tests of what follows a panic: with
/// `JUNCTION_FAILPOINT_NVML_PANIC=INDEX:COUNT`, the collection of the GPU at NVML index
/// INDEX panics the first COUNT times it is about to collect a group.
#[cfg(debug_assertions)]
fn failpoint(ctx: &Ctx<'_>) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static PLAN: std::sync::OnceLock<Option<(u32, AtomicU32)>> = std::sync::OnceLock::new();
    let plan = PLAN.get_or_init(|| {
        let v = std::env::var("JUNCTION_FAILPOINT_NVML_PANIC").ok()?;
        let (index, count) = v.split_once(':')?;
        Some((index.parse().ok()?, AtomicU32::new(count.parse().ok()?)))
    });
    if let Some((index, left)) = plan
        && lock(&ctx.slot).info.index == *index
        && left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    {
        panic!("JUNCTION_FAILPOINT_NVML_PANIC: GPU {index}'s collection panics here");
    }
}

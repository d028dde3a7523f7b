//! One GPU's collection state: every NVML call goes through [`Ctx::call`], which does the
//! feature detection, the error accounting and the watchdog's bookkeeping; features that
//! were unsupported are re-probed; a lost GPU, or one that needs a reset, is marked failed
//! and probed until it answers. The threads that run it are in `crew`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::collect::{self, GpmState, MigDevice, V3Layout};
use super::disabled::{Disabled, Retry};
use crate::internal_events::{InternalEvent, NvmlCallFailed, NvmlImplausible};
use crate::model::health::{Action, Code};
use crate::model::{Feature, GpuSlot, Group, HealthState, Model, Sample, lock};

/// The call a GPU's collector is in, for the watchdog. A call is numbered, not timed: the
/// collector makes about 150 calls a GPU a cycle, and reading the clock around each took 5 %
/// of the collecting thread's CPU (perf, the 8-GPU node); the watchdog, which wakes a few
/// times a second, reads the clock for them.
#[derive(Debug, Default)]
pub(super) struct Busy {
    /// The call in flight and its number.
    pub(super) call: Option<(&'static str, u64)>,
    /// Calls entered so far on this GPU (the last one's number).
    calls: u64,
    /// The watchdog's: the number of the call it saw in flight at its last round, and when it
    /// first saw that call.
    seen: Option<(u64, Instant)>,
    /// Set by the watchdog when it marked the slot stuck; the collector clears both.
    pub(super) stuck: bool,
}

/// A GPU slot and the call its collector is in.
pub(super) type Watched = (Arc<Mutex<GpuSlot>>, Arc<Mutex<Busy>>);

/// Why collection on a GPU stops until it answers again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Halt {
    /// `NVML_ERROR_GPU_IS_LOST`: fallen off the bus.
    Lost,
    /// `NVML_ERROR_RESET_REQUIRED`: the GPU must be reset before it can be used (GPUd treats
    /// it as unhealthy too).
    ResetRequired,
}

impl Halt {
    /// The reason code (a `gpu.health.reason` value), the action and the sentence.
    pub(super) fn reason(self) -> (Code, Action, &'static str) {
        match self {
            Halt::Lost => (
                Code::GpuLost,
                Action::RebootNode,
                "GPU is lost (fallen off the bus)",
            ),
            Halt::ResetRequired => (
                Code::ResetRequired,
                Action::ResetGpu,
                "GPU requires a reset (NVML_ERROR_RESET_REQUIRED)",
            ),
        }
    }
}

/// What a worker needs while collecting.
pub struct Ctx<'n> {
    pub nvml: &'n Nvml,
    pub model: &'n Model,
    pub dev: Device<'n>,
    pub slot: Arc<Mutex<GpuSlot>>,
    busy: Arc<Mutex<Busy>>,
    pub max_processes: usize,
    pub gpm: GpmState<'n>,
    /// MIG devices found by the last MIG collection.
    pub mig_devices: Vec<MigDevice>,
    /// MIG mode seen by the last MIG collection.
    pub mig_mode: Option<bool>,
    /// Config collections since P2P was last read, and what it read (P2P is topology: read
    /// at start and every few collections, not every time).
    pub p2p: (u32, Vec<Sample>),
    /// Per-process attributes (name, container, pod), cached for the live process list.
    pub proc_names: BTreeMap<u32, crate::model::Attrs>,
    /// Newest per-process utilization timestamp seen (µs, CPU clock); 0 before the first.
    pub last_process_sample: u64,
    /// The processes group's interval: the first per-process utilization read asks for this
    /// window, not for the driver's whole buffer.
    pub process_window: Duration,
    /// How this driver lays out `_v3` process entries when the written bytes do not say.
    pub layout: V3Layout,
    /// Features disabled on this GPU (mirrors the slot's map without taking its lock;
    /// looked up before every NVML call).
    disabled: Disabled,
    /// Features being tried again after a re-probe.
    reprobing: BTreeSet<Feature>,
    /// Set once the start-up report has been logged: later disables log one line each.
    reported: Arc<AtomicBool>,
    /// Set by a group that wants to run again this soon, before its interval (GPM's first
    /// cycle, which needs a second sample); the crew reads and clears it.
    pub again_in: Option<Duration>,
    /// Set when a call returned after the watchdog marked it stuck (the thread it held may
    /// have been replaced meanwhile); the crew reads and clears it.
    pub(super) held: bool,
    uuid: String,
}

/// What a GPU's context starts from.
pub(super) struct Start<'n> {
    pub nvml: &'n Nvml,
    pub model: &'n Model,
    pub dev: Device<'n>,
    pub slot: Arc<Mutex<GpuSlot>>,
    pub busy: Arc<Mutex<Busy>>,
    pub max_processes: usize,
    pub process_window: Duration,
    pub layout: V3Layout,
    pub reported: Arc<AtomicBool>,
}

impl<'n> Ctx<'n> {
    /// A GPU's context before its first collection.
    pub(super) fn new(s: Start<'n>) -> Self {
        let uuid = lock(&s.slot).info.uuid.clone();
        Self {
            nvml: s.nvml,
            model: s.model,
            dev: s.dev,
            slot: s.slot,
            busy: s.busy,
            max_processes: s.max_processes,
            gpm: GpmState::default(),
            mig_devices: Vec::new(),
            mig_mode: None,
            p2p: (0, Vec::new()),
            proc_names: BTreeMap::new(),
            last_process_sample: 0,
            process_window: s.process_window,
            layout: s.layout,
            disabled: Disabled::default(),
            reprobing: BTreeSet::new(),
            reported: s.reported,
            again_in: None,
            held: false,
            uuid,
        }
    }

    /// Tells the watchdog that `call` starts now.
    fn enter(&self, call: &'static str) {
        entered(&self.busy, call);
    }

    /// Tells the watchdog that the call returned (see [`returned`]).
    pub(super) fn leave(&mut self) {
        self.held |= returned(&self.busy, &self.slot, self.model);
    }

    /// Runs one NVML call for `feature`, with feature detection and error accounting.
    /// `Ok(None)`: the value is unavailable this time (or for good, if unsupported).
    pub fn call<T>(
        &mut self,
        feature: impl Into<Feature>,
        f: impl FnOnce(&Device<'n>) -> Result<T, NvmlError>,
    ) -> Result<Option<T>, Halt> {
        let feature = feature.into();
        if self.disabled.contains(&feature) {
            return Ok(None);
        }
        self.enter(feature.name);
        let r = f(&self.dev);
        self.leave();
        match r {
            Ok(v) => {
                if !self.reprobing.is_empty() && self.reprobing.remove(&feature) {
                    tracing::info!(gpu = %self.uuid, feature = %feature, "NVML feature available again");
                }
                Ok(Some(v))
            }
            Err(e) => self.failed(feature, e).map(|()| None),
        }
    }

    /// True once `feature` is disabled on this GPU.
    pub fn is_disabled(&self, feature: impl Into<Feature>) -> bool {
        self.disabled.contains(&feature.into())
    }

    /// Accounts a failed call: disables unsupported features, halts on a lost GPU or one that
    /// needs a reset, counts the rest.
    pub fn failed(&mut self, feature: impl Into<Feature>, e: NvmlError) -> Result<(), Halt> {
        let feature = feature.into();
        match e {
            NvmlError::NotSupported => {
                let why = if self.mig_mode == Some(true) {
                    "NOT_SUPPORTED on this GPU while MIG mode is on"
                } else {
                    "NOT_SUPPORTED on this GPU"
                };
                self.disable(feature, why.into(), Retry::Reprobe);
            }
            NvmlError::FailedToLoadSymbol(s) => self.disable(
                feature,
                format!("not in this driver's NVML ({s})"),
                Retry::Never,
            ),
            NvmlError::FunctionNotFound => {
                self.disable(feature, "not in this driver's NVML".into(), Retry::Never)
            }
            NvmlError::GpuLost => return Err(Halt::Lost),
            NvmlError::ResetRequired => return Err(Halt::ResetRequired),
            e => {
                self.reprobing.remove(&feature);
                *lock(&self.slot).errors.entry(feature.name).or_insert(0) += 1;
                NvmlCallFailed {
                    gpu: &self.uuid,
                    feature: feature.name,
                    error: &e,
                }
                .emit(self.model);
            }
        }
        Ok(())
    }

    /// Disables `feature` on this GPU until a re-probe (or for good), logging once. Before the
    /// start-up report, the report says it for every GPU at once.
    fn disable(&mut self, feature: Feature, why: String, retry: Retry) {
        self.disabled.insert(feature, retry);
        let quiet = self.reprobing.remove(&feature)
            || !self.reported.load(Ordering::Relaxed)
            || super::report::quiet(feature.name);
        let mut slot = lock(&self.slot);
        if !slot.disabled.contains_key(&feature) && !quiet {
            tracing::info!(gpu = %self.uuid, feature = %feature, reason = %why, "NVML feature unavailable; disabled for this GPU");
        }
        if slot.disabled.get(&feature) != Some(&why) {
            Arc::make_mut(&mut slot.disabled).insert(feature, why);
        }
    }

    /// Disables a feature for a reason found by the collector itself (e.g. no GPM).
    pub fn disable_unsupported(&mut self, feature: impl Into<Feature>, why: &str) {
        self.disable(feature.into(), why.into(), Retry::Reprobe);
    }

    /// Tries every NOT_SUPPORTED feature again: MIG mode or the GPU's state changed, or the
    /// slow timer fired. A feature that is still unsupported is disabled again silently.
    pub fn reprobe(&mut self, why: &str) {
        let again = self.disabled.take(Retry::Reprobe);
        if again.is_empty() {
            return;
        }
        tracing::debug!(gpu = %self.uuid, features = again.len(), why, "re-probing unsupported NVML features");
        let mut slot = lock(&self.slot);
        for f in again {
            if slot.disabled.contains_key(&f) {
                Arc::make_mut(&mut slot.disabled).remove(&f);
            }
            self.reprobing.insert(f);
        }
    }

    /// Counts a read that returned nonsense, warning once.
    pub fn implausible(&mut self, feature: &'static str, what: String) {
        *lock(&self.slot).errors.entry(feature).or_insert(0) += 1;
        NvmlImplausible {
            gpu: &self.uuid,
            feature,
            what: &what,
        }
        .emit(self.model);
    }
}

/// Tells the watchdog that `call` starts now on this GPU.
pub(super) fn entered(busy: &Mutex<Busy>, call: &'static str) {
    let mut busy = lock(busy);
    busy.calls = busy.calls.wrapping_add(1);
    busy.call = Some((call, busy.calls));
}

/// Tells the watchdog that the GPU's call returned. If the watchdog had marked it stuck,
/// clears the mark and the health reason, and returns true: the thread was held past the
/// deadline (and may have been replaced meanwhile).
pub(super) fn returned(busy: &Mutex<Busy>, slot: &Mutex<GpuSlot>, model: &Model) -> bool {
    let was_stuck = {
        let mut busy = lock(busy);
        busy.call = None;
        std::mem::take(&mut busy.stuck)
    };
    // Lock order: busy, then slot (as the watchdog); the slot only when it was marked.
    if was_stuck {
        let recovered = {
            let mut s = lock(slot);
            s.stuck.take().map(|(call, _)| (call, s.info.uuid.clone()))
        };
        if let Some((call, uuid)) = recovered {
            tracing::warn!(gpu = %uuid, call, "NVML call returned after its deadline; GPU collecting again");
            model.clear(&uuid, Code::NvmlCallStuck);
        }
    }
    was_stuck
}

pub(super) fn publish(slot: &Mutex<GpuSlot>, group: Group, samples: Vec<Sample>) {
    let old = std::mem::replace(&mut lock(slot).groups[group.index()], Arc::new(samples));
    retire(old);
}

/// Sample sets replaced while a reader (an export, a scrape) still held them, each held
/// here until the reader lets go, so that the collecting thread that allocated them frees
/// them. Else the reader frees the sets it held past their replacement: an OTLP export,
/// which runs at the collection's period, often did, and on the 64-GPU node that took it
/// 0.4 to 1.2 ms of its thread's CPU time an export (jemalloc's frees from another thread;
/// 0.1 ms with the sets freed here). Bounded: past it, the reader frees them.
const MAX_RETIRED: usize = 4096;

thread_local! {
    static RETIRED: std::cell::RefCell<Vec<Arc<Vec<Sample>>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Frees `old` here when nothing else holds it, else keeps it until the reader lets go (up
/// to [`MAX_RETIRED`] sets; past that the reader frees it); frees those readers have let go.
fn retire(old: Arc<Vec<Sample>>) {
    RETIRED.with_borrow_mut(|held| {
        // A count of 1 is only ours: it is no longer in the model, so no one can take it.
        held.retain(|set| Arc::strong_count(set) > 1);
        if Arc::strong_count(&old) > 1 && held.len() < MAX_RETIRED {
            held.push(old);
        }
    });
}

/// The reasons this source raises when a GPU stops answering; cleared when it answers.
const FAILURES: [Code; 3] = [Code::GpuLost, Code::ResetRequired, Code::GpuUnreachable];

pub(super) fn mark_failed(
    model: &Model,
    slot: &Mutex<GpuSlot>,
    (code, action, why): (Code, Action, String),
) {
    let uuid = {
        let mut s = lock(slot);
        for g in &mut s.groups {
            *g = Arc::new(Vec::new());
        }
        s.info.uuid.clone()
    };
    if !model.health.reasons(&uuid).iter().any(|r| r.code == code) {
        tracing::error!(gpu = %uuid, reason = %why, "GPU failed; its metrics are withdrawn until it answers again");
    }
    model.raise(&uuid, code, HealthState::Failed, action, why);
}

/// Probes a failed GPU once: its UUID, and a memory read that reaches the GPU (a driver may
/// answer the UUID from its cache while the GPU still needs a reset). True when it answers;
/// `retry_in` is only for the log line when it does not.
pub(super) fn answers_again(ctx: &mut Ctx<'_>, retry_in: Duration) -> bool {
    ctx.enter("nvmlDeviceGetUUID");
    let probe = ctx
        .dev
        .uuid()
        .and_then(|_| match collect::raw::memory_v1(ctx.nvml, &ctx.dev) {
            Err(e @ (NvmlError::GpuLost | NvmlError::ResetRequired)) => Err(e),
            _ => Ok(()),
        });
    ctx.leave();
    match probe {
        Ok(()) => {
            tracing::warn!(gpu = %ctx.uuid, "failed GPU answers again; collecting");
            for code in FAILURES {
                ctx.model.clear(&ctx.uuid, code);
            }
            ctx.model.gpu_recovered(&ctx.uuid);
            true
        }
        Err(e) => {
            tracing::debug!(gpu = %ctx.uuid, error = %e, retry_in_secs = retry_in.as_secs(), "failed GPU still not answering");
            false
        }
    }
}

/// Marks GPUs whose current call has run past `timeout` as stuck (one log line each time).
/// A call counts from the round that first saw it in flight: it is marked once it has been
/// seen in flight for `timeout`, so it has run at least that long (never early), and at most
/// one round later than a clock read at its start would have marked it (the rounds come every
/// half deadline, 50 ms to 1 s: at the default 2 s deadline within 3 s of its start).
/// Whether a call was in flight on any GPU (a GPU marked stuck is in its call).
pub(super) fn watchdog(watched: &[Watched], timeout: Duration, model: &Model) -> bool {
    let mut in_flight = false;
    for (slot, busy) in watched {
        let mut busy = lock(busy);
        let Some((call, number)) = busy.call else {
            busy.seen = None;
            continue;
        };
        in_flight = true;
        // The clock is read only for a call in flight (a round seldom finds one).
        let since = match busy.seen {
            Some((seen, at)) if seen == number => at,
            _ => {
                // First seen now: it has not been seen for the deadline (never 0) yet.
                busy.seen = Some((number, Instant::now()));
                continue;
            }
        };
        if busy.stuck || since.elapsed() < timeout {
            continue;
        }
        busy.stuck = true;
        let uuid = {
            let mut s = lock(slot);
            if s.stuck.is_some() {
                continue;
            }
            s.stuck = Some((call, since));
            s.timeouts += 1;
            tracing::error!(gpu = %s.info.uuid, call, timeout_ms = timeout.as_millis() as u64,
                "NVML call is stuck past its deadline; this GPU's metrics are stale");
            s.info.uuid.clone()
        };
        let why = format!(
            "NVML call {call} did not return within {} ms",
            timeout.as_millis()
        );
        model.raise(
            &uuid,
            Code::NvmlCallStuck,
            HealthState::Degraded,
            Action::None,
            why,
        );
    }
    in_flight
}

#[cfg(test)]
mod tests;

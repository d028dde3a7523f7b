//! One thread per GPU: schedules the groups, isolates hanging calls, handles lost GPUs and
//! GPUs that need a reset, and re-probes features that were unsupported.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::NvmlConfig;
use super::collect::{self, GpmState, MigDevice, V3Layout};
use super::disabled::{Disabled, Retry};
use super::report;
use crate::internal_events::{InternalEvent, NvmlCallFailed, NvmlImplausible};
use crate::model::health::{Action, Code};
use crate::model::{Feature, GpuSlot, Group, HealthState, Model, Sample, lock};
pub use crate::shutdown::Shutdown;

/// The call a worker is in, for the watchdog.
#[derive(Debug, Default)]
struct Busy {
    call: Option<(&'static str, Instant)>,
    /// Set by the watchdog when it marked the slot stuck; the worker clears both.
    stuck: bool,
}

/// A GPU slot and the call its worker is in.
type Watched = (Arc<Mutex<GpuSlot>>, Arc<Mutex<Busy>>);

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
    fn reason(self) -> (Code, Action, &'static str) {
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
    uuid: String,
}

impl<'n> Ctx<'n> {
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
        lock(&self.busy).call = Some((feature.name, Instant::now()));
        let r = f(&self.dev);
        let was_stuck = {
            let mut busy = lock(&self.busy);
            busy.call = None;
            std::mem::take(&mut busy.stuck)
        };
        // Lock order: busy, then slot (as the watchdog); the slot only when it was marked.
        if was_stuck {
            let recovered = lock(&self.slot).stuck.take();
            if let Some((call, _)) = recovered {
                tracing::warn!(gpu = %self.uuid, call, "NVML call returned after its deadline; GPU collecting again");
                self.model.clear(&self.uuid, Code::NvmlCallStuck);
            }
        }
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
        let again: Vec<Feature> = self.disabled.with(Retry::Reprobe).collect();
        if again.is_empty() {
            return;
        }
        tracing::debug!(gpu = %self.uuid, features = again.len(), why, "re-probing unsupported NVML features");
        let mut slot = lock(&self.slot);
        for f in again {
            self.disabled.remove(&f);
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

/// The running workers.
pub struct Workers {
    handles: Vec<JoinHandle<()>>,
    done: Arc<(Mutex<usize>, Condvar)>,
    shutdown: Shutdown,
}

impl Workers {
    /// Waits until every worker has finished its first full cycle, or `limit`.
    pub fn wait_once(&self, limit: Duration) {
        let n = self.handles.len();
        let guard = lock(&self.done.0);
        let _ = self.done.1.wait_timeout_while(guard, limit, |d| *d < n);
    }

    /// Stops the workers and joins those that finish within `deadline` (a thread stuck in an
    /// NVML call is left behind; the process exits anyway).
    pub fn stop(self, deadline: Duration) {
        self.shutdown.trigger();
        let end = Instant::now() + deadline;
        for h in self.handles {
            crate::agent::join_by(h, end);
        }
    }
}

/// What every GPU thread shares.
struct Shared {
    nvml: Arc<Nvml>,
    model: Arc<Model>,
    schedule: Vec<(Group, Duration)>,
    max_processes: usize,
    retry_max: Duration,
    reprobe_every: Duration,
    layout: V3Layout,
    shutdown: Shutdown,
    once: bool,
    done: Arc<(Mutex<usize>, Condvar)>,
    reported: Arc<AtomicBool>,
}

/// Starts the GPU threads, the watchdog and the start-up report. With `once`, each thread
/// runs every group once.
pub fn start(
    nvml: Arc<Nvml>,
    model: Arc<Model>,
    config: &NvmlConfig,
    layout: V3Layout,
    slots: Vec<Arc<Mutex<GpuSlot>>>,
    shutdown: Shutdown,
    once: bool,
) -> Workers {
    let timeout = Duration::from_millis(config.call_timeout_ms);
    let shared = Arc::new(Shared {
        nvml,
        model,
        schedule: config.groups.schedule(),
        max_processes: config.max_processes_per_gpu as usize,
        retry_max: Duration::from_secs(config.lost_retry_max_secs.max(1)),
        reprobe_every: Duration::from_secs(config.reprobe_interval_secs.max(1)),
        layout,
        shutdown: shutdown.clone(),
        once,
        done: Arc::new((Mutex::new(0usize), Condvar::new())),
        reported: Arc::new(AtomicBool::new(once)),
    });
    let mut handles = Vec::new();
    let mut watched = Vec::new();
    for (index, slot) in slots.iter().cloned().enumerate() {
        let busy = Arc::new(Mutex::new(Busy::default()));
        watched.push((slot.clone(), busy.clone()));
        let shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("nvml-gpu{index}"))
            .spawn(move || run_gpu(&shared, index as u32, slot, busy));
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                tracing::error!(gpu = index, error = %e, "cannot start the NVML thread for this GPU")
            }
        }
    }
    if !once {
        let sd = shutdown.clone();
        let model = shared.model.clone();
        let spawned = std::thread::Builder::new()
            .name("nvml-watchdog".into())
            .spawn(move || {
                // Half the deadline (50 ms to 1 s): a stuck call is reported within 1.5
                // deadlines. Each wake-up of an idle thread costs tens of µs of CPU on a busy
                // host (80 µs here, against the 110 µs a GPU's whole 1 s cycle takes): at the
                // default 2 s deadline this thread wakes once a second, not twice.
                let period = (timeout / 2).clamp(Duration::from_millis(50), Duration::from_secs(1));
                while !sd.sleep(period) {
                    watchdog(&watched, timeout, &model);
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the NVML watchdog");
        }
        let (n, shared) = (handles.len(), shared.clone());
        let limit = timeout * 8 + Duration::from_secs(5);
        let _ = std::thread::Builder::new()
            .name("nvml-report".into())
            .spawn(move || {
                {
                    let guard = lock(&shared.done.0);
                    let _ = shared.done.1.wait_timeout_while(guard, limit, |d| *d < n);
                }
                shared.reported.store(true, Ordering::Relaxed);
                report::startup(&slots);
            });
    }
    Workers {
        handles,
        done: shared.done.clone(),
        shutdown,
    }
}

/// Marks GPUs whose current call has run past `timeout` as stuck (one log line each time).
fn watchdog(watched: &[Watched], timeout: Duration, model: &Model) {
    for (slot, busy) in watched {
        let mut busy = lock(busy);
        let Some((call, since)) = busy.call else {
            continue;
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
}

fn run_gpu(sh: &Shared, index: u32, slot: Arc<Mutex<GpuSlot>>, busy: Arc<Mutex<Busy>>) {
    let finish = || {
        *lock(&sh.done.0) += 1;
        sh.done.1.notify_all();
    };
    let uuid = lock(&slot).info.uuid.clone();
    lock(&busy).call = Some(("device_handle", Instant::now()));
    let dev = sh.nvml.device_by_index(index);
    lock(&busy).call = None;
    let dev = match dev {
        Ok(d) => d,
        Err(e) => {
            mark_failed(
                &sh.model,
                &slot,
                (
                    Code::GpuUnreachable,
                    Action::DrainAndService,
                    format!("cannot open the GPU: {e}"),
                ),
            );
            finish();
            return;
        }
    };
    let process_window = sh
        .schedule
        .iter()
        .find(|(g, _)| *g == Group::Processes)
        .map_or(Duration::from_secs(5), |(_, d)| *d);
    let mut ctx = Ctx {
        nvml: &sh.nvml,
        model: &sh.model,
        dev,
        slot: slot.clone(),
        busy,
        max_processes: sh.max_processes,
        gpm: GpmState::default(),
        mig_devices: Vec::new(),
        mig_mode: None,
        p2p: (0, Vec::new()),
        proc_names: BTreeMap::new(),
        last_process_sample: 0,
        process_window,
        layout: sh.layout,
        disabled: Disabled::default(),
        reprobing: BTreeSet::new(),
        reported: sh.reported.clone(),
        uuid,
    };
    let start = Instant::now();
    let mut due: Vec<Instant> = sh.schedule.iter().map(|_| start).collect();
    // Each group's last sample count, to size the next batch without regrowing it.
    let mut sizes: Vec<usize> = sh.schedule.iter().map(|_| 16).collect();
    let mut next_reprobe = start + sh.reprobe_every;
    let mut first_cycle = true;
    loop {
        if sh.shutdown.is_triggered() {
            break;
        }
        let now = Instant::now();
        if now >= next_reprobe {
            ctx.reprobe("periodic re-probe (sources.nvml.reprobe_interval_secs)");
            next_reprobe = now + sh.reprobe_every;
        }
        let mut halted = None;
        for (i, (group, interval)) in sh.schedule.iter().enumerate() {
            if due[i] > now {
                continue;
            }
            let mut out = Vec::with_capacity(sizes[i]);
            if let Err(h) = collect::collect(*group, &mut ctx, &mut out) {
                halted = Some(h);
                break;
            }
            sizes[i] = out.len();
            publish(&slot, *group, out);
            due[i] += *interval;
            if due[i] <= now {
                due[i] = now + *interval;
            }
        }
        if let Some(halt) = halted {
            ctx.gpm = GpmState::default();
            let (code, action, why) = halt.reason();
            mark_failed(&sh.model, &slot, (code, action, why.into()));
            if sh.once {
                finish();
                return;
            }
            if !wait_for_recovery(&mut ctx, sh.retry_max, &sh.shutdown) {
                break;
            }
            ctx.reprobe("the GPU answers again");
            let now = Instant::now();
            due.iter_mut().for_each(|d| *d = now);
            continue;
        }
        if first_cycle {
            first_cycle = false;
            finish();
            if sh.once {
                return;
            }
        }
        let next = due
            .iter()
            .min()
            .copied()
            .unwrap_or(now + Duration::from_secs(1))
            .min(next_reprobe);
        crate::allocator::flush_thread_cache();
        if sh
            .shutdown
            .sleep(next.saturating_duration_since(Instant::now()))
        {
            break;
        }
    }
}

fn publish(slot: &Mutex<GpuSlot>, group: Group, samples: Vec<Sample>) {
    let mut s = lock(slot);
    s.groups[group.index()] = Arc::new(samples);
}

/// The reasons this source raises when a GPU stops answering; cleared when it answers.
const FAILURES: [Code; 3] = [Code::GpuLost, Code::ResetRequired, Code::GpuUnreachable];

fn mark_failed(model: &Model, slot: &Mutex<GpuSlot>, (code, action, why): (Code, Action, String)) {
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

/// Probes a failed GPU with backoff until it answers (its UUID, and a memory read that
/// reaches the GPU: a driver may answer the UUID from its cache while the GPU still needs a
/// reset). Returns false on shutdown.
fn wait_for_recovery(ctx: &mut Ctx<'_>, retry_max: Duration, shutdown: &Shutdown) -> bool {
    let mut wait = Duration::from_secs(1);
    loop {
        if shutdown.sleep(wait) {
            return false;
        }
        lock(&ctx.busy).call = Some(("nvmlDeviceGetUUID", Instant::now()));
        let probe =
            ctx.dev
                .uuid()
                .and_then(|_| match collect::raw::memory_v1(ctx.nvml, &ctx.dev) {
                    Err(e @ (NvmlError::GpuLost | NvmlError::ResetRequired)) => Err(e),
                    _ => Ok(()),
                });
        lock(&ctx.busy).call = None;
        match probe {
            Ok(()) => {
                tracing::warn!(gpu = %ctx.uuid, "failed GPU answers again; collecting");
                for code in FAILURES {
                    ctx.model.clear(&ctx.uuid, code);
                }
                ctx.model.gpu_recovered(&ctx.uuid);
                return true;
            }
            Err(e) => {
                tracing::debug!(gpu = %ctx.uuid, error = %e, retry_in_secs = wait.as_secs(), "failed GPU still not answering");
                wait = (wait * 2).min(retry_max);
            }
        }
    }
}

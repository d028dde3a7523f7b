//! One thread per GPU: schedules the groups, isolates hanging calls, handles lost GPUs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use super::NvmlConfig;
use super::collect::{self, GpmState};
use crate::model::{GpuSlot, Group, HealthState, Sample, lock};

/// How often a failing feature may log again; in between, failures are only counted.
const WARN_EVERY: Duration = Duration::from_secs(600);

/// A shutdown signal that wakes sleeping workers at once.
#[derive(Debug, Clone, Default)]
pub struct Shutdown(Arc<(Mutex<bool>, Condvar)>);

impl Shutdown {
    /// Asks every worker to stop.
    pub fn trigger(&self) {
        *lock(&self.0.0) = true;
        self.0.1.notify_all();
    }

    /// True once triggered.
    pub fn is_triggered(&self) -> bool {
        *lock(&self.0.0)
    }

    /// Sleeps for `d` or until shutdown; returns true if shutting down.
    pub fn sleep(&self, d: Duration) -> bool {
        let guard = lock(&self.0.0);
        let (guard, _) = self
            .0
            .1
            .wait_timeout_while(guard, d, |stop| !*stop)
            .unwrap_or_else(|e| e.into_inner());
        *guard
    }
}

/// The call a worker is in, for the watchdog.
#[derive(Debug, Default)]
struct Busy {
    call: Option<(&'static str, Instant)>,
    /// Set by the watchdog when it marked the slot stuck; the worker clears both.
    stuck: bool,
}

/// A GPU slot and the call its worker is in.
type Watched = (Arc<Mutex<GpuSlot>>, Arc<Mutex<Busy>>);

/// GPU is lost: stop this cycle.
pub struct Lost;

/// What a worker needs while collecting.
pub struct Ctx<'n> {
    pub nvml: &'n Nvml,
    pub dev: Device<'n>,
    pub slot: Arc<Mutex<GpuSlot>>,
    busy: Arc<Mutex<Busy>>,
    pub max_processes: usize,
    pub gpm: GpmState<'n>,
    /// MIG instances found by the last MIG collection: (GPU instance id, MIG UUID).
    pub mig_instances: Vec<(u32, String)>,
    pub proc_names: BTreeMap<u32, String>,
    pub last_process_sample: u64,
    /// Features disabled on this GPU (mirrors the slot's map without taking its lock).
    disabled: BTreeSet<&'static str>,
    /// When each feature last logged a failure (failures are rate-limited, then counted).
    warned: BTreeMap<&'static str, Instant>,
    uuid: String,
}

impl<'n> Ctx<'n> {
    /// Runs one NVML call for `feature`, with feature detection and error accounting.
    /// `Ok(None)`: the value is unavailable this time (or for good, if unsupported).
    pub fn call<T>(
        &mut self,
        feature: &'static str,
        f: impl FnOnce(&Device<'n>) -> Result<T, NvmlError>,
    ) -> Result<Option<T>, Lost> {
        if self.disabled.contains(feature) {
            return Ok(None);
        }
        lock(&self.busy).call = Some((feature, Instant::now()));
        let r = f(&self.dev);
        let was_stuck = {
            let mut busy = lock(&self.busy);
            busy.call = None;
            std::mem::take(&mut busy.stuck)
        };
        // Lock order: busy, then slot (as the watchdog); the slot only when it was marked.
        if was_stuck {
            let mut slot = lock(&self.slot);
            if let Some((call, _)) = slot.stuck.take() {
                tracing::warn!(gpu = %self.uuid, call, "NVML call returned after its deadline; GPU collecting again");
                if slot.state == HealthState::Degraded {
                    slot.state = HealthState::Ok;
                    slot.reason = None;
                }
            }
        }
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) => self.failed(feature, e).map(|()| None),
        }
    }

    /// True once `feature` is disabled on this GPU.
    pub fn is_disabled(&self, feature: &str) -> bool {
        self.disabled.contains(feature)
    }

    /// Accounts a failed call: disables unsupported features, reports lost GPUs, counts the rest.
    pub fn failed(&mut self, feature: &'static str, e: NvmlError) -> Result<(), Lost> {
        match e {
            NvmlError::NotSupported => self.disable(feature, "NOT_SUPPORTED on this GPU".into()),
            NvmlError::FailedToLoadSymbol(s) => {
                self.disable(feature, format!("not in this driver's NVML ({s})"))
            }
            NvmlError::FunctionNotFound => {
                self.disable(feature, "not in this driver's NVML".into())
            }
            NvmlError::GpuLost => return Err(Lost),
            e => {
                *lock(&self.slot).errors.entry(feature).or_insert(0) += 1;
                if self.should_warn(feature) {
                    tracing::warn!(gpu = %self.uuid, feature, error = %e, "NVML call failed; counting further failures in junction_source_errors_total");
                }
            }
        }
        Ok(())
    }

    /// Disables `feature` on this GPU for good, logging once.
    pub fn disable(&mut self, feature: &'static str, why: String) {
        self.disabled.insert(feature);
        let mut slot = lock(&self.slot);
        if !slot.disabled.contains_key(feature) {
            tracing::info!(gpu = %self.uuid, feature, reason = %why, "NVML feature unavailable; disabled for this GPU");
            slot.disabled.insert(feature, why);
        }
    }

    /// Counts a read that returned nonsense, warning once.
    pub fn implausible(&mut self, feature: &'static str, what: String) {
        *lock(&self.slot).errors.entry(feature).or_insert(0) += 1;
        if self.should_warn(feature) {
            tracing::warn!(gpu = %self.uuid, feature, "{what}; ignored");
        }
    }

    /// At most one failure line per feature and GPU every [`WARN_EVERY`].
    fn should_warn(&mut self, feature: &'static str) -> bool {
        let now = Instant::now();
        match self.warned.get(feature) {
            Some(last) if now.duration_since(*last) < WARN_EVERY => false,
            _ => {
                self.warned.insert(feature, now);
                true
            }
        }
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
            while !h.is_finished() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
            if h.is_finished() {
                let _ = h.join();
            }
        }
    }
}

/// Starts the GPU threads and the watchdog. With `once`, each thread runs every group once.
pub fn start(
    nvml: Arc<Nvml>,
    config: &NvmlConfig,
    slots: Vec<Arc<Mutex<GpuSlot>>>,
    shutdown: Shutdown,
    once: bool,
) -> Workers {
    let schedule = config.groups.schedule();
    let timeout = Duration::from_millis(config.call_timeout_ms);
    let done = Arc::new((Mutex::new(0usize), Condvar::new()));
    let mut handles = Vec::new();
    let mut watched = Vec::new();
    for (index, slot) in slots.into_iter().enumerate() {
        let busy = Arc::new(Mutex::new(Busy::default()));
        watched.push((slot.clone(), busy.clone()));
        let (nvml, schedule, shutdown, done) = (
            nvml.clone(),
            schedule.clone(),
            shutdown.clone(),
            done.clone(),
        );
        let max_processes = config.max_processes_per_gpu as usize;
        let retry_max = Duration::from_secs(config.lost_retry_max_secs.max(1));
        let spawned = std::thread::Builder::new()
            .name(format!("nvml-gpu{index}"))
            .spawn(move || {
                run_gpu(
                    &nvml,
                    index as u32,
                    slot,
                    busy,
                    &schedule,
                    max_processes,
                    retry_max,
                    &shutdown,
                    once,
                    &done,
                );
            });
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                tracing::error!(gpu = index, error = %e, "cannot start the NVML thread for this GPU")
            }
        }
    }
    if !once {
        let shutdown = shutdown.clone();
        let spawned = std::thread::Builder::new()
            .name("nvml-watchdog".into())
            .spawn(move || {
                // A quarter of the deadline (50 ms to 500 ms): a stuck call is reported within
                // 1.25 deadlines without waking often.
                let period =
                    (timeout / 4).clamp(Duration::from_millis(50), Duration::from_millis(500));
                while !shutdown.sleep(period) {
                    watchdog(&watched, timeout);
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the NVML watchdog");
        }
    }
    Workers {
        handles,
        done,
        shutdown,
    }
}

/// Marks GPUs whose current call has run past `timeout` as stuck (one log line each time).
fn watchdog(watched: &[Watched], timeout: Duration) {
    for (slot, busy) in watched {
        let mut busy = lock(busy);
        let Some((call, since)) = busy.call else {
            continue;
        };
        if busy.stuck || since.elapsed() < timeout {
            continue;
        }
        busy.stuck = true;
        let mut s = lock(slot);
        if s.stuck.is_none() {
            s.stuck = Some((call, since));
            s.timeouts += 1;
            if s.state == HealthState::Ok {
                s.state = HealthState::Degraded;
                s.reason = Some(format!(
                    "NVML call {call} did not return within {} ms",
                    timeout.as_millis()
                ));
            }
            tracing::error!(gpu = %s.info.uuid, call, timeout_ms = timeout.as_millis() as u64,
                "NVML call is stuck past its deadline; this GPU's metrics are stale, the others keep updating");
        }
    }
}

#[expect(
    clippy::too_many_arguments,
    reason = "the thread entry point takes its whole context"
)]
fn run_gpu(
    nvml: &Nvml,
    index: u32,
    slot: Arc<Mutex<GpuSlot>>,
    busy: Arc<Mutex<Busy>>,
    schedule: &[(Group, Duration)],
    max_processes: usize,
    retry_max: Duration,
    shutdown: &Shutdown,
    once: bool,
    done: &(Mutex<usize>, Condvar),
) {
    let finish = || {
        *lock(&done.0) += 1;
        done.1.notify_all();
    };
    let uuid = lock(&slot).info.uuid.clone();
    lock(&busy).call = Some(("device_handle", Instant::now()));
    let dev = nvml.device_by_index(index);
    lock(&busy).call = None;
    let dev = match dev {
        Ok(d) => d,
        Err(e) => {
            mark_failed(&slot, format!("cannot open the GPU: {e}"));
            finish();
            return;
        }
    };
    let mut ctx = Ctx {
        nvml,
        dev,
        slot: slot.clone(),
        busy,
        max_processes,
        gpm: GpmState::default(),
        mig_instances: Vec::new(),
        proc_names: BTreeMap::new(),
        last_process_sample: 0,
        disabled: BTreeSet::new(),
        warned: BTreeMap::new(),
        uuid,
    };
    let start = Instant::now();
    let mut due: Vec<Instant> = schedule.iter().map(|_| start).collect();
    // Each group's last sample count, to size the next batch without regrowing it.
    let mut sizes: Vec<usize> = schedule.iter().map(|_| 16).collect();
    let mut first_cycle = true;
    loop {
        if shutdown.is_triggered() {
            break;
        }
        let now = Instant::now();
        let mut lost = false;
        for (i, (group, interval)) in schedule.iter().enumerate() {
            if due[i] > now {
                continue;
            }
            let mut out = Vec::with_capacity(sizes[i]);
            if collect::collect(*group, &mut ctx, &mut out).is_err() {
                lost = true;
                break;
            }
            sizes[i] = out.len();
            publish(&slot, *group, out);
            due[i] += *interval;
            if due[i] <= now {
                due[i] = now + *interval;
            }
        }
        if lost {
            ctx.gpm = GpmState::default();
            if once {
                mark_failed(&slot, "GPU is lost (fallen off the bus)".into());
                finish();
                return;
            }
            if !wait_for_recovery(&mut ctx, retry_max, shutdown) {
                break;
            }
            let now = Instant::now();
            due.iter_mut().for_each(|d| *d = now);
            continue;
        }
        if first_cycle {
            first_cycle = false;
            finish();
            if once {
                return;
            }
        }
        let next = due
            .iter()
            .min()
            .copied()
            .unwrap_or(now + Duration::from_secs(1));
        if shutdown.sleep(next.saturating_duration_since(Instant::now())) {
            break;
        }
    }
}

fn publish(slot: &Mutex<GpuSlot>, group: Group, samples: Vec<Sample>) {
    let mut s = lock(slot);
    s.groups[group.index()] = Arc::new(samples);
}

fn mark_failed(slot: &Mutex<GpuSlot>, reason: String) {
    let mut s = lock(slot);
    if s.state != HealthState::Failed {
        tracing::error!(gpu = %s.info.uuid, reason = %reason, "GPU failed; its metrics are withdrawn until it answers again");
    }
    s.state = HealthState::Failed;
    s.reason = Some(reason);
    for g in &mut s.groups {
        *g = Arc::new(Vec::new());
    }
}

/// Reports the GPU failed and probes it with backoff. Returns false on shutdown.
fn wait_for_recovery(ctx: &mut Ctx<'_>, retry_max: Duration, shutdown: &Shutdown) -> bool {
    mark_failed(&ctx.slot, "GPU is lost (fallen off the bus)".into());
    let mut wait = Duration::from_secs(1);
    loop {
        if shutdown.sleep(wait) {
            return false;
        }
        lock(&ctx.busy).call = Some(("nvmlDeviceGetUUID", Instant::now()));
        let probe = ctx.dev.uuid();
        lock(&ctx.busy).call = None;
        match probe {
            Ok(_) => {
                let mut s = lock(&ctx.slot);
                s.state = HealthState::Ok;
                s.reason = None;
                tracing::warn!(gpu = %s.info.uuid, "lost GPU answers again; collecting");
                return true;
            }
            Err(e) => {
                tracing::debug!(gpu = %ctx.uuid, error = %e, retry_in_secs = wait.as_secs(), "lost GPU still not answering");
                wait = (wait * 2).min(retry_max);
            }
        }
    }
}

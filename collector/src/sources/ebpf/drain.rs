//! The drain loop (its own thread): ring-buffer records into the tracker as they come,
//! per-process aggregates from the kernel every `interval_secs`, then the samples and events.

use std::collections::HashMap as StdHashMap;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aya::maps::{Array, HashMap, MapData, RingBuf};
use junction_common::nv::{N_OPS, Op};
use junction_common::{
    COUNTERS_MAP, Call, EVENTS_MAP, Exit, PROC_STATS_WORDS, ProcStats, STATS_MAP, counter, record,
};

use super::EbpfConfig;
use super::loader::Loaded;
use super::tracker::{Note, Tracker};
use crate::model::events::{NewEvent, Severity};
use crate::model::processes::{Hint, ProcessInfo, cgroup_path_by_id, cgroup2_root};
use crate::model::{Metric, Model, Sample};
use crate::shutdown::Shutdown;

/// Where the unified cgroup hierarchy is mounted (cgroup ids are its directories' inodes).
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

struct Maps {
    ring: RingBuf<MapData>,
    stats: HashMap<MapData, u32, [u64; PROC_STATS_WORDS]>,
    counters: Array<MapData, u64>,
}

/// The loaded, attached programs and the maps the drain reads (the programs detach when it
/// drops).
pub struct Attached {
    pub loaded: Loaded,
    maps: Maps,
}

/// Takes the maps the drain reads out of the loaded object.
pub fn attached(mut loaded: Loaded) -> Result<Attached, String> {
    let maps = maps(&mut loaded)?;
    Ok(Attached { loaded, maps })
}

fn maps(loaded: &mut Loaded) -> Result<Maps, String> {
    let mut take = |name: &str| {
        loaded
            .bpf
            .take_map(name)
            .ok_or_else(|| format!("map {name} missing from the BPF object"))
    };
    let ring = RingBuf::try_from(take(EVENTS_MAP)?).map_err(|e| e.to_string())?;
    let stats = HashMap::try_from(take(STATS_MAP)?).map_err(|e| e.to_string())?;
    let counters = Array::try_from(take(COUNTERS_MAP)?).map_err(|e| e.to_string())?;
    Ok(Maps {
        ring,
        stats,
        counters,
    })
}

/// Reads a `repr(C)` record of plain integers from a ring-buffer item.
fn read<T: Copy>(bytes: &[u8]) -> Option<T> {
    (bytes.len() >= std::mem::size_of::<T>())
        // SAFETY: T is a repr(C) struct of integers and byte arrays (Call, Exit): every bit
        // pattern is valid; the length is checked; read_unaligned needs no alignment.
        .then(|| unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// Names of device numbers, for events.
struct DeviceNames {
    uvm: u32,
    caps: u32,
    watched: Vec<(u32, String)>,
}

impl DeviceNames {
    fn name(&self, rdev: u32) -> String {
        let (major, minor) = (rdev >> 20, rdev & 0xFFFFF);
        if let Some((_, p)) = self.watched.iter().find(|(r, _)| *r == rdev) {
            return p.clone();
        }
        match major {
            195 => match minor {
                255 => "/dev/nvidiactl".into(),
                254 => "/dev/nvidia-modeset".into(),
                m => format!("/dev/nvidia{m}"),
            },
            m if m == self.uvm && minor == 1 => "/dev/nvidia-uvm-tools".into(),
            m if m == self.uvm => "/dev/nvidia-uvm".into(),
            m if m == self.caps => format!("/dev/nvidia-caps/nvidia-cap{minor}"),
            _ => format!("device {major}:{minor}"),
        }
    }
}

struct Drain<'a> {
    cfg: &'a EbpfConfig,
    model: &'a Model,
    tracker: Tracker,
    names: DeviceNames,
    cgroup_paths: StdHashMap<u64, Option<String>>,
    /// The cgroup v2 hierarchy, where BPF cgroup ids are looked up.
    cgroup_root: std::path::PathBuf,
    notes: Vec<Note>,
    /// Processes already looked up in `/proc` (done as soon as they are seen, while they
    /// most likely still run).
    identified: std::collections::HashSet<u32>,
    /// Records read from the ring.
    records: u64,
}

/// How often the ring is drained while records come (they do not wake the reader).
const DRAIN_EVERY: Duration = Duration::from_millis(100);

/// Runs until `shutdown` (the programs detach when the caller drops `a`; the source's thread
/// holds it as `Kept`, so that a panic here leaves it for the next start).
pub fn run(a: &mut Attached, cfg: &EbpfConfig, model: &Arc<Model>, shutdown: &Shutdown) {
    let Attached { loaded, maps: m } = a;
    let mut d = Drain {
        cfg,
        model,
        tracker: Tracker::default(),
        names: DeviceNames {
            uvm: loaded.uvm_major,
            caps: loaded.caps_major,
            watched: loaded.watched.clone(),
        },
        cgroup_paths: StdHashMap::new(),
        cgroup_root: cgroup2_root().unwrap_or_else(|| CGROUP_ROOT.into()),
        notes: Vec::new(),
        identified: std::collections::HashSet::new(),
        records: 0,
    };
    let interval = Duration::from_secs(cfg.interval_secs.max(1));
    let mut last = Instant::now() - interval;
    let fd = m.ring.as_raw_fd();
    crate::privileges::wait_gate();
    // Whether the last turn read records.
    let mut busy = false;
    while !shutdown.is_triggered() {
        // Call records do not wake this thread (the programs' `wakeup`): while they come, the
        // ring is drained every 100 ms; when none came, it sleeps until the next refresh. A
        // process's first record on a device wakes it at once, as does a ring a quarter full.
        let to_refresh = interval.saturating_sub(last.elapsed());
        let wait = if busy {
            to_refresh.min(DRAIN_EVERY)
        } else {
            to_refresh
        };
        if !wait.is_zero() {
            crate::shutdown::poll_readable(shutdown, &[fd], Some(wait));
        }
        let before = d.records;
        d.records(&mut m.ring);
        busy = d.records != before;
        d.identify_new();
        if last.elapsed() >= interval {
            last = Instant::now();
            d.refresh(m);
            #[cfg(debug_assertions)]
            failpoint();
        }
        d.notes_to_events();
    }
    model.set_source_up("ebpf", false);
}

/// Debug builds only, for the tests of what follows a panic: with
/// `JUNCTION_FAILPOINT_EBPF_PANIC=COUNT`, the drain panics after each of its first COUNT
/// refreshes (a process's).
#[cfg(debug_assertions)]
fn failpoint() {
    use std::sync::atomic::{AtomicU32, Ordering};
    static LEFT: std::sync::OnceLock<AtomicU32> = std::sync::OnceLock::new();
    let left = LEFT.get_or_init(|| {
        let n = std::env::var("JUNCTION_FAILPOINT_EBPF_PANIC").ok();
        AtomicU32::new(n.and_then(|n| n.parse().ok()).unwrap_or(0))
    });
    if left
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
    {
        panic!("JUNCTION_FAILPOINT_EBPF_PANIC: the eBPF drain panics here");
    }
}

impl Drain<'_> {
    fn records(&mut self, ring: &mut RingBuf<MapData>) {
        while let Some(item) = ring.next() {
            self.records += 1;
            let kind = read::<u32>(&item).unwrap_or(0);
            match kind {
                record::CALL | record::DEVICE => {
                    if let Some(c) = read::<Call>(&item) {
                        self.tracker.call(&c, &mut self.notes);
                    }
                }
                record::EXIT => {
                    if let Some(e) = read::<Exit>(&item) {
                        self.tracker.exit(&e, &mut self.notes);
                    }
                }
                _ => {}
            }
        }
    }

    fn cgroup_path(&mut self, id: u64) -> Option<String> {
        if id == 0 {
            return None;
        }
        self.cgroup_paths
            .entry(id)
            .or_insert_with(|| cgroup_path_by_id(&self.cgroup_root, id, 50_000))
            .clone()
    }

    /// Looks up every process not yet identified, while it most likely still runs.
    fn identify_new(&mut self) {
        let new: Vec<u32> = self
            .tracker
            .procs
            .keys()
            .filter(|t| !self.identified.contains(t))
            .copied()
            .collect();
        for tgid in new {
            self.identified.insert(tgid);
            self.info(tgid);
        }
    }

    fn identify(&mut self, pid: u32, comm: String, cgroup_id: u64) -> Arc<ProcessInfo> {
        // Only a process already gone from /proc needs its cgroup path from the id.
        let root = self.model.processes.proc_root();
        let cgroup = if root.join(pid.to_string()).exists() {
            None
        } else {
            self.cgroup_path(cgroup_id)
        };
        self.model
            .processes
            .identify(pid, Some(&Hint { comm, cgroup }))
    }

    fn info(&mut self, pid: u32) -> Arc<ProcessInfo> {
        let (comm, cg) = self
            .tracker
            .procs
            .get(&pid)
            .map(|p| (p.comm.clone(), p.cgroup_id))
            .unwrap_or_default();
        self.identify(pid, comm, cg)
    }

    /// Aggregates from the kernel, liveness, expiry, samples.
    fn refresh(&mut self, m: &mut Maps) {
        let keys: std::collections::HashSet<u32> = m.stats.keys().filter_map(Result::ok).collect();
        for tgid in &keys {
            if let Ok(w) = m.stats.get(tgid, 0) {
                self.tracker.stats(*tgid, ProcStats::from_words(&w));
            }
        }
        self.identify_new();
        // The exit program removes a process's kernel entry: one that is gone without its
        // exit record having arrived (ring full) has ended.
        let lost: Vec<u32> = self
            .tracker
            .procs
            .iter()
            .filter(|(t, p)| p.ended.is_none() && !keys.contains(t))
            .map(|(t, _)| *t)
            .collect();
        for tgid in lost {
            self.tracker.gone(tgid, &mut self.notes);
        }
        for (tgid, p) in &self.tracker.procs {
            if p.ended.is_some() {
                self.model.processes.ended(*tgid);
            }
        }
        let retention = Duration::from_secs(self.cfg.exited_retention_secs);
        for (tgid, _) in self.tracker.expire(retention) {
            self.identified.remove(&tgid);
        }
        // cgroup paths only of processes still tracked.
        let live: std::collections::HashSet<u64> =
            self.tracker.procs.values().map(|p| p.cgroup_id).collect();
        self.cgroup_paths.retain(|id, _| live.contains(id));
        self.publish(m);
    }

    fn publish(&mut self, m: &Maps) {
        let gpus = self.model.snapshot();
        // What a process may claim is bounded by what the node has.
        self.tracker.inventory = gpus.iter().map(|g| g.info.uuid.clone()).collect();
        if let Some(most) = gpus
            .iter()
            .filter_map(|g| {
                g.groups.iter().flat_map(|x| x.iter()).find_map(|s| {
                    (s.metric == Metric::MemoryLimit && s.attr("hw.gpu.memory.state").is_none())
                        .then_some(s.value as u64)
                })
            })
            .max()
        {
            self.tracker.max_object_bytes = most.max(1 << 30);
        }
        let minors: StdHashMap<u32, String> = gpus
            .into_iter()
            .filter_map(|g| g.info.minor_number.map(|n| (n, g.info.uuid.clone())))
            .collect();
        self.tracker.minors = minors.iter().map(|(m, u)| (*m, u.clone())).collect();
        let minor = |n: u32| minors.get(&n).cloned();
        let mut order: Vec<(u32, Instant)> = self
            .tracker
            .procs
            .iter()
            .map(|(t, p)| (*t, p.last_active))
            .collect();
        order.sort_by_key(|p| std::cmp::Reverse(p.1));
        order.truncate(self.cfg.max_processes as usize);
        let mut out = Vec::new();
        for (tgid, _) in order {
            let info = self.info(tgid);
            let attrs = info.attrs();
            let Some(p) = self.tracker.procs.get(&tgid) else {
                continue;
            };
            let sample = |metric: Metric, v: f64| {
                let mut s = Sample::new(metric, v);
                s.attrs = attrs.clone();
                s
            };
            for (i, op) in Op::ALL.iter().enumerate().take(N_OPS) {
                if p.stats.calls[i] == 0 {
                    continue;
                }
                out.push(
                    sample(Metric::DriverCalls, p.stats.calls[i] as f64)
                        .with("gpu.driver.call", op.name()),
                );
                out.push(
                    sample(Metric::DriverCallFailures, p.stats.failed[i] as f64)
                        .with("gpu.driver.call", op.name()),
                );
                out.push(
                    sample(Metric::DriverCallTime, p.stats.latency_ns[i] as f64 / 1e9)
                        .with("gpu.driver.call", op.name()),
                );
            }
            out.push(sample(Metric::DriverMemoryAllocated, p.allocated as f64));
            out.push(sample(Metric::DriverMemoryFreed, p.freed as f64));
            out.push(sample(
                Metric::DriverMemoryMapped,
                p.stats.mapped_bytes as f64,
            ));
            for (uuid, h) in self.tracker.holdings(p, &minor) {
                out.push(
                    sample(Metric::DriverMemoryUsage, h.memory as f64).with("hw.id", uuid.clone()),
                );
                out.push(sample(Metric::Contexts, h.contexts as f64).with("hw.id", uuid));
            }
        }
        self.model.publish("ebpf", "processes", out);
        let mut stats = vec![
            Sample::new(Metric::EbpfProcesses, self.tracker.procs.len() as f64),
            Sample::new(Metric::EbpfRecords, self.records as f64),
        ];
        for (idx, reason) in [
            (counter::RING_FULL, "ring_full"),
            (counter::INFLIGHT_FULL, "inflight_full"),
            (counter::STATS_FULL, "processes_full"),
            (counter::READ_FAILED, "unreadable"),
        ] {
            let v = m.counters.get(&idx, 0).unwrap_or(0);
            stats.push(Sample::new(Metric::EbpfLost, v as f64).with("junction.reason", reason));
        }
        self.model.publish("ebpf", "stats", stats);
    }

    fn notes_to_events(&mut self) {
        for n in std::mem::take(&mut self.notes) {
            let e = match n {
                Note::Started { tgid, rdev } => {
                    let info = self.info(tgid);
                    let dev = self.names.name(rdev);
                    with_process(
                        NewEvent::now(
                            Severity::Info,
                            "gpu.process.start",
                            format!("process {tgid} ({}) started using {dev}", info.name),
                        ),
                        &info,
                    )
                    .with("gpu.device", dev)
                }
                Note::GpuRegistered { tgid, uuid } => {
                    let info = self.info(tgid);
                    with_process(
                        NewEvent::now(
                            Severity::Info,
                            "gpu.process.attach",
                            format!("process {tgid} ({}) registered {uuid}", info.name),
                        ),
                        &info,
                    )
                    .about(uuid)
                }
                Note::Slow {
                    tgid,
                    op,
                    command,
                    latency,
                } => {
                    let info = self.info(tgid);
                    let what = if command != 0 {
                        format!("{} {command:#010x}", op.name())
                    } else {
                        op.name().to_string()
                    };
                    with_process(
                        NewEvent::now(
                            Severity::Warn,
                            "gpu.driver.slow_call",
                            format!(
                                "process {tgid} ({}) waited {:.3} s in the NVIDIA driver ({what})",
                                info.name,
                                latency.as_secs_f64()
                            ),
                        ),
                        &info,
                    )
                    .with("gpu.driver.call", op.name())
                }
                Note::Ended { tgid } => {
                    let info = self.info(tgid);
                    let Some(p) = self.tracker.procs.get(&tgid) else {
                        continue;
                    };
                    let calls: u64 = p.stats.calls.iter().sum();
                    let failed: u64 = p.stats.failed.iter().sum();
                    with_process(
                        NewEvent::now(
                            Severity::Info,
                            "gpu.process.end",
                            format!(
                                "process {tgid} ({}) ended: {calls} driver calls ({failed} failed), {} bytes allocated, {} freed",
                                info.name, p.allocated, p.freed
                            ),
                        ),
                        &info,
                    )
                }
            };
            self.model.events.append(e);
        }
    }
}

fn with_process(mut e: NewEvent, info: &ProcessInfo) -> NewEvent {
    e.attrs.extend(info.attrs());
    e
}

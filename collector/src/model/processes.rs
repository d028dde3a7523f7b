//! The process table: who a pid is (executable name, container, Kubernetes pod), read once
//! from `/proc` and shared by every source that reports per-process data (NVML's process
//! lists, eBPF's driver calls), so that both carry the same identity. Capped; an entry whose
//! process ended is kept for `retention` (so that a process that lived 50 ms is still
//! exported once) and then dropped.
//!
//! Pids are the host's (NVML and BPF both report host pids): in a container, `proc_root`
//! must be the host's `/proc` and the container needs the host's pid namespace.

mod cgroup;

pub use cgroup::{CgroupIds, cgroup_of, cgroup_path_by_id, cgroup2_root, parse_cgroup_path};

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::lock;

/// Who a process is.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProcessInfo {
    /// Host pid.
    pub pid: u32,
    /// Executable name (basename of `/proc/PID/exe`, else `comm`).
    pub name: String,
    /// The cgroup path (the unified hierarchy's, else the first v1 controller's).
    pub cgroup: String,
    /// Container id, from the cgroup path.
    pub container_id: Option<String>,
    /// Container runtime, from the cgroup path (docker, containerd, cri-o, podman).
    pub runtime: Option<&'static str>,
    /// Kubernetes pod UID, from the cgroup path.
    pub pod_uid: Option<String>,
    /// The pod's name and namespace, when the kubernetes source knows the UID.
    pub pod: Option<PodName>,
    /// The Slurm job, from the cgroup path.
    pub slurm_job: Option<String>,
    /// Start time in clock ticks after boot (`/proc/PID/stat` field 22): a reused pid has
    /// another.
    #[serde(skip)]
    pub start_ticks: u64,
}

impl ProcessInfo {
    /// The attributes every per-process series carries (`process.pid`,
    /// `process.executable.name`, and `container.id` / `k8s.pod.uid` when known).
    pub fn attrs(&self) -> super::Attrs {
        let mut a: super::Attrs = smallvec::smallvec![
            ("process.pid", self.pid.to_string().into()),
            ("process.executable.name", self.name.clone().into()),
        ];
        if let Some(c) = &self.container_id {
            a.push(("container.id", c.clone().into()));
        }
        if let Some(p) = &self.pod_uid {
            a.push(("k8s.pod.uid", p.clone().into()));
        }
        if let Some(p) = &self.pod {
            a.push(("k8s.namespace.name", p.namespace.clone().into()));
            a.push(("k8s.pod.name", p.name.clone().into()));
        }
        if let Some(j) = &self.slurm_job {
            a.push(("slurm.job.id", j.clone().into()));
        }
        a
    }
}

/// A pod's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PodName {
    /// `k8s.namespace.name`.
    pub namespace: String,
    /// `k8s.pod.name`.
    pub name: String,
}

/// The executable's name from `/proc`, when the process is visible there. A program started
/// through the dynamic loader (`ld-linux-x86-64.so.2 [options] PROGRAM`) has the loader as
/// its exe: it is named after the program its command line gives.
pub fn proc_name(proc_root: &Path, pid: u32) -> Option<String> {
    let dir = proc_root.join(pid.to_string());
    if let Ok(exe) = std::fs::read_link(dir.join("exe")) {
        let exe = exe.to_string_lossy();
        let name = basename(exe.trim_end_matches(" (deleted)"));
        if is_loader(name)
            && let Some(program) =
                read_head(&dir.join("cmdline"), CMDLINE_MAX).and_then(|c| loaded_program(&c))
        {
            return Some(program);
        }
        if !name.is_empty() {
            return Some(name.to_string());
        }
    }
    let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
    let comm = comm.trim_end_matches('\n');
    (!comm.is_empty()).then(|| comm.to_string())
}

/// The bytes of a process's command line read at most (the program a loader runs comes
/// first; the rest, as long as its owner likes, is not read).
const CMDLINE_MAX: usize = 4096;

/// Whether an executable's name is glibc's or musl's dynamic loader.
fn is_loader(name: &str) -> bool {
    name.starts_with("ld-linux")
        || name.starts_with("ld-musl")
        || name == "ld.so"
        || name.starts_with("ld64.so")
}

/// The first `max` bytes of a file.
fn read_head(path: &Path, max: usize) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(max as u64)
        .read_to_end(&mut buf)
        .ok()?;
    Some(buf)
}

/// The program a dynamic loader's command line runs (`ld.so [options] PROGRAM [args]`): the
/// first argument after the loader's own options (glibc's `ld.so --help`), by its base name.
pub fn loaded_program(cmdline: &[u8]) -> Option<String> {
    const WITH_VALUE: [&str; 7] = [
        "--library-path",
        "--inhibit-rpath",
        "--audit",
        "--preload",
        "--argv0",
        "--glibc-hwcaps-prefix",
        "--glibc-hwcaps-mask",
    ];
    let mut args = cmdline.split(|b| *b == 0).skip(1);
    while let Some(a) = args.next() {
        let a = String::from_utf8_lossy(a);
        if WITH_VALUE.contains(&a.as_ref()) {
            args.next();
        } else if a.starts_with("--") {
            // Another option of the loader (--inhibit-cache, --list, --verify, …).
        } else {
            let name = basename(&a);
            return (!name.is_empty()).then(|| name.to_string());
        }
    }
    None
}

/// The last component of a path.
pub fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or_default()
}

fn start_ticks(proc_root: &Path, pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    // After the command name in parentheses (which may hold spaces and parentheses).
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

/// Reads who `pid` is from `/proc` (None if it is not there).
pub fn read_process(proc_root: &Path, pid: u32) -> Option<ProcessInfo> {
    if !proc_root.join(pid.to_string()).is_dir() {
        return None;
    }
    let start = start_ticks(proc_root, pid).unwrap_or(0);
    let name = proc_name(proc_root, pid).unwrap_or_default();
    let cgroup = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup"))
        .map(|t| cgroup_of(&t))
        .unwrap_or_default();
    let ids = parse_cgroup_path(&cgroup);
    Some(ProcessInfo {
        pid,
        name,
        cgroup,
        container_id: ids.container_id,
        runtime: ids.runtime,
        pod_uid: ids.pod_uid,
        pod: None,
        slurm_job: ids.slurm_job,
        start_ticks: start,
    })
}

struct Entry {
    info: Arc<ProcessInfo>,
    last_seen: Instant,
    ended: Option<Instant>,
}

/// Hints for a process that may be gone from `/proc` by the time it is looked up (a
/// short-lived process seen by BPF): its command name and cgroup path.
#[derive(Debug, Clone, Default)]
pub struct Hint {
    /// `comm` (up to 15 bytes).
    pub comm: String,
    /// The cgroup path, resolved from the cgroup id.
    pub cgroup: Option<String>,
}

/// The table.
pub struct Processes {
    proc_root: Mutex<PathBuf>,
    entries: Mutex<BTreeMap<u32, Entry>>,
    cap: usize,
    last_prune: Mutex<Option<Instant>>,
    /// Pod names by UID (set by the kubernetes source).
    pods: Mutex<Arc<HashMap<String, PodName>>>,
}

impl Default for Processes {
    fn default() -> Self {
        Self {
            proc_root: Mutex::new(PathBuf::from("/proc")),
            entries: Mutex::new(BTreeMap::new()),
            cap: 4096,
            last_prune: Mutex::new(None),
            pods: Mutex::new(Arc::new(HashMap::new())),
        }
    }
}

impl std::fmt::Debug for Processes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processes")
            .field("entries", &lock(&self.entries).len())
            .finish()
    }
}

impl Processes {
    /// Sets where `/proc` is (the config's `proc_root`).
    pub fn set_proc_root(&self, root: PathBuf) {
        *lock(&self.proc_root) = root;
    }

    /// Where `/proc` is.
    pub fn proc_root(&self) -> PathBuf {
        lock(&self.proc_root).clone()
    }

    /// Replaces the pod names known by UID; processes in those pods are named from now on.
    pub fn set_pod_names(&self, pods: HashMap<String, PodName>) {
        *lock(&self.pods) = Arc::new(pods);
    }

    /// The name of the pod with this UID, if known.
    pub fn pod_name(&self, uid: &str) -> Option<PodName> {
        lock(&self.pods).get(uid).cloned()
    }

    /// `info` with its pod's name, when the UID has one now and the info lacks it.
    fn named(&self, info: &Arc<ProcessInfo>) -> Option<Arc<ProcessInfo>> {
        let uid = info.pod_uid.as_deref()?;
        let pod = self.pod_name(uid)?;
        (info.pod.as_ref() != Some(&pod)).then(|| {
            let mut i = ProcessInfo::clone(info);
            i.pod = Some(pod);
            Arc::new(i)
        })
    }

    /// Who `pid` is: from the table, or read from `/proc` (re-read when the pid was reused),
    /// or, for a process already gone, from `hint`.
    pub fn identify(&self, pid: u32, hint: Option<&Hint>) -> Arc<ProcessInfo> {
        self.prune_now_and_then();
        let root = self.proc_root();
        let now = Instant::now();
        {
            let mut entries = lock(&self.entries);
            if let Some(e) = entries.get_mut(&pid) {
                // Still the same process? (A pid can be reused once the old one ended.)
                let same = e.ended.is_none()
                    || start_ticks(&root, pid).is_none_or(|t| t == e.info.start_ticks);
                if same {
                    e.last_seen = now;
                    if let Some(named) = self.named(&e.info) {
                        e.info = named;
                    }
                    return e.info.clone();
                }
            }
        }
        let info = read_process(&root, pid).unwrap_or_else(|| {
            let h = hint.cloned().unwrap_or_default();
            let cgroup = h.cgroup.unwrap_or_default();
            let ids = parse_cgroup_path(&cgroup);
            ProcessInfo {
                pid,
                name: h.comm,
                cgroup,
                container_id: ids.container_id,
                runtime: ids.runtime,
                pod_uid: ids.pod_uid,
                pod: None,
                slurm_job: ids.slurm_job,
                start_ticks: 0,
            }
        });
        let info = Arc::new(info);
        let info = self.named(&info).unwrap_or(info);
        let mut entries = lock(&self.entries);
        if entries.len() >= self.cap && !entries.contains_key(&pid) {
            // Evict the entry seen longest ago.
            if let Some(old) = entries
                .iter()
                .min_by_key(|(_, e)| e.last_seen)
                .map(|(p, _)| *p)
            {
                entries.remove(&old);
            }
        }
        entries.insert(
            pid,
            Entry {
                info: info.clone(),
                last_seen: now,
                ended: None,
            },
        );
        info
    }

    /// Records that `pid` has ended.
    pub fn ended(&self, pid: u32) {
        if let Some(e) = lock(&self.entries).get_mut(&pid) {
            e.ended.get_or_insert_with(Instant::now);
        }
    }

    /// Once a minute: drops processes that ended two minutes ago and entries nobody has
    /// asked about for five (the sources ask about every process they still report at each
    /// poll), so that the table holds the processes alive now and the last few minutes'
    /// ended ones, not every process that ever lived (`cargo xtask bench --soak`).
    fn prune_now_and_then(&self) {
        {
            let mut last = lock(&self.last_prune);
            if last.is_some_and(|t| t.elapsed() < Duration::from_secs(60)) {
                return;
            }
            *last = Some(Instant::now());
        }
        self.prune(Duration::from_secs(120), Duration::from_secs(300));
    }

    /// Drops processes that ended more than `retention` ago and entries nobody has asked
    /// about for `idle`.
    pub fn prune(&self, retention: Duration, idle: Duration) {
        lock(&self.entries).retain(|_, e| {
            e.ended.is_none_or(|t| t.elapsed() < retention) && e.last_seen.elapsed() < idle
        });
    }

    /// Number of processes in the table.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    /// Whether the table is empty.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;

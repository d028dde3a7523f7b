//! The process table: who a pid is (executable name, container, Kubernetes pod), read once
//! from `/proc` and shared by every source that reports per-process data (NVML's process
//! lists, eBPF's driver calls), so that both carry the same identity. Capped; an entry whose
//! process ended is kept for `retention` (so that a process that lived 50 ms is still
//! exported once) and then dropped.
//!
//! Pids are the host's (NVML and BPF both report host pids): in a container, `proc_root`
//! must be the host's `/proc` and the container needs the host's pid namespace.

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
    /// Start time in clock ticks after boot (`/proc/PID/stat` field 22): a reused pid has
    /// another.
    #[serde(skip)]
    pub start_ticks: u64,
}

impl ProcessInfo {
    /// The attributes every per-process series carries (`process.pid`,
    /// `process.executable.name`, and `container.id` / `k8s.pod.uid` when known).
    pub fn attrs(&self) -> Vec<(&'static str, super::AttrValue)> {
        let mut a: Vec<(&'static str, super::AttrValue)> = vec![
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

/// What the cgroup path says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupIds {
    /// Container id (64 hex digits).
    pub container_id: Option<String>,
    /// Runtime that named the cgroup.
    pub runtime: Option<&'static str>,
    /// Pod UID (dashed).
    pub pod_uid: Option<String>,
}

fn is_hex(s: &str, n: usize) -> bool {
    s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A pod UID as Kubernetes writes it: 8-4-4-4-12 hex (underscores in systemd slice names),
/// or 32 hex digits (static pods' config hash).
fn pod_uid(s: &str) -> Option<String> {
    let u = s.replace('_', "-");
    let parts: Vec<&str> = u.split('-').collect();
    let dashed = parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| is_hex(p, n));
    (dashed || is_hex(&u, 32)).then_some(u)
}

/// A container scope as a runtime names it under the systemd driver (`docker-ID.scope`,
/// `cri-containerd-ID.scope`, `crio-ID.scope`, `libpod-ID.scope`); runtime helper scopes
/// (`crio-conmon-…`, `libpod-conmon-…`) are not containers.
fn runtime_scope(seg: &str) -> Option<(String, &'static str)> {
    let base = seg.strip_suffix(".scope")?;
    [
        ("docker-", "docker"),
        ("cri-containerd-", "containerd"),
        ("containerd-", "containerd"),
        ("crio-", "cri-o"),
        ("libpod-", "podman"),
    ]
    .iter()
    .find_map(|(prefix, rt)| {
        let id = base.strip_prefix(prefix)?;
        is_hex(id, 64).then(|| (id.to_string(), *rt))
    })
}

/// A pod's cgroup as the kubelet names it: `kubepods[-<qos>]-pod<UID>.slice` (systemd
/// driver, underscores for dashes) or `pod<UID>` (cgroupfs driver).
fn pod_segment(seg: &str, systemd: bool) -> Option<String> {
    let uid = if systemd {
        let base = seg.strip_suffix(".slice")?;
        [
            "kubepods-burstable-pod",
            "kubepods-besteffort-pod",
            "kubepods-pod",
        ]
        .iter()
        .find_map(|p| base.strip_prefix(p))?
    } else {
        seg.strip_prefix("pod")?
    };
    pod_uid(uid)
}

/// Container id, runtime and pod UID from one cgroup path — only in the shapes that the
/// kubelet and the runtimes create, at the places they create them, none of which an
/// unprivileged user can write (a user's systemd manager owns `user.slice/…`, a container
/// with a delegated cgroup owns only its subtree; a name there is theirs to choose):
/// - the kubelet, systemd driver: `/kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<UID>.slice[/<runtime>-<ID>.scope]`;
/// - the kubelet, cgroupfs driver: `/kubepods[/<qos>]/pod<UID>[/<ID>]`;
/// - Docker, containerd, CRI-O outside Kubernetes: `/system.slice/<runtime>-<ID>.scope`;
///   Docker with cgroupfs: `/docker/<ID>`; podman as root: `/machine.slice/libpod-<ID>.scope`.
///
/// A process in a sub-cgroup of a container's (its own init.scope, say) is that container's.
///
/// Seen from inside a cgroup namespace (Junction in a pod), a path outside it starts with
/// `/..`: the common ancestors are cut, so the rest may begin below `kubepods.slice` (a QoS
/// slice, a pod slice) or at a container scope; it is read as if they were there.
pub fn parse_cgroup_path(path: &str) -> CgroupIds {
    let mut seg: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let up = seg.iter().take_while(|s| **s == "..").count();
    if seg[up..].contains(&"..") {
        return CgroupIds::default();
    }
    seg.drain(..up);
    if up > 0
        && let Some(first) = seg.first().copied()
    {
        let above: &[&str] = if first.starts_with("kubepods-") && first.ends_with(".slice") {
            &["kubepods.slice"]
        } else if matches!(first, "burstable" | "besteffort") || pod_segment(first, false).is_some()
        {
            &["kubepods"]
        } else if runtime_scope(first).is_some_and(|(_, rt)| rt != "podman") {
            &["system.slice"]
        } else if runtime_scope(first).is_some() {
            &["machine.slice"]
        } else if is_hex(first, 64) {
            &["docker"]
        } else {
            &[]
        };
        seg.splice(0..0, above.iter().copied());
    }
    let mut ids = CgroupIds::default();
    match seg.as_slice() {
        [root @ ("kubepods.slice" | "kubepods"), rest @ ..] => {
            let systemd = *root == "kubepods.slice";
            let qos: &[&str] = if systemd {
                &["kubepods-burstable.slice", "kubepods-besteffort.slice"]
            } else {
                &["burstable", "besteffort"]
            };
            let rest = match rest.split_first() {
                Some((q, tail)) if qos.contains(q) => tail,
                _ => rest,
            };
            let Some((pod, tail)) = rest.split_first() else {
                return ids;
            };
            let Some(uid) = pod_segment(pod, systemd) else {
                return ids;
            };
            ids.pod_uid = Some(uid);
            match tail.first() {
                Some(c) if systemd => {
                    if let Some((id, rt)) = runtime_scope(c) {
                        ids.container_id = Some(id);
                        ids.runtime = Some(rt);
                    }
                }
                Some(c) if is_hex(c, 64) => ids.container_id = Some((*c).to_string()),
                _ => {}
            }
        }
        ["system.slice" | "machine.slice", scope, ..] => {
            if let Some((id, rt)) = runtime_scope(scope)
                && (seg[0] == "system.slice" || rt == "podman")
            {
                ids.container_id = Some(id);
                ids.runtime = Some(rt);
            }
        }
        ["docker", id, ..] if is_hex(id, 64) => {
            ids.container_id = Some((*id).to_string());
            ids.runtime = Some("docker");
        }
        _ => {}
    }
    ids
}

/// The cgroup path of a `/proc/PID/cgroup` file: a line whose path names a container or a
/// pod (v1 hierarchies on hybrid hosts), else the unified (`0::`) line, else the first line.
pub fn cgroup_of(text: &str) -> String {
    let mut unified = None;
    let mut first = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(_ctrl), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let ids = parse_cgroup_path(path);
        if ids.container_id.is_some() || ids.pod_uid.is_some() {
            return path.to_string();
        }
        if id == "0" {
            unified.get_or_insert(path);
        }
        first.get_or_insert(path);
    }
    unified.or(first).unwrap_or_default().to_string()
}

/// The executable's name from `/proc`, when the process is visible there.
pub fn proc_name(proc_root: &Path, pid: u32) -> Option<String> {
    let dir = proc_root.join(pid.to_string());
    if let Ok(exe) = std::fs::read_link(dir.join("exe")) {
        let exe = exe.to_string_lossy();
        let name = basename(exe.trim_end_matches(" (deleted)"));
        if !name.is_empty() {
            return Some(name.to_string());
        }
    }
    let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
    let comm = comm.trim_end_matches('\n');
    (!comm.is_empty()).then(|| comm.to_string())
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

    /// Once a minute: drops processes that ended five minutes ago and entries nobody has
    /// asked about for ten.
    fn prune_now_and_then(&self) {
        {
            let mut last = lock(&self.last_prune);
            if last.is_some_and(|t| t.elapsed() < Duration::from_secs(60)) {
                return;
            }
            *last = Some(Instant::now());
        }
        self.prune(Duration::from_secs(300), Duration::from_secs(600));
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

/// Finds the cgroup v2 directory whose inode number is `id` (what
/// `bpf_get_current_cgroup_id` returns) under `root`, breadth first, at most `limit`
/// directories.
pub fn cgroup_path_by_id(root: &Path, id: u64, limit: usize) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let mut queue = std::collections::VecDeque::from([root.to_path_buf()]);
    let mut seen = 0;
    while let Some(dir) = queue.pop_front() {
        seen += 1;
        if seen > limit {
            return None;
        }
        if std::fs::metadata(&dir).is_ok_and(|m| m.ino() == id) {
            let rel = dir.strip_prefix(root).ok()?;
            return Some(format!("/{}", rel.display()));
        }
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                queue.push_back(e.path());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4e2a1b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f";
    const UID: &str = "0b7a2c5e-9d41-4c8e-a2f3-6e1d5b9c8a70";

    fn ids(path: &str) -> (Option<String>, Option<&'static str>, Option<String>) {
        let i = parse_cgroup_path(path);
        (i.container_id, i.runtime, i.pod_uid)
    }

    #[test]
    fn docker() {
        // cgroupfs driver (v1 and v2) and systemd driver.
        assert_eq!(
            ids(&format!("/docker/{ID}")),
            (Some(ID.into()), Some("docker"), None)
        );
        assert_eq!(
            ids(&format!("/system.slice/docker-{ID}.scope")),
            (Some(ID.into()), Some("docker"), None)
        );
    }

    #[test]
    fn containerd_and_crio_under_kubernetes_systemd_slices() {
        let u = UID.replace('-', "_");
        assert_eq!(
            ids(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{ID}.scope"
            )),
            (Some(ID.into()), Some("containerd"), Some(UID.into()))
        );
        assert_eq!(
            ids(&format!(
                "/kubepods.slice/kubepods-pod{u}.slice/crio-{ID}.scope"
            )),
            (Some(ID.into()), Some("cri-o"), Some(UID.into()))
        );
        // The runtime's monitor process is in the pod but is no container.
        assert_eq!(
            ids(&format!(
                "/kubepods.slice/kubepods-pod{u}.slice/crio-conmon-{ID}.scope"
            )),
            (None, None, Some(UID.into()))
        );
    }

    #[test]
    fn kubernetes_cgroupfs_driver() {
        // cgroup v1 (a controller's path) and v2 with the cgroupfs driver.
        assert_eq!(
            ids(&format!("/kubepods/besteffort/pod{UID}/{ID}")),
            (Some(ID.into()), None, Some(UID.into()))
        );
        assert_eq!(
            ids(&format!("/kubepods/pod{UID}/{ID}")),
            (Some(ID.into()), None, Some(UID.into()))
        );
        // A static pod's UID is its config hash: 32 hex digits.
        let hash = "6f1c2b3a4d5e6f708192a3b4c5d6e7f8";
        assert_eq!(
            ids(&format!("/kubepods/burstable/pod{hash}/{ID}")).2,
            Some(hash.into())
        );
    }

    #[test]
    fn podman_systemd_and_plain_processes() {
        assert_eq!(
            ids(&format!("/machine.slice/libpod-{ID}.scope")),
            (Some(ID.into()), Some("podman"), None)
        );
        assert_eq!(
            ids(&format!("/machine.slice/libpod-conmon-{ID}.scope")),
            (None, None, None)
        );
        assert_eq!(
            ids("/system.slice/nvidia-persistenced.service"),
            (None, None, None)
        );
        assert_eq!(
            ids("/user.slice/user-0.slice/session-3.scope"),
            (None, None, None)
        );
        assert_eq!(ids("/"), (None, None, None));
        // Not an id: wrong length or not hex.
        assert_eq!(ids("/docker/abc123"), (None, None, None));
        assert_eq!(ids("/kubepods/podnot-a-uid/x"), (None, None, None));
    }

    /// A user's systemd manager (or a container with a delegated cgroup) can create any
    /// name below its own cgroup: a pod's or a container's name there is not theirs.
    #[test]
    fn names_where_users_can_write_them_are_nobodys() {
        let u = UID.replace('-', "_");
        for forged in [
            format!("/user.slice/user-1000.slice/user@1000.service/app.slice/kubepods-besteffort-pod{u}.slice/cri-containerd-{ID}.scope"),
            format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"),
            format!("/user.slice/user-1000.slice/user@1000.service/docker-{ID}.scope"),
            format!("/system.slice/docker-{ID}.scope/kubepods.slice/kubepods-pod{u}.slice/crio-{ID}.scope")
                .replace(&format!("docker-{ID}.scope"), "tenant.scope"),
            format!("/junction-test.slice/docker-{ID}.scope"),
            format!("/machine.slice/docker-{ID}.scope"),
            format!("/a/kubepods/pod{UID}/{ID}"),
            format!("/user.slice/docker/{ID}"),
        ] {
            let got = ids(&forged);
            assert_eq!(got.0, None, "{forged}");
            assert_eq!(got.2, None, "{forged}");
        }
        // In the kubelet's pod slice but not where a runtime puts a container: the pod, no
        // container.
        assert_eq!(
            ids(&format!(
                "/kubepods.slice/kubepods-pod{u}.slice/nested/cri-containerd-{ID}.scope"
            )),
            (None, None, Some(UID.into()))
        );
        // Seen from inside a cgroup namespace: the common ancestors cut.
        assert_eq!(
            ids(&format!(
                "/../../../kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{ID}.scope"
            )),
            (Some(ID.into()), Some("containerd"), Some(UID.into()))
        );
        assert_eq!(
            ids(&format!("/../../system.slice/docker-{ID}.scope")),
            (Some(ID.into()), Some("docker"), None)
        );
        assert_eq!(ids(&format!("/../docker-{ID}.scope")).0, Some(ID.into()));
        assert_eq!(
            ids(&format!(
                "/../../user.slice/user-1000.slice/user@1000.service/kubepods-pod{u}.slice/crio-{ID}.scope"
            )),
            (None, None, None)
        );
        assert_eq!(
            ids(&format!("/system.slice/../docker-{ID}.scope")),
            (None, None, None)
        );
        // A container's own sub-cgroup is still that container.
        assert_eq!(
            ids(&format!(
                "/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{ID}.scope/init.scope"
            )),
            (Some(ID.into()), Some("containerd"), Some(UID.into()))
        );
    }

    #[test]
    fn proc_cgroup_files_v1_and_v2() {
        let v2 = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(cgroup_of(&v2), format!("/system.slice/docker-{ID}.scope"));
        let v1 = format!(
            "12:cpuset:/\n11:memory:/kubepods/burstable/pod{UID}/{ID}\n10:pids:/kubepods/burstable/pod{UID}/{ID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n"
        );
        assert_eq!(cgroup_of(&v1), format!("/kubepods/burstable/pod{UID}/{ID}"));
        // Hybrid: the line that names the container wins, wherever it is.
        let hybrid = format!("0::/init.scope\n5:memory:/docker/{ID}\n");
        assert_eq!(cgroup_of(&hybrid), format!("/docker/{ID}"));
        assert_eq!(cgroup_of("1:cpu:/a\n0::/b\n"), "/b");
        assert_eq!(cgroup_of("garbage"), "");
    }

    #[test]
    fn this_process_reads_from_proc() {
        let me = read_process(Path::new("/proc"), std::process::id()).expect("self in /proc");
        assert!(read_process(Path::new("/proc"), u32::MAX - 2).is_none());
        // The executable's name (comm is cut at 15 bytes; the name is not).
        let exe = std::env::current_exe().expect("exe");
        assert_eq!(
            Some(me.name.as_str()),
            exe.file_name().and_then(|n| n.to_str())
        );
        // Field 22 of /proc/self/stat, counted after the parenthesised comm.
        let stat = std::fs::read_to_string("/proc/self/stat").expect("stat");
        let after = stat.rsplit_once(") ").map(|(_, r)| r).expect("stat fields");
        let ticks: u64 = after
            .split_whitespace()
            .nth(22 - 3)
            .and_then(|v| v.parse().ok())
            .expect("starttime");
        assert_eq!(me.start_ticks, ticks);
        let table = Processes::default();
        let a = table.identify(std::process::id(), None);
        let b = table.identify(std::process::id(), None);
        assert!(Arc::ptr_eq(&a, &b), "cached");
        // A pid not in /proc: the hint names it.
        let gone = table.identify(
            u32::MAX - 1,
            Some(&Hint {
                comm: "short".into(),
                cgroup: Some(format!("/docker/{ID}")),
            }),
        );
        assert_eq!(gone.name, "short");
        assert_eq!(gone.container_id.as_deref(), Some(ID));
        table.ended(u32::MAX - 1);
        table.prune(Duration::ZERO, Duration::from_secs(60));
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn names_come_from_proc_when_visible() {
        let dir = std::env::temp_dir().join(format!("junction-proc-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("77")).expect("dir");
        std::fs::write(dir.join("77/comm"), "trainer\n").expect("comm");
        assert_eq!(proc_name(&dir, 77).as_deref(), Some("trainer"));
        assert_eq!(proc_name(&dir, 78), None);
        assert_eq!(basename("/opt/venv/bin/python3.11"), "python3.11");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! What a cgroup says about a process: its container and pod, read only from the shapes the
//! kubelet and the runtimes create (a cgroup a tenant can name is not evidence), and where a
//! BPF cgroup id lives in the hierarchy.

use std::path::Path;

/// What the cgroup path says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupIds {
    /// Container id (64 hex digits).
    pub container_id: Option<String>,
    /// Runtime that named the cgroup.
    pub runtime: Option<&'static str>,
    /// Pod UID (dashed).
    pub pod_uid: Option<String>,
    /// Slurm job id (`slurmstepd`'s `job_<id>` cgroup).
    pub slurm_job: Option<String>,
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
///   Docker with cgroupfs: `/docker/<ID>`; podman as root: `/machine.slice/libpod-<ID>.scope`;
/// - Slurm's `slurmstepd` (root): `/system.slice/slurmstepd.scope/job_<ID>/step_<N>/…`
///   (cgroup v2), `/slurm[_<node>]/uid_<UID>/job_<ID>/step_<N>/…` (v1).
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
        // Slurm's cgroup/v2 plugin: slurmstepd's scope, then the job and its step.
        ["system.slice", "slurmstepd.scope", job, ..] => ids.slurm_job = slurm_job(job),
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
        // Its cgroup/v1 plugin: `/slurm[_<node>]/uid_<uid>/job_<id>/step_<n>/…` in each
        // controller's hierarchy.
        [root, uid, job, ..]
            if (*root == "slurm" || root.starts_with("slurm_"))
                && uid
                    .strip_prefix("uid_")
                    .is_some_and(|u| !u.is_empty() && u.bytes().all(|b| b.is_ascii_digit())) =>
        {
            ids.slurm_job = slurm_job(job);
        }
        _ => {}
    }
    ids
}

/// A Slurm job id from `job_<id>` (at most 20 digits; array and het jobs have their own ids).
fn slurm_job(seg: &str) -> Option<String> {
    seg.strip_prefix("job_")
        .filter(|id| !id.is_empty() && id.len() <= 20 && id.bytes().all(|b| b.is_ascii_digit()))
        .map(str::to_string)
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
        if ids.container_id.is_some() || ids.pod_uid.is_some() || ids.slurm_job.is_some() {
            return path.to_string();
        }
        if id == "0" {
            unified.get_or_insert(path);
        }
        first.get_or_insert(path);
    }
    unified.or(first).unwrap_or_default().to_string()
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

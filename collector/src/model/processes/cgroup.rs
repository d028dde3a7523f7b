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

/// The cgroup v2 directory whose id is `id` (what `bpf_get_current_cgroup_id` returns, the
/// directory's inode number), as a path under `root`: opened through its kernfs file handle
/// when `root` is a cgroup2 mount (one system call, as systemd and bpftool resolve an id;
/// needs `CAP_DAC_READ_SEARCH`, which the agent keeps), else found by walking `root` breadth
/// first, at most `limit` directories. The walk opened every directory of the hierarchy for
/// each new id (in the soak, 1 400 directories a second, each a 32 KiB allocation), and a
/// tenant with a delegated subtree decides how many there are.
pub fn cgroup_path_by_id(root: &Path, id: u64, limit: usize) -> Option<String> {
    match by_handle(root, id) {
        Handle::Found(path) => Some(path),
        Handle::Gone => None,
        Handle::Unsupported => walk(root, id, limit),
    }
}

/// Where the cgroup v2 hierarchy is mounted, from `/proc/self/mountinfo`: `/sys/fs/cgroup`
/// on a unified host, `/sys/fs/cgroup/unified` on a hybrid one (there `/sys/fs/cgroup` is a
/// tmpfs of v1 hierarchies, whose inode numbers are no BPF cgroup id).
pub fn cgroup2_root() -> Option<std::path::PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if right.split(' ').next() != Some("cgroup2") {
            return None;
        }
        left.split(' ').nth(4).map(|m| unescape_mount(m).into())
    })
}

/// A mountinfo path with its octal escapes (`\040` for a space) undone.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

enum Handle {
    Found(String),
    /// The kernel resolves ids here and has no such cgroup (removed, or outside `root`).
    Gone,
    /// No handles here: not cgroupfs, an old kernel, no capability.
    Unsupported,
}

#[cfg(target_os = "linux")]
fn by_handle(root: &Path, id: u64) -> Handle {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    use std::os::unix::ffi::OsStrExt as _;
    /// `FILEID_KERNFS` (include/linux/exportfs.h): an 8-byte kernfs node id.
    const FILEID_KERNFS: i32 = 0xfe;
    /// `struct file_handle` with room for the id.
    #[repr(C)]
    struct KernfsHandle {
        handle_bytes: u32,
        handle_type: i32,
        id: [u8; 8],
    }
    let Ok(mount) = std::fs::File::open(root) else {
        return Handle::Unsupported;
    };
    let mut handle = KernfsHandle {
        handle_bytes: 8,
        handle_type: FILEID_KERNFS,
        id: id.to_ne_bytes(),
    };
    // SAFETY: `handle` is a `struct file_handle` header followed by its 8 bytes; the
    // returned descriptor, if any, is owned here.
    let fd = unsafe {
        libc::open_by_handle_at(
            mount.as_raw_fd(),
            (&raw mut handle).cast::<libc::file_handle>(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return match std::io::Error::last_os_error().raw_os_error() {
            // No such node (any more): the kernel looked.
            Some(libc::ESTALE | libc::ENOENT) if is_cgroup2(&mount) => Handle::Gone,
            _ => Handle::Unsupported,
        };
    }
    // SAFETY: a descriptor just returned to us.
    let dir = unsafe { OwnedFd::from_raw_fd(fd) };
    let Ok(path) = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd())) else {
        return Handle::Unsupported;
    };
    let Ok(root) = std::fs::canonicalize(root) else {
        return Handle::Unsupported;
    };
    match path.strip_prefix(&root) {
        Ok(rel) if !rel.as_os_str().as_bytes().ends_with(b" (deleted)") => {
            Handle::Found(format!("/{}", rel.display()))
        }
        _ => Handle::Gone,
    }
}

#[cfg(not(target_os = "linux"))]
fn by_handle(_root: &Path, _id: u64) -> Handle {
    Handle::Unsupported
}

/// Whether the open directory is on a cgroup2 file system.
#[cfg(target_os = "linux")]
fn is_cgroup2(dir: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd as _;
    /// `CGROUP2_SUPER_MAGIC` (include/uapi/linux/magic.h).
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    // SAFETY: statfs writes into the struct it is given.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::fstatfs(dir.as_raw_fd(), &mut st) };
    r == 0 && st.f_type as i64 == CGROUP2_SUPER_MAGIC
}

/// The walk, where handles do not work.
fn walk(root: &Path, id: u64, limit: usize) -> Option<String> {
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
mod by_id_tests {
    use super::cgroup_path_by_id;
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(super::unescape_mount("/sys/fs/cgroup"), "/sys/fs/cgroup");
        assert_eq!(super::unescape_mount("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(super::unescape_mount("/x\\"), "/x\\");
        assert_eq!(super::unescape_mount("/x\\09"), "/x\\09");
    }

    #[test]
    fn an_id_is_found_by_walking_where_handles_do_not_work() {
        let dir = std::env::temp_dir().join(format!("junction-cg-walk-{}", std::process::id()));
        let leaf = dir.join("kubepods.slice/pod-a/cri-b");
        std::fs::create_dir_all(&leaf).expect("tree");
        let id = std::fs::metadata(&leaf).expect("leaf").ino();
        let found = cgroup_path_by_id(&dir, id, 100);
        let missing = cgroup_path_by_id(&dir, id + 1_000_000, 100);
        let limited = cgroup_path_by_id(&dir, id, 2);
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert_eq!(found.as_deref(), Some("/kubepods.slice/pod-a/cri-b"));
        assert_eq!(missing, None);
        assert_eq!(limited, None, "the walk stops at its limit");
    }

    /// On the real cgroup2 hierarchy (root: the test suite runs as root in CI): a new
    /// cgroup's id resolves through its file handle, and once it is removed, to nothing.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_cgroup_id_resolves_through_its_file_handle_on_the_real_hierarchy() {
        let root = super::cgroup2_root();
        // SAFETY: geteuid has no preconditions.
        let Some(root) = root.filter(|_| unsafe { libc::geteuid() } == 0) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs this as root on a host with a cgroup2 hierarchy"
            );
            eprintln!("skipped: needs root and a cgroup2 hierarchy");
            return;
        };
        let root = root.as_path();
        assert!(
            std::fs::File::open(root).is_ok_and(|f| super::is_cgroup2(&f)),
            "{} is the cgroup2 mount",
            root.display()
        );
        let name = format!("junction-cg-handle-{}", std::process::id());
        let dir = root.join(&name);
        std::fs::create_dir(&dir).expect("mkdir a cgroup");
        let id = std::fs::metadata(&dir).expect("cgroup").ino();
        let found = super::by_handle(root, id);
        std::fs::remove_dir(&dir).expect("rmdir the cgroup");
        let after = cgroup_path_by_id(root, id, 50_000);
        match found {
            super::Handle::Found(p) => assert_eq!(p, format!("/{name}")),
            super::Handle::Gone => panic!("the kernel found no cgroup {id}"),
            super::Handle::Unsupported => panic!("file handles do not work on cgroup2 here"),
        }
        assert_eq!(after, None, "a removed cgroup resolves to nothing");
    }
}

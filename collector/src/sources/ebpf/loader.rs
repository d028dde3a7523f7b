//! Loading and attaching the BPF programs: the embedded object, the load-time globals
//! (device majors, watched devices, kernel struct offsets, Junction's own pid), and the
//! choice between kprobes on the driver's ioctl entry points and the syscall tracepoints.
//! Every failure says what is missing and how to fix it.

use std::path::Path;

use aya::programs::{KProbe, TracePoint};
use aya::{Ebpf, EbpfLoader};
use junction_common::{MAX_WATCHED, Offsets, global, program};

use super::EbpfConfig;
use super::btf;
use super::confine;

/// The BPF object built by `cargo xtask build-ebpf`, when this binary was built after it.
#[cfg(junction_bpf)]
pub fn object() -> Option<&'static [u8]> {
    static OBJECT: &[u8] = aya::include_bytes_aligned!(env!("JUNCTION_BPF_OBJECT"));
    Some(OBJECT)
}

/// The BPF object built by `cargo xtask build-ebpf`, when this binary was built after it.
#[cfg(not(junction_bpf))]
pub fn object() -> Option<&'static [u8]> {
    None
}

/// Where tracefs lives.
const TRACEFS: &str = "/sys/kernel/tracing";

/// The driver's ioctl entry points (kprobe targets), non-static in `kernel-open/`.
pub const ENTRY_POINTS: [&str; 2] = ["nvidia_unlocked_ioctl", "uvm_unlocked_ioctl_entry"];

/// How the programs are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `syscalls/sys_{enter,exit}_ioctl`: every ioctl on the node runs the filter.
    Tracepoint,
    /// `kprobe`/`kretprobe` on the driver's entry points: only NVIDIA calls run it.
    Kprobe,
}

/// Loaded and attached programs.
pub struct Loaded {
    /// The object with its maps.
    pub bpf: Ebpf,
    /// How the ioctl programs are attached.
    pub mode: Mode,
    /// What is attached, one line each (`tracepoint syscalls/sys_enter_ioctl`).
    pub attached: Vec<String>,
    /// Devices treated as NVIDIA's: (kernel dev_t, what it is).
    pub devices: Vec<(u32, String)>,
    /// `nvidia-uvm` major (0 = none).
    pub uvm_major: u32,
    /// `watch_devices` entries that could not be read (gone since validation), and why.
    pub skipped: Vec<(String, std::io::Error)>,
    /// `nvidia-caps` major (0 = none).
    pub caps_major: u32,
    /// Watched devices: (kernel dev_t, path).
    pub watched: Vec<(u32, String)>,
    /// Why the kprobe path is not used, when it is not.
    pub kprobe_note: Option<String>,
    /// Whether aya's loader was kept from parsing the kernel's BTF.
    pub confined: confine::Confined,
}

/// Why BPF is off, with the fix.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// This binary has no BPF object.
    #[error(
        "this junction binary was built without its BPF programs: run `cargo xtask build-ebpf`, then build junction again"
    )]
    NotBuilt,
    /// No BTF for struct offsets.
    #[error(
        "cannot read kernel struct offsets from {path}: {why} (the kernel needs CONFIG_DEBUG_INFO_BTF=y, Linux 5.4 or newer)"
    )]
    Btf {
        /// The BTF file.
        path: String,
        /// What went wrong.
        why: String,
    },
    /// Not allowed to load BPF.
    #[error(
        "not allowed to load BPF programs ({0}): run as root, or grant CAP_BPF and CAP_PERFMON (and CAP_SYS_RESOURCE before Linux 5.11); in a container, the runtime's default seccomp profile allows bpf() and perf_event_open() only with CAP_SYS_ADMIN: run with seccomp unconfined, as config/kubernetes/daemonset.yaml does"
    )]
    Permission(String),
    /// tracefs is not mounted and could not be.
    #[error(
        "tracefs is not mounted on /sys/kernel/tracing and mounting it failed ({0}): on the host, run `mount -t tracefs nodev /sys/kernel/tracing` (systemd mounts it at boot); in a container, mount the host's /sys/kernel/tracing, which must itself be tracefs (mounting it from inside needs CAP_SYS_ADMIN, which the DaemonSet does not grant)"
    )]
    Tracefs(String),
    /// The kernel refused the programs.
    #[error(
        "the kernel refused the BPF programs: {0} (Linux 5.8 or newer is needed for BPF ring buffers)"
    )]
    Kernel(String),
}

fn permission_or_kernel(e: impl std::fmt::Display + std::fmt::Debug) -> LoadError {
    let text = format!("{e}");
    let debug = format!("{e:?}");
    if debug.contains("EPERM") || debug.contains("PermissionDenied") || text.contains("ermission") {
        LoadError::Permission(text)
    } else {
        LoadError::Kernel(format!("{e:#}").replace('\n', " "))
    }
}

/// `/proc/devices`' character-device majors of `nvidia-uvm` and `nvidia-caps` (dynamic).
pub fn dynamic_majors(proc_devices: &str) -> (u32, u32) {
    let (mut uvm, mut caps) = (0, 0);
    let mut chars = false;
    for line in proc_devices.lines() {
        let line = line.trim();
        if line.starts_with("Character devices") {
            chars = true;
            continue;
        }
        if line.starts_with("Block devices") {
            chars = false;
        }
        if !chars {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(major), Some(name)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(major) = major.parse::<u32>() else {
            continue;
        };
        match name {
            "nvidia-uvm" => uvm = major,
            "nvidia-caps" => caps = major,
            _ => {}
        }
    }
    (uvm, caps)
}

/// A device node's number in the kernel's encoding (`MAJOR << 20 | MINOR`), not the
/// user-space `st_rdev` encoding.
pub fn kernel_rdev(path: &Path) -> std::io::Result<u32> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::metadata(path)?;
    if !m.file_type().is_char_device() && !m.file_type().is_block_device() {
        return Err(std::io::Error::other("not a device node"));
    }
    let rdev = m.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    Ok((major << 20) | minor)
}

/// The offset of `sched_process_exit`'s `group_dead` field (Linux 6.15+), 0 if absent.
fn exit_group_dead_offset() -> u32 {
    let path = format!("{TRACEFS}/events/sched/sched_process_exit/format");
    let Ok(text) = std::fs::read_to_string(path) else {
        return 0;
    };
    text.lines()
        .find(|l| l.contains(" group_dead;"))
        .and_then(|l| l.split("offset:").nth(1))
        .and_then(|r| r.split(';').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Mounts tracefs where it is missing (tracepoint attach needs it).
fn ensure_tracefs() -> Result<(), LoadError> {
    if Path::new(TRACEFS).join("events").exists()
        || Path::new("/sys/kernel/debug/tracing/events").exists()
    {
        return Ok(());
    }
    let c = |s: &str| std::ffi::CString::new(s).unwrap_or_default();
    let (src, target, fstype) = (c("nodev"), c(TRACEFS), c("tracefs"));
    // SAFETY: mount(2) with valid NUL-terminated strings and no data.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r == 0 {
        tracing::info!("mounted tracefs on {TRACEFS}");
        return Ok(());
    }
    Err(mount_refused(
        &std::io::Error::last_os_error(),
        crate::privileges::effective(),
    ))
}

/// Why tracefs could not be mounted, for an operator: a process without CAP_BPF and
/// CAP_PERFMON lacks the privileges for eBPF whatever else is missing; one that has them
/// (the DaemonSet's set, which has no CAP_SYS_ADMIN to mount with) needs the host's tracefs
/// mounted in.
fn mount_refused(err: &std::io::Error, effective: Option<u64>) -> LoadError {
    use crate::privileges::{CAP_BPF, CAP_PERFMON};
    let bpf = (1u64 << CAP_BPF) | (1u64 << CAP_PERFMON);
    let may_trace = effective.is_some_and(|caps| caps & bpf == bpf);
    if err.kind() == std::io::ErrorKind::PermissionDenied && !may_trace {
        LoadError::Permission(format!("cannot mount tracefs on {TRACEFS}: {err}"))
    } else {
        LoadError::Tracefs(err.to_string())
    }
}

/// The driver entry points kprobes can attach to, or why there are none: the kernel must
/// have kprobes and the `nvidia` / `nvidia-uvm` modules must be loaded (their symbols in
/// kallsyms).
fn kprobe_targets() -> Result<Vec<&'static str>, String> {
    if !Path::new("/sys/bus/event_source/devices/kprobe/type").exists() {
        return Err("this kernel has no kprobes (CONFIG_KPROBES)".into());
    }
    let kallsyms =
        std::fs::read_to_string("/proc/kallsyms").map_err(|e| format!("/proc/kallsyms: {e}"))?;
    let found: Vec<&'static str> = ENTRY_POINTS
        .into_iter()
        .filter(|sym| {
            kallsyms
                .lines()
                .any(|l| l.split_whitespace().nth(2) == Some(*sym))
        })
        .collect();
    if found.is_empty() {
        return Err(
            "the nvidia modules are not loaded (no nvidia_unlocked_ioctl in /proc/kallsyms)".into(),
        );
    }
    Ok(found)
}

/// What the programs are told at load time.
pub struct Params {
    /// Never trace this tgid (Junction itself).
    pub self_tgid: u32,
    /// Trace only this tgid (0 = all).
    pub only_tgid: u32,
    /// Slow-call threshold.
    pub slow_ns: u64,
    /// Attach the empty floor programs instead (benchmark).
    pub floor: bool,
}

/// Loads the object and attaches the programs.
pub fn load(config: &EbpfConfig, params: &Params) -> Result<Loaded, LoadError> {
    let bytes = object().ok_or(LoadError::NotBuilt)?;
    let btf_path = "/sys/kernel/btf/vmlinux";
    let mut offsets: Offsets = std::fs::File::open(btf_path)
        .map_err(|e| e.to_string())
        .and_then(|f| btf::offsets(f).map_err(|e| e.to_string()))
        .map_err(|why| LoadError::Btf {
            path: btf_path.into(),
            why,
        })?;
    // Attaching tracepoints needs tracefs; the process-exit record's layout is read there.
    ensure_tracefs()?;
    offsets.exit_group_dead = exit_group_dead_offset();

    let (uvm, caps) = dynamic_majors(&std::fs::read_to_string("/proc/devices").unwrap_or_default());
    let mut devices = vec![(
        junction_common::nv::NV_MAJOR << 20,
        "/dev/nvidia* (major 195)".to_string(),
    )];
    if uvm != 0 {
        devices.push((uvm << 20, format!("/dev/nvidia-uvm* (major {uvm})")));
    }
    if caps != 0 {
        devices.push((caps << 20, format!("/dev/nvidia-caps/* (major {caps})")));
    }
    let mut watched = [0u32; MAX_WATCHED];
    let mut watched_paths = Vec::new();
    let mut skipped = Vec::new();
    for (slot, path) in watched.iter_mut().zip(&config.watch_devices) {
        // Validation has checked that each is a device node; a node gone since is skipped.
        match kernel_rdev(Path::new(path)) {
            Ok(r) => {
                *slot = r;
                watched_paths.push((r, path.clone()));
                devices.push((r, format!("{path} (watched, {}:{})", r >> 20, r & 0xFFFFF)));
            }
            Err(e) => skipped.push((path.clone(), e)),
        }
    }

    let words = offsets.to_words();
    // aya's loader parses the kernel's BTF in its constructor; these programs do not need it
    // (see `confine`), so it runs where that file cannot be read.
    let (loaded, confined) = confine::run_without(Path::new(confine::KERNEL_BTF), || {
        let mut loader = EbpfLoader::new();
        loader
            .override_global(global::SELF_TGID, &params.self_tgid, true)
            .override_global(global::ONLY_TGID, &params.only_tgid, true)
            .override_global(global::UVM_MAJOR, &uvm, true)
            .override_global(global::CAPS_MAJOR, &caps, true)
            .override_global(global::WATCHED, &watched, true)
            .override_global(global::OFFSETS, &words, true)
            .override_global(global::SLOW_NS, &params.slow_ns, true);
        loader.load(bytes).map_err(permission_or_kernel)
    })
    .map_err(|e| LoadError::Kernel(format!("loading the BPF object: {e}")))?;
    if let confine::Confined::No(why) = &confined {
        tracing::debug!(%why, "aya's loader parsed the kernel's BTF");
    }
    let mut bpf = loaded?;

    let (targets, mut kprobe_note) = match config.attach.as_str() {
        "tracepoint" => (
            Vec::new(),
            Some("sources.ebpf.attach = \"tracepoint\"".to_string()),
        ),
        _ => match kprobe_targets() {
            Ok(t) => (t, None),
            Err(why) => (Vec::new(), Some(why)),
        },
    };
    if config.attach == "kprobe"
        && let Some(why) = &kprobe_note
    {
        tracing::warn!("sources.ebpf.attach = \"kprobe\" but {why}; using the syscall tracepoints");
    }
    let mut attached = Vec::new();
    let mut mode = Mode::Tracepoint;
    if !targets.is_empty() && !params.floor {
        match attach_kprobes(&mut bpf, &targets, &mut attached) {
            Ok(()) => mode = Mode::Kprobe,
            Err(e) => {
                tracing::warn!(error = %e, "cannot attach kprobes to the driver; using the syscall tracepoints");
                kprobe_note = Some(e);
                attached.clear();
            }
        }
    }
    if mode == Mode::Tracepoint {
        let (enter, exit) = if params.floor {
            (program::EMPTY_ENTER, program::EMPTY_EXIT)
        } else {
            (program::SYS_ENTER_IOCTL, program::SYS_EXIT_IOCTL)
        };
        attach_tracepoint(
            &mut bpf,
            enter,
            "syscalls",
            "sys_enter_ioctl",
            &mut attached,
        )?;
        attach_tracepoint(&mut bpf, exit, "syscalls", "sys_exit_ioctl", &mut attached)?;
    }
    if !params.floor {
        attach_tracepoint(
            &mut bpf,
            program::SCHED_PROCESS_EXIT,
            "sched",
            "sched_process_exit",
            &mut attached,
        )?;
    }
    Ok(Loaded {
        bpf,
        mode,
        attached,
        devices,
        uvm_major: uvm,
        caps_major: caps,
        watched: watched_paths,
        kprobe_note,
        skipped,
        confined,
    })
}

fn attach_tracepoint(
    bpf: &mut Ebpf,
    name: &str,
    category: &str,
    event: &str,
    attached: &mut Vec<String>,
) -> Result<(), LoadError> {
    let prog: &mut TracePoint = bpf
        .program_mut(name)
        .ok_or_else(|| LoadError::Kernel(format!("program {name} missing from the object")))?
        .try_into()
        .map_err(|e| LoadError::Kernel(format!("{name}: {e}")))?;
    prog.load().map_err(permission_or_kernel)?;
    prog.attach(category, event).map_err(permission_or_kernel)?;
    attached.push(format!("tracepoint {category}/{event}"));
    Ok(())
}

fn attach_kprobes(
    bpf: &mut Ebpf,
    targets: &[&str],
    attached: &mut Vec<String>,
) -> Result<(), String> {
    for (name, kind) in [
        (program::IOCTL_KPROBE, "kprobe"),
        (program::IOCTL_KRETPROBE, "kretprobe"),
    ] {
        let prog: &mut KProbe = bpf
            .program_mut(name)
            .ok_or_else(|| format!("program {name} missing"))?
            .try_into()
            .map_err(|e| format!("{name}: {e}"))?;
        prog.load().map_err(|e| format!("{name}: {e}"))?;
        for t in targets {
            prog.attach(*t, 0).map_err(|e| format!("{kind} {t}: {e}"))?;
            attached.push(format!("{kind} {t}"));
        }
    }
    Ok(())
}

/// Loads (verifier-checks) the kprobe programs without attaching them: on kernels without
/// kprobes they cannot run, but the object must still be accepted.
pub fn verify_kprobe_programs(bpf: &mut Ebpf) -> Result<(), String> {
    for name in [program::IOCTL_KPROBE, program::IOCTL_KRETPROBE] {
        let prog: &mut KProbe = bpf
            .program_mut(name)
            .ok_or_else(|| format!("program {name} missing"))?
            .try_into()
            .map_err(|e| format!("{name}: {e}"))?;
        prog.load().map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majors_from_proc_devices() {
        let text = "Character devices:\n  1 mem\n195 nvidia-frontend\n 195 nvidia\n505 nvidia-uvm\n508 nvidia-caps\n509 nvidia-caps-imex-channels\n\nBlock devices:\n  7 loop\n510 nvidia-uvm\n";
        assert_eq!(dynamic_majors(text), (505, 508));
        assert_eq!(dynamic_majors("Character devices:\n  1 mem\n"), (0, 0));
    }

    #[test]
    fn kernel_encoding_of_dev_null() {
        // /dev/null is 1:3.
        assert_eq!(
            kernel_rdev(Path::new("/dev/null")).ok(),
            Some((1 << 20) | 3)
        );
        assert!(kernel_rdev(Path::new("/etc/hostname")).is_err());
    }

    /// A refused tracefs mount is blamed on missing eBPF privileges only where they are
    /// missing: with CAP_BPF and CAP_PERFMON (the DaemonSet's set) the fix is the host's
    /// tracefs, and the message says so.
    #[test]
    fn a_refused_tracefs_mount_names_the_fix_that_applies() {
        use crate::privileges::{CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE};
        let eperm = std::io::Error::from_raw_os_error(libc::EPERM);
        let daemonset = (1u64 << CAP_BPF) | (1 << CAP_PERFMON) | (1 << CAP_SYS_PTRACE);
        let e = mount_refused(&eperm, Some(daemonset));
        assert!(matches!(e, LoadError::Tracefs(_)), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("mount the host's /sys/kernel/tracing") && !text.contains("CAP_BPF"),
            "{text}"
        );
        for caps in [
            None,
            Some(0),
            Some(1u64 << CAP_BPF),
            Some(1u64 << CAP_PERFMON),
        ] {
            let e = mount_refused(&eperm, caps);
            assert!(matches!(e, LoadError::Permission(_)), "{caps:?}: {e}");
            assert!(
                e.to_string().contains("grant CAP_BPF and CAP_PERFMON"),
                "{e}"
            );
        }
        // Not a permission problem (no mount point): tracefs, whatever the capabilities.
        let enoent = std::io::Error::from_raw_os_error(libc::ENOENT);
        assert!(matches!(
            mount_refused(&enoent, Some(0)),
            LoadError::Tracefs(_)
        ));
    }
}

//! The BPF toolchain end to end (privileged): the object that `cargo xtask build-ebpf` built
//! loads into this kernel, attaches to `syscalls/sys_enter_ioctl` and counts this process's
//! ioctls exactly. Its own test binary, so that no other test thread issues ioctls meanwhile.
//!
//! Needs root and the built object; outside CI it skips with the reason, in CI it fails.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use aya::maps::HashMap;
use aya::programs::TracePoint;
use junction_common::{FILTER_TGID_GLOBAL, IOCTL_COUNTS_MAP, IOCTL_PROGRAM};

fn skip(why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{why} (CI must run the privileged tests)"
    );
    eprintln!("SKIPPED: {why}");
}

fn object() -> PathBuf {
    std::env::var_os("JUNCTION_BPF_OBJECT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../collector-ebpf/target/bpfel-unknown-none/release/junction-ebpf")
        })
}

/// tracefs is not mounted on a fresh machine; tracepoint attach needs it.
fn ensure_tracefs() {
    if Path::new("/sys/kernel/tracing/events").exists() {
        return;
    }
    let status = std::process::Command::new("mount")
        .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
        .status();
    assert!(
        status.is_ok_and(|s| s.success()),
        "cannot mount tracefs on /sys/kernel/tracing"
    );
}

#[test]
fn bpf_program_counts_this_process_ioctls() {
    let obj = object();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("not root: loading BPF programs needs CAP_BPF and CAP_PERFMON");
    }
    if !obj.exists() {
        return skip(&format!(
            "{} is missing: run `cargo xtask build-ebpf`",
            obj.display()
        ));
    }
    ensure_tracefs();
    let bytes = std::fs::read(&obj).expect("read BPF object");
    let pid = std::process::id();
    let mut bpf = aya::EbpfLoader::new()
        .override_global(FILTER_TGID_GLOBAL, &pid, true)
        .load(&bytes)
        .expect("load the BPF object");
    let prog: &mut TracePoint = bpf
        .program_mut(IOCTL_PROGRAM)
        .expect("program")
        .try_into()
        .expect("a tracepoint program");
    prog.load().expect("verifier accepts the program");
    prog.attach("syscalls", "sys_enter_ioctl")
        .expect("attach to sys_enter_ioctl");

    let null = std::fs::File::open("/dev/null").expect("open /dev/null");
    for _ in 0..1000 {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD on a valid fd with a valid int out-pointer; /dev/null answers
        // ENOTTY, which is fine: the tracepoint fires on entry.
        unsafe { libc::ioctl(null.as_raw_fd(), libc::FIONREAD, &mut n) };
    }

    let counts: HashMap<_, u32, u64> =
        HashMap::try_from(bpf.map(IOCTL_COUNTS_MAP).expect("map")).expect("a u32 -> u64 hash map");
    let n = counts.get(&pid, 0).expect("this process has a count");
    assert_eq!(n, 1000, "exactly the ioctls this test issued");
}

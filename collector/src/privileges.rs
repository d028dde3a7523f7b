//! Least privilege: once the sources have started (BPF programs loaded and attached, tracefs
//! mounted, `/dev/kmsg` and the devices open), Junction keeps only the capabilities it still
//! uses and sets `no_new_privs`.
//!
//! Kept: `CAP_SYS_PTRACE` (reading `/proc/PID/exe` of other users' processes for their names)
//! and `CAP_DAC_READ_SEARCH` (their `/proc` entries and cgroup files, and a cgroup opened by
//! its id's file handle for a process that ended before it was named). Everything else — CAP_BPF,
//! CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYSLOG, CAP_NET_ADMIN, … — is dropped from the effective,
//! permitted, inheritable, ambient and bounding sets. Open file descriptors (the BPF maps, the
//! kernel log, NVML's device files) keep working without them.
//!
//! Capabilities (and the bounding set, securebits and `no_new_privs`) are per thread in Linux,
//! so the change is made on every thread of the process: each is sent a signal whose handler
//! makes the same system calls (as libcap's psx does). Root's automatic capabilities on exec are
//! turned off (securebits NOROOT), so a tool Junction runs (ipmi-sensors) gets none.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// `CAP_DAC_READ_SEARCH`.
pub const CAP_DAC_READ_SEARCH: u32 = 2;
/// `CAP_SYS_PTRACE`.
pub const CAP_SYS_PTRACE: u32 = 19;

/// `CAP_PERFMON`.
pub const CAP_PERFMON: u32 = 38;
/// `CAP_BPF`.
pub const CAP_BPF: u32 = 39;

/// What is kept after start-up.
pub const KEEP: [u32; 2] = [CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE];

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct Header {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The capability masks every thread applies (low and high words of effective = permitted).
static MASK: AtomicU64 = AtomicU64::new(0);
/// The last error a thread met (0 = none).
static FAILED: AtomicI32 = AtomicI32::new(0);

fn capget() -> Option<[Data; 2]> {
    let mut h = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget(2) with a v3 header and two data structs, as the ABI requires.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) };
    (r == 0).then_some(d)
}

/// The calling thread's effective capabilities as a mask (bit `CAP_*`); `None` where
/// capget(2) fails.
pub fn effective() -> Option<u64> {
    capget().map(|[lo, hi]| u64::from(lo.effective) | (u64::from(hi.effective) << 32))
}

/// Sets this thread's effective and permitted sets to `mask`, inheritable to none
/// (async-signal-safe: one system call).
fn apply(mask: u64) -> i32 {
    let mut h = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let d = [
        Data {
            effective: mask as u32,
            permitted: mask as u32,
            inheritable: 0,
        },
        Data {
            effective: (mask >> 32) as u32,
            permitted: (mask >> 32) as u32,
            inheritable: 0,
        },
    ];
    // SAFETY: capset(2) with a v3 header and two data structs.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) };
    if r == 0 {
        0
    } else {
        // SAFETY: errno of this thread.
        unsafe { *libc::__errno_location() }
    }
}

/// The highest capability number of this kernel.
static LAST_CAP: AtomicU32 = AtomicU32::new(40);

/// Restricts the calling thread: root's automatic capabilities off for what it executes
/// (securebits NOROOT, locked), the bounding and ambient sets reduced to `mask`,
/// `no_new_privs`, then effective and permitted = `mask`. Only system calls:
/// async-signal-safe.
fn restrict_this_thread(mask: u64) -> i32 {
    const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
    const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
    // SAFETY: prctl(2) calls with integer arguments.
    unsafe {
        libc::prctl(
            libc::PR_SET_SECUREBITS,
            SECBIT_NOROOT | SECBIT_NOROOT_LOCKED,
            0,
            0,
            0,
        );
        for cap in 0..=LAST_CAP.load(Ordering::SeqCst) {
            if mask & (1u64 << cap) == 0 {
                libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0);
            }
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    }
    apply(mask)
}

extern "C" fn on_signal(_: libc::c_int) {
    let e = restrict_this_thread(MASK.load(Ordering::SeqCst));
    if e != 0 {
        FAILED.store(e, Ordering::SeqCst);
    }
}

/// Drops every capability but `keep` on every thread, and from the bounding and ambient sets;
/// sets `no_new_privs`. Returns what was kept, or why nothing was done.
pub fn drop_all_but(keep: &[u32]) -> Result<u64, String> {
    let Some(now) = capget() else {
        return Err("capget failed".into());
    };
    let permitted = u64::from(now[0].permitted) | (u64::from(now[1].permitted) << 32);
    if permitted == 0 {
        return Ok(0);
    }
    let wanted = keep.iter().fold(0u64, |m, c| m | (1u64 << c));
    let mask = wanted & permitted;
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    LAST_CAP.store(last.min(63), Ordering::SeqCst);
    // What the signal handler applies on every other thread.
    MASK.store(mask, Ordering::SeqCst);
    let sig = libc::SIGRTMIN() + 5;
    // SAFETY: installing a handler that only makes one system call and touches atomics;
    // SA_RESTART so that interrupted calls resume.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
            return Err("sigaction failed".into());
        }
    }
    // This thread first: a thread it starts from now on inherits the reduced sets.
    let e = restrict_this_thread(mask);
    if e != 0 {
        return Err(format!("capset failed: errno {e}"));
    }
    // SAFETY: gettid(2) has no preconditions.
    let me = unsafe { libc::gettid() };
    let pid = std::process::id() as i32;
    // Every other thread, through a signal, until a pass over /proc/self/task finds none
    // left holding more: a thread started meanwhile by one not yet restricted (a blocking
    // pool thread, a library's worker) inherited the full sets and is signalled in the next
    // pass. A thread is signalled again only if it has not answered within 100 ms (it may
    // have been ending when the signal came).
    let mut signalled: std::collections::HashMap<i32, Instant> = std::collections::HashMap::new();
    let start = Instant::now();
    loop {
        let failed = FAILED.load(Ordering::SeqCst);
        if failed != 0 {
            return Err(format!("capset failed on a thread: errno {failed}"));
        }
        let pending = threads_holding_more(me, mask);
        if pending.is_empty() {
            break;
        }
        if start.elapsed() > Duration::from_secs(2) {
            return Err(format!(
                "{} threads still hold more after 2 s (first: {})",
                pending.len(),
                pending[0].1
            ));
        }
        for (tid, _) in pending {
            if signalled
                .get(&tid)
                .is_some_and(|at| at.elapsed() < Duration::from_millis(100))
            {
                continue;
            }
            // SAFETY: tgkill(2) to a thread of this process.
            unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) };
            signalled.insert(tid, Instant::now());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    match FAILED.load(Ordering::SeqCst) {
        0 => Ok(mask),
        e => Err(format!("capset failed on a thread: errno {e}")),
    }
}

/// Threads of this process but `me` whose sets exceed `mask` or that lack `no_new_privs`,
/// with what is wrong (a thread that ends while being read is left out).
fn threads_holding_more(me: i32, mask: u64) -> Vec<(i32, String)> {
    let Ok(rd) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|t| {
            let tid = t.file_name().to_string_lossy().parse::<i32>().ok()?;
            if tid == me {
                return None;
            }
            let text = std::fs::read_to_string(t.path().join("status")).ok()?;
            thread_problem(&tid.to_string(), &text, mask)
                .err()
                .map(|e| (tid, e))
        })
        .collect()
}

/// What a thread's `/proc/.../status` says it holds beyond `mask` (effective, permitted,
/// inheritable, ambient, `no_new_privs`), or `Ok`.
fn thread_problem(tid: &str, text: &str, mask: u64) -> Result<(), String> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .and_then(|v| u64::from_str_radix(v, 16).ok().or_else(|| v.parse().ok()))
    };
    for (name, allowed) in [
        ("CapEff:", mask),
        ("CapPrm:", mask),
        ("CapInh:", 0),
        ("CapAmb:", 0),
    ] {
        match field(name) {
            Some(v) if v & !allowed == 0 => {}
            Some(v) => {
                return Err(format!(
                    "thread {tid} still holds {} in {}",
                    names(v & !allowed),
                    name.trim_end_matches(':')
                ));
            }
            None if name == "CapAmb:" => {}
            None => return Err(format!("thread {tid}: no {name} in its status")),
        }
    }
    if field("NoNewPrivs:") != Some(1) {
        return Err(format!("thread {tid} has no no_new_privs"));
    }
    Ok(())
}

/// Closed while `junction run` starts its sources with every capability: whatever reads
/// untrusted input (the kernel log, BMCs, the kubelet, `/metrics` peers, the BPF ring) waits
/// here until the capabilities are dropped. Open by default (`junction once`, tests).
static CLOSED: AtomicBool = AtomicBool::new(false);
static OPENED: (std::sync::Mutex<()>, std::sync::Condvar) =
    (std::sync::Mutex::new(()), std::sync::Condvar::new());
static OPENED_ASYNC: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Closes the gate (before the sources start).
pub fn close_gate() {
    CLOSED.store(true, Ordering::SeqCst);
}

/// Opens the gate (the capabilities are dropped, or are not to be).
pub fn open_gate() {
    let _g = crate::model::lock(&OPENED.0);
    CLOSED.store(false, Ordering::SeqCst);
    OPENED.1.notify_all();
    OPENED_ASYNC.notify_waiters();
}

/// Waits (blocking) until the gate is open.
pub fn wait_gate() {
    let mut g = crate::model::lock(&OPENED.0);
    while CLOSED.load(Ordering::SeqCst) {
        g = OPENED.1.wait(g).unwrap_or_else(|e| e.into_inner());
    }
}

/// Waits until the gate is open.
pub async fn gate() {
    loop {
        let opened = OPENED_ASYNC.notified();
        if !CLOSED.load(Ordering::SeqCst) {
            return;
        }
        opened.await;
    }
}

/// Checks every thread of this process (`/proc/self/task/*/status`): effective and
/// permitted sets within `mask`, no inheritable or ambient capability, `no_new_privs` set.
/// The bounding set is not required to shrink (that needs CAP_SETPCAP, which a container
/// rarely has; with `no_new_privs` an exec gains nothing from it).
pub fn verify(mask: u64) -> Result<usize, String> {
    let dir = std::fs::read_dir("/proc/self/task").map_err(|e| format!("/proc/self/task: {e}"))?;
    let mut threads = 0;
    for t in dir.flatten() {
        let Ok(text) = std::fs::read_to_string(t.path().join("status")) else {
            // A thread that has ended meanwhile.
            continue;
        };
        thread_problem(&t.file_name().to_string_lossy(), &text, mask)?;
        threads += 1;
    }
    Ok(threads)
}

/// Names of capabilities in a mask.
pub fn names(mask: u64) -> String {
    let n = |c: u32| match c {
        CAP_DAC_READ_SEARCH => "CAP_DAC_READ_SEARCH".to_string(),
        CAP_SYS_PTRACE => "CAP_SYS_PTRACE".to_string(),
        c => format!("cap {c}"),
    };
    let v: Vec<String> = (0..64).filter(|c| mask & (1u64 << c) != 0).map(n).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check fails for a process that still holds what it should not (this test process:
    /// root's capabilities in CI, no `no_new_privs` anywhere), naming what is held.
    #[test]
    fn the_check_names_a_thread_that_holds_too_much() {
        let e = verify(0).expect_err("this process has not dropped anything");
        assert!(e.contains("thread "), "{e}");
    }

    /// Threads started while the capabilities are being dropped (by threads not yet
    /// restricted, and by their children) end up restricted too: the check after the drop
    /// passes. Run in a child process (this test binary again), so that the drop does not
    /// reach the other tests; meaningful as root (CI), where there is something to drop.
    #[test]
    fn threads_started_during_the_drop_are_restricted_too() {
        const CHILD: &str = "JUNCTION_PRIVILEGES_CHILD";
        if std::env::var_os(CHILD).is_some() {
            let stop = std::sync::Arc::new(AtomicBool::new(false));
            let spawners: Vec<_> = (0..4)
                .map(|_| {
                    let stop = stop.clone();
                    std::thread::spawn(move || {
                        while !stop.load(Ordering::SeqCst) {
                            let _ = std::thread::spawn(|| {
                                std::thread::spawn(|| std::thread::sleep(Duration::from_millis(3)));
                                std::thread::sleep(Duration::from_millis(5));
                            });
                            std::thread::sleep(Duration::from_micros(200));
                        }
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(20));
            let kept = drop_all_but(&KEEP).expect("dropped");
            let checked = verify(kept);
            stop.store(true, Ordering::SeqCst);
            for s in spawners {
                let _ = s.join();
            }
            std::thread::sleep(Duration::from_millis(20));
            checked.expect("every thread restricted right after the drop");
            verify(kept).expect("and every thread started since");
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "privileges::tests::threads_started_during_the_drop_are_restricted_too",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .output()
            .expect("child ran");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "the child ran the test: {text}");
    }

    /// A closed gate holds readers until it opens.
    #[test]
    fn the_gate_holds_readers_until_it_opens() {
        close_gate();
        let waiter = std::thread::spawn(|| {
            wait_gate();
            !CLOSED.load(Ordering::SeqCst)
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let pending = rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(100), gate())
                .await
                .is_err()
        });
        assert!(pending, "closed: the async reader waits");
        assert!(!waiter.is_finished(), "closed: the blocking reader waits");
        open_gate();
        assert!(waiter.join().expect("thread"), "opened");
        rt.block_on(gate());
    }
}

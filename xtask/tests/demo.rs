//! `cargo xtask demo` for a fixed time, non-interactive, from what a fresh clone has (a venv
//! directory of its own, empty: the demo installs its Redfish server itself): every part shows
//! what it is there to show (the hot-HBM GPU's forecast, the ioctl workload attributed with its
//! container, each XID on its GPU, the coolant-flow alarm, the IPMI BMC's readings, OTLP data
//! received), and nothing it started is left running; a second run installs nothing; and
//! Ctrl-C stops everything it started. Needs root (eBPF, /dev/kmsg, cgroups) and the binaries
//! `cargo xtask test` builds first; outside CI it skips without them, in CI it fails.

use std::process::Command;

use testkit::free_port;

fn skip(why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{why} (CI must run the demo test)"
    );
    eprintln!("SKIPPED: {why}");
}

/// Whether the demo can run here with every part (root, and what `cargo xtask test` builds).
fn ready() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("not root: the demo's eBPF, kernel-log and cgroup parts need root");
        return false;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf();
    for built in [
        "target/debug/junction",
        "target/nvml-sim/current/libnvidia-ml.so.1",
        "collector-ebpf/target/bpfel-unknown-none/release/junction-ebpf",
    ] {
        if !root.join(built).exists() {
            skip(&format!("{built} is missing: run `cargo xtask test`"));
            return false;
        }
    }
    true
}

/// The pids the demo says it started are all gone.
fn nothing_left(text: &str) {
    let started = text
        .lines()
        .find_map(|l| l.strip_prefix("demo started: "))
        .unwrap_or_else(|| panic!("the list of what it started:\n{text}"));
    let pids: Vec<i32> = started
        .split_whitespace()
        .filter_map(|w| w.rsplit('=').next()?.parse().ok())
        .collect();
    assert!(
        pids.len() >= 4,
        "junction, the CDU, the BMC and the workload: {started}"
    );
    for pid in pids {
        // SAFETY: kill(2) with signal 0 only checks for the process.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        assert!(!alive, "pid {pid} is still running ({started})");
    }
    // The demo's own verdict, made after the same check (the loop above is the test's).
    assert!(text.contains("demo stopped: everything it started has exited"));
}

/// Ctrl-C in the middle of a run (part of the one test below: two demos at once would share
/// target/demo).
/// (With the venv the first run filled: it installs nothing.)
fn ctrl_c_stops_everything_the_demo_started(venv: &std::path::Path) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["demo", "--plain", "--no-build", "--listen"])
        .arg(format!("127.0.0.1:{}", free_port()))
        .arg("--venv")
        .arg(venv)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run the demo");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut text = String::new();
    // Running once the first view is printed.
    loop {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut out, &mut line).expect("read") == 0 {
            panic!("the demo ended before its first view:\n{text}");
        }
        text.push_str(&line);
        if line.starts_with("Junction demo") {
            break;
        }
    }
    assert!(
        text.contains("demo setup: nothing to install"),
        "a second run installs nothing:\n{text}"
    );
    std::thread::sleep(std::time::Duration::from_secs(5));
    // SAFETY: kill(2) on our own child's pid: what a terminal's Ctrl-C sends.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    std::io::Read::read_to_string(&mut out, &mut text).expect("read the rest");
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}\n{text}");
    nothing_left(&text);
}

#[test]
fn the_demo_shows_every_part_and_leaves_nothing_running() {
    if !ready() {
        return;
    }
    // A venv directory of the demo's own, empty, as on a fresh clone.
    let venv = std::env::temp_dir().join(format!("junction-demo-venv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&venv);
    std::fs::create_dir_all(&venv).expect("venv dir");
    let port = free_port();
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["demo", "--for", "55", "--plain", "--no-build", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--venv")
        .arg(&venv)
        .output()
        .expect("run the demo");
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{err}");
    let check = |what: &str| -> String {
        let prefix = format!("demo check: {what}: ");
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no check for {what}:\n{text}"));
        assert!(line.starts_with("seen"), "{what} not seen:\n{text}\n{err}");
        line.to_string()
    };
    let forecast = check("forecast");
    assert!(
        forecast.contains("GPU 4 HBM reaches its limit"),
        "{forecast}"
    );
    let workload = check("workload");
    assert!(
        workload.contains("trainer")
            && workload.contains("container de0de0")
            && workload.contains("GPU 0"),
        "{workload}"
    );
    for (code, gpu, category) in [
        (13, 0, "application"),
        (31, 1, "application"),
        (48, 2, "hardware"),
        (119, 3, "driver"),
        (63, 6, "informational"),
    ] {
        let line = check(&format!("xid {code}"));
        assert!(
            line.contains(&format!("GPU {gpu}  Xid {code}")) && line.contains(category),
            "{line}"
        );
    }
    assert!(
        text.contains("demo setup: installed sushy-tools"),
        "the demo installs its Redfish server:\n{text}"
    );
    assert!(!text.contains("MISSING:"), "{text}");
    assert!(check("coolant alarm").contains("Secondary Flow is critical"));
    assert!(check("ipmi").contains("bmc/"), "the IPMI BMC's readings");
    check("otlp");
    nothing_left(&text);
    ctrl_c_stops_everything_the_demo_started(&venv);
    let _ = std::fs::remove_dir_all(&venv);
}

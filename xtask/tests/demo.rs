//! `cargo xtask demo` for a fixed time, non-interactive: every part shows what it is there to
//! show (the hot-HBM GPU's forecast, the ioctl workload attributed with its container, each
//! XID on its GPU, the coolant-flow alarm, OTLP data received), and nothing it started is left
//! running. Needs root (eBPF, /dev/kmsg, cgroups) and what `cargo xtask test` installs and
//! builds first; outside CI it skips without them, in CI it fails.

use std::process::Command;

fn skip(why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{why} (CI must run the demo test)"
    );
    eprintln!("SKIPPED: {why}");
}

#[test]
fn the_demo_shows_every_part_and_leaves_nothing_running() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("not root: the demo's eBPF, kernel-log and cgroup parts need root");
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf();
    for built in [
        "target/debug/junction",
        "target/nvml-sim/current/libnvidia-ml.so.1",
        "collector-ebpf/target/bpfel-unknown-none/release/junction-ebpf",
        "target/venv/bin/sushy-static",
    ] {
        if !root.join(built).exists() {
            return skip(&format!("{built} is missing: run `cargo xtask test`"));
        }
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["demo", "--for", "55", "--plain", "--no-build", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
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
    assert!(check("coolant alarm").contains("Secondary Flow is critical"));
    check("otlp");
    // Nothing it started is left.
    let started = text
        .lines()
        .find_map(|l| l.strip_prefix("demo started: "))
        .expect("the list of what it started");
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
    assert!(text.contains("demo stopped: everything it started has exited"));
}

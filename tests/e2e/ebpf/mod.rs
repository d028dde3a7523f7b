//! eBPF attribution end to end (privileged): the real `junction` with its embedded BPF
//! programs attached to this kernel, `watch_devices` pointing at `/dev/null`, and a workload
//! process (a copy of this test binary named `nvworkload`, in a cgroup named like a Docker
//! container) that issues ioctls carrying NVIDIA command values and parameter structs.
//! `/dev/null` answers ENOTTY; a watched device is decoded whatever it answers.
//!
//! Needs root and a junction built after `cargo xtask build-ebpf`; outside CI the tests skip
//! with the reason, in CI they fail.
//!
//! Here, what the tests share: the checks that they can run, the agent's config, the
//! workload's cgroups and process; `attribution.rs` counts a workload's calls, bytes and
//! processes, `privileges.rs` what the agent keeps after start and says without them,
//! `workload.rs` is the workload itself.

mod attribution;
mod privileges;
mod workload;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{self, Agent, EBPF_OFF, value};

const MIB: u64 = 1 << 20;
const READY: &str = "JUNCTION-WORKLOAD-READY";
const CLIENT: u32 = 0xC1D0_0001;
const DEVICE: u32 = 0xD000_0001;

fn skip(why: &str) -> bool {
    assert!(
        std::env::var_os("CI").is_none(),
        "{why} (CI must run the privileged tests)"
    );
    eprintln!("SKIPPED: {why}");
    true
}

/// Whether the privileged tests can run here.
pub(crate) fn cannot_run() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("not root: loading BPF programs needs CAP_BPF and CAP_PERFMON");
    }
    let obj =
        support::root().join("collector-ebpf/target/bpfel-unknown-none/release/junction-ebpf");
    if !obj.exists() {
        return skip("the BPF object is not built: run `cargo xtask build-ebpf`, then the tests");
    }
    false
}

/// The simulator config with `section` for eBPF, and the real `/proc` (the workload is real).
pub(crate) fn ebpf_config(port: u16, section: &str) -> String {
    let empty = format!(
        "proc_root = {:?}",
        support::empty_proc().display().to_string()
    );
    support::sim_config("current", port, "")
        .replace(EBPF_OFF, section)
        .replace(&empty, "proc_root = \"/proc\"")
}

fn start(section: &str) -> Agent {
    let port = support::free_port();
    let mut agent = Agent::spawn_config("h100-training.toml", &ebpf_config(port, section));
    agent.wait_for(Duration::from_secs(60), |m| {
        m.contains("junction_source_up{junction_source=\"ebpf\"} 1") && m.contains("gpu_info{")
    });
    agent
}

pub(crate) const SECTION: &str = "[sources.ebpf]\nwatch_devices = [\"/dev/null\"]\nexited_retention_secs = 3\ninterval_secs = 1\n";

/// The unified cgroup hierarchy's mount point.
fn cgroup2_root() -> PathBuf {
    testkit::cgroup2_root().expect("a cgroup2 mount")
}

/// A cgroup named and placed like a Docker container's (systemd driver):
/// `system.slice/docker-<64 hex>.scope`.
fn container_cgroup(tag: u32) -> (String, PathBuf) {
    let id = format!("{:08x}{}", tag, "5eed".repeat(14));
    let dir = cgroup2_root()
        .join("system.slice")
        .join(format!("docker-{id}.scope"));
    std::fs::create_dir_all(&dir).expect("create the test cgroup");
    (id, dir)
}

/// A copy of this test binary named `nvworkload` (its exe name and comm).
fn workload_exe() -> PathBuf {
    let dir = support::temp_dir();
    let exe = dir.join("nvworkload");
    std::fs::copy(std::env::current_exe().expect("current exe"), &exe).expect("copy workload");
    exe
}

pub(crate) struct Workload {
    child: Child,
    pub(crate) pid: u32,
    container: String,
}

/// Starts the workload: `mode` is "basic", "threads" or "short"; it prints [`READY`] once its
/// ioctls are issued and (except "short") exits when its stdin closes.
pub(crate) fn spawn_workload(mode: &str, uuid: &str, tag: u32) -> Workload {
    let (container, cgroup) = container_cgroup(tag);
    spawn_workload_in(mode, uuid, &cgroup, container)
}

/// A Kubernetes pod's container cgroup (systemd driver, containerd):
/// `kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<UID>.slice/cri-containerd-<ID>.scope`.
pub(crate) fn pod_cgroup(pod_uid: &str, tag: u32) -> (String, PathBuf) {
    let id = format!("{:08x}{}", tag, "cafe".repeat(14));
    let slice = format!("kubepods-besteffort-pod{}.slice", pod_uid.replace('-', "_"));
    let dir = cgroup2_root()
        .join("kubepods.slice")
        .join("kubepods-besteffort.slice")
        .join(slice)
        .join(format!("cri-containerd-{id}.scope"));
    std::fs::create_dir_all(&dir).expect("create the pod cgroup");
    (id, dir)
}

/// The workload's test path in this binary (`workload.rs`).
const WORKLOAD_TEST: &str = "ebpf::workload::workload";

/// The workload in `mode` on the GPU `uuid`, joining `cgroup`: a copy of this binary that runs
/// [`WORKLOAD_TEST`] alone (it prints [`READY`] once its ioctls are issued; a copy that runs
/// no test prints nothing, which the callers check).
fn workload_command(mode: &str, uuid: &str, cgroup: &Path) -> Command {
    let mut c = Command::new(workload_exe());
    c.args([
        "--ignored",
        "--exact",
        WORKLOAD_TEST,
        "--nocapture",
        "--test-threads=1",
    ])
    .env("JUNCTION_WORKLOAD", mode)
    .env("JUNCTION_WORKLOAD_UUID", uuid)
    .env("JUNCTION_WORKLOAD_CGROUP", cgroup.join("cgroup.procs"));
    c
}

/// Starts the workload in the cgroup `cgroup` (named for `container`).
pub(crate) fn spawn_workload_in(
    mode: &str,
    uuid: &str,
    cgroup: &Path,
    container: String,
) -> Workload {
    let mut child = workload_command(mode, uuid, cgroup)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the workload");
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    let start = Instant::now();
    loop {
        line.clear();
        if out.read_line(&mut line).expect("read workload output") == 0 {
            panic!("the workload ended before it was ready");
        }
        // libtest prints "test <WORKLOAD_TEST> ... " before the test's own output.
        if line.contains(READY) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "workload not ready"
        );
    }
    // Keep draining its output so that it never blocks on a full pipe.
    std::thread::spawn(move || for _ in out.lines() {});
    Workload {
        child,
        pid,
        container,
    }
}

impl Workload {
    pub(crate) fn finish(mut self) {
        drop(self.child.stdin.take());
        let status = self.child.wait().expect("wait workload");
        assert!(status.success(), "workload failed: {status}");
    }
}

/// Waits until `/metrics` has a line about `pid` that contains `what`, and returns the page
/// (panics with the process's lines and the log on timeout).
pub(crate) fn wait_pid(agent: &mut Agent, pid: u32, what: &str) -> String {
    let port = agent.port;
    wait_pid_on(port, pid, what, &|| agent.log())
}

/// [`wait_pid`] for any agent serving `/metrics` on `port`; `log` says what it logged.
pub(crate) fn wait_pid_on(port: u16, pid: u32, what: &str, log: &dyn Fn() -> String) -> String {
    let needle = format!("process_pid=\"{pid}\"");
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < Duration::from_secs(30) {
        if let Ok(page) = support::scrape(port, Duration::from_secs(5)) {
            if page
                .lines()
                .any(|l| l.contains(&needle) && l.contains(what))
            {
                return page;
            }
            last = page;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let mine: Vec<&str> = last
        .lines()
        .filter(|l| l.contains(&needle) || l.contains("junction_ebpf"))
        .collect();
    panic!(
        "no line about pid {pid} with {what:?} within 30 s; its lines:\n{}\nlog:\n{}",
        mine.join("\n"),
        log()
    );
}

fn calls(series: &[support::Series], pid: u32, call: &str) -> Option<f64> {
    value(
        series,
        "gpu_process_driver_calls_total",
        &[("process_pid", &pid.to_string()), ("gpu_driver_call", call)],
    )
}

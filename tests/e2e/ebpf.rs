//! eBPF attribution end to end (privileged): the real `junction` with its embedded BPF
//! programs attached to this kernel, `watch_devices` pointing at `/dev/null`, and a workload
//! process (a copy of this test binary named `nvworkload`, in a cgroup named like a Docker
//! container) that issues ioctls carrying NVIDIA command values and parameter structs.
//! `/dev/null` answers ENOTTY; a watched device is decoded whatever it answers.
//!
//! Needs root and a junction built after `cargo xtask build-ebpf`; outside CI the tests skip
//! with the reason, in CI they fail.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::otlp::{Receiver, records};
use crate::support::{self, Agent, EBPF_OFF, parse, value};

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
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    info.lines()
        .find(|l| {
            l.split(" - ")
                .nth(1)
                .is_some_and(|r| r.starts_with("cgroup2 "))
        })
        .and_then(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .expect("a cgroup2 mount")
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

/// The 16 raw bytes of a `GPU-…` UUID.
fn raw_uuid(uuid: &str) -> [u8; 16] {
    let hex: String = uuid.trim_start_matches("GPU-").replace('-', "");
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex");
    }
    out
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

/// Starts the workload in the cgroup `cgroup` (named for `container`).
pub(crate) fn spawn_workload_in(
    mode: &str,
    uuid: &str,
    cgroup: &Path,
    container: String,
) -> Workload {
    let mut child = Command::new(workload_exe())
        .args([
            "--ignored",
            "--exact",
            "ebpf::workload",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("JUNCTION_WORKLOAD", mode)
        .env("JUNCTION_WORKLOAD_UUID", uuid)
        .env("JUNCTION_WORKLOAD_CGROUP", cgroup.join("cgroup.procs"))
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
        // libtest prints "test ebpf::workload ... " before the test's own output.
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

#[test]
fn exact_counts_bytes_gpu_pid_name_and_container_and_series_end_with_the_process() {
    if cannot_run() {
        return;
    }
    // The events go to a receiver of this test's own, and are looked up by this workload's
    // pid: every agent sees every test's /dev/null ioctls.
    let rx = Receiver::start();
    let mut agent = start(&format!(
        "{SECTION}[sinks.otlp]\nenabled = true\ninterval_secs = 1\nendpoint = {:?}\nprotocol = \"http/protobuf\"\n",
        rx.http_url()
    ));
    let uuids = support::uuids(&parse(
        &support::scrape(agent.port, Duration::from_secs(5)).expect("scrape"),
    ));
    let gpu = uuids[2].clone();
    let w = spawn_workload("basic", &gpu, 1);
    let pid = w.pid;
    let page = wait_pid(&mut agent, pid, "uvm_register_gpu");
    // Let the next interval publish every record of the sequence.
    std::thread::sleep(Duration::from_millis(1500));
    let page = support::scrape(agent.port, Duration::from_secs(5)).unwrap_or(page);
    let s = parse(&page);
    let p = pid.to_string();
    assert_eq!(calls(&s, pid, "rm_alloc"), Some(4.0), "{page}");
    assert_eq!(calls(&s, pid, "rm_free"), Some(1.0));
    assert_eq!(calls(&s, pid, "rm_control"), Some(7.0));
    assert_eq!(calls(&s, pid, "uvm_register_gpu"), Some(1.0));
    assert_eq!(calls(&s, pid, "other_rm"), None, "nothing else was called");
    let me = [
        ("process_pid", p.as_str()),
        ("process_executable_name", "nvworkload"),
        ("container_id", w.container.as_str()),
    ];
    assert_eq!(
        value(&s, "gpu_process_driver_memory_allocated_bytes_total", &me),
        Some((8 * MIB) as f64)
    );
    assert_eq!(
        value(&s, "gpu_process_driver_memory_freed_bytes_total", &me),
        Some((5 * MIB) as f64)
    );
    let mut on_gpu = me.to_vec();
    on_gpu.push(("hw_id", gpu.as_str()));
    assert_eq!(
        value(&s, "gpu_process_driver_memory_usage_bytes", &on_gpu),
        Some((3 * MIB) as f64),
        "the live 3 MiB are on the GPU registered through UVM"
    );
    assert_eq!(value(&s, "gpu_process_contexts", &on_gpu), Some(0.0));
    // Watched devices decode whatever the call returned: nothing counts as failed.
    assert_eq!(
        value(
            &s,
            "gpu_process_driver_call_failures_total",
            &[("process_pid", &p), ("gpu_driver_call", "rm_alloc")]
        ),
        Some(0.0)
    );
    // The process's start was an event about this pid, naming the device and the container.
    rx.wait_for(Duration::from_secs(30), "gpu.process.start", |r| {
        !process_events(r, "gpu.process.start", pid).is_empty()
    });
    let started = rx.with(|r| process_events(r, "gpu.process.start", pid));
    assert_eq!(started.len(), 1, "one start: {started:?}");
    assert_eq!(
        started[0].get("gpu.device").map(String::as_str),
        Some("/dev/null")
    );
    assert_eq!(
        started[0].get("container.id"),
        Some(&w.container),
        "{started:?}"
    );
    assert!(rx.with(|r| process_events(r, "gpu.process.end", pid).is_empty()));

    w.finish();
    // Its end is an event, once; the series are gone once the retention has passed.
    rx.wait_for(Duration::from_secs(30), "gpu.process.end", |r| {
        !process_events(r, "gpu.process.end", pid).is_empty()
    });
    let needle = format!("process_pid=\"{pid}\"");
    agent.wait_for(Duration::from_secs(30), move |m| !m.contains(&needle));
    let ended = rx.with(|r| process_events(r, "gpu.process.end", pid));
    assert_eq!(ended.len(), 1, "one end: {ended:?}");
    assert_eq!(
        ended[0].get("process.executable.name").map(String::as_str),
        Some("nvworkload")
    );
    assert!(agent.terminate().success());
}

/// The attributes of each log record named `event` whose `process.pid` is `pid`.
fn process_events(
    r: &support::otlp::Received,
    event: &str,
    pid: u32,
) -> Vec<std::collections::BTreeMap<String, String>> {
    records(r, event)
        .into_iter()
        .filter(|a| a.get("process.pid") == Some(&pid.to_string()))
        .collect()
}

#[test]
fn eight_threads_at_once_count_exactly() {
    if cannot_run() {
        return;
    }
    let mut agent = start(SECTION);
    let uuids = support::uuids(&parse(
        &support::scrape(agent.port, Duration::from_secs(5)).expect("scrape"),
    ));
    let w = spawn_workload("threads", &uuids[0], 2);
    let pid = w.pid;
    let want = format!(
        "gpu_driver_call=\"rm_control\"}} {}",
        THREADS * CONTROLS_PER_THREAD
    );
    let page = wait_pid(&mut agent, pid, &want);
    std::thread::sleep(Duration::from_millis(1500));
    let page = support::scrape(agent.port, Duration::from_secs(5)).unwrap_or(page);
    let s = parse(&page);
    assert_eq!(
        calls(&s, pid, "rm_control"),
        Some((THREADS * CONTROLS_PER_THREAD) as f64),
        "{page}"
    );
    assert_eq!(
        calls(&s, pid, "rm_alloc"),
        Some((2 + THREADS * ALLOCS_PER_THREAD) as f64)
    );
    let p = pid.to_string();
    assert_eq!(
        value(
            &s,
            "gpu_process_driver_memory_usage_bytes",
            &[("process_pid", &p), ("hw_id", &uuids[0])]
        ),
        Some((THREADS * ALLOCS_PER_THREAD * MIB as usize) as f64)
    );
    assert_eq!(
        value(
            &s,
            "junction_ebpf_lost_total",
            &[("junction_reason", "ring_full")]
        ),
        Some(0.0)
    );
    w.finish();
}

#[test]
fn a_process_that_lives_50_ms_is_still_seen() {
    if cannot_run() {
        return;
    }
    let mut agent = start(SECTION);
    let uuids = support::uuids(&parse(
        &support::scrape(agent.port, Duration::from_secs(5)).expect("scrape"),
    ));
    let (container, cgroup) = container_cgroup(3);
    let started = Instant::now();
    let status = Command::new(workload_exe())
        .args([
            "--ignored",
            "--exact",
            "ebpf::workload",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("JUNCTION_WORKLOAD", "short")
        .env("JUNCTION_WORKLOAD_UUID", &uuids[1])
        .env("JUNCTION_WORKLOAD_CGROUP", cgroup.join("cgroup.procs"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = status.id();
    let out = status.wait_with_output().expect("wait");
    assert!(out.status.success());
    eprintln!("workload ran {:?} in all", started.elapsed());
    // Long gone before any scrape: still exported, with its name and container. What it
    // allocated is counted; what it held when it ended the driver freed as its descriptors
    // closed, so it holds nothing (a sum over processes does not count freed memory).
    let page = wait_pid(&mut agent, pid, "uvm_register_gpu");
    let s = parse(&page);
    assert_eq!(calls(&s, pid, "rm_alloc"), Some(4.0), "{page}");
    let p = pid.to_string();
    let me = [
        ("process_pid", p.as_str()),
        ("process_executable_name", "nvworkload"),
        ("container_id", container.as_str()),
    ];
    assert_eq!(
        value(&s, "gpu_process_driver_memory_allocated_bytes_total", &me),
        Some((8 * MIB) as f64),
        "{page}"
    );
    assert_eq!(
        value(&s, "gpu_process_driver_memory_freed_bytes_total", &me),
        Some((8 * MIB) as f64),
        "5 MiB by RM_FREE, 3 MiB at its end: {page}"
    );
    let mut on_gpu = me.to_vec();
    on_gpu.push(("hw_id", uuids[1].as_str()));
    assert_eq!(
        value(&s, "gpu_process_driver_memory_usage_bytes", &on_gpu),
        Some(0.0),
        "{page}"
    );
}

/// A `Cap*:` or `NoNewPrivs:` field of a `/proc/PID/task/TID/status` file.
fn status_field(status: &str, field: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {field} in\n{status}"))
}

#[test]
fn after_start_every_thread_keeps_two_capabilities_and_attribution_still_works() {
    if cannot_run() {
        return;
    }
    let mut agent = start(SECTION);
    let pid = agent.child.id();
    // CAP_DAC_READ_SEARCH (2) and CAP_SYS_PTRACE (19).
    let kept = format!("{:016x}", (1u64 << 2) | (1u64 << 19));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut report = Vec::new();
        let mut all = true;
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("task dir");
        for t in tasks.flatten() {
            let Ok(status) = std::fs::read_to_string(t.path().join("status")) else {
                continue; // a thread that just ended
            };
            let name = status_field(&status, "Name:");
            let fields = ["CapEff:", "CapPrm:", "CapInh:", "CapBnd:", "CapAmb:"]
                .map(|f| status_field(&status, f));
            let nnp = status_field(&status, "NoNewPrivs:");
            let ok = fields[0] == kept
                && fields[1] == kept
                && fields[2] == "0000000000000000"
                && fields[3] == kept
                && fields[4] == "0000000000000000"
                && nnp == "1";
            all &= ok;
            report.push(format!("{name}: {fields:?} no_new_privs {nnp}"));
        }
        if all && !report.is_empty() {
            eprintln!("{} threads, each with only {kept}", report.len());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "threads with more than {kept}:\n{}\nlog:\n{}",
            report.join("\n"),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        agent.log().contains("dropped every other capability"),
        "{}",
        agent.log()
    );
    // The BPF programs, the maps and /proc still work without the dropped capabilities.
    let uuids = support::uuids(&parse(
        &support::scrape(agent.port, Duration::from_secs(5)).expect("scrape"),
    ));
    let w = spawn_workload("basic", &uuids[4], 6);
    let page = wait_pid(&mut agent, w.pid, "uvm_register_gpu");
    assert!(
        page.contains("process_executable_name=\"nvworkload\""),
        "the name still comes from /proc"
    );
    assert!(
        page.contains(&w.container),
        "the container still comes from the cgroup"
    );
    w.finish();
    let status = agent.terminate();
    assert!(status.success(), "a clean stop after the drop: {status}");
}

/// A panic of the ring's drain after the capability drop (a defect of Junction's; a debug
/// build's failpoint makes it here, after the drain's first refresh): the panic is counted,
/// the source is started again with the programs still attached and their maps (it could not
/// load them again without CAP_BPF), and a workload started after it is attributed.
#[test]
fn after_its_drain_panics_attribution_goes_on_without_the_dropped_capabilities() {
    if cannot_run() {
        return;
    }
    let port = support::free_port();
    let mut agent = Agent::spawn_config_env(
        "h100-training.toml",
        &ebpf_config(port, SECTION),
        &[("JUNCTION_FAILPOINT_EBPF_PANIC", "1")],
    );
    let panics = |m: &str| {
        value(
            &parse(m),
            "junction_source_errors_total",
            &[
                ("junction_source", "ebpf"),
                ("junction_stage", "task"),
                ("error_type", "panic"),
            ],
        )
    };
    let page = agent.wait_for(Duration::from_secs(60), |m| {
        panics(m) == Some(1.0)
            && m.contains("junction_source_up{junction_source=\"ebpf\"} 1")
            && m.contains("gpu_info{")
    });
    let uuids = support::uuids(&parse(&page));
    let w = spawn_workload("basic", &uuids[1], 17);
    wait_pid(&mut agent, w.pid, "uvm_register_gpu");
    w.finish();
    let log = agent.log();
    assert!(log.contains("JUNCTION_FAILPOINT_EBPF_PANIC"), "{log}");
    assert!(
        log.contains("eBPF attribution on again, with the programs still attached"),
        "{log}"
    );
    assert!(!log.contains("eBPF attribution is off"), "{log}");
    let last = support::scrape(port, Duration::from_secs(5)).expect("scrape");
    assert_eq!(panics(&last), Some(1.0), "one panic, no more");
    assert!(agent.terminate().success(), "SIGTERM exits 0");
}

#[test]
fn without_privileges_or_when_disabled_junction_runs_and_says_why() {
    // Disabled: said once, and everything else works.
    let port = support::free_port();
    let mut off = Agent::spawn_config(
        "h100-training.toml",
        &ebpf_config(port, "[sources.ebpf]\nenabled = false\n"),
    );
    off.wait_for(Duration::from_secs(30), |m| {
        m.contains("hw_gpu_memory_usage_bytes")
    });
    assert!(
        off.log()
            .contains("eBPF attribution is off (sources.ebpf.enabled = false)"),
        "{}",
        off.log()
    );
    // Unprivileged: as root, run junction as nobody with no capabilities.
    let port = support::free_port();
    let dir = support::temp_dir();
    let config = dir.join("junction.toml");
    std::fs::write(
        &config,
        ebpf_config(port, "[sources.ebpf]\nenabled = true\n"),
    )
    .expect("write config");
    let log = dir.join("stderr.log");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut cmd = if root {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(env!("CARGO_BIN_EXE_junction"));
        c
    } else {
        support::junction()
    };
    // The directory chain must be readable by nobody.
    for d in [dir.as_path(), dir.parent().unwrap_or(Path::new("/"))] {
        let _ = std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755));
    }
    let child = cmd
        .env(
            "JUNCTION_NVML_SIM_SCENARIO",
            support::scenario("h100-training.toml"),
        )
        .env("RUST_LOG", "info")
        .arg("--config")
        .arg(&config)
        .arg("run")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn junction");
    let mut agent = Agent {
        child,
        port,
        stderr: log,
        config,
    };
    agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("hw_gpu_memory_usage_bytes")
    });
    // Counted as the eBPF source's failure to load.
    agent.wait_for(Duration::from_secs(30), |m| {
        support::value(
            &support::parse(m),
            "junction_source_errors_total",
            &[
                ("junction_source", "ebpf"),
                ("junction_stage", "load"),
                ("error_type", "unavailable"),
            ],
        ) == Some(1.0)
    });
    let text = agent.log();
    let line = text
        .lines()
        .find(|l| l.contains("eBPF attribution is off"))
        .unwrap_or_else(|| panic!("no reason given:\n{text}"));
    assert!(
        line.contains("not allowed to load BPF programs") && line.contains("CAP_BPF"),
        "the reason and the fix: {line}"
    );
    assert_eq!(
        text.matches("eBPF attribution is off").count(),
        1,
        "said once"
    );
}

#[test]
fn inventory_shows_what_is_attached() {
    if cannot_run() {
        return;
    }
    let port = support::free_port();
    let dir = support::temp_dir();
    let config = dir.join("junction.toml");
    std::fs::write(&config, ebpf_config(port, SECTION)).expect("write config");
    let out = support::output(
        support::junction()
            .env(
                "JUNCTION_NVML_SIM_SCENARIO",
                support::scenario("h100-training.toml"),
            )
            .arg("--config")
            .arg(&config)
            .arg("inventory"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "Source ebpf:",
        "attached: tracepoint syscalls/sys_enter_ioctl",
        "attached: tracepoint syscalls/sys_exit_ioctl",
        "attached: tracepoint sched/sched_process_exit",
        "devices: /dev/null (watched, 1:3)",
        "kprobe programs: accepted by the verifier",
        // aya's loader did not parse the kernel's BTF (this kernel, and CI's, has Landlock).
        "loader: kept from the kernel's BTF by Landlock",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
}

// ---- the workload ----

const THREADS: usize = 8;
const CONTROLS_PER_THREAD: usize = 500;
const ALLOCS_PER_THREAD: usize = 25;

fn ioctl<T>(fd: i32, cmd: u32, arg: &mut T) {
    // SAFETY: ioctl on /dev/null with a pointer to a live parameter block; /dev/null answers
    // ENOTTY and touches nothing.
    let r = unsafe { libc::ioctl(fd, cmd as libc::c_ulong, arg as *mut T) };
    assert_eq!(r, -1, "/dev/null implements no ioctls");
}

/// `NVOS64_PARAMETERS` (48 bytes). The workload writes its parameter blocks and command values
/// from the driver's headers on its own, not with `junction_common::nv::encode`, so that a wrong
/// offset shared by Junction's encoder and decoder would still fail these tests.
#[repr(C)]
struct Nvos64 {
    h_root: u32,
    h_parent: u32,
    h_new: u32,
    h_class: u32,
    p_alloc: u64,
    p_rights: u64,
    params_size: u32,
    flags: u32,
    status: u32,
    pad: u32,
}

fn alloc(fd: i32, parent: u32, handle: u32, class: u32, params: *mut u8) {
    let mut p = Nvos64 {
        h_root: CLIENT,
        h_parent: parent,
        h_new: handle,
        h_class: class,
        p_alloc: params as u64,
        p_rights: 0,
        params_size: 0,
        flags: 0,
        status: 0,
        pad: 0,
    };
    ioctl(fd, 0xC030_462B, &mut p);
}

fn alloc_memory(fd: i32, handle: u32, bytes: u64) {
    // NV_MEMORY_ALLOCATION_PARAMS (128 bytes), size@64.
    let mut params = [0u8; 128];
    params[64..72].copy_from_slice(&bytes.to_le_bytes());
    alloc(fd, DEVICE, handle, 0x40, params.as_mut_ptr());
}

fn control(fd: i32) {
    // NVOS54_PARAMETERS (32 bytes): NV2080_CTRL_CMD_GPU_GET_PID_INFO.
    let mut p = [0u32; 8];
    p[0] = CLIENT;
    p[1] = DEVICE;
    p[2] = 0x2080_018E;
    ioctl(fd, 0xC020_462A, &mut p);
}

fn setup(fd: i32, uuid: &str) {
    alloc(fd, 0, CLIENT, 0x41, std::ptr::null_mut());
    // NV0080_ALLOC_PARAMETERS: deviceId@0.
    let mut dev = [0u8; 56];
    alloc(fd, CLIENT, DEVICE, 0x80, dev.as_mut_ptr());
    // UVM_REGISTER_GPU_PARAMS (40 bytes): uuid@0, hClient@28.
    let mut reg = [0u8; 40];
    reg[..16].copy_from_slice(&raw_uuid(uuid));
    reg[28..32].copy_from_slice(&CLIENT.to_le_bytes());
    ioctl(fd, 37, &mut reg);
}

/// Not a test: the workload the eBPF tests run (in a copy of this binary), selected by
/// `JUNCTION_WORKLOAD`.
#[test]
#[ignore = "the workload the eBPF tests start; not a test of its own"]
fn workload() {
    // Run with --ignored by hand: nothing to do unless a test started it.
    let Ok(mode) = std::env::var("JUNCTION_WORKLOAD") else {
        return;
    };
    let uuid = std::env::var("JUNCTION_WORKLOAD_UUID").expect("JUNCTION_WORKLOAD_UUID");
    let started = Instant::now();
    if let Ok(procs) = std::env::var("JUNCTION_WORKLOAD_CGROUP") {
        std::fs::write(&procs, std::process::id().to_string()).expect("join the cgroup");
    }
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .expect("open /dev/null");
    let fd = null.as_raw_fd();
    match mode.as_str() {
        "basic" | "short" => {
            setup(fd, &uuid);
            alloc_memory(fd, 0x10, 3 * MIB);
            alloc_memory(fd, 0x11, 5 * MIB);
            // NVOS00_PARAMETERS: hRoot, hObjectParent, hObjectOld, status.
            let mut free = [CLIENT, DEVICE, 0x11, 0];
            ioctl(fd, 0xC010_4629, &mut free);
            for _ in 0..7 {
                control(fd);
            }
        }
        "threads" => {
            setup(fd, &uuid);
            std::thread::scope(|s| {
                for t in 0..THREADS {
                    s.spawn(move || {
                        for i in 0..CONTROLS_PER_THREAD {
                            control(fd);
                            if i % (CONTROLS_PER_THREAD / ALLOCS_PER_THREAD) == 0 {
                                alloc_memory(fd, 0x1000_0000 + (t * 1000 + i) as u32, MIB);
                            }
                        }
                    });
                }
            });
        }
        m => panic!("unknown workload {m}"),
    }
    println!("{READY}");
    std::io::stdout().flush().expect("flush");
    if mode == "short" {
        std::thread::sleep(Duration::from_millis(50).saturating_sub(started.elapsed()));
        return;
    }
    // Until the test closes stdin.
    let mut buf = String::new();
    let _ = std::io::stdin().read_line(&mut buf);
}

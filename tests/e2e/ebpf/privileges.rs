//! What the agent keeps after its start (two capabilities), after its drain panics, and what
//! it says without privileges or when disabled; what `inventory` shows attached.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{SECTION, cannot_run, ebpf_config, spawn_workload, start, wait_pid};
use crate::support::{self, Agent, parse, value};

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
    let out = support::inventory(&config, Some("h100-training.toml"));
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

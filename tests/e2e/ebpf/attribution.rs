//! A workload's calls, bytes, GPU, process and container, counted exactly and ended with it.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::otlp::{Receiver, records};
use crate::support::{self, parse, value};

use super::workload::{ALLOCS_PER_THREAD, CONTROLS_PER_THREAD, THREADS};
use super::{
    MIB, READY, SECTION, calls, cannot_run, container_cgroup, spawn_workload, start, wait_pid,
    workload_command,
};

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
    let status = workload_command("short", &uuids[1], &cgroup)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = status.id();
    let out = status.wait_with_output().expect("wait");
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains(READY), "the workload did not run:\n{said}");
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

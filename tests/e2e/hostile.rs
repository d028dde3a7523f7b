//! Network-facing parts under hostile peers: `/metrics` with thousands of idle and
//! slow-header connections held open still answers scrapes, holds a bounded number of
//! descriptors, and the other sources keep working.

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use crate::kmsg::{domain, scenario};
use crate::support::{self, Agent, parse, value, wait_until};

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn append(path: &Path, text: &str) {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open")
        .write_all(text.as_bytes())
        .expect("append");
}

/// 2000 connections held open (half idle, half sending a request head one byte at a time
/// and never finishing it) against an agent with the shipped unit's 1024 descriptors:
/// scrapes answer, the agent's descriptors stay under its connection cap, and the kernel-log
/// file source still counts a new XID and saves its state.
#[test]
fn metrics_survives_idle_and_slow_header_connections() {
    let d = domain(21);
    let scen = scenario(d, 1, "");
    let dir = support::temp_dir();
    let log = dir.join("kern.log");
    append(&log, "Dec  1 00:00:00 node kernel: booting\n");
    let state = dir.join("state");
    let port = support::free_port();
    let base = support::sim_config("current", port, "");
    let (head, rest) = base.split_once("state_dir = ").expect("state_dir");
    let rest = rest.split_once('\n').map_or("", |(_, r)| r);
    let cfg = format!(
        "{head}state_dir = {:?}\n{rest}\n[sources.kmsg]\ndevice = \"\"\nfiles = [{:?}]\n",
        state.display().to_string(),
        log.display().to_string()
    );
    let mut agent = Agent::spawn_config_path(&scen, &cfg, &[]);
    let pid = agent.child.id();
    // The shipped systemd unit's limit (LimitNOFILE=1024).
    let limit = libc::rlimit64 {
        rlim_cur: 1024,
        rlim_max: 1024,
    };
    // SAFETY: prlimit64 on our own child with a valid rlimit; no old value requested.
    let rc = unsafe {
        libc::prlimit64(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            &limit,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit");
    let body = agent.wait_for(Duration::from_secs(30), |m| m.contains("gpu_info"));
    let gpu = support::uuids(&parse(&body))[0].clone();
    let before = fds(pid);
    let mut held = Vec::new();
    for i in 0..2000 {
        // An agent out of descriptors stops accepting: connects then time out.
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
            continue;
        };
        if i % 2 == 1 {
            let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
        }
        held.push(s);
    }
    eprintln!(
        "holding {} connections; the agent had {before} descriptors",
        held.len()
    );
    // Slow headers: a byte at a time.
    for s in held.iter_mut().skip(1).step_by(2).take(200) {
        let _ = s.write_all(b"X");
    }
    wait_until(Duration::from_secs(20), "a scrape answers", || {
        support::scrape(port, Duration::from_secs(2)).is_ok_and(|b| b.contains("gpu_info"))
    });
    let during = fds(pid);
    assert!(
        during <= before + crate_cap() + 8,
        "{during} descriptors (from {before}) with {} connections held",
        held.len()
    );
    append(
        &log,
        &format!(
            "Dec  1 01:00:00 node kernel: NVRM: Xid (PCI:{d:04x}:18:00): 13, pid=3, name=a, x\n"
        ),
    );
    wait_until(Duration::from_secs(20), "the XID counted and saved", || {
        let counted = support::scrape(port, Duration::from_secs(2)).is_ok_and(|b| {
            value(
                &parse(&b),
                "gpu_xid_errors_total",
                &[("hw_id", &gpu), ("gpu_xid", "13")],
            ) == Some(1.0)
        });
        let saved = std::fs::read_to_string(state.join("xid.json")).is_ok_and(|s| s.contains(&gpu));
        counted && saved
    });
    drop(held);
    assert!(agent.terminate().success());
}

/// The agent's connection cap (`sinks::prometheus::MAX_CONNECTIONS`).
fn crate_cap() -> usize {
    64
}

//! The kernel-log source end to end: XID and SXid lines written to the real `/dev/kmsg`
//! (privileged: root writes records; CI runs these, elsewhere they skip with the reason) or
//! to a followed file, counted per GPU UUID on `/metrics`; restarts that neither replay nor
//! miss; the NVML event path alone and together with the kernel log; floods.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::{self, Agent, parse, scrape, value};

mod files;

/// True when this process may write `/dev/kmsg`; otherwise skips (a failure in CI).
pub(crate) fn privileged() -> bool {
    if testkit::kmsg::writable() {
        return true;
    }
    let why = "not root, or /dev/kmsg is not writable: the kernel-log tests write records";
    assert!(
        std::env::var_os("CI").is_none(),
        "{why} (CI must run the privileged tests)"
    );
    eprintln!("SKIPPED: {why}");
    false
}

pub use testkit::kmsg::write as kmsg_write;

/// A PCI domain of this test process's own, so that its lines cannot be counted by another
/// test (or an earlier run) reading the same kernel log.
pub(crate) fn domain(salt: u32) -> u32 {
    (std::process::id()
        .wrapping_mul(7919)
        .wrapping_add(salt * 104729)
        % 0xfff0)
        + 1
}

/// A scenario of `gpus` H100s on PCI domain `d`, buses 0x18, 0x19, …
pub(crate) fn scenario(d: u32, gpus: u32, extra: &str) -> PathBuf {
    let dir = support::temp_dir();
    let path = dir.join("xid-node.toml");
    let list: Vec<String> = (0..gpus)
        .map(|i| format!("{{ pci_domain = {d}, pci_bus = {} }}", 0x18 + i))
        .collect();
    std::fs::write(
        &path,
        format!(
            "base = {:?}\ngpu_count = {gpus}\ngpus = [{}]\n{extra}\n",
            support::scenario("h100-training.toml")
                .display()
                .to_string(),
            list.join(", ")
        ),
    )
    .expect("scenario");
    path
}

pub(crate) fn config(port: u16, state: &Path, kmsg: &str) -> String {
    let base = support::sim_config("current", port, "lost_retry_max_secs = 1");
    let (head, rest) = base.split_once("state_dir = ").expect("a state_dir line");
    let rest = rest.split_once('\n').map_or("", |(_, r)| r);
    format!(
        "{head}state_dir = {:?}\n{rest}\n[sources.kmsg]\n{kmsg}\n",
        state.display().to_string()
    )
}

pub(crate) fn start(scenario: &Path, config: &str) -> Agent {
    let mut a = Agent::spawn_config_path(scenario, config, &[]);
    a.wait_for(Duration::from_secs(30), |m| {
        m.contains("hw_gpu_memory_usage_bytes")
    });
    a
}

pub(crate) fn xid(body: &str, gpu: &str, code: &str) -> Option<f64> {
    value(
        &parse(body),
        "gpu_xid_errors_total",
        &[("hw_id", gpu), ("gpu_xid", code)],
    )
}

/// XID lines for simulator GPUs appear on `/metrics` against the right GPU UUID; SXid
/// companions and the fallen-off-the-bus line that follows an Xid 79 do not over-count;
/// after a restart nothing is counted twice, lines written while Junction was stopped are
/// counted and the held health reason is back. (Forged records: `kmsg_trust.rs`.)
#[test]
fn xids_from_dev_kmsg_per_gpu_and_across_restarts() {
    if !privileged() {
        return;
    }
    let d = domain(1);
    let scen = scenario(d, 4, "");
    let state = support::temp_dir().join("state");
    let port = support::free_port();
    let cfg = config(port, &state, "accept_user_records = true");
    let mut agent = start(&scen, &cfg);
    let s = parse(&agent.wait_for(Duration::from_secs(10), |m| m.contains("gpu_info")));
    let ids = support::uuids(&s);
    let p = |bus: u32| format!("{d:04x}:{bus:02x}:00");
    let unix_now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    let written_at = unix_now();
    kmsg_write(&[
        format!(
            "NVRM: Xid (PCI:{}): 13, pid=4242, name=trainer, Graphics SM Warp Exception",
            p(0x18)
        ),
        format!(
            "NVRM: Xid (PCI:{} GPU-I:03): 31, pid=77, MMU Fault: ENGINE GRAPHICS",
            p(0x19)
        ),
        format!(
            "NVRM: Xid (PCI:{}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            p(0x1a)
        ),
        format!("NVRM: GPU {}.0: GPU has fallen off the bus.", p(0x1a)),
        format!(
            "nvidia-nvswitch1: SXid (PCI:{d:04x}:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"
        ),
        format!(
            "nvidia-nvswitch1: SXid (PCI:{d:04x}:06:00.0): 20034, Severity 1 Engine instance 60 Sub-engine instance 00"
        ),
        format!(
            "nvidia-nvswitch1: SXid (PCI:{d:04x}:06:00.0): 20034, Data {{0x10000000, 0x10000000}}"
        ),
        format!(
            "NVRM: GPU at PCI:{}: GPU-deadbeef-0000-4000-8000-{d:012x}",
            p(0x99)
        ),
        format!(
            "NVRM: Xid (PCI:{}): 43, pid=9, name=orphan, channel 0x0b00000a",
            p(0x99)
        ),
    ]);
    let orphan = format!("PCI-{}", p(0x99));
    let body = agent.wait_for(Duration::from_secs(10), |m| {
        m.contains(&orphan) && m.contains(&format!("NVSwitch-PCI-{d:04x}:06:00.0"))
    });
    assert_eq!(xid(&body, &ids[0], "13"), Some(1.0));
    assert_eq!(xid(&body, &ids[1], "31"), Some(1.0));
    assert_eq!(
        xid(&body, &ids[2], "79"),
        Some(1.0),
        "the bus line is the same occurrence (domain {d:04x}):\n{body}\n{}",
        agent.log()
    );
    // No NVIDIA device at that address on this bus: its preamble's UUID is not learned.
    assert_eq!(xid(&body, &orphan, "43"), Some(1.0));
    assert!(!body.contains(&format!("GPU-deadbeef-0000-4000-8000-{d:012x}")));
    let sxid = parse(&body)
        .into_iter()
        .filter(|x| {
            x.name == "gpu_sxid_errors_total"
                && x.labels["hw_id"] == format!("NVSwitch-PCI-{d:04x}:06:00.0")
        })
        .collect::<Vec<_>>();
    assert_eq!(sxid.len(), 1, "{sxid:?}");
    assert_eq!(sxid[0].value, 1.0, "companions are not new SXids");
    assert_eq!(sxid[0].labels["gpu_sxid_severity"], "fatal");
    let s = parse(&body);
    assert_eq!(
        value(
            &s,
            "hw_status",
            &[("hw_id", &ids[2]), ("hw_state", "failed")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "gpu_health_reason",
            &[("hw_id", &ids[2]), ("gpu_health_reason", "xid_79")]
        ),
        Some(1.0)
    );
    // The record's kernel timestamp as wall-clock time: when it was written (to the second).
    let last = value(&s, "gpu_xid_last_time_seconds", &[("hw_id", &ids[0])]).unwrap_or(0.0);
    assert!(
        (written_at - 5.0..=unix_now() + 1.0).contains(&last),
        "last XID at {last}, written at {written_at}"
    );
    assert!(agent.terminate().success());

    // Written while Junction is down.
    kmsg_write(&[
        format!(
            "NVRM: Xid (PCI:{}): 13, pid=4243, name=trainer, Graphics Exception",
            p(0x18)
        ),
        format!(
            "NVRM: Xid (PCI:{}): 48, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860",
            p(0x1b)
        ),
    ]);
    let mut agent = start(&scen, &cfg);
    let body = agent.wait_for(Duration::from_secs(10), |m| xid(m, &ids[3], "48").is_some());
    assert_eq!(
        xid(&body, &ids[0], "13"),
        Some(2.0),
        "not replayed, not missed"
    );
    assert_eq!(xid(&body, &ids[3], "48"), Some(1.0));
    assert_eq!(
        xid(&body, &ids[2], "79"),
        Some(1.0),
        "kept across the restart"
    );
    let s = parse(&body);
    assert_eq!(
        value(
            &s,
            "hw_status",
            &[("hw_id", &ids[2]), ("hw_state", "failed")]
        ),
        Some(1.0),
        "Xid 79 holds until the node reboots, across a restart"
    );
    assert!(agent.terminate().success());
}

/// The NVML event path alone (the kernel log off) counts the simulator's XIDs; with both
/// paths, the same XID on the same GPU counts once, and a second kernel-log line is a second
/// occurrence.
#[test]
fn nvml_events_alone_and_together_with_the_kernel_log() {
    let d = domain(2);
    let events = "[[events]]\ngpu = 0\nat_secs = 1.0\nxid = 13\n[[events]]\ngpu = 1\nat_secs = 1.0\nxid = 31\n";
    let scen = scenario(d, 2, events);
    let state = support::temp_dir().join("state");
    let port = support::free_port();
    let mut agent = start(&scen, &config(port, &state, "enabled = false"));
    let body = agent.wait_for(Duration::from_secs(15), |m| {
        m.contains("gpu_xid_errors_total{")
    });
    let ids = support::uuids(&parse(&body));
    let body = agent.wait_for(Duration::from_secs(15), |m| xid(m, &ids[1], "31").is_some());
    assert_eq!(xid(&body, &ids[0], "13"), Some(1.0));
    assert_eq!(xid(&body, &ids[1], "31"), Some(1.0));
    assert!(agent.terminate().success());

    if !privileged() {
        return;
    }
    let state = support::temp_dir().join("state");
    let mut agent = start(&scen, &config(port, &state, "accept_user_records = true"));
    agent.wait_for(Duration::from_secs(15), |m| {
        xid(m, &ids[0], "13") == Some(1.0)
    });
    let line = format!("NVRM: Xid (PCI:{d:04x}:18:00): 13, pid=5, name=app, Graphics Exception");
    // Wait until the agent has read this very record (its saved position passes it): only
    // then does "one XID" say that the two paths were joined.
    let seq = crate::kmsg_trust::write_and_wait_read(&state, std::slice::from_ref(&line));
    eprintln!("our record: seq {seq}");
    let body = scrape(agent.port, Duration::from_secs(5)).expect("scrape");
    assert_eq!(
        xid(&body, &ids[0], "13"),
        Some(1.0),
        "NVML and the kernel log: one XID"
    );
    kmsg_write(&[line]);
    let body = agent.wait_for(Duration::from_secs(10), |m| {
        xid(m, &ids[0], "13") == Some(2.0)
    });
    assert_eq!(
        xid(&body, &ids[0], "13"),
        Some(2.0),
        "a second line is a second XID"
    );
    assert!(agent.terminate().success());
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open log file");
    f.write_all(text.as_bytes()).expect("append");
}

/// A flood through `/dev/kmsg`: 100 000 records, one in a thousand an XID. Every XID is
/// counted, or, if the kernel's ring overran before Junction read it, the loss is counted.
#[test]
fn a_dev_kmsg_flood_loses_nothing_or_counts_the_loss() {
    if !privileged() {
        return;
    }
    let d = domain(4);
    let scen = scenario(d, 1, "");
    let state = support::temp_dir().join("state");
    let port = support::free_port();
    let mut agent = start(&scen, &config(port, &state, "accept_user_records = true"));
    let ids = support::uuids(&parse(
        &scrape(agent.port, Duration::from_secs(5)).expect("scrape"),
    ));
    let rss = support::rss_kib(agent.child.id());
    let lines: Vec<String> = (0..100_000u32)
        .map(|i| {
            if i % 1000 == 999 {
                format!("NVRM: Xid (PCI:{d:04x}:18:00): 43, pid={i}, name=flood, channel 1")
            } else {
                format!("junction flood test: unrelated record {i}")
            }
        })
        .collect();
    let start = Instant::now();
    kmsg_write(&lines);
    eprintln!("wrote 100000 records in {:?}", start.elapsed());
    let done = |m: &str| {
        let s = parse(m);
        let counted = xid(m, &ids[0], "43").unwrap_or(0.0);
        let lost = value(&s, "junction_kmsg_lost_total", &[]).unwrap_or(0.0);
        counted == 100.0 || (lost > 0.0 && 100.0 - counted <= lost)
    };
    let body = agent.wait_for(Duration::from_secs(60), done);
    let s = parse(&body);
    let counted = xid(&body, &ids[0], "43").unwrap_or(0.0);
    let lost = value(&s, "junction_kmsg_lost_total", &[]).unwrap_or(0.0);
    eprintln!("counted {counted} of 100 XIDs; {lost} records lost to ring overruns");
    assert!(counted <= 100.0);
    assert!(
        100.0 - counted <= lost,
        "every missing XID is a counted loss: {counted} counted, {lost} lost"
    );
    let grown = support::rss_kib(agent.child.id()).saturating_sub(rss);
    assert!(grown < 32 * 1024, "RSS grew {grown} KiB over the flood");
    assert!(agent.terminate().success());
}

/// A panic of the `/dev/kmsg` reader after the capability drop (a defect of Junction's; a
/// debug build's failpoint makes it here, at a record of the test's): the panic is counted,
/// the source's other reader (a followed file) is stopped before the source starts again (else
/// the file would have two readers and count each line twice), and the source is started again
/// with the descriptor the reader held (it could not open the device again: CAP_SYSLOG is
/// dropped, and `kernel.dmesg_restrict` is set on the CI machines). Both read on: an XID
/// written to each after the panic is counted once, and the record the reader panicked at is
/// counted as lost rather than read again.
#[test]
fn the_kernel_log_is_read_on_after_its_reader_panics() {
    if !privileged() {
        return;
    }
    let restricted =
        std::fs::read_to_string("/proc/sys/kernel/dmesg_restrict").is_ok_and(|s| s.trim() == "1");
    eprintln!("kernel.dmesg_restrict set: {restricted}");
    let d = domain(15);
    let scen = scenario(d, 2, "");
    let dir = support::temp_dir();
    let log = dir.join("kern.log");
    append(&log, "Dec  7 00:00:00 node kernel: [    1.000] booting\n");
    let port = support::free_port();
    let marker = format!("junction failpoint {} {d}", std::process::id());
    let mut agent = Agent::spawn_config_path(
        &scen,
        &config(
            port,
            &dir.join("state"),
            &format!(
                "accept_user_records = true\nfiles = [{:?}]",
                log.display().to_string()
            ),
        ),
        &[("JUNCTION_FAILPOINT_KMSG_PANIC", marker.as_str())],
    );
    let first = agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("hw_gpu_memory_usage_bytes")
    });
    let ids = support::uuids(&parse(&first));
    let panics = |m: &str| {
        value(
            &parse(m),
            "junction_source_errors_total",
            &[
                ("junction_source", "kmsg"),
                ("junction_stage", "task"),
                ("error_type", "panic"),
            ],
        )
    };
    kmsg_write(&[format!("{marker}: the reader panics at this record")]);
    agent.wait_for(Duration::from_secs(30), |m| panics(m) == Some(1.0));
    kmsg_write(&[format!(
        "NVRM: Xid (PCI:{d:04x}:18:00): 13, pid=4242, name=trainer, Graphics SM Warp Exception"
    )]);
    let after = agent.wait_for(Duration::from_secs(30), |m| {
        xid(m, &ids[0], "13") == Some(1.0)
            && value(
                &parse(m),
                "junction_source_up",
                &[("junction_source", "kmsg")],
            ) == Some(1.0)
    });
    let lost = value(&parse(&after), "junction_kmsg_lost_total", &[]).unwrap_or(0.0);
    assert!(
        lost >= 1.0,
        "the record it panicked at is counted lost: {lost}"
    );
    append(
        &log,
        &format!(
            "Dec  7 00:00:01 node kernel: [    2.000] NVRM: Xid (PCI:{d:04x}:19:00): 31, pid=7, name=a, MMU Fault\n"
        ),
    );
    agent.wait_for(Duration::from_secs(30), |m| {
        xid(m, &ids[1], "31") == Some(1.0)
    });
    // Later scrapes: each still once, one panic.
    std::thread::sleep(Duration::from_secs(2));
    let later = scrape(port, Duration::from_secs(5)).expect("/metrics answers");
    assert_eq!(xid(&later, &ids[0], "13"), Some(1.0));
    assert_eq!(
        xid(&later, &ids[1], "31"),
        Some(1.0),
        "the file has one reader"
    );
    assert_eq!(panics(&later), Some(1.0));
    let log = agent.log();
    assert!(log.contains("JUNCTION_FAILPOINT_KMSG_PANIC"), "{log}");
    assert!(!log.contains("cannot open the kernel log"), "{log}");
    assert!(agent.terminate().success(), "SIGTERM exits 0");
}

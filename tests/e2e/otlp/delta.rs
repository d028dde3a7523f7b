//! Delta temporality: each increase reported once across a restart, a panic of the exporter,
//! crashes and a reboot.

use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};

use super::config;
use crate::support::otlp::{self, Receiver, attr};
use crate::support::{self, Agent, parse, scrape};

/// The increases of a counter's delta points, in every request received so far, of `metric`
/// where `key` is `value`; and whether every such metric said delta.
fn delta_sum(r: &otlp::Received, metric: &str, key: &str, value: &str) -> (f64, bool) {
    let mut sum = 0.0;
    let mut all_delta = true;
    for req in &r.metrics {
        for m in req
            .resource_metrics
            .iter()
            .flat_map(|rm| &rm.scope_metrics)
            .flat_map(|sm| &sm.metrics)
            .filter(|m| m.name == metric)
        {
            let Some(metric::Data::Sum(s)) = &m.data else {
                continue;
            };
            all_delta &= s.aggregation_temporality == 1;
            for p in s
                .data_points
                .iter()
                .filter(|p| attr(&p.attributes, key) == Some(value))
            {
                if let Some(number_data_point::Value::AsDouble(v)) = p.value {
                    sum += v;
                }
            }
        }
    }
    (sum, all_delta)
}

/// With delta temporality, a counter's increases add up across a clean restart to what the
/// counter rose by: the XIDs of a kernel-log file, which the agent keeps counting across the
/// restart (`state_dir`), are not reported again by the first export after it (without the
/// saved delta state, that export carried the whole count again).
#[test]
fn delta_reports_each_xid_once_across_a_restart() {
    use std::io::Write as _;

    use crate::kmsg;
    let rx = Receiver::start();
    let d = kmsg::domain(11);
    let scen = kmsg::scenario(d, 1, "");
    let dir = support::temp_dir();
    let log = dir.join("kern.log");
    std::fs::write(&log, "Nov 30 00:00:00 node kernel: [    1.000] booting\n").expect("log");
    let files = format!("device = \"\"\nfiles = [{:?}]", log.display().to_string());
    let cfg = format!(
        "{}\n[sinks.otlp]\nenabled = true\ninterval_secs = 1\nendpoint = {:?}\nprotocol = \"grpc\"\ntemporality = \"delta\"\n",
        kmsg::config(support::free_port(), &dir.join("state"), &files),
        rx.grpc_url()
    );
    let xid_line = |pid: u32| {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .expect("log");
        writeln!(
            f,
            "Nov 30 01:02:0{pid} node kernel: [ 12.345] NVRM: Xid (PCI:{d:04x}:18:00): 13, pid={pid}, name=a, x"
        )
        .expect("append");
    };
    let sum = |r: &otlp::Received| delta_sum(r, "gpu.xid.errors", "gpu.xid", "13");
    let settle = |want: f64, agent: &Agent| {
        rx.wait_for(Duration::from_secs(20), "the XIDs' increases", |r| {
            sum(r).0 >= want
        });
        // Two more exports: nothing more is added.
        let n = rx.with(|r| r.metrics.len());
        rx.wait_for(Duration::from_secs(10), "two more exports", |r| {
            r.metrics.len() >= n + 2
        });
        let (total, delta) = rx.with(sum);
        assert!(delta, "gpu.xid.errors is exported as delta");
        assert_eq!(
            total,
            want,
            "the increases add up to the count\n{}",
            agent.log()
        );
    };

    let mut agent = kmsg::start(&scen, &cfg);
    xid_line(1);
    settle(1.0, &agent);
    assert!(agent.terminate().success());
    let saved = dir.join("state/otlp-delta.json");
    assert!(saved.exists(), "a clean stop saves the delta state");

    // One more XID while the agent is down: counted once it is back, and reported once.
    xid_line(2);
    let mut agent = kmsg::start(&scen, &cfg);
    agent.wait_for(Duration::from_secs(10), |m| {
        let ids = support::uuids(&parse(m));
        ids.first()
            .is_some_and(|id| kmsg::xid(m, id, "13") == Some(2.0))
    });
    settle(2.0, &agent);
    assert!(
        agent.log().contains("going on from the last export"),
        "{}",
        agent.log()
    );
    assert!(agent.terminate().success());
}

/// A scenario of one H100 in `dir`, for the delta tests (one GPU's counts to add up).
fn one_gpu(dir: &std::path::Path) -> std::path::PathBuf {
    let scen = dir.join("one-gpu.toml");
    std::fs::write(
        &scen,
        format!(
            "base = {:?}\ngpu_count = 1\n",
            support::scenario("h100-training.toml")
                .display()
                .to_string()
        ),
    )
    .expect("scenario");
    scen
}

/// With delta temporality, counters are reported once across a panic of the exporter (a
/// defect of Junction's; a debug build's failpoint makes it here, after the third export):
/// the panic is counted, the supervisor starts the sink again, and the new exporter goes on
/// from the state the first one saved while it ran.
#[test]
fn delta_reports_counts_once_across_a_panic_of_the_exporter() {
    let rx = Receiver::start();
    let dir = support::temp_dir();
    let scen = one_gpu(&dir);
    let port = support::free_port();
    let cfg = config(
        port,
        &format!(
            "endpoint = {:?}\nprotocol = \"grpc\"\ntemporality = \"delta\"\n",
            rx.grpc_url()
        ),
    );
    let mut agent =
        Agent::spawn_config_path(&scen, &cfg, &[("JUNCTION_FAILPOINT_OTLP_PANIC", "3")]);
    let panics = |m: &str| {
        support::value(
            &parse(m),
            "junction_source_errors_total",
            &[
                ("junction_source", "otlp"),
                ("junction_stage", "task"),
                ("error_type", "panic"),
            ],
        )
    };
    agent.wait_for(Duration::from_secs(30), |m| panics(m) == Some(1.0));
    let after = rx.with(|r| r.metrics.len());
    rx.wait_for(
        Duration::from_secs(20),
        "three exports after the panic",
        |r| r.metrics.len() >= after + 3,
    );
    let ((life, d1), (vol, d2)) = rx.with(|r| {
        (
            delta_sum(r, "gpu.ecc.errors.lifetime", "error.type", "corrected"),
            delta_sum(r, "hw.errors", "error.type", "corrected"),
        )
    });
    assert!(d1 && d2, "exported as delta");
    let log = agent.log();
    assert_eq!((life, vol), (17.0, 2.0), "reported once\n{log}");
    assert!(log.contains("JUNCTION_FAILPOINT_OTLP_PANIC"), "{log}");
    assert!(log.contains("going on from the last export"), "{log}");
    assert_eq!(
        panics(&scrape(port, Duration::from_secs(5)).expect("scrape")),
        Some(1.0),
        "one panic"
    );
    assert!(agent.terminate().success());
}

/// With delta temporality, counters are reported once across crashes of the agent: it saves
/// its exports' counter values in `state_dir` while it runs, so a start after a crash goes
/// on from the last save. The driver's count (the volatile ECC count) goes on within its
/// boot and starts again after a reboot; the GPU's lifetime count (kept in its InfoROM)
/// goes on across the reboot too.
#[test]
fn delta_reports_counts_once_across_crashes_and_a_reboot() {
    let rx = Receiver::start();
    let dir = support::temp_dir();
    let scen = one_gpu(&dir);
    let scen = scen.display().to_string();
    // A /proc of the test's own, for the boot id: a simulated reboot is a new one.
    let proc_dir = dir.join("proc");
    let boot = |id: &str| {
        let p = proc_dir.join("sys/kernel/random");
        std::fs::create_dir_all(&p).expect("proc dir");
        std::fs::write(p.join("boot_id"), format!("{id}\n")).expect("boot_id");
    };
    // One config (its state directory is made anew at each call), on a new port each run.
    let first = support::free_port();
    let base = config(
        first,
        &format!(
            "endpoint = {:?}\nprotocol = \"grpc\"\ntemporality = \"delta\"\n",
            rx.grpc_url()
        ),
    )
    .replace(
        &format!(
            "proc_root = {:?}",
            support::empty_proc().display().to_string()
        ),
        &format!("proc_root = {:?}", proc_dir.display().to_string()),
    );
    let cfg = |port: u16| base.replace(&format!("127.0.0.1:{first}"), &format!("127.0.0.1:{port}"));
    let state = base
        .lines()
        .find_map(|l| l.strip_prefix("state_dir = "))
        .map(|s| std::path::PathBuf::from(s.trim_matches('"')))
        .expect("state_dir");
    // The scenario's counts: 17 corrected errors over the GPU's life, 2 since the driver loaded.
    let lifetime =
        |r: &otlp::Received| delta_sum(r, "gpu.ecc.errors.lifetime", "error.type", "corrected");
    let volatile = |r: &otlp::Received| delta_sum(r, "hw.errors", "error.type", "corrected");
    // Runs the agent until three exports are in and both files are written, then kills it.
    let crash = |why: &str| {
        let before = rx.with(|r| r.metrics.len());
        let agent = Agent::spawn_config(&scen, &cfg(support::free_port()));
        rx.wait_for(Duration::from_secs(20), why, |r| {
            r.metrics.len() >= before + 3
        });
        for file in ["otlp-delta.json", "otlp-delta-lasting.json"] {
            let t = Instant::now();
            while !state.join(file).exists() && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(100));
            }
            assert!(
                state.join(file).exists(),
                "{file} while running\n{}",
                agent.log()
            );
        }
        let log = agent.log();
        drop(agent);
        log
    };
    let totals = || {
        let ((life, d1), (vol, d2)) = rx.with(|r| (lifetime(r), volatile(r)));
        assert!(d1 && d2, "exported as delta");
        (life, vol)
    };

    boot("boot-a");
    crash("three exports");
    assert_eq!(totals(), (17.0, 2.0));
    // A crash, and a start in the same boot: both go on.
    let log = crash("three exports after a crash");
    assert_eq!(totals(), (17.0, 2.0), "reported once\n{log}");
    assert!(log.contains("going on from the last export"), "{log}");
    // A reboot: the driver's count starts again (the simulator's is 2 again), the lifetime
    // count goes on.
    boot("boot-b");
    let log = crash("three exports after a reboot");
    assert_eq!(totals(), (17.0, 4.0), "{log}");
    assert!(
        log.contains("go on from their last exported values"),
        "{log}"
    );
}

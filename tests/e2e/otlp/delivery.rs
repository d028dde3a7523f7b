//! Delivery: events as log records exactly once across outages, a receiver that is down,
//! slow, UNAVAILABLE, rejecting or closing idle connections, the queue's bound, TLS and
//! headers.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::{config, start_agent};
use crate::support::otlp::{self, Mode, Receiver, attr, attr_int};
use crate::support::{self, Agent, parse, scrape};

/// The sequence numbers of the events the receiver accepted, with duplicates.
fn received_events(rx: &Receiver) -> Vec<i64> {
    rx.with(|r| {
        r.logs
            .iter()
            .flat_map(|l| &l.resource_logs)
            .flat_map(|rl| &rl.scope_logs)
            .flat_map(|sl| &sl.log_records)
            .filter_map(|lr| attr_int(&lr.attributes, "junction.event.sequence"))
            .collect()
    })
}

/// Events recorded so far, per `/metrics`.
fn events_recorded(port: u16) -> u64 {
    let body = scrape(port, Duration::from_secs(5)).expect("scrape");
    parse(&body)
        .iter()
        .filter(|s| s.name == "junction_events_total")
        .map(|s| s.value as u64)
        .sum()
}

fn metric(port: u16, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let body = scrape(port, Duration::from_secs(5)).expect("scrape");
    support::value(&parse(&body), name, labels)
}

/// After the receiver is back, every event the agent recorded has arrived exactly once.
fn assert_exactly_once(rx: &Receiver, agent: &mut Agent) {
    let start = Instant::now();
    loop {
        let recorded = events_recorded(agent.port);
        let got = received_events(rx);
        let distinct: BTreeSet<i64> = got.iter().copied().collect();
        if distinct.len() as u64 == recorded && recorded > 0 {
            assert_eq!(got.len(), distinct.len(), "no event twice: {got:?}");
            assert_eq!(
                distinct,
                (0..recorded as i64).collect::<BTreeSet<_>>(),
                "every event, once"
            );
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{} of {recorded} events arrived: {got:?}\n{}",
            distinct.len(),
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The receiver is down when the agent starts, then down again for 30 s in the middle: the
/// agent keeps serving `/metrics`, its memory stays flat, metrics resume and every event
/// emitted meanwhile (health transitions of a flapping GPU) arrives exactly once.
#[test]
fn events_emitted_while_the_receiver_is_down_arrive_exactly_once() {
    let mut rx = Receiver::start();
    rx.down();
    let mut agent = start_agent(
        "flapping.toml",
        &format!("endpoint = {:?}\nprotocol = \"grpc\"\n", rx.grpc_url()),
    );
    agent.wait_for(Duration::from_secs(20), |m| {
        m.contains("hw_status{") && m.contains(support::NVML_UP)
    });
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        events_recorded(agent.port) > 0,
        "the flapping GPU made events"
    );
    rx.up();
    rx.wait_for(
        Duration::from_secs(20),
        "metrics after the receiver came up",
        |r| !r.metrics.is_empty(),
    );
    assert_exactly_once(&rx, &mut agent);
    // A health transition as a log record: severity, event name, the GPU, a sentence.
    let failed = rx.with(|r| {
        r.logs
            .iter()
            .flat_map(|l| &l.resource_logs)
            .flat_map(|rl| &rl.scope_logs)
            .flat_map(|sl| &sl.log_records)
            .find(|lr| attr(&lr.attributes, "hw.state") == Some("failed"))
            .cloned()
            .expect("a failed transition")
    });
    assert_eq!(failed.severity_number, 17, "ERROR");
    assert_eq!(failed.event_name, "junction.health.change");
    assert_eq!(
        attr(&failed.attributes, "gpu.health.reason"),
        Some("gpu_lost")
    );
    assert!(attr(&failed.attributes, "hw.id").is_some_and(|id| id.starts_with("GPU-")));
    assert!(
        otlp::body(&failed.body).contains("fallen off the bus"),
        "{:?}",
        failed.body
    );

    // Down for 30 s in the middle.
    let rss_before = support::rss_kib(agent.child.id());
    let events_before = events_recorded(agent.port);
    rx.down();
    let metrics_before = rx.with(|r| r.metrics.len());
    for _ in 0..30 {
        std::thread::sleep(Duration::from_secs(1));
        scrape(agent.port, Duration::from_secs(5)).expect("/metrics is served during the outage");
    }
    let rss_during = support::rss_kib(agent.child.id());
    assert!(
        events_recorded(agent.port) >= events_before + 4,
        "events happened during the outage"
    );
    assert!(
        metric(
            agent.port,
            "junction_sink_export_failures_total",
            &[("junction_sink", "otlp"), ("junction_signal", "metrics")]
        )
        .is_some_and(|v| v > 0.0)
    );
    assert!(
        rss_during < rss_before + 16 * 1024,
        "RSS grew from {rss_before} KiB to {rss_during} KiB during the outage"
    );
    rx.up();
    rx.wait_for(Duration::from_secs(20), "metrics resume", |r| {
        r.metrics.len() > metrics_before
    });
    assert_exactly_once(&rx, &mut agent);
    assert_eq!(
        metric(
            agent.port,
            "junction_sink_events_dropped_total",
            &[("junction_sink", "otlp")]
        ),
        Some(0.0)
    );
    let log = agent.log();
    // The receiver was down: at least one line, and once per kind and signal, not per export.
    assert!(
        (1..=4).contains(&log.matches("OTLP export failed").count()),
        "failures are logged once per kind and signal, not per export:\n{log}"
    );
    assert!(agent.terminate().success());
}

/// A receiver slower than the timeout, then one answering UNAVAILABLE / 503 with a retry
/// hint: nothing is lost or doubled once it accepts again.
fn slow_then_unavailable(protocol: &str) {
    let rx = Receiver::start();
    rx.set_mode(Mode::Slow(Duration::from_secs(3)));
    let endpoint = if protocol == "grpc" {
        rx.grpc_url()
    } else {
        rx.http_url()
    };
    let mut agent = start_agent(
        "flapping.toml",
        &format!("endpoint = {endpoint:?}\nprotocol = {protocol:?}\ntimeout_ms = 1000\n"),
    );
    agent.wait_for(Duration::from_secs(20), |m| {
        m.contains("hw_status{") && m.contains(support::NVML_UP)
    });
    std::thread::sleep(Duration::from_secs(6));
    rx.set_mode(Mode::Unavailable);
    std::thread::sleep(Duration::from_secs(6));
    assert!(rx.with(|r| r.requests) > 0, "the agent kept trying");
    assert!(rx.with(|r| r.logs.is_empty()), "nothing accepted so far");
    scrape(agent.port, Duration::from_secs(5)).expect("/metrics is served");
    rx.set_mode(Mode::Accept);
    assert_exactly_once(&rx, &mut agent);
    assert!(agent.terminate().success());
}

#[test]
fn slow_and_unavailable_receivers_over_grpc_lose_nothing() {
    slow_then_unavailable("grpc");
}

#[test]
fn slow_and_unavailable_receivers_over_http_lose_nothing() {
    slow_then_unavailable("http/protobuf");
}

/// A 400 / INVALID_ARGUMENT is not retried: counted, and logged once with the receiver's
/// message.
fn rejected(protocol: &str, expect_message: bool) {
    let rx = Receiver::start();
    rx.set_mode(Mode::Reject("metric hw.bogus has an invalid unit".into()));
    let endpoint = if protocol == "grpc" {
        rx.grpc_url()
    } else {
        rx.http_url()
    };
    let mut agent = start_agent(
        "h100-training.toml",
        &format!("endpoint = {endpoint:?}\nprotocol = {protocol:?}\n"),
    );
    agent.wait_for(Duration::from_secs(20), |m| {
        m.contains("hw_status{") && m.contains(support::NVML_UP)
    });
    std::thread::sleep(Duration::from_secs(5));
    let requests = rx.with(|r| r.requests);
    // About one metric export a second, with no retries in between.
    assert!((3..=9).contains(&requests), "{requests} requests in 5 s");
    let failures = metric(
        agent.port,
        "junction_sink_export_failures_total",
        &[("junction_sink", "otlp"), ("junction_signal", "metrics")],
    )
    .unwrap_or(0.0);
    assert!(failures >= 3.0, "{failures}");
    let log = agent.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("rejected the export"))
        .collect();
    assert_eq!(lines.len(), 1, "logged once: {lines:#?}");
    if expect_message {
        assert!(lines[0].contains("has an invalid unit"), "{}", lines[0]);
    }
    assert!(agent.terminate().success());
}

#[test]
fn rejected_exports_over_grpc_are_counted_not_retried() {
    rejected("grpc", true);
}

#[test]
fn rejected_exports_over_http_are_counted_not_retried() {
    rejected("http/protobuf", true);
}

/// Past the queue bound the oldest events are dropped, and the drop counter equals the loss.
#[test]
fn past_the_queue_bound_the_drop_counter_equals_the_loss() {
    let mut rx = Receiver::start();
    rx.down();
    let mut agent = start_agent(
        "flapping.toml",
        &format!(
            "endpoint = {:?}\nprotocol = \"http/protobuf\"\nmax_queued_events = 3\n",
            rx.http_url()
        ),
    );
    agent.wait_for(Duration::from_secs(20), |m| {
        m.contains("hw_status{") && m.contains(support::NVML_UP)
    });
    let start = Instant::now();
    while events_recorded(agent.port) < 8 {
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "not enough events"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    rx.up();
    std::thread::sleep(Duration::from_secs(3));
    let (got, dropped, recorded) = loop {
        let recorded = events_recorded(agent.port);
        let got: BTreeSet<i64> = received_events(&rx).into_iter().collect();
        let dropped = metric(
            agent.port,
            "junction_sink_events_dropped_total",
            &[("junction_sink", "otlp")],
        )
        .unwrap_or(0.0) as u64;
        if got.len() as u64 + dropped == recorded {
            break (got, dropped, recorded);
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "received {got:?}, dropped {dropped}, recorded {recorded}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(dropped >= 5, "{dropped} dropped of {recorded}");
    // The oldest went: what arrived is the newest.
    assert!(got.iter().all(|s| *s as u64 >= dropped), "{got:?}");
    assert!(agent.terminate().success());
}

/// TLS with a test CA: trusted through `ca_file`, data arrives and the configured headers
/// reach the receiver (and no log, even at debug level); a wrong CA is refused with a clear
/// error.
#[test]
fn tls_with_a_test_ca_and_headers_that_never_reach_a_log() {
    let ca = otlp::test_ca();
    let rx = Receiver::start_tls(Some(ca.server));
    let dir = support::temp_dir();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, &ca.ca).expect("ca");
    let secret = "Bearer s3cr3t-t0ken-value";
    let otlp = format!(
        "endpoint = {:?}\nprotocol = \"grpc\"\nca_file = {:?}\nheaders = {{ authorization = {secret:?}, x-scope-orgid = \"tenant-7\" }}\n",
        rx.grpc_url().replace("127.0.0.1", "localhost"),
        ca_file.display().to_string()
    );
    let port = support::free_port();
    let mut agent = Agent::spawn_config_env(
        "h100-training.toml",
        &config(port, &otlp),
        &[("RUST_LOG", "debug")],
    );
    rx.wait_for(Duration::from_secs(20), "metrics over TLS", |r| {
        !r.metrics.is_empty()
    });
    let headers = rx.with(|r| r.headers.clone());
    assert!(
        headers.contains(&("authorization".into(), secret.into())),
        "{headers:?}"
    );
    assert!(headers.contains(&("x-scope-orgid".into(), "tenant-7".into())));
    assert!(agent.terminate().success());
    assert!(
        !agent.log().contains("s3cr3t"),
        "a header value reached the log"
    );

    // A CA that did not sign the receiver's certificate.
    let wrong = dir.join("wrong-ca.pem");
    std::fs::write(&wrong, otlp::test_ca().ca).expect("ca");
    let otlp = format!(
        "endpoint = {:?}\nprotocol = \"grpc\"\nca_file = {:?}\n",
        rx.grpc_url().replace("127.0.0.1", "localhost"),
        wrong.display().to_string()
    );
    let before = rx.with(|r| r.metrics.len());
    let mut agent = start_agent("h100-training.toml", &otlp);
    agent.wait_for(Duration::from_secs(20), |m| {
        m.contains("junction_sink_export_failures_total{junction_sink=\"otlp\",junction_signal=\"metrics\"} 1")
            || m.contains("junction_sink_export_failures_total{junction_sink=\"otlp\",junction_signal=\"metrics\"} 2")
    });
    assert_eq!(rx.with(|r| r.metrics.len()), before, "nothing accepted");
    let log = agent.log();
    assert!(
        log.contains("OTLP export failed") && log.contains("certificate"),
        "a clear error: {log}"
    );
    assert!(agent.terminate().success());
}

/// Events are sent as they happen, not at the metric interval: with metrics every minute,
/// the flapping GPU's transitions arrive before the first metric export does.
#[test]
fn events_do_not_wait_for_the_metric_interval() {
    let rx = Receiver::start();
    let config = config(
        support::free_port(),
        &format!("endpoint = {:?}\nprotocol = \"grpc\"\n", rx.grpc_url()),
    )
    .replace(
        "[sinks.otlp]\nenabled = true\ninterval_secs = 1\n",
        "[sinks.otlp]\nenabled = true\ninterval_secs = 60\n",
    );
    let mut agent = Agent::spawn_config("flapping.toml", &config);
    rx.wait_for(Duration::from_secs(30), "an event", |r| !r.logs.is_empty());
    assert_eq!(
        rx.with(|r| r.metrics.len()),
        0,
        "metrics wait for their interval; events did not"
    );
    assert!(agent.terminate().success());
}

/// A receiver that closes connections idle for 300 ms (as a collector or a load balancer
/// with an idle timeout does) costs no export a second attempt: the next request goes on a
/// new connection, not into the closed one (this passes too with the exporter's runtime held
/// between exports, where hyper finds the closed connection when it sends). Every byte the
/// agent says it sent arrived, and no export failed.
#[test]
fn a_receiver_that_closes_idle_connections_costs_no_retry() {
    let sink = testkit::otlp::Sink::start_closing_idle(Duration::from_millis(300))
        .expect("OTLP/HTTP receiver");
    let agent = start_agent(
        "h100-training.toml",
        &format!(
            "endpoint = \"http://127.0.0.1:{}\"\nprotocol = \"http/protobuf\"\n",
            sink.port
        ),
    );
    let requests = || sink.counts("/v1/metrics").requests;
    let start = Instant::now();
    while requests() < 5 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{} metric exports arrived in 30 s",
            requests()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Between two exports (one a second): just after one arrived, and once its connection
    // has been closed.
    let n = requests();
    while requests() == n {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(400));
    let got = sink.counts("/v1/metrics");
    let signal = [("junction_sink", "otlp"), ("junction_signal", "metrics")];
    let sent = metric(agent.port, "junction_sink_sent_bytes_total", &signal).expect("bytes sent");
    let failed =
        metric(agent.port, "junction_sink_export_failures_total", &signal).expect("failures");
    assert_eq!(failed, 0.0, "no export failed");
    assert_eq!(
        sent as u64, got.bytes,
        "each of {} requests sent once: the agent sent {sent} bytes, {} arrived",
        got.requests, got.bytes
    );
}

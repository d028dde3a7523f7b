//! The OTLP sink against an OTLP receiver in the test (tonic gRPC services and an HTTP/protobuf
//! handler): the registry's metrics over both protocols, agreeing with `/metrics`; events as
//! log records, delivered exactly once across outages; a receiver that is down, slow,
//! UNAVAILABLE or rejecting; TLS; headers; the precedence of the config file over `OTEL_*`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};

use crate::support::otlp::{self, Mode, Receiver, attr, attr_int};
use crate::support::{self, Agent, parse, scrape};

/// A registry row from METRICS.md (generated from the registry; a drift test keeps it so).
struct Desc {
    prometheus: String,
    unit: String,
    kind: String,
    attrs: BTreeSet<String>,
}

fn registry() -> BTreeMap<String, Desc> {
    support::registry_rows()
        .into_iter()
        .map(|r| {
            (
                r.name,
                Desc {
                    prometheus: r.prometheus,
                    unit: r.unit,
                    kind: r.kind,
                    attrs: r.attrs.into_iter().collect(),
                },
            )
        })
        .collect()
}

/// A config for the simulator with the OTLP sink pointed at `endpoint`.
fn config(port: u16, otlp: &str) -> String {
    format!(
        "{}\n[sinks.otlp]\nenabled = true\ninterval_secs = 1\n{otlp}\n",
        support::sim_config("current", port, "lost_retry_max_secs = 1")
    )
}

fn start_agent(scenario: &str, otlp: &str) -> Agent {
    Agent::spawn_config(scenario, &config(support::free_port(), otlp))
}

/// One data point: (metric, labels as Prometheus would name them) → value.
type Points = BTreeMap<(String, BTreeMap<String, String>), f64>;

/// The data points of the last metric request, keyed like `/metrics` series.
fn otlp_points(req: &ExportMetricsServiceRequest, reg: &BTreeMap<String, Desc>) -> Points {
    let mut out = Points::new();
    for rm in &req.resource_metrics {
        for sm in &rm.scope_metrics {
            for m in &sm.metrics {
                let desc = reg
                    .get(&m.name)
                    .unwrap_or_else(|| panic!("{} is not in the registry", m.name));
                assert_eq!(m.unit, desc.unit, "{} unit", m.name);
                let (points, kind) = match &m.data {
                    Some(metric::Data::Gauge(g)) => (&g.data_points, "gauge"),
                    Some(metric::Data::Sum(s)) if s.is_monotonic => {
                        assert_eq!(s.aggregation_temporality, 2, "{} is cumulative", m.name);
                        (&s.data_points, "counter")
                    }
                    Some(metric::Data::Sum(s)) => (&s.data_points, "updowncounter"),
                    other => panic!("{}: unexpected data {other:?}", m.name),
                };
                assert_eq!(kind, desc.kind, "{} kind", m.name);
                for p in points {
                    let mut labels = BTreeMap::new();
                    for kv in &p.attributes {
                        assert!(
                            desc.attrs.contains(&kv.key),
                            "{} has attribute {} outside the registry's {:?}",
                            m.name,
                            kv.key,
                            desc.attrs
                        );
                        labels.insert(
                            kv.key.replace(['.', '-'], "_"),
                            attr(&p.attributes, &kv.key).unwrap_or_default().to_string(),
                        );
                    }
                    let v = match p.value {
                        Some(number_data_point::Value::AsDouble(d)) => d,
                        Some(number_data_point::Value::AsInt(i)) => i as f64,
                        None => panic!("{} without a value", m.name),
                    };
                    out.insert((desc.prometheus.clone(), labels), v);
                }
            }
        }
    }
    out
}

/// Every registry metric, name, unit, kind and attribute, and every value agrees between the
/// OTLP export and `/metrics` in the same run; the resource says who is reporting. Bodies are
/// compressed as `compression` says (gzip: the agent compresses the metrics request as it
/// writes it; none: it sends its encoder's buffer).
fn same_metrics_as_scrape(protocol: &str, compression: &str) {
    let rx = Receiver::start();
    let endpoint = match protocol {
        "grpc" => rx.grpc_url(),
        _ => rx.http_url(),
    };
    let otlp = format!(
        "endpoint = {endpoint:?}\nprotocol = {protocol:?}\ncompression = {compression:?}\nresource_attributes = {{ cluster = \"test-a\" }}\n"
    );
    // Every NVML group once an hour: after its first cycle the model stays as it is.
    let config = config(support::free_port(), &otlp)
        .replace("]\ninterval_secs = 1\n", "]\ninterval_secs = 3600\n");
    let mut agent = Agent::spawn_config("h100-training.toml", &config);
    agent.wait_for(Duration::from_secs(20), |m| {
        m.contains("gpu_sm_activity_ratio")
            && m.contains("gpu_process_utilization_ratio")
            && m.contains(support::NVML_UP)
    });
    let reg = registry();
    rx.wait_for(
        Duration::from_secs(20),
        "a metric export with GPM and processes",
        |r| {
            r.metrics.last().is_some_and(|m| {
                let p = otlp_points(m, &reg);
                p.keys().any(|(n, _)| n == "gpu_sm_activity_ratio")
                    && p.keys().any(|(n, _)| n == "gpu_process_utilization_ratio")
            })
        },
    );
    // NVML collects once (every group at an hour), so that the export and the scrape read the
    // same model: every value must be equal, not close.
    let n = rx.with(|r| r.metrics.len());
    rx.wait_for(Duration::from_secs(10), "the next export", |r| {
        r.metrics.len() > n
    });
    if protocol != "grpc" {
        let encoding = rx.with(|r| {
            r.headers
                .iter()
                .find(|(k, _)| k == "content-encoding")
                .map(|(_, v)| v.clone())
        });
        let expected = (compression == "gzip").then(|| "gzip".to_string());
        assert_eq!(encoding, expected, "compression = {compression:?}");
    }
    let body = scrape(agent.port, Duration::from_secs(5)).expect("scrape");
    let otlp = rx.with(|r| otlp_points(r.metrics.last().expect("metrics"), &reg));
    let prom: Points = parse(&body)
        .into_iter()
        .map(|s| ((s.name, s.labels), s.value))
        .collect();
    // The sinks' own telemetry moves between the two reads; everything else is the model.
    let model = |k: &(String, BTreeMap<String, String>)| !k.0.starts_with("junction_sink");
    let o: BTreeSet<_> = otlp.keys().filter(|k| model(k)).collect();
    let p: BTreeSet<_> = prom.keys().filter(|k| model(k)).collect();
    assert_eq!(
        o.symmetric_difference(&p).collect::<Vec<_>>(),
        Vec::<&&(String, BTreeMap<String, String>)>::new(),
        "the same series on both sinks"
    );
    assert!(o.len() > 1500, "{} series", o.len());
    for k in o {
        assert_eq!(otlp[k], prom[k], "{k:?}");
    }
    counters_start_where_they_began(&rx.with(|r| r.metrics.last().cloned().expect("metrics")));
    // Values straight from the scenario, unit-converted.
    let gpu0 = support::uuids(&parse(&body))[0].clone();
    // The one series of `name` on GPU 0 with the `extra` labels (and any others: the GPU's
    // identity on the conventions' series).
    let at = |name: &str, extra: &[(&str, &str)]| {
        let mut want: Vec<(&str, &str)> = vec![("hw_id", gpu0.as_str())];
        want.extend_from_slice(extra);
        const IDENTITY: [&str; 6] = [
            "hw_vendor",
            "hw_model",
            "hw_name",
            "hw_serial_number",
            "hw_driver_version",
            "hw_firmware_version",
        ];
        let hits: Vec<f64> = otlp
            .iter()
            .filter(|((n, l), _)| {
                let own: BTreeMap<&str, &str> = l
                    .iter()
                    .filter(|(k, _)| {
                        !IDENTITY.contains(&k.as_str()) || want.iter().any(|(w, _)| w == k)
                    })
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                n == name && own == want.iter().copied().collect()
            })
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(hits.len(), 1, "{name} {want:?}: {hits:?}");
        hits[0]
    };
    assert_eq!(
        at("hw_gpu_utilization_ratio", &[("hw_gpu_task", "general")]),
        0.97
    );
    assert_eq!(
        at("hw_gpu_memory_usage_bytes", &[]),
        62459.0 * 1024.0 * 1024.0
    );
    assert_eq!(
        at("gpu_clock_frequency_hertz", &[("gpu_clock_domain", "sm")]),
        1980e6
    );
    // Resource, and the conventions' version on it and on the scope.
    let (res, schemas) = rx.with(|r| {
        let rm = &r.metrics.last().expect("metrics").resource_metrics[0];
        (
            rm.resource.clone().expect("resource"),
            (
                rm.schema_url.clone(),
                rm.scope_metrics[0].schema_url.clone(),
            ),
        )
    });
    let url = "https://opentelemetry.io/schemas/1.44.0";
    assert_eq!(schemas, (url.to_string(), url.to_string()));
    assert_eq!(attr(&res.attributes, "service.name"), Some("junction"));
    assert_eq!(
        attr(&res.attributes, "service.version"),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert!(attr(&res.attributes, "host.name").is_some_and(|h| !h.is_empty()));
    assert_eq!(attr(&res.attributes, "cluster"), Some("test-a"));
    // host.id is the machine id (systemd's file, then D-Bus's); where neither exists it is
    // absent. CI's machines have one, so there the attribute is always checked by value.
    let machine_id = ["/etc/machine-id", "/var/lib/dbus/machine-id"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .find(|s| !s.is_empty());
    assert!(
        machine_id.is_some() || std::env::var_os("CI").is_none(),
        "CI must have /etc/machine-id or /var/lib/dbus/machine-id, to check host.id against"
    );
    assert_eq!(attr(&res.attributes, "host.id"), machine_id.as_deref());
    assert!(agent.terminate().success());
}

#[test]
fn grpc_carries_the_same_metrics_as_the_scrape() {
    same_metrics_as_scrape("grpc", "gzip");
}

#[test]
fn http_carries_the_same_metrics_as_the_scrape() {
    same_metrics_as_scrape("http/protobuf", "gzip");
}

#[test]
fn uncompressed_http_carries_the_same_metrics_as_the_scrape() {
    same_metrics_as_scrape("http/protobuf", "none");
}

/// Cumulative counters' start times: the hardware's (the driver's energy and ECC counts) the
/// host's boot (`btime`; the agent's `proc_root` here has no `stat`, so it reads the host's),
/// Junction's own the agent's start (after the boot, before the export), the lifetime ECC
/// count none.
fn counters_start_where_they_began(req: &ExportMetricsServiceRequest) {
    let btime: u64 = std::fs::read_to_string("/proc/stat")
        .expect("/proc/stat")
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .expect("btime");
    let boot_ns = btime * 1_000_000_000;
    let mut seen = BTreeSet::new();
    for m in req
        .resource_metrics
        .iter()
        .flat_map(|rm| &rm.scope_metrics)
        .flat_map(|sm| &sm.metrics)
    {
        let Some(metric::Data::Sum(s)) = &m.data else {
            continue;
        };
        if !s.is_monotonic {
            continue;
        }
        for p in &s.data_points {
            let start = p.start_time_unix_nano;
            match m.name.as_str() {
                "hw.energy" | "hw.errors" => assert_eq!(start, boot_ns, "{}", m.name),
                "gpu.ecc.errors.lifetime" => assert_eq!(start, 0, "{}", m.name),
                n if n.starts_with("junction.") => assert!(
                    start > boot_ns && start < p.time_unix_nano,
                    "{n}: {start} after the boot ({boot_ns}), before {}",
                    p.time_unix_nano
                ),
                _ => continue,
            }
            seen.insert(m.name.clone());
        }
    }
    for name in [
        "hw.energy",
        "hw.errors",
        "gpu.ecc.errors.lifetime",
        "junction.sink.exports",
    ] {
        assert!(seen.contains(name), "{name} in the export");
    }
}

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

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
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
    let rss_before = rss_kib(agent.child.id());
    let events_before = events_recorded(agent.port);
    rx.down();
    let metrics_before = rx.with(|r| r.metrics.len());
    for _ in 0..30 {
        std::thread::sleep(Duration::from_secs(1));
        scrape(agent.port, Duration::from_secs(5)).expect("/metrics is served during the outage");
    }
    let rss_during = rss_kib(agent.child.id());
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

/// The config file wins over `OTEL_EXPORTER_OTLP_ENDPOINT`; without it, the environment
/// applies.
#[test]
fn the_config_file_wins_over_the_environment() {
    let from_env = Receiver::start();
    let from_file = Receiver::start();
    let port = support::free_port();
    let env_url = from_env.http_url();
    let mut agent = Agent::spawn_config_env(
        "h100-training.toml",
        &config(
            port,
            &format!(
                "endpoint = {:?}\nprotocol = \"http/protobuf\"\n",
                from_file.http_url()
            ),
        ),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", env_url.as_str()),
            ("OTEL_SERVICE_NAME", "from-env"),
        ],
    );
    from_file.wait_for(
        Duration::from_secs(20),
        "metrics at the file's endpoint",
        |r| !r.metrics.is_empty(),
    );
    assert_eq!(from_env.with(|r| r.requests), 0);
    let res = from_file.with(|r| {
        r.metrics[0].resource_metrics[0]
            .resource
            .clone()
            .expect("resource")
    });
    assert_eq!(
        attr(&res.attributes, "service.name"),
        Some("from-env"),
        "the file left it unset"
    );
    assert!(agent.terminate().success());

    let port = support::free_port();
    let mut agent = Agent::spawn_config_env(
        "h100-training.toml",
        &config(port, "protocol = \"http/protobuf\"\n"),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", env_url.as_str()),
            ("K8S_NODE_NAME", "gpu-node-17"),
        ],
    );
    from_env.wait_for(
        Duration::from_secs(20),
        "metrics at the environment's endpoint",
        |r| !r.metrics.is_empty(),
    );
    let res = from_env.with(|r| {
        r.metrics[0].resource_metrics[0]
            .resource
            .clone()
            .expect("resource")
    });
    assert_eq!(
        attr(&res.attributes, "k8s.node.name"),
        Some("gpu-node-17"),
        "from the downward API"
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

/// A GPU that falls off the bus: its readings stop being exported (its status stays).
#[test]
fn a_lost_gpus_readings_stop_being_exported() {
    let rx = Receiver::start();
    let mut agent = start_agent(
        "gpu-lost.toml",
        &format!("endpoint = {:?}\nprotocol = \"grpc\"\n", rx.grpc_url()),
    );
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        parse(m)
            .iter()
            .any(|s| s.name == "hw_status" && s.labels["hw_state"] == "failed" && s.value == 1.0)
    });
    let lost = parse(&body)
        .into_iter()
        .find(|s| s.name == "hw_status" && s.labels["hw_state"] == "failed" && s.value == 1.0)
        .expect("failed GPU")
        .labels["hw_id"]
        .clone();
    let n = rx.with(|r| r.metrics.len());
    rx.wait_for(Duration::from_secs(10), "two more exports", |r| {
        r.metrics.len() >= n + 2
    });
    let reg = registry();
    // Before the loss it had readings; in the last export, none.
    let first = rx.with(|r| otlp_points(r.metrics.first().expect("metrics"), &reg));
    let had: Vec<String> = first
        .keys()
        .filter(|(_, l)| l.get("hw_id") == Some(&lost))
        .map(|(n, _)| n.clone())
        .collect();
    assert!(
        had.contains(&"hw_gpu_memory_usage_bytes".to_string()),
        "exported before the loss: {had:?}"
    );
    let last = rx.with(|r| otlp_points(r.metrics.last().expect("metrics"), &reg));
    let of_lost: Vec<(String, String)> = last
        .keys()
        .filter_map(|(n, l)| l.get("hw_id").map(|id| (n.clone(), id.clone())))
        .collect();
    let readings = support::readings_of(
        of_lost.iter().map(|(n, id)| (n.as_str(), id.as_str())),
        &lost,
    );
    assert!(
        readings.is_empty(),
        "still exported for the lost GPU: {readings:?}"
    );
    assert!(
        of_lost
            .iter()
            .any(|(n, id)| n == "hw_status" && *id == lost)
    );
    assert!(agent.terminate().success());
}

/// First contact: an endpoint (in the file, or `OTEL_EXPORTER_OTLP_ENDPOINT` as an SDK user
/// would set it) without `enabled = true` pushes nothing, and the agent says so at start,
/// naming the key to set; with `enabled = true` the same receiver gets metrics.
#[test]
fn an_endpoint_without_enabled_says_at_start_that_nothing_is_pushed() {
    let rx = Receiver::start();
    let base = |port| support::sim_config("current", port, "");
    let file = format!(
        "{}\n[sinks.otlp]\ninterval_secs = 1\nendpoint = {:?}\n",
        base(support::free_port()),
        rx.grpc_url()
    );
    let env_only = base(support::free_port());
    let said = |agent: &mut Agent, what: &str| {
        agent.wait_for(Duration::from_secs(30), |m| {
            m.contains("hw_gpu_memory_usage_bytes")
        });
        let log = agent.log();
        let line = log
            .lines()
            .find(|l| l.contains("WARN") && l.contains("nothing is pushed over OTLP"))
            .unwrap_or_else(|| panic!("no warning at start:\n{log}"));
        assert!(line.contains(what), "{line}");
        assert!(line.contains("enabled = true"), "names the fix: {line}");
    };
    let mut a = Agent::spawn_config("h100-training.toml", &file);
    said(&mut a, "[sinks.otlp] sets endpoint");
    let url = rx.grpc_url();
    let mut b = Agent::spawn_config_env(
        "h100-training.toml",
        &env_only,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str())],
    );
    said(&mut b, "OTEL_EXPORTER_OTLP_ENDPOINT=");
    // Both ran a few export intervals' worth: nothing arrived.
    std::thread::sleep(Duration::from_secs(3));
    assert!(rx.with(|r| r.metrics.is_empty() && r.logs.is_empty()));
    assert!(a.terminate().success() && b.terminate().success());
    // Turned on, the same receiver gets metrics: the silence above was the switch.
    let mut c = Agent::spawn_config(
        "h100-training.toml",
        &file.replace("[sinks.otlp]\n", "[sinks.otlp]\nenabled = true\n"),
    );
    rx.wait_for(Duration::from_secs(30), "metrics once enabled", |r| {
        !r.metrics.is_empty()
    });
    assert!(!c.log().contains("nothing is pushed over OTLP"));
    assert!(c.terminate().success());
}

/// `junction once --format otlp` writes the request an export sends: it decodes, every
/// metric's name, unit, kind and attributes are the registry's, and it holds the series
/// `once --format prometheus` prints.
#[test]
fn once_writes_the_metrics_request_an_export_sends() {
    use prost::Message as _;
    let dir = support::temp_dir();
    let config = dir.join("once.toml");
    std::fs::write(
        &config,
        format!(
            "proc_root = {:?}\n[sources.nvml]\nlibrary = {:?}\n[sinks.otlp]\nresource_attributes = {{ cluster = \"once\" }}\n",
            support::empty_proc().display().to_string(),
            support::sim_lib("current").display().to_string()
        ),
    )
    .expect("config");
    let run = |format: &str| {
        let out = support::output(
            support::junction()
                .env(
                    "JUNCTION_NVML_SIM_SCENARIO",
                    support::scenario("h100-training.toml"),
                )
                .args(["once", "--format", format, "--config"])
                .arg(&config),
        );
        assert!(
            out.status.success(),
            "once --format {format}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let req = ExportMetricsServiceRequest::decode(&run("otlp")[..]).expect("a request");
    let res = req.resource_metrics[0].resource.clone().expect("resource");
    assert_eq!(attr(&res.attributes, "cluster"), Some("once"));
    let otlp: BTreeSet<_> = otlp_points(&req, &registry()).into_keys().collect();
    let prom: BTreeSet<_> = parse(&String::from_utf8(run("prometheus")).expect("text"))
        .into_iter()
        .map(|s| (s.name, s.labels))
        .collect();
    assert!(otlp.len() > 1500, "{} series", otlp.len());
    assert_eq!(
        otlp.symmetric_difference(&prom).collect::<Vec<_>>(),
        Vec::<&(String, BTreeMap<String, String>)>::new(),
        "the same series as the page"
    );
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

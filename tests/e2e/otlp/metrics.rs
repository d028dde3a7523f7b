//! The registry's metrics over OTLP, agreeing with `/metrics` in the same run; a lost GPU's
//! readings; `junction once --format otlp`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};

use super::{config, start_agent};
use crate::support::otlp::{Receiver, attr};
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

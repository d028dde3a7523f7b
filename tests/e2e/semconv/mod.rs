//! Junction's names against OpenTelemetry's hardware conventions themselves
//! (semantic-conventions v1.44.0, `model/hardware/`, in `../shared/realworld/semconv-hardware/`):
//! every registry entry (METRICS.md, generated from the registry) whose name the conventions
//! define has their instrument and unit, carries their required attributes, and uses only
//! attribute names they define in their `hw.*` namespace; on the simulated node, every value of
//! an attribute the conventions enumerate is one of their members. A deviation not listed in
//! [`KNOWN`] fails the build; each listed one names the item of the conventions check
//! (`../shared/reference/semconv-check.md`) that will remove it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::support::{self, Agent, parse};

mod spec;

use spec::{Spec, spec};

/// Values of an enumerated attribute the conventions do not list, each with why: (metric or
/// `*`, attribute, value or `*`, why). The conventions' enums are open: a value of one's own
/// is allowed where none of theirs applies ("if one of them applies, then the respective
/// value MUST be used"); every entry here is such a case, none a deviation still open.
const KNOWN: &[(&str, &str, &str, &str)] = &[
    (
        "*",
        "hw.type",
        "cooling_unit",
        "a CDU: the conventions have no cooling types",
    ),
    ("*", "hw.type", "cooling_loop", "as cooling_unit"),
    ("*", "hw.type", "coolant_connector", "as cooling_unit"),
    ("*", "hw.type", "pump", "as cooling_unit"),
    ("*", "hw.type", "filter", "as cooling_unit"),
    ("*", "hw.type", "reservoir", "as cooling_unit"),
    ("*", "hw.type", "leak_detector", "as cooling_unit"),
    (
        "*",
        "hw.type",
        "cdu",
        "a cooling unit by its Redfish EquipmentType",
    ),
    ("*", "hw.type", "bmc", "the BMC itself"),
    (
        "*",
        "hw.limit_type",
        "high.fatal",
        "a non-recoverable threshold: the conventions stop at critical",
    ),
    ("*", "hw.limit_type", "low.fatal", "as high.fatal"),
    (
        "*",
        "hw.limit_type",
        "high.degraded.user",
        "a threshold a user set (Redfish UpperCautionUser): the conventions have none",
    ),
    (
        "*",
        "hw.limit_type",
        "high.critical.user",
        "as high.degraded.user",
    ),
    (
        "*",
        "hw.limit_type",
        "low.degraded.user",
        "as high.degraded.user",
    ),
    (
        "*",
        "hw.limit_type",
        "low.critical.user",
        "as high.degraded.user",
    ),
];

fn known(metric: &str, attr: &str, value: &str) -> bool {
    KNOWN
        .iter()
        .any(|(m, a, v, _)| (*m == "*" || *m == metric) && *a == attr && (*v == "*" || *v == value))
}

#[test]
fn every_spec_name_has_the_spec_instrument_unit_and_attributes() {
    let spec = spec();
    assert!(
        spec.metrics.contains_key("hw.gpu.utilization") && spec.attributes.contains_key("hw.type"),
        "the conventions were read"
    );
    let mut checked = 0;
    let mut wrong = Vec::new();
    for support::RegistryRow {
        name,
        unit,
        kind,
        attrs,
        ..
    } in support::registry_rows()
    {
        let Some(m) = spec.metrics.get(&name) else {
            // Not a spec name: it must not sit in the spec's namespace as if it were.
            if name.starts_with("hw.") {
                wrong.push(format!(
                    "{name}: in hw.* but not a metric of the conventions"
                ));
            }
            continue;
        };
        checked += 1;
        if kind != m.instrument {
            wrong.push(format!(
                "{name}: {kind}, the conventions say {}",
                m.instrument
            ));
        }
        if unit != m.unit {
            wrong.push(format!(
                "{name}: unit {unit}, the conventions say {}",
                m.unit
            ));
        }
        for (a, l) in &m.attrs {
            if l == "required" && !attrs.contains(a) {
                wrong.push(format!("{name}: lacks the required attribute {a}"));
            }
        }
        for a in &attrs {
            if a.starts_with("hw.") && !spec.attributes.contains_key(a) && !known(&name, a, "*") {
                wrong.push(format!(
                    "{name}: {a} is not an attribute of the conventions"
                ));
            }
        }
    }
    assert!(checked >= 13, "{checked} spec names checked");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The enumerated values on a scrape that the conventions do not list (and [`KNOWN`] does not
/// explain), and how many values were checked.
fn enum_deviations(spec: &Spec, body: &str) -> (BTreeSet<String>, usize) {
    let reg = support::registry_rows();
    // Prometheus name → the registry name; label → attribute.
    let by_prom: BTreeMap<&str, (&str, &Vec<String>)> = reg
        .iter()
        .map(|r| (r.prometheus.as_str(), (r.name.as_str(), &r.attrs)))
        .collect();
    let mut wrong = BTreeSet::new();
    let mut seen = 0;
    for s in parse(body) {
        let Some((name, attrs)) = by_prom.get(s.name.as_str()) else {
            continue;
        };
        if !spec.metrics.contains_key(*name) {
            continue;
        }
        for a in attrs.iter() {
            let Some(Some(members)) = spec.attributes.get(a) else {
                continue;
            };
            let Some(v) = s.labels.get(&a.replace('.', "_")) else {
                continue;
            };
            seen += 1;
            if !members.contains(v) && !known(name, a, v) {
                wrong.insert(format!(
                    "{name}{{{a}={v:?}}}: the conventions list {members:?}"
                ));
            }
        }
    }
    (wrong, seen)
}

#[test]
fn every_enumerated_value_on_the_simulated_node_is_the_specs() {
    let spec = spec();
    let mut agent = Agent::start("h100-training.toml", "current");
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("hw_temperature_limit_celsius") && m.contains("hw_status{")
    });
    let (wrong, seen) = enum_deviations(&spec, &body);
    assert!(seen > 50, "enumerated values checked: {seen}");
    assert!(
        wrong.is_empty(),
        "{}",
        wrong.into_iter().collect::<Vec<_>>().join("\n")
    );
    assert!(agent.terminate().success());
}

/// `sum by (hw_type)` of a query's samples, from Prometheus' answer.
fn sums_by_type(prom: &support::prometheus::Prometheus, expr: &str) -> BTreeMap<String, f64> {
    let res = prom.result(expr).expect("query");
    res.as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["metric"]["hw_type"].as_str().unwrap_or("").to_string(),
                r["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(f64::NAN),
            )
        })
        .collect()
}

/// One component's own draw by its Redfish physical context, as the conventions' `hw.type`
/// (written out here on its own): the kinds that hold no other component.
fn own_draw_type(context: &str) -> Option<&'static str> {
    Some(match context {
        "CPU" => "cpu",
        "Memory" => "memory",
        "Fan" => "fan",
        "StorageDevice" => "physical_disk",
        "NetworkingDevice" => "network",
        "Battery" => "battery",
        _ => return None,
    })
}

/// The power sensors of a served tree that are one component's own draw, summed by type:
/// those discovery reaches (members of a collection; a mockup may hold a sensor only a
/// processor's EnvironmentMetrics names).
fn own_draw_in_tree(dir: &std::path::Path, sums: &mut BTreeMap<String, f64>) {
    let mut docs = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(doc) = serde_json::from_str::<serde_json::Value>(
                &std::fs::read_to_string(&p).unwrap_or_default(),
            ) {
                docs.push(doc);
            }
        }
    }
    let members: BTreeSet<&str> = docs
        .iter()
        .flat_map(|d| d["Members"].as_array().into_iter().flatten())
        .filter_map(|m| m["@odata.id"].as_str())
        .collect();
    for doc in &docs {
        let sensor = doc["@odata.type"]
            .as_str()
            .is_some_and(|t| t.starts_with("#Sensor."));
        let reached = doc["@odata.id"]
            .as_str()
            .is_some_and(|i| members.contains(i));
        if sensor
            && reached
            && doc["ReadingType"] == "Power"
            && let (Some(t), Some(v)) = (
                doc["PhysicalContext"].as_str().and_then(own_draw_type),
                doc["Reading"].as_f64(),
            )
        {
            *sums.entry(t.to_string()).or_default() += v;
        }
    }
}

/// The conventions' sums on the simulated node with its BMCs, through a real Prometheus:
/// `sum by (hw_type)` of `hw_power_watts` is the scenario's GPUs (NVML, each once: no BMC
/// copy of a GPU's draw, no chassis or host total, no supply's input) plus what the BMCs
/// report of components that hold no other; the host's total is `hw_host_power_watts`; the
/// rate of `hw_errors_total` by type is the scenario's volatile ECC rate, not doubled by the
/// lifetime count.
#[test]
fn sums_by_hw_type_count_each_gpu_once_with_the_bmcs() {
    use crate::bmc::{config, serve_trees, shared_redfish};
    use crate::bmc_tree::project_tree;
    use crate::support::bmc as sbmc;
    let Some(tool) = sbmc::venv_tool("sushy-static") else {
        return;
    };
    // The first GPU's serial, for the tree whose GPU chassis the BMC shares with NVML.
    let mut agent = Agent::start("bmc-sums.toml", "current");
    let body = agent.wait_for(Duration::from_secs(30), |m| m.contains("gpu_info{"));
    agent.terminate();
    let serial = parse(&body)
        .into_iter()
        .find(|s| s.name == "gpu_info" && s.labels["gpu_index"] == "0")
        .map(|s| s.labels["hw_serial_number"].clone())
        .expect("gpu 0");
    let trees = [
        ("dgx", shared_redfish().join("nvidia-dgx-h100/redfish/v1")),
        (
            "1u",
            shared_redfish().join("dmtf-public-liquid-cooled-server"),
        ),
        ("rack", project_tree(&serial)),
    ];
    let (_servers, sections) = serve_trees(&tool, &trees, "interval_secs = 5\n");
    let port = support::free_port();
    let mut agent = Agent::spawn_config("bmc-sums.toml", &config(&sections, true, port));
    // Every target's whole tree read (the DGX's eight GPU readings and the shared GPU's).
    let complete = |m: &str| {
        m.contains("hw_host_power_watts{")
            && m.contains("rack:/Chassis/Rack1/Sensors/CPU0Power")
            && m.lines()
                .filter(|l| l.starts_with("bmc_power_watts{") && l.contains("hw_type=\"gpu\""))
                .count()
                >= 9
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let m = support::scrape(port, Duration::from_secs(5)).unwrap_or_default();
        if complete(&m) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the BMCs' trees not read within 60 s:\n{}",
            m.lines()
                .filter(|l| l.contains("power_watts{") || l.starts_with("junction_target"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let Some(prom) = support::prometheus::Prometheus::start(port, None) else {
        return;
    };
    // The scenario: 300 + 350 + 400 + 450 W; corrected volatile errors at 1, 1, 1, 2 a second.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let (power, errors) = loop {
        let power = sums_by_type(&prom, "sum by (hw_type) (hw_power_watts)");
        let errors = sums_by_type(
            &prom,
            "sum by (hw_type) (rate(hw_errors_total{error_type=\"corrected\"}[20s]))",
        );
        let ready = power.contains_key("gpu")
            && errors.get("gpu").is_some_and(|r| r.is_finite() && *r > 0.0)
            // The series older than the rate's window (rate() does not extrapolate far
            // past a series' first sample).
            && prom.result("count_over_time(hw_errors_total[40s])").is_ok_and(|r| {
                r.as_array()
                    .and_then(|a| a.first())
                    .and_then(|x| x["value"][1].as_str())
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(|n| n >= 25.0)
            });
        if ready || std::time::Instant::now() > deadline {
            break (power, errors);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let mut want = BTreeMap::from([("gpu".to_string(), 1500.0)]);
    for (_, dir) in &trees {
        own_draw_in_tree(dir, &mut want);
    }
    assert!(
        want.len() > 1,
        "the BMCs report a component's own draw: {want:?}"
    );
    let scraped = support::scrape(port, Duration::from_secs(5)).unwrap_or_default();
    let lines: Vec<&str> = scraped
        .lines()
        .filter(|l| l.starts_with("hw_power_watts{") || l.starts_with("bmc_power_watts{"))
        .collect();
    assert_eq!(
        power.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{power:?}\n{}",
        lines.join("\n")
    );
    for (t, w) in &want {
        assert!(
            (power[t] - w).abs() < 1e-6,
            "sum by (hw_type) (hw_power_watts){{hw_type={t:?}}} is {}, want {w}",
            power[t]
        );
    }
    // The errors: 5 a second over the node, each counted once.
    assert_eq!(errors.keys().collect::<Vec<_>>(), ["gpu"], "{errors:?}");
    assert!(
        (errors["gpu"] - 5.0).abs() < 0.5,
        "rate of hw_errors_total: {errors:?}"
    );
    // The host's total where the conventions put it, and the BMC's copies of GPUs apart.
    let host = sums_by_type(&prom, "sum by (hw_type) (hw_host_power_watts)");
    assert_eq!(host.get("enclosure"), Some(&374.0), "{host:?}");
    let copies = prom
        .result("count(bmc_power_watts{hw_type=\"gpu\"})")
        .expect("query");
    assert_eq!(
        copies[0]["value"][1].as_str(),
        Some("17"),
        "the DGX's sixteen GPU readings (board and DRAM of eight GPUs) and the shared GPU's: {copies}"
    );
    // Every label a series carries is one its registry entry (METRICS.md) lists (D23):
    // NVML, three BMCs and the agent's own series.
    let scraped = support::scrape(port, Duration::from_secs(5)).expect("scrape");
    let listed: BTreeMap<String, BTreeSet<String>> = support::registry_rows()
        .into_iter()
        .map(|r| {
            (
                r.prometheus,
                r.attrs.iter().map(|a| a.replace(['.', '-'], "_")).collect(),
            )
        })
        .collect();
    // The enumerated values the BMCs' series carry are the conventions' too (or a component
    // type they have none for: KNOWN).
    let (wrong, seen) = enum_deviations(&spec(), &scraped);
    assert!(seen > 100, "enumerated values checked: {seen}");
    assert!(
        wrong.is_empty(),
        "{}",
        wrong.into_iter().collect::<Vec<_>>().join("\n")
    );
    let mut unlisted = BTreeSet::new();
    for x in parse(&scraped) {
        let Some(attrs) = listed.get(&x.name) else {
            unlisted.insert(format!("{}: not in the registry", x.name));
            continue;
        };
        for k in x.labels.keys() {
            if k != "hw_id" && !attrs.contains(k) {
                unlisted.insert(format!("{}{{{k}}}", x.name));
            }
        }
    }
    assert!(
        unlisted.is_empty(),
        "labels the registry does not list:\n{}",
        unlisted.into_iter().collect::<Vec<_>>().join("\n")
    );
    assert!(agent.terminate().success());
}

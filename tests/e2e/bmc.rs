//! The Redfish source end to end against real servers on loopback: `sushy-static` serving the
//! DMTF CDU and liquid-cooled-server mockups, a DGX H100 capture and a tree written here, every
//! exported value compared with the tree. The tree with every quirk is in `bmc_tree`, the
//! transport (TLS, auth, timeouts, sessions) in `bmc_sessions`, IPMI in `ipmi`.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::bmc;
use crate::support::{self, Series, parse, value};

use crate::bmc_tree::project_tree;

pub(crate) fn fixtures() -> PathBuf {
    support::root().join("tests/fixtures")
}

/// DMTF's and NVIDIA's Redfish mockups, read where they are kept (`../shared/fixtures`).
pub(crate) fn shared_redfish() -> PathBuf {
    testkit::shared().join("fixtures/redfish")
}

/// A config with only the given sections (NVML on the simulator when `nvml`).
pub(crate) fn config(sections: &str, nvml: bool, port: u16) -> String {
    let base = if nvml {
        support::sim_config("current", port, "")
    } else {
        format!(
            "state_dir = {:?}\n[sources.nvml]\nenabled = false\n{}\n[sinks.prometheus]\nlisten = \"127.0.0.1:{port}\"\n",
            support::temp_dir().join("state").display().to_string(),
            support::EBPF_OFF
        )
    };
    format!("{base}\n[sources.kmsg]\nenabled = false\n{sections}")
}

/// `junction once --format prometheus` with `config`: (exit ok, stdout, stderr).
pub(crate) fn once(config_text: &str) -> (bool, String, String) {
    let dir = support::temp_dir();
    let path = dir.join("junction.toml");
    std::fs::write(&path, config_text).expect("config");
    let out = support::output(
        support::junction()
            .env(
                "JUNCTION_NVML_SIM_SCENARIO",
                support::scenario("h100-training.toml"),
            )
            .arg("--config")
            .arg(&path)
            .args(["once", "--format", "prometheus"]),
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Each (target name, tree) served by `sushy-static`: the servers (stopped on drop) and the
/// `[[sources.redfish.targets]]` sections that poll them (each with `extra`).
pub(crate) fn serve_trees(
    tool: &Path,
    trees: &[(&str, PathBuf)],
    extra: &str,
) -> (Vec<bmc::Server>, String) {
    let servers: Vec<_> = trees
        .iter()
        .map(|(_, d)| bmc::sushy_static(tool, d))
        .collect();
    let mut sections = String::new();
    for ((name, _), s) in trees.iter().zip(&servers) {
        sections.push_str(&redfish_target(
            name,
            &format!("http://127.0.0.1:{}", s.port),
            extra,
        ));
    }
    (servers, sections)
}

pub(crate) fn redfish_target(name: &str, url: &str, extra: &str) -> String {
    format!("\n[[sources.redfish.targets]]\nname = {name:?}\nurl = {url:?}\n{extra}\n")
}

/// A reading as BMCs send it.
fn num(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|x: &f64| x.is_finite())
}

/// The metric and factor a Sensor's reading is exported as (the spec, written out here
/// independently of the code under test).
fn sensor_metric(doc: &Value) -> (&'static str, f64) {
    let units = doc["ReadingUnits"].as_str().unwrap_or("");
    let ctx = doc["PhysicalContext"].as_str().unwrap_or("");
    let ty = doc["ReadingType"].as_str().unwrap_or(match units {
        "Cel" => "Temperature",
        "W" => "Power",
        "V" => "Voltage",
        "kPa" => "PressurekPa",
        "L/min" => "LiquidFlowLPM",
        "kW" => "Heat",
        "RPM" | "{rev}/min" => "Rotational",
        "%" => "Percent",
        _ => "Other",
    });
    // A GPU's T.Limit as HGX BMCs publish it: a temperature whose thresholds are all lower
    // ones, at or below 0 and one negative, is a margin.
    let thresholds: Vec<(&String, f64)> = doc["Thresholds"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k, num(&v["Reading"])?)))
        .collect();
    let margin = !thresholds.is_empty()
        && thresholds
            .iter()
            .all(|(k, v)| k.starts_with("Lower") && *v <= 0.0)
        && thresholds.iter().any(|(_, v)| *v < 0.0);
    match ty {
        "Temperature" if margin => ("bmc_sensor_reading", 1.0),
        "Temperature" => ("hw_temperature_celsius", 1.0),
        "Humidity" => ("cooling_humidity_ratio", 0.01),
        "Power" => (power_metric(ctx, false), 1.0),
        "EnergyJoules" => (power_metric(ctx, true), 1.0),
        "EnergyWh" => (power_metric(ctx, true), 3600.0),
        "EnergykWh" => (power_metric(ctx, true), 3.6e6),
        "Voltage" => ("hw_voltage_volts", 1.0),
        "LiquidFlowLPM" => ("cooling_flow_L_per_min", 1.0),
        "LiquidFlow" => ("cooling_flow_L_per_min", 60.0),
        "PressurekPa" => ("cooling_pressure_kPa", 1.0),
        "PressurePa" | "Pressure" => ("cooling_pressure_kPa", 0.001),
        "Heat" => ("cooling_heat_removed_watts", 1000.0),
        "Rotational" if ctx == "Pump" => ("cooling_pump_speed_rpm", 1.0),
        "Rotational" => ("hw_fan_speed_rpm", 1.0),
        "Percent" if ctx == "Pump" => ("cooling_pump_speed_ratio", 0.01),
        "Percent" if ctx == "Fan" => ("hw_fan_speed_ratio", 0.01),
        "Valve" => ("cooling_valve_position_ratio", 0.01),
        _ => ("bmc_sensor_reading", 1.0),
    }
}

/// Where a power (energy) sensor's reading goes by its physical context, so that no sum over
/// `hw_power_watts` counts anything twice: one component's own draw there, a GPU's (NVML
/// reports it) and whatever sums others (a supply's input too) in `bmc_power_watts`. (A host chassis' total, in
/// `hw_host_power_watts`, is checked apart.)
fn power_metric(ctx: &str, energy: bool) -> &'static str {
    let own = matches!(
        ctx,
        "CPU" | "Memory" | "Fan" | "StorageDevice" | "NetworkingDevice" | "Battery"
    );
    match (own, energy) {
        (true, false) => "hw_power_watts",
        (true, true) => "hw_energy_joules_total",
        (false, false) => "bmc_power_watts",
        (false, true) => "bmc_energy_joules_total",
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

/// Every Sensor, CoolantConnector, Pump and chassis LeakDetector in the tree at `dir` (served
/// as target `target`) is exported with the tree's value. Returns how many were checked.
fn check_tree(target: &str, dir: &Path, series: &[Series]) -> usize {
    // What discovery can reach: members of some collection (a mockup may hold resources that
    // nothing links, e.g. a sensor only a processor's EnvironmentMetrics points at).
    let mut reachable = std::collections::HashSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(doc) =
                serde_json::from_str::<Value>(&std::fs::read_to_string(&p).unwrap_or_default())
            {
                for m in doc["Members"].as_array().into_iter().flatten() {
                    if let Some(u) = m["@odata.id"].as_str() {
                        reachable.insert(u.trim_start_matches("/redfish/v1").to_string());
                    }
                }
            }
        }
    }
    // The sensors a host chassis' totals name (a root chassis of a server's type, DSP0268
    // ChassisType): the host's power and energy.
    let mut host_sources = std::collections::HashSet::new();
    for e in std::fs::read_dir(dir.join("Chassis"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let read = |p: PathBuf| -> Value {
            serde_json::from_str(&std::fs::read_to_string(p).unwrap_or_default())
                .unwrap_or(Value::Null)
        };
        let c = read(e.path().join("index.json"));
        let root = c["Links"]["ContainedBy"].is_null();
        let server = matches!(
            c["ChassisType"].as_str(),
            Some("RackMount" | "Blade" | "Sled" | "StandAlone" | "Tower" | "Desktop")
        );
        if root && server {
            let env = read(e.path().join("EnvironmentMetrics/index.json"));
            for key in ["PowerWatts", "EnergyJoules", "EnergykWh"] {
                if let Some(u) = env[key]["DataSourceUri"].as_str() {
                    host_sources.insert(u.trim_start_matches("/redfish/v1").to_string());
                }
            }
        }
    }
    let mut checked = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.file_name().and_then(|n| n.to_str()) != Some("index.json") {
                continue;
            }
            let doc: Value =
                serde_json::from_str(&std::fs::read_to_string(&p).expect("read")).expect("json");
            let rel = p
                .parent()
                .and_then(|x| x.strip_prefix(dir).ok())
                .map(|x| format!("/{}", x.display()))
                .unwrap_or_default();
            if !reachable.contains(&rel) {
                continue;
            }
            // Identified by where it was fetched from, whatever it declares.
            let id = format!("{target}:{rel}");
            let ty = doc["@odata.type"].as_str().unwrap_or("");
            let mut expect = |metric: &str, labels: &[(&str, &str)], v: f64| {
                let mut l = vec![("hw_id", id.as_str())];
                l.extend_from_slice(labels);
                let got = value(series, metric, &l);
                assert!(
                    got.is_some_and(|g| close(g, v)),
                    "{target} {rel}: {metric} {labels:?} is {got:?}, the tree says {v}"
                );
                checked += 1;
            };
            if ty.starts_with("#Sensor.") {
                if let Some(r) = num(&doc["Reading"]) {
                    let (mut metric, factor) = sensor_metric(&doc);
                    if host_sources.contains(&rel) {
                        metric = match metric {
                            "bmc_power_watts" | "hw_power_watts" => "hw_host_power_watts",
                            _ => "hw_host_energy_joules_total",
                        };
                    }
                    expect(metric, &[], r * factor);
                }
            } else if ty.starts_with("#CoolantConnector.") {
                for (key, metric, point, f) in [
                    ("FlowLitersPerMinute", "cooling_flow_L_per_min", None, 1.0),
                    (
                        "SupplyTemperatureCelsius",
                        "cooling_coolant_temperature_celsius",
                        Some("supply"),
                        1.0,
                    ),
                    (
                        "ReturnTemperatureCelsius",
                        "cooling_coolant_temperature_celsius",
                        Some("return"),
                        1.0,
                    ),
                    (
                        "SupplyPressurekPa",
                        "cooling_pressure_kPa",
                        Some("supply"),
                        1.0,
                    ),
                    ("HeatRemovedkW", "cooling_heat_removed_watts", None, 1000.0),
                ] {
                    if let Some(r) = num(&doc[key]["Reading"]) {
                        let labels: Vec<(&str, &str)> = point
                            .map(|p| vec![("cooling_coolant_point", p)])
                            .unwrap_or_default();
                        expect(metric, &labels, r * f);
                    }
                }
            } else if ty.starts_with("#Pump.") {
                if let Some(r) = num(&doc["PumpSpeedPercent"]["Reading"]) {
                    expect("cooling_pump_speed_ratio", &[], r * 0.01);
                }
            } else if ty.starts_with("#LeakDetector.")
                && rel.contains("/LeakDetectors/")
                && !rel.contains("/LeakDetection/")
            {
                let state = match doc["DetectorState"].as_str() {
                    Some("OK") => "ok",
                    Some("Warning") => "warning",
                    Some("Critical") => "critical",
                    _ => continue,
                };
                expect(
                    "cooling_leak_detector_state",
                    &[("cooling_leak_state", state)],
                    1.0,
                );
            }
        }
    }
    checked
}

#[test]
fn dmtf_and_dgx_mockups_every_exported_value_equals_the_tree() {
    let Some(tool) = bmc::venv_tool("sushy-static") else {
        return;
    };
    let trees = [
        ("cdu", shared_redfish().join("dmtf-public-cooling-unit")),
        (
            "1u",
            shared_redfish().join("dmtf-public-liquid-cooled-server"),
        ),
        ("dgx", shared_redfish().join("nvidia-dgx-h100/redfish/v1")),
    ];
    let (_servers, sections) = serve_trees(&tool, &trees, "");
    let (ok, out, err) = once(&config(&sections, false, support::free_port()));
    assert!(ok, "{err}");
    let series = parse(&out);
    for (name, dir) in &trees {
        let n = check_tree(name, dir, &series);
        eprintln!("{name}: {n} values checked");
        assert!(n >= 10, "{name}: only {n} values checked");
        assert_eq!(
            value(&series, "junction_target_up", &[("junction_target", name)]),
            Some(1.0)
        );
    }
    // The CDU mockup's SecondaryHeatLoad declares PrimaryHeatLoad's id: both are exported.
    assert_eq!(
        value(
            &series,
            "cooling_heat_removed_watts",
            &[("hw_id", "cdu:/Chassis/CDU/Sensors/SecondaryHeatLoad")]
        ),
        Some(25310.0)
    );
    assert_eq!(
        value(
            &series,
            "cooling_heat_removed_watts",
            &[("hw_id", "cdu:/Chassis/CDU/Sensors/PrimaryHeatLoad")]
        ),
        Some(25480.0)
    );
    // The liquid-cooled server's CPU1Temp has no ReadingType: inferred from Cel.
    assert!(
        value(
            &series,
            "hw_temperature_celsius",
            &[("hw_id", "1u:/Chassis/1U/Sensors/CPU1Temp")]
        )
        .is_some()
    );
    // The DGX's legacy Thermal (no Sensors on that chassis) is read, with its thresholds:
    // every temperature and fan of it, by value, walked here from the file.
    let thermal: Value = serde_json::from_str(
        &std::fs::read_to_string(
            shared_redfish().join("nvidia-dgx-h100/redfish/v1/Chassis/DGX/Thermal/index.json"),
        )
        .expect("DGX Thermal"),
    )
    .expect("json");
    let (mut legacy, mut margins) = (0, 0);
    for (key, metric, field) in [
        ("Temperatures", "hw_temperature_celsius", "ReadingCelsius"),
        ("Fans", "hw_fan_speed_rpm", "Reading"),
    ] {
        for t in thermal[key].as_array().into_iter().flatten() {
            let (Some(name), Some(v)) = (t["Name"].as_str(), num(&t[field])) else {
                continue;
            };
            let labels = [("junction_target", "dgx"), ("hw_name", name)];
            // A GPU's T.Limit (TLIMIT_GB_SXMn: lower thresholds 0, -3, -5 and no upper one) is
            // a margin, not a temperature: a reading in Cel of its own.
            if key == "Temperatures"
                && num(&t["LowerThresholdCritical"]).is_some_and(|c| c < 0.0)
                && num(&t["UpperThresholdCritical"]).is_none()
            {
                assert_eq!(
                    value(&series, "bmc_sensor_reading", &labels),
                    Some(v),
                    "{name}"
                );
                assert_eq!(value(&series, metric, &labels), None, "{name}");
                margins += 1;
                continue;
            }
            assert_eq!(value(&series, metric, &labels), Some(v), "{name}");
            // Thresholds as the conventions name them (hw.limit_type).
            let limit = if key == "Fans" {
                "hw_fan_speed_limit_rpm"
            } else {
                "hw_temperature_limit_celsius"
            };
            for (json_key, threshold) in [
                ("LowerThresholdNonCritical", "low.degraded"),
                ("UpperThresholdNonCritical", "high.degraded"),
                ("UpperThresholdCritical", "high.critical"),
                ("UpperThresholdFatal", "high.fatal"),
            ] {
                if let Some(want) = num(&t[json_key]) {
                    let mut l = labels.to_vec();
                    l.push(("hw_limit_type", threshold));
                    assert_eq!(value(&series, limit, &l), Some(want), "{name} {threshold}");
                }
            }
            legacy += 1;
        }
    }
    assert!(legacy > 0, "the DGX's legacy Thermal has readings");
    assert!(margins > 0, "the DGX's legacy Thermal has T.Limit sensors");
    // Its HGX sensors' T.Limit (HGX_GPU_SXM_n_TEMP_1) likewise, one per GPU, on the GPU.
    let hgx: Vec<_> = series
        .iter()
        .filter(|s| {
            s.name == "bmc_sensor_reading"
                && s.labels
                    .get("hw_id")
                    .is_some_and(|id| id.ends_with("_TEMP_1"))
        })
        .collect();
    assert!(!hgx.is_empty(), "HGX T.Limit sensors");
    assert!(
        hgx.iter().all(|s| s.labels.contains_key("hw_parent")),
        "{hgx:#?}"
    );
    assert_eq!(
        value(
            &series,
            "hw_temperature_celsius",
            &[("junction_target", "dgx"), ("hw_name", "TEMP_GB_HSC5")]
        ),
        Some(29.0),
        "legacy Thermal read"
    );
    // Its metric report's values of sensors read elsewhere are not exported twice.
    let dram: Vec<_> = series
        .iter()
        .filter(|s| {
            s.name == "hw_temperature_celsius"
                && s.labels
                    .get("hw_name")
                    .is_some_and(|n| n.contains("SXM 1 DRAM 0 Temp"))
        })
        .collect();
    assert_eq!(dram.len(), 1, "{dram:#?}");
}

/// `[sinks] legacy_names` serves the previous release's Prometheus names for one release; by
/// default the names are the translation's.
#[test]
fn legacy_names_serve_the_previous_releases_names() {
    let Some(tool) = bmc::venv_tool("sushy-static") else {
        return;
    };
    let server = bmc::sushy_static(&tool, &project_tree("no-such-serial"));
    let target = redfish_target("rack", &format!("http://127.0.0.1:{}", server.port), "");
    let (ok, new, err) = once(&config(&target, false, support::free_port()));
    assert!(ok, "{err}");
    let legacy = format!("{target}\n[sinks]\nlegacy_names = true\n");
    let (ok, old, err) = once(&config(&legacy, false, support::free_port()));
    assert!(ok, "{err}");
    let flow = |out: &str, name: &str| {
        value(
            &parse(out),
            name,
            &[("hw_id", "rack:/Chassis/Rack1/Sensors/Flow")],
        )
    };
    assert_eq!(flow(&new, "cooling_flow_L_per_min"), Some(41.5));
    assert_eq!(flow(&new, "cooling_flow_liters_per_minute"), None);
    assert_eq!(flow(&old, "cooling_flow_liters_per_minute"), Some(41.5));
    assert_eq!(flow(&old, "cooling_flow_L_per_min"), None);
    assert!(
        old.contains("# TYPE cooling_pressure_kilopascals gauge"),
        "{old}"
    );
}

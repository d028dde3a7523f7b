//! BMC sources end to end against real servers on loopback: `sushy-static` serving the DMTF
//! CDU and liquid-cooled-server mockups, a DGX H100 capture and a tree written here;
//! `sushy-emulator` with basic auth over TLS; a slow and a silent BMC; OpenIPMI's `ipmi_sim`
//! compared with `ipmitool`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::bmc::{self, BadBmc, DynamicBmc, IpmiSim};
use crate::support::{self, Agent, Series, parse, value};

fn fixtures() -> PathBuf {
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

fn write(dir: &Path, path: &str, doc: Value) {
    let d = if path.is_empty() {
        dir.to_path_buf()
    } else {
        dir.join(path)
    };
    std::fs::create_dir_all(&d).expect("dir");
    std::fs::write(
        d.join("index.json"),
        serde_json::to_vec_pretty(&doc).expect("json"),
    )
    .expect("write");
}

fn members(base: &str, names: &[&str]) -> Value {
    json!({
        "@odata.id": base,
        "Members": names.iter().map(|n| json!({"@odata.id": format!("{base}/{n}")})).collect::<Vec<_>>(),
        "Members@odata.count": names.len(),
    })
}

/// A tree written here, modelled on the mockups, with every quirk the source handles and a
/// GPU chassis carrying the simulator's first GPU's serial number.
pub(crate) fn project_tree(gpu_serial: &str) -> PathBuf {
    let dir = support::temp_dir().join("tree");
    let r = "/redfish/v1";
    write(
        &dir,
        "",
        json!({
            "@odata.id": r, "@odata.type": "#ServiceRoot.v1_17_0.ServiceRoot", "Name": "Rack BMC", "Vendor": "Junction tests",
            "Chassis": {"@odata.id": format!("{r}/Chassis")},
            "ThermalEquipment": {"@odata.id": format!("{r}/ThermalEquipment")},
            "TelemetryService": {"@odata.id": format!("{r}/TelemetryService")},
            // Advertised, but sushy-static answers 404 to any query: the walk falls back.
            "ProtocolFeaturesSupported": {"ExpandQuery": {"Levels": true, "MaxLevels": 2}}
        }),
    );
    write(
        &dir,
        "Chassis",
        members(&format!("{r}/Chassis"), &["Rack1", "GPU0"]),
    );
    write(
        &dir,
        "Chassis/Rack1",
        json!({
            "@odata.id": format!("{r}/Chassis/Rack1"), "@odata.type": "#Chassis.v1_26_0.Chassis", "Id": "Rack1", "Name": "Rack 1",
            "Status": {"Health": "Warning"},
            "Sensors": {"@odata.id": format!("{r}/Chassis/Rack1/Sensors")},
            "LeakDetectors": {"@odata.id": format!("{r}/Chassis/Rack1/LeakDetectors")},
            "ThermalSubsystem": {"@odata.id": format!("{r}/Chassis/Rack1/ThermalSubsystem")}
        }),
    );
    let s = format!("{r}/Chassis/Rack1/Sensors");
    write(
        &dir,
        "Chassis/Rack1/Sensors",
        members(
            &s,
            &[
                "Inlet",
                "Flow",
                "NoType",
                "Broken",
                "DupA",
                "DupB",
                "Pressure",
                "CPU0Power",
                "PSU0Input",
            ],
        ),
    );
    let sensor = |id: &str, extra: Value| {
        let mut d = json!({"@odata.id": format!("{s}/{id}"), "@odata.type": "#Sensor.v1_12_0.Sensor", "Id": id, "Name": id});
        for (k, v) in extra.as_object().expect("object") {
            d[k] = v.clone();
        }
        d
    };
    write(
        &dir,
        "Chassis/Rack1/Sensors/Inlet",
        sensor(
            "Inlet",
            json!({"Reading": 24.5, "ReadingType": "Temperature", "ReadingUnits": "Cel", "PhysicalContext": "LiquidInlet"}),
        ),
    );
    // A reading sent as a string.
    write(
        &dir,
        "Chassis/Rack1/Sensors/Flow",
        sensor(
            "Flow",
            json!({"Reading": "41.500000", "ReadingType": "LiquidFlowLPM", "ReadingUnits": "L/min",
        "Thresholds": {"LowerCritical": {"Reading": 20}, "LowerCaution": {"Reading": "30"}}}),
        ),
    );
    // No ReadingType: the units say what it is.
    write(
        &dir,
        "Chassis/Rack1/Sensors/NoType",
        sensor("NoType", json!({"Reading": 33.25, "ReadingUnits": "Cel"})),
    );
    // No reading at all.
    write(
        &dir,
        "Chassis/Rack1/Sensors/Broken",
        sensor(
            "Broken",
            json!({"Reading": "nan", "ReadingType": "Temperature", "ReadingUnits": "Cel"}),
        ),
    );
    write(
        &dir,
        "Chassis/Rack1/Sensors/DupA",
        sensor(
            "DupA",
            json!({"Reading": 1.5, "ReadingType": "Voltage", "ReadingUnits": "V"}),
        ),
    );
    // Declares DupA's id (as the DMTF CDU mockup's SecondaryHeatLoad does): still itself.
    let mut dup_b = sensor(
        "DupA",
        json!({"Reading": 3.3, "ReadingType": "Voltage", "ReadingUnits": "V"}),
    );
    dup_b["Name"] = json!("DupB");
    write(&dir, "Chassis/Rack1/Sensors/DupB", dup_b);
    // One component's own draw (a CPU's), and a supply's input (which holds it).
    write(
        &dir,
        "Chassis/Rack1/Sensors/CPU0Power",
        sensor(
            "CPU0Power",
            json!({"Reading": 182.5, "ReadingType": "Power", "ReadingUnits": "W", "PhysicalContext": "CPU"}),
        ),
    );
    write(
        &dir,
        "Chassis/Rack1/Sensors/PSU0Input",
        sensor(
            "PSU0Input",
            json!({"Reading": 2950, "ReadingType": "Power", "ReadingUnits": "W", "PhysicalContext": "PowerSupply"}),
        ),
    );
    // Pascals, above its caution threshold.
    write(
        &dir,
        "Chassis/Rack1/Sensors/Pressure",
        sensor(
            "Pressure",
            json!({"Reading": 250000, "ReadingType": "PressurePa", "ReadingUnits": "Pa",
        "Thresholds": {"UpperCaution": {"Reading": 240000}, "UpperCritical": {"Reading": 300000}}}),
        ),
    );
    write(
        &dir,
        "Chassis/Rack1/LeakDetectors",
        members(&format!("{r}/Chassis/Rack1/LeakDetectors"), &["ColdPlate"]),
    );
    write(
        &dir,
        "Chassis/Rack1/LeakDetectors/ColdPlate",
        json!({"@odata.id": format!("{r}/Chassis/Rack1/LeakDetectors/ColdPlate"),
        "@odata.type": "#LeakDetector.v1_6_0.LeakDetector", "Name": "Cold plate leak", "DetectorState": "Warning", "LeakDetectorType": "Moisture"}),
    );
    write(
        &dir,
        "Chassis/Rack1/ThermalSubsystem",
        json!({"@odata.id": format!("{r}/Chassis/Rack1/ThermalSubsystem"),
        "CoolantConnectors": {"@odata.id": format!("{r}/Chassis/Rack1/ThermalSubsystem/CoolantConnectors")},
        "Pumps": {"@odata.id": format!("{r}/Chassis/Rack1/ThermalSubsystem/Pumps")}}),
    );
    write(
        &dir,
        "Chassis/Rack1/ThermalSubsystem/CoolantConnectors",
        members(
            &format!("{r}/Chassis/Rack1/ThermalSubsystem/CoolantConnectors"),
            &["Loop1"],
        ),
    );
    write(
        &dir,
        "Chassis/Rack1/ThermalSubsystem/CoolantConnectors/Loop1",
        json!({
        "@odata.id": format!("{r}/Chassis/Rack1/ThermalSubsystem/CoolantConnectors/Loop1"), "@odata.type": "#CoolantConnector.v1_3_0.CoolantConnector",
        "Name": "Loop 1", "FlowLitersPerMinute": {"Reading": 55.5}, "SupplyTemperatureCelsius": {"Reading": 28},
        "ReturnTemperatureCelsius": {"Reading": "38.25"}, "HeatRemovedkW": {"Reading": 12.5}}),
    );
    write(
        &dir,
        "Chassis/Rack1/ThermalSubsystem/Pumps",
        members(
            &format!("{r}/Chassis/Rack1/ThermalSubsystem/Pumps"),
            &["P1"],
        ),
    );
    write(
        &dir,
        "Chassis/Rack1/ThermalSubsystem/Pumps/P1",
        json!({"@odata.id": format!("{r}/Chassis/Rack1/ThermalSubsystem/Pumps/P1"),
        "@odata.type": "#Pump.v1_2_0.Pump", "Name": "Pump 1", "PumpSpeedPercent": {"Reading": 70, "SpeedRPM": 3100}}),
    );
    // The GPU's board, as an HGX baseboard reports it.
    write(
        &dir,
        "Chassis/GPU0",
        json!({"@odata.id": format!("{r}/Chassis/GPU0"), "@odata.type": "#Chassis.v1_17_0.Chassis",
        "Name": "GPU_SXM_1", "ChassisType": "Module", "SerialNumber": gpu_serial,
        "Status": {"State": "Enabled", "Health": "Warning"},
        "Sensors": {"@odata.id": format!("{r}/Chassis/GPU0/Sensors")}}),
    );
    write(
        &dir,
        "Chassis/GPU0/Sensors",
        members(
            &format!("{r}/Chassis/GPU0/Sensors"),
            &["GPU0_DRAM_0_Temp_0"],
        ),
    );
    write(
        &dir,
        "Chassis/GPU0/Sensors/GPU0_DRAM_0_Temp_0",
        json!({"@odata.id": format!("{r}/Chassis/GPU0/Sensors/GPU0_DRAM_0_Temp_0"),
        "@odata.type": "#Sensor.v1_2_0.Sensor", "Name": "GPU0 DRAM 0 Temp 0", "Reading": 71, "ReadingType": "Temperature", "ReadingUnits": "Cel",
        "PhysicalContext": "GPU", "Thresholds": {"UpperCritical": {"Reading": 95}}}),
    );
    write(
        &dir,
        "ThermalEquipment",
        json!({"@odata.id": format!("{r}/ThermalEquipment"), "CDUs": {"@odata.id": format!("{r}/ThermalEquipment/CDUs")}}),
    );
    write(
        &dir,
        "ThermalEquipment/CDUs",
        members(&format!("{r}/ThermalEquipment/CDUs"), &["1"]),
    );
    write(
        &dir,
        "ThermalEquipment/CDUs/1",
        json!({"@odata.id": format!("{r}/ThermalEquipment/CDUs/1"), "@odata.type": "#CoolingUnit.v1_5_0.CoolingUnit",
        "Name": "Row CDU", "EquipmentType": "CDU", "Status": {"Health": "Critical"},
        "PrimaryCoolantConnectors": {"@odata.id": format!("{r}/ThermalEquipment/CDUs/1/PrimaryCoolantConnectors")}}),
    );
    write(
        &dir,
        "ThermalEquipment/CDUs/1/PrimaryCoolantConnectors",
        members(
            &format!("{r}/ThermalEquipment/CDUs/1/PrimaryCoolantConnectors"),
            &["1"],
        ),
    );
    write(
        &dir,
        "ThermalEquipment/CDUs/1/PrimaryCoolantConnectors/1",
        json!({"@odata.id": format!("{r}/ThermalEquipment/CDUs/1/PrimaryCoolantConnectors/1"),
        "@odata.type": "#CoolantConnector.v1_3_0.CoolantConnector", "Name": "Facility supply", "FlowLitersPerMinute": {"Reading": 120}}),
    );
    // The CDU forgets to link its reservoir.
    write(
        &dir,
        "ThermalEquipment/CDUs/1/Reservoirs",
        members(&format!("{r}/ThermalEquipment/CDUs/1/Reservoirs"), &["R1"]),
    );
    write(
        &dir,
        "ThermalEquipment/CDUs/1/Reservoirs/R1",
        json!({"@odata.id": format!("{r}/ThermalEquipment/CDUs/1/Reservoirs/R1"),
        "@odata.type": "#Reservoir.v1_0_2.Reservoir", "Name": "Reservoir", "FluidLevelPercent": {"Reading": 85}}),
    );
    write(
        &dir,
        "TelemetryService",
        json!({"@odata.id": format!("{r}/TelemetryService"), "MetricReports": {"@odata.id": format!("{r}/TelemetryService/MetricReports")}}),
    );
    write(
        &dir,
        "TelemetryService/MetricReports",
        members(&format!("{r}/TelemetryService/MetricReports"), &["Env"]),
    );
    write(
        &dir,
        "TelemetryService/MetricReports/Env",
        json!({"@odata.id": format!("{r}/TelemetryService/MetricReports/Env"), "MetricValues": [
            {"MetricProperty": format!("{r}/Chassis/GPU0/Sensors/GPU0_Power_0"), "MetricValue": "455.5", "Oem": {"Nvidia": {"MetricValueStale": false}}},
            {"MetricProperty": format!("{r}/Chassis/GPU0/Sensors/GPU0_TEMP_1"), "MetricValue": "60.0", "Oem": {"Nvidia": {"MetricValueStale": true}}},
            {"MetricProperty": format!("{r}/Chassis/GPU0/Sensors/GPU0_Energy_0"), "MetricValue": "nan"},
            {"MetricProperty": format!("{r}/Chassis/GPU0/Sensors/GPU0_DRAM_0_Temp_0#/Reading"), "MetricValue": "71.0"}
        ]}),
    );
    dir
}

#[test]
fn a_tree_with_every_quirk_and_a_gpu_the_bmc_shares_with_nvml() {
    let Some(tool) = bmc::venv_tool("sushy-static") else {
        return;
    };
    // The simulator's first GPU.
    let mut agent = Agent::start("h100-training.toml", "current");
    let s = parse(&support::scrape(agent.port, Duration::from_secs(5)).expect("scrape"));
    let gpu = s
        .iter()
        .find(|x| x.name == "gpu_info" && x.labels["gpu_index"] == "0")
        .expect("gpu 0")
        .clone();
    agent.terminate();
    let (uuid, serial) = (
        gpu.labels["hw_id"].clone(),
        gpu.labels["hw_serial_number"].clone(),
    );
    let tree = project_tree(&serial);
    let server = bmc::sushy_static(&tool, &tree);
    let (ok, out, err) = once(&config(
        &redfish_target("rack", &format!("http://127.0.0.1:{}", server.port), ""),
        true,
        support::free_port(),
    ));
    assert!(ok, "{err}");
    let s = parse(&out);
    let v = |m: &str, l: &[(&str, &str)]| value(&s, m, l);
    let id = |p: &str| format!("rack:{p}");
    assert_eq!(
        v(
            "hw_temperature_celsius",
            &[
                ("hw_id", &id("/Chassis/Rack1/Sensors/Inlet")),
                ("hw_sensor_location", "liquid_inlet")
            ]
        ),
        Some(24.5)
    );
    assert_eq!(
        v(
            "cooling_flow_L_per_min",
            &[("hw_id", &id("/Chassis/Rack1/Sensors/Flow"))]
        ),
        Some(41.5),
        "a string reading"
    );
    assert_eq!(
        v(
            "bmc_sensor_threshold",
            &[
                ("hw_id", &id("/Chassis/Rack1/Sensors/Flow")),
                ("bmc_threshold", "lower_caution")
            ]
        ),
        Some(30.0)
    );
    assert_eq!(
        v(
            "hw_temperature_celsius",
            &[("hw_id", &id("/Chassis/Rack1/Sensors/NoType"))]
        ),
        Some(33.25),
        "type from the units"
    );
    assert!(!out.contains("Sensors/Broken"), "nan is no reading");
    assert_eq!(
        v(
            "hw_voltage_volts",
            &[("hw_id", &id("/Chassis/Rack1/Sensors/DupA"))]
        ),
        Some(1.5)
    );
    assert_eq!(
        v(
            "hw_voltage_volts",
            &[("hw_id", &id("/Chassis/Rack1/Sensors/DupB"))]
        ),
        Some(3.3),
        "the duplicated id"
    );
    assert_eq!(
        v(
            "cooling_pressure_kPa",
            &[("hw_id", &id("/Chassis/Rack1/Sensors/Pressure"))]
        ),
        Some(250.0),
        "Pa to kPa"
    );
    assert_eq!(
        v(
            "bmc_sensor_state",
            &[
                ("hw_id", &id("/Chassis/Rack1/Sensors/Pressure")),
                ("bmc_sensor_state", "warning")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        v(
            "bmc_sensor_threshold",
            &[
                ("hw_id", &id("/Chassis/Rack1/Sensors/Pressure")),
                ("bmc_threshold", "upper_critical")
            ]
        ),
        Some(300.0)
    );
    assert_eq!(
        v(
            "cooling_leak_detector_state",
            &[
                ("hw_id", &id("/Chassis/Rack1/LeakDetectors/ColdPlate")),
                ("cooling_leak_state", "warning")
            ]
        ),
        Some(1.0)
    );
    let loop1 = id("/Chassis/Rack1/ThermalSubsystem/CoolantConnectors/Loop1");
    assert_eq!(
        v("cooling_flow_L_per_min", &[("hw_id", &loop1)]),
        Some(55.5)
    );
    assert_eq!(
        v(
            "cooling_coolant_temperature_celsius",
            &[("hw_id", &loop1), ("cooling_coolant_point", "return")]
        ),
        Some(38.25)
    );
    assert_eq!(
        v("cooling_heat_removed_watts", &[("hw_id", &loop1)]),
        Some(12500.0)
    );
    let p1 = id("/Chassis/Rack1/ThermalSubsystem/Pumps/P1");
    assert_eq!(v("cooling_pump_speed_rpm", &[("hw_id", &p1)]), Some(3100.0));
    assert_eq!(v("cooling_pump_speed_ratio", &[("hw_id", &p1)]), Some(0.7));
    assert_eq!(
        v(
            "cooling_flow_L_per_min",
            &[(
                "hw_id",
                &id("/ThermalEquipment/CDUs/1/PrimaryCoolantConnectors/1")
            )]
        ),
        Some(120.0)
    );
    assert_eq!(
        v(
            "cooling_coolant_level_ratio",
            &[("hw_id", &id("/ThermalEquipment/CDUs/1/Reservoirs/R1"))]
        ),
        Some(0.85),
        "an unlinked reservoir"
    );
    assert_eq!(
        v(
            "hw_status",
            &[
                ("hw_id", &id("/ThermalEquipment/CDUs/1")),
                ("hw_state", "failed")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        v(
            "hw_status",
            &[("hw_id", &id("/Chassis/Rack1")), ("hw_state", "degraded")]
        ),
        Some(1.0)
    );
    // The BMC's HBM temperature of the GPU is a sensor of its own on the GPU (hw.parent is
    // the GPU's NVML hw.id), next to NVML's.
    assert_eq!(
        v(
            "hw_temperature_celsius",
            &[
                ("hw_parent", &uuid),
                ("junction_target", "rack"),
                ("hw_name", "GPU0 DRAM 0 Temp 0")
            ]
        ),
        Some(71.0)
    );
    // h100-training.toml: the GPU's `temp_memory = 71`.
    assert_eq!(
        v(
            "hw_temperature_celsius",
            &[("hw_id", &uuid), ("hw_sensor_location", "memory_junction")]
        ),
        Some(71.0),
        "NVML's HBM temperature"
    );
    // The metric report: a fresh value exported (the BMC's copy of the GPU's power, which
    // NVML's hw.power counts: not a second hw.power series), a stale one and a nan not, one
    // of a sensor read already not twice.
    assert_eq!(
        v(
            "bmc_power_watts",
            &[
                ("hw_parent", &uuid),
                ("hw_type", "gpu"),
                ("junction_target", "rack")
            ]
        ),
        Some(455.5)
    );
    assert!(
        !s.iter().any(|x| x.name == "hw_power_watts"
            && x.labels.get("junction_target").map(String::as_str) == Some("rack")
            && x.labels.get("hw_type").map(String::as_str) == Some("gpu")),
        "no BMC copy of a GPU's power in hw_power_watts"
    );
    assert!(!out.contains("GPU0_TEMP_1"), "stale value skipped");
    assert!(!out.contains("GPU0_Energy_0"), "nan skipped");
    assert_eq!(
        s.iter()
            .filter(|x| x.name == "hw_temperature_celsius"
                && x.labels.get("junction_target").map(String::as_str) == Some("rack")
                && x.labels.get("hw_parent") == Some(&uuid))
            .count(),
        1
    );
    // One hw.status state set for the GPU, Junction's; the BMC's health of it apart.
    let states: Vec<_> = s
        .iter()
        .filter(|x| x.name == "hw_status" && x.labels.get("hw_id") == Some(&uuid))
        .map(|x| x.labels["hw_state"].clone())
        .collect();
    assert_eq!(
        states.len(),
        std::collections::BTreeSet::from_iter(&states).len(),
        "{states:?}"
    );
    // The BMC says Warning of the GPU: that is its own series; the verdict stays NVML's.
    assert_eq!(
        v(
            "bmc_component_health",
            &[("hw_id", &uuid), ("bmc_health", "warning")]
        ),
        Some(1.0),
        "the BMC's health of the GPU"
    );
    assert_eq!(
        s.iter()
            .filter(|x| x.name == "hw_status" && x.labels.get("hw_id") == Some(&uuid))
            .map(|x| x.value)
            .sum::<f64>(),
        1.0,
        "one state of the GPU is true: Junction's verdict"
    );
    // `junction once` as a table shows the BMC too.
    let dir = support::temp_dir();
    let path = dir.join("junction.toml");
    std::fs::write(
        &path,
        config(
            &redfish_target("rack", &format!("http://127.0.0.1:{}", server.port), ""),
            false,
            support::free_port(),
        ),
    )
    .expect("config");
    let table = support::output(support::junction().arg("--config").arg(&path).arg("once"));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("BMC rack (redfish)") && text.contains("Loop 1 (return)"),
        "{text}"
    );
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

#[test]
fn sushy_emulator_basic_auth_over_tls() {
    let Some(tool) = bmc::venv_tool("sushy-emulator") else {
        return;
    };
    let ca = support::otlp::test_ca();
    let server = bmc::sushy_emulator(
        &tool,
        "monitor",
        "s3cret-pass",
        &ca.server.cert,
        &ca.server.key,
    );
    let dir = support::temp_dir();
    let (caf, good, bad) = (dir.join("ca.pem"), dir.join("good"), dir.join("bad"));
    std::fs::write(&caf, &ca.ca).expect("ca");
    std::fs::write(&good, "s3cret-pass\n").expect("pw");
    std::fs::write(&bad, "wrong-pass\n").expect("pw");
    let url = format!("https://127.0.0.1:{}", server.port);
    let target = |pw: &Path, extra: &str| {
        redfish_target(
            "emu",
            &url,
            &format!(
                "username = \"monitor\"\npassword_file = {:?}\n{extra}",
                pw.display().to_string()
            ),
        )
    };
    // Trusted CA, right password: the emulator's (legacy Thermal) readings.
    let (ok, out, err) = once(&config(
        &target(&good, &format!("ca_file = {:?}", caf.display().to_string())),
        false,
        support::free_port(),
    ));
    assert!(
        ok,
        "{err}\n{}",
        std::fs::read_to_string(&server.log).unwrap_or_default()
    );
    let s = parse(&out);
    assert_eq!(
        value(&s, "junction_target_up", &[("junction_target", "emu")]),
        Some(1.0)
    );
    assert!(
        s.iter()
            .any(|x| x.name == "hw_temperature_celsius" && x.value == 41.0),
        "CPU Temp 41 C:\n{out}"
    );
    assert!(
        s.iter()
            .any(|x| x.name == "hw_fan_speed_rpm" && x.value == 2100.0),
        "a fan at 2100 RPM"
    );
    // An untrusted certificate is refused, saying what to do.
    let (ok, _, err) = once(&config(&target(&good, ""), false, support::free_port()));
    assert!(!ok);
    assert!(err.contains("TLS") && err.contains("ca_file"), "{err}");
    // ... unless configured.
    let (ok, out, err) = once(&config(
        &target(&good, "insecure = true"),
        false,
        support::free_port(),
    ));
    assert!(ok, "{err}");
    assert!(err.contains("verification is off"), "a warning: {err}");
    assert_eq!(
        value(
            &parse(&out),
            "junction_target_up",
            &[("junction_target", "emu")]
        ),
        Some(1.0)
    );
    // A wrong password: up 0, a clear error, no crash, the other sources go on, no secret in
    // the log.
    let port = support::free_port();
    let mut agent = Agent::spawn_config(
        "h100-training.toml",
        &config(
            &target(
                &bad,
                &format!(
                    "ca_file = {:?}\ninterval_secs = 1",
                    caf.display().to_string()
                ),
            ),
            true,
            port,
        ),
    );
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        value(
            &parse(m),
            "junction_target_poll_failures_total",
            &[("junction_target", "emu"), ("error_type", "auth")],
        )
        .is_some()
            && m.contains("hw_gpu_memory_usage_bytes")
    });
    assert_eq!(
        value(
            &parse(&body),
            "junction_target_up",
            &[("junction_target", "emu")]
        ),
        Some(0.0)
    );
    let log = agent.log();
    assert!(log.contains("authentication failed"), "{log}");
    assert!(
        !log.contains("wrong-pass") && !log.contains("s3cret"),
        "no password in the log"
    );
    assert!(
        agent.child.try_wait().expect("status").is_none(),
        "still running"
    );
}

#[test]
fn a_slow_and_a_silent_bmc_time_out_on_schedule_never_overlap_and_hold_nothing_up() {
    let slow = BadBmc::start(Some(Duration::from_secs(3)));
    let silent = BadBmc::start(None);
    let port = support::free_port();
    let sections = redfish_target(
        "slow",
        &format!("http://127.0.0.1:{}", slow.port),
        "timeout_secs = 2\ninterval_secs = 1",
    ) + &redfish_target(
        "silent",
        &format!("http://127.0.0.1:{}", silent.port),
        "timeout_secs = 2\ninterval_secs = 1",
    );
    let mut agent = Agent::spawn_config("h100-training.toml", &config(&sections, true, port));
    let start = Instant::now();
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        let s = parse(m);
        ["slow", "silent"].iter().all(|t| {
            value(
                &s,
                "junction_target_poll_failures_total",
                &[("junction_target", t), ("error_type", "timeout")],
            )
            .is_some_and(|n| n >= 3.0)
        })
    });
    let elapsed = start.elapsed().as_secs_f64();
    let s = parse(&body);
    for (t, b) in [("slow", &slow), ("silent", &silent)] {
        assert_eq!(
            value(&s, "junction_target_up", &[("junction_target", t)]),
            Some(0.0)
        );
        let d = value(
            &s,
            "junction_target_poll_duration_seconds",
            &[("junction_target", t)],
        )
        .expect("duration");
        assert!(
            (2.0..3.0).contains(&d),
            "{t}: a poll ends at its 2 s timeout, took {d}"
        );
        // One poll at a time: never two connections open at once, although each poll lasts
        // twice the interval.
        assert_eq!(
            b.max_open(Duration::from_millis(250)),
            1,
            "{t}: polls overlapped"
        );
        let polls = b.connections() as f64;
        assert!(
            polls <= elapsed / 2.0 + 2.0,
            "{t}: {polls} polls in {elapsed:.1} s, each lasting 2 s"
        );
    }
    // NVML is unaffected while the BMCs hang: GPU 0's energy counter moves between two
    // scrapes (a stalled collection would leave the old series in place).
    let energy = |m: &str| {
        let s = parse(m);
        let gpu = support::uuids(&s).first().cloned().unwrap_or_default();
        value(&s, "hw_energy_joules_total", &[("hw_id", &gpu)]).unwrap_or(0.0)
    };
    let before = support::scrape(agent.port, Duration::from_secs(5)).expect("scrape");
    std::thread::sleep(Duration::from_millis(2500));
    let after = support::scrape(agent.port, Duration::from_secs(5)).expect("scrape");
    assert!(
        energy(&after) > energy(&before),
        "NVML stopped updating while the BMCs hang: {} then {}",
        energy(&before),
        energy(&after)
    );
    assert!(body.contains("hw_gpu_memory_usage_bytes"));
    assert!(agent.log().contains("Redfish poll failed"));
}

/// One chassis with eight temperature sensors: a walk that fans out.
fn eight_sensors(path: &str, _t: f64) -> Option<Value> {
    let r = "/redfish/v1";
    let sensors = format!("{r}/Chassis/1/Sensors");
    Some(match path.trim_start_matches(r) {
        "" => {
            json!({"@odata.id": r, "Chassis": {"@odata.id": format!("{r}/Chassis")}, "SessionService": {"@odata.id": format!("{r}/SessionService")}})
        }
        "/Chassis" => json!({"Members": [{"@odata.id": format!("{r}/Chassis/1")}]}),
        "/Chassis/1" => json!({"Id": "1", "Name": "Node", "Sensors": {"@odata.id": sensors}}),
        "/Chassis/1/Sensors" => {
            json!({"Members": (0..8).map(|i| json!({"@odata.id": format!("{sensors}/T{i}")})).collect::<Vec<_>>()})
        }
        p => {
            let i: u32 = p.strip_prefix("/Chassis/1/Sensors/T")?.parse().ok()?;
            json!({"@odata.id": format!("{sensors}/T{i}"), "Id": format!("T{i}"), "Name": format!("T{i}"), "Reading": 30 + i, "ReadingType": "Temperature", "ReadingUnits": "Cel"})
        }
    })
}

/// `auth = "session"` against a BMC that enforces sessions: one session for many polls, one
/// new session when it expires (also when requests in flight are refused together), a wrong
/// password refused without the password in the log, the session deleted at shutdown.
#[test]
fn redfish_sessions_are_reused_recreated_once_when_they_expire_and_deleted_at_shutdown() {
    let bmc = DynamicBmc::with_sessions("monitor", "s3cret-pw", eight_sensors);
    let sessions = bmc.sessions.clone().expect("sessions");
    let dir = support::temp_dir();
    let (good, bad) = (dir.join("good"), dir.join("bad"));
    std::fs::write(&good, "s3cret-pw\n").expect("pw");
    std::fs::write(&bad, "wrong-pw\n").expect("pw");
    let url = format!("http://127.0.0.1:{}", bmc.port);
    let extra = |pw: &Path| {
        format!(
            "username = \"monitor\"\npassword_file = {:?}\nauth = \"session\"\ninterval_secs = 1\nexpand = false\nmax_concurrent_requests = 4",
            pw.display().to_string()
        )
    };
    let port = support::free_port();
    let sections =
        redfish_target("bmc", &url, &extra(&good)) + &redfish_target("wrong", &url, &extra(&bad));
    let mut agent = Agent::spawn_config("h100-training.toml", &config(&sections, false, port));
    let requests = |m: &str| {
        value(
            &parse(m),
            "junction_target_requests_total",
            &[("junction_target", "bmc")],
        )
        .unwrap_or(0.0)
    };
    // A poll is 12 requests (root, chassis collection, chassis, sensor collection, 8 sensors).
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        requests(m) >= 36.0 && m.contains("Sensors/T7")
    });
    let s = parse(&body);
    assert_eq!(
        value(&s, "junction_target_up", &[("junction_target", "bmc")]),
        Some(1.0)
    );
    assert_eq!(sessions.created(), 1, "one session for three polls");
    // The BMC ends every session: the next poll creates one new session.
    sessions.expire_all();
    let after = requests(&body);
    let body = agent.wait_for(Duration::from_secs(30), |m| requests(m) >= after + 24.0);
    assert_eq!(
        value(
            &parse(&body),
            "junction_target_up",
            &[("junction_target", "bmc")]
        ),
        Some(1.0)
    );
    assert_eq!(sessions.created(), 2);
    // Sessions that end in the middle of a walk, with four requests in flight: those refused
    // together create one session between them, never one each.
    sessions.expire_after(10);
    let before = sessions.created();
    let after = requests(&body);
    let body = agent.wait_for(Duration::from_secs(30), |m| requests(m) >= after + 60.0);
    assert!(
        sessions.created() >= before + 4,
        "sessions expired and were re-created"
    );
    assert_eq!(sessions.max_live(), 1, "never two sessions at once");
    sessions.expire_after(0);
    // The wrong password: refused at login, an auth failure, no password in the log.
    let s = parse(&body);
    assert_eq!(
        value(&s, "junction_target_up", &[("junction_target", "wrong")]),
        Some(0.0)
    );
    assert!(
        value(
            &s,
            "junction_target_poll_failures_total",
            &[("junction_target", "wrong"), ("error_type", "auth")]
        )
        .is_some_and(|n| n >= 1.0)
    );
    assert!(sessions.refused_logins() >= 1);
    // Shutdown deletes the live session.
    let deleted = sessions.deleted();
    assert!(agent.terminate().success());
    assert_eq!(
        sessions.deleted(),
        deleted + 1,
        "the session is deleted at shutdown"
    );
    assert_eq!(sessions.live(), 0);
    let log = agent.log();
    assert!(
        !log.contains("s3cret-pw") && !log.contains("wrong-pw") && !log.contains("token-"),
        "no secret in the log:\n{log}"
    );
}

/// The same against a Redfish service we did not write: DMTF's Redfish-Mockup-Server answers a
/// session login with 204, `X-Auth-Token` and `Location` (not 201), and removes the session
/// from its collection on DELETE. It does not check tokens; what this shows is that the login
/// and the logout reach it as it expects.
#[test]
fn redfish_sessions_log_in_and_out_of_dmtfs_mockup_server() {
    let Some(server) = bmc::mockup_server(&shared_redfish().join("dmtf-public-cooling-unit"))
    else {
        return;
    };
    let sessions = || {
        let body = support::get(
            server.port,
            "/redfish/v1/SessionService/Sessions",
            Duration::from_secs(10),
        )
        .expect("sessions");
        let doc: Value = serde_json::from_str(&body).expect("sessions JSON");
        doc["Members"]
            .as_array()
            .expect("members")
            .iter()
            .map(|m| m["@odata.id"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    let before = sessions();
    let pw = support::temp_dir().join("pw");
    std::fs::write(&pw, "s3cret-pw\n").expect("pw");
    let port = support::free_port();
    let extra = format!(
        "username = \"monitor\"\npassword_file = {:?}\nauth = \"session\"\ninterval_secs = 1",
        pw.display().to_string()
    );
    let sections = redfish_target("cdu", &format!("http://127.0.0.1:{}", server.port), &extra);
    let mut agent = Agent::spawn_config("h100-training.toml", &config(&sections, false, port));
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        value(
            &parse(m),
            "junction_target_requests_total",
            &[("junction_target", "cdu")],
        )
        .is_some_and(|n| n > 40.0)
    });
    assert_eq!(
        value(
            &parse(&body),
            "junction_target_up",
            &[("junction_target", "cdu")]
        ),
        Some(1.0),
        "{}",
        agent.log()
    );
    let during = sessions();
    assert_eq!(
        during.len(),
        before.len() + 1,
        "one session for several polls: {during:?}"
    );
    assert!(agent.terminate().success());
    assert_eq!(sessions(), before, "the session is gone after shutdown");
    assert!(!agent.log().contains("s3cret-pw"));
}

/// The overlap measure the test above relies on: back-to-back connections are one at a time,
/// two held open together are two.
#[test]
fn the_bad_bmcs_overlap_measure_tells_back_to_back_from_overlapping() {
    use std::net::TcpStream;
    let hold = |port: u16| {
        let c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        std::thread::sleep(Duration::from_millis(600));
        c
    };
    let serial = BadBmc::start(None);
    for _ in 0..3 {
        drop(hold(serial.port));
    }
    let parallel = BadBmc::start(None);
    let first = TcpStream::connect(("127.0.0.1", parallel.port)).expect("connect");
    drop(hold(parallel.port));
    drop(first);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(serial.connections(), 3);
    assert_eq!(serial.max_open(Duration::from_millis(250)), 1);
    assert_eq!(parallel.connections(), 2);
    assert_eq!(parallel.max_open(Duration::from_millis(250)), 2);
}

/// `ipmitool sensor` (name → value, thresholds unc/uc/unr/lnc/lc/lnr).
/// One `ipmitool sensor` line: name, reading, thresholds.
/// (name, value, unit, thresholds) as `ipmitool sensor` prints them.
type IpmitoolSensor = (String, Option<f64>, String, Vec<(&'static str, f64)>);

fn ipmitool(sim: &IpmiSim) -> Vec<IpmitoolSensor> {
    let out = support::output(std::process::Command::new("ipmitool").args([
        "-I",
        "lanplus",
        "-H",
        "127.0.0.1",
        "-p",
        &sim.server.port.to_string(),
        "-U",
        "monitor",
        "-P",
        "monpass",
        "-L",
        "USER",
        "sensor",
    ]));
    assert!(
        out.status.success(),
        "ipmitool failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').map(str::trim).collect();
            if f.len() < 10 {
                return None;
            }
            let t = |i: usize| f[i].parse::<f64>().ok();
            let mut th = Vec::new();
            for (i, n) in [
                (4, "lower_fatal"),
                (5, "lower_critical"),
                (6, "lower_caution"),
                (7, "upper_caution"),
                (8, "upper_critical"),
                (9, "upper_fatal"),
            ] {
                if let Some(x) = t(i) {
                    th.push((n, x));
                }
            }
            Some((f[0].to_string(), t(1), f[2].to_string(), th))
        })
        .collect()
}

/// IPMI's threshold names (as `ipmitool` heads its columns) as the conventions'
/// `hw.limit_type` (non-critical = degraded; non-recoverable has no name there).
fn spec_limit(t: &str) -> &'static str {
    match t {
        "lower_fatal" => "low.fatal",
        "lower_critical" => "low.critical",
        "lower_caution" => "low.degraded",
        "upper_caution" => "high.degraded",
        "upper_critical" => "high.critical",
        "upper_fatal" => "high.fatal",
        other => panic!("threshold {other}"),
    }
}

/// The metric an `ipmitool` unit column is exported as (IPMI's unit names, written out here
/// on their own).
fn ipmi_metric(unit: &str) -> &'static str {
    match unit {
        "degrees C" => "hw_temperature_celsius",
        "RPM" => "cooling_pump_speed_rpm",
        "Volts" => "hw_voltage_volts",
        "Watts" => "hw_power_watts",
        _ => "cooling_flow_L_per_min",
    }
}

fn ipmi_target(sim: &IpmiSim) -> String {
    let pw = support::temp_dir().join("ipmi-pw");
    std::fs::write(&pw, "monpass\n").expect("pw");
    format!(
        "\n[[sources.ipmi.targets]]\nname = \"sim\"\nhost = \"127.0.0.1\"\nport = {}\nusername = \"monitor\"\npassword_file = {:?}\nworkaround_flags = \"opensesspriv\"\ninterval_secs = 1\ntimeout_secs = 5\n",
        sim.server.port,
        pw.display().to_string()
    )
}

fn have_ipmi_tools() -> bool {
    ["ipmi_sim", "ipmitool", "ipmi-sensors", "sdrcomp"]
        .iter()
        // One guard call per tool, with the /usr/sbin path as its first choice (the guard
        // fails in CI, so a first call on PATH alone would never reach the fallback).
        .all(|t| support::require_tool(t, Some(PathBuf::from("/usr/sbin").join(t))).is_some())
}

#[test]
fn ipmi_sim_values_equal_ipmitool_and_a_live_change_shows_at_the_next_poll() {
    if !have_ipmi_tools() {
        return;
    }
    let emu = std::fs::read_to_string(fixtures().join("ipmi/sim2.emu")).expect("emu");
    let sim = IpmiSim::start(&emu);
    let port = support::free_port();
    let mut agent = Agent::spawn_config(
        "h100-training.toml",
        &config(&ipmi_target(&sim), false, port),
    );
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("junction_target_up{junction_source=\"ipmi\",junction_target=\"sim\"} 1")
    });
    let s = parse(&body);
    let reference = ipmitool(&sim);
    assert_eq!(reference.len(), 4, "{reference:?}");
    for (name, v, unit, _) in &reference {
        assert!(v.is_some(), "ipmitool reads {name}: {reference:?}");
        let metric = ipmi_metric(unit);
        let got = value(&s, metric, &[("hw_name", name), ("junction_target", "sim")]);
        assert_eq!(
            got, *v,
            "{name} ({unit}) as {metric}: junction {got:?}, ipmitool {v:?}"
        );
    }
    // Pushed over its critical threshold through the simulator's console (the oracle sees it
    // first: what follows is Junction's part).
    sim.console("sensor_set_value 0x20 0 1 95 1");
    assert_eq!(
        ipmitool(&sim)
            .iter()
            .find(|r| r.0 == "GPU1 Temp")
            .and_then(|r| r.1),
        Some(95.0),
        "the simulator took the change"
    );
    let body = agent.wait_for(Duration::from_secs(15), |m| {
        let s = parse(m);
        value(&s, "hw_temperature_celsius", &[("hw_name", "GPU1 Temp")]) == Some(95.0)
    });
    let s = parse(&body);
    // Its state as the conventions' hw.status of a temperature sensor: failed.
    assert_eq!(
        value(
            &s,
            "hw_status",
            &[
                ("hw_name", "GPU1 Temp"),
                ("hw_type", "temperature"),
                ("hw_state", "failed")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&s, "bmc_sensor_state", &[("hw_name", "GPU1 Temp")]),
        None
    );
}

#[test]
fn ipmi_thresholds_equal_ipmitool_and_a_leak_is_critical() {
    if !have_ipmi_tools() {
        return;
    }
    let emu = format!(
        "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02\nsel_enable 0x20 1000 0x0a\n{}\
         sensor_add 0x20 0 1 0x01 0x01\nsensor_set_value 0x20 0 1 55 0\nsensor_set_threshold 0x20 0 1 settable 111000 100 90 80 0 0 0\n\
         sensor_add 0x20 0 2 0x01 0x01\nsensor_set_value 0x20 0 2 30 0\n\
         sensor_add 0x20 0 3 0x04 0x01\nsensor_set_value 0x20 0 3 60 0\n\
         sensor_add 0x20 0 4 0x0b 0x01\nsensor_set_value 0x20 0 4 84 0\nsensor_set_threshold 0x20 0 4 settable 000011 0 0 0 0 80 120\n\
         sensor_add 0x20 0 5 0x0a 0x03\nsensor_set_bit 0x20 0 5 0 1 0\nmc_enable 0x20\n",
        bmc::sdr_lines(&fixtures().join("ipmi/cooling.sdrs"))
    );
    let sim = IpmiSim::start(&emu);
    let port = support::free_port();
    let mut agent = Agent::spawn_config(
        "h100-training.toml",
        &config(&ipmi_target(&sim), false, port),
    );
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("cooling_leak_detector_state")
    });
    let s = parse(&body);
    let mut compared = 0;
    for (name, _, unit, thresholds) in ipmitool(&sim) {
        for (t, v) in thresholds {
            compared += 1;
            // A temperature's thresholds as the conventions name them; the rest Junction's.
            let (metric, label, t) = if unit == "degrees C" {
                (
                    "hw_temperature_limit_celsius",
                    "hw_limit_type",
                    spec_limit(t),
                )
            } else {
                ("bmc_sensor_threshold", "bmc_threshold", t)
            };
            assert_eq!(
                value(&s, metric, &[("hw_name", &name), (label, t)]),
                Some(v),
                "{name} {t}"
            );
        }
    }
    // GPU1 Temp has three readable thresholds, the coolant flow two.
    assert_eq!(compared, 5, "thresholds compared with ipmitool");
    // The host's heating margin (the conventions' hw.host.heating_margin): the least, over
    // the temperatures ipmitool reads, of the upper caution (else critical) threshold less
    // the reading.
    let want = ipmitool(&sim)
        .into_iter()
        .filter(|(_, _, unit, _)| unit == "degrees C")
        .filter_map(|(_, v, _, th)| {
            let upper = |n: &str| th.iter().find(|(k, _)| *k == n).map(|(_, x)| *x);
            Some(upper("upper_caution").or_else(|| upper("upper_critical"))? - v?)
        })
        .reduce(f64::min)
        .expect("a temperature with an upper threshold");
    assert_eq!(
        value(&s, "hw_host_heating_margin_celsius", &[]),
        Some(want),
        "heating margin"
    );
    assert_eq!(
        value(
            &s,
            "bmc_sensor_threshold",
            &[
                ("hw_name", "Coolant Flow"),
                ("bmc_threshold", "lower_critical")
            ]
        ),
        Some(40.0)
    );
    assert_eq!(
        value(
            &s,
            "cooling_leak_detector_state",
            &[("hw_name", "Leak Manifold"), ("cooling_leak_state", "ok")]
        ),
        Some(1.0)
    );
    // The flow drops below its lower critical threshold; the manifold gets wet.
    sim.console("sensor_set_value 0x20 0 4 50 1");
    sim.console("sensor_set_bit 0x20 0 5 0 0 0");
    sim.console("sensor_set_bit 0x20 0 5 1 1 1");
    let body = agent.wait_for(Duration::from_secs(15), |m| {
        let s = parse(m);
        value(
            &s,
            "cooling_leak_detector_state",
            &[
                ("hw_name", "Leak Manifold"),
                ("cooling_leak_state", "critical"),
            ],
        ) == Some(1.0)
            && value(&s, "cooling_flow_L_per_min", &[("hw_name", "Coolant Flow")]) == Some(25.0)
    });
    assert_eq!(
        value(
            &parse(&body),
            "bmc_sensor_state",
            &[
                ("hw_name", "Coolant Flow"),
                ("bmc_sensor_state", "critical")
            ]
        ),
        Some(1.0)
    );
}

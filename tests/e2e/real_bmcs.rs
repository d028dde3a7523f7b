//! Redfish captures of real BMCs (`../shared/realworld/redfish/libredfish-*`: NVIDIA's
//! libredfish mockups, recorded from real machines with DMTF's Mockup-Creator) and DMTF's
//! public mockups (`dmtf-public-*`: both models side by side, legacy alone), each served
//! by `sushy-static`: one `junction once` per tree must export every non-null reading the
//! tree holds with its value and unit — the list is each tree's `expected-readings.tsv`,
//! made by walking the JSON independently of Junction — except what the README's Redfish
//! table leaves out on purpose (decided here from the tree, not from Junction's output); no
//! chassis may be blind, and the poll must end within its timeout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::bmc::{config, once};
use crate::support::{self, Series, bmc, parse};

/// The trees with a ServiceRoot (the `telegraf-*` ones hold a chassis alone).
const TREES: [&str; 13] = [
    "dmtf-public-bladed",
    "dmtf-public-catfish",
    "dmtf-public-rackmount1",
    "dmtf-public-smartnic",
    "dmtf-public-telemetry",
    "dmtf-public-tower",
    "libredfish-dell",
    "libredfish-hpe",
    "libredfish-lenovo",
    "libredfish-supermicro",
    "libredfish-nvidia-gb200",
    "libredfish-nvidia-gbswitch",
    "libredfish-nvidia-gh200",
];

fn realworld() -> PathBuf {
    support::root().join("../shared/realworld/redfish")
}

/// One row of `expected-readings.tsv`.
#[derive(Debug, Clone)]
struct Row {
    chassis: String,
    kind: String,
    name: String,
    reading: String,
    unit: String,
    reference: String,
}

fn rows(tree: &Path) -> Vec<Row> {
    let text =
        std::fs::read_to_string(tree.join("expected-readings.tsv")).expect("expected-readings.tsv");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let at = |i: usize| f.get(i).copied().unwrap_or("").to_string();
            Row {
                chassis: at(0),
                kind: at(1),
                name: at(2),
                reading: at(3),
                unit: at(4),
                reference: at(6),
            }
        })
        .collect()
}

/// The JSON document at a Redfish URI of the tree.
fn doc(tree: &Path, uri: &str) -> Option<Value> {
    let rel = uri.split('#').next()?.trim_start_matches('/');
    let text = std::fs::read_to_string(tree.join(rel).join("index.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// What kind of reading a row is, by its unit and what the tree says of it (the Redfish
/// specification's units, written out here on their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    Temperature,
    Fan,
    Power,
    Voltage,
    Other,
}

/// A power reading: one of the metrics a power reading goes to by what it stands for (the
/// host's total, one component's own draw, a supply's output, a copy or a sub-total); which
/// one is tested on trees whose structure says it (`bmc::` and `semconv::`).
const POWER: &str = "power";
/// An energy reading, as [`POWER`].
const ENERGY: &str = "energy";

/// Whether the series `name` is one `metric` (or its family) stands for.
fn is_metric(name: &str, metric: &str) -> bool {
    match metric {
        POWER => matches!(
            name,
            "hw_power_watts"
                | "hw_host_power_watts"
                | "bmc_power_watts"
                | "hw_power_supply_usage_watts"
        ),
        ENERGY => matches!(
            name,
            "hw_energy_joules_total" | "hw_host_energy_joules_total" | "bmc_energy_joules_total"
        ),
        m => name == m,
    }
}

/// The metric a row is exported as, the factor to the registry's unit, and its class.
fn expected(row: &Row, tree: &Path) -> (&'static str, f64, Class) {
    let context = doc(tree, &row.reference)
        .and_then(|d| d["PhysicalContext"].as_str().map(str::to_string))
        .unwrap_or_default();
    // A thermal margin by its name (an excerpt is known by the sensor it names).
    let sensor_name = doc(tree, &row.reference)
        .and_then(|d| d["Name"].as_str().map(str::to_string))
        .filter(|_| row.reference.starts_with("/redfish/"))
        .unwrap_or_else(|| row.name.clone());
    // Or by its thresholds: a T.Limit (degrees below a GPU's or CPU's limit) is published as
    // a temperature whose thresholds are all lower ones, at or below 0, one negative.
    let lower: Vec<f64> = doc(tree, &row.reference)
        .and_then(|d| d["Thresholds"].as_object().cloned())
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            k.starts_with("Lower")
                .then(|| v["Reading"].as_f64())
                .flatten()
        })
        .collect::<Option<Vec<f64>>>()
        .unwrap_or_default();
    let t_limit =
        !lower.is_empty() && lower.iter().all(|v| *v <= 0.0) && lower.iter().any(|v| *v < 0.0);
    let margin = t_limit
        || sensor_name
            .to_ascii_lowercase()
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|w| w == "dts" || w == "margin");
    let fan_kind = row.kind.starts_with("Thermal.Fans") || row.kind == "ThermalSubsystem.Fan";
    match (row.kind.as_str(), row.unit.as_str()) {
        ("EnvironmentMetrics.TemperatureCelsius", _) => {
            ("hw_temperature_celsius", 1.0, Class::Temperature)
        }
        ("EnvironmentMetrics.PowerWatts", _) => (POWER, 1.0, Class::Power),
        ("EnvironmentMetrics.EnergyJoules", _) => (ENERGY, 1.0, Class::Other),
        ("EnvironmentMetrics.EnergykWh", _) => (ENERGY, 3.6e6, Class::Other),
        (_, "Cel" | "C") if margin => ("bmc_sensor_reading", 1.0, Class::Other),
        (_, "Cel" | "C") => ("hw_temperature_celsius", 1.0, Class::Temperature),
        (_, "W" | "Watts") => (POWER, 1.0, Class::Power),
        (_, "V") => ("hw_voltage_volts", 1.0, Class::Voltage),
        (_, "J") => (ENERGY, 1.0, Class::Other),
        (_, "kW.h" | "kWh") => (ENERGY, 3.6e6, Class::Other),
        (_, "W.h" | "Wh") => (ENERGY, 3600.0, Class::Other),
        (_, "RPM") if context == "Pump" => ("cooling_pump_speed_rpm", 1.0, Class::Other),
        (_, "RPM") => ("hw_fan_speed_rpm", 1.0, Class::Fan),
        (_, "%" | "Percent" | "") if fan_kind || context == "Fan" => {
            ("hw_fan_speed_ratio", 0.01, Class::Fan)
        }
        (_, "%") if context == "Pump" => ("cooling_pump_speed_ratio", 0.01, Class::Other),
        _ => ("bmc_sensor_reading", 1.0, Class::Other),
    }
}

/// Rows of the newer model (Sensors, ThermalSubsystem, EnvironmentMetrics) as against the
/// legacy one (Thermal, Power).
fn legacy(row: &Row) -> bool {
    row.kind.starts_with("Thermal.") || row.kind.starts_with("Power.")
}

/// Why a row is left out on purpose (the README's Redfish table), if it is.
fn left_out(
    row: &Row,
    tree: &Path,
    newer: &BTreeMap<(String, Class), usize>,
) -> Option<&'static str> {
    if row.reading == "null" || row.reading == "{}" {
        return Some("no reading");
    }
    if row.kind.starts_with("Sensor:") && row.unit.is_empty() {
        return Some(
            "a sensor without ReadingUnits is discrete (a flag that reads 0), not a measurement",
        );
    }
    if row.kind == "ThermalMetrics.TemperatureSummaryCelsius" {
        return Some("a summary of temperatures the chassis' sensors report one by one");
    }
    if row.kind.starts_with("EnvironmentMetrics.PowerLimit") {
        return Some("a limit, not a reading");
    }
    if legacy(row) {
        let (_, _, class) = expected(row, tree);
        if newer.contains_key(&(row.chassis.clone(), class)) {
            return Some("the newer resources give this chassis readings of this kind");
        }
    }
    None
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1.0)
}

/// Every reading of one tree, checked; returns how many were checked and why the rest
/// were left out.
fn check(name: &str, tool: &Path) -> (usize, BTreeMap<&'static str, usize>) {
    let tree = realworld().join(name);
    let server = bmc::sushy_static(tool, &tree.join("redfish/v1"));
    let port = support::free_port();
    let target = format!(
        "\n[[sources.redfish.targets]]\nname = \"t\"\nurl = \"http://127.0.0.1:{}\"\ntimeout_secs = 30\n",
        server.port
    );
    let (ok, stdout, stderr) = once(&config(&target, false, port));
    assert!(ok, "{name}: one poll within its timeout\n{stderr}");
    let all = parse(&stdout);
    let series: Vec<&Series> = all
        .iter()
        .filter(|s| s.labels.get("junction_target").map(String::as_str) == Some("t"))
        .collect();
    let blind: Vec<&&Series> = series
        .iter()
        .filter(|s| {
            s.name == "junction_source_errors_total"
                && s.labels.get("junction_stage").map(String::as_str) == Some("chassis")
        })
        .collect();
    assert!(blind.is_empty(), "{name}: a blind chassis\n{stderr}");
    let rows = rows(&tree);
    // Which kinds the newer resources give each chassis with a value.
    let mut newer: BTreeMap<(String, Class), usize> = BTreeMap::new();
    for r in &rows {
        if legacy(r) || r.reading == "null" || (r.kind.starts_with("Sensor:") && r.unit.is_empty())
        {
            continue;
        }
        let (_, _, class) = expected(r, &tree);
        *newer.entry((r.chassis.clone(), class)).or_default() += 1;
    }
    // The sensors checked in their own right (an excerpt of one is reported as it).
    let sensor_refs: std::collections::HashSet<&str> = rows
        .iter()
        .filter(|r| r.kind.starts_with("Sensor:") && left_out(r, &tree, &newer).is_none())
        .map(|r| r.reference.as_str())
        .collect();
    let mut checked = 0;
    let mut skipped: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut missing = Vec::new();
    for r in &rows {
        if let Some(why) = left_out(r, &tree, &newer) {
            *skipped.entry(why).or_default() += 1;
            continue;
        }
        if r.kind == "LeakDetector" {
            let state = r.reading.to_ascii_lowercase();
            let found = series.iter().any(|s| {
                s.name == "cooling_leak_detector_state"
                    && s.labels.get("hw_name") == Some(&r.name)
                    && s.labels.get("cooling_leak_state") == Some(&state)
                    && s.value == 1.0
            });
            if !found {
                missing.push(format!("{r:?}"));
            }
            checked += 1;
            continue;
        }
        // An excerpt of a sensor the tree also holds is reported once, as that sensor.
        let excerpt = !r.kind.starts_with("Sensor:") && !legacy(r);
        if excerpt && sensor_refs.contains(r.reference.as_str()) {
            *skipped
                .entry("reported once, as the sensor it mirrors")
                .or_default() += 1;
            continue;
        }
        let Ok(v) = r.reading.trim_matches('"').parse::<f64>() else {
            panic!("{name}: a reading that is not a number: {r:?}");
        };
        let (metric, factor, _) = expected(r, &tree);
        let want = v * factor;
        let found = series.iter().any(|s| {
            is_metric(&s.name, metric)
                && close(s.value, want)
                && (excerpt || r.name.is_empty() || s.labels.get("hw_name") == Some(&r.name))
                && (metric != "bmc_sensor_reading"
                    || s.labels.get("bmc_sensor_unit").map(String::as_str)
                        == Some(if r.unit == "C" {
                            "Cel"
                        } else {
                            r.unit.as_str()
                        })
                    || r.unit == "C")
        });
        if !found {
            missing.push(format!("{metric} = {want}: {r:?}"));
        }
        checked += 1;
    }
    assert!(
        missing.is_empty(),
        "{name}: {} of {checked} readings not exported:\n{}",
        missing.len(),
        missing.join("\n")
    );
    (checked, skipped)
}

#[test]
fn every_reading_of_real_bmcs_is_exported_with_its_value_and_unit() {
    let Some(tool) = bmc::venv_tool("sushy-static") else {
        return;
    };
    let mut report = Vec::new();
    for name in TREES {
        let (checked, skipped) = check(name, &tool);
        assert!(checked > 0, "{name}: nothing checked");
        report.push(format!("{name}: {checked} checked; {skipped:?}"));
    }
    eprintln!("{}", report.join("\n"));
}

/// The GB200 capture's live leak alarm: a cold-plate detector in `Critical` is reported
/// critical (and a GPU health reason follows from it on a node with GPUs).
#[test]
fn the_gb200_cold_plate_leak_is_critical() {
    let Some(tool) = bmc::venv_tool("sushy-static") else {
        return;
    };
    let tree = realworld().join("libredfish-nvidia-gb200");
    let critical: Vec<Row> = rows(&tree)
        .into_iter()
        .filter(|r| r.kind == "LeakDetector" && r.reading == "Critical")
        .collect();
    assert!(
        !critical.is_empty(),
        "the capture holds a critical detector"
    );
    let server = bmc::sushy_static(&tool, &tree.join("redfish/v1"));
    let target = format!(
        "\n[[sources.redfish.targets]]\nname = \"gb200\"\nurl = \"http://127.0.0.1:{}\"\n",
        server.port
    );
    let (ok, stdout, stderr) = once(&config(&target, false, support::free_port()));
    assert!(ok, "{stderr}");
    let s = parse(&stdout);
    for r in &critical {
        assert_eq!(
            support::value(
                &s,
                "cooling_leak_detector_state",
                &[
                    ("hw_name", r.name.as_str()),
                    ("cooling_leak_state", "critical")
                ]
            ),
            Some(1.0),
            "{r:?}"
        );
    }
}

/// A chassis whose tree has temperatures and fans, none of them readable (every reading
/// null, as a BMC whose sensors are not yet populated sends them): the poll says so, in the
/// log and in `junction_source_errors_total{junction_stage="chassis"}`, naming the chassis
/// and the resources it tried; `junction inventory` shows it.
#[test]
fn a_blind_chassis_is_never_silent() {
    use serde_json::json;
    let bmc = crate::support::bmc::DynamicBmc::start(|path, _| {
        let r = "/redfish/v1";
        Some(match path.trim_start_matches(r) {
            "" => json!({"@odata.id": r, "Chassis": {"@odata.id": format!("{r}/Chassis")}}),
            "/Chassis" => json!({"Members": [{"@odata.id": format!("{r}/Chassis/Board")}]}),
            "/Chassis/Board" => json!({"Id": "Board", "Name": "Baseboard",
                "Sensors": {"@odata.id": format!("{r}/Chassis/Board/Sensors")},
                "Thermal": {"@odata.id": format!("{r}/Chassis/Board/Thermal")}}),
            "/Chassis/Board/Sensors" => json!({"Members": [
                {"@odata.id": format!("{r}/Chassis/Board/Sensors/Inlet")}]}),
            "/Chassis/Board/Sensors/Inlet" => json!({"Id": "Inlet", "Name": "Inlet",
                "ReadingType": "Temperature", "ReadingUnits": "Cel", "Reading": null,
                "Status": {"State": "Absent"}}),
            "/Chassis/Board/Thermal" => json!({
                "Temperatures": [{"@odata.id": format!("{r}/Chassis/Board/Thermal#/Temperatures/0"),
                    "Name": "CPU1 Temp", "ReadingCelsius": null}],
                "Fans": [{"@odata.id": format!("{r}/Chassis/Board/Thermal#/Fans/0"),
                    "Name": "FAN1", "Reading": null, "ReadingUnits": "RPM"}]}),
            _ => return None,
        })
    });
    let target = format!(
        "\n[[sources.redfish.targets]]\nname = \"blind\"\nurl = \"http://127.0.0.1:{}\"\n",
        bmc.port
    );
    let (ok, stdout, stderr) = once(&config(&target, false, support::free_port()));
    assert!(ok, "the poll itself succeeds: {stderr}");
    assert_eq!(
        support::value(
            &parse(&stdout),
            "junction_source_errors_total",
            &[
                ("junction_source", "redfish"),
                ("junction_stage", "chassis"),
                ("error_type", "blind"),
                ("junction_target", "blind"),
            ]
        ),
        Some(1.0),
        "{stdout}"
    );
    assert!(
        stderr.contains("chassis Baseboard") && stderr.contains("Sensors, Thermal"),
        "the log names the chassis and what was tried: {stderr}"
    );
    let dir = support::temp_dir();
    let path = dir.join("junction.toml");
    std::fs::write(&path, config(&target, false, support::free_port())).expect("config");
    let out = support::inventory(&path, None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("note: chassis Baseboard"),
        "inventory shows it:\n{text}"
    );
}

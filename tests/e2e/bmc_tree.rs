//! A Redfish tree written here, modelled on the mockups, with every quirk the source handles
//! and a GPU chassis the BMC shares with NVML, served by `sushy-static` and read end to end.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::bmc;
use crate::support::{self, Agent, parse, value};

use crate::bmc::{config, once, redfish_target};

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

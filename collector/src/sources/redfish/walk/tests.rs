//! The mapping, on documents directly.

use serde_json::json;

use super::map::{self, Chassis, Ids, Part};
use crate::model::bmc::{Level, Quantity};

const IDS: Ids<'static> = Ids("bmc1");

fn board() -> Chassis {
    Chassis {
        id: "bmc1:/Chassis/1".into(),
        gpu: false,
        host: true,
    }
}

#[test]
fn lenient_numbers() {
    assert_eq!(map::num(&json!(35)), Some(35.0));
    assert_eq!(map::num(&json!("35.000000")), Some(35.0));
    assert_eq!(map::num(&json!(" 2.5 ")), Some(2.5));
    assert_eq!(map::num(&json!("nan")), None);
    assert_eq!(map::num(&json!("NaN")), None);
    assert_eq!(map::num(&json!(null)), None);
    assert_eq!(map::num(&json!("n/a")), None);
    assert_eq!(map::num(&json!({"Reading": 1})), None);
}

#[test]
fn sensor_thresholds_scale_with_the_reading() {
    let t = json!({
        "UpperCritical": {"Reading": 1380, "Activation": "Increasing"},
        "UpperCaution": {"Reading": "1240"},
        "LowerFatal": {"Reading": null},
        "Bogus": {"Reading": 1}
    });
    assert_eq!(
        map::thresholds(Some(&t), 0.001),
        vec![("upper_caution", 1.24), ("upper_critical", 1.38)]
    );
    let legacy = json!({"UpperThresholdCritical": 128, "LowerThresholdNonCritical": 5});
    assert_eq!(
        map::legacy_thresholds(&legacy, 1.0),
        vec![("upper_critical", 128.0), ("lower_caution", 5.0)]
    );
}

#[test]
fn a_sensor_of_a_board_and_of_a_gpu() {
    let doc = json!({
        "Name": "Inlet", "Reading": "31.5", "ReadingUnits": "Cel",
        "PhysicalContext": "Intake",
        "Thresholds": {"UpperCritical": {"Reading": 30}}
    });
    let r =
        map::sensor(IDS, "/redfish/v1/Chassis/1/Sensors/Inlet", &doc, &board()).expect("a reading");
    assert_eq!(r.id, "bmc1:/Chassis/1/Sensors/Inlet");
    assert_eq!(r.hw_type, "temperature");
    assert_eq!(r.parent.as_deref(), Some("bmc1:/Chassis/1"));
    assert_eq!((r.quantity, r.value), (Quantity::Temperature, 31.5));
    assert_eq!(r.location.as_deref(), Some("intake"));
    assert_eq!(r.state, Some(Level::Critical));
    let gpu = Chassis {
        id: "GPU-1".into(),
        gpu: true,
        host: false,
    };
    // A sensor on one of this node's GPUs is its own component, on the GPU.
    let r = map::sensor(IDS, "/redfish/v1/Chassis/G/Sensors/T", &doc, &gpu).expect("a reading");
    assert_eq!(
        (r.id.as_str(), r.hw_type.as_str()),
        ("bmc1:/Chassis/G/Sensors/T", "temperature")
    );
    assert_eq!(r.parent.as_deref(), Some("GPU-1"));
    // No reading, no sensor.
    let absent = json!({"Name": "Battery", "ReadingType": "Temperature", "Reading": null});
    assert!(map::sensor(IDS, "/x", &absent, &board()).is_none());
}

#[test]
fn parts_read_their_own_properties() {
    let pump = json!({
        "Name": "Pump 1", "PumpSpeedPercent": {"Reading": 80, "SpeedRPM": 3100},
        "InletPressurekPa": {"Reading": 12.5, "DataSourceUri": "/redfish/v1/x#frag"}
    });
    let out = Part::Pump.map(IDS, "/redfish/v1/CDU/Pumps/1", &pump, "bmc1:/CDU");
    assert_eq!(out.components.len(), 1);
    assert_eq!(out.components[0].hw_type, "pump");
    assert_eq!(out.components[0].parent.as_deref(), Some("bmc1:/CDU"));
    let got: Vec<_> = out
        .excerpts
        .iter()
        .map(|(src, r)| (src.is_some(), r.quantity, r.value, r.point))
        .collect();
    assert_eq!(
        got,
        vec![
            (false, Quantity::PumpRatio, 0.8, None),
            (false, Quantity::PumpRpm, 3100.0, None),
            (false, Quantity::Pressure, 12.5, Some("inlet")),
        ]
    );
    let connector = json!({"FlowLitersPerMinute": 40, "HeatRemovedkW": {"Reading": 1.5},
        "ReturnTemperatureCelsius": {"Reading": null}});
    let out = Part::Connector.map(IDS, "/redfish/v1/C/1", &connector, "p");
    let got: Vec<_> = out
        .excerpts
        .iter()
        .map(|(_, r)| (r.quantity, r.value))
        .collect();
    assert_eq!(got, vec![(Quantity::Flow, 40.0), (Quantity::Heat, 1500.0)]);
}

#[test]
fn excerpts_name_the_sensor_they_mirror() {
    let env = json!({"TemperatureCelsius": {"Reading": 24, "DataSourceUri": "/redfish/v1/S/T#x"},
        "EnergykWh": {"Reading": 2}});
    let owner = map::Owner {
        id: "bmc1:/Chassis/1",
        hw_type: "enclosure",
        name: "Board",
        parent: None,
    };
    let out = map::environment(&env, owner);
    assert_eq!(out.excerpts[0].0.as_deref(), Some("/redfish/v1/S/T"));
    assert_eq!(out.excerpts[1].1.value, 7.2e6);
    let th = json!({"TemperatureReadingsCelsius": [
        {"DeviceName": "CPU", "Reading": 50, "DataSourceUri": "/redfish/v1/Chassis/1/Sensors/CPU"},
        {"Reading": null}
    ]});
    let out = map::thermal_metrics(IDS, "/redfish/v1/TM", &th, &board());
    assert_eq!(out.excerpts.len(), 1);
    assert_eq!(out.excerpts[0].1.id, "bmc1:/Chassis/1/Sensors/CPU");
}

#[test]
fn leak_states_and_report_owners() {
    let d = json!({"Name": "Cold plate", "DetectorState": "Critical"});
    let out = map::leak_detector(IDS, "/redfish/v1/L/1", &d, "bmc1:/Chassis/1");
    assert_eq!(out.readings[0].value, 2.0);
    let report = json!({"MetricValues": [
        {"MetricProperty": "/redfish/v1/Chassis/GPU_0/Sensors/GPU_0_Temp_0#/Reading", "MetricValue": "41"},
        {"MetricProperty": "/redfish/v1/Chassis/GPU_0/Sensors/Stale_Temp", "MetricValue": 1,
         "Oem": {"Nvidia": {"MetricValueStale": true}}}
    ]});
    let out = map::metric_report(IDS, &report, |c| {
        (c == "/redfish/v1/Chassis/GPU_0").then(|| Chassis {
            id: "GPU-0".into(),
            gpu: true,
            host: false,
        })
    });
    assert_eq!(out.excerpts.len(), 1);
    let (src, r) = &out.excerpts[0];
    assert_eq!(
        src.as_deref(),
        Some("/redfish/v1/Chassis/GPU_0/Sensors/GPU_0_Temp_0")
    );
    assert_eq!(
        (r.id.as_str(), r.parent.as_deref(), r.quantity, r.value),
        (
            "bmc1:/Chassis/GPU_0/Sensors/GPU_0_Temp_0",
            Some("GPU-0"),
            Quantity::Temperature,
            41.0
        )
    );
}

#[test]
fn legacy_thermal_fans_in_percent_or_rpm() {
    let th = json!({
        "Temperatures": [{"@odata.id": "/redfish/v1/Chassis/1/Thermal#/Temperatures/0",
            "Name": "CPU1", "ReadingCelsius": 45, "UpperThresholdCritical": 90}],
        "Fans": [{"@odata.id": "/redfish/v1/Chassis/1/Thermal#/Fans/0", "FanName": "FAN1",
            "Reading": 40, "ReadingUnits": "Percent"},
            {"Name": "FAN2", "Reading": 5200}]
    });
    let rs = map::legacy_thermal(IDS, &th, "bmc1:/Chassis/1");
    let got: Vec<_> = rs
        .iter()
        .map(|r| (r.name.as_str(), r.quantity, r.value))
        .collect();
    assert_eq!(
        got,
        vec![
            ("CPU1", Quantity::Temperature, 45.0),
            ("FAN1", Quantity::FanRatio, 0.4),
            ("FAN2", Quantity::FanRpm, 5200.0),
        ]
    );
    assert_eq!(rs[0].thresholds, vec![("upper_critical", 90.0)]);
}

#[test]
fn legacy_power_by_kind_and_margins_are_not_temperatures() {
    let pw = json!({
        "PowerControl": [{"@odata.id": "/redfish/v1/Chassis/1/Power#/PowerControl/0",
            "Name": "System Power Control", "PowerConsumedWatts": 614,
            "PowerLimit": {"LimitInWatts": 1205},
            "PowerMetrics": {"AverageConsumedWatts": 612, "MaxConsumedWatts": null}}],
        "PowerSupplies": [{"@odata.id": "/redfish/v1/Chassis/1/Power#/PowerSupplies/0",
            "Name": "PS1", "PowerInputWatts": "303", "LineInputVoltage": 240,
            "Status": {"Health": "Warning"}}],
        "Voltages": [{"@odata.id": "/redfish/v1/Chassis/1/Power#/Voltages/0",
            "Name": "CPU1 VCORE", "ReadingVolts": 1.8, "UpperThresholdCritical": 2.1},
            {"Name": "Absent rail", "ReadingVolts": null}]
    });
    let p = map::legacy_power(IDS, &pw, &board());
    let power: Vec<_> = p.power.iter().map(|r| (r.name.as_str(), r.value)).collect();
    assert_eq!(
        power,
        vec![
            ("System Power Control", 614.0),
            ("System Power Control (average)", 612.0),
            ("PS1 (input)", 303.0),
        ]
    );
    assert_eq!(p.power[0].thresholds, vec![("power_limit", 1205.0)]);
    let volts: Vec<_> = p
        .voltage
        .iter()
        .map(|r| (r.name.as_str(), r.value))
        .collect();
    assert_eq!(volts, vec![("PS1 (input)", 240.0), ("CPU1 VCORE", 1.8)]);
    assert_eq!(p.supplies[0].health, Some(Level::Warning));
    // What a chassis' readings give, by kind.
    let out = map::Out {
        readings: p.power,
        ..map::Out::default()
    };
    let k = out.kinds();
    assert!(k.power && !k.voltage && !k.temperature && !k.fan);
    // A DTS margin is not a temperature, wherever it is read.
    assert_eq!(map::temperature("CPU 1 DTS"), Quantity::Other);
    assert_eq!(map::temperature("GPU0 Thermal Margin"), Quantity::Other);
    assert_eq!(map::temperature("CPU1 Temp"), Quantity::Temperature);
    let th = json!({"Temperatures": [{"Name": "CPU 1 DTS", "ReadingCelsius": -51}]});
    assert_eq!(
        map::legacy_thermal(IDS, &th, "p")[0].quantity,
        Quantity::Other
    );
}

#[test]
fn a_supply_s_metrics_mirror_their_sensors() {
    let supply = json!({"Name": "Power Supply 1"});
    let metrics = json!({
        "InputPowerWatts": {"Reading": 937.4, "DataSourceUri": "/redfish/v1/Chassis/1U/Sensors/PS1InputPower"},
        "InputVoltage": {"Reading": 230.2}
    });
    let out = map::power_supply(
        IDS,
        "/redfish/v1/Chassis/1U/PowerSubsystem/PowerSupplies/Bay1",
        &supply,
        "bmc1:/Chassis/1U",
        Some(&metrics),
    );
    assert_eq!(out.components[0].hw_type, "power_supply");
    let got: Vec<_> = out
        .excerpts
        .iter()
        .map(|(src, r)| (src.as_deref(), r.quantity, r.value))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                Some("/redfish/v1/Chassis/1U/Sensors/PS1InputPower"),
                Quantity::Power,
                937.4
            ),
            (None, Quantity::Voltage, 230.2),
        ]
    );
}

//! Cooling resources: thermal-subsystem parts (fans, pumps, coolant connectors) and a cooling
//! unit's (filters, reservoirs), leak detectors and their groups, EnvironmentMetrics,
//! ThermalMetrics arrays, and the cooling unit itself.

use serde_json::Value;

use super::{Chassis, Ids, Origin, Out, Owner, Prop, array, at, prop, strip, text};
use crate::model::bmc::{self, Quantity, Reading};

/// The members of a `ThermalSubsystem` (and of a cooling unit) that are components with
/// readings of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// `Fan`: speed in percent and RPM.
    Fan,
    /// `Pump`: speed in percent and RPM, inlet pressure.
    Pump,
    /// `CoolantConnector`: flow, temperatures, pressures, heat, valve.
    Connector,
    /// `Filter`: pressure drop.
    Filter,
    /// `Reservoir`: fluid level, internal pressure.
    Reservoir,
}

const CONNECTOR: &[Prop] = &[
    prop("FlowLitersPerMinute", Quantity::Flow, 1.0),
    at(
        "SupplyTemperatureCelsius",
        Quantity::CoolantTemperature,
        "supply",
    ),
    at(
        "ReturnTemperatureCelsius",
        Quantity::CoolantTemperature,
        "return",
    ),
    at(
        "DeltaTemperatureCelsius",
        Quantity::CoolantTemperature,
        "delta",
    ),
    at("SupplyPressurekPa", Quantity::Pressure, "supply"),
    at("ReturnPressurekPa", Quantity::Pressure, "return"),
    at("DeltaPressurekPa", Quantity::Pressure, "delta"),
    prop("HeatRemovedkW", Quantity::Heat, 1000.0),
    prop("ValvePositionPercent", Quantity::Valve, 0.01),
];

const RESERVOIR: &[Prop] = &[
    prop("FluidLevelPercent", Quantity::Level, 0.01),
    at("InternalPressurekPa", Quantity::Pressure, "internal"),
];

impl Part {
    /// Its `hw.type`.
    pub fn hw_type(self) -> &'static str {
        match self {
            Part::Fan => "fan",
            Part::Pump => "pump",
            Part::Connector => "coolant_connector",
            Part::Filter => "filter",
            Part::Reservoir => "reservoir",
        }
    }

    /// The part at `url`, in `parent`.
    pub fn map(self, ids: Ids<'_>, url: &str, doc: &Value, parent: &str) -> Out {
        let mut out = Out::default();
        let hw_type = self.hw_type();
        let id = out.resource(ids, url, doc, hw_type, Some(parent));
        let name = text(doc, "Name").unwrap_or(url);
        let owner = Owner {
            id: &id,
            hw_type,
            name,
            parent: Some(parent),
        };
        let (speed, ratio, rpm) = match self {
            Part::Fan => ("SpeedPercent", Quantity::FanRatio, Quantity::FanRpm),
            Part::Pump => ("PumpSpeedPercent", Quantity::PumpRatio, Quantity::PumpRpm),
            Part::Connector => {
                out.props(doc, owner, CONNECTOR, Origin::Own);
                return out;
            }
            Part::Filter => {
                let p = at("DeltaLiquidPressurekPa", Quantity::Pressure, "delta");
                out.props(doc, owner, &[p], Origin::Own);
                return out;
            }
            Part::Reservoir => {
                out.props(doc, owner, RESERVOIR, Origin::Own);
                return out;
            }
        };
        let speed = doc.get(speed);
        out.value(speed, owner, ratio, 0.01, None, Origin::Own);
        if let Some(r) = speed.and_then(|s| s.get("SpeedRPM")) {
            out.value(Some(r), owner, rpm, 1.0, None, Origin::Own);
        }
        if self == Part::Pump {
            let p = at("InletPressurekPa", Quantity::Pressure, "inlet");
            out.props(doc, owner, &[p], Origin::Own);
        }
        out
    }
}

/// A `LeakDetector` resource in `parent`.
pub fn leak_detector(ids: Ids<'_>, url: &str, doc: &Value, parent: &str) -> Out {
    let mut out = Out::default();
    let id = out.resource(ids, url, doc, "leak_detector", Some(parent));
    if let Some(state) = text(doc, "DetectorState") {
        out.readings.push(leak_reading(
            &id,
            text(doc, "Name").unwrap_or(url),
            parent,
            state,
        ));
    }
    out
}

/// The `LeakDetectorGroups` of a `LeakDetection` resource in `parent`: excerpts of the
/// detectors they list.
pub fn leak_groups(ids: Ids<'_>, doc: &Value, parent: &str) -> Out {
    let mut out = Out::default();
    for group in array(doc, "LeakDetectorGroups") {
        let owner = Owner {
            id: parent,
            hw_type: "leak_detection",
            name: text(group, "GroupName").unwrap_or("leak detectors"),
            parent: None,
        };
        let humidity = prop("HumidityPercent", Quantity::Humidity, 0.01);
        out.props(group, owner, &[humidity], Origin::Mirror);
        for d in array(group, "Detectors") {
            let (Some(state), Some(name)) = (text(d, "DetectorState"), text(d, "DeviceName"))
            else {
                continue;
            };
            let source = text(d, "DataSourceUri").map(|s| strip(s).to_string());
            let id = source
                .as_deref()
                .map(|s| ids.of(s))
                .unwrap_or_else(|| format!("{parent}/{name}"));
            out.excerpts
                .push((source, leak_reading(&id, name, parent, state)));
        }
    }
    out
}

const ENVIRONMENT: &[Prop] = &[
    prop("TemperatureCelsius", Quantity::Temperature, 1.0),
    prop("HumidityPercent", Quantity::Humidity, 0.01),
    prop("PowerWatts", Quantity::Power, 1.0),
    prop("EnergyJoules", Quantity::Energy, 1.0),
    prop("EnergykWh", Quantity::Energy, 3.6e6),
];

/// An `EnvironmentMetrics` resource, as readings of `owner` (named after it: a chassis'
/// temperature is "its" temperature), with its `FanSpeedsPercent` as fan speeds named after
/// each fan.
pub fn environment(doc: &Value, owner: Owner<'_>) -> Out {
    let mut out = Out::default();
    out.props(doc, owner, ENVIRONMENT, Origin::Mirror);
    for f in array(doc, "FanSpeedsPercent") {
        let name = text(f, "DeviceName")
            .or_else(|| text(f, "DataSourceUri"))
            .unwrap_or("fan");
        let fan = Owner { name, ..owner };
        out.value(Some(f), fan, Quantity::FanRatio, 0.01, None, Origin::Mirror);
    }
    out
}

/// A `ThermalMetrics` resource (fetched from `url`) of `chassis`.
pub fn thermal_metrics(ids: Ids<'_>, url: &str, doc: &Value, chassis: &Chassis) -> Out {
    let mut out = Out::default();
    for e in array(doc, "TemperatureReadingsCelsius") {
        let name = text(e, "DeviceName")
            .or_else(|| e.get("DataSourceUri").and_then(Value::as_str))
            .unwrap_or("temperature");
        // Each reading is its sensor's (on a GPU's chassis too: hw.parent is then the GPU).
        let src = e
            .get("DataSourceUri")
            .and_then(Value::as_str)
            .unwrap_or(url);
        let rid = ids.of(strip(src));
        let owner = Owner {
            id: &rid,
            hw_type: "temperature",
            name,
            parent: Some(&chassis.id),
        };
        out.value(
            Some(e),
            owner,
            Quantity::Temperature,
            1.0,
            None,
            Origin::Mirror,
        );
    }
    out
}

/// A cooling unit's own level (`CoolantLevelPercent`).
pub fn cooling_unit(ids: Ids<'_>, url: &str, doc: &Value, hw_type: &str) -> Out {
    let mut out = Out::default();
    let kind = text(doc, "EquipmentType").map(bmc::snake);
    let id = out.resource(ids, url, doc, kind.as_deref().unwrap_or(hw_type), None);
    let owner = Owner {
        id: &id,
        hw_type,
        name: text(doc, "Name").unwrap_or(url),
        parent: None,
    };
    let level = prop("CoolantLevelPercent", Quantity::Level, 0.01);
    out.props(doc, owner, &[level], Origin::Own);
    out
}

fn leak_reading(id: &str, name: &str, parent: &str, state: &str) -> Reading {
    let idx = match state {
        "OK" => 0,
        "Warning" => 1,
        "Critical" => 2,
        "Absent" => 4,
        _ => 3,
    };
    Reading {
        id: id.to_string(),
        hw_type: "leak_detector".into(),
        name: name.to_string(),
        parent: Some(parent.to_string()),
        quantity: Quantity::Leak,
        value: f64::from(idx),
        unit: String::new(),
        location: None,
        point: None,
        thresholds: Vec::new(),
        state: None,
        scope: Default::default(),
    }
}

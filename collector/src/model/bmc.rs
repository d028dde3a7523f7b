//! What BMC sources (Redfish, IPMI) report, in one shape: components (chassis, cooling units,
//! loops, connectors, pumps, leak detectors, sensors) and readings normalised to the
//! registry's units, with thresholds and a state. Turned into samples here, so that both
//! sources export the same metrics the same way.

use super::{HealthState, Metric, Sample};

/// A component a BMC reports.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Component {
    /// `hw.id`: `{target}:{path}`, or the GPU UUID for a GPU the BMC identifies.
    pub id: String,
    /// `hw.type` (enclosure for a chassis, as the conventions name it; cooling_unit, cooling_loop, coolant_connector, pump, filter,
    /// reservoir, leak_detector, fan, gpu, bmc).
    pub hw_type: String,
    /// Its name.
    pub name: String,
    /// `hw.parent`.
    pub parent: Option<String>,
    /// Model.
    pub model: Option<String>,
    /// Serial number.
    pub serial: Option<String>,
    /// `Status.Health`.
    pub health: Option<Level>,
}

/// A state against thresholds, or a Redfish `Health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Within limits.
    Ok,
    /// Past a caution / non-critical threshold.
    Warning,
    /// Past a critical, fatal or non-recoverable threshold.
    Critical,
}

impl Level {
    /// Every level, for the state sets.
    pub const ALL: [Level; 3] = [Level::Ok, Level::Warning, Level::Critical];

    /// The attribute value.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warning => "warning",
            Level::Critical => "critical",
        }
    }

    /// From a Redfish `Health` (`OK`, `Warning`, `Critical`).
    pub fn from_health(h: &str) -> Option<Level> {
        match h {
            "OK" => Some(Level::Ok),
            "Warning" => Some(Level::Warning),
            "Critical" => Some(Level::Critical),
            _ => None,
        }
    }

    fn hw_state(self) -> HealthState {
        match self {
            Level::Ok => HealthState::Ok,
            Level::Warning => HealthState::Degraded,
            Level::Critical => HealthState::Failed,
        }
    }
}

/// Leak detector states (Redfish `DetectorState`).
pub const LEAK_STATES: [&str; 5] = ["ok", "warning", "critical", "unavailable", "absent"];

/// What a reading measures, in the registry's unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    /// Cel.
    Temperature,
    /// Cel, at a coolant connector (`point` = supply, return, delta).
    CoolantTemperature,
    /// W.
    Power,
    /// J (a counter).
    Energy,
    /// V.
    Voltage,
    /// rpm.
    FanRpm,
    /// 0–1.
    FanRatio,
    /// rpm.
    PumpRpm,
    /// 0–1.
    PumpRatio,
    /// L/min.
    Flow,
    /// kPa.
    Pressure,
    /// W.
    Heat,
    /// 0–1.
    Humidity,
    /// 0–1.
    Level,
    /// 0–1.
    Valve,
    /// A leak detector: the value is an index into [`LEAK_STATES`].
    Leak,
    /// Anything else, in `unit`.
    Other,
}

impl Quantity {
    /// The `hw.type` of a sensor measuring this.
    pub fn sensor_type(self) -> &'static str {
        match self {
            Quantity::Temperature | Quantity::CoolantTemperature => "temperature",
            Quantity::Power => "power",
            Quantity::Energy => "energy",
            Quantity::Voltage => "voltage",
            Quantity::FanRpm | Quantity::FanRatio => "fan",
            Quantity::PumpRpm | Quantity::PumpRatio => "pump",
            Quantity::Flow => "flow",
            Quantity::Pressure => "pressure",
            Quantity::Heat => "heat",
            Quantity::Humidity => "humidity",
            Quantity::Level => "level",
            Quantity::Valve => "valve",
            Quantity::Leak => "leak_detector",
            Quantity::Other => "sensor",
        }
    }

    fn metric(self) -> Metric {
        match self {
            Quantity::Temperature => Metric::Temperature,
            Quantity::CoolantTemperature => Metric::CoolantTemperature,
            Quantity::Power => Metric::Power,
            Quantity::Energy => Metric::Energy,
            Quantity::Voltage => Metric::Voltage,
            Quantity::FanRpm => Metric::FanRpm,
            Quantity::FanRatio => Metric::FanSpeed,
            Quantity::PumpRpm => Metric::PumpSpeed,
            Quantity::PumpRatio => Metric::PumpSpeedRatio,
            Quantity::Flow => Metric::CoolantFlow,
            Quantity::Pressure => Metric::CoolantPressure,
            Quantity::Heat => Metric::HeatRemoved,
            Quantity::Humidity => Metric::Humidity,
            Quantity::Level => Metric::CoolantLevel,
            Quantity::Valve => Metric::ValvePosition,
            Quantity::Leak => Metric::LeakState,
            Quantity::Other => Metric::SensorReading,
        }
    }
}

/// One reading.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Reading {
    /// `hw.id` of what it is about: the sensor's component, or the GPU's UUID.
    pub id: String,
    /// `hw.type`.
    pub hw_type: String,
    /// The sensor's (or property's) name.
    pub name: String,
    /// `hw.parent`.
    pub parent: Option<String>,
    /// What it measures.
    #[serde(skip)]
    pub quantity: Quantity,
    /// The value in the registry's unit.
    pub value: f64,
    /// The unit as the BMC gave it.
    pub unit: String,
    /// `hw.sensor_location` (the physical context, snake case).
    pub location: Option<String>,
    /// `cooling.coolant.point`: supply, return, delta, inlet.
    pub point: Option<&'static str>,
    /// Thresholds (`upper_critical`, …) in the registry's unit.
    pub thresholds: Vec<(&'static str, f64)>,
    /// The state against the thresholds (or the sensor's health when it has none).
    pub state: Option<Level>,
    /// For power and energy: what the reading stands for.
    pub scope: Scope,
}

/// What a power or energy reading stands for, which decides its metric, so that a sum over
/// `hw.power` / `hw.energy` counts each component once (the conventions' host metrics: "the
/// overall energy usage of a host MUST be reported using hw.host.energy and hw.host.power
/// only … to prevent summing up overlapping values").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Decided by what it is about: one component's own draw (`hw.power{hw.type}` where its
    /// physical context or owner names a component type of the conventions that holds no
    /// other: cpu, memory, fan, disk, network, battery), the BMC's copy of a GPU's (NVML
    /// reports the GPU: `bmc.power{hw.type=gpu}`), a supply's input (everything the host
    /// draws: `bmc.power{hw.type=power_supply}`), or anything else (`bmc.power`).
    #[default]
    Auto,
    /// The whole host (the host chassis' EnvironmentMetrics or PowerControl, an IPMI
    /// system-power sensor): `hw.host.power` / `hw.host.energy`.
    Host,
    /// A power supply's output: `hw.power_supply.usage`.
    SupplyOutput,
    /// A sub-total or an interval statistic (a non-host chassis' total, PowerControl's
    /// average, minimum, maximum): `bmc.power` / `bmc.energy`.
    Aside,
}

/// The component type (as the conventions' `hw.type` names it) whose own draw a power
/// reading is, from its physical context (snake case) or its owner's type; `None` where
/// neither names one.
pub fn consumer_type(location: Option<&str>, owner_type: &str) -> Option<&'static str> {
    let of = |s: &str| -> Option<&'static str> {
        Some(match s {
            "cpu" => "cpu",
            "memory" => "memory",
            "power_supply" => "power_supply",
            "fan" => "fan",
            "gpu" => "gpu",
            "storage_device" | "physical_disk" => "physical_disk",
            "networking_device" | "network" => "network",
            "battery" => "battery",
            _ => return None,
        })
    };
    location.and_then(of).or_else(|| of(owner_type))
}

/// The conventions' `hw.limit_type` of a threshold (`upper_critical` → `high.critical`);
/// fatal (non-recoverable) and user-set thresholds, which the conventions do not name, keep
/// a value of their own in the same shape (`high.fatal`, `high.degraded.user`).
pub fn limit_type(threshold: &str) -> &'static str {
    match threshold {
        "upper_caution" => "high.degraded",
        "upper_critical" => "high.critical",
        "upper_fatal" => "high.fatal",
        "lower_caution" => "low.degraded",
        "lower_critical" => "low.critical",
        "lower_fatal" => "low.fatal",
        "upper_caution_user" => "high.degraded.user",
        "upper_critical_user" => "high.critical.user",
        "lower_caution_user" => "low.degraded.user",
        "lower_critical_user" => "low.critical.user",
        _ => "other",
    }
}

impl Reading {
    /// The state the thresholds give, else `health`.
    pub fn level(
        value: f64,
        thresholds: &[(&'static str, f64)],
        health: Option<Level>,
    ) -> Option<Level> {
        if thresholds.is_empty() {
            return health;
        }
        let mut level = Level::Ok;
        for (name, t) in thresholds {
            let upper = name.starts_with("upper");
            let past = if upper { value >= *t } else { value <= *t };
            if !past {
                continue;
            }
            let l = if name.contains("caution") {
                Level::Warning
            } else {
                Level::Critical
            };
            level = level.max(l);
        }
        Some(level)
    }
}

/// The `ReadingType` a unit implies (`None`: a unit that says nothing of the kind).
fn type_of_unit(units: &str) -> Option<&'static str> {
    Some(match units {
        "Cel" | "C" | "degrees C" => "Temperature",
        "W" | "Watts" => "Power",
        "J" => "EnergyJoules",
        "Wh" => "EnergyWh",
        "kWh" => "EnergykWh",
        "V" | "Volts" => "Voltage",
        "A" | "Amps" => "Current",
        "L/min" | "L per minute" => "LiquidFlowLPM",
        "L/s" => "LiquidFlow",
        "kPa" => "PressurekPa",
        "Pa" => "PressurePa",
        "kW" => "Heat",
        "RPM" | "{rev}/min" => "Rotational",
        "%" | "Percent" => "Percent",
        "cm" => "LiquidLevel",
        _ => return None,
    })
}

/// Normalises a reading: the quantity, the factor to the registry's unit. `reading_type` is
/// Redfish's `ReadingType`, `units` its `ReadingUnits`, `context` the physical context (tells
/// fans from pumps for speeds and percentages). As real BMCs need:
/// - no units: a discrete sensor (Lenovo's presence and failure flags, typed `Power` or
///   `Temperature`, read 0), not a measurement: none;
/// - units that name another kind than `ReadingType` (Lenovo: `Current` in `Watts`,
///   `AirFlow` in `RPM`): the units say what the number is, and win;
/// - no `ReadingType`: the units decide; units Junction does not know: `Other`, in them.
pub fn normalise(
    reading_type: Option<&str>,
    units: Option<&str>,
    context: Option<&str>,
) -> Option<(Quantity, f64)> {
    let units = units.unwrap_or("").trim();
    if units.is_empty() {
        return None;
    }
    let ty = match (reading_type, type_of_unit(units)) {
        // Altitude is read as barometric pressure (Pa, DSP0268): air, not coolant.
        (Some("Altitude"), _) => "Altitude",
        (_, Some(by_unit)) => by_unit,
        (Some(t), None) => t,
        (None, None) => "Other",
    };
    let ctx = context.unwrap_or("");
    let pump = ctx == "Pump";
    Some(match ty {
        "Temperature" => (Quantity::Temperature, 1.0),
        "Humidity" => (Quantity::Humidity, 0.01),
        "Power" => (Quantity::Power, 1.0),
        "EnergyJoules" => (Quantity::Energy, 1.0),
        "EnergyWh" => (Quantity::Energy, 3600.0),
        "EnergykWh" => (Quantity::Energy, 3.6e6),
        "Voltage" => (Quantity::Voltage, 1.0),
        "LiquidFlowLPM" => (Quantity::Flow, 1.0),
        "LiquidFlow" => (Quantity::Flow, 60.0),
        "PressurekPa" => (Quantity::Pressure, 1.0),
        "PressurePa" | "Pressure" => (Quantity::Pressure, 0.001),
        "Heat" => (Quantity::Heat, 1000.0),
        "Rotational" if pump => (Quantity::PumpRpm, 1.0),
        "Rotational" => (Quantity::FanRpm, 1.0),
        "Percent" if pump => (Quantity::PumpRatio, 0.01),
        "Percent" if ctx == "Fan" => (Quantity::FanRatio, 0.01),
        // A percentage that is a humidity by its type.
        "Percent" if reading_type == Some("Humidity") => (Quantity::Humidity, 0.01),
        "Percent" if reading_type == Some("Valve") => (Quantity::Valve, 0.01),
        "Valve" => (Quantity::Valve, 0.01),
        _ => (Quantity::Other, 1.0),
    })
}

/// `value` in the registry's unit: multiplied by `factor`, or divided by its inverse where
/// that is exact (percent to ratio: 70 / 100 is 0.7, 70 × 0.01 is not).
pub fn scale(value: f64, factor: f64) -> f64 {
    if factor < 1.0 && factor > 0.0 {
        value / (1.0 / factor).round()
    } else {
        value * factor
    }
}

/// Redfish threshold names as attribute values.
pub fn threshold_name(key: &str) -> Option<&'static str> {
    Some(match key {
        "UpperCaution" => "upper_caution",
        "UpperCautionUser" => "upper_caution_user",
        "UpperCritical" => "upper_critical",
        "UpperCriticalUser" => "upper_critical_user",
        "UpperFatal" => "upper_fatal",
        "LowerCaution" => "lower_caution",
        "LowerCautionUser" => "lower_caution_user",
        "LowerCritical" => "lower_critical",
        "LowerCriticalUser" => "lower_critical_user",
        "LowerFatal" => "lower_fatal",
        _ => return None,
    })
}

/// Snake case of a Redfish enum value (`LiquidInlet` → `liquid_inlet`).
pub fn snake(s: &str) -> String {
    let c: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len() + 4);
    for i in 0..c.len() {
        if c[i].is_ascii_uppercase() && i > 0 {
            let prev_lower = c[i - 1].is_ascii_lowercase() || c[i - 1].is_ascii_digit();
            let acronym_end = c[i - 1].is_ascii_uppercase()
                && c.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            if prev_lower || acronym_end {
                out.push('_');
            }
        }
        out.push(c[i].to_ascii_lowercase());
    }
    out
}

/// Everything one poll of one target produced.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Poll {
    /// The target's name (`junction.target`).
    pub target: String,
    /// Components.
    pub components: Vec<Component>,
    /// Readings.
    pub readings: Vec<Reading>,
    /// What the poll found odd and an operator should know (a chassis with temperatures or
    /// fans in its tree and none readable), one sentence each.
    pub notes: Vec<String>,
    /// The `hw.id` of the host the target's sensors are inside, where the target is a host's
    /// BMC (an IPMI BMC; a Redfish service with a host chassis), not a CDU's.
    pub host: Option<String>,
}

mod samples;
pub use samples::is_thermal_margin;

#[cfg(test)]
mod tests;

/// Which targets of a BMC source answered their last poll: the source is up while any does.
#[derive(Clone)]
pub struct TargetsUp {
    source: &'static str,
    up: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, bool>>>,
}

impl TargetsUp {
    /// For the source `source` (`junction.source`).
    pub fn new(source: &'static str) -> Self {
        Self {
            source,
            up: Default::default(),
        }
    }

    /// Records how `target`'s last poll went.
    pub fn set(&self, model: &super::Model, target: &str, ok: bool) {
        let mut m = super::lock(&self.up);
        m.insert(target.to_string(), ok);
        model.set_source_up(self.source, m.values().any(|v| *v));
    }

    /// A target that cannot be polled at all (its credentials or device missing): down, with
    /// `junction.target.up` 0.
    pub fn unusable(&self, model: &super::Model, target: &str) {
        self.set(model, target, false);
        model.publish(
            self.source,
            format!("{target}:stats"),
            vec![
                Sample::new(Metric::TargetUp, 0.0)
                    .with("junction.source", self.source)
                    .with("junction.target", target.to_string()),
            ],
        );
    }
}

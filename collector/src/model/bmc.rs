//! What BMC sources (Redfish, IPMI) report, in one shape: components (chassis, cooling units,
//! loops, connectors, pumps, leak detectors, sensors) and readings normalised to the
//! registry's units, with thresholds and a state. Turned into samples here, so that both
//! sources export the same metrics the same way.

use super::{AttrValue, HealthState, Metric, Sample};

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
}

impl Poll {
    /// The samples both sinks export.
    pub fn samples(&self) -> Vec<Sample> {
        let target: AttrValue = self.target.clone().into();
        let base = |id: &str, hw_type: &str, name: &str, parent: &Option<String>| {
            let mut attrs: Vec<(&'static str, AttrValue)> = vec![
                ("hw.id", id.to_string().into()),
                ("hw.type", hw_type.to_string().into()),
                ("hw.name", name.to_string().into()),
            ];
            if let Some(p) = parent {
                attrs.push(("hw.parent", p.clone().into()));
            }
            attrs.push(("junction.target", target.clone()));
            attrs
        };
        let mut out = Vec::new();
        for c in &self.components {
            let attrs = base(&c.id, &c.hw_type, &c.name, &c.parent);
            let mut info = Sample::new(Metric::ComponentInfo, 1.0);
            info.attrs = attrs.clone();
            info = info
                .with("hw.model", c.model.clone().unwrap_or_default())
                .with("hw.serial_number", c.serial.clone().unwrap_or_default());
            out.push(info);
            if let Some(h) = c.health {
                for s in [HealthState::Ok, HealthState::Degraded, HealthState::Failed] {
                    let mut st =
                        Sample::new(Metric::Status, f64::from(u8::from(h.hw_state() == s)));
                    st.attrs = attrs.clone();
                    out.push(st.with("hw.state", s.as_str()));
                }
            }
        }
        for r in &self.readings {
            let attrs = base(&r.id, &r.hw_type, &r.name, &r.parent);
            let metric = r.quantity.metric();
            if r.quantity == Quantity::Leak {
                for (i, state) in LEAK_STATES.iter().enumerate() {
                    let mut s = Sample::new(metric, f64::from(u8::from(r.value as usize == i)));
                    s.attrs = attrs.clone();
                    out.push(s.with("cooling.leak.state", *state));
                }
                continue;
            }
            let mut s = Sample::new(metric, r.value);
            s.attrs = attrs.clone();
            // A discrete sensor has a state and no reading.
            let has_value = !r.value.is_nan();
            if let Some(l) = &r.location {
                s = s.with("hw.sensor_location", l.clone());
            }
            if let Some(p) = r.point {
                s = s.with("cooling.coolant.point", p);
            }
            if r.quantity == Quantity::Other {
                s = s.with("bmc.sensor.unit", r.unit.clone());
            }
            if has_value {
                out.push(s);
            }
            let unit = registry_unit(r);
            for (name, v) in &r.thresholds {
                let mut t = Sample::new(Metric::SensorThreshold, *v);
                t.attrs = attrs.clone();
                out.push(
                    t.with("bmc.threshold", *name)
                        .with("bmc.sensor.unit", unit.clone()),
                );
            }
            if let Some(level) = r.state {
                for l in Level::ALL {
                    let mut st = Sample::new(Metric::SensorState, f64::from(u8::from(l == level)));
                    st.attrs = attrs.clone();
                    out.push(st.with("bmc.sensor.state", l.as_str()));
                }
            }
        }
        out
    }
}

/// The unit a reading's value (and thresholds) are in after normalising.
fn registry_unit(r: &Reading) -> String {
    match r.quantity {
        Quantity::Other => r.unit.clone(),
        q => q.metric().desc().unit.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_types() {
        assert_eq!(
            normalise(Some("Heat"), Some("kW"), None),
            Some((Quantity::Heat, 1000.0))
        );
        assert_eq!(
            normalise(None, Some("Cel"), None),
            Some((Quantity::Temperature, 1.0))
        );
        assert_eq!(
            normalise(Some("Rotational"), Some("RPM"), Some("Pump")),
            Some((Quantity::PumpRpm, 1.0))
        );
        assert_eq!(
            normalise(Some("PressurePa"), Some("Pa"), None),
            Some((Quantity::Pressure, 0.001))
        );
        assert_eq!(
            normalise(Some("LiquidFlow"), Some("L/s"), None),
            Some((Quantity::Flow, 60.0))
        );
        assert_eq!(normalise(None, None, None), None);
        assert_eq!(
            normalise(None, Some("furlongs"), None),
            Some((Quantity::Other, 1.0))
        );
        // What real BMCs send: discrete flags without units, units that contradict the type.
        assert_eq!(normalise(Some("Power"), Some(""), None), None);
        assert_eq!(
            normalise(Some("Current"), Some("Watts"), None),
            Some((Quantity::Power, 1.0))
        );
        assert_eq!(
            normalise(Some("AirFlow"), Some("RPM"), Some("Fan")),
            Some((Quantity::FanRpm, 1.0))
        );
        assert_eq!(
            normalise(Some("AirFlow"), Some("CFM"), None),
            Some((Quantity::Other, 1.0))
        );
        assert_eq!(
            normalise(Some("Altitude"), Some("Pa"), None),
            Some((Quantity::Other, 1.0))
        );
        assert_eq!(
            normalise(Some("Temperature"), Some("C"), None),
            Some((Quantity::Temperature, 1.0))
        );
    }

    #[test]
    fn levels_from_thresholds_or_health() {
        let t = [
            ("upper_caution", 80.0),
            ("upper_critical", 90.0),
            ("lower_critical", 5.0),
        ];
        assert_eq!(Reading::level(50.0, &t, None), Some(Level::Ok));
        assert_eq!(Reading::level(85.0, &t, None), Some(Level::Warning));
        assert_eq!(
            Reading::level(95.0, &t, Some(Level::Ok)),
            Some(Level::Critical)
        );
        assert_eq!(Reading::level(1.0, &t, None), Some(Level::Critical));
        assert_eq!(
            Reading::level(1.0, &[], Some(Level::Warning)),
            Some(Level::Warning)
        );
        assert_eq!(Reading::level(1.0, &[], None), None);
    }

    #[test]
    fn snake_case() {
        assert_eq!(snake("LiquidInlet"), "liquid_inlet");
        assert_eq!(snake("GPU"), "gpu");
        assert_eq!(snake("GPUSubsystem"), "gpu_subsystem");
        assert_eq!(snake("Intake"), "intake");
    }
}

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

//! What BMC sources (Redfish, IPMI) report, in one shape: components (chassis, cooling units,
//! loops, connectors, pumps, leak detectors, sensors) and readings normalised to the
//! registry's units, with thresholds and a state. Turned into samples here, so that both
//! sources export the same metrics the same way.

use super::{AttrValue, Attrs, HealthState, Metric, Sample};

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

impl Poll {
    /// The samples both sinks export. Each component and sensor is one `hw.id` with at most
    /// one `hw.status` state set; a GPU the BMC shares with NVML keeps Junction's verdict as
    /// its only `hw.status` (the BMC's view is `bmc.component.health`); temperatures,
    /// voltages and fan speeds carry their state and thresholds as the conventions do
    /// (`hw.status{hw.type}`, `hw.*.limit{hw.limit_type}`), other quantities as
    /// `bmc.sensor.state` / `bmc.sensor.threshold`; power and energy go where their
    /// [`Scope`] says.
    pub fn samples(&self) -> Vec<Sample> {
        let target: AttrValue = self.target.clone().into();
        let base = |id: &str, hw_type: &str, name: &str, parent: &Option<String>| {
            let mut attrs: Attrs = smallvec::smallvec![
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
        let gpus: std::collections::HashSet<&str> = self
            .components
            .iter()
            .filter(|c| c.hw_type == "gpu")
            .map(|c| c.id.as_str())
            .collect();
        let mut with_status = std::collections::HashSet::new();
        let mut out = Vec::new();
        for c in &self.components {
            let attrs = base(&c.id, &c.hw_type, &c.name, &c.parent);
            let mut info = Sample::new(Metric::ComponentInfo, 1.0);
            info.attrs = attrs.clone();
            info = info
                .with("hw.model", c.model.clone().unwrap_or_default())
                .with("hw.serial_number", c.serial.clone().unwrap_or_default());
            out.push(info);
            let Some(h) = c.health else { continue };
            if c.hw_type == "gpu" {
                for l in Level::ALL {
                    let mut st = Sample::new(Metric::ComponentHealth, f64::from(u8::from(h == l)));
                    st.attrs = attrs.clone();
                    out.push(st.with("bmc.health", l.as_str()));
                }
            } else {
                with_status.insert(c.id.as_str());
                push_status(&mut out, &attrs, h);
            }
        }
        for r in &self.readings {
            let mut hw_type = r.hw_type.as_str();
            // A T.Limit is a reading in Cel of its own, as a DTS margin is.
            let margin = is_thermal_margin(r);
            if margin {
                hw_type = Quantity::Other.sensor_type();
            }
            let metric = match r.quantity {
                _ if margin => Metric::SensorReading,
                Quantity::Power | Quantity::Energy => {
                    let energy = r.quantity == Quantity::Energy;
                    let about_gpu = r.parent.as_deref().is_some_and(|p| gpus.contains(p))
                        || gpus.contains(r.id.as_str());
                    let (m, t) = power_metric(r, energy, about_gpu);
                    if let Some(t) = t {
                        hw_type = t;
                    }
                    m
                }
                q => q.metric(),
            };
            let attrs = base(&r.id, hw_type, &r.name, &r.parent);
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
            } else if margin {
                s = s.with("bmc.sensor.unit", registry_unit(r));
            }
            if has_value {
                out.push(s);
            }
            // The conventions' families: a state set of the sensor and its limits.
            let limit = match r.quantity {
                _ if margin => None,
                Quantity::Temperature => Some((Metric::TemperatureLimit, "temperature")),
                Quantity::Voltage => Some((Metric::VoltageLimit, "voltage")),
                Quantity::FanRpm => Some((Metric::FanRpmLimit, "fan")),
                _ => None,
            };
            if let Some((limit, kind)) = limit {
                let mut attrs = base(&r.id, kind, &r.name, &r.parent);
                if let Some(l) = &r.location {
                    attrs.push(("hw.sensor_location", l.clone().into()));
                }
                for (name, v) in &r.thresholds {
                    let mut t = Sample::new(limit, *v);
                    t.attrs = attrs.clone();
                    out.push(t.with("hw.limit_type", limit_type(name)));
                }
                if let Some(level) = r.state
                    && with_status.insert(r.id.as_str())
                {
                    push_status(&mut out, &attrs, level);
                }
                continue;
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
        if let Some(host) = &self.host {
            out.extend(host_temperatures(host, &self.readings, &target));
        }
        out
    }
}

/// A temperature sensor that reads a thermal margin, not a temperature: NVIDIA's HGX BMCs
/// publish each GPU's (and a GB200's Grace CPU's: 0, -4, -5) T.Limit (degrees below its maximum operating temperature, the scale of
/// NVML's T.Limit values) as a `Temperature` sensor in `Cel` whose thresholds are all lower
/// ones at or below 0, one of them negative (Sensor `HGX_GPU_SXM_n_TEMP_1`: caution 0,
/// critical -2, fatal -8; a DGX's legacy Thermal `TLIMIT_GB_SXMn`: 0, -3, -5). No temperature
/// sensor alarms at -2 °C.
pub fn is_thermal_margin(r: &Reading) -> bool {
    r.quantity == Quantity::Temperature
        && !r.thresholds.is_empty()
        && r.thresholds
            .iter()
            .all(|(n, v)| n.starts_with("lower") && *v <= 0.0)
        && r.thresholds.iter().any(|(_, v)| *v < 0.0)
}

/// The warmest of some readings.
fn warmest<'a>(rs: impl Iterator<Item = &'a Reading>) -> Option<&'a Reading> {
    rs.max_by(|a, b| a.value.total_cmp(&b.value))
}

/// Air-intake sensors at most, by physical context, for that context to say where a sensor
/// is: a BMC that calls more of them intake (a DGX's AMI BMC puts all 120 of its legacy
/// temperatures, retimers and voltage regulators included, at `Intake`) is taken at its
/// sensors' names instead.
const MAX_INTAKE_SENSORS: usize = 8;

/// The conventions' host temperatures, from a host BMC's sensors: `hw.host.ambient_temperature`
/// (the warmest air intake: what the host breathes) and `hw.host.heating_margin` (how many
/// degrees any internal sensor has before its warning threshold: the least over the
/// temperatures with an upper caution threshold, or a critical one where there is none).
/// Thermal-margin sensors are neither.
fn host_temperatures(host: &str, readings: &[Reading], target: &AttrValue) -> Vec<Sample> {
    let temps = || {
        readings.iter().filter(|r| {
            r.quantity == Quantity::Temperature && r.value.is_finite() && !is_thermal_margin(r)
        })
    };
    let sample = |m: Metric, v: f64, name: &str| {
        Sample::new(m, v)
            .with("hw.id", host.to_string())
            .with("hw.name", name.to_string())
            .with("junction.target", target.clone())
    };
    let mut out = Vec::new();
    let by_context =
        || temps().filter(|r| matches!(r.location.as_deref(), Some("intake" | "room" | "ambient")));
    let named = |words: &'static [&'static str]| {
        temps().filter(move |r| {
            let n = r.name.to_ascii_lowercase();
            words.iter().any(|w| n.contains(w))
        })
    };
    let air = if by_context().count() <= MAX_INTAKE_SENSORS {
        warmest(by_context())
    } else {
        // Names: an ambient sensor first (the room's air), else the inlets.
        warmest(named(&["ambient"])).or_else(|| warmest(named(&["inlet", "intake"])))
    };
    if let Some(r) = air {
        out.push(sample(Metric::HostAmbient, r.value, &r.name));
    }
    let margin = |r: &Reading| {
        let upper = |kind: &str| {
            r.thresholds
                .iter()
                .filter(|(n, _)| *n == kind)
                .map(|(_, v)| *v)
                .reduce(f64::min)
        };
        upper("upper_caution")
            .or_else(|| upper("upper_critical"))
            .map(|t| t - r.value)
    };
    if let Some((r, m)) = temps()
        .filter_map(|r| margin(r).map(|m| (r, m)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
    {
        out.push(sample(Metric::HostHeatingMargin, m, &r.name));
    }
    out
}

/// `hw.status` of a BMC component or sensor: 1 for its state (ok, degraded, failed).
fn push_status(out: &mut Vec<Sample>, attrs: &[(&'static str, AttrValue)], level: Level) {
    for s in [HealthState::Ok, HealthState::Degraded, HealthState::Failed] {
        let mut st = Sample::new(Metric::Status, f64::from(u8::from(level.hw_state() == s)));
        st.attrs = attrs.iter().cloned().collect();
        out.push(st.with("hw.state", s.as_str()));
    }
}

/// Where a power (or, with `energy`, energy) reading goes, and the `hw.type` it carries
/// there where that is not the reading's own (see [`Scope`]).
fn power_metric(r: &Reading, energy: bool, about_gpu: bool) -> (Metric, Option<&'static str>) {
    let (own, host, aside) = if energy {
        (Metric::Energy, Metric::HostEnergy, Metric::BmcEnergy)
    } else {
        (Metric::Power, Metric::HostPower, Metric::BmcPower)
    };
    let consumer = consumer_type(r.location.as_deref(), &r.hw_type);
    match r.scope {
        Scope::Host => (host, Some("enclosure")),
        Scope::SupplyOutput if !energy => (Metric::PowerSupplyUsage, Some("power_supply")),
        Scope::SupplyOutput | Scope::Aside => (aside, None),
        Scope::Auto if about_gpu || consumer == Some("gpu") => (aside, Some("gpu")),
        // A supply's input is everything the host draws through it.
        Scope::Auto if consumer == Some("power_supply") => (aside, Some("power_supply")),
        Scope::Auto => match consumer {
            Some(t) => (own, Some(t)),
            None => (aside, None),
        },
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

    fn reading(id: &str, hw_type: &str, quantity: Quantity, value: f64) -> Reading {
        Reading {
            id: id.into(),
            hw_type: hw_type.into(),
            name: id.into(),
            parent: Some("bmc:/Chassis/1".into()),
            quantity,
            value,
            unit: String::new(),
            location: None,
            point: None,
            thresholds: Vec::new(),
            state: None,
            scope: Scope::Auto,
        }
    }

    /// (metric, hw.type) of each sample with hw.id `id`.
    fn routed(samples: &[Sample], id: &str) -> Vec<(&'static str, String)> {
        samples
            .iter()
            .filter(|s| s.attr("hw.id") == Some(id))
            .map(|s| {
                (
                    s.metric.desc().name,
                    s.attr("hw.type").unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn power_goes_where_no_sum_counts_it_twice() {
        let gpu = Component {
            id: "GPU-1".into(),
            hw_type: "gpu".into(),
            name: "GPU 0".into(),
            parent: None,
            model: None,
            serial: None,
            health: Some(Level::Warning),
        };
        let mut host = reading("host", "power", Quantity::Power, 2400.0);
        host.scope = Scope::Host;
        let mut avg = reading("avg", "power", Quantity::Power, 2300.0);
        avg.scope = Scope::Aside;
        let psu_in = reading("psu", "power_supply", Quantity::Power, 1210.0);
        let mut psu_out = reading("psu-out", "power_supply", Quantity::Power, 1150.0);
        psu_out.scope = Scope::SupplyOutput;
        let mut copy = reading("gpu-copy", "power", Quantity::Power, 455.0);
        copy.parent = Some("GPU-1".into());
        let mut by_context = reading("gpu-ctx", "power", Quantity::Power, 71.0);
        by_context.location = Some("gpu".into());
        let mut cpu = reading("cpu", "power", Quantity::Power, 180.0);
        cpu.location = Some("cpu".into());
        let mut hsc = reading("hsc", "power", Quantity::Power, 72.0);
        hsc.location = Some("gpu_subsystem".into());
        let mut gpu_energy = reading("gpu-energy", "energy", Quantity::Energy, 5.6e7);
        gpu_energy.location = Some("gpu".into());
        let poll = Poll {
            target: "bmc".into(),
            components: vec![gpu],
            readings: vec![
                host, avg, psu_in, psu_out, copy, by_context, cpu, hsc, gpu_energy,
            ],
            notes: Vec::new(),
            host: None,
        };
        let s = poll.samples();
        let one = |id: &str| routed(&s, id);
        assert_eq!(one("host"), [("hw.host.power", "enclosure".into())]);
        assert_eq!(one("avg"), [("bmc.power", "power".into())]);
        assert_eq!(one("psu"), [("bmc.power", "power_supply".into())]);
        assert_eq!(
            one("psu-out"),
            [("hw.power_supply.usage", "power_supply".into())]
        );
        assert_eq!(one("gpu-copy"), [("bmc.power", "gpu".into())]);
        assert_eq!(one("gpu-ctx"), [("bmc.power", "gpu".into())]);
        assert_eq!(one("cpu"), [("hw.power", "cpu".into())]);
        assert_eq!(one("hsc"), [("bmc.power", "power".into())]);
        assert_eq!(one("gpu-energy"), [("bmc.energy", "gpu".into())]);
        // The GPU's own hw.status is Junction's: the BMC's view is a metric of its own.
        let gpu: Vec<_> = routed(&s, "GPU-1").into_iter().map(|(m, _)| m).collect();
        assert!(!gpu.contains(&"hw.status"), "{gpu:?}");
        assert_eq!(
            s.iter()
                .filter(|x| x.metric == Metric::ComponentHealth && x.value == 1.0)
                .filter_map(|x| x.attr("bmc.health"))
                .collect::<Vec<_>>(),
            ["warning"]
        );
    }

    /// A GPU's T.Limit sensor as a DGX's BMC publishes it (a temperature in Cel, thresholds
    /// LowerCaution 0, LowerCritical -2, LowerFatal -8) is a margin: not a temperature, not
    /// the host's ambient; and a BMC that puts every sensor at the air intake is taken at its
    /// sensors' names for the ambient.
    #[test]
    fn a_t_limit_sensor_is_a_margin_and_an_all_intake_bmc_is_read_by_name() {
        let mut tlimit = reading("tl", "temperature", Quantity::Temperature, 55.0);
        tlimit.thresholds = vec![
            ("lower_caution", 0.0),
            ("lower_critical", -2.0),
            ("lower_fatal", -8.0),
        ];
        tlimit.location = Some("intake".into());
        tlimit.state = Reading::level(55.0, &tlimit.thresholds, None);
        let mut freeze = reading("cold", "temperature", Quantity::Temperature, 20.0);
        freeze.thresholds = vec![("lower_caution", 0.0)];
        assert!(is_thermal_margin(&tlimit));
        assert!(
            !is_thermal_margin(&freeze),
            "a 0 °C low alarm is a temperature's"
        );
        let mut readings = vec![tlimit];
        for i in 0..10 {
            let mut r = reading(
                &format!("retimer{i}"),
                "temperature",
                Quantity::Temperature,
                58.0,
            );
            r.location = Some("intake".into());
            readings.push(r);
        }
        for (name, v) in [("TEMP_AMBIENT", 22.0), ("TEMP_MB_INLET", 25.0)] {
            let mut r = reading(name, "temperature", Quantity::Temperature, v);
            r.location = Some("intake".into());
            readings.push(r);
        }
        let poll = Poll {
            target: "bmc".into(),
            components: Vec::new(),
            readings,
            notes: Vec::new(),
            host: Some("bmc".into()),
        };
        let s = poll.samples();
        let of = |id: &str| -> Vec<Metric> {
            s.iter()
                .filter(|x| x.attr("hw.id") == Some(id))
                .map(|x| x.metric)
                .collect()
        };
        let tl = of("tl");
        assert!(tl.contains(&Metric::SensorReading), "{tl:?}");
        assert!(!tl.contains(&Metric::Temperature) && !tl.contains(&Metric::TemperatureLimit));
        assert!(
            tl.contains(&Metric::SensorThreshold),
            "its thresholds are kept"
        );
        let ambient: Vec<_> = s
            .iter()
            .filter(|x| x.metric == Metric::HostAmbient)
            .map(|x| (x.attr("hw.name").unwrap_or(""), x.value))
            .collect();
        assert_eq!(ambient, [("TEMP_AMBIENT", 22.0)]);
    }

    #[test]
    fn temperatures_voltages_and_fans_carry_the_conventions_state_and_limits() {
        let mut t = reading("t", "temperature", Quantity::Temperature, 85.0);
        t.thresholds = vec![
            ("lower_critical", 5.0),
            ("upper_caution", 80.0),
            ("upper_critical", 90.0),
            ("upper_fatal", 95.0),
        ];
        t.state = Reading::level(85.0, &t.thresholds, None);
        let mut flow = reading("f", "flow", Quantity::Flow, 20.0);
        flow.thresholds = vec![("lower_caution", 30.0)];
        flow.state = Some(Level::Warning);
        let poll = Poll {
            target: "bmc".into(),
            components: Vec::new(),
            readings: vec![t, flow],
            notes: Vec::new(),
            host: Some("bmc".into()),
        };
        let s = poll.samples();
        let limits: Vec<_> = s
            .iter()
            .filter(|x| x.metric == Metric::TemperatureLimit)
            .map(|x| (x.attr("hw.limit_type").unwrap_or(""), x.value))
            .collect();
        assert_eq!(
            limits,
            [
                ("low.critical", 5.0),
                ("high.degraded", 80.0),
                ("high.critical", 90.0),
                ("high.fatal", 95.0)
            ]
        );
        let state = |id: &str, m: Metric, key: &str| -> Vec<String> {
            s.iter()
                .filter(|x| x.metric == m && x.attr("hw.id") == Some(id) && x.value == 1.0)
                .filter_map(|x| x.attr(key).map(str::to_string))
                .collect()
        };
        assert_eq!(state("t", Metric::Status, "hw.state"), ["degraded"]);
        assert!(state("t", Metric::SensorState, "bmc.sensor.state").is_empty());
        // The host's heating margin: 80 − 85, the sensor past its caution threshold.
        let margin: Vec<_> = s
            .iter()
            .filter(|x| x.metric == Metric::HostHeatingMargin)
            .map(|x| (x.attr("hw.id").unwrap_or(""), x.value))
            .collect();
        assert_eq!(margin, [("bmc", -5.0)]);
        // Flow has no family in the conventions: it keeps Junction's own.
        assert_eq!(
            state("f", Metric::SensorState, "bmc.sensor.state"),
            ["warning"]
        );
        assert!(state("f", Metric::Status, "hw.state").is_empty());
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

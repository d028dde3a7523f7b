//! A poll's samples: components and readings as the registry's metrics, each sensor once with
//! its state and limits (the conventions' families where they have one), power and energy
//! where what they stand for puts them, and the host's temperatures.

use super::{LEAK_STATES, Level, Poll, Quantity, Reading, Scope, consumer_type, limit_type};
use crate::model::{AttrValue, Attrs, HealthState, Metric, Sample};

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

//! From Redfish documents to components and readings: pure functions of the JSON (no I/O,
//! no shared state), so that each resource family's mapping is tested on documents directly.
//! Which documents are fetched, and which reading wins where two describe one sensor, is the
//! walker's business (`super`).

mod cooling;
mod legacy;
mod power;
mod report;

use serde_json::Value;

pub use cooling::{Part, cooling_unit, environment, leak_detector, leak_groups, thermal_metrics};
pub use legacy::{LegacyPower, legacy_power, legacy_thermal, legacy_thresholds};
pub use power::power_supply;
pub use report::metric_report;

use crate::model::bmc::{self, Component, Level, Quantity, Reading};

/// A number as BMCs send it: a JSON number, or a string holding one; `null`, `"nan"` and
/// non-finite values are no reading.
pub fn num(v: &Value) -> Option<f64> {
    let x = match v {
        Value::Number(n) => n.as_f64()?,
        Value::String(s) => s.trim().parse::<f64>().ok()?,
        _ => return None,
    };
    x.is_finite().then_some(x)
}

/// The `@odata.id` a property links to.
pub fn link(v: &Value, key: &str) -> Option<String> {
    v.get(key)?
        .get("@odata.id")?
        .as_str()
        .map(|s| s.to_string())
}

/// A non-empty string property.
pub fn text<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key)?.as_str().filter(|s| !s.is_empty())
}

/// `Status.Health`.
pub fn health(v: &Value) -> Option<Level> {
    Level::from_health(v.get("Status")?.get("Health")?.as_str()?)
}

/// A Redfish path without the fragment.
pub fn strip(uri: &str) -> &str {
    uri.split('#').next().unwrap_or(uri)
}

/// How a target names what it reports: `hw.id` = `{target}:{path below /redfish/v1}`.
#[derive(Clone, Copy)]
pub struct Ids<'a>(pub &'a str);

impl Ids<'_> {
    /// The `hw.id` of the resource at `path`.
    pub fn of(&self, path: &str) -> String {
        format!(
            "{}:{}",
            self.0,
            path.strip_prefix("/redfish/v1").unwrap_or(path)
        )
    }
}

/// A chassis as the walk knows it: its `hw.id` (a GPU's UUID where the chassis is a GPU the
/// NVML inventory names), whether it is a GPU, and whether it is the host itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chassis {
    /// `hw.id`.
    pub id: String,
    /// Whether it is one of this node's GPUs.
    pub gpu: bool,
    /// Whether its totals are the whole host's (see [`is_host`]).
    pub host: bool,
}

impl Chassis {
    /// What the chassis' own totals (EnvironmentMetrics, PowerControl) stand for: the host's,
    /// a GPU's (the BMC's copy), or a sub-total of what it holds.
    pub fn total_scope(&self) -> crate::model::bmc::Scope {
        use crate::model::bmc::Scope;
        if self.host {
            Scope::Host
        } else if self.gpu {
            Scope::Auto
        } else {
            Scope::Aside
        }
    }
}

/// Chassis types of a whole server (DSP0268 `ChassisType`): a root chassis of one of these
/// is the host, and its power and energy totals are `hw.host.*`. A GPU baseboard (`Zone`,
/// `Module`), a CDU or a rack is not.
const HOST_TYPES: [&str; 8] = [
    "RackMount",
    "Blade",
    "Sled",
    "StandAlone",
    "Tower",
    "Desktop",
    "Enclosure",
    "Drawer",
];

/// Whether a chassis document is the host: a root chassis (no `ContainedBy`) of a server's
/// type.
pub fn is_host(doc: &Value) -> bool {
    let contained = doc
        .get("Links")
        .and_then(|l| l.get("ContainedBy"))
        .and_then(|c| c.get("@odata.id"))
        .is_some();
    !contained && text(doc, "ChassisType").is_some_and(|t| HOST_TYPES.contains(&t))
}

/// Who a reading belongs to.
#[derive(Clone, Copy)]
pub struct Owner<'a> {
    /// `hw.id`.
    pub id: &'a str,
    /// `hw.type`.
    pub hw_type: &'a str,
    /// The reading's name.
    pub name: &'a str,
    /// `hw.parent`.
    pub parent: Option<&'a str>,
}

/// Whether a reading taken from a property stands for itself or mirrors a sensor.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The resource's own property (a pump's speed), kept even where it names a sensor as its
    /// source.
    Own,
    /// An excerpt of a sensor (ThermalMetrics arrays, EnvironmentMetrics, leak detector
    /// groups): dropped if its `DataSourceUri` was read as a resource.
    Mirror,
}

/// One property read as a reading: where it is, what it measures and how it scales.
#[derive(Clone, Copy)]
pub struct Prop {
    /// The property's key.
    pub key: &'static str,
    /// What it measures.
    pub quantity: Quantity,
    /// Factor to the registry's unit.
    pub factor: f64,
    /// `hw.coolant.point` (supply, return, delta, inlet, internal).
    pub point: Option<&'static str>,
}

const fn prop(key: &'static str, quantity: Quantity, factor: f64) -> Prop {
    Prop {
        key,
        quantity,
        factor,
        point: None,
    }
}

const fn at(key: &'static str, quantity: Quantity, point: &'static str) -> Prop {
    Prop {
        key,
        quantity,
        factor: 1.0,
        point: Some(point),
    }
}

/// What documents gave: components, readings, and excerpts with the sensor they mirror.
#[derive(Default, Debug)]
pub struct Out {
    /// Components.
    pub components: Vec<Component>,
    /// Readings of resources read in their own right.
    pub readings: Vec<Reading>,
    /// Excerpts: (the sensor they mirror, the reading).
    pub excerpts: Vec<(Option<String>, Reading)>,
}

/// The kinds of reading the legacy resources are read for, where the newer resources give
/// none of that kind with a value.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Kinds {
    /// Temperatures.
    pub temperature: bool,
    /// Fan speeds (RPM or percent).
    pub fan: bool,
    /// Power.
    pub power: bool,
    /// Voltages.
    pub voltage: bool,
}

impl Out {
    /// Adds what `other` gave.
    pub fn extend(&mut self, other: Out) {
        self.components.extend(other.components);
        self.readings.extend(other.readings);
        self.excerpts.extend(other.excerpts);
    }

    /// The kinds of reading this holds with a value.
    pub fn kinds(&self) -> Kinds {
        let mut k = Kinds::default();
        for r in self
            .readings
            .iter()
            .chain(self.excerpts.iter().map(|(_, r)| r))
        {
            match r.quantity {
                Quantity::Temperature => k.temperature = true,
                Quantity::FanRpm | Quantity::FanRatio => k.fan = true,
                Quantity::Power => k.power = true,
                Quantity::Voltage => k.voltage = true,
                _ => {}
            }
        }
        k
    }

    /// A value (`v`: a number, or an object with `Reading` and maybe `DataSourceUri`) as a
    /// reading of `owner`.
    pub fn value(
        &mut self,
        v: Option<&Value>,
        owner: Owner<'_>,
        quantity: Quantity,
        factor: f64,
        point: Option<&'static str>,
        origin: Origin,
    ) {
        let Some(v) = v else { return };
        let (value, source) = match v {
            Value::Object(o) => (
                o.get("Reading").and_then(num),
                o.get("DataSourceUri")
                    .and_then(Value::as_str)
                    .map(|s| strip(s).to_string()),
            ),
            other => (num(other), None),
        };
        let Some(value) = value else { return };
        let source = if origin == Origin::Mirror {
            source
        } else {
            None
        };
        self.excerpts.push((
            source,
            Reading {
                id: owner.id.to_string(),
                hw_type: owner.hw_type.to_string(),
                name: owner.name.to_string(),
                parent: owner.parent.map(str::to_string),
                quantity,
                value: bmc::scale(value, factor),
                unit: String::new(),
                location: None,
                point,
                thresholds: Vec::new(),
                state: None,
                scope: Default::default(),
            },
        ));
    }

    /// Each of `props` of `doc` as a reading of `owner`.
    pub fn props(&mut self, doc: &Value, owner: Owner<'_>, props: &[Prop], origin: Origin) {
        for p in props {
            self.value(doc.get(p.key), owner, p.quantity, p.factor, p.point, origin);
        }
    }

    /// A resource that is a component of its own (pump, fan, connector, filter, reservoir,
    /// leak detector, cooling unit), with the owner its readings carry.
    fn resource(
        &mut self,
        ids: Ids<'_>,
        url: &str,
        doc: &Value,
        hw_type: &str,
        parent: Option<&str>,
    ) -> String {
        let c = component(ids, url, doc, hw_type, parent);
        let id = c.id.clone();
        self.components.push(c);
        id
    }
}

/// A resource's component.
pub fn component(
    ids: Ids<'_>,
    url: &str,
    doc: &Value,
    hw_type: &str,
    parent: Option<&str>,
) -> Component {
    Component {
        id: ids.of(url),
        hw_type: hw_type.to_string(),
        name: text(doc, "Name")
            .or_else(|| text(doc, "Id"))
            .unwrap_or(url)
            .to_string(),
        parent: parent.map(str::to_string),
        model: text(doc, "Model").map(str::to_string),
        serial: text(doc, "SerialNumber").map(str::to_string),
        health: health(doc),
    }
}

/// A temperature by its name: a thermal margin (Intel's DTS, "… Margin": degrees below the
/// part's limit, read as a negative number) is not a temperature; it is reported as a
/// reading in `Cel` of its own (`bmc_sensor_reading`).
pub fn temperature(name: &str) -> Quantity {
    let n = name.to_ascii_lowercase();
    if n.split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| w == "dts" || w == "margin")
    {
        Quantity::Other
    } else {
        Quantity::Temperature
    }
}

/// A `Sensor` resource of `chassis`; none without a reading or a known quantity.
pub fn sensor(ids: Ids<'_>, url: &str, doc: &Value, chassis: &Chassis) -> Option<Reading> {
    let value = doc.get("Reading").and_then(num)?;
    let context = text(doc, "PhysicalContext");
    let (quantity, factor) =
        bmc::normalise(text(doc, "ReadingType"), text(doc, "ReadingUnits"), context)?;
    let thresholds = thresholds(doc.get("Thresholds"), factor);
    let value = bmc::scale(value, factor);
    let name = text(doc, "Name")
        .or_else(|| text(doc, "Id"))
        .unwrap_or(url)
        .to_string();
    let quantity = if quantity == Quantity::Temperature {
        temperature(&name)
    } else {
        quantity
    };
    // The sensor is a component of its own, on its chassis (a GPU's UUID for one of this
    // node's GPUs: the join to NVML's series goes through hw.parent).
    let (id, hw_type, parent) = (
        ids.of(url),
        quantity.sensor_type().to_string(),
        Some(chassis.id.clone()),
    );
    Some(Reading {
        id,
        hw_type,
        name,
        parent,
        quantity,
        value,
        unit: text(doc, "ReadingUnits").unwrap_or("").to_string(),
        location: context.map(bmc::snake),
        point: None,
        state: Reading::level(value, &thresholds, health(doc)),
        thresholds,
        scope: Default::default(),
    })
}

/// The entries of an array property (none where it is absent or not an array).
pub fn array<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    v.get(key).and_then(Value::as_array).into_iter().flatten()
}

/// A Sensor's `Thresholds` in the registry's unit.
pub fn thresholds(t: Option<&Value>, factor: f64) -> Vec<(&'static str, f64)> {
    let Some(Value::Object(o)) = t else {
        return Vec::new();
    };
    let mut out: Vec<(&'static str, f64)> = o
        .iter()
        .filter_map(|(k, v)| {
            let name = bmc::threshold_name(k)?;
            let r = v.get("Reading").and_then(num)?;
            Some((name, bmc::scale(r, factor)))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(b.0));
    out
}

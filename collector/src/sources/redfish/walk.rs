//! Discovery: ServiceRoot → Chassis → Sensors (with `$expand` where the service advertises
//! it), ThermalSubsystem (ThermalMetrics, Fans, Pumps, CoolantConnectors, LeakDetection), the
//! chassis' LeakDetectors, EnvironmentMetrics, legacy Thermal (only where the newer resources
//! gave a chassis nothing); ServiceRoot → ThermalEquipment → CDUs, ImmersionUnits,
//! HeatExchangers, RPUs, CoolingLoops; ServiceRoot → TelemetryService metric reports (NVIDIA
//! HGX style; stale values skipped).
//!
//! Lenient as real BMCs need: numbers sent as strings, `null` and `"nan"`; a missing
//! `ReadingType` inferred from `ReadingUnits`; a resource is identified by the URL it was
//! fetched from (a resource that declares another's `@odata.id` is still itself), and one
//! reached twice is read once; excerpts (`DataSourceUri`) of a sensor already read are not
//! read again. A sub-resource that fails is skipped; only the ServiceRoot failing fails the
//! poll.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::client::{Client, Error};
use crate::model::bmc::{self, Component, Level, Poll, Quantity, Reading};
use crate::model::{Model, lock};

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

fn link(v: &Value, key: &str) -> Option<String> {
    v.get(key)?
        .get("@odata.id")?
        .as_str()
        .map(|s| s.to_string())
}

fn text<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key)?.as_str().filter(|s| !s.is_empty())
}

fn health(v: &Value) -> Option<Level> {
    Level::from_health(v.get("Status")?.get("Health")?.as_str()?)
}

/// Redfish paths without the fragment.
fn strip(uri: &str) -> &str {
    uri.split('#').next().unwrap_or(uri)
}

#[derive(Default)]
struct Acc {
    components: Vec<Component>,
    readings: Vec<Reading>,
    /// Excerpts, kept until the end: dropped if their source was read as a resource.
    excerpts: Vec<(Option<String>, Reading)>,
    /// Resources read (by the URL they were fetched from).
    seen: HashSet<String>,
    /// Chassis URL → its component id (a GPU's UUID for a GPU's chassis).
    chassis_ids: BTreeMap<String, (String, bool)>,
    /// Chassis that have a `LeakDetectors` collection (the deprecated one in LeakDetection is
    /// then not read).
    with_detectors: HashSet<String>,
    /// Resources whose declared `@odata.id` is not the URL they were fetched from.
    misnamed: Vec<(String, String)>,
    /// Sub-resources that failed.
    failed: u64,
    /// An error that fails the whole poll (credentials refused past the ServiceRoot, which
    /// services serve without authentication; TLS; the connection).
    fatal: Option<Error>,
}

/// What one walk needs.
pub struct Walker {
    client: Arc<Client>,
    target: String,
    expand: bool,
    model: Arc<Model>,
    acc: Mutex<Acc>,
}

/// The result of a walk, with what was odd about it.
pub struct Walked {
    /// The components and readings.
    pub poll: Poll,
    /// Sub-resources that failed.
    pub failed: u64,
    /// (URL, declared `@odata.id`) of resources that declare another's id.
    pub misnamed: Vec<(String, String)>,
    /// Whether `$expand` was used.
    pub expanded: bool,
}

impl Walker {
    fn id(&self, path: &str) -> String {
        format!(
            "{}:{}",
            self.target,
            path.strip_prefix("/redfish/v1").unwrap_or(path)
        )
    }

    fn component(&self, c: Component) {
        lock(&self.acc).components.push(c);
    }

    fn reading(&self, r: Reading) {
        lock(&self.acc).readings.push(r);
    }

    fn excerpt(&self, source: Option<String>, r: Reading) {
        lock(&self.acc).excerpts.push((source, r));
    }

    /// Marks a resource read; false if it already was.
    fn first(&self, url: &str) -> bool {
        lock(&self.acc).seen.insert(strip(url).to_string())
    }

    async fn get(&self, path: &str) -> Option<Value> {
        match self.client.get(path).await {
            Ok(v) => {
                if let Some(declared) = v.get("@odata.id").and_then(Value::as_str)
                    && strip(declared).trim_end_matches('/') != path.trim_end_matches('/')
                    && !path.contains('?')
                {
                    lock(&self.acc)
                        .misnamed
                        .push((path.to_string(), declared.to_string()));
                }
                Some(v)
            }
            Err(e) => {
                self.failure(path, e);
                None
            }
        }
    }

    fn failure(&self, path: &str, e: Error) {
        let mut acc = lock(&self.acc);
        match e {
            Error::Status(..) | Error::Protocol(..) => {
                tracing::debug!(path, error = %e, "Redfish resource skipped");
                acc.failed += 1;
            }
            e => {
                acc.fatal.get_or_insert(e);
            }
        }
    }

    /// A collection's members: (URL, the member's document when the collection was expanded).
    async fn members(&self, path: &str, expand: bool) -> Vec<(String, Option<Value>)> {
        let use_expand = expand
            && self.expand
            && !self
                .client
                .expand_failed
                .load(std::sync::atomic::Ordering::Relaxed);
        let doc = if use_expand {
            let q = format!("{path}?$expand=.($levels=1)");
            match self.client.get(&q).await {
                Ok(v) => Some(v),
                // Refused: if the plain GET works, `$expand` is what the service cannot do
                // (advertised or not): plain GETs from now on. A collection that is simply
                // missing is no reason to stop expanding.
                Err(Error::Status(..)) => {
                    let plain = self.get(path).await;
                    if plain.is_some() {
                        self.client
                            .expand_failed
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    plain
                }
                Err(e) => {
                    self.failure(path, e);
                    None
                }
            }
        } else {
            self.get(path).await
        };
        let Some(doc) = doc else {
            return Vec::new();
        };
        let members = doc.get("Members").and_then(Value::as_array);
        if let Some(m) = members
            && m.len() > super::client::MAX_MEMBERS
        {
            tracing::warn!(
                collection = path,
                members = m.len(),
                read = super::client::MAX_MEMBERS,
                "a Redfish collection has more members than Junction reads; the rest are skipped"
            );
        }
        members
            .map(|m| {
                m.iter()
                    .take(super::client::MAX_MEMBERS)
                    .filter_map(|e| {
                        let url = e.get("@odata.id")?.as_str()?.to_string();
                        // An expanded member carries more than its link.
                        let full = e.as_object().is_some_and(|o| o.len() > 1);
                        Some((url, full.then(|| e.clone())))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every member's document, fetched in parallel where not expanded.
    async fn member_docs(self: &Arc<Self>, path: &str, expand: bool) -> Vec<(String, Value)> {
        let members = self.members(path, expand).await;
        let mut out = Vec::new();
        let mut set = tokio::task::JoinSet::new();
        for (url, doc) in members {
            match doc {
                Some(d) => out.push((url, d)),
                None => {
                    let w = self.clone();
                    set.spawn(async move { w.get(&url).await.map(|d| (url, d)) });
                }
            }
        }
        while let Some(r) = set.join_next().await {
            if let Ok(Some(x)) = r {
                out.push(x);
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// A `Sensor` resource.
    fn sensor(&self, url: &str, doc: &Value, parent: &str, gpu: bool) {
        if !self.first(url) {
            return;
        }
        let Some(value) = doc.get("Reading").and_then(num) else {
            return;
        };
        self.sensor_reading(url, doc, parent, gpu, value);
    }

    fn sensor_reading(&self, url: &str, doc: &Value, parent: &str, gpu: bool, value: f64) {
        let context = text(doc, "PhysicalContext");
        let Some((quantity, factor)) =
            bmc::normalise(text(doc, "ReadingType"), text(doc, "ReadingUnits"), context)
        else {
            return;
        };
        let thresholds = thresholds(doc.get("Thresholds"), factor);
        let value = bmc::scale(value, factor);
        let name = text(doc, "Name")
            .or_else(|| text(doc, "Id"))
            .unwrap_or(url)
            .to_string();
        let (id, hw_type, parent) = if gpu {
            (parent.to_string(), "gpu".to_string(), None)
        } else {
            (
                self.id(url),
                quantity.sensor_type().to_string(),
                Some(parent.to_string()),
            )
        };
        self.reading(Reading {
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
        });
    }

    /// A property of a resource (connector, pump, fan, filter, reservoir, loop): read as that
    /// resource's own reading, even where it names a sensor as its source.
    #[expect(clippy::too_many_arguments, reason = "the parts of one reading")]
    fn property(
        &self,
        v: Option<&Value>,
        id: &str,
        hw_type: &str,
        name: &str,
        parent: Option<&str>,
        quantity: Quantity,
        factor: f64,
        point: Option<&'static str>,
    ) {
        self.embedded_as(v, id, hw_type, name, parent, quantity, factor, point, false);
    }

    /// A reading that mirrors a sensor (ThermalMetrics arrays, EnvironmentMetrics, leak
    /// detector groups): dropped at the end if its `DataSourceUri` was read as a resource.
    #[expect(clippy::too_many_arguments, reason = "the parts of one reading")]
    fn embedded(
        &self,
        v: Option<&Value>,
        id: &str,
        hw_type: &str,
        name: &str,
        parent: Option<&str>,
        quantity: Quantity,
        factor: f64,
        point: Option<&'static str>,
    ) {
        self.embedded_as(v, id, hw_type, name, parent, quantity, factor, point, true);
    }

    #[expect(clippy::too_many_arguments, reason = "the parts of one reading")]
    fn embedded_as(
        &self,
        v: Option<&Value>,
        id: &str,
        hw_type: &str,
        name: &str,
        parent: Option<&str>,
        quantity: Quantity,
        factor: f64,
        point: Option<&'static str>,
        mirror: bool,
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
        let source = if mirror { source } else { None };
        self.excerpt(
            source,
            Reading {
                id: id.to_string(),
                hw_type: hw_type.to_string(),
                name: name.to_string(),
                parent: parent.map(str::to_string),
                quantity,
                value: bmc::scale(value, factor),
                unit: String::new(),
                location: None,
                point,
                thresholds: Vec::new(),
                state: None,
            },
        );
    }

    fn resource_component(
        &self,
        url: &str,
        doc: &Value,
        hw_type: &str,
        parent: Option<&str>,
    ) -> String {
        let id = self.id(url);
        self.component(Component {
            id: id.clone(),
            hw_type: hw_type.to_string(),
            name: text(doc, "Name")
                .or_else(|| text(doc, "Id"))
                .unwrap_or(url)
                .to_string(),
            parent: parent.map(str::to_string),
            model: text(doc, "Model").map(str::to_string),
            serial: text(doc, "SerialNumber").map(str::to_string),
            health: health(doc),
        });
        id
    }

    fn leak_detector(&self, url: &str, doc: &Value, parent: &str) {
        if !self.first(url) {
            return;
        }
        let id = self.resource_component(url, doc, "leak_detector", Some(parent));
        if let Some(state) = text(doc, "DetectorState") {
            self.reading(leak_reading(
                &id,
                text(doc, "Name").unwrap_or(url),
                parent,
                state,
            ));
        }
    }

    fn pump(&self, url: &str, doc: &Value, parent: &str) {
        if !self.first(url) {
            return;
        }
        let id = self.resource_component(url, doc, "pump", Some(parent));
        let name = text(doc, "Name").unwrap_or(url).to_string();
        let speed = doc.get("PumpSpeedPercent");
        self.property(
            speed,
            &id,
            "pump",
            &name,
            Some(parent),
            Quantity::PumpRatio,
            0.01,
            None,
        );
        if let Some(rpm) = speed.and_then(|s| s.get("SpeedRPM")) {
            self.property(
                Some(rpm),
                &id,
                "pump",
                &name,
                Some(parent),
                Quantity::PumpRpm,
                1.0,
                None,
            );
        }
        self.property(
            doc.get("InletPressurekPa"),
            &id,
            "pump",
            &name,
            Some(parent),
            Quantity::Pressure,
            1.0,
            Some("inlet"),
        );
    }

    fn fan(&self, url: &str, doc: &Value, parent: &str) {
        if !self.first(url) {
            return;
        }
        let id = self.resource_component(url, doc, "fan", Some(parent));
        let name = text(doc, "Name").unwrap_or(url).to_string();
        let speed = doc.get("SpeedPercent");
        self.property(
            speed,
            &id,
            "fan",
            &name,
            Some(parent),
            Quantity::FanRatio,
            0.01,
            None,
        );
        if let Some(rpm) = speed.and_then(|s| s.get("SpeedRPM")) {
            self.property(
                Some(rpm),
                &id,
                "fan",
                &name,
                Some(parent),
                Quantity::FanRpm,
                1.0,
                None,
            );
        }
    }

    fn connector(&self, url: &str, doc: &Value, parent: &str) {
        if !self.first(url) {
            return;
        }
        let id = self.resource_component(url, doc, "coolant_connector", Some(parent));
        let name = text(doc, "Name").unwrap_or(url).to_string();
        let t = "coolant_connector";
        for (key, q, f, point) in [
            ("FlowLitersPerMinute", Quantity::Flow, 1.0, None),
            (
                "SupplyTemperatureCelsius",
                Quantity::CoolantTemperature,
                1.0,
                Some("supply"),
            ),
            (
                "ReturnTemperatureCelsius",
                Quantity::CoolantTemperature,
                1.0,
                Some("return"),
            ),
            (
                "DeltaTemperatureCelsius",
                Quantity::CoolantTemperature,
                1.0,
                Some("delta"),
            ),
            ("SupplyPressurekPa", Quantity::Pressure, 1.0, Some("supply")),
            ("ReturnPressurekPa", Quantity::Pressure, 1.0, Some("return")),
            ("DeltaPressurekPa", Quantity::Pressure, 1.0, Some("delta")),
            ("HeatRemovedkW", Quantity::Heat, 1000.0, None),
            ("ValvePositionPercent", Quantity::Valve, 0.01, None),
        ] {
            self.property(doc.get(key), &id, t, &name, Some(parent), q, f, point);
        }
    }

    fn environment(&self, doc: &Value, id: &str, hw_type: &str, name: &str, parent: Option<&str>) {
        for (key, q, f) in [
            ("TemperatureCelsius", Quantity::Temperature, 1.0),
            ("HumidityPercent", Quantity::Humidity, 0.01),
            ("PowerWatts", Quantity::Power, 1.0),
            ("EnergyJoules", Quantity::Energy, 1.0),
            ("EnergykWh", Quantity::Energy, 3.6e6),
        ] {
            self.embedded(doc.get(key), id, hw_type, name, parent, q, f, None);
        }
    }

    async fn leak_detection(self: &Arc<Self>, path: &str, parent: &str, chassis: Option<&str>) {
        let Some(doc) = self.get(path).await else {
            return;
        };
        // The detectors listed here are deprecated in favour of the chassis' own.
        let chassis_has = chassis.is_some_and(|c| lock(&self.acc).with_detectors.contains(c));
        if let Some(l) = link(&doc, "LeakDetectors")
            && !chassis_has
        {
            for (url, d) in self.member_docs(&l, true).await {
                self.leak_detector(&url, &d, parent);
            }
        }
        for group in doc
            .get("LeakDetectorGroups")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let gname = text(group, "GroupName").unwrap_or("leak detectors");
            self.embedded(
                group.get("HumidityPercent"),
                parent,
                "leak_detection",
                gname,
                None,
                Quantity::Humidity,
                0.01,
                None,
            );
            for d in group
                .get("Detectors")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let (Some(state), Some(name)) = (text(d, "DetectorState"), text(d, "DeviceName"))
                else {
                    continue;
                };
                let source = text(d, "DataSourceUri").map(|s| strip(s).to_string());
                let id = source
                    .as_deref()
                    .map(|s| self.id(s))
                    .unwrap_or_else(|| format!("{parent}/{name}"));
                self.excerpt(source, leak_reading(&id, name, parent, state));
            }
        }
    }

    async fn chassis(self: Arc<Self>, url: String, doc: Value) {
        // What the newer resources gave this chassis (legacy Thermal is read where nothing).
        let mut found = 0usize;
        let (id, gpu) = lock(&self.acc)
            .chassis_ids
            .get(&url)
            .cloned()
            .unwrap_or_else(|| (self.id(&url), false));
        let sensors = link(&doc, "Sensors");
        let subsystem = link(&doc, "ThermalSubsystem");
        if let Some(s) = &sensors {
            for (u, d) in self.member_docs(s, true).await {
                found += 1;
                self.sensor(&u, &d, &id, gpu);
            }
        }
        if let Some(l) = link(&doc, "LeakDetectors") {
            for (u, d) in self.member_docs(&l, true).await {
                self.leak_detector(&u, &d, &id);
            }
        }
        if let Some(ts) = &subsystem
            && let Some(sub) = self.get(ts).await
        {
            if let Some(tm) = link(&sub, "ThermalMetrics")
                && let Some(m) = self.get(&tm).await
            {
                for e in m
                    .get("TemperatureReadingsCelsius")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    found += 1;
                    let name = text(e, "DeviceName")
                        .or_else(|| e.get("DataSourceUri").and_then(Value::as_str))
                        .unwrap_or("temperature")
                        .to_string();
                    let (rid, t, p) = if gpu {
                        (id.clone(), "gpu", None)
                    } else {
                        let src = e
                            .get("DataSourceUri")
                            .and_then(Value::as_str)
                            .unwrap_or(&tm);
                        (self.id(strip(src)), "temperature", Some(id.as_str()))
                    };
                    self.embedded(Some(e), &rid, t, &name, p, Quantity::Temperature, 1.0, None);
                }
            }
            for (key, kind) in [("Fans", 0), ("Pumps", 1), ("CoolantConnectors", 2)] {
                if let Some(l) = link(&sub, key) {
                    for (u, d) in self.member_docs(&l, true).await {
                        found += 1;
                        match kind {
                            0 => self.fan(&u, &d, &id),
                            1 => self.pump(&u, &d, &id),
                            _ => self.connector(&u, &d, &id),
                        }
                    }
                }
            }
            if let Some(l) = link(&sub, "LeakDetection") {
                self.leak_detection(&l, &id, Some(&url)).await;
            }
        }
        if let Some(e) = link(&doc, "EnvironmentMetrics")
            && let Some(env) = self.get(&e).await
        {
            let name = text(&doc, "Name").unwrap_or(&url).to_string();
            let t = if gpu { "gpu" } else { "chassis" };
            self.environment(&env, &id, t, &name, None);
        }
        // Legacy Thermal where the newer resources gave nothing (absent, or linked but empty).
        if found == 0
            && let Some(t) = link(&doc, "Thermal")
            && let Some(th) = self.get(&t).await
        {
            self.legacy_thermal(&th, &id);
        }
    }

    fn legacy_thermal(&self, th: &Value, parent: &str) {
        for t in th
            .get("Temperatures")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(value) = t.get("ReadingCelsius").and_then(num) else {
                continue;
            };
            let rid = t.get("@odata.id").and_then(Value::as_str).unwrap_or("");
            let thresholds = legacy_thresholds(t, 1.0);
            self.reading(Reading {
                id: self.id(rid),
                hw_type: "temperature".into(),
                name: text(t, "Name").unwrap_or(rid).to_string(),
                parent: Some(parent.to_string()),
                quantity: Quantity::Temperature,
                value,
                unit: "Cel".into(),
                location: text(t, "PhysicalContext").map(bmc::snake),
                point: None,
                state: Reading::level(value, &thresholds, health(t)),
                thresholds,
            });
        }
        for f in th
            .get("Fans")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(value) = f.get("Reading").and_then(num) else {
                continue;
            };
            let rid = f.get("@odata.id").and_then(Value::as_str).unwrap_or("");
            let percent = text(f, "ReadingUnits") == Some("Percent");
            let (q, factor) = if percent {
                (Quantity::FanRatio, 0.01)
            } else {
                (Quantity::FanRpm, 1.0)
            };
            let thresholds = legacy_thresholds(f, factor);
            let value = bmc::scale(value, factor);
            self.reading(Reading {
                id: self.id(rid),
                hw_type: "fan".into(),
                name: text(f, "Name")
                    .or_else(|| text(f, "FanName"))
                    .unwrap_or(rid)
                    .to_string(),
                parent: Some(parent.to_string()),
                quantity: q,
                value,
                unit: text(f, "ReadingUnits").unwrap_or("RPM").to_string(),
                location: None,
                point: None,
                state: Reading::level(value, &thresholds, health(f)),
                thresholds,
            });
        }
    }

    async fn cooling_unit(self: Arc<Self>, url: String, doc: Value, hw_type: &'static str) {
        if !self.first(&url) {
            return;
        }
        let kind = text(&doc, "EquipmentType").map(bmc::snake);
        let id = self.resource_component(&url, &doc, kind.as_deref().unwrap_or(hw_type), None);
        let name = text(&doc, "Name").unwrap_or(&url).to_string();
        let chassis = doc
            .get("Links")
            .and_then(|l| l.get("Chassis"))
            .and_then(|c| match c {
                Value::Array(a) => a.first().and_then(|x| x.get("@odata.id")),
                o => o.get("@odata.id"),
            })
            .and_then(Value::as_str)
            .map(|s| strip(s).to_string());
        self.property(
            doc.get("CoolantLevelPercent"),
            &id,
            hw_type,
            &name,
            None,
            Quantity::Level,
            0.01,
            None,
        );
        for key in ["PrimaryCoolantConnectors", "SecondaryCoolantConnectors"] {
            if let Some(l) = link(&doc, key) {
                for (u, d) in self.member_docs(&l, true).await {
                    self.connector(&u, &d, &id);
                }
            }
        }
        if let Some(l) = link(&doc, "Pumps") {
            for (u, d) in self.member_docs(&l, true).await {
                self.pump(&u, &d, &id);
            }
        }
        if let Some(l) = link(&doc, "Filters") {
            for (u, d) in self.member_docs(&l, true).await {
                if !self.first(&u) {
                    continue;
                }
                let fid = self.resource_component(&u, &d, "filter", Some(&id));
                let fname = text(&d, "Name").unwrap_or(&u).to_string();
                self.property(
                    d.get("DeltaLiquidPressurekPa"),
                    &fid,
                    "filter",
                    &fname,
                    Some(&id),
                    Quantity::Pressure,
                    1.0,
                    Some("delta"),
                );
            }
        }
        // Reservoirs: read where linked, and looked for where a unit forgets the link.
        let reservoirs = link(&doc, "Reservoirs").unwrap_or_else(|| format!("{url}/Reservoirs"));
        for (u, d) in self.member_docs(&reservoirs, true).await {
            if !self.first(&u) {
                continue;
            }
            let rid = self.resource_component(&u, &d, "reservoir", Some(&id));
            let rname = text(&d, "Name").unwrap_or(&u).to_string();
            self.property(
                d.get("FluidLevelPercent"),
                &rid,
                "reservoir",
                &rname,
                Some(&id),
                Quantity::Level,
                0.01,
                None,
            );
            self.property(
                d.get("InternalPressurekPa"),
                &rid,
                "reservoir",
                &rname,
                Some(&id),
                Quantity::Pressure,
                1.0,
                Some("internal"),
            );
        }
        if let Some(e) = link(&doc, "EnvironmentMetrics")
            && let Some(env) = self.get(&e).await
        {
            self.environment(&env, &id, hw_type, &name, None);
        }
        if let Some(l) = link(&doc, "LeakDetection") {
            self.leak_detection(&l, &id, chassis.as_deref()).await;
        }
    }

    async fn telemetry(self: &Arc<Self>, path: &str) {
        let Some(ts) = self.get(path).await else {
            return;
        };
        let Some(reports) = link(&ts, "MetricReports") else {
            return;
        };
        for (_, report) in self.member_docs(&reports, false).await {
            for mv in report
                .get("MetricValues")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let stale = mv
                    .get("Oem")
                    .and_then(|o| o.get("Nvidia"))
                    .and_then(|n| n.get("MetricValueStale"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let (Some(prop), Some(value)) = (
                    mv.get("MetricProperty").and_then(Value::as_str),
                    mv.get("MetricValue").and_then(num),
                ) else {
                    continue;
                };
                if stale {
                    continue;
                }
                let uri = strip(prop).to_string();
                let name = uri.rsplit('/').next().unwrap_or(&uri).to_string();
                let lname = name.to_ascii_lowercase();
                let quantity = if lname.contains("temp") {
                    Quantity::Temperature
                } else if lname.contains("energy") {
                    Quantity::Energy
                } else if lname.contains("power") {
                    Quantity::Power
                } else if lname.contains("voltage") {
                    Quantity::Voltage
                } else {
                    Quantity::Other
                };
                // The sensor's chassis: a GPU's readings carry its UUID.
                let chassis = uri
                    .split("/Chassis/")
                    .nth(1)
                    .and_then(|r| r.split('/').next())
                    .map(|c| format!("/redfish/v1/Chassis/{c}"));
                let owner = chassis
                    .as_ref()
                    .and_then(|c| lock(&self.acc).chassis_ids.get(c).cloned());
                let (id, t, parent) = match owner {
                    Some((gpu_id, true)) => (gpu_id, "gpu", None),
                    Some((cid, false)) => (self.id(&uri), "sensor", Some(cid)),
                    None => (self.id(&uri), "sensor", None),
                };
                self.excerpt(
                    Some(uri.clone()),
                    Reading {
                        id,
                        hw_type: t.to_string(),
                        name,
                        parent,
                        quantity,
                        value,
                        unit: String::new(),
                        location: None,
                        point: None,
                        thresholds: Vec::new(),
                        state: None,
                    },
                );
            }
        }
    }
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
    }
}

/// A Sensor's `Thresholds` in the registry's unit.
fn thresholds(t: Option<&Value>, factor: f64) -> Vec<(&'static str, f64)> {
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

/// Legacy `Thermal` thresholds (`UpperThresholdNonCritical`, …).
fn legacy_thresholds(v: &Value, factor: f64) -> Vec<(&'static str, f64)> {
    [
        ("UpperThresholdNonCritical", "upper_caution"),
        ("UpperThresholdCritical", "upper_critical"),
        ("UpperThresholdFatal", "upper_fatal"),
        ("LowerThresholdNonCritical", "lower_caution"),
        ("LowerThresholdCritical", "lower_critical"),
        ("LowerThresholdFatal", "lower_fatal"),
    ]
    .into_iter()
    .filter_map(|(k, n)| v.get(k).and_then(num).map(|x| (n, bmc::scale(x, factor))))
    .collect()
}

/// Walks the whole service.
pub async fn walk(
    client: Arc<Client>,
    target: &str,
    allow_expand: bool,
    model: Arc<Model>,
) -> Result<Walked, Error> {
    let root = client.get("/redfish/v1").await?;
    let features = root
        .get("ProtocolFeaturesSupported")
        .and_then(|p| p.get("ExpandQuery"));
    let advertised = features.is_some_and(|e| {
        e.get("Levels").and_then(Value::as_bool) == Some(true)
            || e.get("ExpandAll").and_then(Value::as_bool) == Some(true)
    });
    let w = Arc::new(Walker {
        client,
        target: target.to_string(),
        expand: allow_expand && advertised,
        model,
        acc: Mutex::new(Acc::default()),
    });
    let bmc_id = target.to_string();
    w.component(Component {
        id: bmc_id.clone(),
        hw_type: "bmc".into(),
        name: text(&root, "Product")
            .or_else(|| text(&root, "Name"))
            .unwrap_or(target)
            .to_string(),
        parent: None,
        model: text(&root, "Vendor").map(str::to_string),
        serial: text(&root, "UUID").map(str::to_string),
        health: None,
    });
    // Chassis first (their sensors are what excerpts and reports refer to), in parallel.
    if let Some(c) = link(&root, "Chassis") {
        let docs = w.member_docs(&c, false).await;
        for (url, doc) in &docs {
            let gpu = w
                .model
                .gpu_by_identity(text(doc, "SerialNumber"), text(doc, "UUID"));
            let contained = doc
                .get("Links")
                .and_then(|l| l.get("ContainedBy"))
                .and_then(|c| c.get("@odata.id"))
                .and_then(Value::as_str)
                .map(|s| w.id(strip(s)));
            let (id, is_gpu) = match &gpu {
                Some(u) => (u.clone(), true),
                None => (w.id(url), false),
            };
            {
                let mut acc = lock(&w.acc);
                acc.chassis_ids.insert(url.clone(), (id.clone(), is_gpu));
                acc.seen.insert(url.clone());
                if link(doc, "LeakDetectors").is_some() {
                    acc.with_detectors.insert(url.clone());
                }
            }
            w.component(Component {
                id,
                hw_type: if is_gpu { "gpu" } else { "chassis" }.into(),
                name: text(doc, "Name").unwrap_or(url).to_string(),
                parent: contained.or_else(|| Some(bmc_id.clone())),
                model: text(doc, "Model").map(str::to_string),
                serial: text(doc, "SerialNumber").map(str::to_string),
                health: health(doc),
            });
        }
        let mut set = tokio::task::JoinSet::new();
        for (url, doc) in docs {
            set.spawn(w.clone().chassis(url, doc));
        }
        while set.join_next().await.is_some() {}
    }
    if let Some(te) = link(&root, "ThermalEquipment")
        && let Some(doc) = w.get(&te).await
    {
        for (key, t) in [
            ("CDUs", "cooling_unit"),
            ("ImmersionUnits", "cooling_unit"),
            ("HeatExchangers", "cooling_unit"),
            ("RPUs", "cooling_unit"),
            ("CoolingLoops", "cooling_loop"),
        ] {
            if let Some(l) = link(&doc, key) {
                for (u, d) in w.member_docs(&l, false).await {
                    w.clone().cooling_unit(u, d, t).await;
                }
            }
        }
    }
    if let Some(t) = link(&root, "TelemetryService") {
        w.telemetry(&t).await;
    }
    let expanded = w.expand
        && !w
            .client
            .expand_failed
            .load(std::sync::atomic::Ordering::Relaxed);
    let mut acc = std::mem::take(&mut *lock(&w.acc));
    if let Some(e) = acc.fatal.take() {
        return Err(e);
    }
    let seen = std::mem::take(&mut acc.seen);
    let mut keys: HashSet<(String, String, Option<&'static str>, String)> = acc
        .readings
        .iter()
        .map(|r| {
            (
                r.id.clone(),
                r.name.clone(),
                r.point,
                format!("{:?}", r.quantity),
            )
        })
        .collect();
    for (source, r) in acc.excerpts {
        if source.as_ref().is_some_and(|s| seen.contains(s)) {
            continue;
        }
        // The same excerpt reached twice (a report and a ThermalMetrics array).
        if keys.insert((
            r.id.clone(),
            r.name.clone(),
            r.point,
            format!("{:?}", r.quantity),
        )) {
            acc.readings.push(r);
        }
    }
    Ok(Walked {
        poll: Poll {
            target: target.to_string(),
            components: acc.components,
            readings: acc.readings,
        },
        failed: acc.failed,
        misnamed: acc.misnamed,
        expanded,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenient_numbers() {
        assert_eq!(num(&serde_json::json!(35)), Some(35.0));
        assert_eq!(num(&serde_json::json!("35.000000")), Some(35.0));
        assert_eq!(num(&serde_json::json!(" 2.5 ")), Some(2.5));
        assert_eq!(num(&serde_json::json!("nan")), None);
        assert_eq!(num(&serde_json::json!("NaN")), None);
        assert_eq!(num(&serde_json::json!(null)), None);
        assert_eq!(num(&serde_json::json!("n/a")), None);
        assert_eq!(num(&serde_json::json!({"Reading": 1})), None);
    }

    #[test]
    fn sensor_thresholds_scale_with_the_reading() {
        let t = serde_json::json!({
            "UpperCritical": {"Reading": 1380, "Activation": "Increasing"},
            "UpperCaution": {"Reading": "1240"},
            "LowerFatal": {"Reading": null},
            "Bogus": {"Reading": 1}
        });
        assert_eq!(
            thresholds(Some(&t), 0.001),
            vec![("upper_caution", 1.24), ("upper_critical", 1.38)]
        );
        let legacy =
            serde_json::json!({"UpperThresholdCritical": 128, "LowerThresholdNonCritical": 5});
        assert_eq!(
            legacy_thresholds(&legacy, 1.0),
            vec![("upper_critical", 128.0), ("lower_caution", 5.0)]
        );
    }
}

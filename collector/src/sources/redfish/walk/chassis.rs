//! The chassis family: each chassis' Sensors, LeakDetectors, ThermalSubsystem (ThermalMetrics,
//! Fans, Pumps, CoolantConnectors, LeakDetection), EnvironmentMetrics, PowerSubsystem; then,
//! per kind of reading (temperatures, fans, power, voltages), the legacy Thermal and Power
//! for every kind the newer resources gave this chassis none of with a value. A chassis whose
//! tree has temperatures or fans and none readable says so.

use std::sync::Arc;

use serde_json::Value;

use super::Walker;
use super::map::{self, Chassis, Out, Owner, Part, link, strip, text};
use crate::model::bmc::{Component, Quantity};
use crate::model::lock;

/// The links of a chassis that lead to temperatures or fans.
const THERMAL_LINKS: [&str; 4] = [
    "Sensors",
    "ThermalSubsystem",
    "EnvironmentMetrics",
    "Thermal",
];

impl Walker {
    /// Records a chassis before any is traversed (sensors and reports refer to chassis by
    /// URL): a GPU's chassis takes its UUID.
    pub(super) fn register_chassis(&self, url: &str, doc: &Value) {
        let ids = self.ids();
        let gpu = self
            .model
            .gpu_by_identity(text(doc, "SerialNumber"), text(doc, "UUID"));
        let contained = doc
            .get("Links")
            .and_then(|l| l.get("ContainedBy"))
            .and_then(|c| c.get("@odata.id"))
            .and_then(Value::as_str)
            .map(|s| ids.of(strip(s)));
        let chassis = match gpu {
            Some(u) => Chassis {
                id: u,
                gpu: true,
                host: false,
            },
            None => Chassis {
                id: ids.of(url),
                gpu: false,
                host: map::is_host(doc),
            },
        };
        let component = Component {
            id: chassis.id.clone(),
            hw_type: if chassis.gpu { "gpu" } else { "enclosure" }.into(),
            name: text(doc, "Name").unwrap_or(url).to_string(),
            parent: contained.or_else(|| Some(self.target.clone())),
            model: text(doc, "Model").map(str::to_string),
            serial: text(doc, "SerialNumber").map(str::to_string),
            health: map::health(doc),
        };
        let mut acc = lock(&self.acc);
        acc.chassis.insert(url.to_string(), chassis);
        acc.seen.insert(url.to_string());
        if link(doc, "LeakDetectors").is_some() {
            acc.with_detectors.insert(url.to_string());
        }
        acc.add(Out {
            components: vec![component],
            ..Out::default()
        });
    }

    /// A part of `parent` (fan, pump, connector, filter, reservoir), read once.
    pub(super) fn part(&self, part: Part, url: &str, doc: &Value, parent: &str) {
        self.add(self.part_out(part, url, doc, parent));
    }

    fn part_out(&self, part: Part, url: &str, doc: &Value, parent: &str) -> Out {
        if self.first(url) {
            part.map(self.ids(), url, doc, parent)
        } else {
            Out::default()
        }
    }

    pub(super) fn leak_detector(&self, url: &str, doc: &Value, parent: &str) {
        if self.first(url) {
            self.add(map::leak_detector(self.ids(), url, doc, parent));
        }
    }

    pub(super) async fn leak_detection(
        self: &Arc<Self>,
        path: &str,
        parent: &str,
        chassis: Option<&str>,
    ) {
        let Some(doc) = self.get(path).await else {
            return;
        };
        // The detectors listed here are deprecated in favour of the chassis' own.
        let chassis_has = chassis.is_some_and(|c| lock(&self.acc).with_detectors.contains(c));
        if !chassis_has {
            for (url, d) in self.linked(&doc, "LeakDetectors", true).await {
                self.leak_detector(&url, &d, parent);
            }
        }
        self.add(map::leak_groups(self.ids(), &doc, parent));
    }

    pub(super) async fn chassis(self: Arc<Self>, url: String, doc: Value) {
        let ids = self.ids();
        let chassis = lock(&self.acc)
            .chassis
            .get(&url)
            .cloned()
            .unwrap_or_else(|| Chassis {
                id: ids.of(&url),
                gpu: false,
                host: map::is_host(&doc),
            });
        let id = chassis.id.as_str();
        // What the newer resources give this chassis, and which kinds its tree holds.
        let mut out = Out::default();
        let mut present = map::Kinds::default();
        for (u, d) in self.linked(&doc, "Sensors", true).await {
            let ty = text(&d, "ReadingType");
            present.temperature |= ty == Some("Temperature");
            present.fan |= ty == Some("Rotational") || text(&d, "PhysicalContext") == Some("Fan");
            if self.first(&u) {
                let r = map::sensor(ids, &u, &d, &chassis);
                let name = text(&d, "Name").unwrap_or(&u).to_string();
                lock(&self.acc)
                    .sensors
                    .insert(map::strip(&u).to_string(), (name, r.is_some()));
                out.readings.extend(r);
            }
        }
        for (u, d) in self.linked(&doc, "LeakDetectors", true).await {
            self.leak_detector(&u, &d, id);
        }
        if let Some(ts) = link(&doc, "ThermalSubsystem")
            && let Some(sub) = self.get(&ts).await
        {
            if let Some(tm) = link(&sub, "ThermalMetrics")
                && let Some(m) = self.get(&tm).await
            {
                present.temperature |= map::array(&m, "TemperatureReadingsCelsius")
                    .next()
                    .is_some();
                out.extend(map::thermal_metrics(ids, &tm, &m, &chassis));
            }
            for (key, part) in [
                ("Fans", Part::Fan),
                ("Pumps", Part::Pump),
                ("CoolantConnectors", Part::Connector),
            ] {
                for (u, d) in self.linked(&sub, key, true).await {
                    present.fan |= part == Part::Fan;
                    out.extend(self.part_out(part, &u, &d, id));
                }
            }
            if let Some(l) = link(&sub, "LeakDetection") {
                self.leak_detection(&l, id, Some(&url)).await;
            }
        }
        if let Some(e) = link(&doc, "EnvironmentMetrics")
            && let Some(env) = self.get(&e).await
        {
            let owner = Owner {
                id,
                hw_type: if chassis.gpu { "gpu" } else { "enclosure" },
                name: text(&doc, "Name").unwrap_or(&url),
                parent: None,
            };
            let mut env = map::environment(&env, owner);
            let scope = chassis.total_scope();
            for (_, r) in &mut env.excerpts {
                if matches!(r.quantity, Quantity::Power | Quantity::Energy) {
                    r.scope = scope;
                }
            }
            out.extend(env);
        }
        if let Some(ps) = link(&doc, "PowerSubsystem")
            && let Some(sub) = self.get(&ps).await
        {
            for (u, d) in self.linked(&sub, "PowerSupplies", true).await {
                if !self.first(&u) {
                    continue;
                }
                let metrics = match link(&d, "Metrics") {
                    Some(m) => self.get(&m).await,
                    None => None,
                };
                out.extend(map::power_supply(ids, &u, &d, id, metrics.as_ref()));
            }
        }
        self.legacy(&doc, &chassis, &mut out, &mut present).await;
        // A chassis with temperatures or fans in its tree and none read.
        let read = out.kinds();
        if (present.temperature || present.fan) && !read.temperature && !read.fan {
            let tried: Vec<&str> = THERMAL_LINKS
                .into_iter()
                .filter(|k| link(&doc, k).is_some())
                .collect();
            let name = text(&doc, "Name").unwrap_or(&url);
            lock(&self.acc).notes.push(format!(
                "chassis {name} ({url}): no temperature or fan could be read from {}",
                tried.join(", ")
            ));
        }
        self.add(out);
    }

    /// The legacy Thermal and Power of a chassis, for the kinds its newer resources did not
    /// give (`out`); what legacy Thermal holds is noted in `present`.
    async fn legacy(
        self: &Arc<Self>,
        doc: &Value,
        chassis: &Chassis,
        out: &mut Out,
        present: &mut map::Kinds,
    ) {
        let ids = self.ids();
        let id = chassis.id.as_str();
        let given = out.kinds();
        if (!given.temperature || !given.fan)
            && let Some(t) = link(doc, "Thermal")
            && let Some(th) = self.get(&t).await
        {
            present.temperature |= map::array(&th, "Temperatures").next().is_some();
            present.fan |= map::array(&th, "Fans").next().is_some();
            out.readings
                .extend(map::legacy_thermal(ids, &th, id).into_iter().filter(|r| {
                    if r.hw_type == "fan" {
                        !given.fan
                    } else {
                        !given.temperature
                    }
                }));
        }
        if (!given.power || !given.voltage)
            && let Some(p) = link(doc, "Power")
            && let Some(pw) = self.get(&p).await
        {
            let legacy = map::legacy_power(ids, &pw, chassis);
            if !given.power {
                out.readings.extend(legacy.power);
            }
            if !given.voltage {
                out.readings.extend(legacy.voltage);
            }
            out.components.extend(legacy.supplies);
        }
    }
}

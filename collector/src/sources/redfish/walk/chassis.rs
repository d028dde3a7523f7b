//! The chassis family: each chassis' Sensors, LeakDetectors, ThermalSubsystem (ThermalMetrics,
//! Fans, Pumps, CoolantConnectors, LeakDetection), EnvironmentMetrics, and legacy Thermal
//! where the newer resources gave nothing.

use std::sync::Arc;

use serde_json::Value;

use super::Walker;
use super::map::{self, Chassis, Out, Owner, Part, link, strip, text};
use crate::model::bmc::Component;
use crate::model::lock;

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
            Some(u) => Chassis { id: u, gpu: true },
            None => Chassis {
                id: ids.of(url),
                gpu: false,
            },
        };
        let component = Component {
            id: chassis.id.clone(),
            hw_type: if chassis.gpu { "gpu" } else { "chassis" }.into(),
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
        if self.first(url) {
            self.add(part.map(self.ids(), url, doc, parent));
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
        // What the newer resources gave this chassis (legacy Thermal is read where nothing).
        let mut found = 0usize;
        let chassis = lock(&self.acc)
            .chassis
            .get(&url)
            .cloned()
            .unwrap_or_else(|| Chassis {
                id: ids.of(&url),
                gpu: false,
            });
        let id = chassis.id.as_str();
        for (u, d) in self.linked(&doc, "Sensors", true).await {
            found += 1;
            if self.first(&u)
                && let Some(r) = map::sensor(ids, &u, &d, &chassis)
            {
                self.add(Out {
                    readings: vec![r],
                    ..Out::default()
                });
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
                found += map::array(&m, "TemperatureReadingsCelsius").count();
                self.add(map::thermal_metrics(ids, &tm, &m, &chassis));
            }
            for (key, part) in [
                ("Fans", Part::Fan),
                ("Pumps", Part::Pump),
                ("CoolantConnectors", Part::Connector),
            ] {
                for (u, d) in self.linked(&sub, key, true).await {
                    found += 1;
                    self.part(part, &u, &d, id);
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
                hw_type: if chassis.gpu { "gpu" } else { "chassis" },
                name: text(&doc, "Name").unwrap_or(&url),
                parent: None,
            };
            self.add(map::environment(&env, owner));
        }
        // Legacy Thermal where the newer resources gave nothing (absent, or linked but empty).
        if found == 0
            && let Some(t) = link(&doc, "Thermal")
            && let Some(th) = self.get(&t).await
        {
            self.add(Out {
                readings: map::legacy_thermal(ids, &th, id),
                ..Out::default()
            });
        }
    }
}

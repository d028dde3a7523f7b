//! The service-level families: ThermalEquipment (CDUs, immersion units, heat exchangers,
//! RPUs, cooling loops, with their connectors, pumps, filters, reservoirs and leak detection)
//! and the TelemetryService's metric reports.

use std::sync::Arc;

use serde_json::Value;

use super::map::{self, Owner, Part, link, strip, text};
use super::{Presence, Walker};
use crate::model::lock;

impl Walker {
    /// Every cooling unit and loop that `ThermalEquipment` lists.
    pub(super) async fn thermal_equipment(self: &Arc<Self>, doc: &Value) {
        for (key, t) in [
            ("CDUs", "cooling_unit"),
            ("ImmersionUnits", "cooling_unit"),
            ("HeatExchangers", "cooling_unit"),
            ("RPUs", "cooling_unit"),
            ("CoolingLoops", "cooling_loop"),
        ] {
            for (u, d) in self.linked(doc, key, false).await {
                self.clone().cooling_unit(u, d, t).await;
            }
        }
    }

    async fn cooling_unit(self: Arc<Self>, url: String, doc: Value, hw_type: &'static str) {
        if !self.first(&url) {
            return;
        }
        let ids = self.ids();
        let unit = map::cooling_unit(ids, &url, &doc, hw_type);
        let id = unit.components[0].id.clone();
        self.add(unit);
        let chassis = doc
            .get("Links")
            .and_then(|l| l.get("Chassis"))
            .and_then(|c| match c {
                Value::Array(a) => a.first().and_then(|x| x.get("@odata.id")),
                o => o.get("@odata.id"),
            })
            .and_then(Value::as_str)
            .map(|s| strip(s).to_string());
        for key in ["PrimaryCoolantConnectors", "SecondaryCoolantConnectors"] {
            for (u, d) in self.linked(&doc, key, true).await {
                self.part(Part::Connector, &u, &d, &id);
            }
        }
        for (u, d) in self.linked(&doc, "Pumps", true).await {
            self.part(Part::Pump, &u, &d, &id);
        }
        for (u, d) in self.linked(&doc, "Filters", true).await {
            self.part(Part::Filter, &u, &d, &id);
        }
        // Reservoirs: read where linked, and looked for where a unit forgets the link.
        let reservoirs = match link(&doc, "Reservoirs") {
            Some(l) => self.member_docs(&l, true).await,
            None => {
                self.docs_of(&format!("{url}/Reservoirs"), true, Presence::Guessed)
                    .await
            }
        };
        for (u, d) in reservoirs {
            self.part(Part::Reservoir, &u, &d, &id);
        }
        if let Some(e) = link(&doc, "EnvironmentMetrics")
            && let Some(env) = self.get(&e).await
        {
            let owner = Owner {
                id: &id,
                hw_type,
                name: text(&doc, "Name").unwrap_or(&url),
                parent: None,
            };
            self.add(map::environment(&env, owner));
        }
        if let Some(l) = link(&doc, "LeakDetection") {
            self.leak_detection(&l, &id, chassis.as_deref()).await;
        }
    }

    pub(super) async fn telemetry(self: &Arc<Self>, path: &str) {
        let Some(ts) = self.get(path).await else {
            return;
        };
        let Some(reports) = link(&ts, "MetricReports") else {
            return;
        };
        for (_, report) in self.member_docs(&reports, false).await {
            let out = map::metric_report(self.ids(), &report, |c| {
                lock(&self.acc).chassis.get(c).cloned()
            });
            self.add(out);
        }
    }
}

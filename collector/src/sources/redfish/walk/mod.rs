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
//!
//! Split by what it does: this file fetches (the walker, collections, the entry point);
//! `chassis` and `equipment` traverse one resource family each; `map` turns documents into
//! readings without I/O; `merge` decides which of two readings of one sensor is kept.

mod chassis;
mod equipment;
pub mod map;
mod merge;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::client::{Client, Error, MAX_MEMBERS};
use crate::internal_events::{InternalEvent, RedfishResourceSkipped};
use crate::model::bmc::{Component, Poll};
use crate::model::{Model, lock};
use map::{Ids, Out, link, strip, text};
use merge::Acc;

pub use map::num;

/// Whether a collection was linked by the service or guessed by Junction (where services
/// forget the link): a guessed one that is absent is no failure.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Presence {
    Linked,
    Guessed,
}

/// What one walk needs: the client, the target's name, whether to expand, the model (for the
/// GPUs it knows), and what has been gathered so far.
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
    fn ids(&self) -> Ids<'_> {
        Ids(&self.target)
    }

    fn add(&self, out: Out) {
        lock(&self.acc).add(out);
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
                acc.failed += 1;
                drop(acc);
                RedfishResourceSkipped {
                    target: &self.target,
                    path,
                    error_type: e.kind(),
                    error: &e,
                }
                .emit(&self.model);
            }
            e => {
                acc.fatal.get_or_insert(e);
            }
        }
    }

    fn expanding(&self) -> bool {
        self.expand && !self.client.expand_failed.load(Ordering::Relaxed)
    }

    /// A resource that a service may not have (a guessed path): absent (404) is no failure.
    async fn get_guessed(&self, path: &str) -> Option<Value> {
        match self.client.get(path).await {
            Ok(v) => Some(v),
            Err(Error::Status(404, _)) => None,
            Err(e) => {
                self.failure(path, e);
                None
            }
        }
    }

    /// A collection's members: (URL, the member's document when the collection was expanded).
    async fn members_of(
        &self,
        path: &str,
        expand: bool,
        presence: Presence,
    ) -> Vec<(String, Option<Value>)> {
        let doc = if expand && self.expanding() {
            let q = format!("{path}?$expand=.($levels=1)");
            match self.client.get(&q).await {
                Ok(v) => Some(v),
                // Refused: if the plain GET works, `$expand` is what the service cannot do
                // (advertised or not): plain GETs from now on. A collection that is simply
                // missing is no reason to stop expanding.
                Err(Error::Status(..)) => {
                    let plain = match presence {
                        Presence::Linked => self.get(path).await,
                        Presence::Guessed => self.get_guessed(path).await,
                    };
                    if plain.is_some() {
                        self.client.expand_failed.store(true, Ordering::Relaxed);
                    }
                    plain
                }
                Err(e) => {
                    self.failure(path, e);
                    None
                }
            }
        } else if presence == Presence::Guessed {
            self.get_guessed(path).await
        } else {
            self.get(path).await
        };
        let Some(doc) = doc else {
            return Vec::new();
        };
        let members = doc.get("Members").and_then(Value::as_array);
        if let Some(m) = members
            && m.len() > MAX_MEMBERS
        {
            tracing::warn!(
                collection = path,
                members = m.len(),
                read = MAX_MEMBERS,
                "a Redfish collection has more members than Junction reads; the rest are skipped"
            );
        }
        members
            .map(|m| {
                m.iter()
                    .take(MAX_MEMBERS)
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
        self.docs_of(path, expand, Presence::Linked).await
    }

    async fn docs_of(
        self: &Arc<Self>,
        path: &str,
        expand: bool,
        presence: Presence,
    ) -> Vec<(String, Value)> {
        let members = self.members_of(path, expand, presence).await;
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

    /// The documents of the collection `key` links to in `doc` (none where there is no link).
    async fn linked(
        self: &Arc<Self>,
        doc: &Value,
        key: &str,
        expand: bool,
    ) -> Vec<(String, Value)> {
        match link(doc, key) {
            Some(l) => self.member_docs(&l, expand).await,
            None => Vec::new(),
        }
    }
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
    w.add(Out {
        components: vec![Component {
            id: target.to_string(),
            hw_type: "bmc".into(),
            name: text(&root, "Product")
                .or_else(|| text(&root, "Name"))
                .unwrap_or(target)
                .to_string(),
            parent: None,
            model: text(&root, "Vendor").map(str::to_string),
            serial: text(&root, "UUID").map(str::to_string),
            health: None,
        }],
        ..Out::default()
    });
    // Chassis first (their sensors are what excerpts and reports refer to), in parallel.
    if let Some(c) = link(&root, "Chassis") {
        let docs = w.member_docs(&c, false).await;
        for (url, doc) in &docs {
            w.register_chassis(url, doc);
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
        w.thermal_equipment(&doc).await;
    }
    if let Some(t) = link(&root, "TelemetryService") {
        w.telemetry(&t).await;
    }
    let expanded = w.expanding();
    let acc = std::mem::take(&mut *lock(&w.acc));
    acc.finish(target, expanded)
}

#[cfg(test)]
mod tests;

//! What a walk gathers, and the rule that keeps one reading per sensor: a resource read in
//! its own right wins over every excerpt of it (`DataSourceUri`), and an excerpt reached twice
//! (a metric report and a ThermalMetrics array) is kept once.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::super::client::Error;
use super::Walked;
use super::map;
use super::map::{Chassis, Out};
use crate::model::bmc::{Component, Poll, Quantity, Reading, Scope};

/// What a walk has gathered so far.
#[derive(Default)]
pub struct Acc {
    components: Vec<Component>,
    readings: Vec<Reading>,
    /// Excerpts, kept until the end: dropped if their source was read as a resource.
    excerpts: Vec<(Option<String>, Reading)>,
    /// Resources read (by the URL they were fetched from).
    pub seen: HashSet<String>,
    /// Sensor resources fetched, by URL: their names, and whether each gave a reading.
    pub sensors: HashMap<String, (String, bool)>,
    /// Chassis URL → what the walk calls it.
    pub chassis: BTreeMap<String, Chassis>,
    /// Chassis that have a `LeakDetectors` collection (the deprecated one in LeakDetection is
    /// then not read).
    pub with_detectors: HashSet<String>,
    /// Resources whose declared `@odata.id` is not the URL they were fetched from.
    pub misnamed: Vec<(String, String)>,
    /// Sub-resources that failed.
    pub failed: u64,
    /// Notes for the operator (blind chassis).
    pub notes: Vec<String>,
    /// An error that fails the whole poll (credentials refused past the ServiceRoot, which
    /// services serve without authentication; TLS; the connection).
    pub fatal: Option<Error>,
}

type Key = (String, String, Option<&'static str>, String);

fn key(r: &Reading) -> Key {
    (
        r.id.clone(),
        r.name.clone(),
        r.point,
        format!("{:?}", r.quantity),
    )
}

impl Acc {
    /// Adds what documents gave.
    pub fn add(&mut self, out: Out) {
        self.components.extend(out.components);
        self.readings.extend(out.readings);
        self.excerpts.extend(out.excerpts);
    }

    /// The walk's result; the fatal error if there was one.
    pub fn finish(mut self, target: &str, expanded: bool) -> Result<Walked, Error> {
        if let Some(e) = self.fatal.take() {
            return Err(e);
        }
        let mut keys: HashSet<Key> = self.readings.iter().map(key).collect();
        let ids = map::Ids(target);
        // Sensors an excerpt of the host's total mirrors: the host's total too.
        let mut host_sensors = HashSet::new();
        for (source, mut r) in self.excerpts {
            if let Some(src) = &source {
                match self.sensors.get(src) {
                    // Its sensor was read with a value: reported once, as the sensor.
                    Some((_, true)) => {
                        if r.scope == Scope::Host {
                            host_sensors.insert(ids.of(src));
                        }
                        continue;
                    }
                    // Its sensor gave no reading (no units): the excerpt is what there is,
                    // named as the sensor is (a thermal margin is then known as one).
                    Some((name, false)) => {
                        r.name = name.clone();
                        if r.quantity == Quantity::Temperature
                            && map::temperature(name) == Quantity::Other
                        {
                            r.quantity = Quantity::Other;
                            r.hw_type = Quantity::Other.sensor_type().into();
                            r.unit = "Cel".into();
                        }
                    }
                    None if self.seen.contains(src) => continue,
                    None => {}
                }
            }
            if keys.insert(key(&r)) {
                self.readings.push(r);
            }
        }
        // A reading about one of this node's GPUs (an excerpt of its chassis' metrics) is
        // its own component, on the GPU: the GPU's hw.id is NVML's series' alone.
        let gpus: HashSet<&str> = self
            .chassis
            .values()
            .filter(|c| c.gpu)
            .map(|c| c.id.as_str())
            .collect();
        for r in &mut self.readings {
            if host_sensors.contains(&r.id) {
                r.scope = Scope::Host;
            }
            if gpus.contains(r.id.as_str()) {
                let gpu = std::mem::take(&mut r.id);
                r.id = format!("{target}:{gpu}/{}", r.name);
                r.hw_type = r.quantity.sensor_type().into();
                r.parent = Some(gpu);
            }
        }
        Ok(Walked {
            poll: Poll {
                target: target.to_string(),
                components: self.components,
                readings: self.readings,
                notes: self.notes,
                host: self.chassis.values().find(|c| c.host).map(|c| c.id.clone()),
            },
            failed: self.failed,
            misnamed: self.misnamed,
            expanded,
        })
    }
}

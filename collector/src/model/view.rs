//! One flattened view of a model snapshot, grouped by metric, that every sink renders: the
//! GPUs' samples with their `hw.id`, the per-GPU status samples, the agent's own samples and
//! every published sample set. Prometheus and OTLP export the same view, so they agree by
//! construction.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::health::Reason;
use super::{DriverInfo, GpuSlot, Metric, Model, REGISTRY, Sample, status_samples};

/// A snapshot of the model and the samples derived from it.
pub struct Snapshot {
    /// The GPU slots.
    pub gpus: Vec<GpuSlot>,
    per_gpu: Vec<Vec<Sample>>,
    node: Vec<Sample>,
    sets: Vec<Arc<Vec<Sample>>>,
}

impl Snapshot {
    /// Takes a snapshot (copies `Arc`s; never waits on a source).
    pub fn take(model: &Model) -> Self {
        let gpus = model.snapshot();
        let driver = model.driver();
        let sources: Vec<(&'static str, bool)> = model.sources().into_iter().collect();
        let health = model.health.all();
        let mut snap = Self::of(gpus, driver.as_ref(), &sources, model.sets(), &health);
        snap.node.extend(model.errors.samples());
        for (name, n) in model.events.counts() {
            snap.node
                .push(Sample::new(Metric::Events, n as f64).with("event.name", name));
        }
        snap
    }

    /// A snapshot of the given parts.
    pub fn of(
        gpus: Vec<GpuSlot>,
        driver: Option<&DriverInfo>,
        sources: &[(&'static str, bool)],
        sets: Vec<Arc<Vec<Sample>>>,
        health: &BTreeMap<String, Vec<Reason>>,
    ) -> Self {
        let per_gpu = gpus
            .iter()
            .map(|g| {
                let reasons = health.get(&g.info.uuid).map_or(&[][..], Vec::as_slice);
                status_samples(g, driver, reasons)
            })
            .collect();
        let mut node = Vec::new();
        for (source, up) in sources {
            node.push(
                Sample::new(Metric::SourceUp, f64::from(u8::from(*up)))
                    .with("junction.source", *source),
            );
        }
        Self {
            gpus,
            per_gpu,
            node,
            sets,
        }
    }

    /// Groups every sample by metric.
    pub fn view(&self) -> View<'_> {
        let mut by_metric: Vec<Vec<(&str, &Sample)>> = vec![Vec::new(); REGISTRY.len()];
        for (g, extra) in self.gpus.iter().zip(&self.per_gpu) {
            let id = g.info.uuid.as_str();
            for s in g.groups.iter().flat_map(|v| v.iter()).chain(extra) {
                by_metric[s.metric as usize].push((id, s));
            }
        }
        for s in self
            .node
            .iter()
            .chain(self.sets.iter().flat_map(|v| v.iter()))
        {
            by_metric[s.metric as usize].push(("", s));
        }
        View { by_metric }
    }
}

/// Samples grouped by metric, each with the `hw.id` of its GPU ("" for samples that carry
/// their own `hw.id` or none).
pub struct View<'a> {
    by_metric: Vec<Vec<(&'a str, &'a Sample)>>,
}

impl<'a> View<'a> {
    /// Every metric with samples, in registry order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &[(&'a str, &'a Sample)])> {
        self.by_metric
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_empty())
            .map(|(i, v)| (i, v.as_slice()))
    }
}

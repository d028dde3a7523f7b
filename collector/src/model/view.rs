//! One flattened view of a model snapshot, grouped by metric, that every sink renders: the
//! GPUs' samples with their `hw.id`, the per-GPU status samples, the agent's own samples and
//! every published sample set. Prometheus and OTLP export the same view, so they agree by
//! construction.

use std::collections::BTreeMap;
use std::sync::Arc;

use std::sync::atomic::{AtomicBool, Ordering};

use super::health::Reason;
use super::{
    AttrValue, DriverInfo, GpuInfo, GpuSlot, Metric, Model, REGISTRY, Sample, info_sample,
    status_samples,
};

/// Whether a GPU's series of the conventions carry its identity (`[sinks]
/// identity_attributes`; set once at start).
static IDENTITY: AtomicBool = AtomicBool::new(true);

/// Turns the identity attributes on the GPU's series of the conventions on or off.
pub fn set_identity_attributes(on: bool) {
    IDENTITY.store(on, Ordering::Relaxed);
}

/// Whether a metric's GPU series carry the GPU's identity: the conventions' GPU metrics and
/// their GPU refinements (`metric_attributes.hw.gpu`: hw.gpu.*, hw.errors, hw.status), and
/// the GPU's hw.power / hw.energy.
pub fn takes_identity(metric: usize) -> bool {
    // Decided once per metric, not per series on every scrape and export.
    static TAKES: std::sync::OnceLock<Vec<bool>> = std::sync::OnceLock::new();
    TAKES.get_or_init(|| {
        REGISTRY
            .iter()
            .map(|d| {
                d.name.starts_with("hw.gpu.")
                    || matches!(d.name, "hw.errors" | "hw.status" | "hw.power" | "hw.energy")
            })
            .collect()
    })[metric]
}

/// The identity attributes the conventions recommend on a GPU's series (`hw.vendor`,
/// `hw.model`, `hw.name`, `hw.serial_number`, `hw.driver_version`, `hw.firmware_version`),
/// the values `gpu.info` carries; empty ones left out.
fn identity(g: &GpuSlot, driver: Option<&DriverInfo>) -> Vec<(&'static str, AttrValue)> {
    let mut out: Vec<(&'static str, AttrValue)> = vec![
        ("hw.vendor", "nvidia".into()),
        ("hw.model", g.info.name.clone().into()),
        ("hw.name", g.info.name.clone().into()),
    ];
    if let Some(s) = g.info.serial.as_ref().filter(|s| !s.is_empty()) {
        out.push(("hw.serial_number", s.clone().into()));
    }
    if let Some(d) = driver.filter(|d| !d.driver_version.is_empty()) {
        out.push(("hw.driver_version", d.driver_version.clone().into()));
    }
    if let Some(v) = g.info.vbios.as_ref().filter(|v| !v.is_empty()) {
        out.push(("hw.firmware_version", v.clone().into()));
    }
    out
}

/// The identity attribute keys ([`identity`]): a sample that names one itself keeps its own
/// value, and the GPU's is written for the others only.
pub const IDENTITY_KEYS: [&str; 6] = [
    "hw.vendor",
    "hw.model",
    "hw.name",
    "hw.serial_number",
    "hw.driver_version",
    "hw.firmware_version",
];

/// Whether a sample names an identity attribute itself (then only the GPU's others are added).
pub fn names_identity(s: &Sample) -> bool {
    s.attrs
        .iter()
        .any(|(k, _)| k.starts_with("hw.") && IDENTITY_KEYS.contains(k))
}

/// A snapshot of the model and the samples derived from it.
pub struct Snapshot {
    /// The GPU slots.
    pub gpus: Vec<GpuSlot>,
    per_gpu: Vec<Vec<Sample>>,
    /// Each GPU's `gpu.info` sample and identity attributes (see [`Described`]).
    described: Vec<Described>,
    node: Vec<Sample>,
    sets: Vec<Arc<Vec<Sample>>>,
}

/// What a snapshot derives from a GPU's identity and the driver's versions alone: its
/// `gpu.info` sample and its identity attributes. Made again for every snapshot, they were
/// sixteen strings copied and freed a GPU at every scrape and export; they are kept instead
/// ([`described`]) for as long as the GPU's `GpuInfo` (held here, so its address is not
/// reused) and the driver's versions are the same. A GPU's `GpuInfo` is never changed in
/// place: a GPU found anew has a new one.
#[derive(Clone)]
struct Described {
    info: Arc<GpuInfo>,
    /// The driver's and CUDA's versions the sample carries.
    driver: Option<(String, Option<String>)>,
    sample: Arc<Sample>,
    identity: Arc<Vec<(&'static str, AttrValue)>>,
}

/// The [`Described`] of every GPU that a model or a snapshot still holds (an entry whose
/// `GpuInfo` only this cache holds goes at the next snapshot): as many as the node has GPUs.
static DESCRIBED: std::sync::Mutex<Vec<Described>> = std::sync::Mutex::new(Vec::new());

/// Each of `gpus`' [`Described`], from the cache where its identity and the driver's
/// versions are unchanged.
fn described(gpus: &[GpuSlot], driver: Option<&DriverInfo>) -> Vec<Described> {
    let versions = driver.map(|d| (d.driver_version.as_str(), d.cuda_version.as_deref()));
    let make = |g: &GpuSlot| Described {
        info: g.info.clone(),
        driver: driver.map(|d| (d.driver_version.clone(), d.cuda_version.clone())),
        sample: Arc::new(info_sample(&g.info, driver)),
        identity: Arc::new(identity(g, driver)),
    };
    let mut cache = super::lock(&DESCRIBED);
    cache.retain(|d| Arc::strong_count(&d.info) > 1);
    gpus.iter()
        .enumerate()
        .map(|(i, g)| {
            // The GPUs come in the same order each time: the entry is mostly at `i`.
            let at = match cache.get(i) {
                Some(d) if Arc::ptr_eq(&d.info, &g.info) => Some(i),
                _ => cache.iter().position(|d| Arc::ptr_eq(&d.info, &g.info)),
            };
            match at {
                Some(at) => {
                    let d = &mut cache[at];
                    if d.driver.as_ref().map(|(v, c)| (v.as_str(), c.as_deref())) != versions {
                        *d = make(g);
                    }
                    d.clone()
                }
                None => {
                    let d = make(g);
                    cache.push(d.clone());
                    d
                }
            }
        })
        .collect()
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
                status_samples(g, reasons)
            })
            .collect();
        let described = described(&gpus, driver);
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
            described,
            node,
            sets,
        }
    }

    /// Every sample, with its GPU's `hw.id` ("" for the node's).
    fn each<'s>(&'s self, mut f: impl FnMut(&'s str, &'s Sample)) {
        for ((g, extra), d) in self.gpus.iter().zip(&self.per_gpu).zip(&self.described) {
            let id = g.info.uuid.as_str();
            for group in &g.groups {
                for s in group.iter() {
                    f(id, s);
                }
            }
            f(id, &d.sample);
            for s in extra {
                f(id, s);
            }
        }
        for s in &self.node {
            f("", s);
        }
        for set in &self.sets {
            for s in set.iter() {
                f("", s);
            }
        }
    }

    /// Groups every sample by metric.
    pub fn view(&self) -> View<'_> {
        self.view_in(Lists::default())
    }

    /// Groups every sample by metric in `lists`, the lists of an earlier view given back
    /// ([`View::give_back`]): a sink that views the model every interval keeps them, so
    /// that a view allocates nothing once they are at the node's size (64 GPUs: 400 KB,
    /// faulted in anew at every export and every scrape before).
    pub fn view_in(&self, Lists(lists): Lists) -> View<'_> {
        // Counted first, so that each metric's list is allocated at most once, at its size:
        // grown by doubling, the 64-GPU node's largest lists were copied into new pages on
        // every scrape.
        let mut counts = vec![0usize; REGISTRY.len()];
        self.each(|_, s| counts[s.metric as usize] += 1);
        // An empty list of `'static` references is one of any shorter lifetime.
        let mut by_metric: Vec<Vec<(&str, &Sample)>> = lists;
        by_metric.resize_with(REGISTRY.len(), Vec::new);
        for (list, n) in by_metric.iter_mut().zip(counts) {
            if list.capacity() > 2 * n + 64 {
                // What a burst (a thousand processes) left is not kept for good.
                list.shrink_to(n);
            }
            // Grown by doubling where a count rose (a process started): not again at every
            // series more.
            list.reserve(n);
        }
        self.each(|id, s| by_metric[s.metric as usize].push((id, s)));
        // Off (`[sinks] identity_attributes = false`): no GPU's series carry it.
        let on = IDENTITY.load(Ordering::Relaxed);
        let identity = self
            .gpus
            .iter()
            .zip(&self.described)
            .map(|(g, d)| {
                let attrs = if on { d.identity.as_slice() } else { &[] };
                (g.info.uuid.as_str(), attrs)
            })
            .collect();
        View {
            by_metric,
            identity,
            last: std::cell::Cell::new(0),
        }
    }
}

/// A view's lists, emptied and kept between views (see [`Snapshot::view_in`]).
#[derive(Default)]
pub struct Lists(Vec<Vec<(&'static str, &'static Sample)>>);

impl Lists {
    /// The entries the lists have room for.
    pub fn capacity(&self) -> usize {
        self.0.iter().map(Vec::capacity).sum()
    }
}

/// An emptied list of a view's entries as one of `'static` entries: the same allocation,
/// since the two types differ in lifetimes alone (the standard library collects a `Vec`'s
/// own iterator into a `Vec` of a type of the same size and alignment in place).
fn emptied<'a>(mut list: Vec<(&'a str, &'a Sample)>) -> Vec<(&'static str, &'static Sample)> {
    list.clear();
    list.into_iter()
        .map(|_| unreachable!("the list was cleared"))
        .collect()
}

/// Samples grouped by metric, each with the `hw.id` of its GPU ("" for samples that carry
/// their own `hw.id` or none).
pub struct View<'a> {
    by_metric: Vec<Vec<(&'a str, &'a Sample)>>,
    identity: Vec<(&'a str, &'a [(&'static str, AttrValue)])>,
    /// Where in `identity` the last GPU was found: a metric's samples go GPU by GPU, so the
    /// next is that one or the one after it (64 GPUs: no search of 64 on every series).
    last: std::cell::Cell<usize>,
}

impl<'a> View<'a> {
    /// The view's lists, emptied, for the next view ([`Snapshot::view_in`]).
    pub fn give_back(self) -> Lists {
        Lists(self.by_metric.into_iter().map(emptied).collect())
    }

    /// Every metric with samples, in registry order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &[(&'a str, &'a Sample)])> {
        self.by_metric
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_empty())
            .map(|(i, v)| (i, v.as_slice()))
    }

    /// The attributes a sample of `metric` on the GPU `gpu` carries besides its own: the
    /// GPU's identity where the metric takes it and the sample has no `hw.id` of its own (a
    /// MIG instance's, a fan's).
    pub fn extra(&self, metric: usize, gpu: &str, s: &Sample) -> &'a [(&'static str, AttrValue)] {
        if s.attr("hw.id").is_some() {
            return &[];
        }
        self.identity_of(metric, gpu)
    }

    /// The GPU's identity attributes where `metric` takes them, for a sample without a
    /// `hw.id` of its own (the caller has checked).
    pub fn identity_of(&self, metric: usize, gpu: &str) -> &'a [(&'static str, AttrValue)] {
        if gpu.is_empty() || !takes_identity(metric) {
            return &[];
        }
        // The view's samples carry the snapshot's own strings: found by address, else by
        // value.
        let last = self.last.get();
        let at = |i: usize| {
            self.identity
                .get(i)
                .filter(|(id, _)| std::ptr::eq(id.as_ptr(), gpu.as_ptr()) && id.len() == gpu.len())
        };
        if let Some((_, i)) = at(last) {
            return i;
        }
        if let Some((_, i)) = at(last + 1) {
            self.last.set(last + 1);
            return i;
        }
        match self
            .identity
            .iter()
            .position(|(id, _)| std::ptr::eq(id.as_ptr(), gpu.as_ptr()))
            .or_else(|| self.identity.iter().position(|(id, _)| *id == gpu))
        {
            Some(p) => {
                self.last.set(p);
                self.identity[p].1
            }
            None => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot of one source and `n` samples of each of two metrics.
    fn snapshot(n: usize) -> Snapshot {
        let set = (0..n)
            .flat_map(|i| {
                [
                    Sample::new(Metric::SinkExports, i as f64).with("junction.sink", i.to_string()),
                    Sample::new(Metric::SinkExportFailures, 0.0)
                        .with("junction.sink", i.to_string()),
                ]
            })
            .collect();
        Snapshot::of(
            Vec::new(),
            None,
            &[("nvml", true)],
            vec![Arc::new(set)],
            &BTreeMap::new(),
        )
    }

    /// A metric's entries as (GPU, value, attributes).
    type Entries = Vec<(String, f64, String)>;

    fn entries(view: &View<'_>) -> Vec<(usize, Entries)> {
        view.iter()
            .map(|(i, list)| {
                let list = list
                    .iter()
                    .map(|(id, s)| (id.to_string(), s.value, format!("{:?}", s.attrs)))
                    .collect();
                (i, list)
            })
            .collect()
    }

    /// A GPU's `gpu.info` sample and identity are made once and shared by later snapshots
    /// while its identity and the driver's versions stay; made again, with the new values,
    /// when the driver's version changes or the GPU is another (a new `GpuInfo`).
    #[test]
    fn a_gpus_info_and_identity_are_kept_until_they_change() {
        let gpu = |serial: &str| {
            crate::model::GpuSlot::new(GpuInfo {
                uuid: format!("GPU-kept-{serial}"),
                name: "H100".into(),
                serial: Some(serial.into()),
                ..GpuInfo::default()
            })
        };
        let driver = |v: &str| DriverInfo {
            driver_version: v.into(),
            cuda_version: Some("12.8".into()),
            nvml_version: None,
        };
        let take = |g: &crate::model::GpuSlot, d: &DriverInfo| {
            Snapshot::of(vec![g.clone()], Some(d), &[], Vec::new(), &BTreeMap::new())
        };
        let info = |snap: &Snapshot| {
            let view = snap.view();
            let (_, list) = view
                .iter()
                .find(|(i, _)| *i == Metric::Info as usize)
                .expect("gpu.info");
            assert_eq!(list.len(), 1);
            let s = list[0].1;
            (s as *const Sample, s.attrs.clone())
        };
        let a = gpu("1650");
        let first = take(&a, &driver("570.86.15"));
        let (at, attrs) = info(&first);
        assert!(attrs.contains(&("hw.serial_number", "1650".into())));
        assert!(attrs.contains(&("hw.driver_version", "570.86.15".into())));
        assert_eq!(first.described[0].identity[1], ("hw.model", "H100".into()));
        // The same GPU and driver: the same sample, not a copy.
        let again = take(&a, &driver("570.86.15"));
        assert_eq!(info(&again).0, at);
        assert!(Arc::ptr_eq(
            &first.described[0].identity,
            &again.described[0].identity
        ));
        // Another driver version: made again.
        let (_, attrs) = info(&take(&a, &driver("580.65.06")));
        assert!(attrs.contains(&("hw.driver_version", "580.65.06".into())));
        // Another GPU under the same uuid and driver: its own serial.
        let (_, attrs) = info(&take(&gpu("1651"), &driver("580.65.06")));
        assert!(attrs.contains(&("hw.serial_number", "1651".into())));
        assert!(!attrs.contains(&("hw.serial_number", "1650".into())));
    }

    #[test]
    fn a_view_in_kept_lists_is_the_view_and_allocates_nothing_once_they_are_at_size() {
        let big = snapshot(500);
        let view = big.view_in(Lists::default());
        assert_eq!(entries(&view), entries(&big.view()));
        let lists = view.give_back();
        let room = lists.capacity();
        assert!(room >= 1001, "room for every entry: {room}");
        // The lists given back are the ones the view filled: same allocation, emptied.
        let at: Vec<*const u8> = lists.0.iter().map(|l| l.as_ptr().cast()).collect();
        assert!(lists.0.iter().all(Vec::is_empty));

        // A later snapshot (other references, other lifetimes) fills the same lists.
        let again = snapshot(500);
        let view = again.view_in(lists);
        assert_eq!(entries(&view), entries(&again.view()));
        let lists = view.give_back();
        assert_eq!(lists.capacity(), room);
        let same: Vec<*const u8> = lists.0.iter().map(|l| l.as_ptr().cast()).collect();
        assert_eq!(same, at, "no list was allocated anew");

        // A much smaller state lets what the larger one needed go.
        let small = snapshot(10);
        let view = small.view_in(lists);
        assert_eq!(entries(&view), entries(&small.view()));
        let lists = view.give_back();
        assert!(
            lists.capacity() < room / 4,
            "{} of {room}",
            lists.capacity()
        );
    }
}

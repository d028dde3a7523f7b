//! The node model: inventory, the latest samples per GPU and group, and per-GPU state.
//! Sources write into it; sinks read snapshots of it. Sources never talk to sinks.

pub mod bmc;
pub mod events;
pub mod fabric;
pub mod health;
pub mod history;
pub mod naming;
pub mod processes;
pub mod registry;
pub mod signatures;
pub mod state;
pub mod view;
pub mod xid;
pub mod xid_catalog;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

pub use registry::{Group, Metric, REGISTRY};

/// An attribute value: static for enums, owned for ids and names.
pub type AttrValue = Cow<'static, str>;

/// A sample's attributes: up to three held inline (most samples have one to three: a link
/// and an error type, a clock domain), so that collecting a sample allocates nothing for
/// them; more spill to the heap.
pub type Attrs = smallvec::SmallVec<[(&'static str, AttrValue); 3]>;

/// One data point.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Which metric.
    pub metric: Metric,
    /// Attributes besides the GPU's `hw.id` (which the sinks add unless `hw.id` is here).
    pub attrs: Attrs,
    /// The value, in the registry's unit.
    pub value: f64,
}

impl Sample {
    /// A sample with no extra attributes.
    pub fn new(metric: Metric, value: f64) -> Self {
        Self {
            metric,
            attrs: Attrs::new(),
            value,
        }
    }

    /// Adds an attribute.
    pub fn with(mut self, key: &'static str, value: impl Into<AttrValue>) -> Self {
        self.attrs.push((key, value.into()));
        self
    }

    /// The value of an attribute.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_ref())
    }
}

/// Identity of a GPU, read once when the source is built.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct GpuInfo {
    /// NVML index.
    pub index: u32,
    /// `GPU-…` UUID: `hw.id`.
    pub uuid: String,
    /// Product name.
    pub name: String,
    /// Board serial, when the board has an infoROM.
    pub serial: Option<String>,
    /// PCI bus id normalised to `dddd:bb:dd.f`.
    pub pci_bus_id: String,
    /// Minor number (`/dev/nvidiaN`).
    pub minor_number: Option<u32>,
    /// VBIOS version.
    pub vbios: Option<String>,
}

/// `hw.status` states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Working.
    Ok,
    /// Working but impaired (e.g. an NVML call is stuck).
    Degraded,
    /// Not working (e.g. fallen off the bus).
    Failed,
    /// Expected to fail.
    PredictedFailure,
}

impl HealthState {
    /// Every state, for the `hw.status` state set.
    pub const ALL: [HealthState; 4] = [
        HealthState::Ok,
        HealthState::Degraded,
        HealthState::Failed,
        HealthState::PredictedFailure,
    ];

    /// The `hw.state` value.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Ok => "ok",
            HealthState::Degraded => "degraded",
            HealthState::Failed => "failed",
            HealthState::PredictedFailure => "predicted_failure",
        }
    }
}

/// A feature of a GPU that can be unsupported on its own: an NVML call, optionally for one
/// link, fan or counter index, so that one unsupported link does not switch off its siblings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Feature {
    /// The feature (also the `junction.stage` of its errors).
    pub name: &'static str,
    /// The link, fan or other index it applies to.
    pub index: Option<u32>,
}

impl Feature {
    /// A feature at an index (an NVLink link, a fan).
    pub const fn at(name: &'static str, index: u32) -> Self {
        Self {
            name,
            index: Some(index),
        }
    }
}

impl Feature {
    /// The name's length and its first and last eight bytes with the index, mixed into a
    /// word (not the whole name: the NVML collector looks a feature up before every call; names
    /// that share all of these only share a bucket, and equality still compares the whole
    /// name). By the name's text, not its address: equal features need not share one.
    pub fn digest(&self) -> u64 {
        let b = self.name.as_bytes();
        // Two 8-byte loads (names of eight bytes and more: nearly all), else one padded word.
        let (first, last) = match (b.first_chunk::<8>(), b.last_chunk::<8>()) {
            (Some(head), Some(tail)) => (u64::from_le_bytes(*head), u64::from_le_bytes(*tail)),
            _ => {
                let mut w = [0u8; 8];
                w[..b.len()].copy_from_slice(b);
                (u64::from_le_bytes(w), 0)
            }
        };
        first
            ^ last.rotate_left(29)
            ^ (b.len() as u64).rotate_left(50)
            ^ u64::from(self.index.unwrap_or(u32::MAX)).rotate_left(13)
    }
}

/// Hashes [`Feature::digest`].
impl std::hash::Hash for Feature {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.digest());
    }
}

impl From<&'static str> for Feature {
    fn from(name: &'static str) -> Self {
        Self { name, index: None }
    }
}

impl std::fmt::Display for Feature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.index {
            Some(i) => write!(f, "{}[{i}]", self.name),
            None => f.write_str(self.name),
        }
    }
}

impl serde::Serialize for Feature {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// What the model holds for one GPU.
#[derive(Debug, Clone)]
pub struct GpuSlot {
    /// Identity (shared: a snapshot copies the pointer, not the strings).
    pub info: Arc<GpuInfo>,
    /// Latest samples per group (index = [`Group::index`]).
    pub groups: Vec<Arc<Vec<Sample>>>,
    /// Features disabled on this GPU and why (NOT_SUPPORTED, symbol missing); shared, so
    /// that a snapshot does not copy it (it changes when a feature is disabled or re-probed).
    pub disabled: Arc<BTreeMap<Feature, String>>,
    /// An NVML call running past its deadline: the call and since when.
    pub stuck: Option<(&'static str, Instant)>,
    /// NVML calls that ran past the deadline.
    pub timeouts: u64,
    /// Failed reads per feature.
    pub errors: BTreeMap<&'static str, u64>,
}

impl GpuSlot {
    pub(crate) fn new(info: GpuInfo) -> Self {
        Self {
            info: Arc::new(info),
            groups: Group::ALL.iter().map(|_| Arc::new(Vec::new())).collect(),
            disabled: Arc::default(),
            stuck: None,
            timeouts: 0,
            errors: BTreeMap::new(),
        }
    }
}

/// Sample sets that are not a GPU's NVML groups, keyed by (owner, key): a sink's own
/// telemetry, a BMC target's components. An owner replaces a whole set at once.
type Sets = BTreeMap<(&'static str, String), Arc<Vec<Sample>>>;

/// The node model shared by sources and sinks.
#[derive(Debug, Default)]
pub struct Model {
    gpus: Mutex<Vec<Arc<Mutex<GpuSlot>>>>,
    sources: Mutex<BTreeMap<&'static str, bool>>,
    source_details: Mutex<BTreeMap<&'static str, Vec<String>>>,
    bmc: Mutex<BTreeMap<(&'static str, String), Arc<bmc::Poll>>>,
    driver: Mutex<Option<DriverInfo>>,
    sets: Mutex<Sets>,
    /// Events: health transitions, XIDs, …
    pub events: events::EventLog,
    /// Why each GPU is not ok.
    pub health: health::Health,
    /// What the NICs and the PCIe bus say about each GPU, and each GPU's rail.
    pub fabric: fabric::Fabric,
    /// What happened to each GPU across boots (the state directory's `history.jsonl`).
    pub history: history::History,
    /// XID counters and checkpoints.
    pub xids: xid::Xids,
    /// Who each pid is (name, container, pod), shared by per-process sources.
    pub processes: processes::Processes,
    /// Failed reads of every source (`junction_source_errors_total`).
    pub errors: crate::internal_events::Errors,
    /// Set once the GPU inventory is known (NVML has listed the GPUs, or failed to).
    inventory: (Mutex<bool>, std::sync::Condvar),
}

/// Driver-level identity.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DriverInfo {
    /// Driver version.
    pub driver_version: String,
    /// CUDA driver version, e.g. "12.4".
    pub cuda_version: Option<String>,
    /// NVML version.
    pub nvml_version: Option<String>,
}

/// Locks a mutex, recovering from poisoning (a panicked writer leaves consistent data here:
/// every write is a whole-value replacement).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Model {
    /// An empty model.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Adds a GPU to the inventory and returns its slot.
    pub fn add_gpu(&self, info: GpuInfo) -> Arc<Mutex<GpuSlot>> {
        let slot = Arc::new(Mutex::new(GpuSlot::new(info)));
        lock(&self.gpus).push(slot.clone());
        slot
    }

    /// Says that the GPU inventory is known (or will not be): what maps PCI addresses to
    /// GPUs may start.
    pub fn set_inventory_known(&self) {
        *lock(&self.inventory.0) = true;
        self.inventory.1.notify_all();
    }

    /// Waits until the GPU inventory is known, at most `limit`; true if it is.
    pub fn wait_inventory(&self, limit: std::time::Duration) -> bool {
        let g = lock(&self.inventory.0);
        let (g, _) = self
            .inventory
            .1
            .wait_timeout_while(g, limit, |known| !*known)
            .unwrap_or_else(|e| e.into_inner());
        *g
    }

    /// [`Model::wait_inventory`] that stops waiting when `shutdown` is triggered: Some(known)
    /// after the wait, None if shutting down (a thread waiting for a hung NVML must not hold
    /// up SIGTERM).
    pub fn wait_inventory_unless(
        &self,
        limit: std::time::Duration,
        shutdown: &crate::shutdown::Shutdown,
    ) -> Option<bool> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.wait_inventory(left.min(std::time::Duration::from_millis(100))) {
                return Some(true);
            }
            if shutdown.is_triggered() {
                return None;
            }
            if left.is_zero() {
                return Some(false);
            }
        }
    }

    /// Records driver identity.
    pub fn set_driver(&self, d: DriverInfo) {
        *lock(&self.driver) = Some(d);
    }

    /// Driver identity, if a source has set it.
    pub fn driver(&self) -> Option<DriverInfo> {
        lock(&self.driver).clone()
    }

    /// Records whether a source is up.
    pub fn set_source_up(&self, source: &'static str, up: bool) {
        lock(&self.sources).insert(source, up);
    }

    /// Records what a source says about itself for `junction inventory` (how it is attached,
    /// why it is off).
    pub fn set_source_detail(&self, source: &'static str, lines: Vec<String>) {
        lock(&self.source_details).insert(source, lines);
    }

    /// What each source said about itself.
    pub fn source_details(&self) -> BTreeMap<&'static str, Vec<String>> {
        lock(&self.source_details).clone()
    }

    /// Records what one poll of a BMC target produced and publishes its samples (replacing
    /// the target's previous ones).
    pub fn set_bmc(&self, source: &'static str, poll: bmc::Poll) {
        self.publish(source, poll.target.clone(), poll.samples());
        lock(&self.bmc).insert((source, poll.target.clone()), Arc::new(poll));
    }

    /// The latest poll of every BMC target, by source.
    pub fn bmc_polls(&self) -> Vec<(&'static str, Arc<bmc::Poll>)> {
        lock(&self.bmc)
            .iter()
            .map(|((s, _), p)| (*s, p.clone()))
            .collect()
    }

    /// The UUID of the GPU with this board serial number or UUID (how a BMC names a GPU).
    pub fn gpu_by_identity(&self, serial: Option<&str>, uuid: Option<&str>) -> Option<String> {
        let serial = serial.map(str::trim).filter(|s| !s.is_empty());
        let uuid = uuid
            .map(|u| u.trim().trim_start_matches("GPU-").to_ascii_lowercase())
            .filter(|u| !u.is_empty());
        self.gpus().iter().find_map(|g| {
            let info = &lock(g).info;
            let by_serial = serial.is_some() && info.serial.as_deref().map(str::trim) == serial;
            let by_uuid = uuid
                .as_deref()
                .is_some_and(|u| info.uuid.trim_start_matches("GPU-").to_ascii_lowercase() == u);
            (by_serial || by_uuid).then(|| info.uuid.clone())
        })
    }

    /// Source up flags.
    pub fn sources(&self) -> BTreeMap<&'static str, bool> {
        lock(&self.sources).clone()
    }

    /// The GPU slots.
    pub fn gpus(&self) -> Vec<Arc<Mutex<GpuSlot>>> {
        lock(&self.gpus).clone()
    }

    /// A consistent copy of every GPU slot (cheap: samples are shared `Arc`s).
    pub fn snapshot(&self) -> Vec<GpuSlot> {
        self.gpus().iter().map(|s| lock(s).clone()).collect()
    }

    /// Replaces the sample set `key` of `owner`. Samples carry their own `hw.id` (or none,
    /// for node-level samples).
    pub fn publish(&self, owner: &'static str, key: impl Into<String>, samples: Vec<Sample>) {
        lock(&self.sets).insert((owner, key.into()), Arc::new(samples));
    }

    /// Every sample set (cheap: shared `Arc`s).
    pub fn sets(&self) -> Vec<Arc<Vec<Sample>>> {
        lock(&self.sets).values().cloned().collect()
    }

    /// Raises a health reason for the GPU `hw_id` (an event if its state changes).
    pub fn raise(
        &self,
        hw_id: &str,
        code: health::Code,
        state: HealthState,
        action: health::Action,
        detail: impl Into<String>,
    ) {
        let reason = health::Reason {
            code,
            state,
            detail: detail.into(),
            action,
            since: std::time::SystemTime::now(),
        };
        let detail = reason.detail.clone();
        // Every reason that is new to the GPU is remembered, whether or not its state moves.
        let (_, new) = self.health.raise_reason(&self.events, hw_id, reason);
        if new {
            self.remember(
                hw_id,
                "health",
                format!("{}:{}", state.as_str(), code.as_str()),
                &detail,
            );
        }
    }

    /// Clears a health reason of the GPU `hw_id`.
    pub fn clear(&self, hw_id: &str, code: health::Code) {
        if self
            .health
            .clear_reason(&self.events, hw_id, code)
            .is_some()
        {
            let now = health::verdict(&self.health.reasons(hw_id));
            self.remember(
                hw_id,
                "health",
                format!("{}:{}-cleared", now.as_str(), code.as_str()),
                "",
            );
        }
    }
}

impl Model {
    /// Appends to the event history.
    pub fn remember(&self, id: &str, kind: &str, code: impl Into<String>, detail: &str) {
        self.history
            .append(history::Entry::now(&self.boot_id(), id, kind, code, detail));
    }
}

/// A GPU's `gpu.info` sample: its identity and the driver's versions. It changes only with
/// them, so a snapshot takes it from [`view`]'s cache rather than making it again.
pub fn info_sample(info: &GpuInfo, driver: Option<&DriverInfo>) -> Sample {
    Sample::new(Metric::Info, 1.0)
        .with("hw.name", info.name.clone())
        .with("hw.vendor", "nvidia")
        .with("hw.model", info.name.clone())
        .with("hw.serial_number", info.serial.clone().unwrap_or_default())
        .with(
            "hw.driver_version",
            driver.map(|d| d.driver_version.clone()).unwrap_or_default(),
        )
        .with(
            "hw.firmware_version",
            info.vbios.clone().unwrap_or_default(),
        )
        .with("gpu.index", info.index.to_string())
        .with(
            "gpu.minor_number",
            info.minor_number.map(|m| m.to_string()).unwrap_or_default(),
        )
        .with("gpu.pci.bdf", info.pci_bus_id.clone())
        .with(
            "gpu.cuda_driver_version",
            driver
                .and_then(|d| d.cuda_version.clone())
                .unwrap_or_default(),
        )
}

/// The samples that describe a slot's state and the agent's view of it (always present),
/// but `gpu.info` ([`info_sample`]).
pub fn status_samples(slot: &GpuSlot, reasons: &[health::Reason]) -> Vec<Sample> {
    let state = health::verdict(reasons);
    let mut out = Vec::with_capacity(8);
    for s in HealthState::ALL {
        out.push(
            Sample::new(Metric::Status, f64::from(u8::from(state == s)))
                .with("hw.type", "gpu")
                .with("hw.state", s.as_str()),
        );
    }
    for r in reasons {
        out.push(
            Sample::new(Metric::HealthReason, 1.0)
                .with("hw.type", "gpu")
                .with("gpu.health.reason", r.code.as_str()),
        );
    }
    out.push(Sample::new(Metric::NvmlTimeouts, slot.timeouts as f64));
    out.push(Sample::new(
        Metric::NvmlStuck,
        f64::from(u8::from(slot.stuck.is_some())),
    ));
    out.push(Sample::new(Metric::Disabled, slot.disabled.len() as f64));
    out
}

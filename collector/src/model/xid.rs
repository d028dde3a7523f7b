//! XIDs and SXids as the model keeps them, whichever path reported them (the kernel log, a
//! log file, NVML events): a counter per (GPU, XID) that survives restarts, the time of the
//! last XID per GPU, one event per occurrence, and the health reasons that hold until a
//! reset or reboot (Xid 79; Xid 154's recovery action). The same XID on the same GPU seen by
//! two paths within [`DEDUP_WINDOW`] counts once. Counters, the inputs' checkpoints and the
//! held reasons are saved together, atomically, so that a restart neither counts an event
//! twice nor misses one; a new boot starts clean.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use super::events::{NewEvent, Severity};
use super::health::Reason;
use super::state::StateDir;
use super::xid_catalog::{self, Category};
use super::{AttrValue, HealthState, Metric, Model, Sample, lock};

/// Reports of one XID on one GPU from two paths within this window are one occurrence.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(10);
/// Counters kept for GPUs the inventory does not know (by PCI address, or a UUID the
/// driver's preamble named), at most; the rest count under `PCI-other`.
pub const MAX_UNKNOWN: usize = 32;
/// PCI → UUID pairs learned from the driver's preamble lines, at most.
pub const MAX_LEARNED: usize = 64;
/// NVSwitches counted by address, at most; the rest count under `NVSwitch-other`.
pub const MAX_SWITCHES: usize = 64;
/// SXid codes counted per switch, at most; the rest count under `other`.
pub const MAX_SXID_CODES: usize = 64;
/// The counter key of every XID code the catalog does not know (`gpu.xid="other"`; the
/// event keeps the code the line gave).
pub const OTHER_XID: u32 = u32::MAX;
/// Saved state is written at most this often (and at shutdown).
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Which path reported an XID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `/dev/kmsg`.
    Kmsg,
    /// A kernel-log file.
    File,
    /// `nvmlEventSetWait`.
    Nvml,
}

impl Via {
    /// `junction.xid.source`.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Kmsg => "kmsg",
            Via::File => "file",
            Via::Nvml => "nvml",
        }
    }
}

/// What a path saw.
#[derive(Debug, Clone)]
pub struct Report {
    /// The path.
    pub via: Via,
    /// A fallen-off-the-bus line without an Xid (counted as Xid 79).
    pub bus_line: bool,
    /// The GPU's PCI address, `dddd:bb:dd`.
    pub pci: Option<String>,
    /// The GPU's UUID when the path knows it (NVML).
    pub uuid: Option<String>,
    /// The XID.
    pub code: u32,
    /// When it happened.
    pub time: SystemTime,
    /// The process the driver named.
    pub pid: Option<u32>,
    /// Its name, if the line gave one.
    pub process: Option<String>,
    /// MIG GPU instance.
    pub gpu_instance: Option<u32>,
    /// MIG compute instance.
    pub compute_instance: Option<u32>,
    /// The whole message.
    pub message: String,
    /// Details decoded from the message.
    pub attrs: Vec<(&'static str, AttrValue)>,
    /// NVLink5 lines say Fatal or Nonfatal themselves.
    pub fatal: Option<bool>,
    /// Xid 154: the new recovery action.
    pub recovery_action: Option<u32>,
}

/// An input's position in a file.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FileCursor {
    /// The file's inode when read.
    pub inode: u64,
    /// Bytes consumed.
    pub offset: u64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct SavedReason {
    code: String,
    failed: bool,
    action: String,
    detail: String,
}

/// What is saved.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct Saved {
    boot_id: String,
    kmsg_next_seq: u64,
    files: BTreeMap<String, FileCursor>,
    counters: BTreeMap<String, BTreeMap<u32, u64>>,
    last: BTreeMap<String, f64>,
    sxid: BTreeMap<String, BTreeMap<String, u64>>,
    reasons: BTreeMap<String, Vec<SavedReason>>,
}

/// One occurrence and the paths that have reported it (a bit per path and line kind).
#[derive(Debug)]
struct Recent {
    id: String,
    code: u32,
    seen: u8,
    at: Instant,
}

/// The bit of a path (and, for the kernel log, of the Xid 79 line or the bus line).
fn channel(via: Via, bus_line: bool) -> u8 {
    let path = match via {
        Via::Kmsg => 0,
        Via::File => 1,
        Via::Nvml => 2,
    };
    1 << (path * 2 + u8::from(bus_line))
}

/// Where an input has read up to; saved together with what it counted.
#[derive(Debug, Clone)]
pub enum Checkpoint {
    /// The next `/dev/kmsg` sequence number.
    Kmsg(u64),
    /// A followed file's position.
    File(std::sync::Arc<str>, FileCursor),
}

#[derive(Debug, Default)]
struct Inner {
    saved: Saved,
    recent: VecDeque<Recent>,
    /// PCI → UUID from the driver's `NVRM: GPU at PCI:…: GPU-…` lines.
    pci_uuid: BTreeMap<String, String>,
    dirty: bool,
    last_flush: Option<Instant>,
}

impl Inner {
    /// Another path's report of an occurrence already counted within [`DEDUP_WINDOW`]:
    /// true (and the path is noted). A path that reports the same XID twice saw two.
    fn duplicate(&mut self, id: &str, code: u32, bit: u8) -> bool {
        let now = Instant::now();
        while self
            .recent
            .front()
            .is_some_and(|e| now.duration_since(e.at) > DEDUP_WINDOW)
        {
            self.recent.pop_front();
        }
        if let Some(e) = self
            .recent
            .iter_mut()
            .find(|e| e.id == id && e.code == code && e.seen & bit == 0)
        {
            e.seen |= bit;
            return true;
        }
        self.recent.push_back(Recent {
            id: id.to_string(),
            code,
            seen: bit,
            at: now,
        });
        false
    }

    fn advance(&mut self, at: &Checkpoint) {
        match at {
            Checkpoint::Kmsg(seq) => {
                if self.saved.kmsg_next_seq != *seq {
                    self.saved.kmsg_next_seq = *seq;
                    self.dirty = true;
                }
            }
            // Once per followed line: no allocation but for a file's first position.
            Checkpoint::File(path, cursor) => match self.saved.files.get_mut(&**path) {
                Some(c) if c == cursor => {}
                Some(c) => {
                    *c = cursor.clone();
                    self.dirty = true;
                }
                None => {
                    self.saved.files.insert(path.to_string(), cursor.clone());
                    self.dirty = true;
                }
            },
        }
    }
}

/// The XID state of the node.
#[derive(Debug, Default)]
pub struct Xids {
    inner: Mutex<Inner>,
    state: Mutex<Option<StateDir>>,
    /// Held while an input counts a record and moves its checkpoint past it, and while the
    /// state is saved: a save has both or neither.
    gate: Mutex<()>,
}

/// The health-reason codes XIDs raise.
const REASON_79: &str = "xid_79";
const REASON_154: &str = "xid_154";
/// A hardware XID NVIDIA's catalog calls fatal for the GPU (48, 74, 95, 119, 120, 140, …):
/// failed, with the catalog's action, until the GPU is reset or the node reboots.
const REASON_FATAL: &str = "xid_fatal";

fn static_code(code: &str) -> Option<&'static str> {
    [REASON_79, REASON_154, REASON_FATAL]
        .into_iter()
        .find(|c| *c == code)
}

impl Model {
    /// Opens the state directory: restores the XID counters, the inputs' checkpoints and the
    /// held health reasons when they are from this boot; starts clean otherwise.
    pub fn open_state(&self, dir: &std::path::Path, proc_root: &std::path::Path) {
        let state = StateDir::open(dir);
        let boot = super::state::boot_id(proc_root);
        let saved: Option<Saved> = state.load("xid");
        let saved = match saved {
            Some(s) if !boot.is_empty() && s.boot_id == boot => s,
            Some(_) => {
                tracing::info!("saved kernel-log state is from an earlier boot; starting clean");
                Saved::default()
            }
            None => Saved::default(),
        };
        for (id, reasons) in &saved.reasons {
            for r in reasons {
                if let Some(code) = static_code(&r.code) {
                    self.health.restore(
                        id,
                        Reason {
                            code,
                            state: if r.failed {
                                HealthState::Failed
                            } else {
                                HealthState::Degraded
                            },
                            detail: r.detail.clone(),
                            action: health_action_static(&r.action),
                            since: SystemTime::now(),
                        },
                    );
                }
            }
        }
        {
            let mut i = lock(&self.xids.inner);
            i.saved = Saved {
                boot_id: boot,
                ..saved
            };
        }
        *lock(&self.xids.state) = Some(state);
        self.publish_xids();
    }

    /// The `/dev/kmsg` sequence number to read from (0: the whole ring of this boot).
    pub fn kmsg_next_seq(&self) -> u64 {
        lock(&self.xids.inner).saved.kmsg_next_seq
    }

    /// Runs `count` (what one record says) and moves the input's checkpoint past the
    /// record, as one step for the saved state: a kill at any point neither counts the
    /// record twice nor loses it.
    pub fn checkpointed<R>(&self, at: Checkpoint, count: impl FnOnce() -> R) -> R {
        let _gate = lock(&self.xids.gate);
        let r = count();
        lock(&self.xids.inner).advance(&at);
        r
    }

    /// Where a file was read up to.
    pub fn file_cursor(&self, path: &str) -> Option<FileCursor> {
        lock(&self.xids.inner).saved.files.get(path).cloned()
    }

    /// Records where a file has been read up to.
    pub fn set_file_cursor(&self, path: &str, cursor: FileCursor) {
        let _gate = lock(&self.xids.gate);
        lock(&self.xids.inner).advance(&Checkpoint::File(path.into(), cursor));
    }

    /// Learns a GPU's UUID from the driver's `NVRM: GPU at PCI:…` line, for a GPU the
    /// inventory does not list (NVML down, or the GPU lost): only for an NVIDIA device the
    /// PCI bus has (`/sys/bus/pci/devices/<addr>.0/vendor` is 0x10de), at most
    /// [`MAX_LEARNED`], and never a UUID the inventory gives another GPU. False: not learned.
    pub fn learn_gpu_uuid(&self, pci: &str, uuid: &str) -> bool {
        let vendor = std::fs::read_to_string(format!("/sys/bus/pci/devices/{pci}.0/vendor"));
        if vendor.map_or(true, |v| v.trim() != "0x10de") {
            return false;
        }
        self.learn_gpu_uuid_checked(pci, uuid)
    }

    /// [`Model::learn_gpu_uuid`] once the device is known to be on the bus.
    fn learn_gpu_uuid_checked(&self, pci: &str, uuid: &str) -> bool {
        let taken = self.gpus().iter().any(|s| {
            let s = lock(s);
            s.info.uuid.eq_ignore_ascii_case(uuid) || s.info.pci_bus_id.starts_with(pci)
        });
        let mut i = lock(&self.xids.inner);
        if taken || (i.pci_uuid.len() >= MAX_LEARNED && !i.pci_uuid.contains_key(pci)) {
            return false;
        }
        i.pci_uuid.insert(pci.to_string(), uuid.to_string());
        true
    }

    /// The GPU at a PCI address (`dddd:bb:dd`): its UUID from the inventory or the driver's
    /// preamble line.
    fn gpu_at(&self, pci: &str) -> Option<String> {
        self.gpus()
            .iter()
            .find_map(|s| {
                let s = lock(s);
                s.info
                    .pci_bus_id
                    .starts_with(pci)
                    .then(|| s.info.uuid.clone())
            })
            .or_else(|| lock(&self.xids.inner).pci_uuid.get(pci).cloned())
    }

    /// Records an XID report: counts it (once across paths), appends its event, raises or
    /// clears the health reasons it implies. Returns false for a duplicate.
    pub fn record_xid(&self, r: Report) -> bool {
        let uuid = r
            .uuid
            .clone()
            .or_else(|| r.pci.as_deref().and_then(|p| self.gpu_at(p)));
        let code = if r.bus_line { 79 } else { r.code };
        let inventory: Vec<String> = self
            .gpus()
            .iter()
            .map(|s| lock(s).info.uuid.clone())
            .collect();
        let id = {
            let mut i = lock(&self.xids.inner);
            let id = match (&uuid, &r.pci) {
                (Some(u), _) => u.clone(),
                (None, Some(p)) => format!("PCI-{p}"),
                (None, None) => "PCI-other".to_string(),
            };
            // GPUs the inventory does not list are counted by id up to a cap.
            let id = if inventory.contains(&id) || i.saved.counters.contains_key(&id) {
                id
            } else {
                let unknown = i
                    .saved
                    .counters
                    .keys()
                    .filter(|k| !inventory.contains(k))
                    .count();
                if unknown >= MAX_UNKNOWN {
                    "PCI-other".to_string()
                } else {
                    id
                }
            };
            // Another path's report of the same XID on the same GPU: one occurrence.
            if i.duplicate(&id, code, channel(r.via, r.bus_line)) {
                return false;
            }
            let key = if xid_catalog::is_catalogued(code) {
                code
            } else {
                OTHER_XID
            };
            *i.saved
                .counters
                .entry(id.clone())
                .or_default()
                .entry(key)
                .or_insert(0) += 1;
            let t = r
                .time
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            i.saved.last.insert(id.clone(), t);
            i.dirty = true;
            id
        };
        self.events.append(self.xid_event(&r, code, &id));
        self.xid_health(&r, code, &id);
        self.publish_xids();
        true
    }

    fn xid_event(&self, r: &Report, code: u32, id: &str) -> NewEvent {
        let entry = xid_catalog::lookup(code);
        let drain = r.fatal.unwrap_or(entry.drain);
        let severity = match (code, drain, entry.category) {
            (79, _, _) => Severity::Fatal,
            (_, true, _) => Severity::Error,
            (_, false, Category::Informational) => Severity::Info,
            _ => Severity::Warn,
        };
        let mut e = NewEvent {
            time: r.time,
            ..NewEvent::now(severity, "gpu.xid", r.message.clone())
        }
        .about(id.to_string())
        .with("gpu.xid", code.to_string())
        .with("gpu.xid.mnemonic", entry.mnemonic)
        .with("gpu.xid.category", entry.category.as_str())
        .with("gpu.xid.action", entry.action)
        .with("gpu.xid.drain", if drain { "true" } else { "false" })
        .with(
            "gpu.health.action",
            xid_catalog::health_action(entry.action),
        )
        .with("junction.xid.source", r.via.as_str());
        if let Some(p) = &r.pci {
            e = e.with("gpu.pci.bdf", p.clone());
        }
        if let Some(pid) = r.pid {
            e = e.with("process.pid", pid.to_string());
            // Who it is (name, container, pod) from the process table; the log line's name
            // wins (the process may be gone).
            let hint = super::processes::Hint {
                comm: r.process.clone().unwrap_or_default(),
                cgroup: None,
            };
            let info = self.processes.identify(pid, Some(&hint));
            let name = r.process.clone().unwrap_or_else(|| info.name.clone());
            if !name.is_empty() {
                e = e.with("process.executable.name", name);
            }
            if let Some(c) = &info.container_id {
                e = e.with("container.id", c.clone());
            }
            if let Some(p) = &info.pod_uid {
                e = e.with("k8s.pod.uid", p.clone());
            }
        }
        if let Some(gi) = r.gpu_instance {
            e = e.with("gpu.mig.gpu_instance_id", gi.to_string());
        }
        if let Some(ci) = r.compute_instance {
            e = e.with("gpu.mig.compute_instance_id", ci.to_string());
        }
        if r.bus_line {
            e = e.with("gpu.xid.bus_line", "true");
        }
        e.attrs.extend(r.attrs.iter().cloned());
        e
    }

    /// Xid 79 fails the GPU until the node reboots; Xid 154 carries the recovery action the
    /// driver now asks for (none clears it).
    fn xid_health(&self, r: &Report, code: u32, id: &str) {
        let mut fatal_detail = String::new();
        let held = match (code, r.recovery_action) {
            (79, _) => Some((
                REASON_79,
                HealthState::Failed,
                "reboot_node",
                "Xid 79: the GPU has fallen off the bus; holds until the node is rebooted",
            )),
            // "To none" clears the reason, unless NVML still reports an action for the GPU.
            (154, Some(0)) if self.nvml_recovery_action(id).is_some_and(|a| a != "none") => {
                tracing::warn!(gpu = %id, "an Xid 154 says the recovery action is none, but NVML still reports one; the reason holds");
                return;
            }
            (154, Some(0)) => {
                self.clear(id, REASON_154);
                None
            }
            (154, Some(1)) => Some((
                REASON_154,
                HealthState::Failed,
                "reset_gpu",
                "Xid 154: the driver asks for a GPU reset",
            )),
            (154, Some(2 | 7)) => Some((
                REASON_154,
                HealthState::Failed,
                "reboot_node",
                "Xid 154: the driver asks for a node reboot",
            )),
            (154, Some(4 | 6)) => Some((
                REASON_154,
                HealthState::Failed,
                "reset_gpu",
                "Xid 154: the driver asks to drain the GPU and reset it",
            )),
            (154, Some(_)) => Some((
                REASON_154,
                HealthState::Degraded,
                "drain_and_service",
                "Xid 154: the driver asks to drain peer-to-peer work (or recover the IMEX domain)",
            )),
            (c, _) if xid_catalog::lookup(c).drain && c != 154 => {
                let e = xid_catalog::lookup(c);
                fatal_detail = format!(
                    "Xid {c} ({}): {}; holds until the GPU is reset or the node reboots",
                    e.mnemonic, e.description
                );
                Some((
                    REASON_FATAL,
                    HealthState::Failed,
                    xid_catalog::health_action(e.action),
                    "",
                ))
            }
            _ => None,
        };
        if let Some((reason, state, action, detail)) = held {
            let detail = if detail.is_empty() {
                fatal_detail.as_str()
            } else {
                detail
            };
            self.raise(id, reason, state, action, detail);
            let mut i = lock(&self.xids.inner);
            let list = i.saved.reasons.entry(id.to_string()).or_default();
            list.retain(|s| s.code != reason);
            list.push(SavedReason {
                code: reason.into(),
                failed: state == HealthState::Failed,
                action: action.into(),
                detail: detail.into(),
            });
            i.dirty = true;
        } else if code == 154 {
            let mut i = lock(&self.xids.inner);
            if let Some(list) = i.saved.reasons.get_mut(id) {
                list.retain(|s| s.code != REASON_154);
            }
            i.dirty = true;
        }
    }

    /// The recovery action NVML reports for the GPU now (`gpu.recovery_action`), if it
    /// reports one.
    fn nvml_recovery_action(&self, id: &str) -> Option<String> {
        self.gpus().iter().find_map(|s| {
            let s = lock(s);
            if s.info.uuid != id {
                return None;
            }
            s.groups.iter().flat_map(|g| g.iter()).find_map(|x| {
                (x.metric == Metric::RecoveryAction && x.value == 1.0)
                    .then(|| x.attr("gpu.recovery_action").map(str::to_string))
                    .flatten()
            })
        })
    }

    /// A GPU that was lost or needed a reset answers again (it was reset): the XID reasons
    /// that hold until a reset clear.
    pub fn gpu_recovered(&self, id: &str) {
        for code in [REASON_FATAL, REASON_154] {
            self.clear(id, code);
        }
        let mut i = lock(&self.xids.inner);
        if let Some(list) = i.saved.reasons.get_mut(id) {
            list.retain(|s| s.code != REASON_FATAL && s.code != REASON_154);
        }
        i.dirty = true;
    }

    /// Records an SXid (NVSwitch) event: counted per switch, code and severity; its companion
    /// lines are never passed here.
    pub fn record_sxid(
        &self,
        via: Via,
        switch_pci: &str,
        code: u32,
        fatal: Option<bool>,
        link: Option<u32>,
        message: String,
    ) -> bool {
        let severity = match fatal {
            Some(true) => "fatal",
            Some(false) => "nonfatal",
            None => "unknown",
        };
        let id = {
            let mut i = lock(&self.xids.inner);
            let mut id = format!("NVSwitch-PCI-{switch_pci}");
            if !i.saved.sxid.contains_key(&id) && i.saved.sxid.len() >= MAX_SWITCHES {
                id = "NVSwitch-other".to_string();
            }
            if i.duplicate(&id, code, channel(via, false)) {
                return false;
            }
            let codes = i.saved.sxid.entry(id.clone()).or_default();
            let mut key = format!("{code}:{severity}");
            if !codes.contains_key(&key) && codes.len() >= MAX_SXID_CODES {
                key = format!("other:{severity}");
            }
            *codes.entry(key).or_insert(0) += 1;
            i.dirty = true;
            id
        };
        let mut e = NewEvent::now(
            if fatal == Some(true) {
                Severity::Error
            } else {
                Severity::Warn
            },
            "gpu.sxid",
            message,
        )
        .about(id)
        .with("hw.type", "nvswitch")
        .with("gpu.sxid", code.to_string())
        .with("gpu.sxid.severity", severity)
        .with("gpu.pci.bdf", switch_pci.to_string())
        .with("junction.xid.source", via.as_str());
        if let Some(l) = link {
            e = e.with("gpu.nvlink.link", l.to_string());
        }
        self.events.append(e);
        self.publish_xids();
        true
    }

    /// Saves the XID state if it changed and the last save is [`FLUSH_EVERY`] old (`force`:
    /// now, at shutdown).
    pub fn flush_xids(&self, force: bool) {
        // One save at a time, each of a state no older than the last one saved.
        let state = lock(&self.xids.state);
        let snapshot = {
            let _gate = lock(&self.xids.gate);
            let mut i = lock(&self.xids.inner);
            if !i.dirty || (!force && i.last_flush.is_some_and(|t| t.elapsed() < FLUSH_EVERY)) {
                return;
            }
            i.dirty = false;
            i.last_flush = Some(Instant::now());
            i.saved.clone()
        };
        if let Some(state) = state.as_ref() {
            state.store("xid", &snapshot);
        }
    }

    fn publish_xids(&self) {
        let mut out = Vec::new();
        {
            let i = lock(&self.xids.inner);
            for (id, codes) in &i.saved.counters {
                for (code, n) in codes {
                    out.push(
                        Sample::new(Metric::XidErrors, *n as f64)
                            .with("hw.id", id.clone())
                            .with(
                                "gpu.xid",
                                if *code == OTHER_XID {
                                    "other".to_string()
                                } else {
                                    code.to_string()
                                },
                            )
                            .with(
                                "gpu.xid.category",
                                xid_catalog::lookup(*code).category.as_str(),
                            ),
                    );
                }
            }
            for (id, t) in &i.saved.last {
                out.push(Sample::new(Metric::XidLast, t.floor()).with("hw.id", id.clone()));
            }
            for (id, codes) in &i.saved.sxid {
                for (key, n) in codes {
                    let (code, severity) = key.split_once(':').unwrap_or((key, "unknown"));
                    out.push(
                        Sample::new(Metric::SxidErrors, *n as f64)
                            .with("hw.id", id.clone())
                            .with("hw.type", "nvswitch")
                            .with("gpu.sxid", code.to_string())
                            .with("gpu.sxid.severity", severity.to_string()),
                    );
                }
            }
        }
        self.publish("xid", "counters", out);
    }
}

fn health_action_static(a: &str) -> &'static str {
    [
        "none",
        "restart_app",
        "reset_gpu",
        "reboot_node",
        "drain_and_service",
    ]
    .into_iter()
    .find(|x| *x == a)
    .unwrap_or("drain_and_service")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(via: Via, code: u32) -> Report {
        Report {
            via,
            bus_line: false,
            pci: Some("0000:3b:00".into()),
            uuid: None,
            code,
            time: SystemTime::now(),
            pid: None,
            process: None,
            gpu_instance: None,
            compute_instance: None,
            message: format!("NVRM: Xid (PCI:0000:3b:00): {code}, test"),
            attrs: Vec::new(),
            fatal: None,
            recovery_action: None,
        }
    }

    fn count(m: &Model, id: &str, code: u32) -> u64 {
        lock(&m.xids.inner)
            .saved
            .counters
            .get(id)
            .and_then(|c| c.get(&code))
            .copied()
            .unwrap_or(0)
    }

    #[test]
    fn two_paths_count_once_and_one_path_counts_every_line() {
        let m = Model::default();
        m.learn_gpu_uuid_checked("0000:3b:00", "GPU-aaaa");
        assert!(m.record_xid(report(Via::Kmsg, 13)));
        assert!(
            !m.record_xid(report(Via::Nvml, 13)),
            "the other path: a duplicate"
        );
        assert!(
            m.record_xid(report(Via::Kmsg, 13)),
            "a second line is a second XID"
        );
        assert!(m.record_xid(report(Via::Nvml, 31)));
        assert_eq!(count(&m, "GPU-aaaa", 13), 2);
        assert_eq!(count(&m, "GPU-aaaa", 31), 1);
        // An Xid 79 line and the bus line that follows it: one occurrence.
        assert!(m.record_xid(report(Via::Kmsg, 79)));
        let mut bus = report(Via::Kmsg, 0);
        bus.bus_line = true;
        assert!(!m.record_xid(bus));
        assert_eq!(count(&m, "GPU-aaaa", 79), 1);
        assert_eq!(
            crate::model::health::verdict(&m.health.reasons("GPU-aaaa")),
            HealthState::Failed
        );
    }

    /// Kernel log, file and NVML: one XID however many paths report it, the Xid 79 line
    /// and its bus line included.
    #[test]
    fn three_paths_count_once() {
        let m = Model::default();
        m.learn_gpu_uuid_checked("0000:3b:00", "GPU-aaaa");
        let bus = |via| Report {
            bus_line: true,
            ..report(via, 0)
        };
        assert!(m.record_xid(report(Via::Kmsg, 79)));
        for r in [
            bus(Via::Kmsg),
            report(Via::File, 79),
            bus(Via::File),
            report(Via::Nvml, 79),
        ] {
            assert!(!m.record_xid(r.clone()), "{r:?}");
        }
        assert_eq!(count(&m, "GPU-aaaa", 79), 1);
        // Two XIDs each seen by all three paths: two.
        for _ in 0..2 {
            for via in [Via::Kmsg, Via::File, Via::Nvml] {
                m.record_xid(report(via, 13));
            }
        }
        assert_eq!(count(&m, "GPU-aaaa", 13), 2);
        assert!(m.record_sxid(
            Via::Kmsg,
            "0000:05:00.0",
            20034,
            Some(true),
            None,
            "x".into()
        ));
        assert!(!m.record_sxid(
            Via::File,
            "0000:05:00.0",
            20034,
            Some(true),
            None,
            "x".into()
        ));
    }

    /// Nothing a line says can grow the state without bound: GPU ids, XID codes, switches,
    /// SXid codes and learned UUIDs are capped, and a UUID is learned only for an NVIDIA
    /// device on the PCI bus.
    #[test]
    fn what_lines_create_is_bounded() {
        let m = Model::default();
        m.add_gpu(crate::model::GpuInfo {
            uuid: "GPU-real".into(),
            pci_bus_id: "0000:18:00.0".into(),
            ..Default::default()
        });
        for i in 0..1000u32 {
            let mut r = report(Via::Kmsg, 13);
            r.pci = Some(format!("{:04x}:{:02x}:00", 0x100 + i / 256, i % 256));
            m.record_xid(r);
            m.record_xid(report(Via::Kmsg, 1000 + i));
            m.record_sxid(
                Via::Kmsg,
                &format!("{i:04x}:05:00.0"),
                12028,
                None,
                None,
                "x".into(),
            );
            m.record_sxid(
                Via::Kmsg,
                "0000:06:00.0",
                30000 + i,
                Some(false),
                None,
                "x".into(),
            );
        }
        let mut r = report(Via::Kmsg, 13);
        r.pci = Some("0000:18:00".into());
        m.record_xid(r);
        let i = lock(&m.xids.inner);
        assert!(
            i.saved.counters.len() <= MAX_UNKNOWN + 2,
            "{}",
            i.saved.counters.len()
        );
        assert_eq!(
            i.saved.counters["GPU-real"][&13], 1,
            "the inventory's GPU is always counted"
        );
        let codes: Vec<u32> = i
            .saved
            .counters
            .values()
            .flat_map(|c| c.keys().copied())
            .collect();
        assert!(
            codes.iter().all(|c| *c == 13 || *c == OTHER_XID),
            "{codes:?}"
        );
        assert!(
            i.saved.sxid.len() <= MAX_SWITCHES + 1,
            "{}",
            i.saved.sxid.len()
        );
        assert!(i.saved.sxid.values().all(|c| c.len() <= MAX_SXID_CODES + 2));
        drop(i);
        // The PCI address is on no bus here: nothing learned.
        assert!(!m.learn_gpu_uuid("0000:99:00", "GPU-deadbeef-0000-4000-8000-000000000000"));
        for i in 0..1000u32 {
            m.learn_gpu_uuid_checked(&format!("{i:04x}:99:00"), "GPU-x");
        }
        assert_eq!(lock(&m.xids.inner).pci_uuid.len(), MAX_LEARNED);
        assert!(
            !m.learn_gpu_uuid_checked("0000:18:00", "GPU-forged"),
            "the inventory's own"
        );
        assert!(
            !m.learn_gpu_uuid_checked("0000:77:00", "GPU-real"),
            "another GPU's UUID"
        );
    }

    /// An Xid 154 "to none" does not clear the reason while NVML still reports an action.
    #[test]
    fn xid_154_to_none_does_not_clear_what_nvml_still_reports() {
        let m = Model::default();
        let slot = m.add_gpu(crate::model::GpuInfo {
            uuid: "GPU-b".into(),
            pci_bus_id: "0000:3b:00.0".into(),
            ..Default::default()
        });
        let mut r = report(Via::Kmsg, 154);
        r.recovery_action = Some(1);
        m.record_xid(r);
        lock(&slot).groups[0] = std::sync::Arc::new(vec![
            Sample::new(Metric::RecoveryAction, 1.0).with("gpu.recovery_action", "gpu_reset"),
            Sample::new(Metric::RecoveryAction, 0.0).with("gpu.recovery_action", "none"),
        ]);
        let mut r = report(Via::Kmsg, 154);
        r.recovery_action = Some(0);
        m.record_xid(r);
        assert_eq!(m.health.reasons("GPU-b")[0].code, "xid_154", "held");
        lock(&slot).groups[0] = std::sync::Arc::new(vec![
            Sample::new(Metric::RecoveryAction, 0.0).with("gpu.recovery_action", "gpu_reset"),
            Sample::new(Metric::RecoveryAction, 1.0).with("gpu.recovery_action", "none"),
        ]);
        let mut r = report(Via::Kmsg, 154);
        r.recovery_action = Some(0);
        m.record_xid(r);
        assert!(m.health.reasons("GPU-b").is_empty(), "NVML agrees: cleared");
    }

    #[test]
    fn xid_154_raises_and_clears_by_value() {
        let m = Model::default();
        m.learn_gpu_uuid_checked("0000:3b:00", "GPU-b");
        let mut r = report(Via::Kmsg, 154);
        r.recovery_action = Some(1);
        m.record_xid(r);
        let reasons = m.health.reasons("GPU-b");
        assert_eq!(reasons[0].code, "xid_154");
        assert_eq!(reasons[0].action, "reset_gpu");
        let mut r = report(Via::Kmsg, 154);
        r.recovery_action = Some(0);
        m.record_xid(r);
        assert!(m.health.reasons("GPU-b").is_empty());
    }

    #[test]
    fn the_xids_dcgm_fails_a_gpu_for_fail_it_until_a_reset() {
        // DCGM's health watch fails a GPU for Xid 48, 74, 79, 95, 119, 120, 140; 94 only warns
        // (the health rules degrade it), application XIDs do nothing to the GPU.
        for (code, reason, action) in [
            (48, "xid_fatal", "reset_gpu"),
            (74, "xid_fatal", "drain_and_service"),
            (79, "xid_79", "reboot_node"),
            (95, "xid_fatal", "reset_gpu"),
            (119, "xid_fatal", "reset_gpu"),
            (120, "xid_fatal", "reset_gpu"),
            (140, "xid_fatal", "reset_gpu"),
        ] {
            let m = Model::default();
            m.learn_gpu_uuid_checked("0000:3b:00", "GPU-b");
            m.record_xid(report(Via::Kmsg, code));
            let reasons = m.health.reasons("GPU-b");
            assert_eq!(reasons.len(), 1, "Xid {code}: {reasons:?}");
            assert_eq!(
                (reasons[0].code, reasons[0].state, reasons[0].action),
                (reason, HealthState::Failed, action),
                "Xid {code}"
            );
            // A reset clears what a reset cures; Xid 79 holds until the node reboots.
            m.gpu_recovered("GPU-b");
            assert_eq!(
                m.health.reasons("GPU-b").is_empty(),
                code != 79,
                "Xid {code} after a reset"
            );
        }
        for code in [13, 31, 43, 45, 94] {
            let m = Model::default();
            m.learn_gpu_uuid_checked("0000:3b:00", "GPU-b");
            m.record_xid(report(Via::Kmsg, code));
            assert!(m.health.reasons("GPU-b").is_empty(), "Xid {code}");
        }
    }
}

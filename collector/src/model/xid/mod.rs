//! XIDs and SXids as the model keeps them, whichever path reported them (the kernel log, a
//! log file, NVML events): a counter per (GPU, XID) that survives restarts, the time of the
//! last XID per GPU, one event per occurrence, and the health reasons that hold until a
//! reset or reboot (Xid 79; Xid 154's recovery action). The same XID on the same GPU seen by
//! two paths within [`DEDUP_WINDOW`] counts once. Counters, the inputs' checkpoints and the
//! held reasons are saved together, atomically, so that a restart neither counts an event
//! twice nor misses one; a new boot starts clean.
//!
//! Split by what it decides: `dedup` (the window, pure), `policy` (what an XID does to health
//! and its event's severity, pure), `saved` (the state and its caps); `inputs` (where each
//! input has read up to, and the state directory); this file records and publishes.

mod dedup;
mod inputs;
mod policy;
mod saved;
pub mod signatures;

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use super::events::{NewEvent, Severity};
use super::health::Code;
use super::state::StateDir;
use super::xid_catalog;
use super::{AttrValue, Metric, Model, Sample, lock};
use dedup::channel;
use policy::Effect;
use saved::Inner;

pub use dedup::DEDUP_WINDOW;
pub use inputs::{Checkpoint, FileCursor, FileLease};
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
    /// A crash record of an earlier boot (pstore, kdump).
    Crash,
}

impl Via {
    /// `junction.xid.source`.
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Kmsg => "kmsg",
            Via::File => "file",
            Via::Nvml => "nvml",
            Via::Crash => "crash_record",
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

/// The XID state of the node.
#[derive(Debug, Default)]
pub struct Xids {
    inner: Mutex<Inner>,
    state: Mutex<Option<StateDir>>,
    /// Held while an input counts a record and moves its checkpoint past it, and while the
    /// state is saved: a save has both or neither.
    gate: Mutex<()>,
}

impl Model {
    /// The GPU's last XID code this boot.
    pub fn last_xid(&self, id: &str) -> Option<u32> {
        lock(&self.xids.inner).saved.last_code.get(id).copied()
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
            let id = i.xid_counter_id(id, &inventory);
            // Another path's report of the same XID on the same GPU: one occurrence.
            if i.window
                .duplicate(&id, code, channel(r.via, r.bus_line), Instant::now())
            {
                return false;
            }
            let key = if xid_catalog::is_catalogued(code) {
                code
            } else {
                OTHER_XID
            };
            let t = r
                .time
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            i.count_xid(&id, key, t);
            // The code itself, bounded or not: one entry per GPU.
            i.saved.last_code.insert(id.clone(), code);
            id
        };
        self.events.append(self.xid_event(&r, code, &id));
        let mut e = crate::model::history::Entry::now(
            &self.boot_id(),
            &id,
            "xid",
            code.to_string(),
            &r.message,
        );
        e.pid = r.pid;
        self.history.append(e);
        self.xid_health(&r, code, &id);
        self.publish_xids();
        true
    }

    fn xid_event(&self, r: &Report, code: u32, id: &str) -> NewEvent {
        let entry = xid_catalog::lookup(code);
        let drain = r.fatal.unwrap_or(entry.drain);
        let severity = policy::severity(code, r.fatal);
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
            xid_catalog::health_action(entry.action).as_str(),
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

    /// Raises or clears the reason the XID implies (see [`policy::effect`]) and saves it.
    fn xid_health(&self, r: &Report, code: u32, id: &str) {
        match policy::effect(code, r.recovery_action, || self.nvml_recovery_action(id)) {
            Effect::Raise(h) => {
                self.raise(id, h.code, h.state, h.action, h.detail.clone());
                lock(&self.xids.inner).hold(id, &h);
            }
            Effect::Clear154 => {
                self.clear(id, Code::Xid154);
                lock(&self.xids.inner).release(id, &[Code::Xid154]);
            }
            Effect::Disputed => {
                tracing::warn!(gpu = %id, "an Xid 154 says the recovery action is none, but NVML still reports one; the reason holds");
            }
            Effect::Nothing => {}
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
        const CURED: [Code; 5] = [
            Code::XidFatal,
            Code::Xid154,
            Code::GspUnresponsive,
            Code::RmInitFailed,
            Code::PcieFatalLogged,
        ];
        for code in CURED {
            self.clear(id, code);
        }
        lock(&self.xids.inner).release(id, &CURED);
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
        let severity = policy::sxid_severity(fatal);
        let id: String = {
            let mut i = lock(&self.xids.inner);
            let id = i.sxid_counter_id(switch_pci);
            if i.window
                .duplicate(&id, code, channel(via, false), Instant::now())
            {
                return false;
            }
            i.count_sxid(&id, code, severity);
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
        .about(id.clone())
        .with("hw.type", "nvswitch")
        .with("gpu.sxid", code.to_string())
        .with("gpu.sxid.severity", severity)
        .with("gpu.pci.bdf", switch_pci.to_string())
        .with("junction.xid.source", via.as_str());
        if let Some(l) = link {
            e = e.with("gpu.nvlink.link", l.to_string());
        }
        self.remember(&id, "sxid", format!("{code}:{severity}"), &e.body);
        self.events.append(e);
        self.publish_xids();
        true
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
            self.signature_samples(&i, &mut out);
            for (id, codes) in &i.saved.sxid {
                for (key, n) in codes {
                    let (code, severity) = saved::split_sxid_key(key);
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

#[cfg(test)]
mod tests;

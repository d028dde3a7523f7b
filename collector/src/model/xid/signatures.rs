//! Kernel-log signatures beyond XID (`model::signatures`): each match is counted once across
//! the kernel-log paths per component and signature, is an event (at most one a minute per
//! component and signature, the count saying the rest; every process's OOM kill or hang is
//! one), and does what the catalog says to
//! health. Counts and node reasons are kept with the XID state (across agent restarts, reset
//! at reboot); GPU reasons are held like the fatal XIDs'.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use super::dedup::channel;
use super::policy::Held;
use crate::model::events::{NewEvent, Severity};
use crate::model::fabric::normalize_bdf;
use crate::model::signatures::{CATALOG, Effect, Level, Target};
use crate::model::xid::Via;
use crate::model::{HealthState, Metric, Model, Sample, lock};

/// Components the signature counters keep apart; the rest count as `other`.
pub const MAX_COMPONENTS: usize = 128;

/// One event per component and signature per this long.
const EVENT_EVERY: Duration = Duration::from_secs(60);

/// What a matched line says, as the parser found it.
#[derive(Debug, Clone, Default)]
pub struct SignatureReport {
    /// Catalog index.
    pub sig: usize,
    /// The path it came by.
    pub via: Option<Via>,
    /// A PCI address in the line.
    pub pci: Option<String>,
    /// The port that printed it (AER).
    pub reporter: Option<String>,
    /// A disk or file system.
    pub dev: Option<String>,
    /// A process and its name.
    pub pid: Option<u32>,
    /// Its name.
    pub comm: Option<String>,
    /// The driver's GPU number.
    pub rm: Option<u32>,
    /// The message.
    pub message: String,
    /// When.
    pub time: Option<SystemTime>,
    /// The boot it happened in, where that is not this one (a crash record of an earlier
    /// boot, read at this one's start).
    pub boot: Option<String>,
}

impl Model {
    /// The GPUs a line's PCI address names: those at or behind it on the bus (as the pcie
    /// source found the tree); where the tree is unknown and the line is about a GPU, the GPU
    /// at that address. NVML's UUID where NVML lists it, else `PCI-dddd:bb:dd` (as XID lines
    /// name a GPU NVML does not know).
    fn gpus_at_or_behind(&self, pci: &str, is_gpu: bool) -> Vec<String> {
        let Some(bdf) = normalize_bdf(pci) else {
            return Vec::new();
        };
        let mut bdfs = self.fabric.gpus_behind(&bdf);
        if bdfs.is_empty() && is_gpu {
            bdfs.push(bdf);
        }
        let slots = self.snapshot();
        bdfs.iter()
            .take(16)
            .map(|b| {
                slots
                    .iter()
                    .find(|s| normalize_bdf(&s.info.pci_bus_id).as_deref() == Some(b.as_str()))
                    .map_or_else(|| format!("PCI-{}", &b[..10]), |s| s.info.uuid.clone())
            })
            .collect()
    }

    /// The GPUs (UUIDs) whose rail holds the NIC at `pci`.
    fn rail_gpus(&self, pci: &str) -> Vec<String> {
        let bdfs = self.fabric.gpus_on_rail_of(pci);
        let slots = self.snapshot();
        let mut out: Vec<String> = slots
            .iter()
            .filter(|s| normalize_bdf(&s.info.pci_bus_id).is_some_and(|b| bdfs.contains(&b)))
            .map(|s| s.info.uuid.clone())
            .collect();
        out.truncate(16);
        out
    }

    /// The GPUs a process used, from NVML's process lists and eBPF's per-process series.
    fn gpus_of_pid(&self, pid: u32) -> Vec<String> {
        let p = pid.to_string();
        let mut out: Vec<String> = self
            .snapshot()
            .iter()
            .filter(|s| {
                s.groups.iter().flat_map(|g| g.iter()).any(|x| {
                    x.metric == Metric::ProcessMemory && x.attr("process.pid") == Some(p.as_str())
                })
            })
            .map(|s| s.info.uuid.clone())
            .collect();
        for set in self.sets() {
            for x in set.iter() {
                if x.attr("process.pid") == Some(p.as_str())
                    && let Some(id) = x
                        .attr("hw.id")
                        .filter(|i| i.starts_with("GPU-") || i.starts_with("MIG-"))
                    && !out.iter().any(|o| o == id)
                {
                    out.push(id.to_string());
                }
            }
        }
        out.truncate(16);
        out
    }

    /// Records a signature match. Returns false for a duplicate (another path's copy).
    pub fn record_signature(&self, r: SignatureReport) -> bool {
        let Some(sig) = CATALOG.get(r.sig) else {
            return false;
        };
        let gpus = match sig.target {
            Target::Gpu | Target::PciPath => r
                .pci
                .as_deref()
                .map(|p| self.gpus_at_or_behind(p, sig.target == Target::Gpu))
                .unwrap_or_default(),
            Target::Process => r.pid.map(|p| self.gpus_of_pid(p)).unwrap_or_default(),
            // The GPUs whose rail the NIC is (named, not failed: the nic source's port
            // states say whether the rail is degraded).
            Target::Nic => r
                .pci
                .as_deref()
                .map(|p| self.rail_gpus(p))
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        let component = match sig.target {
            Target::Gpu => gpus.first().cloned().unwrap_or_else(|| "PCI-other".into()),
            Target::PciPath | Target::Nic => r
                .pci
                .as_deref()
                .and_then(normalize_bdf)
                .map_or_else(|| "PCI-other".into(), |b| format!("PCI-{b}")),
            Target::Disk => format!("disk:{}", r.dev.as_deref().unwrap_or("unknown")),
            Target::Process | Target::Node => "node".into(),
        };
        let now = Instant::now();
        let first_event = {
            let mut i = lock(&self.xids.inner);
            let bit = channel(r.via.unwrap_or(Via::Kmsg), false);
            if i.window
                .duplicate(&component, 1_000_000 + r.sig as u32, bit, now)
            {
                return false;
            }
            let known = i.saved.signatures.contains_key(&component);
            let key = if known || i.saved.signatures.len() < MAX_COMPONENTS {
                component.clone()
            } else {
                "other".into()
            };
            *i.saved
                .signatures
                .entry(key)
                .or_default()
                .entry(sig.id.to_string())
                .or_insert(0) += 1;
            i.dirty = true;
            // Every process's kill or hang is its own event (the event log's ring bounds
            // them); the rest are limited per component and signature.
            let k = (component.clone(), r.sig);
            let due = sig.target == Target::Process
                || i.signature_events
                    .get(&k)
                    .is_none_or(|t| now.duration_since(*t) >= EVENT_EVERY);
            if due && sig.target != Target::Process {
                if i.signature_events.len() >= 4 * MAX_COMPONENTS {
                    i.signature_events
                        .retain(|_, t| now.duration_since(*t) < EVENT_EVERY);
                }
                i.signature_events.insert(k, now);
            }
            due
        };
        let mut h = crate::model::history::Entry::now(
            &self.boot_id(),
            match gpus.first() {
                Some(g) if sig.target != Target::Nic => g.as_str(),
                _ => component.as_str(),
            },
            "signature",
            sig.id,
            &r.message,
        );
        h.pid = r.pid;
        if let Some(b) = &r.boot {
            h.boot = b.as_str().into();
        }
        if let Some(ms) = r
            .time
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        {
            h.ms = ms.as_millis() as u64;
        }
        self.history.append(h);
        if first_event {
            self.events
                .append(self.signature_event(&r, sig, &component, &gpus));
        }
        let detail = format!(
            "{}: {}",
            sig.meaning,
            r.message.chars().take(300).collect::<String>()
        );
        match sig.effect {
            Effect::Event => {}
            Effect::GpuReason(code, failed, action) => {
                let state = if failed {
                    HealthState::Failed
                } else {
                    HealthState::Degraded
                };
                for g in &gpus {
                    self.raise(g, code, state, action, detail.clone());
                    lock(&self.xids.inner).hold(
                        g,
                        &Held {
                            code,
                            state,
                            action,
                            detail: detail.clone(),
                        },
                    );
                }
            }
            Effect::NodeReason(reason) => {
                let mut i = lock(&self.xids.inner);
                if !i.saved.node_reasons.contains_key(reason) {
                    i.saved.node_reasons.insert(reason.to_string(), detail);
                    i.dirty = true;
                }
            }
        }
        self.publish_xids();
        true
    }

    fn signature_event(
        &self,
        r: &SignatureReport,
        sig: &crate::model::signatures::Signature,
        component: &str,
        gpus: &[String],
    ) -> NewEvent {
        let severity = match sig.level {
            Level::Info => Severity::Info,
            Level::Warn => Severity::Warn,
            Level::Error => Severity::Error,
        };
        let mut about = format!("{}: {}", sig.meaning, r.message.trim());
        let mut e = NewEvent::now(severity, "kmsg.signature", String::new())
            .with("kmsg.signature", sig.id)
            .with("hw.type", sig.target.hw_type())
            .with("junction.xid.source", r.via.unwrap_or(Via::Kmsg).as_str());
        if let Some(t) = r.time {
            e.time = t;
        }
        e = e.about(match gpus.first() {
            Some(g) if sig.target != Target::Nic => g.clone(),
            _ => component.to_string(),
        });
        if gpus.len() > 1 || sig.target == Target::PciPath {
            e = e.with("pcie.bdf", component.trim_start_matches("PCI-").to_string());
        }
        if !gpus.is_empty() {
            e = e.with("gpu.ids", gpus.join(","));
        }
        if let Some(rep) = &r.reporter {
            e = e.with("pcie.reporter", rep.clone());
        }
        if let Some(d) = &r.dev {
            e = e.with("hw.name", d.clone());
        }
        if let Some(rm) = r.rm {
            e = e.with("gpu.rm_index", rm.to_string());
        }
        if let Some(pid) = r.pid {
            let hint = super::super::processes::Hint {
                comm: r.comm.clone().unwrap_or_default(),
                cgroup: None,
            };
            let info = self.processes.identify(pid, Some(&hint));
            let name = r.comm.clone().unwrap_or_else(|| info.name.clone());
            e = e.with("process.pid", pid.to_string());
            if !name.is_empty() {
                e = e.with("process.executable.name", name.clone());
            }
            if let Some(c) = &info.container_id {
                e = e.with("container.id", c.clone());
            }
            if let Some(p) = &info.pod_uid {
                e = e.with("k8s.pod.uid", p.clone());
            }
            if !gpus.is_empty() {
                about = format!("{about} (process {pid} {name} used {})", gpus.join(", "));
            }
        }
        e.body = about;
        e
    }

    /// The signature counters and the node reasons, for `publish_xids`.
    pub(super) fn signature_samples(&self, i: &super::saved::Inner, out: &mut Vec<Sample>) {
        let types: BTreeMap<&str, &str> =
            CATALOG.iter().map(|s| (s.id, s.target.hw_type())).collect();
        for (component, sigs) in &i.saved.signatures {
            for (id, n) in sigs {
                out.push(
                    Sample::new(Metric::KmsgSignatures, *n as f64)
                        .with("hw.id", component.clone())
                        .with("hw.type", types.get(id.as_str()).copied().unwrap_or("node"))
                        .with("kmsg.signature", id.clone()),
                );
            }
        }
        for reason in i.saved.node_reasons.keys() {
            out.push(
                Sample::new(Metric::NodeReason, 1.0).with("node.health.reason", reason.clone()),
            );
        }
    }
}

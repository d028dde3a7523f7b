//! The XID state that survives a restart of the agent (not a reboot): the counters, the last
//! XID per GPU, the SXid counters, the held reasons and the inputs' checkpoints, with the caps
//! that keep what kernel lines can create bounded.

use std::collections::BTreeMap;
use std::time::Instant;

use super::super::HealthState;
use super::dedup::Window;
use super::policy::Held;
use super::{Checkpoint, FileCursor, MAX_SWITCHES, MAX_SXID_CODES, MAX_UNKNOWN};
use crate::model::health::Code;

/// A held reason as saved.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SavedReason {
    pub code: String,
    pub failed: bool,
    pub action: String,
    pub detail: String,
}

/// What is saved (the file format: field names and the `"code:severity"` SXid keys stay as
/// they are, so that a newer agent reads an older one's state).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Saved {
    pub boot_id: String,
    pub kmsg_next_seq: u64,
    pub files: BTreeMap<String, FileCursor>,
    pub counters: BTreeMap<String, BTreeMap<u32, u64>>,
    pub last: BTreeMap<String, f64>,
    pub sxid: BTreeMap<String, BTreeMap<String, u64>>,
    pub reasons: BTreeMap<String, Vec<SavedReason>>,
    /// Kernel-log signature counts: component → signature → count.
    #[serde(default)]
    pub signatures: BTreeMap<String, BTreeMap<String, u64>>,
    /// Node reasons the kernel log raised this boot: reason → sentence.
    #[serde(default)]
    pub node_reasons: BTreeMap<String, String>,
    /// Each GPU's last XID code (dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS` is its value).
    #[serde(default)]
    pub last_code: BTreeMap<String, u32>,
}

/// The live state: what is saved, the de-duplication window, the UUIDs learned from the
/// driver's preamble lines.
#[derive(Debug, Default)]
pub struct Inner {
    pub saved: Saved,
    pub window: Window,
    /// PCI → UUID from the driver's `NVRM: GPU at PCI:…: GPU-…` lines.
    pub pci_uuid: BTreeMap<String, String>,
    pub dirty: bool,
    pub last_flush: Option<Instant>,
    /// When each (component, signature) last had an event.
    pub signature_events: BTreeMap<(String, usize), Instant>,
}

/// The SXid counter key.
pub fn sxid_key(code: &str, severity: &str) -> String {
    format!("{code}:{severity}")
}

/// An SXid counter key's (code, severity).
pub fn split_sxid_key(key: &str) -> (&str, &str) {
    key.split_once(':').unwrap_or((key, "unknown"))
}

impl Inner {
    /// Moves an input's checkpoint.
    pub fn advance(&mut self, at: &Checkpoint) {
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

    /// The id an XID on `id` counts under: itself for a GPU of the inventory or one already
    /// counted; `PCI-other` once [`MAX_UNKNOWN`] others are.
    pub fn xid_counter_id(&self, id: String, inventory: &[String]) -> String {
        if inventory.contains(&id) || self.saved.counters.contains_key(&id) {
            return id;
        }
        let unknown = self
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
    }

    /// Counts an XID (`key`: its code, or `OTHER_XID`) at `t` (seconds since the epoch).
    pub fn count_xid(&mut self, id: &str, key: u32, t: f64) {
        *self
            .saved
            .counters
            .entry(id.to_string())
            .or_default()
            .entry(key)
            .or_insert(0) += 1;
        self.saved.last.insert(id.to_string(), t);
        self.dirty = true;
    }

    /// The id an SXid of the switch at `switch_pci` counts under.
    pub fn sxid_counter_id(&self, switch_pci: &str) -> String {
        let id = format!("NVSwitch-PCI-{switch_pci}");
        if !self.saved.sxid.contains_key(&id) && self.saved.sxid.len() >= MAX_SWITCHES {
            "NVSwitch-other".to_string()
        } else {
            id
        }
    }

    /// Counts an SXid; past [`MAX_SXID_CODES`] codes per switch, under `other`.
    pub fn count_sxid(&mut self, id: &str, code: u32, severity: &str) {
        let codes = self.saved.sxid.entry(id.to_string()).or_default();
        let mut key = sxid_key(&code.to_string(), severity);
        if !codes.contains_key(&key) && codes.len() >= MAX_SXID_CODES {
            key = sxid_key("other", severity);
        }
        *codes.entry(key).or_insert(0) += 1;
        self.dirty = true;
    }

    /// Saves a held reason (replacing the one of its code).
    pub fn hold(&mut self, id: &str, h: &Held) {
        let list = self.saved.reasons.entry(id.to_string()).or_default();
        list.retain(|s| s.code != h.code.as_str());
        list.push(SavedReason {
            code: h.code.as_str().into(),
            failed: h.state == HealthState::Failed,
            action: h.action.as_str().into(),
            detail: h.detail.clone(),
        });
        self.dirty = true;
    }

    /// Forgets saved reasons of `id` with these codes.
    pub fn release(&mut self, id: &str, codes: &[Code]) {
        if let Some(list) = self.saved.reasons.get_mut(id) {
            list.retain(|s| !codes.iter().any(|c| c.as_str() == s.code));
        }
        self.dirty = true;
    }
}

//! Delta temporality across a restart. A counter's delta point is its increase since the
//! previous export, and an encoder that starts knows no previous export: its first point is
//! the counter's whole value. For the hardware's counters (energy since the driver loaded,
//! ECC and NVLink errors, the XIDs of this boot, which the kernel-log source keeps across
//! restarts) that whole value was already reported, so a backend that adds up deltas counted
//! it again at every restart of the agent. At a clean stop the exporter saves, after its last
//! export, that export's time and each counter series' last value (`otlp-delta.json` in
//! `state_dir`); the next start takes them and removes the file, so its first points are the
//! increase since that export, from that export's time.
//!
//! The file is used once, and only from the same boot (the driver's counters start again at a
//! reboot) and a build that keys series the same way; otherwise, and after a crash (no file),
//! the first points are whole values as before. Removing the file at start is what keeps a
//! start after a crash from going on from values that the crashed run reported past.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::encode::{Encoder, series_key};
use crate::model::state::{StateDir, boot_id};

/// The file in `state_dir` (`otlp-delta.json`).
const FILE: &str = "otlp-delta";

/// More series than a node has are not taken (the 64-GPU node has about 6,000 counter
/// series).
const MAX_SERIES: usize = 1 << 20;

/// What a clean stop saves.
#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    /// The boot it was saved in.
    boot_id: String,
    /// [`probe`] in the build that saved it: series are keyed by a hash of their metric and
    /// attributes, which another build may compute otherwise.
    probe: u64,
    /// The last export's time (Unix ns).
    last_ns: u64,
    /// Each counter series' last value, by its hash.
    series: Vec<(u64, f64)>,
}

/// The key of a fixed series, as the encoder keys series ([`series_key`]).
fn probe() -> u64 {
    series_key(
        "hw.energy",
        [("hw.id", "GPU-00000000-0000-0000-0000-000000000000")],
    )
}

/// Where a delta exporter's state is kept between runs.
pub struct Resume {
    state: StateDir,
    boot: String,
}

impl Resume {
    /// The state directory and this boot's id.
    pub fn open(state_dir: &Path, proc_root: &Path) -> Self {
        Self {
            state: StateDir::open(state_dir),
            boot: boot_id(proc_root),
        }
    }

    /// Goes on from what the last clean stop saved, when it is from this boot and this
    /// build's keys, and removes it. Whether it went on.
    pub fn take(&self, encoder: &mut Encoder) -> bool {
        let saved: Option<Saved> = self.state.load(FILE);
        if saved.is_some()
            && let Err((path, e)) = self.state.remove(FILE)
        {
            // Kept, it would be taken again after a crash: not gone on from.
            tracing::warn!(file = %path.display(), error = %e, "cannot remove the saved OTLP delta state; the first export reports whole counter values");
            return false;
        }
        let Some(saved) = saved else { return false };
        let why = if self.boot.is_empty() || saved.boot_id != self.boot {
            "it is from an earlier boot"
        } else if saved.probe != probe() {
            "another build saved it"
        } else if saved.series.len() > MAX_SERIES {
            "it holds more series than a node has"
        } else if !encoder.resume(saved.last_ns, &saved.series) {
            "its last export is later than this start: the clock was set back"
        } else {
            tracing::info!(
                series = saved.series.len(),
                "OTLP delta: going on from the last export before the restart"
            );
            return true;
        };
        tracing::info!(
            "OTLP delta: the saved state is not used ({why}); the first export reports whole counter values"
        );
        false
    }

    /// Saves the encoder's delta state for the next start (after the last export).
    pub fn save(&self, encoder: &Encoder) {
        let Some((last_ns, series)) = encoder.delta_state() else {
            return;
        };
        let saved = Saved {
            boot_id: self.boot.clone(),
            probe: probe(),
            last_ns,
            series,
        };
        if let Err((path, e)) = self.state.store(FILE, &saved) {
            tracing::warn!(file = %path.display(), error = %e, "cannot save the OTLP delta state; after the restart the first export reports whole counter values");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "junction-otlp-resume-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("proc/sys/kernel/random")).expect("proc tree");
        d
    }

    fn boot(d: &Path, id: &str) {
        std::fs::write(d.join("proc/sys/kernel/random/boot_id"), format!("{id}\n")).expect("boot");
    }

    #[test]
    fn a_saved_state_is_taken_once_and_only_in_its_boot_and_build() {
        let d = dir("once");
        boot(&d, "boot-a");
        let r = Resume::open(&d.join("state"), &d.join("proc"));
        let file = d.join("state/otlp-delta.json");
        let saved = |boot: &str, probe: u64| Saved {
            boot_id: boot.into(),
            probe,
            last_ns: 1,
            series: vec![(7, 3.0)],
        };
        let store = |s: Saved| r.state.store(FILE, &s).expect("stored");
        let delta = || {
            let envelope = super::super::encode::Envelope {
                resource: Vec::new(),
                schema_url: String::new(),
                scope: (String::new(), String::new()),
            };
            Encoder::new(envelope, true, 10)
        };

        // Nothing saved: nothing to go on from.
        assert!(!r.take(&mut delta()));
        // Saved in this boot by this build: taken, and the file is gone.
        store(saved("boot-a", probe()));
        assert!(r.take(&mut delta()));
        assert!(!file.exists(), "taken once");
        assert!(!r.take(&mut delta()));
        // From another boot, or keyed by another build: removed, not used.
        for s in [saved("boot-b", probe()), saved("boot-a", probe() ^ 1)] {
            store(s);
            assert!(!r.take(&mut delta()));
            assert!(!file.exists());
        }
        // A corrupt file starts clean too.
        std::fs::write(&file, b"{\"boot_id\":").expect("write");
        assert!(!r.take(&mut delta()));
        let _ = std::fs::remove_dir_all(&d);
    }
}

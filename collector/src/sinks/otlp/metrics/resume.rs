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
//!
//! Series that go on counting across a reboot (a GPU's lifetime ECC count, a BMC's energy:
//! [`outlives_boot`](super::encode::outlives_boot)) would report their whole value again after
//! every reboot and every crash, a value a backend already added up. Their last values go to a
//! second file (`otlp-delta-lasting.json`) of any boot, written while the agent runs: after an
//! export in which one changed, at most every [`LASTING_EVERY`], and at the last export. A
//! start takes it (and keeps it) whatever the boot: such a series without a value of its own
//! in the run (after a reboot or a crash, or back after a gap) reports its increase since its
//! kept value. What rose in the last [`LASTING_EVERY`] before a crash is reported again.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::encode::{Encoder, series_key};
use crate::model::state::{StateDir, boot_id};

/// The file in `state_dir` (`otlp-delta.json`).
const FILE: &str = "otlp-delta";

/// The file of the series that outlive a boot (`otlp-delta-lasting.json`).
const LASTING: &str = "otlp-delta-lasting";

/// The least time between two writes of [`LASTING`] while the agent runs (a BMC's energy
/// changes at each of its polls).
pub const LASTING_EVERY: Duration = Duration::from_secs(15);

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

/// What is kept of the series that outlive a boot, whatever the boot.
#[derive(Debug, Serialize, Deserialize)]
struct Lasting {
    /// [`probe`] in the build that saved it.
    probe: u64,
    /// Each such series' last value, by its hash.
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
    /// When [`LASTING`] was last written.
    lasting_at: Option<Instant>,
    /// Whether a failed write of [`LASTING`] was logged (once: it is tried again at each change).
    lasting_warned: bool,
}

impl Resume {
    /// The state directory and this boot's id.
    pub fn open(state_dir: &Path, proc_root: &Path) -> Self {
        Self {
            state: StateDir::open(state_dir),
            boot: boot_id(proc_root),
            lasting_at: None,
            lasting_warned: false,
        }
    }

    /// Goes on from what the last clean stop saved, when it is from this boot and this
    /// build's keys, and removes it; then, whatever the boot, from the last values of the
    /// series that outlive a boot (kept). Whether it went on from the clean stop.
    pub fn take(&self, encoder: &mut Encoder) -> bool {
        let went_on = self.take_boot(encoder);
        self.take_lasting(encoder);
        went_on
    }

    /// The last values of the series that outlive a boot, when this build's keys saved them.
    fn take_lasting(&self, encoder: &mut Encoder) {
        let Some(saved) = self.state.load::<Lasting>(LASTING) else {
            return;
        };
        if saved.probe != probe() {
            tracing::info!(
                "OTLP delta: the saved values of the counters that outlive a reboot are not used (another build saved them); their first export reports whole values"
            );
            return;
        }
        let n = encoder.prime_lasting(&saved.series);
        tracing::info!(
            series = n,
            "OTLP delta: the counters that outlive a reboot (lifetime ECC, BMC energy) go on from their last exported values"
        );
    }

    /// Writes the last values of the series that outlive a boot where one changed, at most
    /// every [`LASTING_EVERY`] unless `last` (the last export).
    pub fn keep_lasting(&mut self, encoder: &mut Encoder, last: bool) {
        if !last && self.lasting_at.is_some_and(|t| t.elapsed() < LASTING_EVERY) {
            return;
        }
        let Some(series) = encoder.lasting_changed() else {
            return;
        };
        self.lasting_at = Some(Instant::now());
        let kept = Lasting {
            probe: probe(),
            series,
        };
        if let Err((path, e)) = self.state.store(LASTING, &kept)
            && !std::mem::replace(&mut self.lasting_warned, true)
        {
            tracing::warn!(file = %path.display(), error = %e, "cannot save the last values of the OTLP counters that outlive a reboot; after a reboot or a crash their first export reports whole values");
        }
    }

    /// [`Resume::take`]'s part for the clean stop of this boot.
    fn take_boot(&self, encoder: &mut Encoder) -> bool {
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

    /// A delta encoder started at 10 ns, with an empty envelope.
    fn delta() -> Encoder {
        let envelope = super::super::encode::Envelope {
            resource: Vec::new(),
            schema_url: String::new(),
            scope: (String::new(), String::new()),
        };
        Encoder::new(envelope, true, 10)
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

    /// The values of the counters that outlive a reboot are written while the agent runs (a
    /// change, at most every LASTING_EVERY, and at the last export), taken by a start in any
    /// boot, crash or not, and kept; another build's are not taken.
    #[test]
    fn counters_that_outlive_a_reboot_are_kept_across_boots_and_crashes() {
        use crate::model::view::Snapshot;
        use crate::model::{Metric, Model, Sample};

        let d = dir("lasting");
        boot(&d, "boot-a");
        let file = d.join("state/otlp-delta-lasting.json");
        let bmc = |j: f64| {
            let m = Model::new();
            m.publish(
                "redfish",
                "bmc-a",
                vec![
                    Sample::new(Metric::BmcEnergy, j)
                        .with("hw.id", "PSU0")
                        .with("junction.target", "bmc-a"),
                ],
            );
            m
        };
        // The energy point of an export of `m`, read back from the request.
        let energy = |e: &mut Encoder, m: &Model| -> f64 {
            use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
            use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
            use prost::Message as _;
            let snap = Snapshot::take(m);
            let (bytes, _) = e.encode(&snap.view(), 20);
            let req = ExportMetricsServiceRequest::decode(bytes).expect("request");
            let m = req.resource_metrics[0].scope_metrics[0]
                .metrics
                .iter()
                .find(|m| m.name == "bmc.energy")
                .expect("bmc.energy");
            let Some(metric::Data::Sum(s)) = &m.data else {
                panic!("a sum")
            };
            match s.data_points[0].value {
                Some(number_data_point::Value::AsDouble(v)) => v,
                ref other => panic!("{other:?}"),
            }
        };

        let mut r = Resume::open(&d.join("state"), &d.join("proc"));
        let mut e = delta();
        assert!(!r.take(&mut e));
        assert_eq!(energy(&mut e, &bmc(1000.0)), 1000.0);
        r.keep_lasting(&mut e, false);
        assert!(file.exists(), "written at the first change");
        // Within LASTING_EVERY: not written again, until the last export.
        energy(&mut e, &bmc(1100.0));
        std::fs::remove_file(&file).expect("remove");
        r.keep_lasting(&mut e, false);
        assert!(!file.exists(), "not within LASTING_EVERY");
        r.keep_lasting(&mut e, true);
        assert!(file.exists(), "the last export writes it");

        // A crash, then a reboot: no clean stop's state, the BMC's energy goes on.
        boot(&d, "boot-b");
        let r = Resume::open(&d.join("state"), &d.join("proc"));
        let mut e = delta();
        assert!(!r.take(&mut e), "no clean stop to go on from");
        assert!(file.exists(), "kept after a start");
        assert_eq!(energy(&mut e, &bmc(1250.0)), 150.0);
        // Another build's keys: not taken.
        let other = Lasting {
            probe: probe() ^ 1,
            series: vec![(1, 1.0)],
        };
        r.state.store(LASTING, &other).expect("stored");
        let mut e = delta();
        r.take(&mut e);
        assert_eq!(energy(&mut e, &bmc(1250.0)), 1250.0);
        let _ = std::fs::remove_dir_all(&d);
    }
}

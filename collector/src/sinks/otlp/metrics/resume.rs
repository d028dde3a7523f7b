//! Delta temporality across a restart. A counter's delta point is its increase since the
//! previous export, and an encoder that starts knows no previous export: its first point is
//! the counter's whole value. For the hardware's counters (energy since the driver loaded,
//! ECC and NVLink errors, the XIDs of this boot, which the kernel-log source keeps across
//! restarts) that whole value was already reported, so a backend that adds up deltas counted
//! it again at every restart of the agent. So the exporter saves an export's time and each
//! counter series' value in it (`otlp-delta.json` in `state_dir`) while it runs: after its
//! first export, then at most every [`KEEP_EVERY`], and after its last export. A start takes
//! them: its first points are the increase since that export, from that export's time.
//!
//! The file is used only from the same boot (the driver's counters start again at a reboot)
//! and a build that keys series the same way; otherwise the first points are whole values.
//! It is kept when taken: a start that crashes before its first export leaves it for the next
//! (which then goes on from the same export, none having been made since). After a crash,
//! what rose between the last save and the crash is reported again: at most [`KEEP_EVERY`] and
//! an interval of increase, where before the file was written only at a clean stop a crash
//! made every counter report its whole value again. A save that fails removes the file, so
//! that a later start never goes on from values older than the last save.
//!
//! Series that go on counting across a reboot (a GPU's lifetime ECC count, a BMC's energy:
//! [`outlives_boot`](super::encode::delta::outlives_boot)) would report their whole value
//! again after every reboot, a value a backend already added up. Their last values go to a second file
//! (`otlp-delta-lasting.json`) of any boot, written in the same way (when one changed). A
//! start takes it (and keeps it) whatever the boot: such a series without a value of its own
//! in the run (after a reboot, or back after a gap) reports its increase since its kept value.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::encode::{Encoder, series_key};
use crate::model::state::{StateDir, boot_id};

/// The file in `state_dir` (`otlp-delta.json`).
const FILE: &str = "otlp-delta";

/// The file of the series that outlive a boot (`otlp-delta-lasting.json`).
const LASTING: &str = "otlp-delta-lasting";

/// The least time between two writes of each file while the agent runs (counters change at
/// nearly every export; each write is synced to disk).
pub const KEEP_EVERY: Duration = Duration::from_secs(15);

/// More series than a node has are not taken (the 64-GPU node has about 6,000 counter
/// series).
const MAX_SERIES: usize = 1 << 20;

/// What is saved of this boot's counters.
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
    /// When [`FILE`] was last written.
    saved_at: Option<Instant>,
    /// Whether a failed write of [`FILE`] was logged (once: it is tried again at each save).
    save_warned: bool,
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
            saved_at: None,
            save_warned: false,
            lasting_at: None,
            lasting_warned: false,
        }
    }

    /// Goes on from the last export saved, when it is from this boot and this build's keys;
    /// then, whatever the boot, from the last values of the series that outlive a boot. Both
    /// files are kept. Whether it went on from this boot's.
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

    /// After an export: saves this boot's counters (after the first export, then at most every
    /// [`KEEP_EVERY`]) and the last values of the series that outlive a boot where one
    /// changed (at most every [`KEEP_EVERY`]); both whatever the time if `last` (the last
    /// export).
    pub fn keep(&mut self, encoder: &mut Encoder, last: bool) {
        self.keep_boot(encoder, last);
        self.keep_lasting(encoder, last);
    }

    fn keep_boot(&mut self, encoder: &Encoder, last: bool) {
        if !last && self.saved_at.is_some_and(|t| t.elapsed() < KEEP_EVERY) {
            return;
        }
        let Some((last_ns, series)) = encoder.delta_state() else {
            return;
        };
        self.saved_at = Some(Instant::now());
        let saved = Saved {
            boot_id: self.boot.clone(),
            probe: probe(),
            last_ns,
            series,
        };
        let Err((path, e)) = self.state.store(FILE, &saved) else {
            return;
        };
        // An older save, taken after a crash, would report again all that rose since it.
        let removed = self.state.remove(FILE).is_ok();
        if !std::mem::replace(&mut self.save_warned, true) {
            if removed {
                tracing::warn!(file = %path.display(), error = %e, "cannot save the OTLP delta state; after a restart the first export reports whole counter values");
            } else {
                tracing::error!(file = %path.display(), error = %e, "cannot save or remove the OTLP delta state; after a crash the first export reports again what rose since the file's last save (remove it)");
            }
        }
    }

    fn keep_lasting(&mut self, encoder: &mut Encoder, last: bool) {
        if !last && self.lasting_at.is_some_and(|t| t.elapsed() < KEEP_EVERY) {
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
            tracing::warn!(file = %path.display(), error = %e, "cannot save the last values of the OTLP counters that outlive a reboot; after a reboot their first export reports whole values");
        }
    }

    /// [`Resume::take`]'s part for this boot's counters.
    fn take_boot(&self, encoder: &mut Encoder) -> bool {
        let Some(saved) = self.state.load::<Saved>(FILE) else {
            return false;
        };
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
        delta_at(10)
    }

    /// A delta encoder started at `start_ns`, with an empty envelope.
    fn delta_at(start_ns: u64) -> Encoder {
        let envelope = super::super::encode::Envelope {
            resource: Vec::new(),
            schema_url: String::new(),
            scope: (String::new(), String::new()),
        };
        Encoder::new(envelope, true, start_ns)
    }

    fn boot(d: &Path, id: &str) {
        std::fs::write(d.join("proc/sys/kernel/random/boot_id"), format!("{id}\n")).expect("boot");
    }

    /// A model holding `s` alone.
    fn one(s: crate::model::Sample) -> std::sync::Arc<crate::model::Model> {
        let m = crate::model::Model::new();
        m.publish("test", "one", vec![s]);
        m
    }

    /// The value of `metric`'s first point in an export of `m` at `now_ns`.
    fn point(e: &mut Encoder, m: &crate::model::Model, metric: &str, now_ns: u64) -> f64 {
        use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
        use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
        use prost::Message as _;
        let snap = crate::model::view::Snapshot::take(m);
        let (bytes, _) = e.encode(&snap.view(), now_ns);
        let req = ExportMetricsServiceRequest::decode(bytes).expect("request");
        let m = req.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .find(|m| m.name == metric)
            .unwrap_or_else(|| panic!("{metric}"));
        let Some(metric::Data::Sum(s)) = &m.data else {
            panic!("a sum")
        };
        match s.data_points[0].value {
            Some(number_data_point::Value::AsDouble(v)) => v,
            ref other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_saved_state_is_taken_only_in_its_boot_and_build_and_kept() {
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
        // Saved in this boot by this build: taken, and kept (a start that crashes before its
        // first export leaves it to the next, which goes on from the same export).
        store(saved("boot-a", probe()));
        assert!(r.take(&mut delta()));
        assert!(file.exists(), "kept");
        assert!(r.take(&mut delta()));
        // From another boot, or keyed by another build: not used.
        for s in [saved("boot-b", probe()), saved("boot-a", probe() ^ 1)] {
            store(s);
            assert!(!r.take(&mut delta()));
        }
        // A corrupt file starts clean too.
        std::fs::write(&file, b"{\"boot_id\":").expect("write");
        assert!(!r.take(&mut delta()));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// This boot's counters are saved while the agent runs (the first export, then at most
    /// every KEEP_EVERY, and the last export): a start after a crash goes on from the last
    /// save. A save that fails removes the file rather than leave an older one to be taken.
    #[test]
    fn this_boots_counters_are_saved_while_running_for_a_start_after_a_crash() {
        use crate::model::{Metric, Sample};

        let d = dir("running");
        boot(&d, "boot-a");
        let file = d.join("state/otlp-delta.json");
        let gpu = |errors: f64| {
            one(Sample::new(Metric::EccErrors, errors)
                .with("hw.id", "GPU-0")
                .with("error.type", "corrected"))
        };
        let errors = |e: &mut Encoder, n: f64, at: u64| point(e, &gpu(n), "hw.errors", at);

        let mut r = Resume::open(&d.join("state"), &d.join("proc"));
        let mut e = delta();
        assert!(!r.take(&mut e));
        assert_eq!(errors(&mut e, 5.0, 20), 5.0);
        r.keep(&mut e, false);
        assert!(file.exists(), "saved after the first export");
        // Within KEEP_EVERY: not saved again; the last export is.
        assert_eq!(errors(&mut e, 7.0, 30), 2.0);
        r.keep(&mut e, false);
        assert_eq!(r.state.load::<Saved>(FILE).expect("saved").last_ns, 20);
        assert_eq!(errors(&mut e, 8.0, 40), 1.0);
        r.keep(&mut e, true);
        let saved: Saved = r.state.load(FILE).expect("saved");
        assert_eq!((saved.last_ns, saved.series.len()), (40, 1));

        // A crash after that save (say after one more export, of 9): the next start goes on
        // from the save (8 at 40), so only what rose since it is reported again.
        let mut e = delta_at(45);
        assert!(r.take(&mut e));
        assert_eq!(errors(&mut e, 10.0, 50), 2.0);

        // The save fails (its temporary file cannot be made): the older file is removed.
        std::fs::create_dir(d.join(format!("state/.otlp-delta.json.{}.tmp", std::process::id())))
            .expect("block the temporary file");
        r.keep(&mut e, true);
        assert!(!file.exists(), "an older save is not left to be taken");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The values of the counters that outlive a reboot are written while the agent runs (a
    /// change, at most every KEEP_EVERY, and at the last export), taken by a start in any
    /// boot, crash or not, and kept; another build's are not taken.
    #[test]
    fn counters_that_outlive_a_reboot_are_kept_across_boots_and_crashes() {
        use crate::model::{Metric, Model, Sample};

        let d = dir("lasting");
        boot(&d, "boot-a");
        let file = d.join("state/otlp-delta-lasting.json");
        let bmc = |j: f64| {
            one(Sample::new(Metric::BmcEnergy, j)
                .with("hw.id", "PSU0")
                .with("junction.target", "bmc-a"))
        };
        let energy = |e: &mut Encoder, m: &Model| point(e, m, "bmc.energy", 20);

        let mut r = Resume::open(&d.join("state"), &d.join("proc"));
        let mut e = delta();
        assert!(!r.take(&mut e));
        assert_eq!(energy(&mut e, &bmc(1000.0)), 1000.0);
        r.keep_lasting(&mut e, false);
        assert!(file.exists(), "written at the first change");
        // Within KEEP_EVERY: not written again, until the last export.
        energy(&mut e, &bmc(1100.0));
        std::fs::remove_file(&file).expect("remove");
        r.keep_lasting(&mut e, false);
        assert!(!file.exists(), "not within KEEP_EVERY");
        r.keep_lasting(&mut e, true);
        assert!(file.exists(), "the last export writes it");

        // A reboot: nothing of this boot to go on from, the BMC's energy goes on.
        boot(&d, "boot-b");
        let r = Resume::open(&d.join("state"), &d.join("proc"));
        let mut e = delta();
        assert!(!r.take(&mut e), "nothing of this boot to go on from");
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

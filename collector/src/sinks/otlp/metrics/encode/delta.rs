//! What delta temporality keeps per series: each counter's last value (by [`series_key`]),
//! and the last values of the series that outlive a boot, for `resume.rs` to keep across
//! reboots.

use std::hash::{Hash, Hasher};

use super::Encoder;
use super::attributes::attributes;
use crate::model::view::View;
use crate::model::{Metric, REGISTRY, Sample};

/// Series that outlive the boot whose last values an encoder keeps, at most: a node has a
/// few hundred (two lifetime ECC counts a GPU, a BMC's energy counters).
pub(super) const MAX_LASTING: usize = 4096;

/// Of [`MAX_LASTING`], the slots only GPUs' lifetime ECC series take: a BMC's counters (up to
/// 4,096 readings a target) cannot crowd them out (a node's GPUs have a few hundred at most).
pub(super) const LIFETIME_RESERVE: usize = 1024;

/// Whether a counter series goes on counting across the host's reboot, so that its whole
/// value after a reboot was reported before it: a GPU's lifetime ECC count (kept in its
/// InfoROM) and a BMC's counters (`junction.target`: energy a BMC counts while the host
/// reboots; not Junction's own counts of its polls of a BMC). The driver's, the kernel's and
/// the NICs' counters start again at a boot.
pub(super) fn outlives_boot(s: &Sample) -> bool {
    s.metric == Metric::EccErrorsLifetime
        || (s.attr("junction.target").is_some()
            && !counted_by_the_agent(REGISTRY[s.metric as usize].name))
}

/// Whether a counter is counted by Junction itself from the agent's start (its own telemetry,
/// the eBPF probes' counts, the daemon restarts it saw), as against the hardware's counters
/// (the driver's since it loaded, the kernel's and the NICs' since the boot, the XIDs and
/// kernel signatures of this boot, which the kernel-log source keeps across restarts).
pub(super) fn counted_by_the_agent(name: &str) -> bool {
    name.starts_with("junction.")
        || name.starts_with("gpu.process.driver.")
        || name == "node.daemon.restarts"
}

impl Encoder {
    /// Series whose last value delta keeps (0 for cumulative).
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.previous.len()
    }

    /// With delta temporality: the last export's time and each counter series' last value
    /// (by the hash [`Encoder::delta_of`] keys it by), for a restart to go on from.
    pub fn delta_state(&self) -> Option<(u64, Vec<(u64, f64)>)> {
        self.delta.then(|| {
            let series = self
                .previous
                .iter()
                .filter(|(_, (v, _))| v.is_finite())
                .map(|(h, (v, _))| (*h, *v))
                .collect();
            (self.last_ns, series)
        })
    }

    /// With delta temporality, goes on from a stopped encoder's [`Encoder::delta_state`]:
    /// the first export's counters report their increase since that encoder's last export,
    /// and its points start at that export's time (a series it did not have reports its
    /// whole value, as at any start). Nothing happens with cumulative temporality, or for a
    /// state from the future (a clock set back since: the sink's start is used). Whether it
    /// went on.
    pub fn resume(&mut self, last_ns: u64, series: &[(u64, f64)]) -> bool {
        if !self.delta || last_ns > self.start_ns {
            return false;
        }
        self.last_ns = last_ns;
        self.previous = series
            .iter()
            .map(|&(h, v)| (h, (v, self.generation)))
            .collect();
        true
    }

    /// With delta temporality, takes the last values of series that outlive a boot (a state
    /// kept across reboots: [`Encoder::lasting_changed`]): such a series with no value of its
    /// own in this encoder (none since its start or [`Encoder::resume`], or gone from the
    /// last export) reports its increase since that value (its whole value where it went
    /// back), not its whole value. At most [`MAX_LASTING`] are taken. How many were taken.
    pub fn prime_lasting(&mut self, series: &[(u64, f64)]) -> usize {
        if !self.delta {
            return 0;
        }
        let mut n = 0;
        for &(h, v) in series.iter().filter(|(_, v)| v.is_finite()) {
            if self.lasting.len() >= MAX_LASTING {
                break;
            }
            self.lasting.insert(h, v);
            n += 1;
        }
        n
    }

    /// The last values of the series that outlive a boot, when one has changed (or was first
    /// seen) since the last call; `None` when none has, and with cumulative temporality.
    pub fn lasting_changed(&mut self) -> Option<Vec<(u64, f64)>> {
        if !std::mem::take(&mut self.lasting_changed) {
            return None;
        }
        Some(self.lasting.iter().map(|(h, v)| (*h, *v)).collect())
    }

    /// Notes a series' value where it outlives a boot.
    fn note_lasting(&mut self, key: u64, value: f64, lifetime: bool) {
        let bound = if lifetime {
            MAX_LASTING
        } else {
            MAX_LASTING - LIFETIME_RESERVE
        };
        let full = self.lasting.len() >= bound;
        match self.lasting.entry(key) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                if e.get().to_bits() != value.to_bits() {
                    e.insert(value);
                    self.lasting_changed = true;
                }
            }
            std::collections::hash_map::Entry::Vacant(e) if !full => {
                e.insert(value);
                self.lasting_changed = true;
            }
            std::collections::hash_map::Entry::Vacant(_) => {}
        }
    }

    /// A counter's increase since the previous export (its value the first time, and after
    /// the counter went back, as on a driver reload); for a series that outlives a boot, the
    /// first time is the first time it was kept ([`Encoder::prime_lasting`]).
    pub(super) fn delta_of(&mut self, view: &View<'_>, i: usize, gpu: &str, s: &Sample) -> f64 {
        let key = series_key(REGISTRY[i].name, attributes(view, i, gpu, s));
        let slot = self
            .previous
            .entry(key)
            .or_insert((f64::NAN, self.generation));
        let mut prev = slot.0;
        *slot = (s.value, self.generation);
        if outlives_boot(s) {
            // Unknown here (new since the start, or back after a gap): its last value of any
            // run, kept across reboots.
            if prev.is_nan()
                && let Some(v) = self.lasting.get(&key)
            {
                prev = *v;
            }
            self.note_lasting(key, s.value, s.metric == Metric::EccErrorsLifetime);
        }
        if prev.is_finite() && s.value >= prev {
            s.value - prev
        } else {
            s.value
        }
    }
}

/// The key delta keeps a series' last value by (and a restart's saved state holds): a hash of
/// the metric's name, not its registry index (a state saved by another build, whose registry
/// may list metrics in another order, is matched by what the series are), and its attributes.
pub(in crate::sinks::otlp::metrics) fn series_key<'a>(
    name: &str,
    attrs: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    for (k, v) in attrs {
        k.hash(&mut h);
        v.hash(&mut h);
    }
    h.finish()
}

//! The features disabled on one GPU, as its worker looks them up before every NVML call.

use crate::model::Feature;

/// Whether a disabled feature is tried again when the GPU's configuration changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// NOT_SUPPORTED: may change with MIG mode or after a GPU reset.
    Reprobe,
    /// The symbol is not in this driver's library: never, until the agent is restarted.
    Never,
}

/// The disabled features and a 1024-bit summary of them: a feature whose bit is clear is not
/// in the map, so the lookup before each call (an H100 with every group at 1 s: about 270 a
/// cycle, most for features that are not disabled) is a bit test rather than a hash-table
/// probe. A set bit only means "look in the map". Per-link features fill it fastest (18
/// links of each unsupported one): 54 features disabled leave 95 % of the bits clear.
#[derive(Debug, Default)]
pub struct Disabled {
    map: foldhash::HashMap<Feature, Retry>,
    bits: [u64; 16],
}

impl Disabled {
    /// The feature's bit (word, mask), from [`Feature::digest`] (which mixes in the name's
    /// last eight bytes: the names of a family share their start, `nvlink_error_replay`,
    /// `nvlink_error_crc_flit`).
    fn bit(f: &Feature) -> (usize, u64) {
        let h = f.digest().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54;
        ((h >> 6) as usize, 1 << (h & 63))
    }

    /// Whether `f` is disabled.
    #[inline]
    pub fn contains(&self, f: &Feature) -> bool {
        let (w, m) = Self::bit(f);
        self.bits[w] & m != 0 && self.map.contains_key(f)
    }

    /// Disables `f`.
    pub fn insert(&mut self, f: Feature, retry: Retry) {
        let (w, m) = Self::bit(&f);
        self.bits[w] |= m;
        self.map.insert(f, retry);
    }

    /// Enables `f` again.
    #[cfg(test)]
    pub fn remove(&mut self, f: &Feature) {
        if self.map.remove(f).is_some() {
            self.summarize();
        }
    }

    /// Enables every feature disabled for `retry` again, and returns them (the summary is
    /// made again once, not once a feature: a re-probe of an 18-link GPU enables a hundred).
    pub fn take(&mut self, retry: Retry) -> Vec<Feature> {
        let taken: Vec<Feature> = self.with(retry).collect();
        if !taken.is_empty() {
            self.map.retain(|_, r| *r != retry);
            self.summarize();
        }
        taken
    }

    /// Makes the summary again from the map.
    fn summarize(&mut self) {
        self.bits = [0; 16];
        for f in self.map.keys() {
            let (w, m) = Self::bit(f);
            self.bits[w] |= m;
        }
    }

    /// The features disabled for `retry`.
    pub fn with(&self, retry: Retry) -> impl Iterator<Item = Feature> + '_ {
        self.map
            .iter()
            .filter(move |(_, r)| **r == retry)
            .map(|(f, _)| *f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Features of every shape the workers use: plain, per link, per fan, names that share
    /// their first eight bytes; each found once inserted, none found before or after removal,
    /// whatever else is in the set.
    #[test]
    fn lookups_agree_with_the_set() {
        let names = [
            "power",
            "nvlink_errors",
            "nvlink_error_replay",
            "nvlink_error_recovery",
            "nvlink_state",
            "fan_speed",
            "retired_pages_dbe",
            "retired_pages_sbe",
            "x",
        ];
        let mut all = Vec::new();
        for name in names {
            all.push(Feature::from(name));
            for i in 0..18 {
                all.push(Feature::at(name, i));
            }
        }
        let mut d = Disabled::default();
        let mut truth = std::collections::HashSet::new();
        // Insert every third, then remove every other inserted one, checking all each time.
        for (step, f) in all.iter().enumerate() {
            if step % 3 == 0 {
                d.insert(*f, Retry::Reprobe);
                truth.insert(*f);
            }
        }
        for f in &all {
            assert_eq!(d.contains(f), truth.contains(f), "{f}");
        }
        let inserted: Vec<Feature> = truth.iter().copied().collect();
        for f in inserted.iter().step_by(2) {
            d.remove(f);
            truth.remove(f);
        }
        for f in &all {
            assert_eq!(d.contains(f), truth.contains(f), "{f} after removals");
        }
        // The same name at another address is the same feature.
        let owned = String::from("nvlink_errors");
        let moved: &'static str = Box::leak(owned.into_boxed_str());
        assert_eq!(
            d.contains(&Feature::at(moved, 3)),
            truth.contains(&Feature::at("nvlink_errors", 3))
        );
        assert_eq!(d.with(Retry::Reprobe).count(), truth.len());
        assert_eq!(d.with(Retry::Never).count(), 0);
        // Everything removed: no bit left, nothing found.
        for f in &all {
            d.remove(f);
        }
        assert_eq!(d.bits, [0; 16]);
        assert!(all.iter().all(|f| !d.contains(f)));
    }

    /// Names that share their digest (the same length, first and last eight bytes) are
    /// different features; a feature disabled again is listed once, for the later reason.
    #[test]
    fn features_that_share_a_digest_stay_apart() {
        let (a, b) = (
            Feature::at("nvlink_error_A_counter", 2),
            Feature::at("nvlink_error_B_counter", 2),
        );
        assert_eq!(a.digest(), b.digest());
        let mut d = Disabled::default();
        d.insert(a, Retry::Reprobe);
        assert!(d.contains(&a) && !d.contains(&b));
        assert!(!d.contains(&Feature::at("nvlink_error_A_counter", 3)));
        d.insert(b, Retry::Never);
        d.insert(a, Retry::Never);
        assert!(d.contains(&a) && d.contains(&b));
        assert_eq!(d.with(Retry::Never).count(), 2);
        assert_eq!(d.with(Retry::Reprobe).count(), 0);
        d.remove(&a);
        assert!(!d.contains(&a) && d.contains(&b));
    }

    /// A re-probe takes every feature disabled for it at once and leaves the others, found as
    /// before.
    #[test]
    fn a_reprobe_takes_its_features_and_leaves_the_others() {
        let mut d = Disabled::default();
        let mut never = Vec::new();
        let mut reprobe = std::collections::HashSet::new();
        for link in 0..18 {
            for (i, name) in ["nvlink_error_ecc_data", "nvlink5_counters", "gpm"]
                .into_iter()
                .enumerate()
            {
                let f = Feature::at(name, link);
                if i == 2 && link % 2 == 0 {
                    d.insert(f, Retry::Never);
                    never.push(f);
                } else {
                    d.insert(f, Retry::Reprobe);
                    reprobe.insert(f);
                }
            }
        }
        let taken = d.take(Retry::Reprobe);
        assert_eq!(taken.len(), reprobe.len());
        assert!(taken.iter().all(|f| reprobe.contains(f) && !d.contains(f)));
        assert!(never.iter().all(|f| d.contains(f)));
        assert_eq!(d.with(Retry::Reprobe).count(), 0);
        assert!(d.take(Retry::Reprobe).is_empty(), "nothing left to take");
        assert_eq!(d.take(Retry::Never).len(), never.len());
        assert_eq!(d.bits, [0; 16]);
    }

    /// The summary spreads the features of one GPU: with every link of three per-link
    /// features disabled (54), one of them of a family that shares its start and length
    /// (`nvlink_error_*`), most of the features read on each call still skip the map, the
    /// family's others included.
    #[test]
    fn disabled_links_leave_most_lookups_to_the_summary() {
        let mut d = Disabled::default();
        // ECC_DATA counts on NVLink 4 and later only: one of a family disabled on every link.
        for name in [
            "nvlink_link_recovery",
            "nvlink5_counters",
            "nvlink_error_ecc_data",
        ] {
            for link in 0..18 {
                d.insert(Feature::at(name, link), Retry::Reprobe);
            }
        }
        let set: u32 = d.bits.iter().map(|w| w.count_ones()).sum();
        assert!(set >= 48, "{set} bits for 54 features");
        let mut asked = 0;
        let mut to_map = 0;
        for name in [
            "nvlink_error_replay",
            "nvlink_error_recovery",
            "nvlink_error_crc_flit",
            "nvlink_error_crc_data",
            "nvlink_state",
            "nvlink_fields",
            "nvlink_throughput",
        ] {
            for link in 0..18 {
                let (w, m) = Disabled::bit(&Feature::at(name, link));
                asked += 1;
                to_map += u32::from(d.bits[w] & m != 0);
            }
        }
        assert!(
            to_map * 10 <= asked,
            "{to_map} of {asked} lookups reach the map"
        );
    }
}

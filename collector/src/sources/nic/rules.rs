//! When a NIC port is not ok. The defaults are those GPUd and NVSentinel document
//! (`../shared/reference/node-fabric-and-bus.md` §1.6–1.7; docs/HEALTH.md cites each):
//!
//! | reason | when | state | default from |
//! |---|---|---|---|
//! | `port_down` | not ACTIVE / LinkUp, having been (or, for InfiniBand, `expected_ports` set) | failed | NVSentinel (port DOWN is fatal) |
//! | `port_absent` | the device or port disappeared | failed | NVSentinel (device gone) |
//! | `rate_below_expected` | an InfiniBand port up at a rate under `expected_rate_gbps` | degraded | GPUd (`at_least_rate`), NVSentinel (rate renegotiation) |
//! | `port_flapping` | `flap_transitions` down→up within `flap_window_secs` | degraded | GPUd (3 flaps, 12 h) |
//! | `fatal_counter` | `link_downed`, `excessive_buffer_overrun_errors`, `local_link_integrity_errors`, `rnr_nak_retry_err` rose | failed | NVSentinel (delta > 0, fatal) |
//! | `error_rate` | `symbol_error` > 10/s or > 120/h (failed), `link_error_recovery` > 5/min, `port_rcv_errors` > 10/s, `local_ack_timeout_err` > 1/s, `port_xmit_discards` > 100/s, `roce_slow_restart` > 10/s | degraded (failed for 120/h) | NVSentinel |
//!
//! A counter stuck at its saturation value has no rate and raises nothing.

use std::time::{Duration, Instant};

use crate::model::HealthState;
use crate::model::health::closed_set;
use crate::sources::readings::{Readings, Shape};

closed_set! {
    /// Why a NIC port is not ok (`nic.health.reason`).
    pub enum NicCode {
        /// Down, having been up (or expected up).
        PortDown = "port_down",
        /// Gone from sysfs.
        PortAbsent = "port_absent",
        /// Up at a rate under the expected one.
        RateBelowExpected = "rate_below_expected",
        /// Down and up again too often.
        PortFlapping = "port_flapping",
        /// A counter that must never rise rose.
        FatalCounter = "fatal_counter",
        /// An error counter rising faster than its threshold.
        ErrorRate = "error_rate",
    }
}

/// How a counter rule reads its counter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    /// Any increase since the last read.
    AnyIncrease,
    /// More than this many per second over the last read.
    PerSecond(f64),
    /// More than this many within the last minute.
    PerMinute(f64),
    /// More than this many within the last hour.
    PerHour(f64),
}

/// One rule on one counter.
#[derive(Debug, Clone, Copy)]
pub struct CounterRule {
    /// The counter (`counters/` or `hw_counters/` name).
    pub counter: &'static str,
    /// When it fires.
    pub threshold: Threshold,
    /// The state it puts the port in.
    pub state: HealthState,
}

const fn rule(counter: &'static str, threshold: Threshold, state: HealthState) -> CounterRule {
    CounterRule {
        counter,
        threshold,
        state,
    }
}

/// The counter rules (NVSentinel's `nic-health-monitor` defaults).
pub const COUNTER_RULES: &[CounterRule] = &[
    rule("link_downed", Threshold::AnyIncrease, HealthState::Failed),
    rule(
        "excessive_buffer_overrun_errors",
        Threshold::AnyIncrease,
        HealthState::Failed,
    ),
    rule(
        "local_link_integrity_errors",
        Threshold::AnyIncrease,
        HealthState::Failed,
    ),
    rule(
        "rnr_nak_retry_err",
        Threshold::AnyIncrease,
        HealthState::Failed,
    ),
    rule(
        "symbol_error",
        Threshold::PerHour(120.0),
        HealthState::Failed,
    ),
    rule(
        "symbol_error",
        Threshold::PerSecond(10.0),
        HealthState::Degraded,
    ),
    rule(
        "link_error_recovery",
        Threshold::PerMinute(5.0),
        HealthState::Degraded,
    ),
    rule(
        "port_rcv_errors",
        Threshold::PerSecond(10.0),
        HealthState::Degraded,
    ),
    rule(
        "local_ack_timeout_err",
        Threshold::PerSecond(1.0),
        HealthState::Degraded,
    ),
    rule(
        "port_xmit_discards",
        Threshold::PerSecond(100.0),
        HealthState::Degraded,
    ),
    rule(
        "roce_slow_restart",
        Threshold::PerSecond(10.0),
        HealthState::Degraded,
    ),
];

/// The longest window a rule looks back over.
pub const LONGEST_WINDOW: Duration = Duration::from_secs(3600);

/// How a counter's totals are kept: every read of the last two minutes (the rates per second
/// and per minute), one a minute over the rest of the hour (so that "the last hour" runs from
/// the first kept read within it, 59 to 60 minutes back).
const SHAPE: Shape = Shape {
    span: LONGEST_WINDOW,
    fine: Duration::from_secs(120),
    step: Duration::from_secs(60),
};

/// A counter's totals over the last hour.
#[derive(Debug, Clone, Default)]
pub struct History {
    points: Readings<u64>,
}

impl History {
    /// Adds the total read at `at`.
    pub fn push(&mut self, at: Instant, total: u64) {
        self.points.push(at, total, &SHAPE);
    }

    /// Whether `threshold` is exceeded now; the sentence says by how much.
    pub fn exceeds(&self, threshold: Threshold) -> Option<String> {
        let &(now, last) = self.points.last()?;
        let within = |w: Duration| self.points.since(w).map(|(_, v)| last.saturating_sub(*v));
        match threshold {
            Threshold::AnyIncrease => {
                let (_, prev) = self.points.iter().rev().nth(1)?;
                (last > *prev).then(|| format!("rose by {}", last - prev))
            }
            Threshold::PerSecond(max) => {
                let (t, prev) = self.points.iter().rev().nth(1)?;
                let dt = now.saturating_duration_since(*t).as_secs_f64();
                let rate = last.saturating_sub(*prev) as f64 / dt.max(1e-3);
                (rate > max).then(|| format!("{rate:.1}/s (threshold {max}/s)"))
            }
            Threshold::PerMinute(max) => within(Duration::from_secs(60))
                .filter(|n| *n as f64 > max)
                .map(|n| format!("{n} in the last minute (threshold {max})")),
            Threshold::PerHour(max) => within(LONGEST_WINDOW)
                .filter(|n| *n as f64 > max)
                .map(|n| format!("{n} in the last hour (threshold {max})")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_over_their_windows() {
        let t0 = Instant::now();
        let mut h = History::default();
        h.push(t0, 100);
        assert_eq!(h.exceeds(Threshold::AnyIncrease), None);
        h.push(t0 + Duration::from_secs(1), 100);
        assert_eq!(h.exceeds(Threshold::AnyIncrease), None);
        h.push(t0 + Duration::from_secs(2), 125);
        assert!(h.exceeds(Threshold::AnyIncrease).is_some());
        assert!(h.exceeds(Threshold::PerSecond(10.0)).is_some(), "25/s");
        assert!(h.exceeds(Threshold::PerSecond(30.0)).is_none());
        assert!(h.exceeds(Threshold::PerMinute(20.0)).is_some());
        assert!(h.exceeds(Threshold::PerHour(120.0)).is_none());
        // Two minutes later the burst is outside the minute, inside the hour.
        h.push(t0 + Duration::from_secs(122), 125);
        assert!(h.exceeds(Threshold::PerMinute(5.0)).is_none());
        assert!(h.exceeds(Threshold::PerHour(20.0)).is_some());
    }
}

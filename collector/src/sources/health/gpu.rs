//! What the evaluator remembers about each GPU between evaluations (trends, alarms, when each
//! reason last held, the recent ECC, PCIe and XID figures), and what it makes of them: the
//! rates the rules need, the thermal forecasts, and which reasons stay raised.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::HealthConfig;
use super::forecast::{Alarm, Params, Trend};
use super::rules::{Finding, Rates, find, samples};
use crate::model::health::{Action, Code};
use crate::model::{GpuSlot, HealthState, Metric, Model, Sample};
use crate::sources::readings::{Readings, Shape};

/// What the evaluator remembers about a GPU.
#[derive(Default)]
pub(super) struct GpuState {
    trends: BTreeMap<&'static str, Trend>,
    alarms: BTreeMap<&'static str, Alarm>,
    /// When each reason's condition last held.
    last_true: BTreeMap<Code, Instant>,
    thermal_violation: Option<f64>,
    pcie: VecDeque<(Instant, f64)>,
    ecc: Readings<f64>,
    xids: BTreeMap<u32, (f64, Instant)>,
    errors: BTreeMap<&'static str, u64>,
    /// The memory-repair figures last in the history.
    pub(super) memory: Option<String>,
}

/// The corrected-ECC totals a GPU keeps for its rate this hour against the hour before: two
/// hours, one a minute (kept at every evaluation, it was a reading every `interval_secs` for
/// two hours, 720 a GPU at the default 10 s, filling for the agent's first two hours).
const ECC_READINGS: Shape = Shape {
    span: Duration::from_secs(7200),
    fine: Duration::from_secs(60),
    step: Duration::from_secs(60),
};

/// Adds the corrected-ECC total `n` read at `now`; the errors in the last hour and in the
/// hour before it, once the readings reach back 50 minutes.
pub(super) fn ecc_per_hour(ecc: &mut Readings<f64>, now: Instant, n: f64) -> Option<(f64, f64)> {
    ecc.push(now, n, &ECC_READINGS);
    let (first, mid) = (ecc.first()?, ecc.since(Duration::from_secs(3600))?);
    (now.duration_since(first.0) >= Duration::from_secs(3000))
        .then(|| ((n - mid.1).max(0.0), (mid.1 - first.1).max(0.0)))
}

/// The forecast series: (location, limit type) of the NVML thresholds they aim at.
const FORECASTS: [(&str, &str); 2] = [("gpu_die", "throttled"), ("memory_junction", "max")];

impl GpuState {
    /// The rates and recent events the rules need, from this evaluation's samples.
    pub(super) fn rates(
        &mut self,
        slot: &GpuSlot,
        now: Instant,
        xid_counts: &BTreeMap<(String, u32), f64>,
        hold: Duration,
    ) -> Rates {
        let st = self;
        let uuid = &slot.info.uuid;
        let mut rates = Rates::default();
        let all = || samples(slot);
        if let Some(v) = find(
            all(),
            Metric::ViolationTime,
            &[("gpu.violation.type", "thermal")],
        ) {
            rates.thermal_violation_rising = st.thermal_violation.is_some_and(|p| v > p);
            st.thermal_violation = Some(v);
        }
        if let Some(n) = find(all(), Metric::PcieReplay, &[]) {
            st.pcie.push_back((now, n));
            while st
                .pcie
                .front()
                .is_some_and(|(t0, _)| now.duration_since(*t0) > Duration::from_secs(60))
            {
                st.pcie.pop_front();
            }
            if let (Some(a), Some(b)) = (st.pcie.front(), st.pcie.back()) {
                let secs = b.0.duration_since(a.0).as_secs_f64();
                if secs >= 30.0 {
                    rates.pcie_replays_per_min = Some((b.1 - a.1).max(0.0) * 60.0 / secs);
                }
            }
        }
        if let Some(n) = find(all(), Metric::EccErrors, &[("error.type", "corrected")]) {
            rates.ecc_corrected_per_hour = ecc_per_hour(&mut st.ecc, now, n);
        }
        for ((id, code), n) in xid_counts.iter().filter(|((id, _), _)| id == uuid) {
            let _ = id;
            let e = st.xids.entry(*code).or_insert((*n, now - hold * 2));
            if *n > e.0 {
                e.1 = now;
            }
            e.0 = *n;
        }
        rates.xids = st
            .xids
            .iter()
            .filter(|(_, (_, at))| now.duration_since(*at) < hold)
            .map(|(c, _)| *c)
            .collect();
        // Reads that failed since the last evaluation (an unsupported feature is not
        // counted there: it is disabled).
        for (feature, n) in &slot.errors {
            if st.errors.get(feature).is_some_and(|p| n > p) {
                rates.unreadable.push((*feature).to_string());
            }
            st.errors.insert(feature, *n);
        }
        rates
    }

    /// The temperature forecasts (their series go into `out`) and the findings of those that
    /// persist.
    pub(super) fn forecasts(
        &mut self,
        slot: &GpuSlot,
        t: f64,
        (params, cfg): (&Params, &HealthConfig),
        out: &mut Vec<Sample>,
    ) -> Vec<Finding> {
        let st = self;
        let uuid = &slot.info.uuid;
        let all = || samples(slot);
        let mut findings = Vec::new();
        for (loc, limit_type) in FORECASTS {
            let temp = find(all(), Metric::Temperature, &[("hw.sensor_location", loc)]);
            let limit = find(
                all(),
                Metric::TemperatureLimit,
                &[("hw.sensor_location", loc), ("hw.limit_type", limit_type)],
            );
            let (Some(v), Some(limit)) = (temp, limit) else {
                continue;
            };
            let trend = st.trends.entry(loc).or_default();
            trend.push(t, v, params.window_secs);
            let alarm = st.alarms.entry(loc).or_default();
            let fc = trend.forecast(limit, t, params);
            if let Some(fc) = &fc {
                out.push(
                    Sample::new(Metric::TimeToThreshold, fc.eta_secs)
                        .with("hw.id", uuid.clone())
                        .with("hw.sensor_location", loc),
                );
            }
            let horizon = cfg.forecast_horizon_secs as f64;
            if alarm.step(fc.as_ref(), horizon, cfg.forecast_persist)
                && let Some(fc) = fc
            {
                findings.push(Finding {
                    code: Code::ThermalForecast,
                    state: HealthState::PredictedFailure,
                    action: Action::None,
                    detail: format!(
                        "{} at {:.1} °C rising {:.2} °C/min: reaches its limit of {limit} °C in about {:.0} min",
                        loc.replace('_', " "),
                        fc.level,
                        fc.slope * 60.0,
                        fc.eta_secs / 60.0
                    ),
                });
            }
        }
        findings
    }

    /// Raises what holds; clears what has not held for the hold time. (For a duplicated code,
    /// e.g. two coolant sensors, the first finding's detail is kept.)
    pub(super) fn settle(
        &mut self,
        model: &Model,
        uuid: &str,
        findings: Vec<Finding>,
        now: Instant,
        hold: Duration,
    ) {
        let st = self;
        let mut raised = std::collections::BTreeSet::new();
        for fnd in findings {
            st.last_true.insert(fnd.code, now);
            if raised.insert(fnd.code) {
                model.raise(uuid, fnd.code, fnd.state, fnd.action, fnd.detail);
            }
        }
        for code in super::rules::CODES {
            if raised.contains(code) {
                continue;
            }
            if let Some(last) = st.last_true.get(code)
                && now.duration_since(*last) >= hold
            {
                model.clear(uuid, *code);
                st.last_true.remove(code);
            }
        }
    }
}

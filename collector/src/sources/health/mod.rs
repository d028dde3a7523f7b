//! GPU health: every signal Junction gathers turned into a per-GPU verdict (`hw.status`) with
//! its reasons and one recommended action, and thermal forecasts.
//!
//! Every `interval_secs` it reads the model (NVML's samples, the XID counters, the BMC
//! readings), applies the rules (`rules.rs`), and raises or clears reasons. A reason is raised
//! as soon as its condition holds and cleared only once the condition has been absent for
//! `clear_after_secs` (default one hour), so that a signal oscillating around a threshold
//! changes a GPU's verdict at most once an hour. Reasons with a reset or reboot as their end
//! (Xid 79, the fatal XIDs, `reset_required`) are held by the sources that raise them, across
//! agent restarts. Forecasts (`forecast.rs`) need `persist` evaluations in a row under the
//! horizon before they count.

pub mod drift;
pub mod escalation;
pub mod fabric;
pub mod forecast;
mod gpu;
mod memory;
pub mod rules;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent::{Component, Ctx};
use crate::config::{Config, Invalid, config_section};
use crate::internal_events::{HealthInputUnreadable, InternalEvent};
use crate::model::bmc::{Level, Quantity};
use crate::model::health::{Action, Code};
use crate::model::{HealthState, Metric, Model, Sample};
use forecast::{Alarm, Params, Trend};
use gpu::GpuState;
use rules::Finding;

config_section! {
    /// `[health]`: the per-GPU verdict and the forecasts.
    pub struct HealthConfig {
        /// Evaluate the health rules and forecasts. Default: true.
        pub enabled: bool = true,
        /// Seconds between evaluations (also the forecasts' sampling period).
        pub interval_secs: u64 = 10,
        /// A reason clears once its condition has been absent this long (hysteresis).
        pub clear_after_secs: u64 = 3600,
        /// Seconds of history a temperature trend is fitted over.
        pub forecast_window_secs: u64 = 600,
        /// `predicted_failure` when a temperature is forecast to reach its limit within this
        /// many seconds.
        pub forecast_horizon_secs: u64 = 1200,
        /// Evaluations in a row under the horizon before the forecast counts.
        pub forecast_persist: u32 = 6,
        /// Forecast only within this many °C of the limit.
        pub forecast_gate_celsius: f64 = 25.0,
        /// Corrected ECC errors per hour from which a rising rate is a reason (degraded at most).
        pub ecc_rising_per_hour: f64 = 100.0,
        /// The same hardware or driver XID (or fatal kernel-log signature) on a GPU in two
        /// boots within this many seconds fails it for inspection (GPUd: 3 days).
        pub escalate_boots_window_secs: u64 = 259200,
        /// One XID this many times on a GPU within `xid_repeat_window_secs` degrades it
        /// (NVSentinel: 5 in a day).
        pub xid_repeat_count: u32 = 5,
        /// See `xid_repeat_count`.
        pub xid_repeat_window_secs: u64 = 86400,
        /// Xid 13 or 31 from this many processes on one GPU within the window: the GPU's.
        pub xid_repeat_processes: u32 = 3,
        /// An NVLink5 link whose effective bit-error rate (after FEC) is above this fails
        /// its GPU (DCGM: 1e-12).
        pub nvlink_effective_ber_max: f64 = 1e-12,
        /// The same health reason raised on a GPU in this many boots within
        /// `reboots_window_secs`: resets and reboots do not clear it (`resets_ineffective`).
        pub reboots_count: u32 = 3,
        /// See `reboots_count` (a week).
        pub reboots_window_secs: u64 = 604800,
        /// The event history (`history.jsonl` in the state directory) keeps at most this
        /// many bytes: past them the oldest half is dropped. At start only the file's last
        /// this many bytes are read (a file grown past it costs no more). At least 65536.
        pub history_max_bytes: u64 = 4194304,
        /// … and nothing older than this many seconds (14 days).
        pub history_max_age_secs: u64 = 1209600,
    }
}

impl HealthConfig {
    /// Adds every problem with this section to `out`.
    pub fn validate(&self, prefix: &str, out: &mut Vec<Invalid>) {
        if self.interval_secs == 0 || self.forecast_window_secs < 3 * self.interval_secs {
            out.push(Invalid {
                key: format!("{prefix}.forecast_window_secs"),
                message:
                    "interval_secs must be at least 1 and forecast_window_secs at least 3 intervals"
                        .into(),
            });
        }
        if self.history_max_bytes < 65536 {
            out.push(Invalid {
                key: format!("{prefix}.history_max_bytes"),
                message: "must be at least 65536 (64 KiB)".into(),
            });
        }
        if self.history_max_age_secs
            < self
                .escalate_boots_window_secs
                .max(self.reboots_window_secs)
        {
            out.push(Invalid {
                key: format!("{prefix}.history_max_age_secs"),
                message: "must be at least escalate_boots_window_secs and reboots_window_secs: the escalation rules read that far back".into(),
            });
        }
        if self.forecast_persist == 0 {
            out.push(Invalid {
                key: format!("{prefix}.forecast_persist"),
                message: "must be at least 1".into(),
            });
        }
    }
}

/// The health evaluator.
pub const COMPONENT: Component = Component {
    name: "health",
    enabled: |c| c.health.enabled,
    start: |c, ctx| Box::pin(async move { Ok(tokio::spawn(run(c, ctx))) }),
    once: None,
    inspect: None,
    // After the sources' one collection: the rules once.
    derive: Some(|c, model| {
        Box::pin(async move {
            let mut ev = Evaluator::new(c.health.clone(), c.expect.clone());
            ev.evaluate(&model);
        })
    }),
    off_but_asked: None,
};

struct Evaluator {
    cfg: HealthConfig,
    expect: drift::ExpectConfig,
    drift: drift::Drift,
    params: Params,
    start: Instant,
    gpus: BTreeMap<String, GpuState>,
    coolant: BTreeMap<String, (Trend, Alarm)>,
}

impl Evaluator {
    fn new(cfg: HealthConfig, expect: drift::ExpectConfig) -> Self {
        let ber_max = cfg.nvlink_effective_ber_max;
        let params = Params {
            window_secs: cfg.forecast_window_secs as f64,
            gate: cfg.forecast_gate_celsius,
            ..Params::default()
        };
        Self {
            cfg,
            expect,
            drift: drift::Drift::new(ber_max),
            params,
            start: Instant::now(),
            gpus: BTreeMap::new(),
            coolant: BTreeMap::new(),
        }
    }

    fn evaluate(&mut self, model: &Model) {
        let now = Instant::now();
        let t = now.duration_since(self.start).as_secs_f64();
        let mut out = Vec::new();
        // Node-wide cooling: BMC readings past their thresholds, leaks, coolant forecasts.
        let cooling = self.cooling(model, t, &mut out);
        let xid_counts = xid_counts(model);
        // What the history across boots says.
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let params = escalation::Params {
            boots_window_secs: self.cfg.escalate_boots_window_secs as f64,
            repeat_count: self.cfg.xid_repeat_count.max(1),
            repeat_window_secs: self.cfg.xid_repeat_window_secs as f64,
            processes: self.cfg.xid_repeat_processes.max(1),
            reboots: self.cfg.reboots_count.max(2),
            reboots_window_secs: self.cfg.reboots_window_secs as f64,
        };
        // The history is let go before anything is appended to it (a memory change, a
        // transition): an append while a reader holds the entries copies them all.
        let escalated = {
            let history = model.history.entries();
            for (reason, detail) in escalation::node_escalations(&history, unix, &params) {
                tracing::debug!(reason, detail, "node reason from the history");
                out.push(Sample::new(Metric::NodeReason, 1.0).with("node.health.reason", reason));
            }
            escalation::escalations(&history, unix, &params)
        };
        let drifted = self.drift.evaluate(model, &self.expect, &mut out);
        let hold = Duration::from_secs(self.cfg.clear_after_secs);
        for slot in model.snapshot() {
            let uuid = slot.info.uuid.clone();
            let st = self.gpus.entry(uuid.clone()).or_default();
            memory::remember(model, &uuid, &slot, &mut st.memory);
            let rates = st.rates(&slot, now, &xid_counts, hold);
            if !rates.unreadable.is_empty() {
                HealthInputUnreadable {
                    gpu: &uuid,
                    signals: &rates.unreadable,
                }
                .emit(model);
            }
            let mut findings = rules::evaluate(&slot, &rates, self.cfg.ecc_rising_per_hour);
            findings.extend(cooling.iter().cloned());
            // The NICs of its rail and its PCIe path (the nic and pcie sources).
            findings.extend(model.fabric.findings(&slot.info.pci_bus_id));
            findings.extend(escalated.get(&uuid).cloned().unwrap_or_default());
            findings.extend(drifted.get(&uuid).cloned().unwrap_or_default());
            findings.extend(st.forecasts(&slot, t, (&self.params, &self.cfg), &mut out));
            st.settle(model, &uuid, findings, now, hold);
            // The action series: one per GPU.
            let reasons = model.health.reasons(&uuid);
            out.push(
                Sample::new(Metric::HealthAction, 1.0)
                    .with("hw.id", uuid.clone())
                    .with(
                        "gpu.health.action",
                        crate::model::health::action(&reasons).as_str(),
                    ),
            );
        }
        model.publish("health", "gpus", out);
    }

    /// Cooling findings for every GPU of the node: BMC readings past their thresholds, leaks,
    /// coolant supply forecasts (their series go into `out`).
    fn cooling(&mut self, model: &Model, t: f64, out: &mut Vec<Sample>) -> Vec<Finding> {
        let mut cooling: Vec<Finding> = Vec::new();
        for (_, poll) in model.bmc_polls() {
            for r in &poll.readings {
                match r.quantity {
                    Quantity::Flow | Quantity::Pressure | Quantity::CoolantTemperature
                        if matches!(r.state, Some(Level::Warning | Level::Critical)) =>
                    {
                        cooling.push(Finding {
                            code: Code::CoolantOutOfRange,
                            state: HealthState::Degraded,
                            action: Action::None,
                            detail: format!(
                                "{} ({}) is past its threshold: {}",
                                r.name, poll.target, r.value
                            ),
                        });
                    }
                    // A leak detector's warning degrades the node's GPUs; critical fails them.
                    Quantity::Leak if (1.0..=2.0).contains(&r.value) => {
                        let critical = r.value >= 2.0;
                        cooling.push(Finding {
                            code: Code::LeakDetected,
                            state: if critical {
                                HealthState::Failed
                            } else {
                                HealthState::Degraded
                            },
                            action: Action::DrainAndService,
                            detail: format!(
                                "leak detector {} ({}) reports {}",
                                r.name,
                                poll.target,
                                if critical { "a leak" } else { "a warning" }
                            ),
                        });
                    }
                    _ => {}
                }
                // The coolant supply temperature against its upper threshold (a connector's
                // supply, or a sensor at the liquid inlet).
                let supply = (r.quantity == Quantity::CoolantTemperature
                    && r.point == Some("supply"))
                    || (r.quantity == Quantity::Temperature
                        && r.location.as_deref() == Some("liquid_inlet"));
                if supply {
                    let limit = r
                        .thresholds
                        .iter()
                        .filter(|(n, _)| n.starts_with("upper"))
                        .map(|(_, v)| *v)
                        .fold(f64::INFINITY, f64::min);
                    if limit.is_finite() {
                        let (trend, alarm) = self.coolant.entry(r.id.clone()).or_default();
                        trend.push(t, r.value, self.params.window_secs);
                        let fc = trend.forecast(limit, t, &self.params);
                        if let Some(fc) = &fc {
                            let mut s = Sample::new(Metric::CoolantTimeToThreshold, fc.eta_secs)
                                .with("hw.id", r.id.clone())
                                .with("hw.name", r.name.clone())
                                .with("junction.target", poll.target.clone());
                            s.attrs.push(("cooling.coolant.point", "supply".into()));
                            out.push(s);
                        }
                        let horizon = self.cfg.forecast_horizon_secs as f64;
                        if alarm.step(fc.as_ref(), horizon, self.cfg.forecast_persist)
                            && let Some(fc) = fc
                        {
                            cooling.push(Finding {
                                code: Code::CoolantOutOfRange,
                                state: HealthState::Degraded,
                                action: Action::None,
                                detail: format!(
                                    "{} ({}) rising: reaches {limit} °C in about {:.0} min",
                                    r.name,
                                    poll.target,
                                    fc.eta_secs / 60.0
                                ),
                            });
                        }
                    }
                }
            }
        }
        cooling
    }
}

/// The XID counters per (GPU, code), from the sample sets they are published in (no
/// snapshot: its per-GPU status and identity samples are not needed here).
fn xid_counts(model: &Model) -> BTreeMap<(String, u32), f64> {
    let mut counts = BTreeMap::new();
    for set in model.sets() {
        for s in set.iter().filter(|s| s.metric == Metric::XidErrors) {
            if let (Some(gpu), Some(Ok(xid))) = (s.attr("hw.id"), s.attr("gpu.xid").map(str::parse))
            {
                counts.insert((gpu.to_string(), xid), s.value);
            }
        }
    }
    counts
}

async fn run(config: Arc<Config>, ctx: Ctx) {
    let cfg = config.health.clone();
    ctx.model.set_source_up("health", true);
    let mut ev = Evaluator::new(cfg.clone(), config.expect.clone());
    let interval = Duration::from_secs(cfg.interval_secs.max(1));
    loop {
        ev.evaluate(&ctx.model);
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = ctx.shutdown.wait() => break,
        }
    }
}

#[cfg(test)]
mod tests;

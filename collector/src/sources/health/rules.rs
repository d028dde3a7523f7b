//! The health rules: what a GPU's latest samples (and the node's cooling readings) say about
//! it. Each rule gives a reason code, the state it puts the GPU in and the action it calls
//! for. Where DCGM's health watches and GPUd agree, these agree (see the table test).
//!
//! | reason | when | state | action |
//! |---|---|---|---|
//! | `ecc_uncorrectable` | volatile uncorrected ECC errors > 0 | failed | reset_gpu |
//! | `remap_failed` | a row remapping failed | failed | drain_and_service |
//! | `remap_pending` | a row remapping waits for a reset | degraded | reboot_node |
//! | `retired_pages_pending` | page retirement waits for a reboot | degraded | reset_gpu |
//! | `retired_pages_excess` | ≥ 63 retired pages | failed | drain_and_service |
//! | `recovery_action` | the driver asks for a reset, reboot or drain-and-reset / drain-P2P | failed / degraded | its action |
//! | `temperature_over_slowdown` | die ≥ slowdown or memory junction ≥ its max | degraded | none |
//! | `thermal_slowdown` | HW or SW thermal slowdown active, or thermal violation time rising | degraded | none |
//! | `hw_slowdown` | HW slowdown or power brake active | degraded | none |
//! | `pcie_replay_rate` | > 16 PCIe replays per minute | degraded | none |
//! | `xid_contained` | Xid 94 (contained memory error) | degraded | restart_app |
//! | `xid_retirement` | Xid 63 / 92 | degraded | none |
//! | `ecc_correctable_rising` | corrected ECC errors rising ≥ `ecc_rising_per_hour` | degraded | none |
//! | `signal_unreadable` | a health signal failed to read (not: unsupported) | degraded | none |
//! | `coolant_out_of_range` | a BMC flow, pressure or coolant sensor past a threshold | degraded | none |
//! | `leak_detected` | a BMC leak detector in warning / critical | degraded / failed | drain_and_service |
//! | `thermal_forecast` | die or memory temperature forecast to reach its limit within the horizon | predicted_failure | none |
//! | `rail_degraded` | a NIC port of the GPU's rail is not ok (the `nic` source) | degraded | none |
//! | `pcie_aer_fatal` | a fatal AER error on the GPU or the ports above it (the `pcie` source) | failed | drain_and_service |
//! | `pcie_aer_nonfatal` | non-fatal AER errors there, any in the last interval | degraded | none |
//! | `pcie_link_degraded` | the GPU's link narrower than its maximum, or slower for `link_grace_secs` | degraded | none |
//!
//! The kernel-log and NVML sources raise their own: `gpu_lost`, `reset_required`,
//! `gpu_unreachable`, `nvml_call_stuck`, `xid_79`, `xid_154`, `xid_fatal`.

pub use crate::model::health::Finding;
use crate::model::health::{Action, Code};
use crate::model::{GpuSlot, HealthState, Metric, Sample};

fn f(code: Code, state: HealthState, action: Action, detail: String) -> Finding {
    Finding {
        code,
        state,
        action,
        detail,
    }
}

/// Every reason code the rules can give (the health component clears those it raised).
pub const CODES: &[Code] = &[
    Code::EccUncorrectable,
    Code::RemapFailed,
    Code::RemapPending,
    Code::RetiredPagesPending,
    Code::RetiredPagesExcess,
    Code::RecoveryAction,
    Code::TemperatureOverSlowdown,
    Code::ThermalSlowdown,
    Code::HwSlowdown,
    Code::PcieReplayRate,
    Code::XidContained,
    Code::XidRetirement,
    Code::EccCorrectableRising,
    Code::SignalUnreadable,
    Code::CoolantOutOfRange,
    Code::LeakDetected,
    Code::ThermalForecast,
    Code::RailDegraded,
    Code::PcieAerFatal,
    Code::PcieAerNonfatal,
    Code::PcieLinkDegraded,
    Code::HardwareInspection,
    Code::XidRepeated,
    Code::ResetsIneffective,
    Code::ConfigDrift,
    Code::ModeChangePending,
    Code::FabricIncomplete,
    Code::FabricUnhealthy,
    Code::FabricManagerDown,
    Code::NvlinkBerHigh,
    Code::P2pLost,
];

/// The samples of a slot.
pub fn samples(slot: &GpuSlot) -> impl Iterator<Item = &Sample> {
    slot.groups.iter().flat_map(|g| g.iter())
}

/// The value of `metric` whose attributes include `attrs`.
pub fn find<'a>(
    mut it: impl Iterator<Item = &'a Sample>,
    metric: Metric,
    attrs: &[(&str, &str)],
) -> Option<f64> {
    it.find(|s| s.metric == metric && attrs.iter().all(|(k, v)| s.attr(k) == Some(v)))
        .map(|s| s.value)
}

/// Rates the rules need, from the previous evaluation.
#[derive(Debug, Clone, Default)]
pub struct Rates {
    /// Thermal violation time (s) rose since the last evaluation.
    pub thermal_violation_rising: bool,
    /// PCIe replays per minute.
    pub pcie_replays_per_min: Option<f64>,
    /// Corrected ECC errors per hour over the last hour, and over the hour before.
    pub ecc_corrected_per_hour: Option<(f64, f64)>,
    /// New Xid 94 / 63 / 92 occurrences in the hold period.
    pub xids: Vec<u32>,
    /// Features whose reads failed since the last evaluation.
    pub unreadable: Vec<String>,
}

/// The rules over a GPU's latest samples.
pub fn evaluate(slot: &GpuSlot, rates: &Rates, ecc_rising_per_hour: f64) -> Vec<Finding> {
    let mut out = Vec::new();
    memory_and_recovery(slot, &mut out);
    thermal(slot, rates, &mut out);
    events_and_rates(rates, ecc_rising_per_hour, &mut out);
    out
}

/// ECC, row remapping, page retirement, the driver's recovery action.
fn memory_and_recovery(slot: &GpuSlot, out: &mut Vec<Finding>) {
    use HealthState::{Degraded, Failed};
    let s = || samples(slot);
    // Since the driver loaded (hw.errors); the lifetime count would keep a replaced part's
    // history in the verdict.
    let ecc = |ty: &str| find(s(), Metric::EccErrors, &[("error.type", ty)]);
    if let Some(n) = ecc("uncorrected").filter(|n| *n > 0.0) {
        out.push(f(
            Code::EccUncorrectable,
            Failed,
            Action::ResetGpu,
            format!("{n} uncorrectable ECC errors since the driver loaded"),
        ));
    }
    if find(s(), Metric::RemapFailure, &[]) == Some(1.0) {
        out.push(f(
            Code::RemapFailed,
            Failed,
            Action::DrainAndService,
            "a row remapping failed: the GPU needs inspection".into(),
        ));
    }
    if find(s(), Metric::RemapPending, &[]) == Some(1.0) {
        out.push(f(
            Code::RemapPending,
            Degraded,
            Action::RebootNode,
            "a row remapping is pending until the GPU is reset".into(),
        ));
    }
    if find(s(), Metric::RetiredPending, &[]) == Some(1.0) {
        out.push(f(
            Code::RetiredPagesPending,
            Degraded,
            Action::ResetGpu,
            "pages wait to be retired at the next reset".into(),
        ));
    }
    let retired: f64 = s()
        .filter(|x| x.metric == Metric::RetiredPages)
        .map(|x| x.value)
        .sum();
    if retired >= 63.0 {
        out.push(f(
            Code::RetiredPagesExcess,
            Failed,
            Action::DrainAndService,
            format!("{retired} pages retired"),
        ));
    }
    for (name, state, action) in [
        ("gpu_reset", Failed, Action::ResetGpu),
        ("node_reboot", Failed, Action::RebootNode),
        ("drain_and_reset", Failed, Action::ResetGpu),
        ("drain_p2p", Degraded, Action::DrainAndService),
    ] {
        if find(
            s(),
            Metric::RecoveryAction,
            &[("gpu.recovery_action", name)],
        ) == Some(1.0)
        {
            out.push(f(
                Code::RecoveryAction,
                state,
                action,
                format!("the driver's recovery action is {name}"),
            ));
        }
    }
}

/// Temperatures against their limits, clock slowdowns.
fn thermal(slot: &GpuSlot, rates: &Rates, out: &mut Vec<Finding>) {
    use HealthState::Degraded;
    let s = || samples(slot);
    let temp = |loc: &str| find(s(), Metric::Temperature, &[("hw.sensor_location", loc)]);
    let limit = |loc: &str, ty: &str| {
        find(
            s(),
            Metric::TemperatureLimit,
            &[("hw.sensor_location", loc), ("hw.limit_type", ty)],
        )
    };
    if let (Some(t), Some(l)) = (temp("gpu_die"), limit("gpu_die", "throttled"))
        && t >= l
    {
        out.push(f(
            Code::TemperatureOverSlowdown,
            Degraded,
            Action::None,
            format!("die at {t} °C, slowdown at {l} °C"),
        ));
    } else if let (Some(t), Some(l)) = (temp("memory_junction"), limit("memory_junction", "max"))
        && t >= l
    {
        out.push(f(
            Code::TemperatureOverSlowdown,
            Degraded,
            Action::None,
            format!("memory junction at {t} °C, its maximum is {l} °C"),
        ));
    }
    let event =
        |r: &str| find(s(), Metric::ClockEvent, &[("gpu.clock.event.reason", r)]) == Some(1.0);
    if event("hw_thermal_slowdown")
        || event("sw_thermal_slowdown")
        || rates.thermal_violation_rising
    {
        out.push(f(
            Code::ThermalSlowdown,
            Degraded,
            Action::None,
            "clocks are held back by temperature".into(),
        ));
    }
    if event("hw_slowdown") || event("hw_power_brake_slowdown") {
        out.push(f(
            Code::HwSlowdown,
            Degraded,
            Action::None,
            "hardware slowdown (power brake or external signal) is active".into(),
        ));
    }
}

/// PCIe replays, recent XIDs, rising corrected ECC errors, unreadable inputs.
fn events_and_rates(rates: &Rates, ecc_rising_per_hour: f64, out: &mut Vec<Finding>) {
    use HealthState::Degraded;
    if let Some(r) = rates.pcie_replays_per_min.filter(|r| *r > 16.0) {
        out.push(f(
            Code::PcieReplayRate,
            Degraded,
            Action::None,
            format!("{r:.0} PCIe replays per minute"),
        ));
    }
    if rates.xids.contains(&94) {
        out.push(f(
            Code::XidContained,
            Degraded,
            Action::RestartApp,
            "Xid 94: a contained memory error; restart the application".into(),
        ));
    }
    if rates.xids.iter().any(|x| *x == 63 || *x == 92) {
        out.push(f(
            Code::XidRetirement,
            Degraded,
            Action::None,
            "Xid 63/92: memory retirement or a high single-bit error rate".into(),
        ));
    }
    if let Some((now, before)) = rates.ecc_corrected_per_hour
        && now >= ecc_rising_per_hour
        && now > 2.0 * before
    {
        out.push(f(
            Code::EccCorrectableRising,
            Degraded,
            Action::None,
            format!("{now:.0} corrected ECC errors in the last hour ({before:.0} the hour before)"),
        ));
    }
    if !rates.unreadable.is_empty() {
        out.push(f(
            Code::SignalUnreadable,
            Degraded,
            Action::None,
            format!("cannot read: {}", rates.unreadable.join(", ")),
        ));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::{GpuInfo, Group};

    fn slot(samples: Vec<Sample>) -> GpuSlot {
        let mut s = GpuSlot::new(GpuInfo::default());
        s.groups[Group::Errors.index()] = Arc::new(samples);
        s
    }

    fn codes(v: &[Finding]) -> Vec<(&'static str, HealthState, &'static str)> {
        v.iter()
            .map(|x| (x.code.as_str(), x.state, x.action.as_str()))
            .collect()
    }

    /// Rule by rule, what DCGM's health watches (PASS / WARN / FAIL) and GPUd (Healthy /
    /// Degraded / Unhealthy, with its suggested action) decide, and what Junction decides.
    #[test]
    fn agrees_with_dcgm_and_gpud() {
        use HealthState::{Degraded, Failed};
        let ecc = |ty: &'static str, n: f64| {
            Sample::new(Metric::EccErrors, n)
                .with("hw.type", "gpu")
                .with("error.type", ty)
        };
        let temp = |loc: &'static str, v: f64| {
            Sample::new(Metric::Temperature, v).with("hw.sensor_location", loc)
        };
        let limit = |loc: &'static str, ty: &'static str, v: f64| {
            Sample::new(Metric::TemperatureLimit, v)
                .with("hw.sensor_location", loc)
                .with("hw.limit_type", ty)
        };
        let recovery = |name: &'static str| {
            [
                "none",
                "gpu_reset",
                "node_reboot",
                "drain_p2p",
                "drain_and_reset",
            ]
            .map(|n| {
                Sample::new(Metric::RecoveryAction, f64::from(u8::from(n == name)))
                    .with("gpu.recovery_action", n)
            })
            .to_vec()
        };
        let clock = |r: &'static str| {
            vec![Sample::new(Metric::ClockEvent, 1.0).with("gpu.clock.event.reason", r)]
        };
        // (case, DCGM, GPUd, samples, rates, Junction's verdict)
        type Row = (
            &'static str,
            &'static str,
            &'static str,
            Vec<Sample>,
            Rates,
            Vec<(&'static str, HealthState, &'static str)>,
        );
        let rows: Vec<Row> = vec![
            (
                "volatile DBE",
                "FAIL",
                "-",
                vec![ecc("uncorrected", 1.0)],
                Rates::default(),
                vec![("ecc_uncorrectable", Failed, "reset_gpu")],
            ),
            (
                "corrected ECC only",
                "PASS",
                "Healthy (counted, no verdict)",
                vec![ecc("corrected", 5000.0)],
                Rates::default(),
                vec![],
            ),
            (
                "row remap failed",
                "FAIL",
                "Unhealthy, HARDWARE_INSPECTION",
                vec![Sample::new(Metric::RemapFailure, 1.0)],
                Rates::default(),
                vec![("remap_failed", Failed, "drain_and_service")],
            ),
            (
                "row remap pending",
                "-",
                "Unhealthy, REBOOT_SYSTEM",
                vec![Sample::new(Metric::RemapPending, 1.0)],
                Rates::default(),
                vec![("remap_pending", Degraded, "reboot_node")],
            ),
            (
                "retirement pending",
                "WARN",
                "-",
                vec![Sample::new(Metric::RetiredPending, 1.0)],
                Rates::default(),
                vec![("retired_pages_pending", Degraded, "reset_gpu")],
            ),
            (
                "63 retired pages",
                "FAIL",
                "-",
                vec![
                    Sample::new(Metric::RetiredPages, 40.0),
                    Sample::new(Metric::RetiredPages, 23.0),
                ],
                Rates::default(),
                vec![("retired_pages_excess", Failed, "drain_and_service")],
            ),
            (
                "recovery action reset",
                "FAIL",
                "-",
                recovery("gpu_reset"),
                Rates::default(),
                vec![("recovery_action", Failed, "reset_gpu")],
            ),
            (
                "recovery action reboot",
                "FAIL",
                "Unhealthy, REBOOT_SYSTEM",
                recovery("node_reboot"),
                Rates::default(),
                vec![("recovery_action", Failed, "reboot_node")],
            ),
            (
                "recovery action drain and reset",
                "FAIL",
                "-",
                recovery("drain_and_reset"),
                Rates::default(),
                vec![("recovery_action", Failed, "reset_gpu")],
            ),
            (
                "recovery action drain P2P",
                "WARN",
                "-",
                recovery("drain_p2p"),
                Rates::default(),
                vec![("recovery_action", Degraded, "drain_and_service")],
            ),
            (
                "recovery action none",
                "PASS",
                "Healthy",
                recovery("none"),
                Rates::default(),
                vec![],
            ),
            (
                "thermal violation rising",
                "WARN",
                "-",
                vec![],
                Rates {
                    thermal_violation_rising: true,
                    ..Rates::default()
                },
                vec![("thermal_slowdown", Degraded, "none")],
            ),
            (
                "HW thermal slowdown",
                "WARN",
                "Unhealthy at ≥ 0.6/min",
                clock("hw_thermal_slowdown"),
                Rates::default(),
                vec![("thermal_slowdown", Degraded, "none")],
            ),
            (
                "HW slowdown",
                "-",
                "Unhealthy at ≥ 0.6/min",
                clock("hw_slowdown"),
                Rates::default(),
                vec![("hw_slowdown", Degraded, "none")],
            ),
            (
                "die over slowdown",
                "-",
                "Degraded (GPU_MAX)",
                vec![temp("gpu_die", 91.0), limit("gpu_die", "throttled", 90.0)],
                Rates::default(),
                vec![("temperature_over_slowdown", Degraded, "none")],
            ),
            (
                "HBM over its maximum",
                "-",
                "Degraded (MEM_MAX)",
                vec![
                    temp("memory_junction", 96.0),
                    limit("memory_junction", "max", 95.0),
                ],
                Rates::default(),
                vec![("temperature_over_slowdown", Degraded, "none")],
            ),
            (
                "HBM under its maximum",
                "PASS",
                "Healthy",
                vec![
                    temp("memory_junction", 90.0),
                    limit("memory_junction", "max", 95.0),
                ],
                Rates::default(),
                vec![],
            ),
            (
                "PCIe replays 20/min (Gen4 x16 limit 16)",
                "WARN",
                "-",
                vec![],
                Rates {
                    pcie_replays_per_min: Some(20.0),
                    ..Rates::default()
                },
                vec![("pcie_replay_rate", Degraded, "none")],
            ),
            (
                "PCIe replays 10/min",
                "PASS",
                "-",
                vec![],
                Rates {
                    pcie_replays_per_min: Some(10.0),
                    ..Rates::default()
                },
                vec![],
            ),
            (
                "Xid 94",
                "WARN",
                "-",
                vec![],
                Rates {
                    xids: vec![94],
                    ..Rates::default()
                },
                vec![("xid_contained", Degraded, "restart_app")],
            ),
            (
                "Xid 63",
                "WARN",
                "-",
                vec![],
                Rates {
                    xids: vec![63],
                    ..Rates::default()
                },
                vec![("xid_retirement", Degraded, "none")],
            ),
            (
                "corrected ECC rising",
                "WARN (placeholder rate)",
                "Healthy (no verdict)",
                vec![],
                Rates {
                    ecc_corrected_per_hour: Some((500.0, 20.0)),
                    ..Rates::default()
                },
                vec![("ecc_correctable_rising", Degraded, "none")],
            ),
            (
                "a signal that cannot be read",
                "-",
                "-",
                vec![],
                Rates {
                    unreadable: vec!["ecc_uncorrected_volatile".into()],
                    ..Rates::default()
                },
                vec![("signal_unreadable", Degraded, "none")],
            ),
        ];
        for (case, dcgm, gpud, samples, rates, want) in rows {
            let got = codes(&evaluate(&slot(samples), &rates, 100.0));
            assert_eq!(got, want, "{case} (DCGM {dcgm}, GPUd {gpud})");
            // Where DCGM fails a GPU, Junction fails it; where DCGM warns, Junction degrades.
            let worst = got.iter().map(|x| x.1).max_by_key(|s| match s {
                HealthState::Ok => 0,
                HealthState::Degraded => 1,
                HealthState::PredictedFailure => 2,
                HealthState::Failed => 3,
            });
            match dcgm {
                "FAIL" => assert_eq!(worst, Some(Failed), "{case}"),
                d if d.starts_with("WARN") => assert_eq!(worst, Some(Degraded), "{case}"),
                "PASS" => assert_eq!(worst, None, "{case}"),
                _ => {}
            }
        }
    }
}

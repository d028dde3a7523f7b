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
mod tests;

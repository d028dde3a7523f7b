//! Per-GPU health: the active reasons, each raised and cleared by whoever knows (the NVML
//! source: lost, reset required, stuck; the kernel log: Xid 79, the recovery action of Xid
//! 154; the health rules: thresholds, forecasts). A GPU's `hw.status` is the worst state among
//! its reasons. Reasons are keyed by `hw.id`, so a source can raise one before NVML has
//! listed the GPU (the kernel log is read from boot). Every change of a GPU's state is an
//! event.

use std::collections::BTreeMap;
use std::time::SystemTime;

use super::events::{EventLog, NewEvent, Severity};
use super::{HealthState, lock};

/// Defines a closed set of label values: an enum with `as_str()` (the label), `parse()` (from
/// saved state), `ALL`, and `Serialize` as the label.
macro_rules! closed_set {
    ($(#[$m:meta])* pub enum $name:ident { $( $(#[$vm:meta])* $v:ident = $s:literal, )* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name { $( $(#[$vm])* $v, )* }

        impl $name {
            /// Every member.
            pub const ALL: &'static [$name] = &[$($name::$v,)*];

            /// The label value.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$v => $s,)* }
            }

            /// From a label value.
            pub fn parse(s: &str) -> Option<Self> {
                match s { $($s => Some($name::$v),)* _ => None }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub(crate) use closed_set;

closed_set! {
    /// What a reason asks the operator to do (`gpu.health.action`), least urgent first.
    pub enum Action {
        /// Nothing yet (watch it).
        None = "none",
        /// Restart the application.
        RestartApp = "restart_app",
        /// Reset the GPU.
        ResetGpu = "reset_gpu",
        /// Reboot the node.
        RebootNode = "reboot_node",
        /// Drain the node and have it serviced.
        DrainAndService = "drain_and_service",
    }
}

closed_set! {
    /// Why a GPU is not ok (`gpu.health.reason`).
    pub enum Code {
        /// NVML: the GPU has fallen off the bus.
        GpuLost = "gpu_lost",
        /// NVML: the GPU needs a reset.
        ResetRequired = "reset_required",
        /// NVML: the GPU does not answer.
        GpuUnreachable = "gpu_unreachable",
        /// NVML: a call has not returned.
        NvmlCallStuck = "nvml_call_stuck",
        /// Kernel log: Xid 79.
        Xid79 = "xid_79",
        /// Kernel log: Xid 154's recovery action.
        Xid154 = "xid_154",
        /// Kernel log: an XID the catalog calls fatal for the GPU.
        XidFatal = "xid_fatal",
        /// Rules: uncorrectable ECC errors.
        EccUncorrectable = "ecc_uncorrectable",
        /// Rules: a row remap failed.
        RemapFailed = "remap_failed",
        /// Rules: a row remap is pending.
        RemapPending = "remap_pending",
        /// Rules: retired pages pending.
        RetiredPagesPending = "retired_pages_pending",
        /// Rules: too many retired pages.
        RetiredPagesExcess = "retired_pages_excess",
        /// Rules: NVML reports a recovery action.
        RecoveryAction = "recovery_action",
        /// Rules: a temperature past its slowdown limit.
        TemperatureOverSlowdown = "temperature_over_slowdown",
        /// Rules: clocks held back by temperature.
        ThermalSlowdown = "thermal_slowdown",
        /// Rules: a hardware slowdown.
        HwSlowdown = "hw_slowdown",
        /// Rules: a high PCIe replay rate.
        PcieReplayRate = "pcie_replay_rate",
        /// Rules: Xid 94.
        XidContained = "xid_contained",
        /// Rules: Xid 63 / 92.
        XidRetirement = "xid_retirement",
        /// Rules: corrected ECC errors rising.
        EccCorrectableRising = "ecc_correctable_rising",
        /// Rules: a signal that cannot be read.
        SignalUnreadable = "signal_unreadable",
        /// Cooling: a coolant reading past its threshold.
        CoolantOutOfRange = "coolant_out_of_range",
        /// Cooling: a leak detector reports.
        LeakDetected = "leak_detected",
        /// Forecast: a temperature reaches its limit soon.
        ThermalForecast = "thermal_forecast",
        /// Fabric: a NIC of the GPU's rail is not ok.
        RailDegraded = "rail_degraded",
        /// PCIe: a fatal AER error on the GPU's link.
        PcieAerFatal = "pcie_aer_fatal",
        /// PCIe: non-fatal AER errors on the GPU's link.
        PcieAerNonfatal = "pcie_aer_nonfatal",
        /// PCIe: the GPU's link trained below its maximum width or speed.
        PcieLinkDegraded = "pcie_link_degraded",
        /// PCIe: an NVIDIA GPU on the bus that NVML does not list.
        NotInNvml = "not_in_nvml",
        /// Kernel log: GSP RPCs keep failing on the GPU.
        GspUnresponsive = "gsp_unresponsive",
        /// Kernel log: the driver could not initialise the GPU (RmInitAdapter failed).
        RmInitFailed = "rm_init_failed",
        /// Kernel log: a fatal PCIe AER error on the GPU's path.
        PcieFatalLogged = "pcie_fatal_logged",
        /// History: the same failure on the GPU in two or more boots.
        HardwareInspection = "hardware_inspection",
        /// History: one XID too many times, or from too many processes.
        XidRepeated = "xid_repeated",
        /// History: the same reason came back after several reboots within a week.
        ResetsIneffective = "resets_ineffective",
        /// Configuration: a setting differs from `[expect]`.
        ConfigDrift = "config_drift",
        /// Configuration: an ECC or MIG mode change waits for a GPU reset.
        ModeChangePending = "mode_change_pending",
        /// Fabric: the GPU's NVLink fabric registration is not completed (or failed).
        FabricIncomplete = "fabric_incomplete",
        /// Fabric: a fabric health check fails.
        FabricUnhealthy = "fabric_unhealthy",
        /// Fabric: the fabric manager is down or restarting.
        FabricManagerDown = "fabric_manager_down",
        /// NVLink5: a link's effective bit-error rate is over its threshold, or rising.
        NvlinkBerHigh = "nvlink_ber_high",
        /// P2P: the GPU lost P2P with peers it had it with.
        P2pLost = "p2p_lost",
    }
}

/// One condition a rule or a source finds (the health evaluator raises it as a reason and
/// clears it once it has been absent for its hysteresis).
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// Reason code.
    pub code: Code,
    /// State.
    pub state: HealthState,
    /// Action.
    pub action: Action,
    /// A sentence.
    pub detail: String,
}

/// One reason a GPU is not ok.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Reason {
    /// Why (`gpu.health.reason`).
    pub code: Code,
    /// The state it puts the GPU in.
    pub state: HealthState,
    /// A sentence for the operator.
    pub detail: String,
    /// The action it calls for (`gpu.health.action`).
    pub action: Action,
    /// Since when.
    #[serde(skip)]
    pub since: SystemTime,
}

impl HealthState {
    /// Severity order: ok < degraded < predicted_failure < failed.
    pub fn rank(self) -> u8 {
        match self {
            HealthState::Ok => 0,
            HealthState::Degraded => 1,
            HealthState::PredictedFailure => 2,
            HealthState::Failed => 3,
        }
    }
}

/// The reasons of every GPU, by `hw.id`.
#[derive(Debug, Default)]
pub struct Health {
    reasons: std::sync::Mutex<BTreeMap<String, BTreeMap<Code, Reason>>>,
}

/// The worst state among reasons.
pub fn verdict<'a>(reasons: impl IntoIterator<Item = &'a Reason>) -> HealthState {
    reasons
        .into_iter()
        .map(|r| r.state)
        .max_by_key(|s| s.rank())
        .unwrap_or(HealthState::Ok)
}

/// The most urgent action among reasons.
pub fn action<'a>(reasons: impl IntoIterator<Item = &'a Reason>) -> Action {
    reasons
        .into_iter()
        .map(|r| r.action)
        .max()
        .unwrap_or(Action::None)
}

impl Health {
    /// Raises (or updates) a reason; returns true if the GPU's state changed.
    pub fn raise(&self, events: &EventLog, hw_id: &str, reason: Reason) -> bool {
        self.raise_reason(events, hw_id, reason).0
    }

    /// Raises (or updates) a reason; returns (the GPU's state changed, the reason is new).
    pub fn raise_reason(&self, events: &EventLog, hw_id: &str, reason: Reason) -> (bool, bool) {
        let mut all = lock(&self.reasons);
        let entry = all.entry(hw_id.to_string()).or_default();
        let before = verdict(entry.values());
        let new = !entry.contains_key(&reason.code);
        let reason = match entry.get(&reason.code) {
            // Keep when it started; take the newer sentence.
            Some(old) => Reason {
                since: old.since,
                ..reason
            },
            None => reason,
        };
        let code = reason.code;
        entry.insert(code, reason);
        let after = verdict(entry.values());
        if before != after || new {
            let r = &entry[&code];
            let e = transition(hw_id, before, after, r.detail.clone(), Some(r));
            drop(all);
            events.append(e);
        }
        (before != after, new)
    }

    /// Clears a reason; returns true if the GPU's state changed.
    pub fn clear(&self, events: &EventLog, hw_id: &str, code: Code) -> bool {
        self.clear_reason(events, hw_id, code).unwrap_or(false)
    }

    /// Clears a reason; `None` if the GPU did not have it, else whether its state changed.
    pub fn clear_reason(&self, events: &EventLog, hw_id: &str, code: Code) -> Option<bool> {
        let mut all = lock(&self.reasons);
        let entry = all.get_mut(hw_id)?;
        let before = verdict(entry.values());
        let gone = entry.remove(&code)?;
        let after = verdict(entry.values());
        let body = format!("{} cleared: {}", gone.code, gone.detail);
        let e = transition(hw_id, before, after, body, None)
            .with("gpu.health.reason", gone.code.as_str());
        if entry.is_empty() {
            all.remove(hw_id);
        }
        drop(all);
        events.append(e);
        Some(before != after)
    }

    /// Puts back a reason saved before a restart, without an event (it is not news).
    pub fn restore(&self, hw_id: &str, reason: Reason) {
        lock(&self.reasons)
            .entry(hw_id.to_string())
            .or_default()
            .insert(reason.code, reason);
    }

    /// A GPU's reasons, most severe first.
    pub fn reasons(&self, hw_id: &str) -> Vec<Reason> {
        let mut v: Vec<Reason> = lock(&self.reasons)
            .get(hw_id)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        v.sort_by_key(|r| std::cmp::Reverse(r.state.rank()));
        v
    }

    /// Every GPU's reasons.
    pub fn all(&self) -> BTreeMap<String, Vec<Reason>> {
        lock(&self.reasons)
            .iter()
            .map(|(k, v)| (k.clone(), v.values().cloned().collect()))
            .collect()
    }
}

/// The event for a raised or cleared reason.
fn transition(
    hw_id: &str,
    before: HealthState,
    after: HealthState,
    body: String,
    raised: Option<&Reason>,
) -> NewEvent {
    let severity = match (after, raised.map(|r| r.state)) {
        (HealthState::Failed, _) => Severity::Error,
        (HealthState::Ok, _) => Severity::Info,
        _ => Severity::Warn,
    };
    let body = if before == after {
        format!("GPU {hw_id} stays {}: {body}", after.as_str())
    } else {
        format!(
            "GPU {hw_id} is {} (was {}): {body}",
            after.as_str(),
            before.as_str()
        )
    };
    let (name, previous) = super::events::status_change_names();
    let mut e = NewEvent::now(severity, name, body)
        .about(hw_id.to_string())
        .with("hw.type", "gpu")
        .with("hw.state", after.as_str())
        .with(previous, before.as_str());
    if let Some(r) = raised {
        e = e
            .with("gpu.health.reason", r.code.as_str())
            .with("gpu.health.action", r.action.as_str());
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(code: &'static str, state: HealthState) -> Reason {
        Reason {
            code: Code::parse(code).expect("a reason code"),
            state,
            detail: code.into(),
            action: Action::None,
            since: SystemTime::now(),
        }
    }

    #[test]
    fn the_worst_reason_decides_and_every_change_is_an_event() {
        let (h, log) = (Health::default(), EventLog::new(16));
        assert!(h.raise(
            &log,
            "GPU-1",
            reason("nvml_call_stuck", HealthState::Degraded)
        ));
        assert!(h.raise(&log, "GPU-1", reason("xid_79", HealthState::Failed)));
        assert_eq!(verdict(&h.reasons("GPU-1")), HealthState::Failed);
        assert!(!h.clear(&log, "GPU-1", Code::NvmlCallStuck), "still failed");
        assert!(h.clear(&log, "GPU-1", Code::Xid79));
        assert!(h.reasons("GPU-1").is_empty());
        assert_eq!(log.head(), 4, "two raises, two clears");
        assert!(!h.clear(&log, "GPU-1", Code::Xid79), "nothing to clear");
        assert_eq!(log.head(), 4);
    }
}

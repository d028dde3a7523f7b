//! What an XID does to a GPU's health, and how severe its event is: pure functions of the
//! code, what the line said, the catalog and (for Xid 154 "to none") NVML's view.

use super::super::HealthState;
use super::super::events::Severity;
use super::super::health::{Action, Code};
use super::super::xid_catalog::{self, Category};

/// A reason an XID raises, held until a reset or a reboot.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// `xid_79`, `xid_154` or `xid_fatal`.
    pub code: Code,
    /// Failed or degraded.
    pub state: HealthState,
    /// What the operator is asked to do.
    pub action: Action,
    /// The sentence.
    pub detail: String,
}

/// What an XID does to the GPU's reasons.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Raise (or replace) a held reason.
    Raise(Held),
    /// Clear Xid 154's reason: the driver's recovery action is none.
    Clear154,
    /// An Xid 154 "to none" while NVML still reports an action: the reason holds.
    Disputed,
    /// Nothing.
    Nothing,
}

/// The reasons XIDs raise (the kernel-log state restores only these).
pub const CODES: [Code; 6] = [
    Code::Xid79,
    Code::Xid154,
    Code::XidFatal,
    Code::GspUnresponsive,
    Code::RmInitFailed,
    Code::PcieFatalLogged,
];

/// Xid 79 fails the GPU until the node reboots; Xid 154 carries the recovery action the
/// driver now asks for (none clears it, unless `nvml_action` says NVML still reports one); an
/// XID NVIDIA's catalog calls fatal for the GPU (48, 74, 95, 119, 120, 140, …) fails it, with
/// the catalog's action, until the GPU is reset or the node reboots.
pub fn effect(
    code: u32,
    recovery_action: Option<u32>,
    nvml_action: impl FnOnce() -> Option<String>,
) -> Effect {
    use HealthState::{Degraded, Failed};
    let held = |code, state, action, detail: &str| {
        Effect::Raise(Held {
            code,
            state,
            action,
            detail: detail.to_string(),
        })
    };
    match (code, recovery_action) {
        (79, _) => held(
            Code::Xid79,
            Failed,
            Action::RebootNode,
            "Xid 79: the GPU has fallen off the bus; holds until the node is rebooted",
        ),
        (154, Some(0)) if nvml_action().is_some_and(|a| a != "none") => Effect::Disputed,
        (154, Some(0)) => Effect::Clear154,
        (154, Some(1)) => held(
            Code::Xid154,
            Failed,
            Action::ResetGpu,
            "Xid 154: the driver asks for a GPU reset",
        ),
        (154, Some(2 | 7)) => held(
            Code::Xid154,
            Failed,
            Action::RebootNode,
            "Xid 154: the driver asks for a node reboot",
        ),
        (154, Some(4 | 6)) => held(
            Code::Xid154,
            Failed,
            Action::ResetGpu,
            "Xid 154: the driver asks to drain the GPU and reset it",
        ),
        (154, Some(_)) => held(
            Code::Xid154,
            Degraded,
            Action::DrainAndService,
            "Xid 154: the driver asks to drain peer-to-peer work (or recover the IMEX domain)",
        ),
        (c, _) if c != 154 && xid_catalog::lookup(c).drain => {
            let e = xid_catalog::lookup(c);
            held(
                Code::XidFatal,
                Failed,
                xid_catalog::health_action(e.action),
                &format!(
                    "Xid {c} ({}): {}; holds until the GPU is reset or the node reboots",
                    e.mnemonic, e.description
                ),
            )
        }
        _ => Effect::Nothing,
    }
}

/// The severity of an XID's event (`fatal`: what an NVLink5 line says of itself).
pub fn severity(code: u32, fatal: Option<bool>) -> Severity {
    let entry = xid_catalog::lookup(code);
    match (code, fatal.unwrap_or(entry.drain), entry.category) {
        (79, _, _) => Severity::Fatal,
        (_, true, _) => Severity::Error,
        (_, false, Category::Informational) => Severity::Info,
        _ => Severity::Warn,
    }
}

/// `gpu.sxid.severity`.
pub fn sxid_severity(fatal: Option<bool>) -> &'static str {
    match fatal {
        Some(true) => "fatal",
        Some(false) => "nonfatal",
        None => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xid_154_follows_the_recovery_action_and_nvml() {
        let none = || None;
        let raised = |e: Effect| match e {
            Effect::Raise(h) => Some((h.code, h.state, h.action)),
            _ => None,
        };
        assert_eq!(
            raised(effect(154, Some(1), none)),
            Some((Code::Xid154, HealthState::Failed, Action::ResetGpu))
        );
        assert_eq!(
            raised(effect(154, Some(3), none)),
            Some((Code::Xid154, HealthState::Degraded, Action::DrainAndService))
        );
        assert_eq!(effect(154, Some(0), none), Effect::Clear154);
        assert_eq!(
            effect(154, Some(0), || Some("gpu_reset".into())),
            Effect::Disputed
        );
        assert_eq!(
            effect(154, Some(0), || Some("none".into())),
            Effect::Clear154
        );
        assert_eq!(effect(154, None, none), Effect::Nothing);
        assert_eq!(effect(13, None, none), Effect::Nothing);
        assert_eq!(severity(79, None), Severity::Fatal);
        assert_eq!(severity(13, Some(true)), Severity::Error);
    }
}

//! The NVLink fabric and the modes, per GPU, from NVML's series (no `[expect]` needed):
//!
//! | reason | when | state | action | from |
//! |---|---|---|---|---|
//! | `mode_change_pending` | ECC or MIG mode will change at the next GPU reset (current ≠ pending) | degraded | reset_gpu | `nvmlDeviceGetEccMode` / `nvmlDeviceGetMigMode` (pending takes effect after a reset) |
//! | `fabric_incomplete` | the GPU's fabric registration is not completed (not started: failed; in progress: degraded), or completed with an error | failed / degraded | reboot_node | DCGM fabric probe state (`DCGM_FR_FABRIC_PROBE_STATE`: in progress warns, the rest fail); NVSentinel `FABRIC_STATE_UNHEALTHY` |
//! | `fabric_unhealthy` | a fabric health check fails (bandwidth degraded, route recovery or unhealthy, access-timeout recovery, incorrect configuration); the driver's summary alone (limited capacity): degraded | failed / degraded | drain_and_service | DCGM fabric health watch (each true mask field fails); GPUd fabric state |
//! | `nvlink_ber_high` | an NVLink5 link's effective BER (after FEC) over `health.nvlink_effective_ber_max` (1e-12): failed; new effective errors since the last evaluation: degraded | failed / degraded | drain_and_service / none | DCGM NVLink5 health watch (`DCGM_FR_NVLINK_EFFECTIVE_BER_THRESHOLD`) |
//! | `p2p_lost` | the GPU has P2P (read, write, NVLink, atomics) with fewer peers than it had since the agent started: degraded; with none: failed | degraded / failed | reboot_node | GPUd NVLink P2P check (every probed pair lost: REBOOT_SYSTEM) |

use std::collections::BTreeMap;

use crate::model::health::{Action, Code, Finding};
use crate::model::{GpuSlot, HealthState, Metric};

use super::rules::{find, samples};

/// The fabric's and the modes' findings for one GPU (no `[expect]` needed).
pub fn fabric_and_modes(slot: &GpuSlot) -> Vec<Finding> {
    use HealthState::{Degraded, Failed};
    let mut out = Vec::new();
    let v = |m: Metric, attrs: &[(&str, &str)]| find(samples(slot), m, attrs);
    let mut pending = Vec::new();
    if let (Some(c), Some(p)) = (
        v(Metric::EccMode, &[("gpu.mode.setting", "current")]),
        v(Metric::EccMode, &[("gpu.mode.setting", "pending")]),
    ) && c != p
    {
        pending.push(format!("ECC {} → {}", on(c), on(p)));
    }
    if let (Some(c), Some(p)) = (v(Metric::MigMode, &[]), v(Metric::MigModePending, &[]))
        && c != p
    {
        pending.push(format!("MIG {} → {}", on(c), on(p)));
    }
    if !pending.is_empty() {
        out.push(Finding {
            code: Code::ModeChangePending,
            state: Degraded,
            action: Action::ResetGpu,
            detail: format!("{}: takes effect at the next GPU reset", pending.join(", ")),
        });
    }
    let state = samples(slot)
        .find(|s| s.metric == Metric::FabricState && s.value > 0.5)
        .and_then(|s| s.attr("gpu.fabric.state"));
    let status = samples(slot)
        .find(|s| s.metric == Metric::FabricInfo)
        .and_then(|s| s.attr("gpu.fabric.status"));
    let incomplete = match (state, status) {
        (Some("in_progress"), _) => Some((Degraded, "fabric registration in progress".to_string())),
        (Some("not_started"), _) => Some((Failed, "fabric registration not started".to_string())),
        (Some("completed"), Some(s)) if s != "success" => {
            Some((Failed, format!("fabric registration completed with {s}")))
        }
        _ => None,
    };
    if let Some((state, detail)) = incomplete {
        out.push(Finding {
            code: Code::FabricIncomplete,
            state,
            action: Action::RebootNode,
            detail: format!(
                "{detail}: the GPU is not (yet) part of the NVLink fabric; check the fabric manager"
            ),
        });
    }
    let failing: Vec<&str> = samples(slot)
        .filter(|s| s.metric == Metric::FabricHealth && s.value > 0.5)
        .filter_map(|s| s.attr("gpu.fabric.health.check"))
        .collect();
    if !failing.is_empty() {
        let only_summary = failing == ["summary"];
        out.push(Finding {
            code: Code::FabricUnhealthy,
            state: if only_summary { Degraded } else { Failed },
            action: Action::DrainAndService,
            detail: format!("fabric health: {}", failing.join(", ")),
        });
    }
    out
}

fn on(v: f64) -> &'static str {
    if v > 0.5 { "on" } else { "off" }
}

/// NVLink5 on one GPU: a link's effective BER (after FEC) over `max` fails it, as DCGM's
/// NVLink5 health watch does (`DCGM_FR_NVLINK_EFFECTIVE_BER_THRESHOLD`, 1e-12); effective
/// errors that rose since the last evaluation (`last`: their sum then) degrade it.
pub fn nvlink(slot: &GpuSlot, max: f64, last: &mut Option<f64>) -> Option<Finding> {
    let mut worst: Option<(&str, f64)> = None;
    let mut errors: Option<f64> = None;
    for s in samples(slot) {
        match s.metric {
            Metric::NvlinkBer
                if s.attr("gpu.nvlink.ber.type") == Some("effective")
                    && worst.is_none_or(|(_, b)| s.value > b) =>
            {
                worst = Some((s.attr("gpu.nvlink.link").unwrap_or("?"), s.value));
            }
            Metric::NvlinkErrors if s.attr("gpu.nvlink.error.type") == Some("effective") => {
                *errors.get_or_insert(0.0) += s.value;
            }
            _ => {}
        }
    }
    let before = std::mem::replace(last, errors);
    if let Some((link, ber)) = worst.filter(|(_, b)| *b > max) {
        return Some(Finding {
            code: Code::NvlinkBerHigh,
            state: HealthState::Failed,
            action: Action::DrainAndService,
            detail: format!("NVLink {link}: effective BER {ber:.1e} over {max:.0e}"),
        });
    }
    match (before, errors) {
        (Some(a), Some(b)) if b > a => Some(Finding {
            code: Code::NvlinkBerHigh,
            state: HealthState::Degraded,
            action: Action::None,
            detail: format!(
                "{:.0} new NVLink effective errors (uncorrected after FEC)",
                b - a
            ),
        }),
        _ => None,
    }
}

/// P2P on one GPU, per capability, against the most peers it had since the agent started
/// (`best`): fewer is `p2p_lost` (degraded), none where it had some is failed; both ask for
/// a reboot, as GPUd's NVLink P2P check does (all pairs lost: REBOOT_SYSTEM).
pub fn p2p(slot: &GpuSlot, best: &mut BTreeMap<String, f64>) -> Option<Finding> {
    let mut lost = Vec::new();
    let mut none = false;
    for s in samples(slot).filter(|s| s.metric == Metric::P2pPeers) {
        let cap = s.attr("gpu.p2p.capability").unwrap_or("?").to_string();
        let had = best.entry(cap.clone()).or_insert(s.value);
        if s.value < *had {
            none |= s.value == 0.0;
            lost.push(format!(
                "{cap} with {} of {} peers (missing GPU {})",
                s.value,
                had,
                s.attr("gpu.p2p.missing").unwrap_or("")
            ));
        } else {
            *had = s.value;
        }
    }
    (!lost.is_empty()).then(|| Finding {
        code: Code::P2pLost,
        state: if none {
            HealthState::Failed
        } else {
            HealthState::Degraded
        },
        action: Action::RebootNode,
        detail: format!("P2P lost: {}", lost.join("; ")),
    })
}

//! How the GPU is set up: persistence, ECC and compute mode, the GSP firmware, and its
//! registration in the NVLink fabric (`nvmlDeviceGetGpuFabricInfoV`; the health mask decoded
//! per `nvml.h`'s `NVML_GPU_FABRIC_HEALTH_MASK_*` fields, as DCGM's fabric health watch and
//! GPUd's fabric-state check read it). A GPU without a fabric state (state
//! `NOT_SUPPORTED`, or the call NOT_SUPPORTED: PCIe cards, pre-Hopper GPUs) reports none of
//! the fabric series.

use nvml_wrapper::enum_wrappers::device::{ComputeMode, P2pCapabilitiesIndex, P2pStatus};
use nvml_wrapper::error::NvmlError;

use super::raw::{self, FabricInfo};
use crate::model::{Metric, Sample};
use crate::sources::nvml::worker::{Ctx, Halt};

/// The fabric states with a series (`NOT_SUPPORTED` has none).
const FABRIC_STATES: [(u8, &str); 3] = [(1, "not_started"), (2, "in_progress"), (3, "completed")];

/// The health mask's boolean checks: (name, shift); each 2-bit field reads 0 not supported,
/// 1 true (failing), 2 false.
const HEALTH_CHECKS: [(&str, u32); 4] = [
    ("degraded_bandwidth", 0),
    ("route_recovery", 2),
    ("route_unhealthy", 4),
    ("access_timeout_recovery", 6),
];

pub(super) fn config(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
    if let Some(on) = ctx.call("persistence_mode", |d| d.is_in_persistent_mode())? {
        out.push(Sample::new(
            Metric::PersistenceMode,
            f64::from(u8::from(on)),
        ));
    }
    if let Some(e) = ctx.call("ecc_mode", |d| d.is_ecc_enabled())? {
        for (setting, on) in [
            ("current", e.currently_enabled),
            ("pending", e.pending_enabled),
        ] {
            out.push(
                Sample::new(Metric::EccMode, f64::from(u8::from(on)))
                    .with("gpu.mode.setting", setting),
            );
        }
    }
    if let Some(m) = ctx.call("compute_mode", |d| d.compute_mode())? {
        let name = match m {
            ComputeMode::Default => "default",
            ComputeMode::ExclusiveThread => "exclusive_thread",
            ComputeMode::Prohibited => "prohibited",
            ComputeMode::ExclusiveProcess => "exclusive_process",
        };
        out.push(Sample::new(Metric::ComputeMode, 1.0).with("gpu.compute_mode", name));
    }
    if let Some(m) = ctx.call("gsp_firmware", |d| d.gsp_firmware_mode())? {
        let version = if m.enabled {
            ctx.call("gsp_firmware_version", |d| d.gsp_firmware_version())?
                .unwrap_or_default()
        } else {
            String::new()
        };
        out.push(
            Sample::new(Metric::GspFirmware, f64::from(u8::from(m.enabled)))
                .with("hw.firmware_version", version)
                .with("gpu.gsp.default", if m.default { "true" } else { "false" }),
        );
    }
    p2p(ctx, out)?;
    let nvml = ctx.nvml;
    if let Some(f) = ctx.call("fabric_info", |d| raw::fabric_info(nvml, d))? {
        if f.state == 0 {
            ctx.disable_unsupported("fabric_info", "the GPU has no NVLink fabric state");
        } else {
            fabric(&f, out);
        }
    }
    Ok(())
}

/// P2P capabilities read, with `gpu.p2p.capability`.
const P2P: [(P2pCapabilitiesIndex, &str); 4] = [
    (P2pCapabilitiesIndex::Read, "read"),
    (P2pCapabilitiesIndex::Write, "write"),
    (P2pCapabilitiesIndex::NvLink, "nvlink"),
    (P2pCapabilitiesIndex::Atomics, "atomics"),
];

/// Config collections between two P2P reads (a minute at the default 10 s).
const P2P_EVERY: u32 = 6;

/// How many peers this GPU has P2P with, per capability (`nvmlDeviceGetP2PStatus` with every
/// other GPU: OK counts), and the peers it lacks it with (by NVML index, in
/// `gpu.p2p.missing`): a count per capability bounds the series however many GPUs there are.
fn p2p(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
    let (tick, cached) = &mut ctx.p2p;
    if *tick % P2P_EVERY != 0 && !cached.is_empty() {
        *tick += 1;
        out.extend(cached.iter().cloned());
        return Ok(());
    }
    *tick = 1;
    let nvml = ctx.nvml;
    let me = crate::model::lock(&ctx.slot).info.index;
    let Some(count) = ctx.call("p2p_status", |_| nvml.device_count())? else {
        return Ok(());
    };
    let mut samples = Vec::new();
    for (index, cap) in P2P {
        let mut ok = 0u32;
        let mut missing = Vec::new();
        for peer in (0..count).filter(|p| *p != me) {
            // A peer's error (a lost peer answers GPU_IS_LOST) is that peer's: no P2P with
            // it, and this GPU goes on; only an unsupported call switches the feature off.
            let Some(r) = ctx.call("p2p_status", |d| {
                Ok(nvml
                    .device_by_index(peer)
                    .and_then(|other| d.p2p_status(&other, index)))
            })?
            else {
                return Ok(());
            };
            match r {
                Ok(P2pStatus::Ok) => ok += 1,
                Ok(_) => missing.push(peer.to_string()),
                Err(
                    e @ (NvmlError::NotSupported
                    | NvmlError::FailedToLoadSymbol(_)
                    | NvmlError::FunctionNotFound),
                ) => return ctx.failed("p2p_status", e),
                Err(_) => missing.push(peer.to_string()),
            }
        }
        missing.truncate(16);
        samples.push(
            Sample::new(Metric::P2pPeers, f64::from(ok))
                .with("gpu.p2p.capability", cap)
                .with("gpu.p2p.missing", missing.join(",")),
        );
    }
    ctx.p2p.1 = samples.clone();
    out.extend(samples);
    Ok(())
}

/// A 16-byte UUID in its usual spelling.
fn uuid(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// `nvmlReturn_t` as its short name (the fabric manager's answer).
fn status_name(code: u32) -> String {
    match code {
        0 => "success".into(),
        3 => "not_supported".into(),
        10 => "timeout".into(),
        15 => "gpu_lost".into(),
        999 => "unknown".into(),
        n => format!("nvml_error_{n}"),
    }
}

/// The fabric series of one GPU.
pub fn fabric(f: &FabricInfo, out: &mut Vec<Sample>) {
    for (state, name) in FABRIC_STATES {
        out.push(
            Sample::new(Metric::FabricState, f64::from(u8::from(f.state == state)))
                .with("gpu.fabric.state", name),
        );
    }
    let completed = f.state == 3;
    out.push(
        Sample::new(Metric::FabricInfo, 1.0)
            .with("gpu.fabric.cluster_uuid", uuid(&f.cluster_uuid))
            .with("gpu.fabric.clique_id", f.clique_id.to_string())
            .with(
                "gpu.fabric.status",
                if completed {
                    status_name(f.status)
                } else {
                    "pending".into()
                },
            ),
    );
    let Some(mask) = f.health_mask else { return };
    out.push(Sample::new(Metric::FabricHealthMask, f64::from(mask)));
    for (name, shift) in HEALTH_CHECKS {
        let field = (mask >> shift) & 0b11;
        if field != 0 {
            out.push(
                Sample::new(Metric::FabricHealth, f64::from(u8::from(field == 1)))
                    .with("gpu.fabric.health.check", name),
            );
        }
    }
    // 4 bits: 0 not supported, 1 none, 2 and up a named misconfiguration.
    let config = (mask >> 8) & 0xF;
    if config != 0 {
        out.push(
            Sample::new(Metric::FabricHealth, f64::from(u8::from(config >= 2)))
                .with("gpu.fabric.health.check", "incorrect_configuration"),
        );
    }
    if let Some(s) = f.health_summary.filter(|s| *s != 0) {
        out.push(
            Sample::new(Metric::FabricHealth, f64::from(u8::from(s >= 2)))
                .with("gpu.fabric.health.check", "summary"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checks(mask: u32, summary: u8) -> Vec<(String, f64)> {
        let mut out = Vec::new();
        fabric(
            &FabricInfo {
                cluster_uuid: [0xab; 16],
                status: 0,
                clique_id: 7,
                state: 3,
                health_mask: Some(mask),
                health_summary: Some(summary),
            },
            &mut out,
        );
        out.iter()
            .filter(|s| s.metric == Metric::FabricHealth)
            .map(|s| {
                (
                    s.attr("gpu.fabric.health.check").unwrap_or("").to_string(),
                    s.value,
                )
            })
            .filter(|(_, v)| *v > 0.0)
            .collect()
    }

    #[test]
    fn the_health_mask_as_dcgm_reads_it() {
        // DCGM's healthy GPU: 0x1AA (every check "false", configuration "none"), not 0.
        assert!(checks(0x1AA, 1).is_empty());
        assert!(checks(0x11AA, 1).is_empty(), "with the partition field set");
        assert!(
            checks(0, 0).is_empty(),
            "nothing supported: nothing failing"
        );
        // Bandwidth degraded (bits 1:0 = 1), and the summary says so.
        assert_eq!(
            checks(0x1A9, 3),
            vec![("degraded_bandwidth".into(), 1.0), ("summary".into(), 1.0)]
        );
        // Route unhealthy (bits 5:4 = 1) and an incorrect chassis serial (11:8 = 3).
        assert_eq!(
            checks(0x39A, 2),
            vec![
                ("route_unhealthy".into(), 1.0),
                ("incorrect_configuration".into(), 1.0),
                ("summary".into(), 1.0)
            ]
        );
        assert_eq!(uuid(&[0xab; 16]), "abababab-abab-abab-abab-abababababab");
    }
}

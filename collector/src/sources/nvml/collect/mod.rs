//! The collectors, one function per metric group. Units are converted to the registry's:
//! mW→W, mJ→J, %→ratio, MHz→Hz, ns→s, KiB→bytes.

mod board;
mod clocks;
mod config;
mod errors;
mod gpm;
mod nvlink;
mod processes;
pub mod raw;

use super::worker::{Ctx, Halt};
use crate::model::{Feature, Group, Sample};
use raw::{Decode, FieldRequest};

pub use gpm::GpmState;
pub use raw::V3Layout;

/// `NVML_FI_DEV_PERF_POLICY_POWER` (= `NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP`), ns.
pub(super) const FI_VIOLATION_POWER: u32 = 74;
/// `NVML_FI_DEV_PERF_POLICY_THERMAL`, ns.
pub(super) const FI_VIOLATION_THERMAL: u32 = 75;
/// `NVML_FI_DEV_MEMORY_TEMP`
pub(super) const FI_MEMORY_TEMP: u32 = 82;
/// `NVML_FI_DEV_NVLINK_LINK_COUNT`
pub(super) const FI_NVLINK_LINK_COUNT: u32 = 91;
/// `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` / `_RX` (KiB, per link through `scopeId`)
pub(super) const FI_NVLINK_TX: u32 = 138;
pub(super) const FI_NVLINK_RX: u32 = 139;
/// `NVML_FI_DEV_TEMPERATURE_{SHUTDOWN,SLOWDOWN,GPU_MAX}_TLIMIT`: the die thresholds that
/// replace `nvmlDeviceGetTemperatureThreshold` on Ada and newer, on the T.Limit scale (degrees
/// of `nvmlDeviceGetMarginTemperature`'s margin, not temperatures). `MEM_MAX` (195) is not
/// read: nothing makes it absolute.
pub(super) const FI_TLIMIT_SHUTDOWN: u32 = 193;
pub(super) const FI_TLIMIT_SLOWDOWN: u32 = 194;
pub(super) const FI_TLIMIT_GPU_MAX: u32 = 196;
/// `NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_{SUCCESSFUL_EVENTS,FAILED_EVENTS,EVENTS}`
/// (per link; Blackwell).
pub(super) const FI_NVLINK_RECOVERY_SUCCESSFUL: u32 = 213;
pub(super) const FI_NVLINK_RECOVERY_FAILED: u32 = 214;
pub(super) const FI_NVLINK_RECOVERY_EVENTS: u32 = 215;
/// `NVML_FI_DEV_NVLINK_COUNT_{EFFECTIVE_ERRORS,EFFECTIVE_BER,SYMBOL_ERRORS,SYMBOL_BER}`
/// (per link; NVLink5).
pub(super) const FI_NVLINK_EFFECTIVE_ERRORS: u32 = 219;
pub(super) const FI_NVLINK_EFFECTIVE_BER: u32 = 220;
pub(super) const FI_NVLINK_SYMBOL_ERRORS: u32 = 221;
pub(super) const FI_NVLINK_SYMBOL_BER: u32 = 222;
/// `NVML_FI_DEV_NVLINK_COUNT_FEC_HISTORY_0` … `_15` (per link; NVLink5): "count of symbol
/// errors that are corrected", by bin (nvml.h, R570 notes).
pub(super) const FI_NVLINK_FEC_HISTORY_0: u32 = 235;
pub(super) const FEC_BINS: u32 = 16;
/// `NVML_FI_DEV_C2C_LINK_COUNT`, `_GET_STATUS`, `_GET_MAX_BW` (MB/s), and the C2C error
/// counters `NVML_FI_DEV_C2C_LINK_ERROR_{INTR,REPLAY,REPLAY_B2B}` (per link: Grace superchips).
pub(super) const FI_C2C_LINK_COUNT: u32 = 170;
pub(super) const FI_C2C_LINK_STATUS: u32 = 171;
pub(super) const FI_C2C_LINK_MAX_BW: u32 = 172;
pub(super) const FI_C2C_ERROR_INTR: u32 = 231;
pub(super) const FI_C2C_ERROR_REPLAY: u32 = 232;
pub(super) const FI_C2C_ERROR_REPLAY_B2B: u32 = 233;
/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`
pub(super) const FI_RECOVERY_ACTION: u32 = 230;
/// `NVML_FI_DEV_PCIE_COUNT_TX_BYTES` / `_RX_BYTES`: bytes through PCIe since the driver loaded.
pub(super) const FI_PCIE_TX_BYTES: u32 = 197;
pub(super) const FI_PCIE_RX_BYTES: u32 = 198;
/// `NVML_FI_DEV_CLOCKS_EVENT_REASON_{SW_THERM,HW_THERM,HW_POWER_BRAKE}_SLOWDOWN`, ns (CUDA
/// 12 numbering; `raw::field_values` maps them for drivers from 580.82).
pub(super) const FI_VIOLATION_SW_THERMAL: u32 = 251;
pub(super) const FI_VIOLATION_HW_THERMAL: u32 = 252;
pub(super) const FI_VIOLATION_HW_POWER_BRAKE: u32 = 253;
/// NVML reports at most this many NVLink links (`NVML_NVLINK_MAX_LINKS` is 18 in CUDA 12
/// headers; Blackwell-generation parts expose more, so the bound follows the CUDA 13 value).
pub(super) const MAX_NVLINKS: u32 = 36;
/// Index values as attribute values, so that no sample allocates its link or fan name.
pub(super) const INDEX_NAMES: [&str; MAX_NVLINKS as usize] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31", "32",
    "33", "34", "35",
];
/// Readings outside this range are not temperatures: 0 is what a sensor that is not ready
/// returns, and HBM readings far above any limit are a known NVML defect (dcgm-exporter drops
/// them too).
pub(super) const PLAUSIBLE_CELSIUS: std::ops::RangeInclusive<f64> = 1.0..=150.0;

/// A MIG device (a compute instance) found by the MIG collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDevice {
    /// GPU instance id.
    pub gpu_instance: u32,
    /// Compute instance id.
    pub compute_instance: u32,
    /// `MIG-…` UUID.
    pub uuid: String,
}

/// Runs one group's collection into `out`.
pub fn collect(group: Group, ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
    match group {
        Group::Utilization => board::utilization(ctx, out),
        Group::Memory => board::memory(ctx, out),
        Group::Power => board::power(ctx, out),
        Group::Temperature => board::temperature(ctx, out),
        Group::Clocks => clocks::clocks(ctx, out),
        Group::Errors => errors::errors(ctx, out),
        Group::Pcie => errors::pcie(ctx, out),
        Group::Nvlink => nvlink::nvlink(ctx, out),
        Group::Processes => processes::processes(ctx, out),
        Group::Mig => processes::mig(ctx, out),
        Group::Gpm => gpm::gpm(ctx, out),
        Group::Config => config::config(ctx, out),
        Group::Status => Ok(()),
    }
}

pub(super) fn pct(v: u32) -> f64 {
    f64::from(v) / 100.0
}

/// The name of index `i` (a link, a fan).
pub(super) fn index_name(i: u32) -> &'static str {
    INDEX_NAMES.get(i as usize).copied().unwrap_or("?")
}

/// Reads several device-scoped fields in one call under `feature`; one entry per request,
/// `None` where that field is unavailable. A field the GPU does not support is disabled on
/// its own (as `feature` at the field's id), so that its siblings are still read.
pub(super) fn fields(
    ctx: &mut Ctx<'_>,
    feature: &'static str,
    requests: &[FieldRequest],
) -> Result<smallvec::SmallVec<[Option<f64>; 8]>, Halt> {
    // A lone field is the feature itself; in a batch, each field is a feature of its own.
    let key = |r: &FieldRequest| {
        if requests.len() == 1 {
            Feature::from(feature)
        } else {
            Feature::at(feature, r.id)
        }
    };
    let wanted: smallvec::SmallVec<[FieldRequest; 8]> = requests
        .iter()
        .copied()
        .filter(|r| !ctx.is_disabled(key(r)))
        .collect();
    let mut out = smallvec::smallvec![None; requests.len()];
    if wanted.is_empty() {
        return Ok(out);
    }
    let nvml = ctx.nvml;
    let Some(values) = ctx.call(feature, |d| raw::field_values(nvml, d, &wanted))? else {
        return Ok(out);
    };
    for (r, v) in wanted.iter().zip(values) {
        let slot = requests
            .iter()
            .position(|q| q.id == r.id && q.scope == r.scope);
        match (v, slot) {
            (Ok(v), Some(i)) => out[i] = Some(v),
            (Err(e), _) => ctx.failed(key(r), e)?,
            _ => {}
        }
    }
    Ok(out)
}

/// Reads one device-scoped field.
pub(super) fn field(
    ctx: &mut Ctx<'_>,
    feature: &'static str,
    id: u32,
    decode: Decode,
) -> Result<Option<f64>, Halt> {
    let r = FieldRequest {
        id,
        scope: 0,
        decode,
    };
    Ok(fields(ctx, feature, &[r])?.pop().flatten())
}

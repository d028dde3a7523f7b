//! `nvmlDeviceGetFieldValues`: the field ids the simulator answers, in the numbering of the
//! driver the scenario names.

use std::os::raw::c_int;

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlFieldValue_t, nvmlReturn_t};

use crate::state::*;
use crate::system::export;
use crate::thermal::tlimit;

/// Field ids the simulator answers (nvml.h numbering).
const FI_PERF_POLICY_POWER: u32 = 74;
const FI_PERF_POLICY_THERMAL: u32 = 75;
const FI_MEMORY_TEMP: u32 = 82;
const FI_NVLINK_LINK_COUNT: u32 = 91;
const FI_NVLINK_TX: u32 = 138;
const FI_NVLINK_RX: u32 = 139;
const FI_TEMP_SHUTDOWN_TLIMIT: u32 = 193;
const FI_TEMP_SLOWDOWN_TLIMIT: u32 = 194;
const FI_TEMP_MEM_MAX_TLIMIT: u32 = 195;
const FI_TEMP_GPU_MAX_TLIMIT: u32 = 196;
const FI_NVLINK_RECOVERY_SUCCESSFUL: u32 = 213;
const FI_NVLINK_RECOVERY_FAILED: u32 = 214;
const FI_NVLINK_RECOVERY_EVENTS: u32 = 215;
/// C2C (Grace superchips): link count, per-link status and most bandwidth (MB/s), errors.
const FI_C2C_LINK_COUNT: u32 = 170;
const FI_C2C_LINK_STATUS: u32 = 171;
const FI_C2C_LINK_MAX_BW: u32 = 172;
const FI_C2C_ERROR_INTR: u32 = 231;
const FI_C2C_ERROR_REPLAY: u32 = 232;
const FI_C2C_ERROR_REPLAY_B2B: u32 = 233;
/// NVLink5 per-link error counters (`NVML_FI_DEV_NVLINK_COUNT_{EFFECTIVE,SYMBOL}_{ERRORS,BER}`);
/// the BER fields encode mantissa (bits 11:8) and exponent (7:0): mantissa × 10^-exponent.
const FI_NVLINK_EFFECTIVE_ERRORS: u32 = 219;
const FI_NVLINK_EFFECTIVE_BER: u32 = 220;
const FI_NVLINK_SYMBOL_ERRORS: u32 = 221;
const FI_NVLINK_SYMBOL_BER: u32 = 222;
const FI_RECOVERY_ACTION: u32 = 230;
/// `NVML_FI_DEV_PCIE_COUNT_TX_BYTES` / `_RX_BYTES`: bytes through PCIe since the driver
/// loaded (monotonic; newer than the R535 headers).
const FI_PCIE_TX_BYTES: u32 = 197;
const FI_PCIE_RX_BYTES: u32 = 198;
/// `NVML_FI_DEV_NVLINK_COUNT_FEC_HISTORY_0` … `_15` (per link; NVLink5): FEC's corrected
/// symbol errors by bin.
const FI_NVLINK_FEC_HISTORY_0: u32 = 235;
const FI_NVLINK_FEC_HISTORY_15: u32 = 250;
/// The clock-event-reason time counters in CUDA 12 / 13.0 numbering (`_SW_THERM_SLOWDOWN`,
/// `_HW_THERM_SLOWDOWN`, `_HW_POWER_BRAKE_SLOWDOWN`). Drivers from 580.82 (CUDA 13.0
/// Update 1) renumbered 251–273: these three became 269–271 and 251–268 became the power
/// smoothing fields (NVML "known issues" page; nvml-wrapper's `FieldIdScheme`).
const FI_CLOCKS_EVENT_SW_THERM: u32 = 251;
const FI_CLOCKS_EVENT_HW_THERM: u32 = 252;
const FI_CLOCKS_EVENT_HW_POWER_BRAKE: u32 = 253;
/// nvmlValueType_t
const VALUE_DOUBLE: u32 = 0;
const VALUE_UINT: u32 = 1;
const VALUE_ULL: u32 = 3;
const VALUE_SINT: u32 = 5;

/// A BER as the NVLink5 fields encode it: mantissa (1–10) in bits 11:8, exponent in 7:0.
fn encode_ber(ber: f64) -> f64 {
    if ber <= 0.0 || !ber.is_finite() {
        return 0.0;
    }
    let exp = (-ber.log10()).floor() + 1.0;
    let mantissa = (ber * 10f64.powf(exp)).round().clamp(1.0, 15.0);
    (mantissa as u64 * 256 + (exp.clamp(0.0, 255.0) as u64)) as f64
}

/// True if the driver version uses the CUDA 13.0 Update 1 field numbering (580.82 and later).
fn renumbered_fields(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    major > 580 || (major == 580 && minor >= 82)
}

/// Maps a field id as the driver numbers it to the CUDA 12 numbering.
fn canonical_field(id: u32, renumbered: bool) -> u32 {
    match id {
        269..=271 if renumbered => id - 18,
        251..=268 if renumbered => u32::MAX,
        id => id,
    }
}

export!(
    fn nvmlDeviceGetFieldValues(device: nvmlDevice_t, count: c_int, values: *mut nvmlFieldValue_t) {
        let (sim, g) = gpu(device, "nvmlDeviceGetFieldValues")?;
        if values.is_null() || count < 0 {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let now = sim.now();
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        // Fields newer than the R535 headers.
        let newer = !cfg!(any(feature = "legacy", feature = "r535"));
        let renumbered = renumbered_fields(&sim.scenario.driver.version);
        // SAFETY: the caller passes `count` entries at `values`.
        let fields = std::slice::from_raw_parts_mut(values, count as usize);
        let c2c_links = g.value("c2c_link_count", now).unwrap_or(0.0);
        let c2c = |scope: u32| f64::from(scope) < c2c_links;
        for f in fields {
            f.timestamp = ts;
            f.latencyUsec = 0;
            let link_ok = f.scopeId < g.nvlink_count || f.scopeId == u32::MAX;
            let nvlink = link_ok && g.nvlink_count > 0;
            let (kind, val) = match canonical_field(f.fieldId, renumbered) {
                FI_MEMORY_TEMP if sim.quirk("memory_temp_value_type_double") => {
                    (VALUE_DOUBLE, g.value("temp_memory", now))
                }
                FI_MEMORY_TEMP => (VALUE_UINT, g.value("temp_memory", now)),
                FI_NVLINK_LINK_COUNT => (VALUE_UINT, Some(f64::from(g.nvlink_count))),
                FI_NVLINK_TX if nvlink => (VALUE_ULL, g.value("nvlink_tx_kib", now)),
                FI_NVLINK_RX if nvlink => (VALUE_ULL, g.value("nvlink_rx_kib", now)),
                FI_RECOVERY_ACTION => (VALUE_UINT, g.value("recovery_action", now)),
                // The byte counters run at the scenario's PCIe throughput since the driver
                // loaded (the simulator's start), as a real driver's accumulate it.
                FI_PCIE_TX_BYTES if newer => (
                    VALUE_ULL,
                    g.value("pcie_tx_kbps", now).map(|k| k * 1024.0 * now),
                ),
                FI_PCIE_RX_BYTES if newer => (
                    VALUE_ULL,
                    g.value("pcie_rx_kbps", now).map(|k| k * 1024.0 * now),
                ),
                FI_PERF_POLICY_POWER => (VALUE_ULL, g.value("violation_power_ns", now)),
                FI_PERF_POLICY_THERMAL => (VALUE_ULL, g.value("violation_thermal_ns", now)),
                FI_CLOCKS_EVENT_SW_THERM if newer => {
                    (VALUE_ULL, g.value("violation_sw_thermal_ns", now))
                }
                FI_CLOCKS_EVENT_HW_THERM if newer => {
                    (VALUE_ULL, g.value("violation_hw_thermal_ns", now))
                }
                FI_CLOCKS_EVENT_HW_POWER_BRAKE if newer => {
                    (VALUE_ULL, g.value("violation_hw_power_brake_ns", now))
                }
                // On the T.Limit scale, as real drivers answer (an H200 on 580.159: shutdown
                // -8, slowdown -2, GPU and memory max 0): degrees of margin at which each
                // threshold is reached, not temperatures.
                FI_TEMP_SHUTDOWN_TLIMIT if newer => (VALUE_SINT, tlimit(g, "temp_shutdown", now)),
                FI_TEMP_SLOWDOWN_TLIMIT if newer => (VALUE_SINT, tlimit(g, "temp_slowdown", now)),
                FI_TEMP_MEM_MAX_TLIMIT if newer => (
                    VALUE_SINT,
                    g.value("temp_mem_max", now)
                        .and(tlimit(g, "temp_gpu_max", now)),
                ),
                FI_TEMP_GPU_MAX_TLIMIT if newer => (VALUE_SINT, tlimit(g, "temp_gpu_max", now)),
                FI_NVLINK_RECOVERY_SUCCESSFUL if nvlink && newer => {
                    (VALUE_ULL, g.value("nvlink_recovery_successful", now))
                }
                FI_NVLINK_RECOVERY_FAILED if nvlink && newer => {
                    (VALUE_ULL, g.value("nvlink_recovery_failed", now))
                }
                FI_NVLINK_RECOVERY_EVENTS if nvlink && newer => {
                    (VALUE_ULL, g.value("nvlink_recovery_events", now))
                }
                FI_C2C_LINK_COUNT if newer => (VALUE_UINT, g.value("c2c_link_count", now)),
                FI_C2C_LINK_STATUS if newer && c2c(f.scopeId) => {
                    (VALUE_UINT, g.value("c2c_link_status", now))
                }
                FI_C2C_LINK_MAX_BW if newer && c2c(f.scopeId) => {
                    (VALUE_UINT, g.value("c2c_max_bw_mbps", now))
                }
                FI_C2C_ERROR_INTR if newer && c2c(f.scopeId) => {
                    (VALUE_ULL, g.value("c2c_errors_intr", now))
                }
                FI_C2C_ERROR_REPLAY if newer && c2c(f.scopeId) => {
                    (VALUE_ULL, g.value("c2c_errors_replay", now))
                }
                FI_C2C_ERROR_REPLAY_B2B if newer && c2c(f.scopeId) => {
                    (VALUE_ULL, g.value("c2c_errors_replay_b2b", now))
                }
                FI_NVLINK_EFFECTIVE_ERRORS if nvlink && newer => {
                    (VALUE_ULL, g.value("nvlink_effective_errors", now))
                }
                FI_NVLINK_SYMBOL_ERRORS if nvlink && newer => {
                    (VALUE_ULL, g.value("nvlink_symbol_errors", now))
                }
                FI_NVLINK_EFFECTIVE_BER if nvlink && newer => (
                    VALUE_ULL,
                    g.value("nvlink_effective_ber", now).map(encode_ber),
                ),
                FI_NVLINK_SYMBOL_BER if nvlink && newer => {
                    (VALUE_ULL, g.value("nvlink_symbol_ber", now).map(encode_ber))
                }
                id @ FI_NVLINK_FEC_HISTORY_0..=FI_NVLINK_FEC_HISTORY_15 if nvlink && newer => (
                    VALUE_ULL,
                    g.value(
                        &format!("nvlink_fec_history_{}", id - FI_NVLINK_FEC_HISTORY_0),
                        now,
                    ),
                ),
                _ => (VALUE_UINT, None),
            };
            f.valueType = kind;
            match val {
                Some(x) if kind == VALUE_ULL => {
                    f.nvmlReturn = SUCCESS;
                    f.value.ullVal = x.max(0.0) as u64;
                }
                Some(x) if kind == VALUE_SINT => {
                    f.nvmlReturn = SUCCESS;
                    f.value.siVal = x.round() as i32;
                }
                Some(x) => {
                    // For the R545 defect, VALUE_DOUBLE with the integer in the payload.
                    f.nvmlReturn = SUCCESS;
                    f.value.uiVal = x.max(0.0) as u32;
                }
                None => f.nvmlReturn = ERROR_NOT_SUPPORTED,
            }
        }
        Ok(SUCCESS)
    }
);

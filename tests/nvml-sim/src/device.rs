//! Per-device readings: utilization, memory, power, temperatures, clocks, errors, PCIe, NVLink
//! and field values.

use std::os::raw::{c_int, c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{
    nvmlBAR1Memory_t, nvmlDevice_t, nvmlFieldValue_t, nvmlMemory_t, nvmlReturn_t, nvmlUtilization_t,
};

use crate::state::*;
use crate::system::export;

const MIB: u64 = 1024 * 1024;

fn v(call: &'static str, device: nvmlDevice_t, key: &str) -> Result<f64, nvmlReturn_t> {
    let (sim, g) = gpu(device, call)?;
    value(sim, g, key)
}

fn vu(call: &'static str, device: nvmlDevice_t, key: &str) -> Result<c_uint, nvmlReturn_t> {
    Ok(v(call, device, key)?.max(0.0).round() as c_uint)
}

fn vull(call: &'static str, device: nvmlDevice_t, key: &str) -> Result<c_ulonglong, nvmlReturn_t> {
    Ok(v(call, device, key)?.max(0.0).round() as c_ulonglong)
}

export!(
    fn nvmlDeviceGetUtilizationRates(device: nvmlDevice_t, utilization: *mut nvmlUtilization_t) {
        let (sim, g) = gpu(device, "nvmlDeviceGetUtilizationRates")?;
        // Device utilization is not available on the parent GPU while MIG is on (DCGM's
        // DCGM_FI_DEV_GPU_UTIL is blank in MIG mode for the same reason).
        if sim.mig_on(g) == Some(true) {
            return Err(ERROR_NOT_SUPPORTED);
        }
        let u = nvmlUtilization_t {
            gpu: value(sim, g, "gpu_util")?.round() as c_uint,
            memory: value(sim, g, "mem_util")?.round() as c_uint,
        };
        Ok(put(utilization, u))
    }
);

export!(
    fn nvmlDeviceGetEncoderUtilization(
        device: nvmlDevice_t,
        utilization: *mut c_uint,
        period: *mut c_uint,
    ) {
        let u = vu("nvmlDeviceGetEncoderUtilization", device, "enc_util")?;
        put(period, 167_000);
        Ok(put(utilization, u))
    }
);

export!(
    fn nvmlDeviceGetDecoderUtilization(
        device: nvmlDevice_t,
        utilization: *mut c_uint,
        period: *mut c_uint,
    ) {
        let u = vu("nvmlDeviceGetDecoderUtilization", device, "dec_util")?;
        put(period, 167_000);
        Ok(put(utilization, u))
    }
);

/// total, reserved, used, free in bytes for a GPU or a MIG device.
fn memory(call: &'static str, device: nvmlDevice_t) -> Result<(u64, u64, u64, u64), nvmlReturn_t> {
    let (sim, t) = crate::state::device(device, call)?;
    let now = sim.now();
    match t {
        Target::Gpu(g) => {
            let total = value(sim, g, "memory_total_mib")? as u64 * MIB;
            let reserved = g.value("memory_reserved_mib", now).unwrap_or(0.0) as u64 * MIB;
            let used = (value(sim, g, "memory_used_mib")? as u64 * MIB).min(total - reserved);
            Ok((total, reserved, used, total - reserved - used))
        }
        Target::Mig(_, _, m) => {
            let total = m.memory_total_mib * MIB;
            let used = ((m.memory_used_mib.at(now).max(0.0) as u64) * MIB).min(total);
            Ok((total, 0, used, total - used))
        }
    }
}

export!(
    fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, mem: *mut nvmlMemory_t) {
        let (total, reserved, used, free) = memory("nvmlDeviceGetMemoryInfo", device)?;
        // The v1 struct counts reserved memory as used, as the real library does.
        Ok(put(
            mem,
            nvmlMemory_t {
                total,
                free,
                used: used + reserved,
            },
        ))
    }
);

#[cfg(not(feature = "legacy"))]
export!(
    fn nvmlDeviceGetMemoryInfo_v2(
        device: nvmlDevice_t,
        mem: *mut nvml_wrapper_sys::bindings::nvmlMemory_v2_t,
    ) {
        let (total, reserved, used, free) = memory("nvmlDeviceGetMemoryInfo_v2", device)?;
        if mem.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let version = (*mem).version;
        Ok(put(
            mem,
            nvml_wrapper_sys::bindings::nvmlMemory_v2_t {
                version,
                total,
                reserved,
                free,
                used,
            },
        ))
    }
);

export!(
    fn nvmlDeviceGetBAR1MemoryInfo(device: nvmlDevice_t, bar1: *mut nvmlBAR1Memory_t) {
        let (sim, g) = gpu(device, "nvmlDeviceGetBAR1MemoryInfo")?;
        let total = value(sim, g, "bar1_total_mib")? as u64 * MIB;
        let used = (value(sim, g, "bar1_used_mib")? as u64 * MIB).min(total);
        Ok(put(
            bar1,
            nvmlBAR1Memory_t {
                bar1Total: total,
                bar1Free: total - used,
                bar1Used: used,
            },
        ))
    }
);

export!(
    fn nvmlDeviceGetPowerUsage(device: nvmlDevice_t, power: *mut c_uint) {
        Ok(put(
            power,
            vu("nvmlDeviceGetPowerUsage", device, "power_mw")?,
        ))
    }
);

export!(
    fn nvmlDeviceGetEnforcedPowerLimit(device: nvmlDevice_t, limit: *mut c_uint) {
        Ok(put(
            limit,
            vu("nvmlDeviceGetEnforcedPowerLimit", device, "power_limit_mw")?,
        ))
    }
);

export!(
    fn nvmlDeviceGetPowerManagementLimit(device: nvmlDevice_t, limit: *mut c_uint) {
        Ok(put(
            limit,
            vu(
                "nvmlDeviceGetPowerManagementLimit",
                device,
                "power_limit_mw",
            )?,
        ))
    }
);

export!(
    fn nvmlDeviceGetPowerManagementDefaultLimit(device: nvmlDevice_t, limit: *mut c_uint) {
        Ok(put(
            limit,
            vu(
                "nvmlDeviceGetPowerManagementDefaultLimit",
                device,
                "power_default_limit_mw",
            )?,
        ))
    }
);

export!(
    fn nvmlDeviceGetPowerManagementLimitConstraints(
        device: nvmlDevice_t,
        min: *mut c_uint,
        max: *mut c_uint,
    ) {
        let lo = vu(
            "nvmlDeviceGetPowerManagementLimitConstraints",
            device,
            "power_min_limit_mw",
        )?;
        let hi = vu(
            "nvmlDeviceGetPowerManagementLimitConstraints",
            device,
            "power_max_limit_mw",
        )?;
        put(min, lo);
        Ok(put(max, hi))
    }
);

export!(
    fn nvmlDeviceGetTotalEnergyConsumption(device: nvmlDevice_t, energy: *mut c_ulonglong) {
        Ok(put(
            energy,
            vull("nvmlDeviceGetTotalEnergyConsumption", device, "energy_mj")?,
        ))
    }
);

// Deprecated in CUDA 13 (replaced by `nvmlDeviceGetTemperatureV`): absent from the
// `future` build.
#[cfg(not(feature = "future"))]
export!(
    fn nvmlDeviceGetTemperature(device: nvmlDevice_t, sensor: c_uint, temp: *mut c_uint) {
        if sensor != 0 {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        Ok(put(
            temp,
            vu("nvmlDeviceGetTemperature", device, "temp_gpu")?,
        ))
    }
);

// Deprecated on Ada and newer in CUDA 13 (replaced by the `*_TLIMIT` fields, which answer on
// the T.Limit scale): absent from the `future` build. Absolute temperatures.
#[cfg(not(feature = "future"))]
export!(
    fn nvmlDeviceGetTemperatureThreshold(device: nvmlDevice_t, kind: c_uint, temp: *mut c_uint) {
        let key = match kind {
            0 => "temp_shutdown",
            1 => "temp_slowdown",
            2 => "temp_mem_max",
            3 => "temp_gpu_max",
            _ => return Err(ERROR_NOT_SUPPORTED),
        };
        Ok(put(
            temp,
            vu("nvmlDeviceGetTemperatureThreshold", device, key)?,
        ))
    }
);

/// A die threshold on the T.Limit scale: the margin (degrees below the maximum operating
/// temperature, `temp_gpu_max`) at which the die reaches it; 0 for the maximum itself,
/// negative past it. None where the scenario gives no maximum operating temperature.
fn tlimit(g: &crate::scenario::Gpu, key: &str, now: f64) -> Option<f64> {
    Some(g.value("temp_gpu_max", now)? - g.value(key, now)?)
}

/// `nvmlMarginTemperature_v1_t`'s version word: `sizeof | 1 << 24`.
#[cfg(not(any(feature = "legacy", feature = "r535")))]
const MARGIN_TEMPERATURE_V1: c_uint =
    std::mem::size_of::<nvml_wrapper_sys::bindings::nvmlMarginTemperature_v1_t>() as c_uint
        | 1 << 24;

// The thermal margin ("GPU T.Limit Temp" in nvidia-smi): degrees between the die and its
// maximum operating temperature, on the scale of the `*_TLIMIT` fields.
#[cfg(not(any(feature = "legacy", feature = "r535")))]
export!(
    fn nvmlDeviceGetMarginTemperature(
        device: nvmlDevice_t,
        margin: *mut nvml_wrapper_sys::bindings::nvmlMarginTemperature_t,
    ) {
        if margin.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        if (*margin).version != MARGIN_TEMPERATURE_V1 {
            return Err(ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (sim, g) = gpu(device, "nvmlDeviceGetMarginTemperature")?;
        let die = value(sim, g, "temp_gpu")?;
        let max = g
            .value("temp_gpu_max", sim.now())
            .ok_or(ERROR_NOT_SUPPORTED)?;
        (*margin).marginTemperature = (max - die).round() as c_int;
        Ok(SUCCESS)
    }
);

/// `nvmlTemperature_v1_t`'s version word: `sizeof | 1 << 24`.
#[cfg(not(any(feature = "legacy", feature = "r535")))]
const TEMPERATURE_V1: c_uint =
    std::mem::size_of::<nvml_wrapper_sys::bindings::nvmlTemperature_v1_t>() as c_uint | 1 << 24;

// The versioned temperature call of newer drivers.
#[cfg(not(any(feature = "legacy", feature = "r535")))]
export!(
    fn nvmlDeviceGetTemperatureV(
        device: nvmlDevice_t,
        temp: *mut nvml_wrapper_sys::bindings::nvmlTemperature_t,
    ) {
        if temp.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        if (*temp).version != TEMPERATURE_V1 {
            return Err(ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        if (*temp).sensorType != 0 {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let v = v("nvmlDeviceGetTemperatureV", device, "temp_gpu")?;
        (*temp).temperature = v.round() as c_int;
        Ok(SUCCESS)
    }
);

export!(
    fn nvmlDeviceGetNumFans(device: nvmlDevice_t, num: *mut c_uint) {
        let (_, g) = gpu(device, "nvmlDeviceGetNumFans")?;
        Ok(put(num, g.num_fans))
    }
);

export!(
    fn nvmlDeviceGetFanSpeed_v2(device: nvmlDevice_t, fan: c_uint, speed: *mut c_uint) {
        let (sim, g) = gpu(device, "nvmlDeviceGetFanSpeed_v2")?;
        if fan >= g.num_fans {
            return Err(ERROR_NOT_SUPPORTED);
        }
        Ok(put(speed, value(sim, g, "fan_pct")?.round() as c_uint))
    }
);

export!(
    fn nvmlDeviceGetFanSpeed(device: nvmlDevice_t, speed: *mut c_uint) {
        let (sim, g) = gpu(device, "nvmlDeviceGetFanSpeed")?;
        if g.num_fans == 0 {
            return Err(ERROR_NOT_SUPPORTED);
        }
        Ok(put(speed, value(sim, g, "fan_pct")?.round() as c_uint))
    }
);

fn clock_key(kind: c_uint, max: bool) -> Result<&'static str, nvmlReturn_t> {
    Ok(match (kind, max) {
        (0, false) => "clock_graphics_mhz",
        (1, false) => "clock_sm_mhz",
        (2, false) => "clock_mem_mhz",
        (3, false) => "clock_video_mhz",
        (0, true) => "max_clock_graphics_mhz",
        (1, true) => "max_clock_sm_mhz",
        (2, true) => "max_clock_mem_mhz",
        (3, true) => "max_clock_video_mhz",
        _ => return Err(ERROR_INVALID_ARGUMENT),
    })
}

export!(
    fn nvmlDeviceGetClockInfo(device: nvmlDevice_t, kind: c_uint, clock: *mut c_uint) {
        Ok(put(
            clock,
            vu("nvmlDeviceGetClockInfo", device, clock_key(kind, false)?)?,
        ))
    }
);

export!(
    fn nvmlDeviceGetMaxClockInfo(device: nvmlDevice_t, kind: c_uint, clock: *mut c_uint) {
        Ok(put(
            clock,
            vu("nvmlDeviceGetMaxClockInfo", device, clock_key(kind, true)?)?,
        ))
    }
);

export!(
    fn nvmlDeviceGetPerformanceState(device: nvmlDevice_t, state: *mut c_uint) {
        Ok(put(
            state,
            vu("nvmlDeviceGetPerformanceState", device, "pstate")?,
        ))
    }
);

// Deprecated (renamed to `…ClocksEventReasons`): absent from the `future` build.
#[cfg(not(feature = "future"))]
export!(
    fn nvmlDeviceGetCurrentClocksThrottleReasons(device: nvmlDevice_t, reasons: *mut c_ulonglong) {
        Ok(put(
            reasons,
            vull(
                "nvmlDeviceGetCurrentClocksThrottleReasons",
                device,
                "throttle_reasons",
            )?,
        ))
    }
);

#[cfg(not(feature = "legacy"))]
export!(
    fn nvmlDeviceGetCurrentClocksEventReasons(device: nvmlDevice_t, reasons: *mut c_ulonglong) {
        Ok(put(
            reasons,
            vull(
                "nvmlDeviceGetCurrentClocksEventReasons",
                device,
                "throttle_reasons",
            )?,
        ))
    }
);

#[cfg(not(feature = "future"))]
export!(
    fn nvmlDeviceGetSupportedClocksThrottleReasons(
        device: nvmlDevice_t,
        reasons: *mut c_ulonglong,
    ) {
        let _ = gpu(device, "nvmlDeviceGetSupportedClocksThrottleReasons")?;
        Ok(put(reasons, 0x1ff))
    }
);

// Deprecated in CUDA 13 (replaced by the clock-event-reason fields): absent from the
// `future` build.
#[cfg(not(feature = "future"))]
export!(
    fn nvmlDeviceGetViolationStatus(
        device: nvmlDevice_t,
        policy: c_uint,
        time: *mut nvml_wrapper_sys::bindings::nvmlViolationTime_t,
    ) {
        let key = match policy {
            0 => "violation_power_ns",
            1 => "violation_thermal_ns",
            _ => return Err(ERROR_NOT_SUPPORTED),
        };
        let ns = vull("nvmlDeviceGetViolationStatus", device, key)?;
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        Ok(put(
            time,
            nvml_wrapper_sys::bindings::nvmlViolationTime_t {
                referenceTime: now_us,
                violationTime: ns,
            },
        ))
    }
);

export!(
    fn nvmlDeviceGetTotalEccErrors(
        device: nvmlDevice_t,
        error_type: c_uint,
        counter: c_uint,
        count: *mut c_ulonglong,
    ) {
        let key = match (error_type, counter) {
            (0, 0) => "ecc_corrected_volatile",
            (1, 0) => "ecc_uncorrected_volatile",
            (0, 1) => "ecc_corrected_aggregate",
            (1, 1) => "ecc_uncorrected_aggregate",
            _ => return Err(ERROR_INVALID_ARGUMENT),
        };
        Ok(put(
            count,
            vull("nvmlDeviceGetTotalEccErrors", device, key)?,
        ))
    }
);

export!(
    fn nvmlDeviceGetEccMode(device: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) {
        let on = vu("nvmlDeviceGetEccMode", device, "ecc_mode")?;
        // A change set with `nvidia-smi -e` waits for the next reset.
        let next = vu("nvmlDeviceGetEccMode", device, "ecc_pending").unwrap_or(on);
        put(pending, next);
        Ok(put(current, on))
    }
);

fn retired_key(cause: c_uint) -> Result<&'static str, nvmlReturn_t> {
    match cause {
        0 => Ok("retired_sbe_pages"),
        1 => Ok("retired_dbe_pages"),
        _ => Err(ERROR_INVALID_ARGUMENT),
    }
}

export!(
    fn nvmlDeviceGetRetiredPages(
        device: nvmlDevice_t,
        cause: c_uint,
        count: *mut c_uint,
        addresses: *mut c_ulonglong,
    ) {
        let n = vu("nvmlDeviceGetRetiredPages", device, retired_key(cause)?)?;
        retired(n, count, addresses, std::ptr::null_mut())
    }
);

export!(
    fn nvmlDeviceGetRetiredPages_v2(
        device: nvmlDevice_t,
        cause: c_uint,
        count: *mut c_uint,
        addresses: *mut c_ulonglong,
        timestamps: *mut c_ulonglong,
    ) {
        let n = vu("nvmlDeviceGetRetiredPages_v2", device, retired_key(cause)?)?;
        retired(n, count, addresses, timestamps)
    }
);

/// Fills the retired-page arrays with `n` made-up addresses.
unsafe fn retired(
    n: c_uint,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> Result<nvmlReturn_t, nvmlReturn_t> {
    if count.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: checked non-null above; the arrays hold *count entries per nvml.h.
    unsafe {
        let room = *count;
        *count = n;
        if room < n {
            return if n == 0 {
                Ok(SUCCESS)
            } else {
                Err(ERROR_INSUFFICIENT_SIZE)
            };
        }
        for i in 0..n as usize {
            if !addresses.is_null() {
                *addresses.add(i) = 0x1000 * (i as u64 + 1);
            }
            if !timestamps.is_null() {
                *timestamps.add(i) = 1_700_000_000 + i as u64;
            }
        }
    }
    Ok(SUCCESS)
}

export!(
    fn nvmlDeviceGetRetiredPagesPendingStatus(device: nvmlDevice_t, pending: *mut c_uint) {
        Ok(put(
            pending,
            vu(
                "nvmlDeviceGetRetiredPagesPendingStatus",
                device,
                "retired_pending",
            )?,
        ))
    }
);

export!(
    fn nvmlDeviceGetRemappedRows(
        device: nvmlDevice_t,
        corr: *mut c_uint,
        unc: *mut c_uint,
        pending: *mut c_uint,
        failure: *mut c_uint,
    ) {
        let c = "nvmlDeviceGetRemappedRows";
        let (sim, g) = gpu(device, c)?;
        // Not supported on the parent GPU while MIG is on.
        if sim.mig_on(g) == Some(true) {
            return Err(ERROR_NOT_SUPPORTED);
        }
        let (a, b, p, f) = (
            vu(c, device, "remap_correctable")?,
            vu(c, device, "remap_uncorrectable")?,
            vu(c, device, "remap_pending")?,
            vu(c, device, "remap_failure")?,
        );
        put(corr, a);
        put(unc, b);
        put(pending, p);
        Ok(put(failure, f))
    }
);

export!(
    fn nvmlDeviceGetPcieThroughput(device: nvmlDevice_t, counter: c_uint, value: *mut c_uint) {
        let key = match counter {
            0 => "pcie_tx_kbps",
            1 => "pcie_rx_kbps",
            _ => return Err(ERROR_INVALID_ARGUMENT),
        };
        Ok(put(value, vu("nvmlDeviceGetPcieThroughput", device, key)?))
    }
);

export!(
    fn nvmlDeviceGetPcieReplayCounter(device: nvmlDevice_t, value: *mut c_uint) {
        Ok(put(
            value,
            vu("nvmlDeviceGetPcieReplayCounter", device, "pcie_replay")?,
        ))
    }
);

export!(
    fn nvmlDeviceGetCurrPcieLinkGeneration(device: nvmlDevice_t, value: *mut c_uint) {
        Ok(put(
            value,
            vu("nvmlDeviceGetCurrPcieLinkGeneration", device, "pcie_gen")?,
        ))
    }
);

export!(
    fn nvmlDeviceGetCurrPcieLinkWidth(device: nvmlDevice_t, value: *mut c_uint) {
        Ok(put(
            value,
            vu("nvmlDeviceGetCurrPcieLinkWidth", device, "pcie_width")?,
        ))
    }
);

export!(
    fn nvmlDeviceGetMaxPcieLinkGeneration(device: nvmlDevice_t, value: *mut c_uint) {
        Ok(put(
            value,
            vu("nvmlDeviceGetMaxPcieLinkGeneration", device, "pcie_max_gen")?,
        ))
    }
);

export!(
    fn nvmlDeviceGetMaxPcieLinkWidth(device: nvmlDevice_t, value: *mut c_uint) {
        Ok(put(
            value,
            vu("nvmlDeviceGetMaxPcieLinkWidth", device, "pcie_max_width")?,
        ))
    }
);

export!(
    fn nvmlDeviceGetNvLinkState(device: nvmlDevice_t, link: c_uint, active: *mut c_uint) {
        let (sim, g) = gpu(device, "nvmlDeviceGetNvLinkState")?;
        if link >= g.nvlink_count {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // Links numbered at or above `nvlink_active_links` are down.
        let up = g
            .value("nvlink_active_links", sim.now())
            .is_none_or(|n| f64::from(link) < n);
        Ok(put(active, c_uint::from(up)))
    }
);

export!(
    fn nvmlDeviceGetNvLinkErrorCounter(
        device: nvmlDevice_t,
        link: c_uint,
        counter: c_uint,
        value: *mut c_ulonglong,
    ) {
        let (sim, g) = gpu(device, "nvmlDeviceGetNvLinkErrorCounter")?;
        if link >= g.nvlink_count {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // Links from `nvlink_errors_unsupported_from` on have no error counters (one link's
        // answer must not decide its siblings').
        if g.value("nvlink_errors_unsupported_from", sim.now())
            .is_some_and(|n| f64::from(link) >= n)
        {
            return Err(ERROR_NOT_SUPPORTED);
        }
        let key = match counter {
            0 => "nvlink_replay",
            1 => "nvlink_recovery",
            2 => "nvlink_crc_flit",
            3 => "nvlink_crc_data",
            4 => "nvlink_ecc_data",
            _ => return Err(ERROR_INVALID_ARGUMENT),
        };
        Ok(put(
            value,
            crate::state::value(sim, g, key)?.max(0.0) as c_ulonglong,
        ))
    }
);

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

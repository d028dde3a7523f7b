//! Per-device readings: utilization, memory and power; the rest by family in `thermal`,
//! `clocks`, `errors`, `links` and `fields`.

use std::os::raw::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{
    nvmlBAR1Memory_t, nvmlDevice_t, nvmlMemory_t, nvmlReturn_t, nvmlUtilization_t,
};

use crate::state::*;
use crate::system::export;

const MIB: u64 = 1024 * 1024;

pub(crate) fn v(call: &'static str, device: nvmlDevice_t, key: &str) -> Result<f64, nvmlReturn_t> {
    let (sim, g) = gpu(device, call)?;
    value(sim, g, key)
}

pub(crate) fn vu(
    call: &'static str,
    device: nvmlDevice_t,
    key: &str,
) -> Result<c_uint, nvmlReturn_t> {
    Ok(v(call, device, key)?.max(0.0).round() as c_uint)
}

pub(crate) fn vull(
    call: &'static str,
    device: nvmlDevice_t,
    key: &str,
) -> Result<c_ulonglong, nvmlReturn_t> {
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

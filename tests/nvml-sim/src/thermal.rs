//! Temperatures, their thresholds (absolute and on the T.Limit scale), the margin, and fans.

use std::os::raw::c_uint;

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use crate::state::*;
use crate::system::export;

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
            crate::device::vu("nvmlDeviceGetTemperature", device, "temp_gpu")?,
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
            crate::device::vu("nvmlDeviceGetTemperatureThreshold", device, key)?,
        ))
    }
);

/// A die threshold on the T.Limit scale: the margin (degrees below the maximum operating
/// temperature, `temp_gpu_max`) at which the die reaches it; 0 for the maximum itself,
/// negative past it. None where the scenario gives no maximum operating temperature.
pub(crate) fn tlimit(g: &crate::scenario::Gpu, key: &str, now: f64) -> Option<f64> {
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
        (*margin).marginTemperature = (max - die).round() as std::os::raw::c_int;
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
        let v = crate::device::v("nvmlDeviceGetTemperatureV", device, "temp_gpu")?;
        (*temp).temperature = v.round() as std::os::raw::c_int;
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

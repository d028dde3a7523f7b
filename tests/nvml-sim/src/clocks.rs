//! Clocks, the performance state, clock event (throttle) reasons and violation times.

use std::os::raw::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use crate::device::{vu, vull};
use crate::state::*;
use crate::system::export;

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

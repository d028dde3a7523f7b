//! ECC counts and mode, retired pages and remapped rows.

use std::os::raw::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use crate::device::{vu, vull};
use crate::state::*;
use crate::system::export;

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

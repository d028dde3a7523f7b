//! Persistence and compute mode: every driver answers them (enabled and DEFAULT unless the
//! scenario says `persistence_mode` / `compute_mode`).

use std::os::raw::c_uint;

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use crate::state::*;
use crate::system::export;

export!(
    fn nvmlDeviceGetPersistenceMode(device: nvmlDevice_t, mode: *mut c_uint) {
        let (sim, g) = gpu(device, "nvmlDeviceGetPersistenceMode")?;
        let on = g.value("persistence_mode", sim.now()).unwrap_or(1.0);
        Ok(put(mode, c_uint::from(on >= 0.5)))
    }
);

export!(
    fn nvmlDeviceGetComputeMode(device: nvmlDevice_t, mode: *mut c_uint) {
        let (sim, g) = gpu(device, "nvmlDeviceGetComputeMode")?;
        let m = g.value("compute_mode", sim.now()).unwrap_or(0.0);
        Ok(put(mode, m.max(0.0).round() as c_uint))
    }
);

export!(
    /// P2P between two GPUs: `index` READ 0, WRITE 1, NVLINK 2, ATOMICS 3, PROP 4. As on an
    /// HGX node: every capability OK, NVLink only where both GPUs have links (else
    /// NOT_SUPPORTED, 5); a GPU's `p2p_status` value (e.g. 4, DISABLED_BY_REGKEY, or 6,
    /// UNKNOWN) is what every pair it is in answers instead.
    fn nvmlDeviceGetP2PStatus(
        device1: nvmlDevice_t,
        device2: nvmlDevice_t,
        index: c_uint,
        status: *mut c_uint,
    ) {
        let (sim, a) = gpu(device1, "nvmlDeviceGetP2PStatus")?;
        let (_, b) = gpu(device2, "nvmlDeviceGetP2PStatus")?;
        if index > 4 {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let now = sim.now();
        let forced = [a, b]
            .iter()
            .filter_map(|g| g.value("p2p_status", now))
            .map(|v| v.max(0.0).round() as c_uint)
            .max()
            .filter(|v| *v != 0);
        let s = match forced {
            Some(v) => v,
            None if index == 2 && (a.nvlink_count == 0 || b.nvlink_count == 0) => 5,
            None => 0,
        };
        Ok(put(status, s))
    }
);

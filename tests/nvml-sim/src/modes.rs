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

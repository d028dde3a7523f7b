//! PCIe throughput, replays and link state; NVLink state and error counters.

use std::os::raw::{c_uint, c_ulonglong};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use crate::device::vu;
use crate::state::*;
use crate::system::export;

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

//! GPM (GPU performance monitoring, Hopper and newer): samples and metrics.

use std::os::raw::{c_char, c_uint};

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlGpmMetricsGet_t, nvmlGpmSample_t, nvmlGpmSupport_t, nvmlReturn_t,
};

use crate::state::*;
use crate::system::export;

/// What a sample handle holds: when it was taken and on which GPU.
struct Sample {
    t: f64,
    gpu: Option<u32>,
    /// The GPU instance, for samples taken with `nvmlGpmMigSampleGet`.
    gpu_instance: Option<u32>,
}

/// (metric id, scenario key, short name, unit)
const METRICS: &[(u32, &str, &std::ffi::CStr, &std::ffi::CStr)] = &[
    (1, "gpm_graphics_util", c"GR_UTIL", c"%"),
    (2, "gpm_sm_util", c"SM_UTIL", c"%"),
    (3, "gpm_sm_occupancy", c"SM_OCCUP", c"%"),
    (5, "gpm_tensor_util", c"ANY_TENSOR_UTIL", c"%"),
    (6, "gpm_dfma_tensor_util", c"DFMA_TENSOR_UTIL", c"%"),
    (10, "gpm_dram_bw_util", c"DRAM_BW_UTIL", c"%"),
    (11, "gpm_fp64_util", c"FP64_UTIL", c"%"),
    (12, "gpm_fp32_util", c"FP32_UTIL", c"%"),
    (13, "gpm_fp16_util", c"FP16_UTIL", c"%"),
    (20, "gpm_pcie_tx_mibps", c"PCIE_TX", c"MiB/sec"),
    (21, "gpm_pcie_rx_mibps", c"PCIE_RX", c"MiB/sec"),
    (60, "gpm_nvlink_rx_mibps", c"NVLINK_TOTAL_RX", c"MiB/sec"),
    (61, "gpm_nvlink_tx_mibps", c"NVLINK_TOTAL_TX", c"MiB/sec"),
];

export!(
    fn nvmlGpmQueryDeviceSupport(device: nvmlDevice_t, support: *mut nvmlGpmSupport_t) {
        let (_, g) = gpu(device, "nvmlGpmQueryDeviceSupport")?;
        if support.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        (*support).isSupportedDevice = c_uint::from(g.gpm_supported);
        Ok(SUCCESS)
    }
);

export!(
    fn nvmlGpmSampleAlloc(sample: *mut nvmlGpmSample_t) {
        sim()?;
        Ok(put(
            sample,
            Box::into_raw(Box::new(Sample {
                t: 0.0,
                gpu: None,
                gpu_instance: None,
            }))
            .cast(),
        ))
    }
);

/// # Safety
/// `sample` must come from `nvmlGpmSampleAlloc` and not be used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleFree(sample: nvmlGpmSample_t) -> nvmlReturn_t {
    if !sample.is_null() {
        // SAFETY: created by Box::into_raw in nvmlGpmSampleAlloc, freed once.
        drop(unsafe { Box::from_raw(sample.cast::<Sample>()) });
    }
    SUCCESS
}

export!(
    fn nvmlGpmSampleGet(device: nvmlDevice_t, sample: nvmlGpmSample_t) {
        let (sim, g) = gpu(device, "nvmlGpmSampleGet")?;
        if !g.gpm_supported {
            return Err(ERROR_NOT_SUPPORTED);
        }
        if sample.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let s = &mut *sample.cast::<Sample>();
        s.t = sim.now();
        s.gpu = Some(g.index);
        s.gpu_instance = None;
        Ok(SUCCESS)
    }
);

export!(
    fn nvmlGpmMetricsGet(request: *mut nvmlGpmMetricsGet_t) {
        let sim = sim()?;
        if request.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let r = &mut *request;
        if r.sample1.is_null() || r.sample2.is_null() || r.numMetrics as usize > r.metrics.len() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let (s1, s2) = (&*r.sample1.cast::<Sample>(), &*r.sample2.cast::<Sample>());
        let g = match (s1.gpu, s2.gpu) {
            (Some(a), Some(b)) if a == b && s2.t > s1.t && s1.gpu_instance == s2.gpu_instance => {
                &sim.gpus[a as usize]
            }
            _ => return Err(ERROR_INVALID_ARGUMENT),
        };
        // A MIG sample pair reads the instance's own values.
        let instance = s2.gpu_instance.and_then(|gi| {
            g.mig
                .as_ref()
                .and_then(|m| m.instances.iter().find(|i| i.gpu_instance_id == gi))
        });
        let value = |key: &str| match instance {
            Some(i) => i.values.get(key).map(|v| v.at(s2.t)),
            None => g.value(key, s2.t),
        };
        for m in r.metrics.iter_mut().take(r.numMetrics as usize) {
            match METRICS.iter().find(|(id, ..)| *id == m.metricId) {
                Some((_, key, short, unit)) => match value(key) {
                    Some(v) => {
                        m.nvmlReturn = SUCCESS;
                        m.value = v;
                        m.metricInfo.shortName = short.as_ptr() as *mut c_char;
                        m.metricInfo.longName = short.as_ptr() as *mut c_char;
                        m.metricInfo.unit = unit.as_ptr() as *mut c_char;
                    }
                    None => m.nvmlReturn = ERROR_NOT_SUPPORTED,
                },
                None => m.nvmlReturn = ERROR_NOT_SUPPORTED,
            }
        }
        Ok(SUCCESS)
    }
);

export!(
    fn nvmlGpmMigSampleGet(device: nvmlDevice_t, gpu_instance: c_uint, sample: nvmlGpmSample_t) {
        let (sim, g) = gpu(device, "nvmlGpmMigSampleGet")?;
        if !g.gpm_supported {
            return Err(ERROR_NOT_SUPPORTED);
        }
        let mig = g
            .mig
            .as_ref()
            .filter(|_| sim.mig_on(g) == Some(true))
            .ok_or(ERROR_NOT_SUPPORTED)?;
        if !mig
            .instances
            .iter()
            .any(|i| i.gpu_instance_id == gpu_instance)
        {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        if sample.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let s = &mut *sample.cast::<Sample>();
        s.t = sim.now();
        s.gpu = Some(g.index);
        s.gpu_instance = Some(gpu_instance);
        Ok(SUCCESS)
    }
);

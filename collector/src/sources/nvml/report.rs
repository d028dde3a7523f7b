//! The start-up report: one log line per unavailable feature, naming the GPUs it is off on,
//! instead of one line per feature and GPU (24 lines for the retired-page features alone on
//! an 8×H100 node). `junction inventory` keeps the per-GPU detail.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::model::{GpuSlot, lock};

/// When a feature being unavailable is the normal case, and why.
fn expected(feature: &str) -> Option<&'static str> {
    Some(match feature {
        "retired_pages_sbe" | "retired_pages_dbe" | "retired_pages_pending" => {
            "expected on Ampere and newer, which remap rows instead of retiring pages"
        }
        "remapped_rows" => "expected before Ampere, which retires pages instead",
        "gpm" | "gpm_mig" => "expected before Hopper (GPM needs Hopper or newer)",
        "fan_speed" => "expected on passively cooled boards",
        "temperature_memory" => "expected on GPUs without an HBM temperature sensor",
        "nvlink" | "nvlink_state" | "nvlink_throughput" | "nvlink_fields" => {
            "expected on GPUs without NVLink"
        }
        "encoder_utilization" | "decoder_utilization" => "expected on GPUs without video engines",
        "utilization" | "process_utilization" => "expected while MIG mode is on",
        _ => return None,
    })
}

/// Features whose absence is the rule on most GPUs and says nothing: logged at debug level
/// (`junction inventory` lists them): the fabric state exists only on NVLink-fabric systems,
/// the GSP firmware only where the driver runs it, the NVLink5 counters only on Blackwell,
/// the C2C links only on Grace superchips, and
/// none of them on old drivers.
pub fn quiet(feature: &str) -> bool {
    matches!(
        feature,
        "fabric_info"
            | "gsp_firmware"
            | "gsp_firmware_version"
            | "nvlink5_counters"
            | "nvlink_fec_history"
            | "c2c"
    )
}

/// Logs one line per (feature, reason) with the GPUs it is disabled on.
pub fn startup(slots: &[Arc<Mutex<GpuSlot>>]) {
    let mut off: BTreeMap<(&'static str, String), Vec<u32>> = BTreeMap::new();
    for slot in slots {
        let s = lock(slot);
        for (feature, why) in s.disabled.iter() {
            let gpus = off.entry((feature.name, why.clone())).or_default();
            if !gpus.contains(&s.info.index) {
                gpus.push(s.info.index);
            }
        }
    }
    for ((feature, why), gpus) in off {
        let list = gpus
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        if quiet(feature) {
            tracing::debug!(feature, gpus = %list, reason = %why, "NVML feature unavailable; disabled on these GPUs");
            continue;
        }
        match expected(feature) {
            Some(note) => {
                tracing::info!(feature, gpus = %list, reason = %why, note, "NVML feature unavailable; disabled on these GPUs")
            }
            None => {
                tracing::info!(feature, gpus = %list, reason = %why, "NVML feature unavailable; disabled on these GPUs")
            }
        }
    }
}

//! The GSP firmware and the NVLink fabric (not in the `legacy` build's R418): the GPU fabric
//! info of NVSwitch systems and GB200/GH200 trays (`nvmlDeviceGetGpuFabricInfoV` with
//! its v3 and v2 structs, and the v1 call that CUDA 13 deprecates).
//!
//! As real drivers: the GSP calls answer
//! NOT_SUPPORTED where GSP is off (no `gsp_firmware_version`); the fabric calls answer
//! NOT_SUPPORTED where the GPU has no fabric state (no `fabric_state`: a PCIe card, an
//! NVLink bridge pair), and a version word that is neither v2 nor v3 is
//! ARGUMENT_VERSION_MISMATCH. Scenario values: `fabric_state` (0–3), `fabric_status` (an
//! nvmlReturn_t, meaningful once completed), `fabric_clique_id`, `fabric_health_mask` (a
//! healthy GPU reads 0x1AA, not 0), `fabric_health_summary` (1 healthy, 2 unhealthy, 3
//! limited capacity); the cluster UUID is `fabric_cluster_uuid`.

use std::os::raw::{c_char, c_uint};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use crate::state::*;
use crate::system::export;

export!(
    // R510 and newer.
    fn nvmlDeviceGetGspFirmwareVersion(device: nvmlDevice_t, version: *mut c_char) {
        let (_, g) = gpu(device, "nvmlDeviceGetGspFirmwareVersion")?;
        if g.gsp_firmware_version.is_empty() {
            return Err(ERROR_NOT_SUPPORTED);
        }
        // NVML_GSP_FIRMWARE_VERSION_BUF_SIZE
        Ok(write_str(&g.gsp_firmware_version, version, 0x40))
    }
);

export!(
    fn nvmlDeviceGetGspFirmwareMode(
        device: nvmlDevice_t,
        is_enabled: *mut c_uint,
        default_mode: *mut c_uint,
    ) {
        let (_, g) = gpu(device, "nvmlDeviceGetGspFirmwareMode")?;
        let on = c_uint::from(!g.gsp_firmware_version.is_empty());
        put(default_mode, on);
        Ok(put(is_enabled, on))
    }
);

/// (cluster UUID, status, clique, state, health mask, health summary).
type Fabric = ([u8; 16], nvmlReturn_t, u32, u8, u32, u8);

/// The fabric fields now.
fn fabric(device: nvmlDevice_t, call: &'static str) -> Result<Fabric, nvmlReturn_t> {
    let (sim, g) = gpu(device, call)?;
    let now = sim.now();
    let state = g.value("fabric_state", now).ok_or(ERROR_NOT_SUPPORTED)?;
    let n = |k: &str| g.value(k, now).unwrap_or(0.0).max(0.0).round() as u32;
    let mut uuid = [0u8; 16];
    let hex: Vec<u8> = g
        .fabric_cluster_uuid
        .bytes()
        .filter(u8::is_ascii_hexdigit)
        .collect();
    for (i, pair) in hex.chunks(2).take(16).enumerate() {
        let s = std::str::from_utf8(pair).unwrap_or("0");
        uuid[i] = u8::from_str_radix(s, 16).unwrap_or(0);
    }
    Ok((
        uuid,
        n("fabric_status"),
        n("fabric_clique_id"),
        state.max(0.0).round() as u8,
        n("fabric_health_mask"),
        n("fabric_health_summary") as u8,
    ))
}

export!(
    // R525 and newer (deprecated in CUDA 13).
    #[cfg(not(any(feature = "legacy", feature = "future")))]
    fn nvmlDeviceGetGpuFabricInfo(
        device: nvmlDevice_t,
        info: *mut nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_t,
    ) {
        let (uuid, status, clique, state, _, _) = fabric(device, "nvmlDeviceGetGpuFabricInfo")?;
        if info.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; zeroed and then filled field by field, as the driver's.
        unsafe {
            std::ptr::write_bytes(info, 0, 1);
            (*info).clusterUuid = uuid;
            (*info).status = status;
            (*info).cliqueId = clique;
            (*info).state = state;
        }
        Ok(SUCCESS)
    }
);

export!(
    // R550 and newer.
    #[cfg(not(any(feature = "legacy", feature = "r535")))]
    fn nvmlDeviceGetGpuFabricInfoV(
        device: nvmlDevice_t,
        info: *mut nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_v3_t,
    ) {
        if info.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; every version of the struct begins with its version word.
        let version = unsafe { *(info as *const c_uint) };
        let v2 = std::mem::size_of::<nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_v2_t>()
            as c_uint
            | 2 << 24;
        let v3 = std::mem::size_of::<nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_v3_t>()
            as c_uint
            | 3 << 24;
        let (uuid, status, clique, state, mask, summary) =
            fabric(device, "nvmlDeviceGetGpuFabricInfoV")?;
        // The driver hands back a zeroed struct with its fields set: its padding reads 0
        // (pynvml declares the one-byte state as a c_uint and reads three padding bytes
        // with it), so the fields are written one by one, never a whole Rust value.
        if version == v3 {
            // SAFETY: non-null, and as large as the v3 version word says.
            unsafe {
                std::ptr::write_bytes(info, 0, 1);
                (*info).version = version;
                (*info).clusterUuid = uuid;
                (*info).status = status;
                (*info).cliqueId = clique;
                (*info).state = state;
                (*info).healthMask = mask;
                (*info).healthSummary = summary;
            }
            Ok(SUCCESS)
        } else if version == v2 {
            let v = info.cast::<nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_v2_t>();
            // SAFETY: non-null, and as large as the v2 version word says.
            unsafe {
                std::ptr::write_bytes(v, 0, 1);
                (*v).version = version;
                (*v).clusterUuid = uuid;
                (*v).status = status;
                (*v).cliqueId = clique;
                (*v).state = state;
                (*v).healthMask = mask;
            }
            Ok(SUCCESS)
        } else {
            Err(ERROR_ARGUMENT_VERSION_MISMATCH)
        }
    }
);

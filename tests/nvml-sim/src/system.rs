//! Library, system and handle functions.

use std::os::raw::{c_char, c_int, c_uint};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlPciInfo_t, nvmlReturn_t};

use crate::state::*;

/// Defines an exported NVML function whose body returns `Result<nvmlReturn_t, nvmlReturn_t>`.
macro_rules! export {
    ($(#[$m:meta])* fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $body:block) => {
        $(#[$m])*
        /// # Safety
        /// Pointer arguments must be valid as `nvml.h` describes.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> nvmlReturn_t {
            #[allow(unused_unsafe, reason = "some bodies have no unsafe operation")]
            unsafe fn body($($arg: $ty),*) -> Result<nvmlReturn_t, nvmlReturn_t> {
                // SAFETY: the caller passes pointers valid as nvml.h requires; the body writes
                // through them with `put`/`write_str`, which check for null.
                unsafe { $body }
            }
            // SAFETY: forwards the caller's arguments unchanged.
            code(unsafe { body($($arg),*) })
        }
    };
}
pub(crate) use export;

/// # Safety
/// Always safe; `unsafe` because it is an FFI entry point.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    code(
        init()
            .and_then(|s| s.faults("nvmlInit_v2", u32::MAX))
            .map(|_| SUCCESS),
    )
}

/// # Safety
/// Always safe; `unsafe` because it is an FFI entry point.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit() -> nvmlReturn_t {
    code(init().map(|_| SUCCESS))
}

/// # Safety
/// Always safe; `unsafe` because it is an FFI entry point.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    code(
        init()
            .and_then(|s| s.faults("nvmlInitWithFlags", u32::MAX))
            .map(|_| SUCCESS),
    )
}

/// # Safety
/// Always safe; `unsafe` because it is an FFI entry point.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    code(sim().map(|_| SUCCESS))
}

/// # Safety
/// Always safe; returns a static string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static std::ffi::CStr = match result {
        SUCCESS => c"Success",
        ERROR_UNINITIALIZED => c"Uninitialized",
        ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        ERROR_NOT_SUPPORTED => c"Not Supported",
        ERROR_NOT_FOUND => c"Not Found",
        ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        ERROR_TIMEOUT => c"Timeout",
        ERROR_GPU_IS_LOST => c"GPU is lost",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

export!(
    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) {
        let sim = sim()?;
        Ok(write_str(&sim.scenario.driver.version, version, length))
    }
);

export!(
    fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) {
        let sim = sim()?;
        Ok(write_str(
            &sim.scenario.driver.nvml_version,
            version,
            length,
        ))
    }
);

export!(
    fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) {
        Ok(put(version, sim()?.scenario.driver.cuda_version))
    }
);

export!(
    fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) {
        Ok(put(version, sim()?.scenario.driver.cuda_version))
    }
);

export!(
    fn nvmlSystemGetProcessName(pid: c_uint, name: *mut c_char, length: c_uint) {
        let sim = sim()?;
        let all = sim.gpus.iter().flat_map(|g| {
            g.processes.iter().chain(
                g.mig
                    .iter()
                    .flat_map(|m| m.instances.iter().flat_map(|i| i.processes.iter())),
            )
        });
        let mut all = all;
        match all.find(|p| p.pid == pid) {
            Some(p) => Ok(write_str_cropped(&p.name, name, length)),
            None => Err(ERROR_NOT_FOUND),
        }
    }
);

export!(
    fn nvmlDeviceGetCount_v2(count: *mut c_uint) {
        Ok(put(count, sim()?.gpus.len() as c_uint))
    }
);

export!(
    fn nvmlDeviceGetCount(count: *mut c_uint) {
        Ok(put(count, sim()?.gpus.len() as c_uint))
    }
);

export!(
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) {
        let sim = sim()?;
        if index as usize >= sim.gpus.len() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        sim.faults("nvmlDeviceGetHandleByIndex_v2", index)?;
        Ok(put(device, gpu_handle(index)))
    }
);

export!(
    fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut nvmlDevice_t) {
        let sim = sim()?;
        if index as usize >= sim.gpus.len() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        Ok(put(device, gpu_handle(index)))
    }
);

export!(
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut nvmlDevice_t) {
        let sim = sim()?;
        if uuid.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let wanted = std::ffi::CStr::from_ptr(uuid).to_string_lossy();
        let g = sim
            .gpus
            .iter()
            .find(|g| g.uuid == wanted)
            .ok_or(ERROR_NOT_FOUND)?;
        sim.faults("nvmlDeviceGetHandleByUUID", g.index)?;
        Ok(put(device, gpu_handle(g.index)))
    }
);

export!(
    fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) {
        let (_, g) = gpu(device, "nvmlDeviceGetIndex")?;
        Ok(put(index, g.index))
    }
);

export!(
    fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) {
        let (_, t) = crate::state::device(device, "nvmlDeviceGetName")?;
        let n = match &t {
            Target::Gpu(g) => g.name.clone(),
            Target::Mig(g, _, m) => match &m.profile {
                Some(p) => format!("{} MIG {p}", g.name),
                None => format!("{} MIG", g.name),
            },
        };
        Ok(write_str(&n, name, length))
    }
);

export!(
    fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) {
        let (_, t) = crate::state::device(device, "nvmlDeviceGetUUID")?;
        let u = match &t {
            Target::Gpu(g) => g.uuid.as_str(),
            Target::Mig(_, _, m) => m.uuid.as_str(),
        };
        Ok(write_str(u, uuid, length))
    }
);

export!(
    fn nvmlDeviceGetSerial(device: nvmlDevice_t, serial: *mut c_char, length: c_uint) {
        let (_, g) = gpu(device, "nvmlDeviceGetSerial")?;
        Ok(write_str(&g.serial, serial, length))
    }
);

export!(
    fn nvmlDeviceGetVbiosVersion(device: nvmlDevice_t, version: *mut c_char, length: c_uint) {
        let (_, g) = gpu(device, "nvmlDeviceGetVbiosVersion")?;
        Ok(write_str(&g.vbios_version, version, length))
    }
);

export!(
    fn nvmlDeviceGetMinorNumber(device: nvmlDevice_t, minor: *mut c_uint) {
        let (_, g) = gpu(device, "nvmlDeviceGetMinorNumber")?;
        Ok(put(minor, g.minor_number))
    }
);

unsafe fn pci_info(g: &crate::scenario::Gpu, pci: *mut nvmlPciInfo_t) -> nvmlReturn_t {
    if pci.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null; the caller passes a valid nvmlPciInfo_t.
    let p = unsafe { &mut *pci };
    let fill = |dst: &mut [c_char], s: &str| {
        for (d, b) in dst.iter_mut().zip(s.bytes().chain(std::iter::once(0))) {
            *d = b as c_char;
        }
    };
    fill(
        &mut p.busIdLegacy,
        &format!("{:04X}:{:02X}:00.0", g.pci_domain, g.pci_bus),
    );
    fill(&mut p.busId, &g.bus_id());
    p.domain = g.pci_domain;
    p.bus = g.pci_bus;
    p.device = 0;
    p.pciDeviceId = g.pci_device_id;
    p.pciSubSystemId = 0x16c1_10de;
    SUCCESS
}

export!(
    fn nvmlDeviceGetPciInfo_v3(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        let (_, g) = gpu(device, "nvmlDeviceGetPciInfo_v3")?;
        Ok(pci_info(g, pci))
    }
);

export!(
    fn nvmlDeviceGetPciInfo_v2(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        let (_, g) = gpu(device, "nvmlDeviceGetPciInfo_v2")?;
        Ok(pci_info(g, pci))
    }
);

export!(
    fn nvmlDeviceGetPciInfo(device: nvmlDevice_t, pci: *mut nvmlPciInfo_t) {
        let (_, g) = gpu(device, "nvmlDeviceGetPciInfo")?;
        Ok(pci_info(g, pci))
    }
);

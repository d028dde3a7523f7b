//! Processes, MIG, GPM and events.

use std::os::raw::{c_uint, c_ulonglong};
use std::time::Duration;

use nvml_wrapper_sys::bindings::{
    nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t, nvmlProcessInfo_v2_t,
    nvmlProcessUtilizationSample_t, nvmlReturn_t,
};

use crate::scenario::Process;
use crate::state::*;
use crate::system::export;

/// Processes visible through a handle, with their (GPU instance, compute instance) ids.
fn processes(t: &Target<'static>, kind: &str) -> Vec<(&'static Process, u32, u32)> {
    const NONE: u32 = u32::MAX;
    match *t {
        Target::Gpu(g) => {
            let mut v: Vec<_> = g
                .processes
                .iter()
                .filter(|p| p.kind == kind)
                .map(|p| (p, NONE, NONE))
                .collect();
            if let Some(m) = g.mig.as_ref().filter(|m| m.enabled) {
                for i in &m.instances {
                    v.extend(
                        i.processes
                            .iter()
                            .filter(|p| p.kind == kind)
                            .map(|p| (p, i.gpu_instance_id, i.compute_instance_id)),
                    );
                }
            }
            v
        }
        Target::Mig(_, _, i) => i
            .processes
            .iter()
            .filter(|p| p.kind == kind)
            .map(|p| (p, i.gpu_instance_id, i.compute_instance_id))
            .collect(),
    }
}

unsafe fn running(
    call: &'static str,
    kind: &str,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> Result<nvmlReturn_t, nvmlReturn_t> {
    let (_, t) = crate::state::device(device, call)?;
    let list = processes(&t, kind);
    if count.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: `count` is non-null; `infos` holds *count entries per nvml.h.
    unsafe {
        let room = *count as usize;
        *count = list.len() as c_uint;
        if room < list.len() || (infos.is_null() && !list.is_empty()) {
            return Err(ERROR_INSUFFICIENT_SIZE);
        }
        for (i, (p, gi, ci)) in list.iter().enumerate() {
            infos.add(i).write(nvmlProcessInfo_v2_t {
                pid: p.pid,
                usedGpuMemory: p.used_mib * 1024 * 1024,
                gpuInstanceId: *gi,
                computeInstanceId: *ci,
            });
        }
    }
    Ok(SUCCESS)
}

#[cfg(not(feature = "legacy"))]
export!(
    fn nvmlDeviceGetComputeRunningProcesses_v3(
        device: nvmlDevice_t,
        count: *mut c_uint,
        infos: *mut nvmlProcessInfo_v2_t,
    ) {
        running(
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "compute",
            device,
            count,
            infos,
        )
    }
);

export!(
    fn nvmlDeviceGetComputeRunningProcesses_v2(
        device: nvmlDevice_t,
        count: *mut c_uint,
        infos: *mut nvmlProcessInfo_v2_t,
    ) {
        running(
            "nvmlDeviceGetComputeRunningProcesses_v2",
            "compute",
            device,
            count,
            infos,
        )
    }
);

#[cfg(not(feature = "legacy"))]
export!(
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(
        device: nvmlDevice_t,
        count: *mut c_uint,
        infos: *mut nvmlProcessInfo_v2_t,
    ) {
        running(
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
            "graphics",
            device,
            count,
            infos,
        )
    }
);

export!(
    fn nvmlDeviceGetGraphicsRunningProcesses_v2(
        device: nvmlDevice_t,
        count: *mut c_uint,
        infos: *mut nvmlProcessInfo_v2_t,
    ) {
        running(
            "nvmlDeviceGetGraphicsRunningProcesses_v2",
            "graphics",
            device,
            count,
            infos,
        )
    }
);

export!(
    fn nvmlDeviceGetProcessUtilization(
        device: nvmlDevice_t,
        samples: *mut nvmlProcessUtilizationSample_t,
        count: *mut c_uint,
        last_seen: c_ulonglong,
    ) {
        let (_, g) = gpu(device, "nvmlDeviceGetProcessUtilization")?;
        if count.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        // One sample per process, stamped "now": always newer than any earlier `last_seen`.
        let list: Vec<&Process> = if now_us > last_seen {
            g.processes.iter().collect()
        } else {
            Vec::new()
        };
        if list.is_empty() {
            *count = 0;
            return Err(ERROR_NOT_FOUND);
        }
        let room = *count as usize;
        *count = list.len() as c_uint;
        if samples.is_null() || room < list.len() {
            return Err(ERROR_INSUFFICIENT_SIZE);
        }
        for (i, p) in list.iter().enumerate() {
            samples.add(i).write(nvmlProcessUtilizationSample_t {
                pid: p.pid,
                timeStamp: now_us,
                smUtil: p.sm_util,
                memUtil: p.mem_util,
                encUtil: p.enc_util,
                decUtil: p.dec_util,
            });
        }
        Ok(SUCCESS)
    }
);

export!(
    fn nvmlDeviceGetMigMode(device: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) {
        let (_, g) = gpu(device, "nvmlDeviceGetMigMode")?;
        let m = g.mig.as_ref().ok_or(ERROR_NOT_SUPPORTED)?;
        put(pending, c_uint::from(m.enabled));
        Ok(put(current, c_uint::from(m.enabled)))
    }
);

export!(
    fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) {
        let (_, g) = gpu(device, "nvmlDeviceGetMaxMigDeviceCount")?;
        let m = g.mig.as_ref().ok_or(ERROR_NOT_SUPPORTED)?;
        Ok(put(
            count,
            if m.enabled {
                7.max(m.instances.len() as c_uint)
            } else {
                0
            },
        ))
    }
);

export!(
    fn nvmlDeviceGetMigDeviceHandleByIndex(
        device: nvmlDevice_t,
        index: c_uint,
        mig: *mut nvmlDevice_t,
    ) {
        let (_, g) = gpu(device, "nvmlDeviceGetMigDeviceHandleByIndex")?;
        let m = g
            .mig
            .as_ref()
            .filter(|m| m.enabled)
            .ok_or(ERROR_NOT_SUPPORTED)?;
        if index as usize >= m.instances.len() {
            return Err(ERROR_NOT_FOUND);
        }
        Ok(put(mig, mig_handle(g.index, index)))
    }
);

export!(
    fn nvmlDeviceIsMigDeviceHandle(device: nvmlDevice_t, is_mig: *mut c_uint) {
        let (_, t) = crate::state::device(device, "nvmlDeviceIsMigDeviceHandle")?;
        Ok(put(is_mig, c_uint::from(matches!(t, Target::Mig(..)))))
    }
);

export!(
    fn nvmlDeviceGetGpuInstanceId(device: nvmlDevice_t, id: *mut c_uint) {
        match crate::state::device(device, "nvmlDeviceGetGpuInstanceId")? {
            (_, Target::Mig(_, _, i)) => Ok(put(id, i.gpu_instance_id)),
            _ => Err(ERROR_NOT_SUPPORTED),
        }
    }
);

export!(
    fn nvmlDeviceGetComputeInstanceId(device: nvmlDevice_t, id: *mut c_uint) {
        match crate::state::device(device, "nvmlDeviceGetComputeInstanceId")? {
            (_, Target::Mig(_, _, i)) => Ok(put(id, i.compute_instance_id)),
            _ => Err(ERROR_NOT_SUPPORTED),
        }
    }
);

export!(
    fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
        device: nvmlDevice_t,
        parent: *mut nvmlDevice_t,
    ) {
        match crate::state::device(device, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle")? {
            (_, Target::Mig(g, _, _)) => Ok(put(parent, gpu_handle(g.index))),
            _ => Err(ERROR_INVALID_ARGUMENT),
        }
    }
);

export!(
    fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) {
        sim()?;
        let b: Box<EventSet> = Box::new(EventSet { gpus: Vec::new() });
        Ok(put(set, Box::into_raw(b).cast()))
    }
);

/// What an event set is registered for.
struct EventSet {
    gpus: Vec<u32>,
}

export!(
    fn nvmlDeviceGetSupportedEventTypes(device: nvmlDevice_t, types: *mut c_ulonglong) {
        let _ = gpu(device, "nvmlDeviceGetSupportedEventTypes")?;
        Ok(put(types, 8))
    }
);

export!(
    fn nvmlDeviceRegisterEvents(device: nvmlDevice_t, types: c_ulonglong, set: nvmlEventSet_t) {
        let (_, g) = gpu(device, "nvmlDeviceRegisterEvents")?;
        if set.is_null() || types & 8 == 0 {
            return Err(ERROR_NOT_SUPPORTED);
        }
        // SAFETY: `set` came from nvmlEventSetCreate.
        let es = &mut *set.cast::<EventSet>();
        es.gpus.push(g.index);
        Ok(SUCCESS)
    }
);

export!(
    fn nvmlEventSetWait_v2(set: nvmlEventSet_t, data: *mut nvmlEventData_t, timeout_ms: c_uint) {
        let sim = sim()?;
        if set.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: `set` came from nvmlEventSetCreate.
        let gpus = (*set.cast::<EventSet>()).gpus.clone();
        let deadline = sim.now() + f64::from(timeout_ms) / 1000.0;
        loop {
            {
                let mut delivered = sim
                    .delivered_events
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let now = sim.now();
                let next = sim
                    .scenario
                    .events
                    .iter()
                    .enumerate()
                    .find(|(i, e)| !delivered[*i] && e.at_secs <= now && gpus.contains(&e.gpu));
                if let Some((i, e)) = next {
                    delivered[i] = true;
                    return Ok(put(
                        data,
                        nvmlEventData_t {
                            device: gpu_handle(e.gpu),
                            eventType: 8,
                            eventData: e.xid,
                            gpuInstanceId: u32::MAX,
                            computeInstanceId: u32::MAX,
                        },
                    ));
                }
            }
            if sim.now() >= deadline {
                return Err(ERROR_TIMEOUT);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
);

/// # Safety
/// `set` must come from `nvmlEventSetCreate` and not be used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    if !set.is_null() {
        // SAFETY: created by Box::into_raw in nvmlEventSetCreate, freed once.
        drop(unsafe { Box::from_raw(set.cast::<EventSet>()) });
    }
    SUCCESS
}

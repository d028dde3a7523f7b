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
fn processes(sim: &Sim, t: &Target<'static>, kind: &str) -> Vec<(&'static Process, u32, u32)> {
    const NONE: u32 = u32::MAX;
    match *t {
        Target::Gpu(g) => {
            let mut v: Vec<_> = g
                .processes
                .iter()
                .filter(|p| p.kind == kind)
                .map(|p| (p, NONE, NONE))
                .collect();
            if let Some(m) = g.mig.as_ref().filter(|_| sim.mig_on(g) == Some(true)) {
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

fn used_bytes(p: &Process) -> u64 {
    p.used_mib
        .map_or(VALUE_NOT_AVAILABLE_ULL, |m| m * 1024 * 1024)
}

/// The process entry that drivers 535.43 to 535.86 fill in `nvml*RunningProcesses_v3`: the
/// 24-byte `nvmlProcessInfo_v2_t` plus `usedGpuCcProtectedMemory`, 32 bytes in all, while
/// the header every caller compiled against says 24 (XuehaiPan/nvitop PR #79,
/// gpuopenanalytics/pynvml#50, NVIDIA/go-nvml#75). Later drivers went back to 24 bytes and
/// moved the field to `nvmlProcessDetail_v1_t` / `nvmlDeviceGetRunningProcessDetailList`.
#[cfg(feature = "r535")]
#[repr(C)]
pub struct ProcessInfoR535 {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
    used_gpu_cc_protected_memory: c_ulonglong,
}

/// The `_v3` entry of this build: 32 bytes on the R535 build, 24 otherwise.
#[cfg(all(feature = "r535", not(feature = "legacy")))]
pub type V3Entry = ProcessInfoR535;
#[cfg(not(any(feature = "r535", feature = "legacy")))]
pub type V3Entry = nvmlProcessInfo_v2_t;

#[cfg(not(feature = "legacy"))]
fn v3_entry(p: &Process, gi: u32, ci: u32) -> V3Entry {
    #[cfg(feature = "r535")]
    {
        ProcessInfoR535 {
            pid: p.pid,
            used_gpu_memory: used_bytes(p),
            gpu_instance_id: gi,
            compute_instance_id: ci,
            used_gpu_cc_protected_memory: 0,
        }
    }
    #[cfg(not(feature = "r535"))]
    {
        nvmlProcessInfo_v2_t {
            pid: p.pid,
            usedGpuMemory: used_bytes(p),
            gpuInstanceId: gi,
            computeInstanceId: ci,
        }
    }
}

/// The common shape of the process-list calls: `*count` is the room in `infos` on entry and
/// the number of processes on return; INSUFFICIENT_SIZE when they do not fit.
unsafe fn running<T>(
    call: &'static str,
    kind: &str,
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
    entry: fn(&Process, u32, u32) -> T,
) -> Result<nvmlReturn_t, nvmlReturn_t> {
    let (sim, t) = crate::state::device(device, call)?;
    let list = processes(sim, &t, kind);
    if count.is_null() {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: `count` is non-null; `infos` holds *count entries of T per nvml.h (of the
    // driver's own T, which is the point of the R535 defect).
    unsafe {
        let room = *count as usize;
        *count = list.len() as c_uint;
        if room < list.len() || (infos.is_null() && !list.is_empty()) {
            return Err(ERROR_INSUFFICIENT_SIZE);
        }
        for (i, (p, gi, ci)) in list.iter().enumerate() {
            infos.add(i).write(entry(p, *gi, *ci));
        }
    }
    Ok(SUCCESS)
}

fn v2_entry(p: &Process, gi: u32, ci: u32) -> nvmlProcessInfo_v2_t {
    nvmlProcessInfo_v2_t {
        pid: p.pid,
        usedGpuMemory: used_bytes(p),
        gpuInstanceId: gi,
        computeInstanceId: ci,
    }
}

#[cfg(not(feature = "legacy"))]
export!(
    fn nvmlDeviceGetComputeRunningProcesses_v3(
        device: nvmlDevice_t,
        count: *mut c_uint,
        infos: *mut V3Entry,
    ) {
        running(
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "compute",
            device,
            count,
            infos,
            v3_entry,
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
            v2_entry,
        )
    }
);

#[cfg(not(feature = "legacy"))]
export!(
    fn nvmlDeviceGetGraphicsRunningProcesses_v3(
        device: nvmlDevice_t,
        count: *mut c_uint,
        infos: *mut V3Entry,
    ) {
        running(
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
            "graphics",
            device,
            count,
            infos,
            v3_entry,
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
            v2_entry,
        )
    }
);

// Drivers from R545 on: the process list with the confidential-computing field, in its own
// versioned struct. Its presence is how callers tell an R535 driver (which has
// `nvmlDeviceGetConfComputeMemSizeInfo` but not this) from later ones.
#[cfg(not(any(feature = "legacy", feature = "r535")))]
export!(
    fn nvmlDeviceGetRunningProcessDetailList(
        device: nvmlDevice_t,
        list: *mut nvml_wrapper_sys::bindings::nvmlProcessDetailList_t,
    ) {
        if list.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let l = &mut *list;
        let kind = match l.mode {
            0 => "compute",
            1 => "graphics",
            _ => return Err(ERROR_NOT_SUPPORTED),
        };
        let (sim, t) = crate::state::device(device, "nvmlDeviceGetRunningProcessDetailList")?;
        let procs = processes(sim, &t, kind);
        let room = l.numProcArrayEntries as usize;
        l.numProcArrayEntries = procs.len() as c_uint;
        if room < procs.len() || (l.procArray.is_null() && !procs.is_empty()) {
            return Err(ERROR_INSUFFICIENT_SIZE);
        }
        for (i, (p, gi, ci)) in procs.iter().enumerate() {
            l.procArray
                .add(i)
                .write(nvml_wrapper_sys::bindings::nvmlProcessDetail_v1_t {
                    pid: p.pid,
                    usedGpuMemory: used_bytes(p),
                    gpuInstanceId: *gi,
                    computeInstanceId: *ci,
                    usedGpuCcProtectedMemory: 0,
                });
        }
        Ok(SUCCESS)
    }
);

// R535 and later: confidential-computing memory split (zero while CC mode is off).
#[cfg(not(feature = "legacy"))]
export!(
    fn nvmlDeviceGetConfComputeMemSizeInfo(
        device: nvmlDevice_t,
        info: *mut nvml_wrapper_sys::bindings::nvmlConfComputeMemSizeInfo_t,
    ) {
        let _ = gpu(device, "nvmlDeviceGetConfComputeMemSizeInfo")?;
        Ok(put(
            info,
            nvml_wrapper_sys::bindings::nvmlConfComputeMemSizeInfo_t {
                protectedMemSizeKib: 0,
                unprotectedMemSizeKib: 0,
            },
        ))
    }
);

/// The driver samples per-process utilization into a buffer and answers from it, which
/// shows in what callers get back (nvml.h: "one utilization sample structure is returned per
/// process running, that had some non-zero utilization during the last sample period";
/// nvitop and the Datadog agent work around the rest):
/// - only processes with some non-zero utilization appear;
/// - a process can appear several times (older samples from the buffer, oldest first);
/// - the sample at exactly `lastSeenTimeStamp` comes back again (stale), and
///   `lastSeenTimeStamp` = 0 returns the whole buffer (the last 10 s here);
/// - values are passed through unchecked, so a scenario can make them exceed 100.
///
/// Older samples carry half the scenario's values, so a caller that keeps anything but the
/// newest entry per pid exports a visibly wrong number.
fn utilization_samples(
    procs: &[&Process],
    now_us: u64,
    last_seen: u64,
) -> Vec<nvmlProcessUtilizationSample_t> {
    const PERIOD_US: u64 = 500_000;
    const BUFFER_US: u64 = 10_000_000;
    let mut out = Vec::new();
    for p in procs {
        if p.sm_util == 0 && p.mem_util == 0 && p.enc_util == 0 && p.dec_util == 0 {
            continue;
        }
        let sample = |ts: u64, half: bool| nvmlProcessUtilizationSample_t {
            pid: p.pid,
            timeStamp: ts,
            smUtil: if half { p.sm_util / 2 } else { p.sm_util },
            memUtil: if half { p.mem_util / 2 } else { p.mem_util },
            encUtil: if half { p.enc_util / 2 } else { p.enc_util },
            decUtil: if half { p.dec_util / 2 } else { p.dec_util },
        };
        let newest = now_us.saturating_sub(50_000);
        if last_seen > 0 && last_seen < newest {
            out.push(sample(last_seen, true));
        }
        let oldest = if last_seen == 0 {
            newest.saturating_sub(BUFFER_US)
        } else {
            last_seen + 1
        };
        let mut ts = newest.saturating_sub(PERIOD_US);
        let mut older = Vec::new();
        while ts >= oldest && ts > 0 && older.len() < (BUFFER_US / PERIOD_US) as usize {
            older.push(sample(ts, true));
            ts = ts.saturating_sub(PERIOD_US);
        }
        out.extend(older.into_iter().rev());
        if newest > last_seen {
            out.push(sample(newest, false));
        }
    }
    out
}

export!(
    fn nvmlDeviceGetProcessUtilization(
        device: nvmlDevice_t,
        samples: *mut nvmlProcessUtilizationSample_t,
        count: *mut c_uint,
        last_seen: c_ulonglong,
    ) {
        let (sim, g) = gpu(device, "nvmlDeviceGetProcessUtilization")?;
        // Per-process utilization is not available while MIG is on.
        if sim.mig_on(g) == Some(true) {
            return Err(ERROR_NOT_SUPPORTED);
        }
        if count.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        let procs: Vec<&Process> = g.processes.iter().collect();
        let list = utilization_samples(&procs, now_us, last_seen);
        if list.is_empty() {
            *count = 0;
            return Err(ERROR_NOT_FOUND);
        }
        let room = *count as usize;
        *count = list.len() as c_uint;
        if samples.is_null() || room < list.len() {
            return Err(ERROR_INSUFFICIENT_SIZE);
        }
        for (i, s) in list.iter().enumerate() {
            samples.add(i).write(*s);
        }
        Ok(SUCCESS)
    }
);

export!(
    fn nvmlDeviceGetMigMode(device: nvmlDevice_t, current: *mut c_uint, pending: *mut c_uint) {
        let (sim, g) = gpu(device, "nvmlDeviceGetMigMode")?;
        let on = sim.mig_on(g).ok_or(ERROR_NOT_SUPPORTED)?;
        put(pending, c_uint::from(on));
        Ok(put(current, c_uint::from(on)))
    }
);

export!(
    fn nvmlDeviceGetMaxMigDeviceCount(device: nvmlDevice_t, count: *mut c_uint) {
        let (sim, g) = gpu(device, "nvmlDeviceGetMaxMigDeviceCount")?;
        let m = g.mig.as_ref().ok_or(ERROR_NOT_SUPPORTED)?;
        Ok(put(
            count,
            if sim.mig_on(g) == Some(true) {
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
        let (sim, g) = gpu(device, "nvmlDeviceGetMigDeviceHandleByIndex")?;
        let m = g
            .mig
            .as_ref()
            .filter(|_| sim.mig_on(g) == Some(true))
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
            // As nvml.h documents nvmlEventSetWait_v2: "If there are no events ready to be
            // delivered, function sleeps till event arrives but not longer than specified
            // timeout". Sleep until the next scheduled event of these GPUs or the deadline
            // (polling here instead would be counted in the benchmarks, which load this
            // library into the measured process).
            let now = sim.now();
            if now >= deadline {
                return Err(ERROR_TIMEOUT);
            }
            let next = sim
                .scenario
                .events
                .iter()
                .filter(|e| e.at_secs > now && gpus.contains(&e.gpu))
                .map(|e| e.at_secs)
                .fold(deadline, f64::min);
            std::thread::sleep(Duration::from_secs_f64((next - now).max(0.0) + 0.000_5));
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

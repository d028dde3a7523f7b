//! Processes and MIG instances.

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::{MemoryInfo, ProcessInfo};

use super::{memory_info_v1, pct};
use crate::model::{Metric, Sample};
use crate::sources::nvml::worker::{Ctx, Lost};

pub(super) fn processes(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
    let compute = match ctx.call("compute_processes", |d| d.running_compute_processes())? {
        Some(p) => Some(p),
        None if ctx.is_disabled("compute_processes") => {
            ctx.call("compute_processes_v2", |d| d.running_compute_processes_v2())?
        }
        None => None,
    };
    let graphics = match ctx.call("graphics_processes", |d| d.running_graphics_processes())? {
        Some(p) => Some(p),
        None if ctx.is_disabled("graphics_processes") => ctx
            .call("graphics_processes_v2", |d| {
                d.running_graphics_processes_v2()
            })?,
        None => None,
    };
    let mut all: Vec<(ProcessInfo, &'static str)> = Vec::new();
    for (list, kind) in [(compute, "compute"), (graphics, "graphics")] {
        if let Some(list) = list {
            out.push(
                Sample::new(Metric::ProcessCount, list.len() as f64).with("gpu.process.type", kind),
            );
            all.extend(list.into_iter().map(|p| (p, kind)));
        }
    }
    let used = |p: &ProcessInfo| match p.used_gpu_memory {
        UsedGpuMemory::Used(b) => b,
        UsedGpuMemory::Unavailable => 0,
    };
    all.sort_by_key(|(p, _)| std::cmp::Reverse(used(p)));
    all.truncate(ctx.max_processes);
    let live: Vec<u32> = all.iter().map(|(p, _)| p.pid).collect();
    ctx.proc_names.retain(|pid, _| live.contains(pid));
    for (p, kind) in &all {
        let name = process_name(ctx, p.pid)?;
        let mut s = Sample::new(Metric::ProcessMemory, used(p) as f64)
            .with("process.pid", p.pid.to_string())
            .with("process.executable.name", name)
            .with("gpu.process.type", *kind);
        if let Some(gi) = p.gpu_instance_id {
            s = s.with("gpu.mig.gpu_instance_id", gi.to_string());
        }
        out.push(s);
    }
    let since = ctx.last_process_sample;
    // NOT_FOUND: no samples since the last read, i.e. nothing ran.
    let samples = ctx.call("process_utilization", |d| {
        match d.process_utilization_stats(since) {
            Err(NvmlError::NotFound) => Ok(Vec::new()),
            r => r,
        }
    })?;
    for u in samples
        .unwrap_or_default()
        .iter()
        .filter(|u| live.contains(&u.pid))
    {
        ctx.last_process_sample = ctx.last_process_sample.max(u.timestamp);
        let name = process_name(ctx, u.pid)?;
        for (v, task) in [
            (u.sm_util, "general"),
            (u.mem_util, "memory"),
            (u.enc_util, "encoder"),
            (u.dec_util, "decoder"),
        ] {
            out.push(
                Sample::new(Metric::ProcessUtilization, pct(v))
                    .with("process.pid", u.pid.to_string())
                    .with("process.executable.name", name.clone())
                    .with("hw.gpu.task", task),
            );
        }
    }
    Ok(())
}

/// The process name from NVML, cached per pid (bounded by the live process list).
pub(super) fn process_name(ctx: &mut Ctx<'_>, pid: u32) -> Result<String, Lost> {
    if let Some(n) = ctx.proc_names.get(&pid) {
        return Ok(n.clone());
    }
    let nvml = ctx.nvml;
    // NOT_FOUND: the process has exited since the list was read.
    let name = ctx.call("process_name", |_| match nvml.sys_process_name(pid, 64) {
        Err(NvmlError::NotFound) => Ok(String::new()),
        r => r,
    })?;
    let name = name
        .unwrap_or_default()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();
    ctx.proc_names.insert(pid, name.clone());
    Ok(name)
}

pub(super) fn mig(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
    let Some(mode) = ctx.call("mig", |d| d.mig_mode())? else {
        return Ok(());
    };
    let enabled = mode.current == 1;
    out.push(Sample::new(Metric::MigMode, f64::from(u8::from(enabled))));
    ctx.mig_instances.clear();
    if !enabled {
        return Ok(());
    }
    let parent = crate::model::lock(&ctx.slot).info.uuid.clone();
    let max = ctx.call("mig", |d| d.mig_device_count())?.unwrap_or(0);
    let nvml = ctx.nvml;
    for i in 0..max {
        // NOT_FOUND / INVALID_ARGUMENT: no MIG device at this index.
        let found = ctx.call("mig", |d| match d.mig_device_by_index(i) {
            Err(NvmlError::NotFound | NvmlError::InvalidArg) => Ok(None),
            r => r.map(Some),
        })?;
        let Some(m) = found.flatten() else { continue };
        let Some(uuid) = ctx.call("mig", |_| m.uuid())? else {
            continue;
        };
        let gi_id = ctx.call("mig", |_| mig_id(nvml, &m, true))?;
        if let Some(id) = gi_id {
            ctx.mig_instances.push((id, uuid.clone()));
        }
        let gi = gi_id.unwrap_or(u32::MAX).to_string();
        let ci = ctx
            .call("mig", |_| mig_id(nvml, &m, false))?
            .unwrap_or(u32::MAX)
            .to_string();
        let tag = |s: Sample| {
            s.with("hw.id", uuid.clone())
                .with("hw.parent", parent.clone())
                .with("gpu.mig.gpu_instance_id", gi.clone())
                .with("gpu.mig.compute_instance_id", ci.clone())
        };
        let mem = ctx.call("mig_memory", |_| {
            m.memory_info().or_else(|e| match e {
                // Old drivers: the v1 struct.
                NvmlError::FailedToLoadSymbol(_) => memory_info_v1(nvml, &m).map(|v| MemoryInfo {
                    free: v.free,
                    reserved: 0,
                    total: v.total,
                    used: v.used,
                    version: 1,
                }),
                e => Err(e),
            })
        })?;
        if let Some(mem) = mem {
            out.push(tag(Sample::new(Metric::MigMemoryUsage, mem.used as f64)));
            out.push(tag(Sample::new(Metric::MigMemoryLimit, mem.total as f64)));
        }
        let procs = ctx.call("mig_processes", |_| {
            m.running_compute_processes().or_else(|e| match e {
                NvmlError::FailedToLoadSymbol(_) => m.running_compute_processes_v2(),
                e => Err(e),
            })
        })?;
        if let Some(p) = procs {
            out.push(tag(Sample::new(Metric::MigProcesses, p.len() as f64)));
        }
    }
    Ok(())
}

/// GPU instance id (`gpu = true`) or compute instance id of a MIG device.
pub(super) fn mig_id(
    nvml: &nvml_wrapper::Nvml,
    m: &nvml_wrapper::Device<'_>,
    gpu: bool,
) -> Result<u32, NvmlError> {
    let lib = nvml.lib();
    let sym = if gpu {
        lib.nvmlDeviceGetGpuInstanceId.as_ref()
    } else {
        lib.nvmlDeviceGetComputeInstanceId.as_ref()
    };
    let sym = sym.map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut id = 0;
    // SAFETY: a live MIG handle and a valid out-pointer.
    nvml_wrapper::error::nvml_try(unsafe { sym(m.handle(), &mut id) })?;
    Ok(id)
}

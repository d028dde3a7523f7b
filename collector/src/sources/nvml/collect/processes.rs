//! Processes and MIG instances.

use std::collections::BTreeMap;
use std::time::SystemTime;

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::{MemoryInfo, ProcessUtilizationSample};

use super::raw::{self, ProcessKind, RawProcess};
use super::{MigDevice, pct};
use crate::model::processes::basename;
use crate::model::{Attrs, Metric, Sample};
use crate::sources::nvml::worker::{Ctx, Halt};

/// `nvmlSystemGetProcessName` crops the name to the buffer it is given and still succeeds
/// (nvml.h); a path can be as long as `PATH_MAX`.
const PROCESS_NAME_BUFFER: usize = 4096;

pub(super) fn processes(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
    let (nvml, layout) = (ctx.nvml, ctx.layout);
    let mut all: Vec<(RawProcess, &'static str)> = Vec::new();
    for (feature, kind, name) in [
        ("compute_processes", ProcessKind::Compute, "compute"),
        ("graphics_processes", ProcessKind::Graphics, "graphics"),
    ] {
        if let Some(list) = ctx.call(feature, |d| raw::processes(nvml, d, kind, layout))? {
            out.push(
                Sample::new(Metric::ProcessCount, list.len() as f64).with("gpu.process.type", name),
            );
            all.extend(list.into_iter().map(|p| (p, name)));
        }
    }
    // The heaviest first; unknown memory last.
    all.sort_by_key(|(p, _)| std::cmp::Reverse(p.used.unwrap_or(0)));
    all.truncate(ctx.max_processes);
    // Sorted for lookups: up to `max_processes` pids, each looked up by every cached name and
    // every utilization sample (several a pid).
    let mut live: Vec<u32> = all.iter().map(|(p, _)| p.pid).collect();
    live.sort_unstable();
    live.dedup();
    ctx.proc_names
        .retain(|pid, _| live.binary_search(pid).is_ok());
    for (p, kind) in &all {
        let attrs = process_attrs(ctx, p.pid)?;
        // "Not available" memory is no reading: the process is counted, not exported as 0.
        let Some(used) = p.used else { continue };
        let mut s = Sample::new(Metric::ProcessMemory, used as f64);
        s.attrs = attrs;
        s = s.with("gpu.process.type", *kind);
        if let Some(gi) = p.gpu_instance {
            s = s.with("gpu.mig.gpu_instance_id", gi.to_string());
        }
        out.push(s);
    }
    utilization(ctx, &live, out)
}

/// Per-process utilization. The driver answers from a sample buffer: only processes with
/// non-zero utilization, possibly several entries per pid, stale entries at or before the
/// timestamp asked for, and values over 100. Kept: the newest entry per live pid that is newer
/// than the last one seen, values within 0–100, so that no series repeats in one scrape.
fn utilization(ctx: &mut Ctx<'_>, live: &[u32], out: &mut Vec<Sample>) -> Result<(), Halt> {
    // The first read asks for one interval back, not for the driver's whole buffer (0).
    let since = match ctx.last_process_sample {
        0 => {
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_micros() as u64)
                .unwrap_or(0);
            now.saturating_sub(ctx.process_window.as_micros() as u64)
        }
        t => t,
    };
    // NOT_FOUND: no samples since `since`, i.e. nothing ran. INSUFFICIENT_SIZE: the driver's
    // buffer gained samples between the size query and the read; read again.
    let samples = ctx.call("process_utilization", |d| {
        let mut tries = 0;
        loop {
            match d.process_utilization_stats(since) {
                Err(NvmlError::NotFound) => return Ok(Vec::new()),
                Err(NvmlError::InsufficientSize(_)) if tries < 3 => tries += 1,
                r => return r,
            }
        }
    })?;
    let newest = newest_per_pid(samples.unwrap_or_default(), since, live);
    for u in newest.values() {
        ctx.last_process_sample = ctx.last_process_sample.max(u.timestamp);
    }
    for (pid, u) in newest {
        let attrs = process_attrs(ctx, pid)?;
        for (v, task) in [
            (u.sm_util, "general"),
            (u.mem_util, "memory"),
            (u.enc_util, "encoder"),
            (u.dec_util, "decoder"),
        ] {
            if v > 100 {
                continue;
            }
            let mut s = Sample::new(Metric::ProcessUtilization, pct(v));
            s.attrs = attrs.clone();
            out.push(s.with("hw.gpu.task", task));
        }
    }
    Ok(())
}

/// The newest sample per pid among those newer than `since`, for live pids (`live` sorted).
fn newest_per_pid(
    samples: Vec<ProcessUtilizationSample>,
    since: u64,
    live: &[u32],
) -> BTreeMap<u32, ProcessUtilizationSample> {
    let mut newest: BTreeMap<u32, ProcessUtilizationSample> = BTreeMap::new();
    for u in samples {
        if u.timestamp <= since || live.binary_search(&u.pid).is_err() {
            continue;
        }
        match newest.get(&u.pid) {
            Some(n) if n.timestamp >= u.timestamp => {}
            _ => {
                newest.insert(u.pid, u);
            }
        }
    }
    newest
}

/// Who a process is (name, container, pod), from the model's process table (read from
/// `/proc` once per process). Where `/proc` does not show it, the name is NVML's (read into
/// a `PATH_MAX` buffer: a 64-byte one turns long interpreter or venv paths into wrong names).
/// NVML pids are the host's: in a container, `/proc` is the host's only with `hostPID`.
pub(super) fn process_attrs(ctx: &mut Ctx<'_>, pid: u32) -> Result<Attrs, Halt> {
    if let Some(a) = ctx.proc_names.get(&pid) {
        return Ok(a.clone());
    }
    let info = ctx.model.processes.identify(pid, None);
    let mut attrs = info.attrs();
    if info.name.is_empty() {
        let nvml = ctx.nvml;
        // NOT_FOUND: the process has exited since the list was read.
        let name = ctx.call("process_name", |_| {
            match nvml.sys_process_name(pid, PROCESS_NAME_BUFFER) {
                Err(NvmlError::NotFound) => Ok(String::new()),
                r => r,
            }
        })?;
        let name = basename(&name.unwrap_or_default()).to_string();
        for (k, v) in &mut attrs {
            if *k == "process.executable.name" {
                *v = name.clone().into();
            }
        }
    }
    ctx.proc_names.insert(pid, attrs.clone());
    Ok(attrs)
}

pub(super) fn mig(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
    let Some(mode) = ctx.call("mig", |d| d.mig_mode())? else {
        return Ok(());
    };
    let enabled = mode.current == 1;
    // MIG mode changes what the parent GPU supports (utilization, per-process utilization,
    // remapped rows): try the unsupported features again.
    if ctx.mig_mode.is_some_and(|m| m != enabled) {
        tracing::info!(gpu = %crate::model::lock(&ctx.slot).info.uuid, mig = enabled, "MIG mode changed");
        ctx.mig_mode = Some(enabled);
        ctx.reprobe("MIG mode changed");
    }
    ctx.mig_mode = Some(enabled);
    out.push(Sample::new(Metric::MigMode, f64::from(u8::from(enabled))));
    out.push(Sample::new(
        Metric::MigModePending,
        f64::from(u8::from(mode.pending == 1)),
    ));
    ctx.mig_devices.clear();
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
        let gi_id = ctx.call("mig", |_| raw::mig_id(nvml, &m, true))?;
        let ci_id = ctx.call("mig", |_| raw::mig_id(nvml, &m, false))?;
        if let (Some(gi), Some(ci)) = (gi_id, ci_id) {
            ctx.mig_devices.push(MigDevice {
                gpu_instance: gi,
                compute_instance: ci,
                uuid: uuid.clone(),
            });
        }
        let gi = gi_id.unwrap_or(u32::MAX).to_string();
        let ci = ci_id.unwrap_or(u32::MAX).to_string();
        // The GPU instance's profile, from the MIG device's name ("NVIDIA A100-SXM4-40GB MIG
        // 1g.5gb"); none where the name does not carry one.
        let profile = ctx
            .call("mig_profile", |_| m.name())?
            .and_then(|n| mig_profile(&n));
        let tag = |s: Sample| {
            let s = s
                .with("hw.id", uuid.clone())
                .with("hw.parent", parent.clone())
                .with("gpu.mig.gpu_instance_id", gi.clone())
                .with("gpu.mig.compute_instance_id", ci.clone());
            match &profile {
                Some(p) => s.with("gpu.mig.profile", p.clone()),
                None => s,
            }
        };
        let mem = ctx.call("mig_memory", |_| {
            m.memory_info().or_else(|e| match e {
                // Old drivers: the v1 struct.
                NvmlError::FailedToLoadSymbol(_) => raw::memory_v1(nvml, &m).map(|v| MemoryInfo {
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
        let layout = ctx.layout;
        let procs = ctx.call("mig_processes", |_| {
            raw::processes(nvml, &m, ProcessKind::Compute, layout)
        })?;
        if let Some(p) = procs {
            out.push(tag(Sample::new(Metric::MigProcesses, p.len() as f64)));
        }
    }
    Ok(())
}

/// The profile at the end of a MIG device's name: `<n>g.<m>gb` (with its `+me`-style
/// suffixes, `1g.10gb+me`), at most 32 characters.
fn mig_profile(name: &str) -> Option<String> {
    let p = name.rsplit_once(" MIG ")?.1.trim();
    let ok = p.len() <= 32
        && p.split_once("g.")
            .is_some_and(|(g, _)| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()))
        && p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+.-_".contains(&b));
    ok.then(|| p.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_is_the_end_of_a_mig_devices_name() {
        assert_eq!(
            mig_profile("NVIDIA A100-SXM4-40GB MIG 1g.5gb").as_deref(),
            Some("1g.5gb")
        );
        assert_eq!(
            mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me").as_deref(),
            Some("1g.10gb+me")
        );
        assert_eq!(mig_profile("NVIDIA A100-SXM4-80GB MIG"), None);
        assert_eq!(mig_profile("NVIDIA A100 MIG x\"y"), None);
        assert_eq!(mig_profile("NVIDIA A100 MIG g.5gb"), None);
    }

    fn s(pid: u32, ts: u64, sm: u32) -> ProcessUtilizationSample {
        ProcessUtilizationSample {
            pid,
            timestamp: ts,
            sm_util: sm,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
        }
    }

    #[test]
    fn newest_sample_per_pid_newer_than_the_last_read() {
        let got = newest_per_pid(
            vec![
                s(1, 100, 50),
                s(1, 300, 90),
                s(1, 200, 40),
                s(2, 100, 7),
                s(3, 400, 1),
                s(9, 250, 3),
                s(9, 150, 2),
            ],
            100,
            &[1, 2, 5, 9],
        );
        assert_eq!(got.len(), 2, "pid 2 is stale, pid 3 not live: {got:?}");
        assert_eq!(got[&1].sm_util, 90);
        assert_eq!(got[&9].sm_util, 3);
    }
}

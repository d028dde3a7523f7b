//! The collectors, one function per metric group. Units are converted to the registry's:
//! mW→W, mJ→J, %→ratio, MHz→Hz, ns→s, KiB→bytes.

use std::os::raw::c_uint;

use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, PerformancePolicy, RetirementCause,
    TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};
use nvml_wrapper::struct_wrappers::device::{MemoryInfo, ProcessInfo};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper_sys::bindings::nvmlFieldValue_t;

use super::worker::{Ctx, Lost};
use crate::model::{Group, Metric, Sample};

/// `NVML_FI_DEV_MEMORY_TEMP`
const FI_MEMORY_TEMP: u32 = 82;
/// `NVML_FI_DEV_NVLINK_LINK_COUNT`
const FI_NVLINK_LINK_COUNT: u32 = 91;
/// `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` / `_RX` (KiB, per link through `scopeId`)
const FI_NVLINK_TX: u32 = 138;
const FI_NVLINK_RX: u32 = 139;
/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`
const FI_RECOVERY_ACTION: u32 = 230;
/// NVML reports at most this many NVLink links.
const MAX_NVLINKS: u32 = 18;
/// Link indexes as attribute values, so that no sample allocates its link name.
const LINK_NAMES: [&str; MAX_NVLINKS as usize] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    "17",
];
/// HBM readings above this are a known NVML defect (dcgm-exporter drops them too).
const MAX_PLAUSIBLE_CELSIUS: f64 = 200.0;

/// GPM needs two samples: the previous one is kept between cycles.
#[derive(Default)]
pub struct GpmState<'n> {
    prev: Option<GpmSample<'n>>,
}

/// Runs one group's collection into `out`.
pub fn collect(group: Group, ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
    match group {
        Group::Utilization => utilization(ctx, out),
        Group::Memory => memory(ctx, out),
        Group::Power => power(ctx, out),
        Group::Temperature => temperature(ctx, out),
        Group::Clocks => clocks(ctx, out),
        Group::Errors => errors(ctx, out),
        Group::Pcie => pcie(ctx, out),
        Group::Nvlink => nvlink(ctx, out),
        Group::Processes => processes(ctx, out),
        Group::Mig => mig(ctx, out),
        Group::Gpm => gpm(ctx, out),
        Group::Status => Ok(()),
    }
}

fn pct(v: u32) -> f64 {
    f64::from(v) / 100.0
}

fn utilization(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
    if let Some(u) = ctx.call("utilization", |d| d.utilization_rates())? {
        out.push(Sample::new(Metric::Utilization, pct(u.gpu)).with("hw.gpu.task", "general"));
        out.push(Sample::new(Metric::MemoryUtilization, pct(u.memory)));
    }
    if let Some(u) = ctx.call("encoder_utilization", |d| d.encoder_utilization())? {
        out.push(
            Sample::new(Metric::Utilization, pct(u.utilization)).with("hw.gpu.task", "encoder"),
        );
    }
    if let Some(u) = ctx.call("decoder_utilization", |d| d.decoder_utilization())? {
        out.push(
            Sample::new(Metric::Utilization, pct(u.utilization)).with("hw.gpu.task", "decoder"),
        );
    }
    Ok(())
}

fn memory(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
    if let Some(m) = ctx.call("memory_info_v2", |d| d.memory_info())? {
        out.push(Sample::new(Metric::MemoryUsage, m.used as f64));
        out.push(Sample::new(Metric::MemoryLimit, m.total as f64));
        out.push(Sample::new(Metric::MemoryFree, m.free as f64));
        out.push(Sample::new(Metric::MemoryReserved, m.reserved as f64));
    } else if ctx.is_disabled("memory_info_v2") {
        // Old drivers: the v1 struct, which has no reserved field and counts it as used.
        let nvml = ctx.nvml;
        if let Some(m) = ctx.call("memory_info", |d| memory_info_v1(nvml, d))? {
            out.push(Sample::new(Metric::MemoryUsage, m.used as f64));
            out.push(Sample::new(Metric::MemoryLimit, m.total as f64));
            out.push(Sample::new(Metric::MemoryFree, m.free as f64));
        }
    }
    if let Some(b) = ctx.call("bar1_memory", |d| d.bar1_memory_info())? {
        out.push(Sample::new(Metric::Bar1Usage, b.used as f64));
        out.push(Sample::new(Metric::Bar1Limit, b.total as f64));
    }
    Ok(())
}

fn memory_info_v1(
    nvml: &nvml_wrapper::Nvml,
    d: &nvml_wrapper::Device<'_>,
) -> Result<nvml_wrapper_sys::bindings::nvmlMemory_t, NvmlError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetMemoryInfo
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut m = nvml_wrapper_sys::bindings::nvmlMemory_t {
        total: 0,
        free: 0,
        used: 0,
    };
    // SAFETY: `d.handle()` is a live handle from this library; `m` is a valid out-pointer.
    let rc = unsafe { sym(d.handle(), &mut m) };
    nvml_wrapper::error::nvml_try(rc)?;
    Ok(m)
}

fn power(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
    if let Some(mw) = ctx.call("power_usage", |d| d.power_usage())? {
        out.push(Sample::new(Metric::Power, f64::from(mw) / 1000.0).with("hw.type", "gpu"));
    }
    if let Some(mw) = ctx.call("power_limit_enforced", |d| d.enforced_power_limit())? {
        out.push(
            Sample::new(Metric::PowerLimit, f64::from(mw) / 1000.0)
                .with("gpu.power.limit_type", "enforced"),
        );
    }
    if let Some(mw) = ctx.call("power_limit_default", |d| {
        d.power_management_limit_default()
    })? {
        out.push(
            Sample::new(Metric::PowerLimit, f64::from(mw) / 1000.0)
                .with("gpu.power.limit_type", "default"),
        );
    }
    if let Some(c) = ctx.call("power_limit_constraints", |d| {
        d.power_management_limit_constraints()
    })? {
        out.push(
            Sample::new(Metric::PowerLimit, f64::from(c.min_limit) / 1000.0)
                .with("gpu.power.limit_type", "min"),
        );
        out.push(
            Sample::new(Metric::PowerLimit, f64::from(c.max_limit) / 1000.0)
                .with("gpu.power.limit_type", "max"),
        );
    }
    if let Some(mj) = ctx.call("energy", |d| d.total_energy_consumption())? {
        out.push(Sample::new(Metric::Energy, mj as f64 / 1000.0).with("hw.type", "gpu"));
    }
    Ok(())
}

fn temperature(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
    if let Some(t) = ctx.call("temperature_gpu", |d| d.temperature(TemperatureSensor::Gpu))? {
        out.push(
            Sample::new(Metric::Temperature, f64::from(t)).with("hw.sensor_location", "gpu_die"),
        );
    }
    if let Some(v) = field(ctx, "temperature_memory", FI_MEMORY_TEMP)? {
        if v > 0.0 && v <= MAX_PLAUSIBLE_CELSIUS {
            out.push(
                Sample::new(Metric::Temperature, v).with("hw.sensor_location", "memory_junction"),
            );
        } else {
            ctx.implausible(
                "temperature_memory",
                format!("implausible memory-junction temperature {v} °C"),
            );
        }
    }
    let thresholds = [
        (
            "temperature_threshold_slowdown",
            TemperatureThreshold::Slowdown,
            "gpu_die",
            "slowdown",
        ),
        (
            "temperature_threshold_shutdown",
            TemperatureThreshold::Shutdown,
            "gpu_die",
            "shutdown",
        ),
        (
            "temperature_threshold_gpu_max",
            TemperatureThreshold::GpuMax,
            "gpu_die",
            "max_operating",
        ),
        (
            "temperature_threshold_memory_max",
            TemperatureThreshold::MemoryMax,
            "memory_junction",
            "max_operating",
        ),
    ];
    for (feature, kind, location, limit) in thresholds {
        if let Some(t) = ctx.call(feature, |d| d.temperature_threshold(kind))? {
            out.push(
                Sample::new(Metric::TemperatureLimit, f64::from(t))
                    .with("hw.sensor_location", location)
                    .with("hw.limit_type", limit),
            );
        }
    }
    let fans = ctx.call("fan_speed", |d| d.num_fans())?.unwrap_or(0);
    for fan in 0..fans {
        if let Some(p) = ctx.call("fan_speed", |d| d.fan_speed(fan))? {
            out.push(Sample::new(Metric::FanSpeed, pct(p)).with("hw.fan.index", fan.to_string()));
        }
    }
    Ok(())
}

/// Reads one device-scoped field value as f64.
fn field(ctx: &mut Ctx<'_>, feature: &'static str, id: u32) -> Result<Option<f64>, Lost> {
    let Some(mut values) = ctx.call(feature, |d| d.field_values_for(&[FieldId(id)]))? else {
        return Ok(None);
    };
    match values.pop().map(|s| s.and_then(|s| s.value)) {
        Some(Ok(v)) => Ok(Some(sample_value(v))),
        Some(Err(e)) => ctx.failed(feature, e).map(|()| None),
        None => Ok(None),
    }
}

fn sample_value(v: SampleValue) -> f64 {
    match v {
        SampleValue::F64(x) => x,
        SampleValue::U32(x) => f64::from(x),
        SampleValue::U64(x) => x as f64,
        SampleValue::I64(x) => x as f64,
    }
}

fn clocks(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
    let domains = [
        (
            "clock_graphics",
            "max_clock_graphics",
            Clock::Graphics,
            "graphics",
        ),
        ("clock_sm", "max_clock_sm", Clock::SM, "sm"),
        ("clock_memory", "max_clock_memory", Clock::Memory, "memory"),
        ("clock_video", "max_clock_video", Clock::Video, "video"),
    ];
    for (cur, max, clock, name) in domains {
        if let Some(mhz) = ctx.call(cur, |d| d.clock_info(clock))? {
            out.push(
                Sample::new(Metric::ClockFrequency, f64::from(mhz) * 1e6)
                    .with("gpu.clock.domain", name),
            );
        }
        if let Some(mhz) = ctx.call(max, |d| d.max_clock_info(clock))? {
            out.push(
                Sample::new(Metric::ClockMaxFrequency, f64::from(mhz) * 1e6)
                    .with("gpu.clock.domain", name),
            );
        }
    }
    if let Some(p) = ctx.call("performance_state", |d| d.performance_state())? {
        out.push(Sample::new(Metric::PerformanceState, f64::from(p.as_c())));
    }
    if let Some(r) = ctx.call("clock_event_reasons", |d| d.current_throttle_reasons())? {
        let bits = r.bits();
        for (bit, name) in CLOCK_EVENT_REASONS {
            out.push(
                Sample::new(Metric::ClockEvent, f64::from(u8::from(bits & bit != 0)))
                    .with("gpu.clock.event.reason", *name),
            );
        }
    }
    for (feature, policy, name) in [
        ("violation_power", PerformancePolicy::Power, "power"),
        ("violation_thermal", PerformancePolicy::Thermal, "thermal"),
    ] {
        if let Some(v) = ctx.call(feature, |d| d.violation_status(policy))? {
            out.push(
                Sample::new(Metric::ViolationTime, v.violation_time as f64 / 1e9)
                    .with("gpu.violation.type", name),
            );
        }
    }
    Ok(())
}

/// `nvmlClocksEventReason*` bits and their names.
pub const CLOCK_EVENT_REASONS: &[(u64, &str)] = &[
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
];

fn errors(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
    let ecc = [
        (
            "ecc_corrected_volatile",
            MemoryError::Corrected,
            EccCounter::Volatile,
            "corrected",
            "volatile",
        ),
        (
            "ecc_uncorrected_volatile",
            MemoryError::Uncorrected,
            EccCounter::Volatile,
            "uncorrected",
            "volatile",
        ),
        (
            "ecc_corrected_aggregate",
            MemoryError::Corrected,
            EccCounter::Aggregate,
            "corrected",
            "aggregate",
        ),
        (
            "ecc_uncorrected_aggregate",
            MemoryError::Uncorrected,
            EccCounter::Aggregate,
            "uncorrected",
            "aggregate",
        ),
    ];
    for (feature, kind, counter, ty, scope) in ecc {
        if let Some(n) = ctx.call(feature, |d| d.total_ecc_errors(kind, counter))? {
            out.push(
                Sample::new(Metric::EccErrors, n as f64)
                    .with("hw.type", "gpu")
                    .with("error.type", ty)
                    .with("gpu.ecc.counter", scope),
            );
        }
    }
    for (feature, cause, name) in [
        (
            "retired_pages_sbe",
            RetirementCause::MultipleSingleBitEccErrors,
            "multiple_single_bit",
        ),
        (
            "retired_pages_dbe",
            RetirementCause::DoubleBitEccError,
            "double_bit",
        ),
    ] {
        if let Some(p) = ctx.call(feature, |d| d.retired_pages(cause))? {
            out.push(
                Sample::new(Metric::RetiredPages, p.len() as f64)
                    .with("gpu.retirement.cause", name),
            );
        }
    }
    if let Some(p) = ctx.call("retired_pages_pending", |d| d.are_pages_pending_retired())? {
        out.push(Sample::new(Metric::RetiredPending, f64::from(u8::from(p))));
    }
    let nvml = ctx.nvml;
    if let Some((corr, unc, pending, failure)) =
        ctx.call("remapped_rows", |d| remapped_rows(nvml, d))?
    {
        out.push(
            Sample::new(Metric::RemappedRows, f64::from(corr))
                .with("gpu.remap.type", "correctable"),
        );
        out.push(
            Sample::new(Metric::RemappedRows, f64::from(unc))
                .with("gpu.remap.type", "uncorrectable"),
        );
        out.push(Sample::new(
            Metric::RemapPending,
            f64::from(u8::from(pending != 0)),
        ));
        out.push(Sample::new(
            Metric::RemapFailure,
            f64::from(u8::from(failure != 0)),
        ));
    }
    if let Some(v) = field(ctx, "recovery_action", FI_RECOVERY_ACTION)? {
        let current = v as u32;
        for (code, name) in [
            (0, "none"),
            (1, "gpu_reset"),
            (2, "node_reboot"),
            (3, "drain_p2p"),
            (4, "drain_and_reset"),
        ] {
            out.push(
                Sample::new(Metric::RecoveryAction, f64::from(u8::from(current == code)))
                    .with("gpu.recovery_action", name),
            );
        }
    }
    Ok(())
}

fn remapped_rows(
    nvml: &nvml_wrapper::Nvml,
    d: &nvml_wrapper::Device<'_>,
) -> Result<(c_uint, c_uint, c_uint, c_uint), NvmlError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetRemappedRows
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let (mut a, mut b, mut p, mut f) = (0, 0, 0, 0);
    // SAFETY: a live handle from this library and four valid out-pointers.
    let rc = unsafe { sym(d.handle(), &mut a, &mut b, &mut p, &mut f) };
    nvml_wrapper::error::nvml_try(rc)?;
    Ok((a, b, p, f))
}

fn pcie(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
    for (feature, counter, dir) in [
        ("pcie_throughput_tx", PcieUtilCounter::Send, "transmit"),
        ("pcie_throughput_rx", PcieUtilCounter::Receive, "receive"),
    ] {
        if let Some(kib) = ctx.call(feature, |d| d.pcie_throughput(counter))? {
            out.push(
                Sample::new(Metric::PcieThroughput, f64::from(kib) * 1024.0)
                    .with("network.io.direction", dir),
            );
        }
    }
    if let Some(n) = ctx.call("pcie_replay", |d| d.pcie_replay_counter())? {
        out.push(Sample::new(Metric::PcieReplay, f64::from(n)));
    }
    let link = [
        ("pcie_link_gen", Metric::PcieGeneration, "current"),
        ("pcie_link_width", Metric::PcieWidth, "current"),
        ("pcie_link_max_gen", Metric::PcieGeneration, "max"),
        ("pcie_link_max_width", Metric::PcieWidth, "max"),
    ];
    for (feature, metric, state) in link {
        let v = ctx.call(feature, |d| match feature {
            "pcie_link_gen" => d.current_pcie_link_gen(),
            "pcie_link_width" => d.current_pcie_link_width(),
            "pcie_link_max_gen" => d.max_pcie_link_gen(),
            _ => d.max_pcie_link_width(),
        })?;
        if let Some(v) = v {
            out.push(Sample::new(metric, f64::from(v)).with("gpu.pcie.link.state", state));
        }
    }
    Ok(())
}

fn nvlink(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
    let Some(links) = field(ctx, "nvlink", FI_NVLINK_LINK_COUNT)? else {
        return Ok(());
    };
    let links = (links as u32).min(MAX_NVLINKS);
    let nvml = ctx.nvml;
    for link in 0..links {
        let name = LINK_NAMES.get(link as usize).copied().unwrap_or("?");
        if let Some(up) = ctx.call("nvlink_state", |d| d.link_wrapper_for(link).is_active())? {
            out.push(
                Sample::new(Metric::NvlinkState, f64::from(u8::from(up)))
                    .with("gpu.nvlink.link", name),
            );
        }
        if let Some((tx, rx)) =
            ctx.call("nvlink_throughput", |d| nvlink_throughput(nvml, d, link))?
        {
            for (v, dir) in [(tx, "transmit"), (rx, "receive")] {
                out.push(
                    Sample::new(Metric::NvlinkIo, v as f64 * 1024.0)
                        .with("gpu.nvlink.link", name)
                        .with("network.io.direction", dir),
                );
            }
        }
        for (counter, ty) in [
            (ErrorCounter::DlReplay, "replay"),
            (ErrorCounter::DlRecovery, "recovery"),
            (ErrorCounter::DlCrcFlit, "crc_flit"),
            (ErrorCounter::DlCrcData, "crc_data"),
        ] {
            if let Some(n) = ctx.call("nvlink_errors", |d| {
                d.link_wrapper_for(link).error_counter(counter)
            })? {
                out.push(
                    Sample::new(Metric::NvlinkErrors, n as f64)
                        .with("gpu.nvlink.link", name)
                        .with("gpu.nvlink.error.type", ty),
                );
            }
        }
    }
    Ok(())
}

/// Per-link TX/RX data counters (KiB): field values with `scopeId` = link, which
/// `field_values_for` does not expose.
fn nvlink_throughput(
    nvml: &nvml_wrapper::Nvml,
    d: &nvml_wrapper::Device<'_>,
    link: u32,
) -> Result<(u64, u64), NvmlError> {
    let sym = nvml
        .lib()
        .nvmlDeviceGetFieldValues
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    // SAFETY: nvmlFieldValue_t is plain data; all-zero is a valid value.
    let mut values: [nvmlFieldValue_t; 2] = unsafe { std::mem::zeroed() };
    values[0].fieldId = FI_NVLINK_TX;
    values[1].fieldId = FI_NVLINK_RX;
    values[0].scopeId = link;
    values[1].scopeId = link;
    // SAFETY: a live handle and an array of 2 field values, as the count says.
    let rc = unsafe { sym(d.handle(), 2, values.as_mut_ptr()) };
    nvml_wrapper::error::nvml_try(rc)?;
    nvml_wrapper::error::nvml_try(values[0].nvmlReturn)?;
    nvml_wrapper::error::nvml_try(values[1].nvmlReturn)?;
    // SAFETY: the union member matches valueType for these fields (unsigned long long).
    Ok(unsafe { (values[0].value.ullVal, values[1].value.ullVal) })
}

fn processes(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
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
fn process_name(ctx: &mut Ctx<'_>, pid: u32) -> Result<String, Lost> {
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

fn mig(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
    let Some(mode) = ctx.call("mig", |d| d.mig_mode())? else {
        return Ok(());
    };
    let enabled = mode.current == 1;
    out.push(Sample::new(Metric::MigMode, f64::from(u8::from(enabled))));
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
        let gi = ctx
            .call("mig", |_| mig_id(nvml, &m, true))?
            .unwrap_or(u32::MAX)
            .to_string();
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
fn mig_id(
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

/// A GPM metric: its id, where it goes, an attribute, and the factor to the registry unit.
type GpmMapping = (
    GpmMetricId,
    Metric,
    Option<(&'static str, &'static str)>,
    f64,
);

const GPM_METRICS: &[GpmMapping] = &[
    (GpmMetricId::SmUtil, Metric::GpmSmActivity, None, 0.01),
    (GpmMetricId::SmOccupancy, Metric::GpmSmOccupancy, None, 0.01),
    (
        GpmMetricId::GraphicsUtil,
        Metric::GpmGraphicsActivity,
        None,
        0.01,
    ),
    (
        GpmMetricId::AnyTensorUtil,
        Metric::GpmPipeActivity,
        Some(("gpu.pipe", "tensor")),
        0.01,
    ),
    (
        GpmMetricId::DfmaTensorUtil,
        Metric::GpmPipeActivity,
        Some(("gpu.pipe", "tensor_dfma")),
        0.01,
    ),
    (
        GpmMetricId::Fp64Util,
        Metric::GpmPipeActivity,
        Some(("gpu.pipe", "fp64")),
        0.01,
    ),
    (
        GpmMetricId::Fp32Util,
        Metric::GpmPipeActivity,
        Some(("gpu.pipe", "fp32")),
        0.01,
    ),
    (
        GpmMetricId::Fp16Util,
        Metric::GpmPipeActivity,
        Some(("gpu.pipe", "fp16")),
        0.01,
    ),
    (GpmMetricId::DramBwUtil, Metric::GpmDramActivity, None, 0.01),
    (
        GpmMetricId::PcieTxPerSec,
        Metric::GpmPcieThroughput,
        Some(("network.io.direction", "transmit")),
        1048576.0,
    ),
    (
        GpmMetricId::PcieRxPerSec,
        Metric::GpmPcieThroughput,
        Some(("network.io.direction", "receive")),
        1048576.0,
    ),
    (
        GpmMetricId::NvlinkTotalTxPerSec,
        Metric::GpmNvlinkThroughput,
        Some(("network.io.direction", "transmit")),
        1048576.0,
    ),
    (
        GpmMetricId::NvlinkTotalRxPerSec,
        Metric::GpmNvlinkThroughput,
        Some(("network.io.direction", "receive")),
        1048576.0,
    ),
];

fn gpm(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
    match ctx.call("gpm", |d| d.gpm_support())? {
        Some(true) => {}
        Some(false) => {
            ctx.disable("gpm", "GPU has no GPM (Hopper and newer only)".into());
            return Ok(());
        }
        None => return Ok(()),
    }
    if ctx.gpm.prev.is_none() {
        // First cycle: take a baseline, and a second sample shortly after so that the first
        // publication already has values.
        ctx.gpm.prev = ctx.call("gpm", |d| d.gpm_sample())?;
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let Some(next) = ctx.call("gpm", |d| d.gpm_sample())? else {
        return Ok(());
    };
    let Some(prev) = ctx.gpm.prev.take() else {
        ctx.gpm.prev = Some(next);
        return Ok(());
    };
    let ids: Vec<GpmMetricId> = GPM_METRICS.iter().map(|m| m.0).collect();
    let nvml = ctx.nvml;
    let results = ctx.call("gpm", |_| gpm_metrics_get(nvml, &prev, &next, &ids))?;
    ctx.gpm.prev = Some(next);
    for (r, (_, metric, attr, scale)) in results.into_iter().flatten().zip(GPM_METRICS) {
        match r {
            Ok(v) => {
                let mut s = Sample::new(*metric, v.value * scale);
                if let Some((k, val)) = attr {
                    s = s.with(k, *val);
                }
                out.push(s);
            }
            Err(NvmlError::NotSupported) => {}
            Err(e) => ctx.failed("gpm", e)?,
        }
    }
    Ok(())
}

//! Utilization, memory, power and temperatures.

use nvml_wrapper::enum_wrappers::device::{TemperatureSensor, TemperatureThreshold};

use super::raw::{self, Decode, FieldRequest};
use super::{
    FI_MEMORY_TEMP, FI_TLIMIT_GPU_MAX, FI_TLIMIT_SHUTDOWN, FI_TLIMIT_SLOWDOWN, PLAUSIBLE_CELSIUS,
    field, fields, pct,
};
use crate::model::{Feature, Metric, Sample};
use crate::sources::nvml::worker::{Ctx, Halt};

pub(super) fn utilization(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
    if let Some(u) = ctx.call("utilization", |d| d.utilization_rates())? {
        out.push(Sample::new(Metric::Utilization, pct(u.gpu)).with("hw.gpu.task", "general"));
        out.push(Sample::new(Metric::MemoryActivity, pct(u.memory)));
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

pub(super) fn memory(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
    // The fraction in use, as OpenTelemetry's hw.gpu.memory.utilization means it (none for a
    // total of 0).
    let used_fraction = |used: u64, total: u64| {
        (total > 0).then(|| Sample::new(Metric::MemoryUtilization, used as f64 / total as f64))
    };
    if let Some(m) = ctx.call("memory_info_v2", |d| d.memory_info())? {
        out.push(Sample::new(Metric::MemoryUsage, m.used as f64));
        out.push(Sample::new(Metric::MemoryLimit, m.total as f64));
        out.push(Sample::new(Metric::MemoryFree, m.free as f64));
        out.push(Sample::new(Metric::MemoryReserved, m.reserved as f64));
        out.extend(used_fraction(m.used, m.total));
    } else if ctx.is_disabled("memory_info_v2") {
        // Old drivers: the v1 struct, which has no reserved field and counts it as used.
        let nvml = ctx.nvml;
        if let Some(m) = ctx.call("memory_info", |d| raw::memory_v1(nvml, d))? {
            out.push(Sample::new(Metric::MemoryUsage, m.used as f64));
            out.push(Sample::new(Metric::MemoryLimit, m.total as f64));
            out.push(Sample::new(Metric::MemoryFree, m.free as f64));
            out.extend(used_fraction(m.used, m.total));
        }
    }
    if let Some(b) = ctx.call("bar1_memory", |d| d.bar1_memory_info())? {
        out.push(Sample::new(Metric::Bar1Usage, b.used as f64));
        out.push(Sample::new(Metric::Bar1Limit, b.total as f64));
    }
    Ok(())
}

pub(super) fn power(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
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

/// (T.Limit field, legacy threshold, location, limit type: OpenTelemetry's `hw.limit_type`,
/// which "MUST" be used where one applies — NVML's slowdown is `throttled`, its shutdown
/// `high.critical`, its maximum operating temperatures `max`). The memory maximum has no field
/// here: its T.Limit value cannot be made absolute (there is no memory margin to read).
const THRESHOLDS: [(Option<u32>, TemperatureThreshold, &str, &str); 4] = [
    (
        Some(FI_TLIMIT_SLOWDOWN),
        TemperatureThreshold::Slowdown,
        "gpu_die",
        "throttled",
    ),
    (
        Some(FI_TLIMIT_SHUTDOWN),
        TemperatureThreshold::Shutdown,
        "gpu_die",
        "high.critical",
    ),
    (
        Some(FI_TLIMIT_GPU_MAX),
        TemperatureThreshold::GpuMax,
        "gpu_die",
        "max",
    ),
    (
        None,
        TemperatureThreshold::MemoryMax,
        "memory_junction",
        "max",
    ),
];

/// A die threshold in °C from its T.Limit value: the fields answer in degrees of margin (an
/// H200 on 580.159: slowdown -2, shutdown -8, maximum operating 0), and the margin is how far
/// the die is below its maximum operating temperature, so the threshold lies at
/// `die + margin - value`.
fn absolute_threshold(die: f64, margin: f64, tlimit: f64) -> f64 {
    die + margin - tlimit
}

pub(super) fn temperature(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
    // The die temperature: `nvmlDeviceGetTemperatureV` first (CUDA 13 deprecates
    // `nvmlDeviceGetTemperature` and announces its removal), the old call on older drivers.
    let nvml = ctx.nvml;
    let die = match ctx.call("temperature_gpu_v", |d| raw::temperature_v(nvml, d))? {
        Some(t) => Some(f64::from(t)),
        None if ctx.is_disabled("temperature_gpu_v") => ctx
            .call("temperature_gpu", |d| d.temperature(TemperatureSensor::Gpu))?
            .map(f64::from),
        None => None,
    };
    if let Some(t) = die {
        out.push(Sample::new(Metric::Temperature, t).with("hw.sensor_location", "gpu_die"));
    }
    // Memory junction (HBM): read as the integer whatever `valueType` says (R545 drivers label
    // it double), and only plausible readings.
    if let Some(v) = field(ctx, "temperature_memory", FI_MEMORY_TEMP, Decode::Uint)? {
        if PLAUSIBLE_CELSIUS.contains(&v) {
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
    let margin = ctx
        .call("temperature_margin", |d| raw::margin_temperature(nvml, d))?
        .map(f64::from);
    if let Some(m) = margin {
        out.push(Sample::new(Metric::TemperatureMargin, m).with("hw.sensor_location", "gpu_die"));
    }
    // Thresholds: the die's from the `*_TLIMIT` fields (NVIDIA's preferred interface on Ada and
    // newer) made absolute with the margin; the deprecated call for what those cannot give.
    let requests: Vec<FieldRequest> = THRESHOLDS
        .iter()
        .filter_map(|(id, ..)| id.map(FieldRequest::typed))
        .collect();
    let mut from_fields = fields(ctx, "temperature_thresholds", &requests)?.into_iter();
    for (id, kind, location, limit) in &THRESHOLDS {
        let tlimit = id.and_then(|_| from_fields.next().flatten());
        let derived = match (tlimit, die, margin) {
            (Some(tl), Some(t), Some(m)) => Some(absolute_threshold(t, m, tl)),
            _ => None,
        };
        let v = match derived {
            Some(v) => Some(v),
            None => ctx
                .call(Feature::at("temperature_threshold", *kind as u32), |d| {
                    d.temperature_threshold(*kind)
                })?
                .map(f64::from),
        };
        match v {
            Some(t) if PLAUSIBLE_CELSIUS.contains(&t) => out.push(
                Sample::new(Metric::TemperatureLimit, t)
                    .with("hw.sensor_location", *location)
                    .with("hw.limit_type", *limit),
            ),
            Some(t) => ctx.implausible(
                "temperature_thresholds",
                format!("implausible {location} {limit} temperature limit {t} °C"),
            ),
            None => {}
        }
    }
    // Each fan is a component of its own (OpenTelemetry's hw.id is the fan's), on its GPU.
    let fans = ctx.call("fan_count", |d| d.num_fans())?.unwrap_or(0);
    let gpu = crate::model::lock(&ctx.slot).info.uuid.clone();
    for fan in 0..fans.min(super::MAX_NVLINKS) {
        if let Some(p) = ctx.call(Feature::at("fan_speed", fan), |d| d.fan_speed(fan))? {
            out.push(
                Sample::new(Metric::FanSpeed, pct(p))
                    .with("hw.id", format!("{gpu}/fan{fan}"))
                    .with("hw.type", "fan")
                    .with("hw.parent", gpu.clone())
                    .with("hw.name", format!("fan{fan}"))
                    .with("hw.sensor_location", format!("gpu_fan{fan}")),
            );
        }
    }
    Ok(())
}

//! Utilization, memory, power, temperatures and clocks.

use nvml_wrapper::enum_wrappers::device::{
    Clock, PerformancePolicy, TemperatureSensor, TemperatureThreshold,
};

use super::{FI_MEMORY_TEMP, MAX_PLAUSIBLE_CELSIUS, field, memory_info_v1, pct};
use crate::model::{Metric, Sample};
use crate::sources::nvml::worker::{Ctx, Lost};

pub(super) fn utilization(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
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

pub(super) fn memory(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
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

pub(super) fn power(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
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

pub(super) fn temperature(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
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

pub(super) fn clocks(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
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

//! Clocks, performance state, clock event (throttle) reasons and violation time.

use nvml_wrapper::enum_wrappers::device::{Clock, PerformancePolicy};

use super::raw::{self, FieldRequest};
use super::{
    FI_VIOLATION_HW_POWER_BRAKE, FI_VIOLATION_HW_THERMAL, FI_VIOLATION_POWER,
    FI_VIOLATION_SW_THERMAL, FI_VIOLATION_THERMAL, fields,
};
use crate::model::{Feature, Metric, Sample};
use crate::sources::nvml::worker::{Ctx, Halt};

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

/// Violation-time fields (ns) and their `gpu.violation.type`; the first two are what
/// `nvmlDeviceGetViolationStatus` (deprecated in CUDA 13) reports for the power and thermal
/// policies.
const VIOLATIONS: [(u32, &str, Option<PerformancePolicy>); 5] = [
    (FI_VIOLATION_POWER, "power", Some(PerformancePolicy::Power)),
    (
        FI_VIOLATION_THERMAL,
        "thermal",
        Some(PerformancePolicy::Thermal),
    ),
    (FI_VIOLATION_SW_THERMAL, "sw_thermal_slowdown", None),
    (FI_VIOLATION_HW_THERMAL, "hw_thermal_slowdown", None),
    (FI_VIOLATION_HW_POWER_BRAKE, "hw_power_brake_slowdown", None),
];

/// `nvmlPstates_t`: `NVML_PSTATE_UNKNOWN` is 32, not a state.
const PSTATE_UNKNOWN: u32 = 32;

pub(super) fn clocks(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
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
        let p = p.as_c();
        if p < PSTATE_UNKNOWN {
            out.push(Sample::new(Metric::PerformanceState, f64::from(p)));
        }
    }
    // `nvmlDeviceGetCurrentClocksEventReasons` first; the deprecated `…ThrottleReasons`
    // (same bits) on drivers that predate the rename.
    let nvml = ctx.nvml;
    let bits = match ctx.call("clock_event_reasons", |d| {
        raw::clocks_event_reasons(nvml, d)
    })? {
        Some(b) => Some(b),
        None if ctx.is_disabled("clock_event_reasons") => ctx
            .call("clock_throttle_reasons", |d| d.current_throttle_reasons())?
            .map(|r| r.bits()),
        None => None,
    };
    if let Some(bits) = bits {
        for (bit, name) in CLOCK_EVENT_REASONS {
            out.push(
                Sample::new(Metric::ClockEvent, f64::from(u8::from(bits & bit != 0)))
                    .with("gpu.clock.event.reason", *name),
            );
        }
    }
    // Violation time from the fields first; the deprecated `nvmlDeviceGetViolationStatus`
    // for power and thermal where the fields are not there.
    let requests: Vec<FieldRequest> = VIOLATIONS
        .iter()
        .map(|(id, ..)| FieldRequest::typed(*id))
        .collect();
    let values = fields(ctx, "violation_time", &requests)?;
    for ((id, name, policy), v) in VIOLATIONS.iter().zip(values) {
        let ns = match (v, policy) {
            (Some(v), _) => Some(v),
            (None, Some(policy))
                if ctx.is_disabled("violation_time")
                    || ctx.is_disabled(Feature::at("violation_time", *id)) =>
            {
                ctx.call(Feature::at("violation_status", *id), |d| {
                    d.violation_status(*policy)
                })?
                .map(|v| v.violation_time as f64)
            }
            _ => None,
        };
        if let Some(ns) = ns {
            out.push(
                Sample::new(Metric::ViolationTime, ns / 1e9).with("gpu.violation.type", *name),
            );
        }
    }
    Ok(())
}

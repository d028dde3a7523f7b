//! The collectors, one function per metric group. Units are converted to the registry's:
//! mW→W, mJ→J, %→ratio, MHz→Hz, ns→s, KiB→bytes.

mod board;
mod errors;
mod gpm;
mod nvlink;
mod processes;

use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;

use super::worker::{Ctx, Lost};
use crate::model::{Group, Sample};

pub use gpm::GpmState;

/// `NVML_FI_DEV_MEMORY_TEMP`
pub(super) const FI_MEMORY_TEMP: u32 = 82;
/// `NVML_FI_DEV_NVLINK_LINK_COUNT`
pub(super) const FI_NVLINK_LINK_COUNT: u32 = 91;
/// `NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX` / `_RX` (KiB, per link through `scopeId`)
pub(super) const FI_NVLINK_TX: u32 = 138;
pub(super) const FI_NVLINK_RX: u32 = 139;
/// `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`
pub(super) const FI_RECOVERY_ACTION: u32 = 230;
/// NVML reports at most this many NVLink links.
pub(super) const MAX_NVLINKS: u32 = 18;
/// Link indexes as attribute values, so that no sample allocates its link name.
pub(super) const LINK_NAMES: [&str; MAX_NVLINKS as usize] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    "17",
];
/// HBM readings above this are a known NVML defect (dcgm-exporter drops them too).
pub(super) const MAX_PLAUSIBLE_CELSIUS: f64 = 200.0;

/// Runs one group's collection into `out`.
pub fn collect(group: Group, ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
    match group {
        Group::Utilization => board::utilization(ctx, out),
        Group::Memory => board::memory(ctx, out),
        Group::Power => board::power(ctx, out),
        Group::Temperature => board::temperature(ctx, out),
        Group::Clocks => board::clocks(ctx, out),
        Group::Errors => errors::errors(ctx, out),
        Group::Pcie => errors::pcie(ctx, out),
        Group::Nvlink => nvlink::nvlink(ctx, out),
        Group::Processes => processes::processes(ctx, out),
        Group::Mig => processes::mig(ctx, out),
        Group::Gpm => gpm::gpm(ctx, out),
        Group::Status => Ok(()),
    }
}

pub(super) fn pct(v: u32) -> f64 {
    f64::from(v) / 100.0
}

pub(super) fn memory_info_v1(
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

/// Reads one device-scoped field value as f64.
pub(super) fn field(
    ctx: &mut Ctx<'_>,
    feature: &'static str,
    id: u32,
) -> Result<Option<f64>, Lost> {
    let Some(mut values) = ctx.call(feature, |d| d.field_values_for(&[FieldId(id)]))? else {
        return Ok(None);
    };
    match values.pop().map(|s| s.and_then(|s| s.value)) {
        Some(Ok(v)) => Ok(Some(sample_value(v))),
        Some(Err(e)) => ctx.failed(feature, e).map(|()| None),
        None => Ok(None),
    }
}

pub(super) fn sample_value(v: SampleValue) -> f64 {
    match v {
        SampleValue::F64(x) => x,
        SampleValue::U32(x) => f64::from(x),
        SampleValue::U64(x) => x as f64,
        SampleValue::I64(x) => x as f64,
    }
}

//! NVLink per link: state, data counters and errors.

use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::nvmlFieldValue_t;

use super::{FI_NVLINK_LINK_COUNT, FI_NVLINK_RX, FI_NVLINK_TX, LINK_NAMES, MAX_NVLINKS, field};
use crate::model::{Metric, Sample};
use crate::sources::nvml::worker::{Ctx, Lost};

pub(super) fn nvlink(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
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
pub(super) fn nvlink_throughput(
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

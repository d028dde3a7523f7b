//! GPM profiling metrics (Hopper and newer), from two samples one interval apart.

use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};

use crate::model::{Metric, Sample};
use crate::sources::nvml::worker::{Ctx, Lost};

/// GPM needs two samples: the previous one is kept between cycles.
#[derive(Default)]
pub struct GpmState<'n> {
    prev: Option<GpmSample<'n>>,
}

/// A GPM metric: its id, where it goes, an attribute, and the factor to the registry unit.
type GpmMapping = (
    GpmMetricId,
    Metric,
    Option<(&'static str, &'static str)>,
    f64,
);

pub(super) const GPM_METRICS: &[GpmMapping] = &[
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

pub(super) fn gpm(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Lost> {
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

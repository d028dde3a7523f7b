//! GPM profiling metrics (Hopper and newer), from two samples one interval apart.

use std::collections::BTreeMap;

use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::GpmSample;

use super::raw::{self, GpmRequest};

use crate::model::{Metric, Sample};
use crate::sources::nvml::worker::{Ctx, Halt};

/// The first publication needs two samples: the second is taken this long after the first,
/// comfortably above the 100 ms NVML asks for between GPM samples (nvml.h, `nvmlGpmMetricsGet`).
const FIRST_SAMPLE_GAP: std::time::Duration = std::time::Duration::from_millis(250);

/// GPM needs two samples: the previous one is kept between cycles.
#[derive(Default)]
pub struct GpmState<'n> {
    prev: Option<GpmSample<'n>>,
    /// Per MIG GPU instance id.
    mig_prev: BTreeMap<u32, GpmSample<'n>>,
    /// The metrics request, kept from one call to the next (taken out while in use).
    request: Option<GpmRequest>,
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

pub(super) fn gpm(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
    match ctx.call("gpm", |d| d.gpm_support())? {
        Some(true) => {}
        Some(false) => {
            ctx.disable_unsupported("gpm", "GPU has no GPM (Hopper and newer only)");
            return Ok(());
        }
        None => return Ok(()),
    }
    if ctx.gpm.prev.is_none() {
        // First cycle: take a baseline and ask for the group again shortly after, so that
        // the first values come within a cycle, not an interval later. The thread collects
        // the other GPUs meanwhile (it used to sleep here, a quarter of a second a GPU).
        ctx.gpm.prev = ctx.call("gpm", |d| d.gpm_sample())?;
        if ctx.gpm.prev.is_some() {
            ctx.again_in = Some(FIRST_SAMPLE_GAP);
            return mig_instances(ctx, out);
        }
    }
    if let Some(next) = ctx.call("gpm", |d| d.gpm_sample())? {
        let results = match ctx.gpm.prev.take() {
            Some(prev) => metrics(ctx, "gpm", (&prev, &next))?,
            None => None,
        };
        ctx.gpm.prev = Some(next);
        push_metrics(ctx, results, out, |s| s)?;
    }
    mig_instances(ctx, out)
}

/// Per GPU instance: GPM samples a GPU instance, not a compute instance, so a GPU instance
/// that holds several compute instances (MIG devices) is sampled once. Its series carry the
/// GPU's `hw.id` and `gpu.mig.gpu_instance_id`.
fn mig_instances(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
    let mut instances: Vec<u32> = ctx.mig_devices.iter().map(|m| m.gpu_instance).collect();
    instances.sort_unstable();
    instances.dedup();
    ctx.gpm.mig_prev.retain(|gi, _| instances.contains(gi));
    for gi in instances {
        let Some(next) = ctx.call("gpm_mig", |d| d.gpm_mig_sample(gi))? else {
            continue;
        };
        let results = match ctx.gpm.mig_prev.remove(&gi) {
            Some(prev) => metrics(ctx, "gpm_mig", (&prev, &next))?,
            None => None,
        };
        ctx.gpm.mig_prev.insert(gi, next);
        let gi = gi.to_string();
        push_metrics(ctx, results, out, |s| {
            s.with("gpu.mig.gpu_instance_id", gi.clone())
        })?;
    }
    Ok(())
}

/// The metrics of [`GPM_METRICS`] between two samples, under `feature`, through the request
/// the GPU's state keeps.
fn metrics(
    ctx: &mut Ctx<'_>,
    feature: &'static str,
    samples: (&GpmSample<'_>, &GpmSample<'_>),
) -> Result<Option<raw::GpmValues>, Halt> {
    let nvml = ctx.nvml;
    let mut request = ctx.gpm.request.take().unwrap_or_default();
    let r = ctx.call(feature, |_| {
        raw::gpm_metrics(nvml, &mut request, samples, &metric_ids())
    });
    ctx.gpm.request = Some(request);
    r
}

/// The ids of [`GPM_METRICS`], in order.
fn metric_ids() -> [std::os::raw::c_uint; GPM_METRICS.len()] {
    std::array::from_fn(|i| GPM_METRICS[i].0.as_c())
}

/// Converts `nvmlGpmMetricsGet` results into samples, `tag`ging each.
fn push_metrics(
    ctx: &mut Ctx<'_>,
    results: Option<impl IntoIterator<Item = Result<f64, NvmlError>>>,
    out: &mut Vec<Sample>,
    tag: impl Fn(Sample) -> Sample,
) -> Result<(), Halt> {
    for (r, (_, metric, attr, scale)) in results.into_iter().flatten().zip(GPM_METRICS) {
        match r {
            // NaN happens (DCGM blanks such values): no reading, not a NaN series.
            Ok(v) if !v.is_finite() => {}
            Ok(v) => {
                let mut s = Sample::new(*metric, v * scale);
                if let Some((k, val)) = attr {
                    s = s.with(k, *val);
                }
                out.push(tag(s));
            }
            Err(NvmlError::NotSupported) => {}
            Err(e) => ctx.failed("gpm", e)?,
        }
    }
    Ok(())
}

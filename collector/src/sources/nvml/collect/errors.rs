//! ECC, retired pages, remapped rows, the recovery action, and PCIe.

use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, PcieUtilCounter, RetirementCause,
};

use super::raw::{self, Decode, FieldRequest};
use super::{FI_PCIE_RX_BYTES, FI_PCIE_TX_BYTES, FI_RECOVERY_ACTION, field, fields};
use crate::model::{Metric, Sample};
use crate::sources::nvml::worker::{Ctx, Halt};

/// `nvmlDeviceGpuRecoveryAction_t` values and their `gpu.recovery_action` names; CUDA 13
/// added `NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN` (5). A value not listed here is
/// reported as `unknown` rather than dropped.
const RECOVERY_ACTIONS: [(u32, &str); 6] = [
    (0, "none"),
    (1, "gpu_reset"),
    (2, "node_reboot"),
    (3, "drain_p2p"),
    (4, "drain_and_reset"),
    (5, "recover_imex_domain"),
];

pub(super) fn errors(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
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
    // `hw.errors` is the volatile count (since the driver loaded; it resets as a counter
    // does); the lifetime count, which includes it, has a name of its own so that summing
    // `hw.errors` counts each error once.
    for (feature, kind, counter, ty, scope) in ecc {
        if let Some(n) = ctx.call(feature, |d| d.total_ecc_errors(kind, counter))? {
            let s = match scope {
                "volatile" => Sample::new(Metric::EccErrors, n as f64).with("hw.type", "gpu"),
                _ => Sample::new(Metric::EccErrorsLifetime, n as f64),
            };
            out.push(s.with("error.type", ty));
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
        ctx.call("remapped_rows", |d| raw::remapped_rows(nvml, d))?
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
    if let Some(v) = field(ctx, "recovery_action", FI_RECOVERY_ACTION, Decode::Typed)? {
        let current = v as u32;
        let known = RECOVERY_ACTIONS.iter().any(|(c, _)| *c == current);
        for (code, name) in RECOVERY_ACTIONS {
            out.push(
                Sample::new(Metric::RecoveryAction, f64::from(u8::from(current == code)))
                    .with("gpu.recovery_action", name),
            );
        }
        out.push(
            Sample::new(Metric::RecoveryAction, f64::from(u8::from(!known)))
                .with("gpu.recovery_action", "unknown"),
        );
    }
    Ok(())
}

pub(super) fn pcie(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
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
    // The byte counters (hw.gpu.io): one call for both, each disabled on its own where the
    // driver lacks it.
    let bytes = fields(
        ctx,
        "pcie_bytes",
        &[
            FieldRequest::typed(FI_PCIE_TX_BYTES),
            FieldRequest::typed(FI_PCIE_RX_BYTES),
        ],
    )?;
    for (v, dir) in bytes.into_iter().zip(["transmit", "receive"]) {
        if let Some(v) = v {
            out.push(Sample::new(Metric::GpuIo, v).with("network.io.direction", dir));
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

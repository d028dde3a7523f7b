//! A GPU's memory repairs in the history: each change of its remapped rows (by kind), of a
//! pending or failed remap, and of its retired pages (by cause) and a pending retirement is
//! an entry (`kind = "memory"`), compared with the last one the history holds for the GPU, so
//! that neither a restart nor a reboot writes the same figures twice and a GPU that moved bus
//! address keeps its record (it is by UUID).

use crate::model::history::Entry;
use crate::model::{GpuSlot, Metric, Model};

use super::rules::{find, samples};

/// The GPU's memory-repair figures as one line (`None` where NVML gives none of them).
pub fn summary(slot: &GpuSlot) -> Option<String> {
    let v = |m: Metric, attrs: &[(&str, &str)]| find(samples(slot), m, attrs);
    let parts = [
        (
            "remapped_correctable",
            v(Metric::RemappedRows, &[("gpu.remap.type", "correctable")]),
        ),
        (
            "remapped_uncorrectable",
            v(Metric::RemappedRows, &[("gpu.remap.type", "uncorrectable")]),
        ),
        ("remap_pending", v(Metric::RemapPending, &[])),
        ("remap_failure", v(Metric::RemapFailure, &[])),
        (
            "retired_sbe",
            v(
                Metric::RetiredPages,
                &[("gpu.retirement.cause", "multiple_single_bit")],
            ),
        ),
        (
            "retired_dbe",
            v(
                Metric::RetiredPages,
                &[("gpu.retirement.cause", "double_bit")],
            ),
        ),
        ("retired_pending", v(Metric::RetiredPending, &[])),
    ];
    if parts.iter().all(|(_, x)| x.is_none()) {
        return None;
    }
    Some(
        parts
            .iter()
            .filter_map(|(k, x)| x.map(|x| format!("{k}={x}")))
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// Appends the GPU's figures to the history where they differ from its last entry there
/// (`last`: what this evaluator last saw or wrote; looked up in the history the first time,
/// and let go before the append: an append while a reader holds the entries copies them).
pub fn remember(model: &Model, uuid: &str, slot: &GpuSlot, last: &mut Option<String>) {
    let Some(now) = summary(slot) else { return };
    if last.is_none() {
        *last = last_entry(&model.history.entries(), uuid);
    }
    if last.as_deref() != Some(now.as_str()) {
        let detail = match last.as_deref() {
            Some(before) => format!("memory repairs changed: was {before}"),
            None => "memory repairs first seen".to_string(),
        };
        model.remember(uuid, "memory", now.clone(), &detail);
        *last = Some(now);
    }
}

/// The figures of the GPU's last memory entry in `history`.
fn last_entry(history: &[Entry], uuid: &str) -> Option<String> {
    history
        .iter()
        .rev()
        .find(|e| e.kind == "memory" && e.id == uuid)
        .map(|e| e.code.to_string())
}

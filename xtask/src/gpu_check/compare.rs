//! What is compared with `nvidia-smi`: the fields (Junction's metric, nvidia-smi's query
//! name, the unit's factor and the tolerance, and why) and the settings, and how.

use std::collections::BTreeMap;
use std::process::Command;

use super::{metric, parse_csv};

/// One compared field: nvidia-smi's query name, Junction's metric and attribute, the factor
/// from Junction's unit to nvidia-smi's, and the tolerance (absolute, in nvidia-smi's unit).
pub(super) struct Field {
    pub(super) smi: &'static str,
    metric: &'static str,
    attr: Option<(&'static str, &'static str)>,
    to_smi: f64,
    tolerance: f64,
    why: &'static str,
}

pub(super) const MIB: f64 = 1024.0 * 1024.0;

pub(super) const FIELDS: &[Field] = &[
    Field {
        smi: "utilization.gpu",
        metric: "hw.gpu.utilization",
        attr: Some(("hw.gpu.task", "general")),
        to_smi: 100.0,
        tolerance: 15.0,
        why: "%, sampled at different moments",
    },
    Field {
        smi: "utilization.memory",
        metric: "gpu.memory.activity",
        attr: None,
        to_smi: 100.0,
        tolerance: 15.0,
        why: "%, sampled at different moments",
    },
    Field {
        smi: "memory.total",
        metric: "hw.gpu.memory.limit",
        attr: None,
        to_smi: 1.0 / MIB,
        tolerance: 1.0,
        why: "MiB, rounding",
    },
    Field {
        smi: "memory.used",
        metric: "hw.gpu.memory.usage",
        attr: None,
        to_smi: 1.0 / MIB,
        tolerance: 256.0,
        why: "MiB, allocations between reads",
    },
    Field {
        smi: "power.draw",
        metric: "hw.power",
        attr: None,
        to_smi: 1.0,
        tolerance: 60.0,
        why: "W, power moves between reads",
    },
    Field {
        smi: "power.limit",
        metric: "gpu.power.limit",
        attr: Some(("gpu.power.limit_type", "enforced")),
        to_smi: 1.0,
        tolerance: 1.0,
        why: "W",
    },
    Field {
        smi: "temperature.gpu",
        metric: "hw.temperature",
        attr: Some(("hw.sensor_location", "gpu_die")),
        to_smi: 1.0,
        tolerance: 3.0,
        why: "°C",
    },
    Field {
        smi: "temperature.memory",
        metric: "hw.temperature",
        attr: Some(("hw.sensor_location", "memory_junction")),
        to_smi: 1.0,
        tolerance: 3.0,
        why: "°C",
    },
    Field {
        smi: "clocks.sm",
        metric: "gpu.clock.frequency",
        attr: Some(("gpu.clock.domain", "sm")),
        to_smi: 1e-6,
        tolerance: 200.0,
        why: "MHz, boost moves",
    },
    Field {
        smi: "clocks.mem",
        metric: "gpu.clock.frequency",
        attr: Some(("gpu.clock.domain", "memory")),
        to_smi: 1e-6,
        tolerance: 50.0,
        why: "MHz",
    },
    Field {
        smi: "clocks.max.sm",
        metric: "gpu.clock.max_frequency",
        attr: Some(("gpu.clock.domain", "sm")),
        to_smi: 1e-6,
        tolerance: 0.5,
        why: "MHz",
    },
    Field {
        smi: "ecc.errors.corrected.aggregate.total",
        metric: "gpu.ecc.errors.lifetime",
        attr: Some(("error.type", "corrected")),
        to_smi: 1.0,
        tolerance: 0.0,
        why: "count (corrected)",
    },
    Field {
        smi: "pcie.link.width.max",
        metric: "gpu.pcie.link.width",
        attr: Some(("gpu.pcie.link.state", "max")),
        to_smi: 1.0,
        tolerance: 0.0,
        why: "lanes",
    },
    Field {
        smi: "pcie.link.gen.max",
        metric: "gpu.pcie.link.generation",
        attr: Some(("gpu.pcie.link.state", "max")),
        to_smi: 1.0,
        tolerance: 0.0,
        why: "generation",
    },
];

/// Fields that not every nvidia-smi knows, each compared with a query of its own (one unknown
/// name fails a whole query).
const OPTIONAL_FIELDS: &[Field] = &[Field {
    smi: "temperature.gpu.tlimit",
    metric: "gpu.temperature.margin",
    attr: Some(("hw.sensor_location", "gpu_die")),
    to_smi: 1.0,
    // On an H200 that a CUDA program had been heating for seconds, Junction's margin and
    // nvidia-smi's, read a second apart, were 4 °C apart (27 and 23: the T.Limit follows a
    // hotter sensor than the die temperature and moves faster); idle, 50 and 51.
    tolerance: 5.0,
    why: "°C of T.Limit margin, which moves fast under a changing load",
}];

/// nvidia-smi's rows of each of [`OPTIONAL_FIELDS`], each from a query of its own (empty for a
/// field this nvidia-smi does not know). Read right after Junction's collection, as the fixed
/// fields are.
pub(super) fn query_optional() -> Vec<Vec<BTreeMap<String, String>>> {
    OPTIONAL_FIELDS
        .iter()
        .map(|f| {
            let out = Command::new("nvidia-smi")
                .arg(format!("--query-gpu=uuid,{}", f.smi))
                .arg("--format=csv,noheader,nounits")
                .output();
            match out {
                Ok(o) if o.status.success() => {
                    parse_csv(&String::from_utf8_lossy(&o.stdout), &["uuid", f.smi])
                }
                _ => Vec::new(),
            }
        })
        .collect()
}

/// Compares [`OPTIONAL_FIELDS`] with their rows from [`query_optional`]; returns the
/// mismatches. A field this nvidia-smi does not know has no rows.
pub(super) fn compare_optional(
    j: &BTreeMap<String, serde_json::Value>,
    rows: &[Vec<BTreeMap<String, String>>],
) -> usize {
    let mut failures = 0;
    for (f, rows) in OPTIONAL_FIELDS.iter().zip(rows) {
        for row in rows {
            let uuid = row.get("uuid").cloned().unwrap_or_default();
            if let Some(gpu) = j.get(&uuid) {
                failures += usize::from(!compare_field(&uuid, gpu, row, f));
            }
        }
    }
    failures
}

/// One field of one GPU, compared and printed as a row; false on a mismatch.
pub(super) fn compare_field(
    uuid: &str,
    gpu: &serde_json::Value,
    row: &BTreeMap<String, String>,
    f: &Field,
) -> bool {
    let smi_v = row.get(f.smi).and_then(|v| v.trim().parse::<f64>().ok());
    let j_v = metric(gpu, f.metric, f.attr).map(|v| v * f.to_smi);
    let (result, bad) = match (j_v, smi_v) {
        (Some(a), Some(b)) if (a - b).abs() <= f.tolerance => ("ok", false),
        (Some(_), Some(_)) => ("MISMATCH", true),
        (None, None) => ("n/a", false),
        (Some(_), None) => ("smi n/a", false),
        (None, Some(_)) => ("MISSING", true),
    };
    println!(
        "{uuid:<40} {:<38} {:>14} {:>14} {result:>9}  ±{} {}",
        f.smi,
        j_v.map_or("-".into(), |v| format!("{v:.1}")),
        smi_v.map_or("-".into(), |v| format!("{v:.1}")),
        f.tolerance,
        f.why
    );
    !bad
}

/// A setting nvidia-smi prints as a word: its query name, Junction's metric, and where
/// Junction keeps the setting (`Value(attr)`: the series' value, 1 for `Enabled`; `Label(key)`:
/// the label of the series whose value is 1).
struct Setting {
    smi: &'static str,
    metric: &'static str,
    how: How,
}

enum How {
    Value(Option<(&'static str, &'static str)>),
    Label(&'static str),
}

const SETTINGS: &[Setting] = &[
    Setting {
        smi: "persistence_mode",
        metric: "gpu.persistence_mode",
        how: How::Value(None),
    },
    Setting {
        smi: "ecc.mode.current",
        metric: "gpu.ecc.mode",
        how: How::Value(Some(("gpu.mode.setting", "current"))),
    },
    Setting {
        smi: "ecc.mode.pending",
        metric: "gpu.ecc.mode",
        how: How::Value(Some(("gpu.mode.setting", "pending"))),
    },
    Setting {
        smi: "mig.mode.current",
        metric: "gpu.mig.mode",
        how: How::Value(None),
    },
    Setting {
        smi: "mig.mode.pending",
        metric: "gpu.mig.mode.pending",
        how: How::Value(None),
    },
    Setting {
        smi: "compute_mode",
        metric: "gpu.compute_mode",
        how: How::Label("gpu.compute_mode"),
    },
    Setting {
        smi: "fabric.state",
        metric: "gpu.fabric.state",
        how: How::Label("gpu.fabric.state"),
    },
];

/// nvidia-smi's word for a setting as Junction spells it (`Enabled` → `1`, `In Progress` →
/// `in_progress`, `Exclusive_Process` → `exclusive_process`).
fn smi_word(w: &str) -> String {
    match w.trim() {
        "Enabled" => "1".into(),
        "Disabled" => "0".into(),
        other => other.to_lowercase().replace(' ', "_"),
    }
}

/// Compares the settings, each with a query of its own (an nvidia-smi that does not know a
/// field, such as `fabric.state` before R550, fails only that one); returns the mismatches.
pub(super) fn compare_settings(j: &BTreeMap<String, serde_json::Value>) -> usize {
    let mut failures = 0;
    for s in SETTINGS {
        let out = Command::new("nvidia-smi")
            .arg(format!("--query-gpu=uuid,{}", s.smi))
            .arg("--format=csv,noheader,nounits")
            .output();
        let Some(out) = out.ok().filter(|o| o.status.success()) else {
            println!(
                "{:<40} {:<38} {:>14} {:>14} {:>9}",
                "*", s.smi, "", "", "smi n/a"
            );
            continue;
        };
        for row in parse_csv(&String::from_utf8_lossy(&out.stdout), &["uuid", s.smi]) {
            let uuid = row.get("uuid").cloned().unwrap_or_default();
            let smi_v = row.get(s.smi).map(|w| smi_word(w));
            let j_v = j.get(&uuid).and_then(|g| match s.how {
                How::Value(attr) => metric(g, s.metric, attr).map(|v| format!("{v:.0}")),
                How::Label(key) => label(g, s.metric, key),
            });
            let (result, bad) = match (&j_v, &smi_v) {
                (Some(a), Some(b)) if a == b => ("ok", false),
                (Some(_), Some(_)) => ("MISMATCH", true),
                (None, None) => ("n/a", false),
                (Some(_), None) => ("smi n/a", false),
                (None, Some(_)) => ("MISSING", true),
            };
            failures += usize::from(bad);
            println!(
                "{uuid:<40} {:<38} {:>14} {:>14} {result:>9}  exact",
                s.smi,
                j_v.as_deref().unwrap_or("-"),
                smi_v.as_deref().unwrap_or("-"),
            );
        }
    }
    failures
}

/// The `key` label of the `name` series whose value is 1.
fn label(gpu: &serde_json::Value, name: &str, key: &str) -> Option<String> {
    gpu["metrics"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == name && m["value"].as_f64() == Some(1.0))
        .and_then(|m| m["attributes"][key].as_str())
        .map(str::to_string)
}

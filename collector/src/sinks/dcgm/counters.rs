//! The counter set the listener serves: dcgm-exporter's default set, or a counters file in
//! its CSV format.

use super::fields::{Field, Kind, get};

/// dcgm-exporter's default counter set (`etc/default-counters.csv`, which its DCP set
/// `etc/dcp-metrics-included.csv` equals): the names, in its order.
pub const DEFAULT: &[&str] = &[
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DRIVER_VERSION",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
];

/// One selected field: the field, and the type and help its CSV line gives.
#[derive(Debug, Clone)]
pub struct Selected {
    /// The field.
    pub field: &'static Field,
    /// `# TYPE` (the CSV's).
    pub kind: Kind,
    /// `# HELP` (the CSV's, verbatim).
    pub help: String,
}

/// The built-in default set.
pub fn default_set() -> Vec<Selected> {
    DEFAULT
        .iter()
        .filter_map(|n| get(n))
        .map(|f| Selected {
            field: f,
            kind: f.kind,
            help: f.help.to_string(),
        })
        .collect()
}

/// A counters file in dcgm-exporter's CSV format (`name, type, help`; `#` comments): the
/// fields it selects. A name Junction does not know, or a type that is not gauge, counter or
/// label, is an error naming the line.
pub fn parse_csv(text: &str) -> Result<Vec<Selected>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut cols = line.splitn(3, ',');
        let name = cols.next().unwrap_or("").trim();
        let ty = cols.next().unwrap_or("").trim();
        let help = cols.next().unwrap_or("").trim();
        let field = get(name).ok_or_else(|| {
            format!(
                "line {}: {name:?} is not a field Junction knows (METRICS.md lists the dcgm-exporter fields it serves)",
                n + 1
            )
        })?;
        let kind = Kind::parse(ty).ok_or_else(|| {
            format!(
                "line {}: {name}: type {ty:?} is not gauge, counter or label",
                n + 1
            )
        })?;
        if !out.iter().any(|s: &Selected| s.field.name == name) {
            out.push(Selected {
                field,
                kind,
                help: help.to_string(),
            });
        }
    }
    Ok(out)
}

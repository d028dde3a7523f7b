//! The dcgm-exporter fields Junction serves, each from the NVML reading it already takes, in
//! dcgm-exporter's unit and value type (`../shared/realworld/dcgm-consumers/dcgm-exporter/`
//! `LABELS-AND-UNITS.md` §4: percent for `DEV_*` utilisation, ratios for `PROF_*`, MiB, MHz,
//! W, mJ, ns), and the fields it knows but cannot serve, with why.

use super::counters::DEFAULT;
use crate::model::Metric;

/// `# TYPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A gauge.
    Gauge,
    /// A counter (no `_total`).
    Counter,
    /// A label on every GPU line (`DCGM_FI_DRIVER_VERSION`).
    Label,
}

impl Kind {
    /// As the CSV spells it.
    pub fn parse(s: &str) -> Option<Kind> {
        match s.trim() {
            "gauge" => Some(Kind::Gauge),
            "counter" => Some(Kind::Counter),
            "label" => Some(Kind::Label),
            _ => None,
        }
    }

    /// As `# TYPE` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Label => "label",
        }
    }
}

/// Where a field's value comes from.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    /// The GPU-level sample of a metric with these attributes, times the factor.
    Nvml(Metric, &'static [(&'static str, &'static str)], f64),
    /// The sum of every such sample (all NVLink links and directions).
    Sum(Metric, f64),
    /// The GPU's last XID code (0: none yet).
    LastXid,
    /// The driver version (a label).
    Driver,
    /// Nothing Junction reads gives it.
    None(&'static str),
}

/// One field.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// dcgm-exporter's name (the DCGM field's).
    pub name: &'static str,
    /// Its type in dcgm-exporter's default CSV.
    pub kind: Kind,
    /// Printed as an integer (DCGM INT64 fields) or with six decimals (DOUBLE).
    pub int: bool,
    /// Where it comes from.
    pub source: Source,
    /// The help line Junction gives it (a user's CSV gives its own).
    pub help: &'static str,
}

const MIB: f64 = 1.0 / (1024.0 * 1024.0);

macro_rules! f {
    ($name:literal, $kind:ident, $int:literal, $src:expr, $help:literal) => {
        Field {
            name: $name,
            kind: Kind::$kind,
            int: $int,
            source: $src,
            help: $help,
        }
    };
}

use Source::Nvml as N;

/// Every field Junction knows, served or not.
pub static FIELDS: &[Field] = &[
    f!(
        "DCGM_FI_DEV_SM_CLOCK",
        Gauge,
        true,
        N(Metric::ClockFrequency, &[("gpu.clock.domain", "sm")], 1e-6),
        "SM clock frequency (in MHz)."
    ),
    f!(
        "DCGM_FI_DEV_MEM_CLOCK",
        Gauge,
        true,
        N(
            Metric::ClockFrequency,
            &[("gpu.clock.domain", "memory")],
            1e-6
        ),
        "Memory clock frequency (in MHz)."
    ),
    f!(
        "DCGM_FI_DEV_VIDEO_CLOCK",
        Gauge,
        true,
        N(
            Metric::ClockFrequency,
            &[("gpu.clock.domain", "video")],
            1e-6
        ),
        "Video encoder/decoder clock (in MHz)."
    ),
    f!(
        "DCGM_FI_DEV_MAX_SM_CLOCK",
        Gauge,
        true,
        N(
            Metric::ClockMaxFrequency,
            &[("gpu.clock.domain", "sm")],
            1e-6
        ),
        "Maximum SM clock (in MHz)."
    ),
    f!(
        "DCGM_FI_DEV_MAX_MEM_CLOCK",
        Gauge,
        true,
        N(
            Metric::ClockMaxFrequency,
            &[("gpu.clock.domain", "memory")],
            1e-6
        ),
        "Maximum memory clock (in MHz)."
    ),
    f!(
        "DCGM_FI_DEV_MEMORY_TEMP",
        Gauge,
        true,
        N(
            Metric::Temperature,
            &[("hw.sensor_location", "memory_junction")],
            1.0
        ),
        "Memory temperature (in C)."
    ),
    f!(
        "DCGM_FI_DEV_GPU_TEMP",
        Gauge,
        true,
        N(
            Metric::Temperature,
            &[("hw.sensor_location", "gpu_die")],
            1.0
        ),
        "GPU temperature (in C)."
    ),
    f!(
        "DCGM_FI_DEV_POWER_USAGE",
        Gauge,
        false,
        N(Metric::Power, &[("hw.type", "gpu")], 1.0),
        "Power draw (in W)."
    ),
    f!(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        Gauge,
        false,
        N(
            Metric::PowerLimit,
            &[("gpu.power.limit_type", "enforced")],
            1.0
        ),
        "Power management limit (in W)."
    ),
    f!(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        Counter,
        true,
        N(Metric::Energy, &[("hw.type", "gpu")], 1000.0),
        "Total energy consumption since the driver was loaded (in mJ)."
    ),
    f!(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        Counter,
        true,
        N(Metric::PcieReplay, &[], 1.0),
        "Total number of PCIe retries."
    ),
    f!(
        "DCGM_FI_DEV_GPU_UTIL",
        Gauge,
        true,
        N(Metric::Utilization, &[("hw.gpu.task", "general")], 100.0),
        "GPU utilization (in %)."
    ),
    f!(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        Gauge,
        true,
        N(Metric::MemoryActivity, &[], 100.0),
        "Memory utilization (in %)."
    ),
    f!(
        "DCGM_FI_DEV_ENC_UTIL",
        Gauge,
        true,
        N(Metric::Utilization, &[("hw.gpu.task", "encoder")], 100.0),
        "Encoder utilization (in %)."
    ),
    f!(
        "DCGM_FI_DEV_DEC_UTIL",
        Gauge,
        true,
        N(Metric::Utilization, &[("hw.gpu.task", "decoder")], 100.0),
        "Decoder utilization (in %)."
    ),
    f!(
        "DCGM_FI_DEV_XID_ERRORS",
        Gauge,
        true,
        Source::LastXid,
        "Value of the last XID error encountered."
    ),
    f!(
        "DCGM_FI_DEV_FB_FREE",
        Gauge,
        true,
        N(Metric::MemoryFree, &[], MIB),
        "Framebuffer memory free (in MiB)."
    ),
    f!(
        "DCGM_FI_DEV_FB_USED",
        Gauge,
        true,
        N(Metric::MemoryUsage, &[], MIB),
        "Framebuffer memory used (in MiB)."
    ),
    f!(
        "DCGM_FI_DEV_FB_RESERVED",
        Gauge,
        true,
        N(Metric::MemoryReserved, &[], MIB),
        "Framebuffer memory reserved (in MiB)."
    ),
    f!(
        "DCGM_FI_DEV_FB_TOTAL",
        Gauge,
        true,
        N(Metric::MemoryLimit, &[], MIB),
        "Framebuffer memory total (in MiB)."
    ),
    f!(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        Counter,
        true,
        Source::Sum(Metric::NvlinkIo, 1.0 / 1024.0),
        "NVLink data counted on all links, both directions (in KiB, as NVML counts it)."
    ),
    f!(
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        Gauge,
        true,
        Source::None(
            "vGPU licensing: NVML gives it only on vGPU guests, which Junction does not watch"
        ),
        "vGPU License status"
    ),
    f!(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        Counter,
        true,
        N(
            Metric::RemappedRows,
            &[("gpu.remap.type", "uncorrectable")],
            1.0
        ),
        "Number of remapped rows for uncorrectable errors"
    ),
    f!(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        Counter,
        true,
        N(
            Metric::RemappedRows,
            &[("gpu.remap.type", "correctable")],
            1.0
        ),
        "Number of remapped rows for correctable errors"
    ),
    f!(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        Gauge,
        true,
        N(Metric::RemapFailure, &[], 1.0),
        "Whether remapping of rows has failed"
    ),
    f!(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        Counter,
        true,
        N(Metric::EccErrors, &[("error.type", "corrected")], 1.0),
        "Total number of single-bit volatile ECC errors."
    ),
    f!(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        Counter,
        true,
        N(Metric::EccErrors, &[("error.type", "uncorrected")], 1.0),
        "Total number of double-bit volatile ECC errors."
    ),
    f!(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        Counter,
        true,
        N(
            Metric::EccErrorsLifetime,
            &[("error.type", "corrected")],
            1.0
        ),
        "Total number of single-bit persistent ECC errors."
    ),
    f!(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        Counter,
        true,
        N(
            Metric::EccErrorsLifetime,
            &[("error.type", "uncorrected")],
            1.0
        ),
        "Total number of double-bit persistent ECC errors."
    ),
    f!(
        "DCGM_FI_DEV_POWER_VIOLATION",
        Counter,
        true,
        N(
            Metric::ViolationTime,
            &[("gpu.violation.type", "power")],
            1e9
        ),
        "Throttling duration due to power constraints (in ns)."
    ),
    f!(
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        Counter,
        true,
        N(
            Metric::ViolationTime,
            &[("gpu.violation.type", "thermal")],
            1e9
        ),
        "Throttling duration due to thermal constraints (in ns)."
    ),
    f!(
        "DCGM_FI_DEV_PSTATE",
        Gauge,
        true,
        N(Metric::PerformanceState, &[], 1.0),
        "Performance state (P-State) 0-15."
    ),
    f!(
        "DCGM_FI_DRIVER_VERSION",
        Label,
        false,
        Source::Driver,
        "Driver Version"
    ),
    f!(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        Gauge,
        false,
        N(Metric::GpmGraphicsActivity, &[], 1.0),
        "Ratio of time the graphics engine is active."
    ),
    f!(
        "DCGM_FI_PROF_SM_ACTIVE",
        Gauge,
        false,
        N(Metric::GpmSmActivity, &[], 1.0),
        "The ratio of cycles an SM has at least 1 warp assigned."
    ),
    f!(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        Gauge,
        false,
        N(Metric::GpmSmOccupancy, &[], 1.0),
        "The ratio of number of warps resident on an SM."
    ),
    f!(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        Gauge,
        false,
        N(Metric::GpmPipeActivity, &[("gpu.pipe", "tensor")], 1.0),
        "Ratio of cycles the tensor (HMMA) pipe is active."
    ),
    f!(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        Gauge,
        false,
        N(Metric::GpmPipeActivity, &[("gpu.pipe", "fp64")], 1.0),
        "Ratio of cycles the fp64 pipes are active."
    ),
    f!(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        Gauge,
        false,
        N(Metric::GpmPipeActivity, &[("gpu.pipe", "fp32")], 1.0),
        "Ratio of cycles the fp32 pipes are active."
    ),
    f!(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        Gauge,
        false,
        N(Metric::GpmPipeActivity, &[("gpu.pipe", "fp16")], 1.0),
        "Ratio of cycles the fp16 pipes are active."
    ),
    f!(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        Gauge,
        false,
        N(Metric::GpmDramActivity, &[], 1.0),
        "Ratio of cycles the device memory interface is active sending or receiving data."
    ),
    f!(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        Gauge,
        true,
        N(
            Metric::GpmPcieThroughput,
            &[("network.io.direction", "transmit")],
            1.0
        ),
        "The rate of data transmitted over the PCIe bus, in bytes per second."
    ),
    f!(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        Gauge,
        true,
        N(
            Metric::GpmPcieThroughput,
            &[("network.io.direction", "receive")],
            1.0
        ),
        "The rate of data received over the PCIe bus, in bytes per second."
    ),
    f!(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        Gauge,
        true,
        N(
            Metric::GpmNvlinkThroughput,
            &[("network.io.direction", "transmit")],
            1.0
        ),
        "The rate of data transmitted over NVLink, in bytes per second."
    ),
    f!(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        Gauge,
        true,
        N(
            Metric::GpmNvlinkThroughput,
            &[("network.io.direction", "receive")],
            1.0
        ),
        "The rate of data received over NVLink, in bytes per second."
    ),
];

/// The field named `name`.
pub fn get(name: &str) -> Option<&'static Field> {
    FIELDS.iter().find(|f| f.name == name)
}

/// METRICS.md's compatibility table: every field, where its value comes from, or why none.
pub fn markdown() -> String {
    use std::fmt::Write as _;
    let mut out = String::from(
        "\n## dcgm-exporter compatibility (`[sinks.dcgm]`)\n\n\
         The fields `[sinks.dcgm]` serves under dcgm-exporter's names, labels and units \
         (docs/MIGRATING.md). `default` marks dcgm-exporter's default counter set \
         (`etc/default-counters.csv`, which its DCP set equals); a counters file in its CSV \
         format selects any of these. On a MIG-enabled GPU every row is a GPU instance's, as \
         dcgm-exporter's are (`GPU_I_PROFILE`, `GPU_I_ID`, the parent GPU's `UUID`; compute \
         instances share their GPU instance's row): `FB_USED`/`FB_FREE`/`FB_TOTAL` and the \
         `PROF_*` fields are the instance's own readings (`gpu.mig.memory.*`, GPM per GPU \
         instance), the rest the GPU's; `FB_RESERVED` and the utilisations NVML does not \
         give in MIG mode are left out.\n\n\
         | field | type | default | value | from |\n|---|---|---|---|---|\n",
    );
    for f in FIELDS {
        let (value, from) = match f.source {
            Source::Nvml(m, attrs, k) => {
                let sel = attrs
                    .iter()
                    .map(|(a, v)| format!("{a}={v}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let d = m.desc();
                let scale = if (k - 1.0).abs() < f64::EPSILON {
                    String::new()
                } else {
                    format!(" × {k}")
                };
                (
                    format!(
                        "{}{}",
                        if f.int { "integer" } else { "six decimals" },
                        scale
                    ),
                    if sel.is_empty() {
                        format!("`{}` ({})", d.name, d.unit)
                    } else {
                        format!("`{}{{{sel}}}` ({})", d.name, d.unit)
                    },
                )
            }
            Source::Sum(m, k) => (
                format!("integer, the sum × {k}"),
                format!("every `{}` sample of the GPU", m.desc().name),
            ),
            Source::LastXid => (
                "the last XID code (0: none), with `err_code` and `err_msg`".into(),
                "the kernel log and NVML events (this boot)".into(),
            ),
            Source::Driver => (
                "a label on every line".into(),
                "NVML's driver version".into(),
            ),
            Source::None(why) => ("not served".into(), why.to_string()),
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {value} | {from} |",
            f.name,
            f.kind.as_str(),
            if DEFAULT.contains(&f.name) { "yes" } else { "" }
        );
    }
    out
}

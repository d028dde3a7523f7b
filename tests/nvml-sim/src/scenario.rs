//! Scenario files: what the simulated node looks like and how its values move over time.
//!
//! A scenario is TOML. `[defaults]` describes every GPU; `[[gpus]]` entries override it for
//! the GPU at the same position; `gpu_count` says how many GPUs exist. Values are numbers or
//! time functions (ramp, step, sine) of the seconds since `nvmlInit`.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The whole scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Another scenario file (relative to this one) that this one modifies: tables merge
    /// key by key, everything else replaces.
    #[serde(default)]
    pub base: Option<String>,
    /// Number of GPUs on the node.
    pub gpu_count: u32,
    /// Driver, CUDA and NVML versions.
    #[serde(default)]
    pub driver: Driver,
    /// What every GPU looks like unless `[[gpus]]` says otherwise.
    #[serde(default)]
    pub defaults: GpuSpec,
    /// Per-GPU overrides, by position.
    #[serde(default)]
    pub gpus: Vec<GpuSpec>,
    /// Injected faults.
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// XID events delivered through `nvmlEventSetWait`.
    #[serde(default)]
    pub events: Vec<XidEvent>,
}

/// Driver-level versions.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Driver {
    /// `nvmlSystemGetDriverVersion`.
    pub version: String,
    /// `nvmlSystemGetNVMLVersion`.
    pub nvml_version: String,
    /// `nvmlSystemGetCudaDriverVersion_v2`, e.g. 12040 for 12.4.
    pub cuda_version: i32,
    /// The library build the scenario expects: "current", "legacy" (an old driver whose
    /// newer symbols are absent), "r535" (a 535.43–535.86 driver whose `_v3` process lists
    /// fill 32-byte entries) or "future" (no symbols that CUDA 13 deprecates). Each is a
    /// build of this crate with the feature of the same name (`current` has none).
    pub variant: String,
    /// Driver defects to reproduce at run time:
    /// - `memory_temp_value_type_double`: field 82 (`NVML_FI_DEV_MEMORY_TEMP`) says its
    ///   `valueType` is double while the payload is the unsigned integer (seen on R545).
    pub quirks: Vec<String>,
}

impl Default for Driver {
    fn default() -> Self {
        Self {
            version: "550.54.15".into(),
            nvml_version: "12.550.54.15".into(),
            cuda_version: 12040,
            variant: "current".into(),
            quirks: Vec::new(),
        }
    }
}

/// One GPU. Every field is optional so that `[[gpus]]` entries can override `[defaults]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuSpec {
    pub name: Option<String>,
    /// Defaults to a UUID derived from `uuid_seed` and the index (`[defaults]` values of
    /// `uuid` and `serial` apply only to single-GPU scenarios).
    pub uuid: Option<String>,
    pub uuid_seed: Option<u32>,
    pub serial: Option<String>,
    /// PCI bus number (the `bb` of `0000:bb:00.0`); defaults to 0x10 + index.
    pub pci_bus: Option<u32>,
    /// PCI domain (the `dddd` of `dddd:bb:00.0`); defaults to 0.
    pub pci_domain: Option<u32>,
    pub pci_device_id: Option<u32>,
    pub minor_number: Option<u32>,
    pub vbios_version: Option<String>,
    /// GSP firmware version; without it GSP is off (its calls answer NOT_SUPPORTED).
    pub gsp_firmware_version: Option<String>,
    /// The NVLink fabric's cluster UUID (hex, dashes ignored).
    pub fabric_cluster_uuid: Option<String>,
    pub num_fans: Option<u32>,
    pub nvlink_count: Option<u32>,
    pub gpm_supported: Option<bool>,
    /// Added to every default process pid, times the GPU index (distinct pids per GPU).
    pub pid_stride: Option<u32>,
    /// Named values (see `values.md` in the simulator crate for the list); numbers or
    /// time functions.
    pub values: BTreeMap<String, ValueSpec>,
    pub processes: Option<Vec<Process>>,
    pub mig: Option<Mig>,
}

/// A process on a GPU (or a MIG instance).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Process {
    pub pid: u32,
    #[serde(default = "default_process_name")]
    pub name: String,
    /// "compute" or "graphics".
    #[serde(default = "default_process_kind")]
    pub kind: String,
    /// Device memory used; absent means the driver reports `NVML_VALUE_NOT_AVAILABLE`.
    #[serde(default)]
    pub used_mib: Option<u64>,
    #[serde(default)]
    pub sm_util: u32,
    #[serde(default)]
    pub mem_util: u32,
    #[serde(default)]
    pub enc_util: u32,
    #[serde(default)]
    pub dec_util: u32,
}

fn default_process_name() -> String {
    "python3".into()
}
fn default_process_kind() -> String {
    "compute".into()
}

/// MIG layout of a GPU.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mig {
    /// MIG mode at init.
    pub enabled: bool,
    /// MIG mode flips at each of these times (seconds after init), as `nvidia-smi -mig`
    /// followed by a GPU reset would do on a live node.
    #[serde(default)]
    pub toggle_at_secs: Vec<f64>,
    #[serde(default)]
    pub instances: Vec<MigInstance>,
}

/// One MIG device: a compute instance in a GPU instance. Several entries with the same
/// `gpu_instance_id` are compute instances sharing one GPU instance.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigInstance {
    pub uuid: String,
    /// The GPU instance's profile ("1g.10gb"): a MIG device's name is the GPU's name, then
    /// "MIG", then this (as CUDA and NVML name a MIG device: "NVIDIA A100-SXM4-40GB MIG
    /// 1g.5gb"); absent, the name ends at "MIG".
    #[serde(default)]
    pub profile: Option<String>,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub memory_total_mib: u64,
    pub memory_used_mib: ValueSpec,
    #[serde(default)]
    pub processes: Vec<Process>,
    /// This instance's own values (the `gpm_*` keys, for `nvmlGpmMigSampleGet`).
    #[serde(default)]
    pub values: BTreeMap<String, ValueSpec>,
}

/// A fault injected into calls.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// The NVML function name, or "*" for every per-device call.
    pub call: String,
    /// GPU index; every GPU when absent.
    pub gpu: Option<u32>,
    /// "not_supported", "gpu_lost", "reset_required", "unknown", "delay" or "hang".
    pub kind: String,
    /// Active from this many seconds after init.
    #[serde(default)]
    pub from_secs: f64,
    /// Active until this many seconds after init (for ever when absent).
    #[serde(default)]
    pub until_secs: Option<f64>,
    /// For "delay": how long the call takes.
    #[serde(default)]
    pub delay_ms: u64,
    /// For "unknown": fail one call in `every` (1 = every call).
    #[serde(default = "one")]
    pub every: u64,
}

fn one() -> u64 {
    1
}

/// An XID event for `nvmlEventSetWait`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XidEvent {
    pub gpu: u32,
    pub at_secs: f64,
    pub xid: u64,
}

/// A value: a constant or a function of time since init.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ValueSpec {
    Const(f64),
    Ramp(Ramp),
    Step(Step),
    Sine(Sine),
    Approach(Approach),
    Steps(Steps),
}

/// A value that changes at given times: `{ steps = [[0, 3], [20, 2], [40, 3]] }` (seconds
/// after init, value); before the first step, its value.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Steps {
    pub steps: Vec<(f64, f64)>,
}

/// An exponential approach from `start` to `target` with time constant `tau_secs` (a load
/// step settling: how a temperature reaches its plateau).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approach {
    pub start: f64,
    pub target: f64,
    pub tau_secs: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ramp {
    pub from: f64,
    pub to: f64,
    pub over_secs: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub before: f64,
    pub after: f64,
    pub at_secs: f64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sine {
    pub mean: f64,
    pub amplitude: f64,
    pub period_secs: f64,
}

impl ValueSpec {
    /// The value `t` seconds after init. Ramps hold their end value; counters use ramps with a
    /// long `over_secs` so that they keep rising.
    pub fn at(&self, t: f64) -> f64 {
        match self {
            ValueSpec::Const(v) => *v,
            ValueSpec::Ramp(r) => {
                if r.over_secs <= 0.0 || t >= r.over_secs {
                    r.to
                } else {
                    r.from + (r.to - r.from) * (t / r.over_secs)
                }
            }
            ValueSpec::Step(s) => {
                if t < s.at_secs {
                    s.before
                } else {
                    s.after
                }
            }
            ValueSpec::Steps(s) => s
                .steps
                .iter()
                .rev()
                .find(|(at, _)| *at <= t)
                .or(s.steps.first())
                .map_or(0.0, |(_, v)| *v),
            ValueSpec::Approach(a) => {
                a.target - (a.target - a.start) * (-t / a.tau_secs.max(1e-9)).exp()
            }
            ValueSpec::Sine(s) => {
                let period = if s.period_secs > 0.0 {
                    s.period_secs
                } else {
                    1.0
                };
                s.mean + s.amplitude * (t * std::f64::consts::TAU / period).sin()
            }
        }
    }
}

/// A GPU's named values, hashed: every simulated NVML call looks one or two up, and an
/// ordered map's search by name was a third of the simulator's cost under a 1 s collection.
pub type Values = std::collections::HashMap<String, ValueSpec, foldhash::fast::RandomState>;

/// A GPU with defaults applied.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub serial: String,
    pub pci_bus: u32,
    pub pci_domain: u32,
    pub pci_device_id: u32,
    pub minor_number: u32,
    pub vbios_version: String,
    pub gsp_firmware_version: String,
    pub fabric_cluster_uuid: String,
    pub num_fans: u32,
    pub nvlink_count: u32,
    pub gpm_supported: bool,
    pub values: Values,
    pub processes: Vec<Process>,
    pub mig: Option<Mig>,
}

impl Gpu {
    /// The named value at time `t`, or `None` if the scenario does not define it.
    pub fn value(&self, key: &str, t: f64) -> Option<f64> {
        self.values.get(key).map(|v| v.at(t))
    }

    /// PCI bus id as NVML prints it (`00000000:bb:00.0`).
    pub fn bus_id(&self) -> String {
        format!("{:08X}:{:02X}:00.0", self.pci_domain, self.pci_bus)
    }
}

impl Scenario {
    /// Parses a scenario file's text (without `base` resolution).
    pub fn parse(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// Reads a scenario file, applying its `base` chain.
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        let table = load_table(path, 0)?;
        table
            .try_into()
            .map_err(|e: toml::de::Error| format!("{}: {e}", path.display()))
    }

    /// The GPUs with `[defaults]` and `[[gpus]]` merged.
    pub fn resolve(&self) -> Vec<Gpu> {
        (0..self.gpu_count)
            .map(|i| {
                let d = &self.defaults;
                let o = self.gpus.get(i as usize).cloned().unwrap_or_default();
                let seed = o.uuid_seed.or(d.uuid_seed).unwrap_or(0x5eed);
                // The GPU's own values win over the defaults.
                let values: Values = d
                    .values
                    .iter()
                    .chain(&o.values)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                let stride = o.pid_stride.or(d.pid_stride).unwrap_or(0);
                let processes = match o.processes.clone() {
                    Some(p) => p,
                    None => d
                        .processes
                        .clone()
                        .unwrap_or_default()
                        .into_iter()
                        .map(|mut p| {
                            p.pid += stride * i;
                            p
                        })
                        .collect(),
                };
                Gpu {
                    index: i,
                    name: o
                        .name
                        .or(d.name.clone())
                        .unwrap_or_else(|| "NVIDIA H100 80GB HBM3".into()),
                    uuid: o
                        .uuid
                        .or_else(|| d.uuid.clone().filter(|_| self.gpu_count == 1))
                        .unwrap_or_else(|| {
                            format!(
                                "GPU-{seed:08x}-{i:04x}-4{i:03x}-8000-{:012x}",
                                u64::from(seed) * 31 + u64::from(i)
                            )
                        }),
                    serial: o
                        .serial
                        .or_else(|| d.serial.clone().filter(|_| self.gpu_count == 1))
                        .unwrap_or_else(|| {
                            format!(
                                "{}",
                                1_650_000_000_000u64 + u64::from(seed) * 100 + u64::from(i)
                            )
                        }),
                    pci_bus: o.pci_bus.or(d.pci_bus.map(|b| b + i)).unwrap_or(0x10 + i),
                    pci_domain: o.pci_domain.or(d.pci_domain).unwrap_or(0),
                    pci_device_id: o.pci_device_id.or(d.pci_device_id).unwrap_or(0x2330_10de),
                    minor_number: o.minor_number.unwrap_or(i),
                    vbios_version: o
                        .vbios_version
                        .or(d.vbios_version.clone())
                        .unwrap_or_else(|| "96.00.74.00.01".into()),
                    gsp_firmware_version: o
                        .gsp_firmware_version
                        .or(d.gsp_firmware_version.clone())
                        .unwrap_or_default(),
                    fabric_cluster_uuid: o
                        .fabric_cluster_uuid
                        .or(d.fabric_cluster_uuid.clone())
                        .unwrap_or_default(),
                    num_fans: o.num_fans.or(d.num_fans).unwrap_or(0),
                    nvlink_count: o.nvlink_count.or(d.nvlink_count).unwrap_or(0),
                    gpm_supported: o.gpm_supported.or(d.gpm_supported).unwrap_or(false),
                    values,
                    processes,
                    mig: o.mig.or(d.mig.clone()),
                }
            })
            .collect()
    }
}

fn load_table(path: &std::path::Path, depth: usize) -> Result<toml::Table, String> {
    if depth > 8 {
        return Err(format!("{}: `base` chain is too deep", path.display()));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut table: toml::Table =
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let Some(base) = table.remove("base") else {
        return Ok(table);
    };
    let base = base
        .as_str()
        .ok_or_else(|| format!("{}: `base` must be a file name", path.display()))?;
    let base_path = path
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .join(base);
    let mut merged = load_table(&base_path, depth + 1)?;
    merge(&mut merged, table);
    Ok(merged)
}

/// Deep-merges `over` into `into`: tables key by key, other values replace.
fn merge(into: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (into.get_mut(&k), v) {
            (Some(toml::Value::Table(a)), toml::Value::Table(b)) => merge(a, b),
            (_, v) => {
                into.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_functions() {
        let ramp = ValueSpec::Ramp(Ramp {
            from: 10.0,
            to: 20.0,
            over_secs: 10.0,
        });
        assert_eq!(ramp.at(5.0), 15.0);
        assert_eq!(ramp.at(50.0), 20.0);
        let step = ValueSpec::Step(Step {
            before: 1.0,
            after: 2.0,
            at_secs: 3.0,
        });
        assert_eq!(step.at(2.9), 1.0);
        assert_eq!(step.at(3.0), 2.0);
        let sine = ValueSpec::Sine(Sine {
            mean: 50.0,
            amplitude: 10.0,
            period_secs: 4.0,
        });
        assert!((sine.at(1.0) - 60.0).abs() < 1e-9);
    }

    #[test]
    fn defaults_merge_with_overrides() {
        let s = Scenario::parse(
            r#"
            gpu_count = 2
            [defaults]
            name = "A"
            pid_stride = 100
            processes = [{ pid = 10, used_mib = 5 }]
            [defaults.values]
            temp_gpu = 40
            [[gpus]]
            name = "B"
            [gpus.values]
            temp_gpu = { from = 1, to = 2, over_secs = 1 }
            "#,
        )
        .expect("parses");
        let g = s.resolve();
        assert_eq!(g[0].name, "B");
        assert_eq!(g[1].name, "A");
        assert_eq!(g[0].value("temp_gpu", 10.0), Some(2.0));
        assert_eq!(g[1].value("temp_gpu", 10.0), Some(40.0));
        assert_eq!(g[1].processes[0].pid, 110);
        assert_ne!(g[0].uuid, g[1].uuid);
    }
}

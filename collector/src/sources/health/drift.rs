//! How the GPU and the node are set up against what the fleet expects (`[expect]`), and the
//! fabric manager; the fabric's own rules are in `fabric.rs`:
//!
//! | reason | when | state | action | from |
//! |---|---|---|---|---|
//! | `config_drift` | a setting differs from `[expect]` (each one named in the detail and as `node.config.drift{junction.setting}`) | degraded | none | GPUd persistence-mode, ECC and GPU-count checks; DCGM `DCGM_FR_PERSISTENCE_MODE` |
//! | `fabric_manager_down` | `nv-fabricmanager` is expected (`[expect] daemons`) and not running, or it restarted since the last evaluation | failed / degraded | none | GPUd fabric-manager check; NVSentinel `FABRIC_MANAGER_NOT_RUNNING` / `FABRIC_MANAGER_FLAPPING` |

use std::collections::BTreeMap;

use crate::config::{Invalid, config_section};
use crate::model::health::{Action, Code, Finding};
use crate::model::{GpuSlot, HealthState, Metric, Model, Sample};

use super::fabric::{fabric_and_modes, nvlink, p2p};
use super::rules::{find, samples};

config_section! {
    /// `[expect]`: how every node of the fleet must be set up. Each setting left out is not
    /// checked; each mismatch is a `config_drift` reason (degraded) on the GPUs it concerns,
    /// naming the setting, and a `node_config_drift{junction_setting}` series.
    pub struct ExpectConfig {
        /// Persistence mode on (true) or off (false) on every GPU.
        pub persistence_mode: Option<bool> = None,
        /// ECC on (true) or off (false) on every GPU (the current mode; a pending change is
        /// `mode_change_pending`).
        pub ecc: Option<bool> = None,
        /// The compute mode of every GPU: "default", "exclusive_process", "prohibited".
        pub compute_mode: String = String::new(),
        /// The driver versions allowed (e.g. ["570.172.08"]); [] checks none.
        pub driver_versions: Vec<String> = Vec::new(),
        /// The CUDA driver versions allowed (e.g. ["12.8"]).
        pub cuda_versions: Vec<String> = Vec::new(),
        /// The GSP firmware versions allowed (as NVML reports them).
        pub gsp_firmware_versions: Vec<String> = Vec::new(),
        /// Kernel modules that must be loaded: of nvidia, nvidia_uvm, nvidia_modeset,
        /// nvidia_drm, nvidia_peermem, nvidia_fs.
        pub modules: Vec<String> = Vec::new(),
        /// Daemons that must run: of nvidia-persistenced, nv-fabricmanager, nvidia-imex,
        /// nv-hostengine.
        pub daemons: Vec<String> = Vec::new(),
        /// The fabric state every GPU must be in: "completed" (NVSwitch systems, GB200).
        pub fabric: String = String::new(),
        /// GPUs NVML must list; 0 checks none.
        pub gpus: u32 = 0,
    }
}

const COMPUTE_MODES: &[&str] = &[
    "default",
    "exclusive_thread",
    "prohibited",
    "exclusive_process",
];
const FABRIC_STATES: &[&str] = &["not_started", "in_progress", "completed"];

impl ExpectConfig {
    /// Adds every problem with this section to `out`.
    pub fn validate(&self, prefix: &str, out: &mut Vec<Invalid>) {
        let mut one_of = |key: &str, v: &str, allowed: &[&str]| {
            if !allowed.contains(&v) {
                out.push(Invalid {
                    key: format!("{prefix}.{key}"),
                    message: format!("{v:?} is not one of {}", allowed.join(", ")),
                });
            }
        };
        if !self.compute_mode.is_empty() {
            one_of("compute_mode", &self.compute_mode, COMPUTE_MODES);
        }
        if !self.fabric.is_empty() {
            one_of("fabric", &self.fabric, FABRIC_STATES);
        }
        for m in &self.modules {
            one_of("modules", m, crate::sources::host::MODULES);
        }
        for d in &self.daemons {
            one_of("daemons", d, crate::sources::host::DAEMONS);
        }
    }
}

/// What the node says, read once per evaluation.
#[derive(Debug, Default)]
pub struct Node {
    modules: BTreeMap<String, bool>,
    daemons: BTreeMap<String, (bool, f64)>,
    driver: Option<crate::model::DriverInfo>,
    gpus: usize,
}

impl Node {
    /// Reads the host source's series and the driver.
    pub fn read(model: &Model) -> Self {
        let mut n = Node {
            driver: model.driver(),
            gpus: model.snapshot().len(),
            ..Node::default()
        };
        for set in model.sets() {
            for s in set.iter() {
                match s.metric {
                    Metric::KernelModule => {
                        if let Some(m) = s.attr("kernel.module") {
                            n.modules.insert(m.to_string(), s.value > 0.5);
                        }
                    }
                    Metric::DaemonUp | Metric::DaemonRestarts => {
                        if let Some(d) = s.attr("node.daemon") {
                            let e = n.daemons.entry(d.to_string()).or_default();
                            if s.metric == Metric::DaemonUp {
                                e.0 = s.value > 0.5;
                            } else {
                                e.1 = s.value;
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        n
    }
}

/// The settings of one GPU that differ from `[expect]`: (setting, what it is).
pub fn mismatches(slot: &GpuSlot, node: &Node, x: &ExpectConfig) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let v = |m: Metric, attrs: &[(&str, &str)]| find(samples(slot), m, attrs);
    let on = |b: bool| if b { "on" } else { "off" };
    let settings = [
        (
            "persistence_mode",
            x.persistence_mode,
            v(Metric::PersistenceMode, &[]),
        ),
        (
            "ecc",
            x.ecc,
            v(Metric::EccMode, &[("gpu.mode.setting", "current")]),
        ),
    ];
    for (key, want, is) in settings {
        if let (Some(want), Some(is)) = (want, is)
            && (is > 0.5) != want
        {
            out.push((key, format!("expected {}, is {}", on(want), on(is > 0.5))));
        }
    }
    let current = |m: Metric, key: &str| {
        samples(slot)
            .find(|s| s.metric == m && s.value > 0.5)
            .and_then(|s| s.attr(key))
            .map(str::to_string)
    };
    if !x.compute_mode.is_empty()
        && let Some(is) = current(Metric::ComputeMode, "gpu.compute_mode")
        && is != x.compute_mode
    {
        out.push((
            "compute_mode",
            format!("expected {}, is {is}", x.compute_mode),
        ));
    }
    if !x.fabric.is_empty() {
        let is = current(Metric::FabricState, "gpu.fabric.state")
            .unwrap_or_else(|| "none (no fabric state)".into());
        if is != x.fabric {
            out.push(("fabric", format!("expected {}, is {is}", x.fabric)));
        }
    }
    if !x.gsp_firmware_versions.is_empty() {
        let is = samples(slot)
            .find(|s| s.metric == Metric::GspFirmware)
            .map(|s| s.attr("hw.firmware_version").unwrap_or("").to_string());
        if let Some(is) = is
            && !x.gsp_firmware_versions.contains(&is)
        {
            out.push((
                "gsp_firmware_versions",
                format!(
                    "{is:?} is not one of {}",
                    x.gsp_firmware_versions.join(", ")
                ),
            ));
        }
    }
    node_mismatches(node, x, &mut out);
    out
}

/// The node's settings that differ from `[expect]`.
fn node_mismatches(node: &Node, x: &ExpectConfig, out: &mut Vec<(&'static str, String)>) {
    if let Some(d) = &node.driver {
        if !x.driver_versions.is_empty() && !x.driver_versions.contains(&d.driver_version) {
            out.push((
                "driver_versions",
                format!(
                    "{} is not one of {}",
                    d.driver_version,
                    x.driver_versions.join(", ")
                ),
            ));
        }
        if let Some(c) = &d.cuda_version
            && !x.cuda_versions.is_empty()
            && !x.cuda_versions.contains(c)
        {
            out.push((
                "cuda_versions",
                format!("{c} is not one of {}", x.cuda_versions.join(", ")),
            ));
        }
    }
    let missing = |want: &[String], have: &dyn Fn(&str) -> Option<bool>| -> Vec<String> {
        want.iter()
            .filter(|w| have(w) == Some(false))
            .cloned()
            .collect()
    };
    let m = missing(&x.modules, &|w| node.modules.get(w).copied());
    if !m.is_empty() {
        out.push(("modules", format!("not loaded: {}", m.join(", "))));
    }
    let d = missing(&x.daemons, &|w| node.daemons.get(w).map(|d| d.0));
    if !d.is_empty() {
        out.push(("daemons", format!("not running: {}", d.join(", "))));
    }
    if x.gpus > 0 && node.gpus != x.gpus as usize {
        out.push((
            "gpus",
            format!("expected {}, NVML lists {}", x.gpus, node.gpus),
        ));
    }
}

/// Evaluates `[expect]` and the fabric manager: per-GPU findings, and the drift series.
#[derive(Debug, Default)]
pub struct Drift {
    fm_restarts: Option<f64>,
    effective_errors: BTreeMap<String, Option<f64>>,
    p2p_best: BTreeMap<String, BTreeMap<String, f64>>,
    /// `health.nvlink_effective_ber_max`.
    ber_max: f64,
}

impl Drift {
    /// With the NVLink5 effective-BER threshold.
    pub fn new(ber_max: f64) -> Self {
        Self {
            ber_max,
            ..Self::default()
        }
    }

    /// The findings of every GPU (by UUID), and the `node.config.drift` series into `out`.
    pub fn evaluate(
        &mut self,
        model: &Model,
        x: &ExpectConfig,
        out: &mut Vec<Sample>,
    ) -> BTreeMap<String, Vec<Finding>> {
        let node = Node::read(model);
        let mut by_gpu: BTreeMap<String, Vec<Finding>> = BTreeMap::new();
        let mut settings: BTreeMap<&'static str, ()> = BTreeMap::new();
        let fm = node.daemons.get("nv-fabricmanager").copied();
        let restarted = match (self.fm_restarts, fm) {
            (Some(before), Some((_, now))) => now > before,
            _ => false,
        };
        self.fm_restarts = fm.map(|f| f.1);
        let fm_expected = x.daemons.iter().any(|d| d == "nv-fabricmanager");
        let fm_down = fm_expected && fm.is_some_and(|f| !f.0);
        for slot in model.snapshot() {
            let mut f = fabric_and_modes(&slot);
            let last = self
                .effective_errors
                .entry(slot.info.uuid.clone())
                .or_default();
            f.extend(nvlink(&slot, self.ber_max, last));
            let best = self.p2p_best.entry(slot.info.uuid.clone()).or_default();
            f.extend(p2p(&slot, best));
            let m = mismatches(&slot, &node, x);
            if !m.is_empty() {
                for (k, _) in &m {
                    settings.insert(k, ());
                }
                f.push(Finding {
                    code: Code::ConfigDrift,
                    state: HealthState::Degraded,
                    action: Action::None,
                    detail: m
                        .iter()
                        .map(|(k, v)| format!("{k}: {v}"))
                        .collect::<Vec<_>>()
                        .join("; "),
                });
            }
            if fm_down || restarted {
                f.push(Finding {
                    code: Code::FabricManagerDown,
                    state: if fm_down {
                        HealthState::Failed
                    } else {
                        HealthState::Degraded
                    },
                    action: Action::None,
                    detail: if fm_down {
                        "nv-fabricmanager is not running: NVLink traffic through the NVSwitches stops; start nvidia-fabricmanager".into()
                    } else {
                        "nv-fabricmanager restarted".into()
                    },
                });
            }
            by_gpu.insert(slot.info.uuid.clone(), f);
        }
        for k in settings.keys() {
            out.push(Sample::new(Metric::ConfigDrift, 1.0).with("junction.setting", *k));
        }
        by_gpu
    }
}

//! The NVML source: per-GPU and per-MIG-instance state through `nvml-wrapper`.
//!
//! Reads: `libnvidia-ml.so.1` (or `library`), which needs access to `/dev/nvidia*` (root or the
//! `video` group; in a container, the NVIDIA runtime's device mounts).
//!
//! How it fails: building fails loudly if the library cannot be loaded or initialised. Once
//! running, one thread collects every GPU in turn: a call that returns `NOT_SUPPORTED` or is
//! missing from the driver disables that feature (one NVLink link, fan or counter at a time)
//! for that GPU, listed by `junction inventory`; NOT_SUPPORTED features are tried again when
//! MIG mode or the GPU's state changes and every `reprobe_interval_secs`. A call that hangs past
//! `call_timeout_ms` marks that GPU as stuck and the watchdog starts another thread for the
//! other GPUs (one more for each GPU held); the watchdog reports every stuck GPU, but a
//! driver defect that orphans a lock can hang every later call on every GPU
//! (NVIDIA/open-gpu-kernel-modules#1333), and then every GPU is reported stuck. A GPU that
//! falls off the bus or needs a reset is reported failed and probed with backoff.

mod collect;
mod crew;
mod disabled;
mod events;
mod report;
mod seat;
mod worker;

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

use crate::agent::{Component, Ctx, SHUTDOWN_DEADLINE};
use crate::config::{Config, Invalid, config_section};
use crate::model::{DriverInfo, GpuInfo, Group, Model};
pub use crate::shutdown::Shutdown;
use collect::V3Layout;
pub use crew::Workers;

config_section! {
    /// `[sources.nvml]`
    pub struct NvmlConfig {
        /// Poll NVML. Default: true.
        pub enabled: bool = true,
        /// The NVML library: a bare name is looked up by the dynamic loader, a path is opened
        /// as is. Default: "libnvidia-ml.so.1".
        pub library: String = "libnvidia-ml.so.1".into(),
        /// Loading NVML and reading every GPU's identity may take this long (it takes
        /// seconds per GPU without persistence mode); past it the source is reported down and
        /// the other sources and sinks go on. Default: 60.
        pub init_timeout_secs: u64 = 60,
        /// An NVML call running longer than this marks its GPU as stuck
        /// (`junction_nvml_stuck`); the other GPUs keep updating. Default: 2000.
        pub call_timeout_ms: u64 = 2000,
        /// At most this many processes are reported per GPU (the ones using the most
        /// memory), bounding label cardinality. Default: 64.
        pub max_processes_per_gpu: u32 = 64,
        /// A lost GPU (or one that needs a reset) is retried after 1 s, then with doubling
        /// waits up to this. Default: 60.
        pub lost_retry_max_secs: u64 = 60,
        /// Features a GPU answered NOT_SUPPORTED for are tried again this often (and at once
        /// when MIG mode or the GPU's state changes). Default: 600.
        pub reprobe_interval_secs: u64 = 600,
        /// Also take XIDs from NVML events (nvmlEventSetWait), a second path beside the kernel
        /// log; an XID seen by both is counted once. Default: true.
        pub xid_events: bool = true,
        /// Metric groups, each enabled and scheduled on its own. A training node wants
        /// seconds; an inference node tolerates tens of seconds.
        pub groups: GroupsConfig = GroupsConfig::default(),
    }
}

config_section! {
    /// `[sources.nvml.groups]`: one table per metric group.
    pub struct GroupsConfig {
        /// GPU, memory, encoder, decoder utilization. Default interval: 5 s.
        pub utilization: GroupConfig = GroupConfig::every(5),
        /// Framebuffer and BAR1 memory. Default interval: 5 s.
        pub memory: GroupConfig = GroupConfig::every(5),
        /// Power, power limits, energy. Default interval: 5 s.
        pub power: GroupConfig = GroupConfig::every(5),
        /// Die and memory-junction temperature, thresholds, fans. Default interval: 5 s.
        pub temperature: GroupConfig = GroupConfig::every(5),
        /// Clocks, performance state, clock event reasons, violation time. Default: 10 s.
        pub clocks: GroupConfig = GroupConfig::every(10),
        /// ECC, retired pages, remapped rows, recovery action. Default interval: 30 s.
        pub errors: GroupConfig = GroupConfig::every(30),
        /// PCIe throughput, replays, link state. Default interval: 10 s.
        pub pcie: GroupConfig = GroupConfig::every(10),
        /// NVLink state, throughput, errors per link. Default interval: 10 s.
        pub nvlink: GroupConfig = GroupConfig::every(10),
        /// Processes with their memory and utilization. Default interval: 5 s.
        pub processes: GroupConfig = GroupConfig::every(5),
        /// MIG mode and instances. Default interval: 10 s.
        pub mig: GroupConfig = GroupConfig::every(10),
        /// GPM profiling metrics (Hopper and newer), averaged over the interval. Default: 10 s.
        pub gpm: GroupConfig = GroupConfig::every(10),
        /// Persistence, ECC and compute mode, the GSP firmware, the NVLink fabric
        /// registration and its health. Default interval: 10 s.
        pub config: GroupConfig = GroupConfig::every(10),
    }
}

config_section! {
    /// One metric group.
    pub struct GroupConfig {
        /// Collect this group. Default: true.
        pub enabled: bool = true,
        /// Seconds between collections; 0 takes the group's default.
        pub interval_secs: u64 = 0,
    }
}

impl GroupConfig {
    fn every(secs: u64) -> Self {
        Self {
            enabled: true,
            interval_secs: secs,
        }
    }
}

impl GroupsConfig {
    /// The config and default interval of a group (`None` for the always-on status group).
    pub fn get(&self, g: Group) -> Option<(&GroupConfig, u64)> {
        Some(match g {
            Group::Utilization => (&self.utilization, 5),
            Group::Memory => (&self.memory, 5),
            Group::Power => (&self.power, 5),
            Group::Temperature => (&self.temperature, 5),
            Group::Clocks => (&self.clocks, 10),
            Group::Errors => (&self.errors, 30),
            Group::Pcie => (&self.pcie, 10),
            Group::Nvlink => (&self.nvlink, 10),
            Group::Processes => (&self.processes, 5),
            Group::Mig => (&self.mig, 10),
            Group::Gpm => (&self.gpm, 10),
            Group::Config => (&self.config, 10),
            Group::Status => return None,
        })
    }

    /// Enabled groups with their intervals.
    pub fn schedule(&self) -> Vec<(Group, Duration)> {
        Group::ALL
            .iter()
            .filter_map(|&g| {
                let (c, default) = self.get(g)?;
                let secs = if c.interval_secs == 0 {
                    default
                } else {
                    c.interval_secs
                };
                c.enabled.then(|| (g, Duration::from_secs(secs)))
            })
            .collect()
    }
}

impl NvmlConfig {
    /// Adds every problem with this section to `out`.
    pub fn validate(&self, prefix: &str, out: &mut Vec<Invalid>) {
        if !self.enabled {
            return;
        }
        if self.library.contains('/') && !std::path::Path::new(&self.library).exists() {
            out.push(Invalid {
                key: format!("{prefix}.library"),
                message: format!(
                    "{:?} does not exist; give the path of libnvidia-ml.so.1, or a bare name such as \
                     \"libnvidia-ml.so.1\" to use the loader's search path",
                    self.library
                ),
            });
        }
        if !(10..=600_000).contains(&self.call_timeout_ms) {
            out.push(Invalid {
                key: format!("{prefix}.call_timeout_ms"),
                message: format!("{} is out of range; use 10 to 600000", self.call_timeout_ms),
            });
        }
        if self.init_timeout_secs == 0 {
            out.push(Invalid {
                key: format!("{prefix}.init_timeout_secs"),
                message: "must be at least 1".into(),
            });
        }
        if self.reprobe_interval_secs == 0 {
            out.push(Invalid {
                key: format!("{prefix}.reprobe_interval_secs"),
                message: "must be at least 1".into(),
            });
        }
        if self.lost_retry_max_secs == 0 {
            out.push(Invalid {
                key: format!("{prefix}.lost_retry_max_secs"),
                message: "must be at least 1".into(),
            });
        }
        for g in Group::ALL {
            if let Some((c, _)) = self.groups.get(g)
                && c.interval_secs > 86_400
            {
                out.push(Invalid {
                    key: format!("{prefix}.groups.{}.interval_secs", g.name()),
                    message: format!(
                        "{} is more than a day; use 1 to 86400 (0 = default)",
                        c.interval_secs
                    ),
                });
            }
        }
    }
}

/// The NVML source.
pub const COMPONENT: Component = Component {
    name: "nvml",
    enabled: |c| c.sources.nvml.enabled,
    start: |c, ctx| Box::pin(async move { Ok(tokio::spawn(run(c, ctx))) }),
    once: Some(|c, model| {
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                NvmlSource::build(&c.sources.nvml, model).map(|s| s.collect_once())
            })
            .await??;
            Ok(())
        })
    }),
    inspect: None,
    derive: None,
    off_but_asked: None,
};

/// Builds the source off the async workers (a hung `nvmlInit` must neither hide `/metrics`
/// nor delay SIGTERM), runs its threads, and stops them under the deadline.
async fn run(config: Arc<Config>, ctx: Ctx) {
    // Down until every GPU has been read once (or that has taken its limit, see
    // `crew::start`): /healthz answers 503 meanwhile.
    ctx.model.set_source_up("nvml", false);
    let (model, shutdown) = (ctx.model.clone(), ctx.shutdown.clone());
    let build = tokio::task::spawn_blocking(move || {
        NvmlSource::build(&config.sources.nvml, model).map(|s| s.start(shutdown))
    });
    let model = ctx.model.clone();
    let workers = tokio::select! {
        built = build => match built {
            Ok(Ok(w)) => {
                model.set_inventory_known();
                w
            }
            Ok(Err(e)) => {
                model.set_inventory_known();
                // One failing source never stops the others: report it and go on.
                tracing::error!(error = %e, "NVML source failed to start; serving without it");
                return;
            }
            Err(e) => {
                model.set_inventory_known();
                tracing::error!(error = %e, "NVML start-up task failed; serving without it");
                return;
            }
        },
        // A source still starting (a hung nvmlInit) is not waited for.
        () = ctx.shutdown.wait() => return,
    };
    ctx.shutdown.wait().await;
    let _ = tokio::task::spawn_blocking(move || workers.stop(SHUTDOWN_DEADLINE)).await;
}

/// Why the NVML source could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Loading or initialising the library failed.
    #[error(
        "cannot initialise NVML from {library:?} ({detail}). Install the NVIDIA driver (it \
         ships libnvidia-ml.so.1), run the container with the NVIDIA container runtime, or \
         set sources.nvml.library to the library's path"
    )]
    Init {
        /// The library asked for.
        library: String,
        /// The innermost cause, said once (not chained).
        detail: String,
    },
    /// Counting GPUs failed.
    #[error("cannot count GPUs through NVML")]
    Count(#[source] NvmlError),
    /// Initialisation did not return in time (a wedged driver).
    #[error(
        "NVML initialisation from {library:?} did not return within {secs} s (sources.nvml.init_timeout_secs)"
    )]
    InitTimeout {
        /// The library asked for.
        library: String,
        /// The deadline.
        secs: u64,
    },
    /// The initialisation thread could not be started.
    #[error("cannot start the NVML initialisation thread")]
    Thread(#[source] std::io::Error),
}

/// A built NVML source: the library is loaded and every GPU is in the model's inventory.
pub struct NvmlSource {
    nvml: Arc<Nvml>,
    model: Arc<Model>,
    config: NvmlConfig,
    layout: V3Layout,
    gpus: Vec<Arc<std::sync::Mutex<crate::model::GpuSlot>>>,
}

impl NvmlSource {
    /// Loads NVML, reads every GPU's identity and adds it to the model.
    pub fn build(config: &NvmlConfig, model: Arc<Model>) -> Result<Self, BuildError> {
        // nvmlInit can hang on a wedged driver: run it on its own thread under a deadline.
        // Nothing is added to the model until it has returned.
        let (tx, rx) = std::sync::mpsc::channel();
        let library = config.library.clone();
        std::thread::Builder::new()
            .name("nvml-init".into())
            .spawn(move || {
                let _ = tx.send(open(&library));
            })
            .map_err(BuildError::Thread)?;
        let timeout = Duration::from_secs(config.init_timeout_secs);
        let (nvml, driver, infos) =
            rx.recv_timeout(timeout)
                .map_err(|_| BuildError::InitTimeout {
                    library: config.library.clone(),
                    secs: config.init_timeout_secs,
                })??;
        let layout = V3Layout::detect(&nvml, &driver.driver_version);
        if layout == V3Layout::R535 {
            tracing::info!(driver = %driver.driver_version, "this driver fills 32-byte process entries in the _v3 process lists; reading them as such");
        }
        model.set_driver(driver);
        let gpus: Vec<_> = infos.into_iter().map(|info| model.add_gpu(info)).collect();
        tracing::info!(gpus = gpus.len(), library = %config.library, "NVML source ready");
        Ok(Self {
            nvml: Arc::new(nvml),
            model,
            config: config.clone(),
            layout,
            gpus,
        })
    }

    /// Starts the collecting thread (the source is up once every GPU has been read once), the
    /// deadline watchdog and (with `xid_events`) the NVML event thread.
    pub fn start(self, shutdown: Shutdown) -> Workers {
        if self.config.xid_events {
            let (nvml, model, sd) = (self.nvml.clone(), self.model.clone(), shutdown.clone());
            let gpus = self.gpus.len() as u32;
            let spawned = std::thread::Builder::new()
                .name("nvml-events".into())
                .spawn(move || events::run(&nvml, &model, gpus, &sd));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start the NVML event thread");
            }
        }
        crew::start(
            self.nvml,
            self.model,
            &self.config,
            self.layout,
            self.gpus,
            shutdown,
            false,
        )
    }

    /// Collects every enabled group once on every GPU and waits for the results (bounded by
    /// `call_timeout_ms` per GPU).
    pub fn collect_once(self) {
        self.model.set_source_up("nvml", true);
        let shutdown = Shutdown::default();
        let workers = crew::start(
            self.nvml,
            self.model,
            &self.config,
            self.layout,
            self.gpus,
            shutdown.clone(),
            true,
        );
        workers.wait_once(
            Duration::from_millis(self.config.call_timeout_ms) * 4 + Duration::from_secs(1),
        );
        shutdown.trigger();
    }
}

/// Loads and initialises NVML and reads the driver and every GPU's identity.
fn open(library: &str) -> Result<(Nvml, DriverInfo, Vec<GpuInfo>), BuildError> {
    let nvml = Nvml::builder()
        .lib_path(OsStr::new(library))
        .init()
        .map_err(|e| BuildError::Init {
            library: library.to_string(),
            detail: innermost(&e),
        })?;
    let driver = DriverInfo {
        driver_version: nvml.sys_driver_version().unwrap_or_default(),
        cuda_version: nvml
            .sys_cuda_driver_version()
            .ok()
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)),
        nvml_version: nvml.sys_nvml_version().ok(),
    };
    let count = nvml.device_count().map_err(BuildError::Count)?;
    let infos = (0..count)
        .map(|index| read_identity(&nvml, index))
        .collect();
    Ok((nvml, driver, infos))
}

/// The innermost message of an error chain ("libnvidia-ml.so.1: cannot open shared object
/// file: No such file or directory"), without the wrappers that repeat it.
fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// Reads a GPU's identity; what cannot be read is left empty.
fn read_identity(nvml: &Nvml, index: u32) -> GpuInfo {
    let mut info = GpuInfo {
        index,
        ..GpuInfo::default()
    };
    match nvml.device_by_index(index) {
        Ok(d) => {
            info.uuid = d.uuid().unwrap_or_else(|_| format!("unknown-{index}"));
            info.name = d.name().unwrap_or_default();
            info.serial = d.serial().ok();
            info.pci_bus_id = d
                .pci_info()
                .map(|p| normalise_bus_id(&p.bus_id))
                .unwrap_or_default();
            info.minor_number = d.minor_number().ok();
            info.vbios = d.vbios_version().ok();
        }
        Err(e) => {
            tracing::error!(gpu = index, error = %e, "cannot open GPU through NVML");
            info.uuid = format!("unknown-{index}");
        }
    }
    info
}

/// `00000000:18:00.0` → `0000:18:00.0` (the form the kernel uses in sysfs and kmsg).
pub fn normalise_bus_id(raw: &str) -> String {
    let raw = raw.trim().to_ascii_lowercase();
    match raw.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            let d = u32::from_str_radix(domain, 16).unwrap_or(0);
            format!("{d:04x}:{rest}")
        }
        _ => raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_are_normalised() {
        assert_eq!(normalise_bus_id("00000000:AB:00.0"), "0000:ab:00.0");
        assert_eq!(normalise_bus_id("0000:3b:00.0"), "0000:3b:00.0");
    }

    #[test]
    fn zero_interval_takes_the_group_default() {
        let mut g = GroupsConfig::default();
        g.utilization.interval_secs = 0;
        g.gpm.enabled = false;
        let s = g.schedule();
        assert_eq!(s[0], (Group::Utilization, Duration::from_secs(5)));
        assert!(!s.iter().any(|(g, _)| *g == Group::Gpm));
    }
}

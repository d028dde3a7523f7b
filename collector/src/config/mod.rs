//! Configuration: TOML with `[sources.<name>]` and `[sinks.<name>]` tables.
//!
//! Every section is declared with [`config_section!`], which produces the serde type, its
//! defaults and its documentation from one place; the example config (`config/junction.toml`)
//! and the reference (`docs/CONFIG.md`) are generated from them (see [`docs`]).

pub mod docs;
mod load;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use load::{load_file, parse_str};

/// Documentation of one field, for the generated example and reference.
pub struct FieldDoc {
    /// The TOML key.
    pub name: &'static str,
    /// The Rust type, as written in the declaration.
    pub ty: &'static str,
    /// The `///` text.
    pub doc: &'static str,
    /// The fields of a nested section (`None` for a scalar).
    pub nested: fn() -> Option<&'static [FieldDoc]>,
    /// For an array of tables (`[[…]]`): the defaults of one element.
    pub element_defaults: fn() -> Option<toml::Table>,
}

/// Types that can describe their fields. Scalars have none.
pub trait Describe {
    /// The fields of this section, or `None` for a scalar.
    fn fields() -> Option<&'static [FieldDoc]> {
        None
    }

    /// For an array of tables: the defaults of one element.
    fn element_defaults() -> Option<toml::Table> {
        None
    }
}

/// A table of strings (`{ cluster = "a", region = "eu" }`).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(transparent)]
pub struct StringMap(pub std::collections::BTreeMap<String, String>);

impl Describe for StringMap {}

/// A table of secrets (auth headers): deserialized like [`StringMap`], but its `Debug` shows
/// the keys only, so that a secret never reaches a log through a debug print.
#[derive(Clone, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(transparent)]
pub struct SecretMap(pub std::collections::BTreeMap<String, String>);

impl std::fmt::Debug for SecretMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|k| (k, "<redacted>")))
            .finish()
    }
}

impl Describe for SecretMap {}

impl<T: Describe + Default + serde::Serialize> Describe for Vec<T> {
    fn fields() -> Option<&'static [FieldDoc]> {
        T::fields()
    }

    fn element_defaults() -> Option<toml::Table> {
        T::fields().and_then(|_| toml::Table::try_from(T::default()).ok())
    }
}
impl<T> Describe for Option<T> {}
impl Describe for bool {}
impl Describe for u32 {}
impl Describe for u64 {}
impl Describe for f64 {}
impl Describe for String {}
impl Describe for PathBuf {}

/// Declares a config section: a serde struct with `deny_unknown_fields`, a `Default` impl
/// from the `= default` expressions and a [`Describe`] impl from the doc comments.
macro_rules! config_section {
    (
        $(#[doc = $sdoc:literal])*
        pub struct $name:ident {
            $(
                $(#[doc = $doc:literal])*
                pub $field:ident : $ty:ty = $default:expr,
            )*
        }
    ) => {
        $(#[doc = $sdoc])*
        #[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct $name {
            $( $(#[doc = $doc])* pub $field: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                Self { $( $field: $default, )* }
            }
        }

        impl $crate::config::Describe for $name {
            fn fields() -> Option<&'static [$crate::config::FieldDoc]> {
                Some(&[ $( $crate::config::FieldDoc {
                    name: stringify!($field),
                    ty: stringify!($ty),
                    doc: concat!($($doc, "\n"),*),
                    nested: <$ty as $crate::config::Describe>::fields,
                    element_defaults: <$ty as $crate::config::Describe>::element_defaults,
                }, )* ])
            }
        }
    };
}
pub(crate) use config_section;

config_section! {
    /// The whole configuration file.
    pub struct Config {
        /// Where the host's `/proc` is: `/host/proc` in a container that mounts the host's.
        /// Process names and container ids are read there; NVML and eBPF report host pids,
        /// so a container needs the host's pid namespace (`hostPID`). Default: "/proc".
        pub proc_root: PathBuf = PathBuf::from("/proc"),
        /// Where the little state that survives a restart is kept (the kernel-log
        /// checkpoint, XID counters, health reasons that hold until a reset or reboot, and
        /// with OTLP delta temporality the counters' last exported values), written atomically. Unwritable: a warning, and every restart starts clean.
        /// Default: "/var/lib/junction".
        pub state_dir: PathBuf = PathBuf::from("/var/lib/junction"),
        /// Where the host's sysfs is: `/host/sys` in a container that mounts it elsewhere.
        /// The nic and pcie sources read it. Default: "/sys".
        pub sysfs_root: PathBuf = PathBuf::from("/sys"),
        /// Once the sources have started (BPF loaded, devices and the kernel log open), drop
        /// every capability but CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (to name other users'
        /// processes) and set no_new_privs. Default: true.
        pub drop_privileges: bool = true,
        /// Where data comes from.
        pub sources: Sources = Sources::default(),
        /// The per-GPU health verdict, its rules and the forecasts.
        pub health: crate::sources::health::HealthConfig = Default::default(),
        /// How the fleet's nodes must be set up (persistence and ECC mode, driver and GSP
        /// versions, kernel modules, daemons, fabric state, GPU count); each mismatch is a
        /// `config_drift` reason naming the setting. Empty: nothing is checked.
        pub expect: crate::sources::health::drift::ExpectConfig = Default::default(),
        /// Where data goes.
        pub sinks: Sinks = Sinks::default(),
    }
}

config_section! {
    /// `[sources.*]`
    pub struct Sources {
        /// NVML: per-GPU and per-MIG-instance state, polled on dedicated threads.
        pub nvml: crate::sources::nvml::NvmlConfig = Default::default(),
        /// The kernel log: XID and SXid errors from /dev/kmsg and kernel-log files.
        pub kmsg: crate::sources::kmsg::KmsgConfig = Default::default(),
        /// eBPF: per-process NVIDIA driver calls, GPU memory and contexts, joined with
        /// containers and pods.
        pub ebpf: crate::sources::ebpf::EbpfConfig = Default::default(),
        /// Redfish: liquid cooling, leak detection and board thermals from BMCs and CDUs.
        pub redfish: crate::sources::redfish::RedfishConfig = Default::default(),
        /// IPMI: board and cooling sensors from BMCs (over LAN, or in-band via /dev/ipmi0).
        pub ipmi: crate::sources::ipmi::IpmiConfig = Default::default(),
        /// Kubernetes: which pod holds which GPU (the kubelet's pod-resources API) and the
        /// names of the pods processes run in.
        pub kubernetes: crate::sources::kubernetes::KubernetesConfig = Default::default(),
        /// RDMA NICs (InfiniBand, RoCE, EFA): port state, rate and counters, a verdict per
        /// port, and which NICs are each GPU's rail.
        pub nic: crate::sources::nic::NicConfig = Default::default(),
        /// The PCIe bus: AER counters and link state on every GPU's, NVSwitch's and NIC's
        /// path, and NVIDIA GPUs on the bus that NVML does not list.
        pub pcie: crate::sources::pcie::PcieConfig = Default::default(),
        /// The host around the driver: the NVIDIA kernel modules loaded and the NVIDIA
        /// daemons running (persistenced, fabric manager, IMEX, DCGM's host engine).
        pub host: crate::sources::host::HostConfig = Default::default(),
    }
}

config_section! {
    /// `[sinks.*]`
    pub struct Sinks {
        /// Put a GPU's identity (hw.vendor, hw.model, hw.name, hw.serial_number,
        /// hw.driver_version, hw.firmware_version, as gpu.info has them) on its series of the
        /// OpenTelemetry conventions (hw.gpu.*, hw.errors, hw.status, hw.power, hw.energy),
        /// where the conventions recommend them, on /metrics and OTLP alike. Constant per GPU:
        /// the number of series does not change. Default: true (false: smaller payloads; join
        /// gpu_info on hw_id instead).
        pub identity_attributes: bool = true,
        /// Export the names the previous release used where this one renamed them, for the
        /// dashboards, alerts and log queries not yet moved (docs/MIGRATING.md): on /metrics
        /// `cooling_flow_liters_per_minute` (now `cooling_flow_L_per_min`),
        /// `cooling_pressure_kilopascals` (`cooling_pressure_kPa`) and
        /// `k8s_pod_gpu_allocation` (`gpu_k8s_allocation`); status-change events as
        /// `hw.status.change` with `hw.state.previous` (now `junction.health.change`,
        /// `junction.health.previous_state`). Kept for one release. Default: false.
        pub legacy_names: bool = false,
        /// The Prometheus scrape endpoint (`/metrics`, `/healthz`).
        pub prometheus: PrometheusConfig = PrometheusConfig::default(),
        /// OTLP push (gRPC or HTTP/protobuf): metrics, and events as log records.
        /// Precedence: a key set in this table wins over the standard OTEL_* environment
        /// variables; a key left empty (or 0) is taken from them, then from its default; the
        /// signal-specific variables (OTEL_EXPORTER_OTLP_METRICS_*, _LOGS_*) win over the
        /// general ones. Headers and resource attributes merge key by key, the file winning.
        pub otlp: crate::sinks::otlp::OtlpConfig = Default::default(),
        /// dcgm-exporter's names and labels on a listener of their own (its port, 9400, by
        /// default), for the dashboards, alerts and autoscalers written for it.
        pub dcgm: crate::sinks::dcgm::DcgmConfig = Default::default(),
    }
}

config_section! {
    /// `[sinks.prometheus]`
    pub struct PrometheusConfig {
        /// Serve `/metrics` and `/healthz`. Default: true.
        pub enabled: bool = true,
        /// Address and port to listen on. Default: "0.0.0.0:9474" (all interfaces, as a
        /// scrape target must be reachable from Prometheus).
        pub listen: String = "0.0.0.0:9474".into(),
        /// Answer a scraper that asks for gzip (`Accept-Encoding: gzip`, as Prometheus does
        /// unless its `enable_compression` is false) with a gzip page: the 8-GPU node's
        /// 282 KB page is about 19 KB, for about one and a half times a text scrape's CPU
        /// (BENCHMARKS.md).
        /// false: always text. Default: true.
        pub gzip: bool = true,
    }
}

/// One problem found by [`Config::validate`]: the dotted key and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    /// Dotted path of the offending key, e.g. `sinks.prometheus.listen`.
    pub key: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// What every polled target (a BMC over Redfish or IPMI) must get right, checked the same way
/// for each: a password file that exists, a timeout and an interval of at least a second, a
/// name no other target of the section has. `key` names a key of this target; `names` holds
/// the names seen so far in the section.
pub fn check_target(
    key: &dyn Fn(&str) -> String,
    name: String,
    password_file: &str,
    (timeout_secs, interval_secs): (u64, u64),
    names: &mut std::collections::BTreeSet<String>,
    out: &mut Vec<Invalid>,
) {
    if !password_file.is_empty() && !std::path::Path::new(password_file).is_file() {
        out.push(Invalid {
            key: key("password_file"),
            message: format!("{password_file:?} is not a readable file"),
        });
    }
    for (k, v) in [
        ("timeout_secs", timeout_secs),
        ("interval_secs", interval_secs),
    ] {
        if v == 0 {
            out.push(Invalid {
                key: key(k),
                message: "must be at least 1 (seconds)".into(),
            });
        }
    }
    if names.contains(&name) {
        out.push(Invalid {
            key: key("name"),
            message: format!("two targets are named {name:?}: give each a distinct name"),
        });
    }
    names.insert(name);
}

impl Config {
    /// Checks what serde cannot: addresses, paths, ranges. Returns every problem at once.
    pub fn validate(&self) -> Vec<Invalid> {
        let mut out = Vec::new();
        let p = &self.sinks.prometheus;
        if p.enabled && p.listen.parse::<SocketAddr>().is_err() {
            out.push(Invalid {
                key: "sinks.prometheus.listen".into(),
                message: format!(
                    "{:?} is not a socket address; write IP:PORT, e.g. \"0.0.0.0:9474\" or \"[::1]:9474\"",
                    p.listen
                ),
            });
        }
        self.sources.nvml.validate("sources.nvml", &mut out);
        self.sources.kmsg.validate("sources.kmsg", &mut out);
        self.sources.ebpf.validate("sources.ebpf", &mut out);
        self.sources.redfish.validate("sources.redfish", &mut out);
        self.sources.ipmi.validate("sources.ipmi", &mut out);
        self.sources
            .kubernetes
            .validate("sources.kubernetes", &mut out);
        self.sources.nic.validate("sources.nic", &mut out);
        self.sources.pcie.validate("sources.pcie", &mut out);
        self.sources.host.validate("sources.host", &mut out);
        let (kmsg, host) = (&self.sources.kmsg, &self.sources.host);
        let fm = std::path::Path::new(&host.fabric_manager_log);
        if kmsg.enabled
            && host.enabled
            && !host.fabric_manager_log.is_empty()
            && kmsg.files.iter().any(|f| std::path::Path::new(f) == fm)
        {
            // The two would share one saved position, each skipping what the other read.
            out.push(Invalid {
                key: "sources.kmsg.files".into(),
                message: format!(
                    "{:?} is the fabric manager's log, which the host source reads \
                     (sources.host.fabric_manager_log): take it out of sources.kmsg.files",
                    host.fabric_manager_log
                ),
            });
        }
        self.health.validate("health", &mut out);
        self.expect.validate("expect", &mut out);
        self.sinks.dcgm.validate("sinks.dcgm", &mut out);
        self.sinks.otlp.validate("sinks.otlp", &mut out);
        out
    }
}

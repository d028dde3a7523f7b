//! One struct per kind of failed read, by source. Each names its series (source, stage,
//! `error.type`, subject) and its log line: what happened, then what Junction does now.

use std::fmt::Display;
use std::path::Path;

use nvml_wrapper::error::NvmlError;

use super::{InternalEvent, Key, Subject};

/// `error.type` of an I/O error.
pub fn io_error_type(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::NotFound => "not_found",
        std::io::ErrorKind::PermissionDenied => "permission",
        std::io::ErrorKind::IsADirectory => "is_a_directory",
        std::io::ErrorKind::InvalidData => "invalid_data",
        _ => "io",
    }
}

/// `error.type` of an NVML error.
pub fn nvml_error_type(e: &NvmlError) -> &'static str {
    match e {
        NvmlError::Timeout => "timeout",
        NvmlError::NoPermission => "permission",
        NvmlError::InsufficientSize(_) => "insufficient_size",
        NvmlError::InsufficientPower => "insufficient_power",
        NvmlError::DriverNotLoaded => "driver_not_loaded",
        NvmlError::Uninitialized => "uninitialized",
        NvmlError::CorruptedInfoROM => "corrupted_inforom",
        NvmlError::IrqIssue => "irq",
        NvmlError::InvalidArg => "invalid_argument",
        NvmlError::NotFound => "not_found",
        NvmlError::NoData => "no_data",
        NvmlError::Unknown => "unknown",
        _ => "other",
    }
}

/// An NVML call that returned an error (not an unsupported feature: that disables it).
pub struct NvmlCallFailed<'a> {
    /// The GPU's UUID.
    pub gpu: &'a str,
    /// The feature (the stage).
    pub feature: &'static str,
    /// What NVML said.
    pub error: &'a NvmlError,
}

impl InternalEvent for NvmlCallFailed<'_> {
    fn key(&self) -> Key {
        Key {
            source: "nvml",
            stage: self.feature,
            error_type: nvml_error_type(self.error),
            subject: Subject::Gpu(self.gpu.to_string()),
        }
    }

    fn log(&self, suppressed: u64) {
        tracing::warn!(gpu = %self.gpu, feature = self.feature, error = %self.error, suppressed, "NVML call failed; counting further failures in junction_source_errors_total");
    }
}

/// A panic in one GPU's NVML collection (a defect of Junction's, not the GPU's): counted
/// beside the components' panics, with the GPU's `hw.id`.
pub struct NvmlCollectionPanicked<'a> {
    /// The GPU's UUID.
    pub gpu: &'a str,
    /// The panic's message.
    pub why: &'a str,
    /// When the GPU is opened again (`None`: `junction once`, not again).
    pub again: Option<std::time::Duration>,
}

impl InternalEvent for NvmlCollectionPanicked<'_> {
    fn key(&self) -> Key {
        Key {
            source: "nvml",
            stage: "task",
            error_type: "panic",
            subject: Subject::Gpu(self.gpu.to_string()),
        }
    }

    fn log(&self, suppressed: u64) {
        match self.again {
            Some(wait) => {
                tracing::error!(gpu = %self.gpu, panic = %self.why, suppressed, "NVML collection of this GPU panicked; restarting it in {wait:?} (its readings are held meanwhile, its health untouched)")
            }
            None => {
                tracing::error!(gpu = %self.gpu, panic = %self.why, suppressed, "NVML collection of this GPU panicked; this GPU is not collected")
            }
        }
    }
}

/// An NVML read that returned nonsense (ignored).
pub struct NvmlImplausible<'a> {
    /// The GPU's UUID.
    pub gpu: &'a str,
    /// The feature (the stage).
    pub feature: &'static str,
    /// What was wrong with it.
    pub what: &'a str,
}

impl InternalEvent for NvmlImplausible<'_> {
    fn key(&self) -> Key {
        Key {
            source: "nvml",
            stage: self.feature,
            error_type: "implausible",
            subject: Subject::Gpu(self.gpu.to_string()),
        }
    }

    fn log(&self, suppressed: u64) {
        tracing::warn!(gpu = %self.gpu, feature = self.feature, suppressed, "{}; ignored", self.what);
    }
}

/// Reading `/dev/kmsg` failed (not a lost record: those are counted as lost).
pub struct KmsgReadFailed<'a> {
    /// The error.
    pub error: &'a std::io::Error,
}

impl InternalEvent for KmsgReadFailed<'_> {
    fn key(&self) -> Key {
        Key {
            source: "kmsg",
            stage: "device",
            error_type: io_error_type(self.error),
            subject: Subject::Node,
        }
    }

    fn log(&self, suppressed: u64) {
        tracing::warn!(error = %self.error, suppressed, "reading the kernel log failed; retrying every second");
    }
}

/// Opening or reading a followed kernel-log file failed (a missing file is not a failure:
/// it is waited for).
pub struct KmsgFileFailed<'a> {
    /// The file.
    pub path: &'a str,
    /// The error.
    pub error: &'a std::io::Error,
}

impl InternalEvent for KmsgFileFailed<'_> {
    fn key(&self) -> Key {
        Key {
            source: "kmsg",
            stage: "file",
            error_type: io_error_type(self.error),
            subject: Subject::Node,
        }
    }

    fn log(&self, suppressed: u64) {
        tracing::warn!(file = %self.path, error = %self.error, suppressed, "cannot read the kernel-log file; trying again every 250 ms");
    }
}

/// Saving the kernel-log state (XID counters, checkpoints, held reasons) failed.
pub struct StateSaveFailed<'a> {
    /// The file.
    pub file: &'a Path,
    /// The error.
    pub error: &'a std::io::Error,
}

impl InternalEvent for StateSaveFailed<'_> {
    fn key(&self) -> Key {
        Key {
            source: "kmsg",
            stage: "state",
            error_type: io_error_type(self.error),
            subject: Subject::Node,
        }
    }

    fn log(&self, suppressed: u64) {
        tracing::warn!(file = %self.file.display(), error = %self.error, suppressed, "cannot save state; a restart may count kernel-log events again");
    }
}

/// The eBPF probes could not be loaded or attached: attribution is off.
pub struct EbpfUnavailable<'a> {
    /// Why.
    pub error: &'a dyn Display,
}

impl InternalEvent for EbpfUnavailable<'_> {
    fn key(&self) -> Key {
        Key {
            source: "ebpf",
            stage: "load",
            error_type: "unavailable",
            subject: Subject::Node,
        }
    }

    fn log(&self, _suppressed: u64) {
        tracing::warn!("eBPF attribution is off: {}", self.error);
    }
}

/// A `watch_devices` entry that cannot be read.
pub struct EbpfWatchSkipped<'a> {
    /// The entry.
    pub path: &'a str,
    /// The error.
    pub error: &'a std::io::Error,
}

impl InternalEvent for EbpfWatchSkipped<'_> {
    fn key(&self) -> Key {
        Key {
            source: "ebpf",
            stage: "watch_devices",
            error_type: io_error_type(self.error),
            subject: Subject::Node,
        }
    }

    fn log(&self, suppressed: u64) {
        tracing::warn!(path = %self.path, error = %self.error, suppressed, "watch_devices entry skipped");
    }
}

/// The BPF object's records do not match this build.
pub struct EbpfMismatch<'a> {
    /// Why.
    pub error: &'a dyn Display,
}

impl InternalEvent for EbpfMismatch<'_> {
    fn key(&self) -> Key {
        Key {
            source: "ebpf",
            stage: "ring",
            error_type: "mismatch",
            subject: Subject::Node,
        }
    }

    fn log(&self, _suppressed: u64) {
        tracing::error!(error = %self.error, "eBPF attribution is off: the BPF object does not match this junction; rebuild both");
    }
}

/// A Redfish sub-resource that failed (skipped; the rest of the poll goes on).
pub struct RedfishResourceSkipped<'a> {
    /// The target.
    pub target: &'a str,
    /// The resource.
    pub path: &'a str,
    /// `error.type` (http, protocol).
    pub error_type: &'static str,
    /// What happened.
    pub error: &'a dyn Display,
}

impl InternalEvent for RedfishResourceSkipped<'_> {
    fn key(&self) -> Key {
        Key {
            source: "redfish",
            stage: "resource",
            error_type: self.error_type,
            subject: Subject::Target(self.target.to_string()),
        }
    }

    fn log(&self, suppressed: u64) {
        tracing::warn!(target = %self.target, path = self.path, error = %self.error, suppressed, "Redfish resource failed; skipped, the rest of the poll goes on");
    }
}

/// A Redfish chassis whose tree has temperatures or fans, none of which could be read (a
/// blind chassis is never silent).
pub struct RedfishChassisBlind<'a> {
    /// The target.
    pub target: &'a str,
    /// One sentence per blind chassis.
    pub notes: &'a [String],
}

impl InternalEvent for RedfishChassisBlind<'_> {
    fn key(&self) -> Key {
        Key {
            source: "redfish",
            stage: "chassis",
            error_type: "blind",
            subject: Subject::Target(self.target.to_string()),
        }
    }

    fn log(&self, suppressed: u64) {
        tracing::warn!(target = %self.target, suppressed, "{}; `junction inventory` lists what was read", self.notes.join("; "));
    }
}

/// A poll of a BMC target (Redfish, IPMI) failed.
pub struct TargetPollFailed<'a> {
    /// redfish or ipmi.
    pub source: &'static str,
    /// The target.
    pub target: &'a str,
    /// `error.type`.
    pub error_type: &'static str,
    /// What happened.
    pub error: &'a str,
}

fn source_name(source: &str) -> &str {
    match source {
        "redfish" => "Redfish",
        "ipmi" => "IPMI",
        s => s,
    }
}

impl InternalEvent for TargetPollFailed<'_> {
    fn key(&self) -> Key {
        Key {
            source: self.source,
            stage: "poll",
            error_type: self.error_type,
            subject: Subject::Target(self.target.to_string()),
        }
    }

    fn log(&self, suppressed: u64) {
        tracing::warn!(target = %self.target, error = %self.error, suppressed, "{} poll failed; polled again at the next interval", source_name(self.source));
    }
}

/// A BMC target reported more components or readings than are kept of one target.
pub struct TargetTooLarge<'a> {
    /// redfish or ipmi.
    pub source: &'static str,
    /// The target.
    pub target: &'a str,
    /// "components" or "readings".
    pub what: &'static str,
    /// How many it reported.
    pub found: usize,
    /// How many are kept.
    pub kept: usize,
}

impl InternalEvent for TargetTooLarge<'_> {
    fn key(&self) -> Key {
        Key {
            source: self.source,
            stage: "poll",
            error_type: "too_large",
            subject: Subject::Target(self.target.to_string()),
        }
    }

    fn log(&self, suppressed: u64) {
        tracing::warn!(target = %self.target, found = self.found, kept = self.kept, suppressed, "{} target reported more {} than Junction keeps of one target; the rest are left out (a real BMC reports a few hundred: check the target's firmware)", source_name(self.source), self.what);
    }
}

/// A BMC target that cannot be polled at all (its password, CA or work directory).
pub struct TargetUnusable<'a> {
    /// redfish or ipmi.
    pub source: &'static str,
    /// The target.
    pub target: &'a str,
    /// Why, naming the setting.
    pub error: &'a str,
}

impl InternalEvent for TargetUnusable<'_> {
    fn key(&self) -> Key {
        Key {
            source: self.source,
            stage: "open",
            error_type: "config",
            subject: Subject::Target(self.target.to_string()),
        }
    }

    fn log(&self, _suppressed: u64) {
        tracing::error!(target = %self.target, error = %self.error, "{} target not polled", source_name(self.source));
    }
}

/// The kubelet's pod-resources `List` failed.
pub struct KubeletListFailed<'a> {
    /// The socket.
    pub socket: &'a Path,
    /// `error.type` (connect, status, timeout).
    pub error_type: &'static str,
    /// What happened.
    pub error: &'a str,
}

impl InternalEvent for KubeletListFailed<'_> {
    fn key(&self) -> Key {
        Key {
            source: "kubernetes",
            stage: "list",
            error_type: self.error_type,
            subject: Subject::Node,
        }
    }

    fn log(&self, suppressed: u64) {
        tracing::warn!(socket = %self.socket.display(), error = %self.error, suppressed, "cannot list pod resources: pod allocations are stale until the kubelet answers");
    }
}

/// The kubelet's pod directory cannot be read (pods named by UID only).
pub struct PodLogsUnreadable<'a> {
    /// The directory.
    pub dir: &'a str,
    /// The error.
    pub error: &'a std::io::Error,
}

impl InternalEvent for PodLogsUnreadable<'_> {
    fn key(&self) -> Key {
        Key {
            source: "kubernetes",
            stage: "pod_logs",
            error_type: io_error_type(self.error),
            subject: Subject::Node,
        }
    }

    fn log(&self, suppressed: u64) {
        tracing::warn!(dir = %self.dir, error = %self.error, suppressed, "cannot read the kubelet's pod directory: processes in pods are named by UID only (mount /var/log/pods)");
    }
}

/// Signals the health rules read that failed since the last evaluation (the rules that
/// need them cannot decide; `signal_unreadable` is raised).
pub struct HealthInputUnreadable<'a> {
    /// The GPU.
    pub gpu: &'a str,
    /// The signals (NVML features).
    pub signals: &'a [String],
}

impl InternalEvent for HealthInputUnreadable<'_> {
    fn key(&self) -> Key {
        Key {
            source: "health",
            stage: "rules",
            error_type: "input_unreadable",
            subject: Subject::Gpu(self.gpu.to_string()),
        }
    }

    fn log(&self, suppressed: u64) {
        tracing::warn!(gpu = %self.gpu, signals = %self.signals.join(","), suppressed, "health rules cannot read their inputs; signal_unreadable raised while it lasts");
    }
}

/// A source's or a sink's task (or one of its threads) that panicked: it is reported down
/// and started again after `backoff`. Counted under the component's name, stage `task`,
/// `error.type` `panic`, so that one that panics again and again shows as a count that keeps
/// rising (`JunctionComponentRestarting`), where `junction_source_up` only flickers.
pub struct ComponentPanicked<'a> {
    /// The source's or sink's name.
    pub component: &'static str,
    /// `source` or `sink`.
    pub kind: &'static str,
    /// The panic's message (its first 200 characters).
    pub why: &'a str,
    /// Restarts so far, this one included.
    pub restarts: u64,
    /// When it is started again.
    pub backoff: std::time::Duration,
}

impl InternalEvent for ComponentPanicked<'_> {
    fn key(&self) -> Key {
        Key {
            source: self.component,
            stage: "task",
            error_type: "panic",
            subject: Subject::Node,
        }
    }

    fn log(&self, suppressed: u64) {
        tracing::error!(component = self.component, panic = %self.why, restarts = self.restarts, suppressed, "{} panicked; restarting it in {:?}", self.kind, self.backoff);
    }
}

//! The catalog of kernel-log signatures beyond XID and SXid, embedded like the XID catalog:
//! for each, the literals that must appear (a fast pre-filter), the pattern, what it names,
//! its severity and what it does to health. Sources are cited per entry: real lines are in
//! `../shared/realworld/xid-lines.txt` and `../shared/reference/node-fabric-and-bus.md` §2.5
//! and §3 (which names the bug report or project each comes from); the rest are composed from
//! the kernel's format strings, cited there too.
//!
//! Named groups the patterns may have: `pci` (the device the line is about, `dddd:bb:dd.f`),
//! `src` (an AER message's source), `dev` (a disk or file system), `pid` and `comm` (a
//! process), `rm` (the driver's own GPU number, which is not NVML's index).

use super::health::{Action, Code};

/// What a line names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A GPU, by the `pci` group.
    Gpu,
    /// A PCI function (`pci` or `src`): the GPUs at or behind it get the reason.
    PciPath,
    /// An RDMA / Ethernet NIC, by the `pci` group.
    Nic,
    /// A disk or file system, by the `dev` group.
    Disk,
    /// A process (the `pid` group), joined to the GPUs it used.
    Process,
    /// The node.
    Node,
}

impl Target {
    /// The `hw.type` of the component.
    pub fn hw_type(self) -> &'static str {
        match self {
            Target::Gpu => "gpu",
            Target::PciPath => "pci",
            Target::Nic => "network",
            Target::Disk => "disk_controller",
            Target::Process | Target::Node => "node",
        }
    }
}

/// What a match does besides its event and counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Nothing more.
    Event,
    /// A reason on the GPU(s) it names, held until a reset or reboot (like the fatal XIDs).
    GpuReason(Code, bool, Action),
    /// A node reason (`node.health.reason`), held for the rest of the boot.
    NodeReason(&'static str),
}

/// Event severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Worth knowing.
    Info,
    /// Something degraded.
    Warn,
    /// Something failed.
    Error,
}

/// One catalog entry.
#[derive(Debug)]
pub struct Signature {
    /// Its name (`kmsg.signature`).
    pub id: &'static str,
    /// Literals, one of which every matching line contains.
    pub anchors: &'static [&'static str],
    /// The pattern (searched, not anchored). No counted repetition of a wide class
    /// (`.{1,64}`, `[^)]{1,32}`): the compiled pattern holds a copy of the class for each
    /// count, and one such pattern took a megabyte of the agent's heap. A capture's length
    /// is bounded where it is taken (`sources::kmsg::signatures::find`).
    pub pattern: &'static str,
    /// What it names.
    pub target: Target,
    /// How bad it is.
    pub level: Level,
    /// What it does to health.
    pub effect: Effect,
    /// What it means, for the event.
    pub meaning: &'static str,
    /// Where the line and the rule come from.
    pub source: &'static str,
}

const BDF: &str = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]";

macro_rules! pat {
    ($($p:expr),+) => { concat!($($p),+) };
}

/// The catalog. Order matters only for a line two entries could match (the first wins).
pub static CATALOG: &[Signature] = &[
    Signature {
        id: "gsp_heartbeat_timeout",
        anchors: &[
            "_kgspIsHeartbeatTimedOut: Heartbeat timed out",
            "GSP RM heartbeat timed out",
        ],
        pattern: r"NVRM: (?:GPU(?P<rm>[0-9]{1,3}) )?(?:_kgspIsHeartbeatTimedOut: Heartbeat timed out|_kgspRpcRecvPoll: GSP RM heartbeat timed out)",
        target: Target::Node,
        level: Level::Error,
        effect: Effect::Event,
        meaning: "the GSP firmware stopped answering the driver's heartbeat; an Xid 119 or 120 follows",
        source: "NVIDIA/open-gpu-kernel-modules#1230 (xid-lines.txt), node-fabric-and-bus.md §3.1",
    },
    Signature {
        id: "gsp_rpc_timeout",
        anchors: &["GSP Timeout", "rpcRecvPoll timedout"],
        pattern: r"NVRM: (?:GPU(?P<rm>[0-9]{1,3}) )?(?:_kgspLogRpcTimeout: \*+ GSP Timeout|_issueRpcAndWait: rpcRecvPoll timedout for fn [0-9]+)",
        target: Target::Node,
        level: Level::Error,
        effect: Effect::Event,
        meaning: "an RPC to the GSP firmware timed out",
        source: "NVIDIA/open-gpu-kernel-modules#795 and #1230, node-fabric-and-bus.md §3.1",
    },
    Signature {
        id: "gsp_rpc_failed",
        anchors: &["rpcSendMessage failed with status"],
        pattern: r"NVRM: (?:GPU(?P<rm>[0-9]{1,3}) )?_issueRpcAndWait: rpcSendMessage failed with status (?P<status>0x[0-9a-fA-F]{1,8})",
        target: Target::Node,
        level: Level::Warn,
        effect: Effect::Event,
        meaning: "the driver could not send an RPC to the GSP firmware (status 0x0f: the GPU is lost)",
        source: "xid-lines.txt (an RTX on 570, a DGX Station A100)",
    },
    Signature {
        id: "gsp_rpc_errors",
        anchors: &["Rate limiting GSP RPC error prints"],
        pattern: r"NVRM: Rate limiting GSP RPC error prints for GPU at PCI:(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})",
        target: Target::Gpu,
        level: Level::Error,
        effect: Effect::GpuReason(Code::GspUnresponsive, false, Action::ResetGpu),
        meaning: "GSP RPCs keep failing on this GPU; the driver says it likely needs a reset",
        source: "xid-lines.txt (NVIDIA/open-gpu-kernel-modules, an H100 after Xid 119)",
    },
    Signature {
        id: "gsp_crash",
        anchors: &[
            "GSP-CrashCat Report",
            "GSP task watchdog timeout",
            "PMU has halted",
        ],
        pattern: r"(?:NVRM: (?:GPU(?P<rm>[0-9]{1,3}) )?kgspHealthCheck_[A-Za-z0-9]+: \*+ GSP-CrashCat Report|^GSP task watchdog timeout @ pc:|NVRM: (?:GPU[0-9]{1,3} )?_kgspRpcGspEventPmuHalted: Received signal from GSP that PMU has halted)",
        target: Target::Node,
        level: Level::Error,
        effect: Effect::Event,
        meaning: "the GSP firmware crashed (CrashCat report, task watchdog, PMU halted)",
        source: "xid-lines.txt (fedora-box, 580 driver; NVIDIA/open-gpu-kernel-modules issues)",
    },
    Signature {
        id: "gsp_boot_failed",
        anchors: &[
            "cannot proceed with booting GSP",
            "Cannot initialize GSP firmware RM",
        ],
        pattern: r"NVRM: (?:GPU[0-9]{1,3} )?(?:_kgspBootGspRm: .*cannot proceed with booting GSP|RmInitAdapter: Cannot initialize GSP firmware RM)",
        target: Target::Node,
        level: Level::Error,
        effect: Effect::Event,
        meaning: "the GSP firmware could not be booted; the GPU stays uninitialised",
        source: "xid-lines.txt; NVIDIA/open-gpu-kernel-modules#789 (node-fabric-and-bus.md §3.3)",
    },
    Signature {
        id: "driver_reset_required",
        anchors: &["[NV_ERR_RESET_REQUIRED]"],
        pattern: r"NVRM: (?:GPU[0-9]{1,3} )?nvAssertOkFailedNoLog: Assertion failed: Reset required \[NV_ERR_RESET_REQUIRED\]",
        target: Target::Node,
        level: Level::Error,
        effect: Effect::Event,
        meaning: "the driver refuses work until the GPU is reset (NVML answers RESET_REQUIRED)",
        source: "NVIDIA/open-gpu-kernel-modules#942 (xid-lines.txt); sichek's rule, node-fabric-and-bus.md §3.2",
    },
    Signature {
        id: "driver_gpu_lost",
        anchors: &["[NV_ERR_GPU_IS_LOST]"],
        pattern: r"NVRM: (?:GPU[0-9]{1,3} )?nvAssertOkFailedNoLog: Assertion failed: GPU lost from the bus \[NV_ERR_GPU_IS_LOST\]",
        target: Target::Node,
        level: Level::Error,
        effect: Effect::Event,
        meaning: "the driver lost a GPU from the bus (an Xid 79 follows)",
        source: "NVIDIA/open-gpu-kernel-modules#688 (xid-lines.txt), node-fabric-and-bus.md §3.2",
    },
    Signature {
        id: "rm_init_failed",
        // Its companion `rm_init_adapter failed, device minor number N` is the same failure.
        anchors: &["RmInitAdapter failed!"],
        pattern: pat!(
            r"NVRM: GPU (?P<pci>",
            "[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]",
            r"): RmInitAdapter failed! \((?P<code>[0-9a-fA-Fx:]{1,40})\)"
        ),
        target: Target::Gpu,
        level: Level::Error,
        effect: Effect::GpuReason(Code::RmInitFailed, true, Action::ResetGpu),
        meaning: "the driver could not initialise the GPU: it is on the bus but NVML will not list it",
        source: "NVIDIA/gpu-operator#1146, open-gpu-kernel-modules#789 (xid-lines.txt), node-fabric-and-bus.md §3.3",
    },
    Signature {
        id: "driver_probe_failed",
        anchors: &["The NVIDIA probe routine failed"],
        pattern: r"NVRM: The NVIDIA probe routine failed for [0-9]{1,3} device\(s\)",
        target: Target::Node,
        level: Level::Error,
        effect: Effect::Event,
        meaning: "the driver could not probe a GPU at load (it is missing from NVML)",
        source: "xid-lines.txt (a 570 open-module load)",
    },
    Signature {
        id: "nvlink_training_failed",
        anchors: &[
            "postRxDetLinkMask failed",
            "Failed to update Rx Detect Link mask",
        ],
        pattern: r"NVRM: (?:GPU[0-9]{1,3} )?(?:knvlinkUpdatePostRxDetectLinkMask_[A-Za-z0-9_]+: Failed to update Rx Detect Link mask!|knvlinkDiscoverPostRxDetLinks_[A-Za-z0-9_]+: Getting peer[0-9]+(?:'s)? postRxDetLinkMask failed!)",
        target: Target::Node,
        level: Level::Error,
        effect: Effect::NodeReason("nvlink_training_failed"),
        meaning: "NVLink links did not train (a peer's post-RX-detect mask failed); GPUd holds the node unhealthy for the boot and reboots it",
        source: "leptonai/gpud#1271 (xid-lines.txt), gpud nvlink/kmsg.go",
    },
    Signature {
        id: "fabric_probe_failed",
        anchors: &["Fabric Probe failed: 0x"],
        pattern: r"NVRM: (?:GPU[0-9]{1,3} )?[A-Za-z0-9_]+: Fabric Probe failed: 0x[0-9a-fA-F]{1,8}",
        target: Target::Node,
        level: Level::Error,
        effect: Effect::NodeReason("fabric_probe_failed"),
        meaning: "the fabric manager answered a GPU's fabric probe with an error: the GPU is not registered in the NVLink fabric (no multi-node NVLink, no IMEX)",
        source: "composed from src/nvidia/src/kernel/gpu/gpu_fabric_probe.c (_gpuFabricProbeFullSanityCheck): NV_PRINTF(LEVEL_ERROR, \"Fabric Probe failed: 0x%x\\n\", …), which RM prints as \"NVRM: <function>: …\"",
    },
    Signature {
        id: "imex_channels_failed",
        anchors: &["nv-caps-imex failed to"],
        pattern: r"^nv-caps-imex failed to (?:create|add) cdev",
        target: Target::Node,
        level: Level::Error,
        effect: Effect::NodeReason("imex_channels_failed"),
        meaning: "the driver could not create the IMEX channel devices (/dev/nvidia-caps-imex-channels): the IMEX daemon cannot import memory across nodes",
        source: "composed from kernel-open/nvidia/nv-caps-imex.c (nv_caps_imex_init): nv_printf(NV_DBG_ERRORS, \"nv-caps-imex failed to create cdev.\\n\") and \"… failed to add cdev.\\n\"",
    },
    Signature {
        id: "fm_nvswitch_fatal",
        anchors: &["detected NVSwitch fatal error"],
        pattern: r"^detected NVSwitch fatal error (?P<code>[0-9]{1,6}) on fid [0-9]{1,4} on NVSwitch pci bus id (?P<switch>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])",
        target: Target::Node,
        level: Level::Error,
        effect: Effect::NodeReason("nvswitch_fatal"),
        meaning: "the fabric manager saw a fatal NVSwitch error: NVLink traffic through that switch stops until the node is reset",
        source: "the fabric manager's log (/var/log/fabricmanager.log); gpud fabric-manager/log_matcher.go and its example line (node-fabric-and-bus.md §4.5)",
    },
    Signature {
        id: "fm_nvswitch_nonfatal",
        anchors: &["detected NVSwitch non-fatal error"],
        pattern: r"^detected NVSwitch non-fatal error (?P<code>[0-9]{1,6})",
        target: Target::Node,
        level: Level::Warn,
        effect: Effect::Event,
        meaning: "the fabric manager saw a non-fatal NVSwitch error",
        source: "the fabric manager's log; gpud fabric-manager/log_matcher.go: `.+detected NVSwitch non-fatal error (\\d+)`",
    },
    Signature {
        id: "fm_topology_mismatch",
        anchors: &["detected number of NVSwitches don't match"],
        pattern: r"detected number of NVSwitches don't match with any supported system topology",
        target: Target::Node,
        level: Level::Error,
        effect: Effect::NodeReason("fabric_topology_mismatch"),
        meaning: "the fabric manager found fewer (or more) NVSwitches than any supported topology has: it does not start, and NVLink P2P stays off",
        source: "the fabric manager's log; gpud fabric-manager/log_matcher.go: `.*detected number of NVSwitches don't match with any supported system topology.*`",
    },
    Signature {
        id: "fm_multicast_team",
        anchors: &["in the multicast team"],
        pattern: r"failed to find the GPU handle [0-9]{1,10} in the multicast team",
        target: Target::Node,
        level: Level::Warn,
        effect: Effect::Event,
        meaning: "the fabric manager lost a GPU from an NVLink multicast team (NVLS): collectives using it fail",
        source: "the fabric manager's log; gpud fabric-manager/log_matcher.go: `.+failed to find the GPU handle \\d+ in the multicast team .*`",
    },
    Signature {
        id: "peermem_invalid_context",
        anchors: &["ERROR detected invalid context, skipping further processing"],
        pattern: r"nvidia-peermem nv_get_p2p_free_callback:[0-9]+ ERROR detected invalid context, skipping further processing",
        target: Target::Node,
        level: Level::Warn,
        effect: Effect::Event,
        meaning: "GPUDirect RDMA (nvidia-peermem) found an invalid context in its free callback",
        source: "Mellanox/nv_peer_memory#120 (xid-lines.txt), gpud peermem/kmsg_matcher.go",
    },
    Signature {
        id: "nvidia_module_load_failed",
        anchors: &["Unknown symbol", "disagrees about version of symbol"],
        pattern: r"^(?P<module>nvidia_peermem|nvidia_fs|nvidia_uvm|nvidia_drm|nvidia_modeset|nvidia): (?:Unknown symbol [A-Za-z0-9_]+ \(err -?[0-9]{1,5}\)|disagrees about version of symbol [A-Za-z0-9_]+)",
        target: Target::Node,
        level: Level::Error,
        effect: Effect::NodeReason("nvidia_module_load_failed"),
        meaning: "an NVIDIA kernel module (nvidia_peermem, nvidia_fs, …) failed to load against this kernel",
        source: "composed from kernel/module/main.c: \"%s: Unknown symbol %s (err %d)\", \"%s: disagrees about version of symbol %s\"",
    },
    Signature {
        id: "pcie_aer_fatal",
        anchors: &["(Fatal) error"],
        pattern: pat!(
            r"(?:^[^ ]+ (?P<pci>",
            "[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]",
            r"): )?AER: (?:Multiple )?Uncorrect(?:ed|able) \(Fatal\) error (?:message )?received(?::| from) (?:id=[0-9a-fA-F]{4}|(?P<src>",
            "[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]",
            r"))"
        ),
        target: Target::PciPath,
        level: Level::Error,
        effect: Effect::GpuReason(Code::PcieFatalLogged, true, Action::DrainAndService),
        meaning: "an uncorrectable fatal PCIe error: the GPU or NIC behind the port is about to be lost",
        source: "rwth-i6/returnn#1500, drivers/pci/pcie/aer.c (node-fabric-and-bus.md §2.5)",
    },
    Signature {
        id: "pcie_aer_nonfatal",
        anchors: &["(Non-Fatal) error"],
        pattern: pat!(
            r"(?:^[^ ]+ (?P<pci>",
            "[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]",
            r"): )?AER: (?:Multiple )?Uncorrect(?:ed|able) \(Non-Fatal\) error (?:message )?received(?::| from) (?:id=[0-9a-fA-F]{4}|(?P<src>",
            "[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]",
            r"))"
        ),
        target: Target::PciPath,
        level: Level::Warn,
        effect: Effect::Event,
        meaning: "an uncorrectable non-fatal PCIe error (completion timeout, unsupported request, …)",
        source: "NVIDIA/open-gpu-kernel-modules#1229, drivers/pci/pcie/aer.c (node-fabric-and-bus.md §2.5)",
    },
    Signature {
        id: "pcie_aer_corrected",
        anchors: &["Corrected error", "Correctable error"],
        pattern: pat!(
            r"(?:^[^ ]+ (?P<pci>",
            "[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]",
            r"): )?AER: (?:Multiple )?Correct(?:ed|able) error (?:message )?received(?::| from) (?:id=[0-9a-fA-F]{4}|(?P<src>",
            "[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]",
            r"))"
        ),
        target: Target::PciPath,
        level: Level::Info,
        effect: Effect::Event,
        meaning: "a corrected PCIe error (counted; a rising rate is the warning)",
        source: "wilicc/gpu-burn#1, rwth-i6/returnn#1486, Dasharo/coreboot#815 (node-fabric-and-bus.md §2.5)",
    },
    Signature {
        id: "mlx5_fatal",
        anchors: &[
            "Will cause a leak of a command resource",
            "device's health compromised",
            "unrecoverable hardware error",
        ],
        pattern: pat!(
            r"mlx5_core (?P<pci>",
            "[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]",
            r")[^ ]*:? .*(?:timeout\. Will cause a leak of a command resource|device's health compromised|unrecoverable hardware error)"
        ),
        target: Target::Nic,
        level: Level::Error,
        effect: Effect::Event,
        meaning: "the ConnectX firmware stopped answering or reported an unrecoverable error",
        source: "openucx/ucx#7738, charmplusplus/charm#2635; NVSentinel nicdriver/config.go",
    },
    Signature {
        id: "mlx5_degraded",
        anchors: &[
            "TX timeout detected",
            "RX timeout on channel",
            "insufficient power on the PCIe slot",
            "High Temperature",
            "transmit queue",
        ],
        pattern: pat!(
            r"mlx5_core (?P<pci>",
            "[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]",
            r")[^ ]*:? .*(?:TX timeout detected|RX timeout on channel|Detected insufficient power on the PCIe slot|Port module event.*High Temperature|transmit queue [0-9]+ timed out)"
        ),
        target: Target::Nic,
        level: Level::Warn,
        effect: Effect::Event,
        meaning: "a ConnectX port timed out, runs short of slot power or its module overheats",
        source: "NVSentinel nicdriver/config.go; gpud infiniband kmsg rules (node-fabric-and-bus.md §3.7)",
    },
    Signature {
        id: "oom_kill",
        anchors: &["Killed process"],
        pattern: r"(?P<scope>Memory cgroup out of memory|Out of memory): Killed process (?P<pid>[0-9]{1,10}) \((?P<comm>[^)]+)\)",
        target: Target::Process,
        level: Level::Warn,
        effect: Effect::Event,
        meaning: "the kernel's OOM killer killed a process",
        source: "reportportal/kubernetes#203, pcyin/tranX#41; NPD OOMKilling (node-fabric-and-bus.md §3.9)",
    },
    Signature {
        id: "cpu_soft_lockup",
        anchors: &["soft lockup - CPU#", "hard LOCKUP on cpu"],
        pattern: r"(?:soft lockup - CPU#(?P<cpu>[0-9]{1,4}) stuck for [0-9]{1,6}s! \[(?P<comm>.+):(?P<pid>[0-9]{1,10})\]|Watchdog detected hard LOCKUP on cpu [0-9]{1,4})",
        target: Target::Node,
        level: Level::Error,
        effect: Effect::Event,
        meaning: "a CPU was stuck in the kernel",
        source: "deepspeedai/DeepSpeed#925, iron-fish/ironfish#701; gpud cpu/kmsg_matcher.go",
    },
    Signature {
        id: "hung_task",
        anchors: &["blocked for more than"],
        pattern: r"INFO: task (?P<comm>.+):(?P<pid>[0-9]{1,10}) blocked for more than [0-9]{1,6} seconds",
        target: Target::Process,
        level: Level::Warn,
        effect: Effect::Event,
        meaning: "a task was blocked in the kernel (inside the NVIDIA driver: the driver is wedged)",
        source: "leptonai/gpud#117, NVIDIA/k8s-device-plugin#77; NPD TaskHung",
    },
    Signature {
        id: "kernel_panic",
        anchors: &["Kernel panic - not syncing: "],
        pattern: r"^Kernel panic - not syncing: ",
        target: Target::Node,
        level: Level::Error,
        effect: Effect::Event,
        meaning: "the kernel panicked (read from the crash record pstore or kdump kept of an earlier boot)",
        source: "kernel/panic.c: pr_emerg(\"Kernel panic - not syncing: %s\\n\", buf); read back from fs/pstore and makedumpfile --dump-dmesg records",
    },
    Signature {
        id: "nvme_timeout",
        anchors: &["QID"],
        pattern: r"nvme (?P<dev>nvme[0-9]{1,4}): I/O (?:tag )?[0-9]+ .*QID [0-9]+ timeout, (?:reset controller|aborting)",
        target: Target::Disk,
        level: Level::Warn,
        effect: Effect::Event,
        meaning: "an NVMe command timed out",
        source: "linux-nvme/nvme-cli#151, oxidecomputer/propolis#578; gpud disk/kmsg_matcher.go",
    },
    Signature {
        id: "nvme_failed",
        anchors: &[
            "Disabling device after reset failure",
            "Removing after probe failure",
            "Device not ready; aborting reset",
        ],
        pattern: r"nvme (?P<dev>nvme[0-9]{1,4}): (?:Disabling device after reset failure|Removing after probe failure|Device not ready; aborting reset)",
        target: Target::Disk,
        level: Level::Error,
        effect: Effect::Event,
        meaning: "an NVMe controller failed its reset and is being removed",
        source: "linux-nvme/nvme-cli#151; gpud disk/kmsg_matcher.go",
    },
    Signature {
        id: "filesystem_error",
        // XFS does not remount read-only: it shuts down (the next entry).
        anchors: &["EXT4-fs error"],
        pattern: r"EXT4-fs error \(device (?P<dev>[^)]+)\)",
        target: Target::Disk,
        level: Level::Warn,
        effect: Effect::Event,
        meaning: "a file system found an error",
        source: "bit-team/backintime#2568, stratis-storage/stratisd#812; NPD Ext4Error",
    },
    Signature {
        id: "filesystem_read_only",
        anchors: &[
            "Remounting filesystem read-only",
            "Shutting down filesystem",
        ],
        pattern: r"(?:EXT4-fs \((?P<dev>[^)]+)\): Remounting filesystem read-only|XFS \((?P<xdev>[^)]+)\): .*Shutting down filesystem)",
        target: Target::Disk,
        level: Level::Error,
        effect: Effect::NodeReason("filesystem_read_only"),
        meaning: "a file system went read-only or shut down: whatever writes to it fails",
        source: "bit-team/backintime#2568, stratis-storage/stratisd#812; NPD ReadonlyFilesystem",
    },
];

/// Every catalog entry's index by id.
pub fn index_of(id: &str) -> Option<usize> {
    CATALOG.iter().position(|s| s.id == id)
}

/// The `BDF` pattern, for tests.
pub const PCI_PATTERN: &str = BDF;

//! The metric registry: the one place metric names, units, kinds and attributes live.
//! Prometheus names, OTLP names and `METRICS.md` are all derived from it.

use std::fmt::Write as _;

/// OpenTelemetry instrument kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A value sampled now.
    Gauge,
    /// A monotonic cumulative sum.
    Counter,
    /// A non-monotonic sum (exported as a gauge).
    UpDownCounter,
}

/// NVML metric groups, each enabled and scheduled on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Group {
    /// GPU, memory, encoder, decoder utilization.
    Utilization,
    /// Framebuffer and BAR1 memory.
    Memory,
    /// Power draw, limits and energy.
    Power,
    /// Die and memory-junction temperatures, thresholds, fans.
    Temperature,
    /// Clocks, performance state, clock event reasons, violation time.
    Clocks,
    /// ECC counters, retired pages, remapped rows, recovery action.
    Errors,
    /// PCIe throughput, replays, link generation and width.
    Pcie,
    /// NVLink state, throughput and errors per link.
    Nvlink,
    /// Compute and graphics processes with memory and utilization.
    Processes,
    /// MIG mode and MIG instances.
    Mig,
    /// Profiling metrics through GPM (Hopper and newer).
    Gpm,
    /// Modes, firmware and the NVLink fabric registration.
    Config,
    /// Always collected: identity, status, the agent's own health.
    Status,
}

impl Group {
    /// Every group, in collection order.
    pub const ALL: [Group; 13] = [
        Group::Utilization,
        Group::Memory,
        Group::Power,
        Group::Temperature,
        Group::Clocks,
        Group::Errors,
        Group::Pcie,
        Group::Nvlink,
        Group::Processes,
        Group::Mig,
        Group::Gpm,
        Group::Config,
        Group::Status,
    ];

    /// The config key (`[sources.nvml.groups.<name>]`).
    pub fn name(self) -> &'static str {
        match self {
            Group::Utilization => "utilization",
            Group::Memory => "memory",
            Group::Power => "power",
            Group::Temperature => "temperature",
            Group::Clocks => "clocks",
            Group::Errors => "errors",
            Group::Pcie => "pcie",
            Group::Nvlink => "nvlink",
            Group::Processes => "processes",
            Group::Mig => "mig",
            Group::Gpm => "gpm",
            Group::Config => "config",
            Group::Status => "status",
        }
    }

    /// Position in [`Group::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A metric descriptor.
#[derive(Debug)]
pub struct MetricDesc {
    /// OpenTelemetry name.
    pub name: &'static str,
    /// UCUM unit.
    pub unit: &'static str,
    /// Instrument kind.
    pub kind: Kind,
    /// Attributes besides `hw.id`.
    pub attrs: &'static [&'static str],
    /// One line of help.
    pub help: &'static str,
    /// Where the value comes from.
    pub source: &'static str,
    /// The group that collects it.
    pub group: Group,
}

macro_rules! registry {
    ($( $id:ident = $name:literal, $unit:literal, $kind:ident, [$($attr:literal),*], $group:ident, $source:literal, $help:literal; )*) => {
        /// Every metric Junction exports.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[repr(u16)]
        pub enum Metric { $( #[doc = $help] $id, )* }

        /// The registry, in the order of [`Metric`].
        pub static REGISTRY: &[MetricDesc] = &[
            $( MetricDesc { name: $name, unit: $unit, kind: Kind::$kind, attrs: &[$($attr),*], help: $help, source: $source, group: Group::$group }, )*
        ];
    };
}

registry! {
    Info = "gpu.info", "{info}", Gauge, ["hw.name", "hw.vendor", "hw.model", "hw.serial_number", "hw.driver_version", "hw.firmware_version", "gpu.index", "gpu.minor_number", "gpu.pci.bdf", "gpu.cuda_driver_version"], Status,
        "nvmlDeviceGetName/Serial/PciInfo_v3/MinorNumber/VbiosVersion, nvmlSystemGetDriverVersion", "GPU identity; always 1.";
    Status = "hw.status", "1", UpDownCounter, ["hw.type", "hw.state", "hw.name", "hw.parent", "hw.sensor_location", "nic.port", "junction.target", "hw.vendor", "hw.model", "hw.serial_number", "hw.driver_version", "hw.firmware_version"], Status,
        "derived (lost GPU, reset required, stuck NVML call, the health rules; a NIC port's rules); a BMC component's Status.Health; a BMC temperature, voltage or fan sensor's state against its thresholds", "1 for the component's current state (a GPU: ok, degraded, failed, predicted_failure; a NIC port, BMC component or sensor: ok, degraded, failed), 0 for the others; one state set per hw.id.";
    HealthReason = "gpu.health.reason", "{state}", Gauge, ["hw.type", "gpu.health.reason"], Status,
        "derived", "1 for each reason the GPU is not ok (docs/HEALTH.md lists them with their rules): gpu_lost, reset_required, xid_79, xid_fatal, ecc_uncorrectable, remap_pending, thermal_forecast, leak_detected, …";
    Utilization = "hw.gpu.utilization", "1", Gauge, ["hw.gpu.task", "hw.vendor", "hw.model", "hw.name", "hw.serial_number", "hw.driver_version", "hw.firmware_version"], Utilization,
        "nvmlDeviceGetUtilizationRates, nvmlDeviceGetEncoderUtilization, nvmlDeviceGetDecoderUtilization", "Fraction of time the GPU (general), encoder or decoder was busy.";
    MemoryActivity = "gpu.memory.activity", "1", Gauge, [], Utilization,
        "nvmlDeviceGetUtilizationRates (memory)", "Fraction of time device memory was being read or written (nvidia-smi's utilization.memory, DCGM's MEM_COPY_UTIL); not how full it is, which is hw.gpu.memory.utilization.";
    MemoryUtilization = "hw.gpu.memory.utilization", "1", Gauge, ["hw.vendor", "hw.model", "hw.name", "hw.serial_number", "hw.driver_version", "hw.firmware_version"], Memory,
        "nvmlDeviceGetMemoryInfo_v2 (used / total)", "Fraction of device memory in use.";
    MemoryUsage = "hw.gpu.memory.usage", "By", UpDownCounter, ["hw.vendor", "hw.model", "hw.name", "hw.serial_number", "hw.driver_version", "hw.firmware_version"], Memory,
        "nvmlDeviceGetMemoryInfo_v2 (v1 on old drivers)", "Device memory in use.";
    MemoryLimit = "hw.gpu.memory.limit", "By", UpDownCounter, ["hw.vendor", "hw.model", "hw.name", "hw.serial_number", "hw.driver_version", "hw.firmware_version"], Memory,
        "nvmlDeviceGetMemoryInfo_v2", "Total device memory.";
    MemoryFree = "gpu.memory.free", "By", UpDownCounter, [], Memory,
        "nvmlDeviceGetMemoryInfo_v2", "Device memory free.";
    MemoryReserved = "gpu.memory.reserved", "By", UpDownCounter, [], Memory,
        "nvmlDeviceGetMemoryInfo_v2", "Device memory reserved by the driver and firmware.";
    Bar1Usage = "gpu.bar1.usage", "By", UpDownCounter, [], Memory,
        "nvmlDeviceGetBAR1MemoryInfo", "BAR1 memory in use.";
    Bar1Limit = "gpu.bar1.limit", "By", UpDownCounter, [], Memory,
        "nvmlDeviceGetBAR1MemoryInfo", "Total BAR1 memory.";
    Power = "hw.power", "W", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target", "hw.vendor", "hw.model", "hw.serial_number", "hw.driver_version", "hw.firmware_version"], Power,
        "nvmlDeviceGetPowerUsage (mW); Redfish Sensor (Power); IPMI sensors in W", "Power drawn by one component: a GPU's board (NVML), or what a BMC reports of one component that is not a GPU (hw.type from its physical context: cpu, memory, fan, physical_disk, network, battery; with junction.target). Each component once, none holding another: the host's total is hw.host.power, a supply's input, a BMC's copy of a GPU's draw and sub-totals bmc.power.";
    PowerLimit = "gpu.power.limit", "W", Gauge, ["gpu.power.limit_type"], Power,
        "nvmlDeviceGetEnforcedPowerLimit, nvmlDeviceGetPowerManagementDefaultLimit, nvmlDeviceGetPowerManagementLimitConstraints", "Power limits: enforced, default, min, max.";
    Energy = "hw.energy", "J", Counter, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target", "hw.vendor", "hw.model", "hw.serial_number", "hw.driver_version", "hw.firmware_version"], Power,
        "nvmlDeviceGetTotalEnergyConsumption (mJ); Redfish Sensor (EnergyJoules, EnergyWh, EnergykWh)", "Energy consumed since the driver was loaded (NVML), or a BMC's energy counter of one component that is not a GPU (as hw.power).";
    Temperature = "hw.temperature", "Cel", Gauge, ["hw.sensor_location", "hw.type", "hw.name", "hw.parent", "junction.target"], Temperature,
        "nvmlDeviceGetTemperatureV (gpu_die; nvmlDeviceGetTemperature on older drivers), nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP) (memory_junction); Redfish Sensor (Temperature), ThermalMetrics, legacy Thermal; IPMI temperature sensors", "GPU die and memory-junction (HBM) temperature from NVML; temperatures a BMC reports (with junction.target; hw.id is the sensor, hw.parent the GPU's UUID for a sensor on a GPU NVML reports).";
    TemperatureLimit = "hw.temperature.limit", "Cel", Gauge, ["hw.sensor_location", "hw.limit_type", "hw.type", "hw.name", "hw.parent", "junction.target"], Temperature,
        "gpu_die: nvmlDeviceGetFieldValues(NVML_FI_DEV_TEMPERATURE_{SLOWDOWN,SHUTDOWN,GPU_MAX}_TLIMIT), which answer on the T.Limit scale, made absolute with the die temperature and nvmlDeviceGetMarginTemperature (die + margin - T.Limit value); nvmlDeviceGetTemperatureThreshold where a driver lacks those. memory_junction: nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_MEM_MAX) only (the memory T.Limit value has no margin reading to make it absolute)", "Temperature thresholds in °C, as OpenTelemetry's hw.limit_type names them: throttled (NVML's slowdown), high.critical (shutdown), max (maximum operating, die and memory); a BMC sensor's thresholds (with junction.target) as hw.voltage.limit names them.";
    TemperatureMargin = "gpu.temperature.margin", "Cel", Gauge, ["hw.sensor_location"], Temperature,
        "nvmlDeviceGetMarginTemperature", "The die's thermal margin (nvidia-smi's GPU T.Limit Temp): degrees below its maximum operating temperature; negative past it. Slowdown and shutdown come at the driver's T.Limit values (an H200: -2 and -8).";
    FanSpeed = "hw.fan.speed_ratio", "1", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target"], Temperature,
        "nvmlDeviceGetNumFans, nvmlDeviceGetFanSpeed_v2", "Fan speed as a fraction of its maximum. A GPU's fan is a component of its own: hw.id <GPU UUID>/fan<N>, hw.parent the GPU.";
    ClockFrequency = "gpu.clock.frequency", "Hz", Gauge, ["gpu.clock.domain"], Clocks,
        "nvmlDeviceGetClockInfo (MHz)", "Current clock: graphics, sm, memory, video.";
    ClockMaxFrequency = "gpu.clock.max_frequency", "Hz", Gauge, ["gpu.clock.domain"], Clocks,
        "nvmlDeviceGetMaxClockInfo (MHz)", "Maximum clock: graphics, sm, memory, video.";
    PerformanceState = "gpu.performance_state", "{pstate}", Gauge, [], Clocks,
        "nvmlDeviceGetPerformanceState", "Performance state, 0 (P0, highest) to 15.";
    ClockEvent = "gpu.clock.event.active", "{state}", Gauge, ["gpu.clock.event.reason"], Clocks,
        "nvmlDeviceGetCurrentClocksEventReasons (…ThrottleReasons on older drivers)", "1 while the clock event (throttle) reason is active.";
    ViolationTime = "gpu.violation.time", "s", Counter, ["gpu.violation.type"], Clocks,
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_PERF_POLICY_POWER/THERMAL, NVML_FI_DEV_CLOCKS_EVENT_REASON_*) (ns; nvmlDeviceGetViolationStatus on older drivers)", "Time the GPU was held below its clocks: power, thermal, sw_thermal_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown.";
    EccErrors = "hw.errors", "{error}", Counter, ["hw.type", "error.type", "hw.name", "nic.port", "hw.vendor", "hw.model", "hw.serial_number", "hw.driver_version", "hw.firmware_version"], Errors,
        "nvmlDeviceGetTotalEccErrors (NVML_VOLATILE_ECC); /sys/class/infiniband/*/ports/*/counters/* (the IBTA error counters)", "GPU ECC errors since the driver loaded: corrected or uncorrected (the lifetime count is gpu.ecc.errors.lifetime). NIC port errors (hw.type network): error.type is the counter's name (symbol_error, link_downed, port_rcv_errors, …), monotonic across saturation resets.";
    EccErrorsLifetime = "gpu.ecc.errors.lifetime", "{error}", Counter, ["error.type"], Errors,
        "nvmlDeviceGetTotalEccErrors (NVML_AGGREGATE_ECC)", "GPU ECC errors over the GPU's life (kept in its InfoROM across driver loads; includes those in hw.errors): corrected or uncorrected.";
    RetiredPages = "gpu.memory.retired_pages", "{page}", UpDownCounter, ["gpu.retirement.cause"], Errors,
        "nvmlDeviceGetRetiredPages", "Pages retired for multiple single-bit or double-bit ECC errors (pre-Ampere).";
    RetiredPending = "gpu.memory.retired_pages.pending", "{state}", Gauge, [], Errors,
        "nvmlDeviceGetRetiredPagesPendingStatus", "1 if pages are waiting to be retired at the next reboot.";
    RemappedRows = "gpu.memory.remapped_rows", "{row}", UpDownCounter, ["gpu.remap.type"], Errors,
        "nvmlDeviceGetRemappedRows", "Rows remapped for correctable or uncorrectable errors (Ampere and newer).";
    RemapPending = "gpu.memory.remap.pending", "{state}", Gauge, [], Errors,
        "nvmlDeviceGetRemappedRows", "1 if a row remap is waiting for a GPU reset.";
    RemapFailure = "gpu.memory.remap.failure", "{state}", Gauge, [], Errors,
        "nvmlDeviceGetRemappedRows", "1 if a row remap has failed: the GPU needs service.";
    RecoveryAction = "gpu.recovery_action", "{state}", Gauge, ["gpu.recovery_action"], Errors,
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)", "1 for the recovery action the driver asks for (none, gpu_reset, node_reboot, drain_p2p, drain_and_reset, recover_imex_domain; unknown for a value newer than Junction).";
    PcieThroughput = "gpu.pcie.throughput", "By/s", Gauge, ["network.io.direction"], Pcie,
        "nvmlDeviceGetPcieThroughput (KiB/s)", "PCIe throughput over the last 20 ms.";
    GpuIo = "hw.gpu.io", "By", Counter, ["network.io.direction", "hw.vendor", "hw.model", "hw.name", "hw.serial_number", "hw.driver_version", "hw.firmware_version"], Pcie,
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_PCIE_COUNT_TX_BYTES/RX_BYTES)", "Bytes the GPU sent (transmit) and received over PCIe since the driver loaded; absent on drivers without the counters.";
    PcieReplay = "gpu.pcie.replay", "{replay}", Counter, [], Pcie,
        "nvmlDeviceGetPcieReplayCounter", "PCIe replays.";
    PcieGeneration = "gpu.pcie.link.generation", "{generation}", Gauge, ["gpu.pcie.link.state"], Pcie,
        "nvmlDeviceGetCurrPcieLinkGeneration, nvmlDeviceGetMaxPcieLinkGeneration", "PCIe link generation: current or max.";
    PcieWidth = "gpu.pcie.link.width", "{lane}", Gauge, ["gpu.pcie.link.state"], Pcie,
        "nvmlDeviceGetCurrPcieLinkWidth, nvmlDeviceGetMaxPcieLinkWidth", "PCIe link width in lanes: current or max.";
    NvlinkState = "gpu.nvlink.state", "{state}", Gauge, ["gpu.nvlink.link"], Nvlink,
        "nvmlDeviceGetNvLinkState", "1 if the NVLink link is active.";
    NvlinkIo = "gpu.nvlink.io", "By", Counter, ["gpu.nvlink.link", "network.io.direction"], Nvlink,
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX) (KiB)", "NVLink data bytes transmitted and received.";
    NvlinkErrors = "gpu.nvlink.errors", "{error}", Counter, ["gpu.nvlink.link", "gpu.nvlink.error.type"], Nvlink,
        "nvmlDeviceGetNvLinkErrorCounter; NVLink5: nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS / _SYMBOL_ERRORS)", "NVLink errors: replay, recovery, crc_flit, crc_data, ecc_data; on NVLink5, effective (left after FEC) and symbol (before FEC).";
    C2cState = "gpu.c2c.link.state", "{state}", Gauge, ["gpu.c2c.link"], Nvlink,
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_C2C_LINK_GET_STATUS)", "1 if the C2C link between the GPU and its Grace CPU (GH200, GB200) is up.";
    C2cMaxBandwidth = "gpu.c2c.link.max_bandwidth", "By/s", Gauge, ["gpu.c2c.link"], Nvlink,
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_C2C_LINK_GET_MAX_BW) (MB/s)", "The most a C2C link carries.";
    C2cErrors = "gpu.c2c.errors", "{error}", Counter, ["gpu.c2c.link", "gpu.c2c.error.type"], Nvlink,
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_C2C_LINK_ERROR_INTR / _REPLAY / _REPLAY_B2B)", "C2C link errors: interrupt, replay, replay_b2b.";
    NvlinkBer = "gpu.nvlink.ber", "1", Gauge, ["gpu.nvlink.link", "gpu.nvlink.ber.type"], Nvlink,
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER / _SYMBOL_BER), mantissa × 10^-exponent", "NVLink5 bit-error rate per link: effective (after FEC; DCGM fails a link above 1e-12) and symbol (before FEC).";
    NvlinkFecHistory = "gpu.nvlink.fec.history", "{error}", Counter, ["gpu.nvlink.fec.bin"], Nvlink,
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_COUNT_FEC_HISTORY_0 … _15), summed over the GPU's links", "NVLink5 FEC history: the driver's count of corrected symbol errors in each of its 16 bins (0–15), added up over the GPU's links (per link it would be 288 series a GPU; the per-link BERs say which link).";
    NvlinkRecovery = "gpu.nvlink.link_recovery", "{event}", Counter, ["gpu.nvlink.link", "gpu.nvlink.recovery.outcome"], Nvlink,
        "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_*) per link", "NVLink link-recovery events: successful, failed, all (Blackwell and newer).";
    ProcessCount = "gpu.processes", "{process}", UpDownCounter, ["gpu.process.type"], Processes,
        "nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetGraphicsRunningProcesses_v3", "Processes with a compute or graphics context on the GPU.";
    ProcessMemory = "gpu.process.memory.usage", "By", UpDownCounter, ["process.pid", "process.executable.name", "container.id", "k8s.pod.uid", "k8s.namespace.name", "k8s.pod.name", "slurm.job.id", "gpu.process.type", "gpu.mig.gpu_instance_id"], Processes,
        "nvmlDeviceGet{Compute,Graphics}RunningProcesses_v3 (entry size read off the driver's answer), /proc/PID/exe or nvmlSystemGetProcessName, /proc/PID/cgroup", "Device memory used by a process (capped per GPU by max_processes_per_gpu); absent when the driver does not know it. container.id and k8s.pod.uid when the cgroup names them.";
    ProcessUtilization = "gpu.process.utilization", "1", Gauge, ["process.pid", "process.executable.name", "container.id", "k8s.pod.uid", "k8s.namespace.name", "k8s.pod.name", "slurm.job.id", "hw.gpu.task"], Processes,
        "nvmlDeviceGetProcessUtilization (newest sample per pid)", "Fraction of the last sample period a process kept the SMs (general), memory, encoder or decoder busy.";
    DriverCalls = "gpu.process.driver.calls", "{call}", Counter, ["process.pid", "process.executable.name", "container.id", "k8s.pod.uid", "k8s.namespace.name", "k8s.pod.name", "slurm.job.id", "gpu.driver.call"], Processes,
        "eBPF: ioctl() on /dev/nvidia*, /dev/nvidia-uvm (sources.ebpf)", "NVIDIA driver calls a process made, by kind: rm_alloc, rm_free, rm_control, rm_map_memory, register_fd, attach_gpus, uvm_initialize, uvm_register_gpu, other_rm, other_uvm. Seen however briefly the process lived.";
    DriverCallFailures = "gpu.process.driver.call.failures", "{call}", Counter, ["process.pid", "process.executable.name", "container.id", "k8s.pod.uid", "k8s.namespace.name", "k8s.pod.name", "slurm.job.id", "gpu.driver.call"], Processes,
        "eBPF: the ioctl's return value and the driver's status field", "Driver calls that failed (the syscall failed, or the driver answered a status other than NV_OK).";
    DriverCallTime = "gpu.process.driver.call.time", "s", Counter, ["process.pid", "process.executable.name", "container.id", "k8s.pod.uid", "k8s.namespace.name", "k8s.pod.name", "slurm.job.id", "gpu.driver.call"], Processes,
        "eBPF: time between ioctl entry and return", "Time spent in driver calls, by kind (divide by gpu.process.driver.calls for the mean latency).";
    DriverMemoryAllocated = "gpu.process.driver.memory.allocated", "By", Counter, ["process.pid", "process.executable.name", "container.id", "k8s.pod.uid", "k8s.namespace.name", "k8s.pod.name", "slurm.job.id"], Processes,
        "eBPF: NV_ESC_RM_ALLOC of NV01_MEMORY_LOCAL_USER / NV01_MEMORY_SYSTEM, NV_MEMORY_ALLOCATION_PARAMS.size", "Bytes of GPU and GPU-mapped system memory the process allocated through the driver (the CUDA driver's large blocks, not cudaMalloc sizes).";
    DriverMemoryFreed = "gpu.process.driver.memory.freed", "By", Counter, ["process.pid", "process.executable.name", "container.id", "k8s.pod.uid", "k8s.namespace.name", "k8s.pod.name", "slurm.job.id"], Processes,
        "eBPF: NV_ESC_RM_FREE of those objects (or of a parent, or of the client); the process's end (sched_process_exit)", "Bytes of driver memory the process freed, including what it still held when it ended (the driver frees that as its descriptors close).";
    DriverMemoryMapped = "gpu.process.driver.memory.mapped", "By", Counter, ["process.pid", "process.executable.name", "container.id", "k8s.pod.uid", "k8s.namespace.name", "k8s.pod.name", "slurm.job.id"], Processes,
        "eBPF: NV_ESC_RM_MAP_MEMORY length", "Bytes the process mapped into its address space through the driver.";
    DriverMemoryUsage = "gpu.process.driver.memory.usage", "By", UpDownCounter, ["process.pid", "process.executable.name", "container.id", "k8s.pod.uid", "k8s.namespace.name", "k8s.pod.name", "slurm.job.id"], Processes,
        "eBPF: allocations minus frees, attributed to a GPU through the RM object tree and UVM_REGISTER_GPU", "Driver memory a process holds on a GPU now (hw.id); one series, possibly 0, for every GPU the process registered or opened; 0 once it has ended.";
    Contexts = "gpu.process.contexts", "{context}", UpDownCounter, ["process.pid", "process.executable.name", "container.id", "k8s.pod.uid", "k8s.namespace.name", "k8s.pod.name", "slurm.job.id"], Processes,
        "eBPF: NV_ESC_RM_ALLOC of KEPLER_CHANNEL_GROUP_A with the graphics/compute engine", "Graphics/compute contexts (channel groups) a process holds on a GPU (hw.id); 0 once it has ended.";
    EbpfProcesses = "junction.ebpf.processes", "{process}", UpDownCounter, [], Status,
        "agent", "Processes the eBPF source is tracking (live, and ended within exited_retention_secs).";
    EbpfRecords = "junction.ebpf.records", "{record}", Counter, [], Status,
        "agent", "Records read from the BPF ring buffer (allocations, frees, GPU registrations, first use of a device, slow calls, exits).";
    EbpfLost = "junction.ebpf.lost", "{record}", Counter, ["junction.reason"], Status,
        "agent", "What the BPF programs could not record: ring_full (records dropped), inflight_full, processes_full, unreadable (parameter blocks that could not be read).";
    MigMode = "gpu.mig.mode", "{state}", Gauge, [], Mig,
        "nvmlDeviceGetMigMode", "1 if MIG mode is enabled.";
    MigMemoryUsage = "gpu.mig.memory.usage", "By", UpDownCounter, ["hw.parent", "gpu.mig.gpu_instance_id", "gpu.mig.compute_instance_id", "gpu.mig.profile"], Mig,
        "nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceGetMemoryInfo_v2", "Memory used in a MIG instance (hw.id is the MIG UUID).";
    MigMemoryLimit = "gpu.mig.memory.limit", "By", UpDownCounter, ["hw.parent", "gpu.mig.gpu_instance_id", "gpu.mig.compute_instance_id", "gpu.mig.profile"], Mig,
        "nvmlDeviceGetMemoryInfo_v2", "Memory of a MIG instance (hw.id is the MIG UUID).";
    MigProcesses = "gpu.mig.processes", "{process}", UpDownCounter, ["hw.parent", "gpu.mig.gpu_instance_id", "gpu.mig.compute_instance_id", "gpu.mig.profile"], Mig,
        "nvmlDeviceGetComputeRunningProcesses_v3 on the MIG handle", "Compute processes in a MIG instance.";
    GpmSmActivity = "gpu.sm.activity", "1", Gauge, ["gpu.mig.gpu_instance_id"], Gpm,
        "nvmlGpmMetricsGet(NVML_GPM_METRIC_SM_UTIL)", "Fraction of SMs busy, averaged over the GPM interval (DCGM PROF_SM_ACTIVE).";
    GpmSmOccupancy = "gpu.sm.occupancy", "1", Gauge, ["gpu.mig.gpu_instance_id"], Gpm,
        "nvmlGpmMetricsGet(NVML_GPM_METRIC_SM_OCCUPANCY)", "Resident warps as a fraction of the maximum (DCGM PROF_SM_OCCUPANCY).";
    GpmGraphicsActivity = "gpu.graphics.activity", "1", Gauge, ["gpu.mig.gpu_instance_id"], Gpm,
        "nvmlGpmMetricsGet(NVML_GPM_METRIC_GRAPHICS_UTIL)", "Fraction of time the graphics engine was active (DCGM PROF_GR_ENGINE_ACTIVE).";
    GpmPipeActivity = "gpu.pipe.activity", "1", Gauge, ["gpu.pipe", "gpu.mig.gpu_instance_id"], Gpm,
        "nvmlGpmMetricsGet(ANY_TENSOR/DFMA_TENSOR/FP64/FP32/FP16_UTIL)", "Fraction of cycles a pipe was active: tensor, tensor_dfma, fp64, fp32, fp16.";
    GpmDramActivity = "gpu.dram.activity", "1", Gauge, ["gpu.mig.gpu_instance_id"], Gpm,
        "nvmlGpmMetricsGet(NVML_GPM_METRIC_DRAM_BW_UTIL)", "DRAM bandwidth used as a fraction of peak (DCGM PROF_DRAM_ACTIVE).";
    GpmPcieThroughput = "gpu.gpm.pcie.throughput", "By/s", Gauge, ["network.io.direction", "gpu.mig.gpu_instance_id"], Gpm,
        "nvmlGpmMetricsGet(NVML_GPM_METRIC_PCIE_TX/RX_PER_SEC) (MiB/s)", "PCIe bytes per second over the GPM interval.";
    GpmNvlinkThroughput = "gpu.gpm.nvlink.throughput", "By/s", Gauge, ["network.io.direction", "gpu.mig.gpu_instance_id"], Gpm,
        "nvmlGpmMetricsGet(NVML_GPM_METRIC_NVLINK_TOTAL_TX/RX_PER_SEC) (MiB/s)", "NVLink bytes per second over the GPM interval, all links.";
    PersistenceMode = "gpu.persistence_mode", "{state}", Gauge, [], Config,
        "nvmlDeviceGetPersistenceMode", "1 if persistence mode is on (the driver stays initialised without a client; DCGM and GPUd flag it off).";
    EccMode = "gpu.ecc.mode", "{state}", Gauge, ["gpu.mode.setting"], Config,
        "nvmlDeviceGetEccMode", "1 if ECC is on: now (current), and after the next GPU reset (pending).";
    MigModePending = "gpu.mig.mode.pending", "{state}", Gauge, [], Mig,
        "nvmlDeviceGetMigMode", "1 if MIG mode will be on after the next GPU reset.";
    ComputeMode = "gpu.compute_mode", "{mode}", Gauge, ["gpu.compute_mode"], Config,
        "nvmlDeviceGetComputeMode", "1 for the GPU's compute mode: default, exclusive_thread, prohibited or exclusive_process.";
    GspFirmware = "gpu.gsp.firmware", "{state}", Gauge, ["hw.firmware_version", "gpu.gsp.default"], Config,
        "nvmlDeviceGetGspFirmwareMode, nvmlDeviceGetGspFirmwareVersion", "1 if the GPU runs the GSP firmware (its version in hw.firmware_version; gpu.gsp.default whether that is the driver's default), 0 if not.";
    FabricState = "gpu.fabric.state", "{state}", Gauge, ["gpu.fabric.state"], Config,
        "nvmlDeviceGetGpuFabricInfoV (v3; nvmlDeviceGetGpuFabricInfo before R550)", "The GPU's registration in the NVLink fabric, one series per state (not_started, in_progress, completed): 1 for the current one. Only where the GPU has a fabric state (NVSwitch systems, GB200/GH200).";
    FabricInfo = "gpu.fabric.info", "{info}", Gauge, ["gpu.fabric.cluster_uuid", "gpu.fabric.clique_id", "gpu.fabric.status"], Config,
        "nvmlDeviceGetGpuFabricInfoV", "The fabric the GPU is registered in: cluster UUID, clique id, and the fabric manager's answer once registration completed (success, or the NVML error).";
    FabricHealth = "gpu.fabric.health", "{state}", Gauge, ["gpu.fabric.health.check"], Config,
        "nvmlDeviceGetGpuFabricInfoV (healthMask, healthSummary)", "1 if a fabric health check fails: degraded_bandwidth, route_recovery, route_unhealthy, access_timeout_recovery, incorrect_configuration, summary (the driver's own summary: unhealthy or limited capacity); only the checks the GPU reports.";
    FabricHealthMask = "gpu.fabric.health_mask", "{bitmask}", Gauge, [], Config,
        "nvmlDeviceGetGpuFabricInfoV (healthMask)", "The raw fabric health mask (a healthy GPU reads 0x1AA = 426, not 0).";
    P2pPeers = "gpu.p2p.peers", "{gpu}", Gauge, ["gpu.p2p.capability", "gpu.p2p.missing"], Config,
        "nvmlDeviceGetP2PStatus with every other GPU (read at start and every 6 config collections)", "Other GPUs this one has P2P with, per capability (read, write, nvlink, atomics); gpu.p2p.missing lists the NVML indices of those it lacks it with (at most 16).";
    KernelModule = "node.kernel_module.loaded", "{state}", Gauge, ["kernel.module"], Status,
        "/proc/modules", "1 for each NVIDIA kernel module that is loaded (nvidia, nvidia_uvm, nvidia_modeset, nvidia_drm, nvidia_peermem, nvidia_fs), 0 for each that is not.";
    DaemonUp = "node.daemon.up", "{state}", Gauge, ["node.daemon"], Status,
        "/proc (the process's name and executable, owned by root)", "1 if the NVIDIA daemon runs: nvidia-persistenced, nv-fabricmanager, nvidia-imex, nv-hostengine.";
    DaemonRestarts = "node.daemon.restarts", "{restart}", Counter, ["node.daemon"], Status,
        "/proc", "Times the daemon was seen under a new pid since the agent started (a restart).";
    ConfigDrift = "node.config.drift", "{setting}", Gauge, ["junction.setting"], Status,
        "derived ([expect] against NVML and the host source)", "1 for each setting that differs from [expect] on some GPU or on the node (docs/HEALTH.md: config_drift).";
    XidErrors = "gpu.xid.errors", "{error}", Counter, ["gpu.xid", "gpu.xid.category"], Errors,
        "kernel log (NVRM: Xid lines, /dev/kmsg or files), nvmlEventSetWait(NVML_EVENT_TYPE_XID_CRITICAL_ERROR)", "XID errors per GPU and code, counted once across paths; kept across agent restarts, reset at reboot. A GPU the inventory does not know has hw.id PCI-dddd:bb:dd.";
    XidLast = "gpu.xid.last_time", "s", Gauge, [], Errors,
        "kernel log, NVML events", "Unix time of the last XID on the GPU.";
    SxidErrors = "gpu.sxid.errors", "{error}", Counter, ["hw.type", "gpu.sxid", "gpu.sxid.severity"], Errors,
        "kernel log (nvidia-nvswitch SXid lines)", "NVSwitch SXid errors per switch (hw.id NVSwitch-PCI-…), code and severity; companion lines are not counted.";
    KmsgRecords = "junction.kmsg.records", "{record}", Counter, ["junction.input"], Status,
        "agent", "Kernel-log records read: /dev/kmsg records or file lines.";
    KmsgLost = "junction.kmsg.lost", "{record}", Counter, [], Status,
        "agent", "/dev/kmsg records overwritten before they were read (EPIPE: sequence gaps) or too large to read.";
    KmsgIgnored = "junction.kmsg.ignored", "{record}", Counter, ["junction.input"], Status,
        "agent", "Kernel-log records not read for XIDs because the kernel did not write them: /dev/kmsg records of another facility, file lines without the kernel's syslog tag, lines over 64 KiB (accept_user_records reads the first two).";
    Voltage = "hw.voltage", "V", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target"], Status,
        "Redfish Sensor (ReadingType Voltage), IPMI sensors in V", "A voltage a BMC reports (hw.id is the sensor; hw.parent what it sits on, a GPU's UUID for a GPU NVML reports).";
    FanRpm = "hw.fan.speed", "rpm", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target"], Status,
        "Redfish Fan / Sensor (Rotational), legacy Thermal Fans, IPMI fan sensors", "Fan speed a BMC reports.";
    CoolantFlow = "cooling.flow", "L/min", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target", "cooling.coolant.point"], Status,
        "Redfish CoolantConnector.FlowLitersPerMinute, Sensor (LiquidFlowLPM, LiquidFlow), IPMI flow sensors", "Coolant flow through a loop, connector or cold plate.";
    CoolantPressure = "cooling.pressure", "kPa", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target", "cooling.coolant.point"], Status,
        "Redfish CoolantConnector.{Supply,Return,Delta}PressurekPa, Pump.InletPressurekPa, Filter.DeltaLiquidPressurekPa, Sensor (PressurekPa, PressurePa, Pressure)", "Coolant pressure relative to atmosphere (delta: across the connector or filter).";
    CoolantTemperature = "cooling.coolant.temperature", "Cel", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target", "cooling.coolant.point"], Status,
        "Redfish CoolantConnector.{Supply,Return,Delta}TemperatureCelsius", "Coolant temperature at a connector: supply, return, or the difference (delta).";
    HeatRemoved = "cooling.heat_removed", "W", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target"], Status,
        "Redfish CoolantConnector.HeatRemovedkW, Sensor (Heat, kW)", "Heat the coolant carries away.";
    PumpSpeed = "cooling.pump.speed", "rpm", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target"], Status,
        "Redfish Pump.PumpSpeedPercent.SpeedRPM, IPMI pump tachometers", "Pump speed.";
    PumpSpeedRatio = "cooling.pump.speed_ratio", "1", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target"], Status,
        "Redfish Pump.PumpSpeedPercent.Reading", "Pump speed as a fraction of its maximum.";
    CoolantLevel = "cooling.coolant.level", "1", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target"], Status,
        "Redfish Reservoir.FluidLevelPercent, CoolingLoop.CoolantLevelPercent", "Coolant level in a reservoir or loop, as a fraction of full.";
    Humidity = "cooling.humidity", "1", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target"], Status,
        "Redfish Sensor (Humidity), EnvironmentMetrics.HumidityPercent, LeakDetectorGroups.HumidityPercent", "Relative humidity.";
    ValvePosition = "cooling.valve.position", "1", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target"], Status,
        "Redfish CoolantConnector.ValvePositionPercent, Sensor (Valve)", "How far a valve is open (1 = fully open).";
    LeakState = "cooling.leak.detector.state", "1", UpDownCounter, ["hw.type", "hw.name", "hw.parent", "junction.target", "cooling.leak.state"], Status,
        "Redfish LeakDetector.DetectorState, LeakDetectorGroups.Detectors, IPMI discrete leak sensors", "1 for the leak detector's current state (ok, warning, critical, unavailable, absent), 0 for the others.";
    SensorReading = "bmc.sensor.reading", "{reading}", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target", "bmc.sensor.unit"], Status,
        "Redfish Sensor, IPMI sensor", "A BMC reading with no more specific metric (current, frequency, liquid level, altitude, …), in bmc.sensor.unit; a thermal margin in Cel (degrees below a part's limit: Intel's DTS, a sensor named … Margin, and a GPU's or CPU's T.Limit, a Temperature sensor whose thresholds are all lower ones at or below 0, one negative: HGX_GPU_SXM_n_TEMP_1, a DGX's TLIMIT_GB_SXMn, a GB200's ProcessorModule_n_CPU_0_TempLimit_0), which is not a temperature.";
    SensorState = "bmc.sensor.state", "1", UpDownCounter, ["hw.type", "hw.name", "hw.parent", "junction.target", "bmc.sensor.state"], Status,
        "Redfish Sensor thresholds and Status.Health, IPMI sensor state", "1 for the sensor's current state against its thresholds (ok, warning, critical), 0 for the others: quantities the conventions have no family for (flow, pressure, current, …); temperatures, voltages and fan speeds are hw.status.";
    SensorThreshold = "bmc.sensor.threshold", "{reading}", Gauge, ["hw.type", "hw.name", "hw.parent", "junction.target", "bmc.threshold", "bmc.sensor.unit"], Status,
        "Redfish Sensor.Thresholds, legacy Thermal thresholds, IPMI SDR thresholds", "A sensor threshold (lower/upper caution, critical, fatal) in the reading's unit (bmc.sensor.unit), for the quantities bmc.sensor.state covers; temperatures, voltages and fan speeds are hw.*.limit.";
    ComponentInfo = "bmc.component.info", "{component}", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.model", "hw.serial_number", "junction.target"], Status,
        "Redfish Chassis, ThermalEquipment units, loops, connectors, pumps, filters, reservoirs, leak detectors; IPMI BMC", "A component a BMC reports, with its identity; always 1.";
    ComponentHealth = "bmc.component.health", "1", UpDownCounter, ["hw.type", "hw.name", "hw.parent", "junction.target", "bmc.health"], Status,
        "Redfish Status.Health of a chassis that is one of this node's GPUs", "1 for the health the BMC reports for a GPU NVML also reports (ok, warning, critical), 0 for the others; the GPU's hw.status is Junction's verdict alone.";
    HostPower = "hw.host.power", "W", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target"], Status,
        "Redfish EnvironmentMetrics.PowerWatts or PowerControl.PowerConsumedWatts of the host chassis (a root chassis of a server's type); IPMI system power sensors", "Power drawn by the whole host, as its BMC measures it (never summed with hw.power: the host's total contains its components).";
    HostEnergy = "hw.host.energy", "J", Counter, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target"], Status,
        "Redfish EnvironmentMetrics.EnergyJoules / EnergykWh of the host chassis", "Energy consumed by the whole host, as its BMC counts it.";
    HostAmbient = "hw.host.ambient_temperature", "Cel", Gauge, ["hw.name", "junction.target"], Status,
        "a host BMC's warmest air-intake temperature sensor (Redfish PhysicalContext Intake, Room; IPMI sensors named inlet, ambient, intake)", "The temperature of the air the host takes in (hw.id: the host; hw.name: the sensor).";
    HostHeatingMargin = "hw.host.heating_margin", "Cel", Gauge, ["hw.name", "junction.target"], Status,
        "a host BMC's temperature sensors and their upper caution (else critical) thresholds", "How many degrees the host's temperature can rise before a sensor reaches its warning threshold: the least over its sensors (hw.name: that sensor; negative past it).";
    PowerSupplyUsage = "hw.power_supply.usage", "W", UpDownCounter, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target"], Status,
        "Redfish PowerSupplyMetrics.OutputPowerWatts, legacy PowerSupplies.PowerOutputWatts; IPMI power-supply output sensors", "Power a power supply delivers (its input, which holds everything the host draws through it, is bmc.power{hw.type=power_supply}).";
    BmcPower = "bmc.power", "W", Gauge, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target"], Status,
        "Redfish Sensor (Power), EnvironmentMetrics.PowerWatts and PowerControl of a chassis that is not the host, PowerSupplyMetrics.InputPowerWatts; IPMI sensors in W", "A BMC power reading that another series already counts or that sums others: its copy of a GPU's draw (hw.type gpu; hw.parent the GPU where NVML reports it), a supply's input (hw.type power_supply), a sub-total (a GPU baseboard, a chassis inside the host), an interval statistic, or a reading whose context names no one component.";
    BmcEnergy = "bmc.energy", "J", Counter, ["hw.type", "hw.name", "hw.parent", "hw.sensor_location", "junction.target"], Status,
        "Redfish Sensor (EnergyJoules, EnergyWh, EnergykWh) and EnvironmentMetrics of a GPU or a chassis that is not the host", "A BMC energy counter that another series already counts or that sums others (as bmc.power).";
    VoltageLimit = "hw.voltage.limit", "V", Gauge, ["hw.sensor_location", "hw.limit_type", "hw.type", "hw.name", "hw.parent", "junction.target"], Status,
        "Redfish Sensor.Thresholds, legacy Power Voltages thresholds, IPMI SDR thresholds", "A voltage sensor's thresholds, as OpenTelemetry's hw.limit_type names them (low.critical, low.degraded, high.degraded, high.critical; fatal ones high.fatal, low.fatal).";
    FanRpmLimit = "hw.fan.speed.limit", "rpm", Gauge, ["hw.sensor_location", "hw.limit_type", "hw.type", "hw.name", "hw.parent", "junction.target"], Status,
        "Redfish Sensor.Thresholds, legacy Thermal Fans thresholds, IPMI SDR thresholds", "A fan's speed thresholds, as hw.voltage.limit names them.";
    TargetUp = "junction.target.up", "{state}", Gauge, ["junction.source", "junction.target"], Status,
        "agent", "1 if the last poll of a BMC target succeeded.";
    TargetPollDuration = "junction.target.poll.duration", "s", Gauge, ["junction.source", "junction.target"], Status,
        "agent", "How long the last poll of a BMC target took (up to its timeout).";
    TargetRequests = "junction.target.requests", "{request}", Counter, ["junction.source", "junction.target"], Status,
        "agent", "Requests made to a BMC target (HTTP requests; IPMI tool runs).";
    TargetPollFailures = "junction.target.poll.failures", "{poll}", Counter, ["junction.source", "junction.target", "error.type"], Status,
        "agent", "Polls of a BMC target that failed, by reason (timeout, auth, tls, connect, protocol).";
    PodGpuAllocation = "gpu.k8s.allocation", "{device}", Gauge, ["k8s.namespace.name", "k8s.pod.name", "k8s.container.name", "gpu.resource.name"], Status,
        "kubelet pod-resources API (v1 List)", "1 for each GPU or MIG device (hw.id: the device plugin's id, a GPU or MIG UUID) the kubelet allocated to a container; join on hw.id to name the pod on any per-GPU series.";
    NetworkUp = "hw.network.up", "1", UpDownCounter, ["hw.type", "hw.name", "nic.port"], Status,
        "/sys/class/infiniband/*/ports/*/state and phys_state", "1 if the NIC port is ACTIVE and LinkUp (EFA's driver always says so).";
    NetworkBandwidthLimit = "hw.network.bandwidth.limit", "By/s", UpDownCounter, ["hw.type", "hw.name", "nic.port"], Status,
        "/sys/class/infiniband/*/ports/*/rate", "The NIC port's link rate.";
    NetworkIo = "hw.network.io", "By", Counter, ["hw.type", "hw.name", "nic.port", "network.io.direction"], Status,
        "/sys/class/infiniband/*/ports/*/counters/port_{xmit,rcv}_data (octets / 4), EFA hw_counters/{tx,rx}_bytes", "Bytes the NIC port sent and received.";
    NetworkPackets = "hw.network.packets", "{packet}", Counter, ["hw.type", "hw.name", "nic.port", "network.io.direction"], Status,
        "/sys/class/infiniband/*/ports/*/counters/port_{xmit,rcv}_packets, EFA hw_counters/{tx,rx}_pkts", "Packets the NIC port sent and received.";
    NicCounter = "nic.counter", "{event}", Counter, ["hw.type", "hw.name", "nic.port", "nic.counter", "nic.counter.source"], Status,
        "/sys/class/infiniband/*/ports/*/hw_counters/* (the driver's: mlx5 out_of_sequence, rnr_nak_retry_err, roce_adp_retrans, …; EFA's), counters/* that are no error", "A NIC port counter with no more specific metric, by name (at most 128 per directory), monotonic across 32-bit wraps and resets.";
    NicPortState = "nic.port.state", "{state}", Gauge, ["hw.type", "hw.name", "nic.port", "nic.port.state_type"], Status,
        "/sys/class/infiniband/*/ports/*/state, phys_state", "The port's logical state (1 DOWN … 4 ACTIVE) and physical state (2 Polling, 3 Disabled, 5 LinkUp, 6 LinkErrorRecovery, …) codes.";
    NicInfo = "nic.info", "{info}", Gauge, ["hw.type", "hw.name", "nic.port", "nic.link_layer", "network.interface.name", "nic.pci.bdf", "nic.numa_node", "hw.firmware_version", "hw.model", "nic.driver"], Status,
        "/sys/class/infiniband/*: fw_ver, hca_type, device (PCI function, numa_node, driver), ports/*/link_layer, gid_attrs/ndevs", "A NIC port's identity; always 1.";
    NicReason = "nic.health.reason", "{state}", Gauge, ["hw.type", "hw.name", "nic.port", "nic.health.reason"], Status,
        "derived (the NIC rules, docs/HEALTH.md)", "1 for each reason the NIC port is not ok: port_down, port_absent, rate_below_expected, port_flapping, fatal_counter, error_rate.";
    GpuRail = "gpu.rail", "{nic}", Gauge, ["nic.device", "gpu.rail.affinity"], Status,
        "the PCIe tree in sysfs (realpath of /sys/bus/pci/devices/*), numa_node; sources.nic.rails", "1 for each NIC of the GPU's rail (hw.id: the GPU), with how it was found: switch, root_port, host_bridge, numa, config.";
    AerErrors = "pcie.aer.errors", "{error}", Counter, ["hw.type", "pcie.bdf", "pcie.aer.severity"], Status,
        "/sys/bus/pci/devices/*/aer_dev_{correctable,nonfatal,fatal} (TOTAL_ERR_*)", "AER errors a PCIe function logged, by severity (correctable, nonfatal, fatal): the GPUs (hw.id the GPU), NVSwitches, NICs and the ports above them (hw.id PCI-<address>).";
    AerErrorTypes = "pcie.aer.error_types", "{error}", Counter, ["hw.type", "pcie.bdf", "pcie.aer.severity", "error.type"], Status,
        "/sys/bus/pci/devices/*/aer_dev_{correctable,nonfatal,fatal}", "AER errors by the kernel's name for the error bit (RxErr, BadTLP, CmpltTO, Surprise Down Error, …), at most 32 per severity.";
    AerRootPortErrors = "pcie.aer.rootport.errors", "{error}", Counter, ["hw.type", "pcie.bdf", "pcie.aer.severity"], Status,
        "/sys/bus/pci/devices/*/aer_rootport_total_err_{cor,nonfatal,fatal}", "AER messages a root port received from its whole hierarchy, by severity.";
    PcieLinkSpeed = "pcie.link.speed", "{transfer}/s", Gauge, ["hw.type", "pcie.bdf", "pcie.link.state"], Status,
        "/sys/bus/pci/devices/*/{current,max}_link_speed (GT/s)", "PCIe link speed, current and max, in transfers per second.";
    PcieLinkWidth = "pcie.link.width", "{lane}", Gauge, ["hw.type", "pcie.bdf", "pcie.link.state"], Status,
        "/sys/bus/pci/devices/*/{current,max}_link_width", "PCIe link width in lanes, current and max.";
    KmsgSignatures = "kmsg.signature.events", "{event}", Counter, ["hw.type", "kmsg.signature"], Status,
        "kernel log (/dev/kmsg, files): the signature catalog (model/signatures.rs)", "Kernel messages beyond XID and SXid by signature (GSP timeouts and crashes, RmInitAdapter failures, NVLink training, nvidia-peermem, AER, mlx5, OOM kills, lockups, hung tasks, NVMe, file systems) and the component they name (hw.id: a GPU, PCI-<address>, disk:<name>, or node); counted once across paths, kept across agent restarts, reset at reboot.";
    NodeReason = "node.health.reason", "{state}", Gauge, ["node.health.reason"], Status,
        "derived (sources.pcie.expected_gpus, sources.nic.expected_ports); the kernel log's signature catalog", "1 for each reason the node is not whole: gpus_missing (fewer NVIDIA GPUs on the bus than expected), ports_missing (fewer active NIC ports than expected); from the kernel log, held for the boot: nvlink_training_failed, nvidia_module_load_failed, filesystem_read_only.";
    HealthAction = "gpu.health.action", "{state}", Gauge, ["gpu.health.action"], Status,
        "derived (the health rules)", "1 for the one action the GPU's reasons call for: none, restart_app, reset_gpu, reboot_node, drain_and_service (see gpu.health.reason).";
    TimeToThreshold = "gpu.temperature.time_to_threshold", "s", Gauge, ["hw.sensor_location"], Status,
        "derived: a robust trend of hw.temperature against hw.temperature.limit (throttled, the slowdown limit, for the die; max for the memory junction)", "Forecast time until the die or memory-junction temperature reaches its limit; present only while a steady rise toward it is seen (docs/HEALTH.md).";
    CoolantTimeToThreshold = "cooling.coolant.time_to_threshold", "s", Gauge, ["hw.name", "junction.target", "cooling.coolant.point"], Status,
        "derived: a robust trend of a BMC coolant supply temperature against its lowest upper threshold", "Forecast time until the coolant supply temperature reaches its upper threshold; present only while it rises steadily.";
    SourceUp = "junction.source.up", "{state}", Gauge, ["junction.source"], Status,
        "agent", "1 while a source is running and answering; a sink appears under its name only once it has panicked (0 while it is restarted, 1 after).";
    SourceErrors = "junction.source.errors", "{error}", Counter, ["junction.source", "junction.stage", "error.type", "junction.target"], Status,
        "agent", "Failed reads per source, stage and kind, with the GPU (hw.id) or target (junction.target) they concern: an NVML call that returned an error, a kernel-log read, a Redfish resource, a BMC poll, the kubelet's List, a health-rule input; a source's or sink's panic (junction.stage task, error.type panic: it is restarted; with hw.id, one GPU's NVML collection, opened again).";
    Events = "junction.events", "{event}", Counter, ["event.name"], Status,
        "agent", "Events recorded in the event log (health transitions, XIDs, …) since the agent started.";
    SinkExports = "junction.sink.exports", "{export}", Counter, ["junction.sink", "junction.signal"], Status,
        "agent", "Exports attempted per sink and signal (OTLP requests; /metrics scrapes served).";
    SinkExportFailures = "junction.sink.export.failures", "{export}", Counter, ["junction.sink", "junction.signal"], Status,
        "agent", "Exports that failed (receiver down, timed out, rejected).";
    SinkSentBytes = "junction.sink.sent", "By", Counter, ["junction.sink", "junction.signal"], Status,
        "agent", "Bytes put on the wire (OTLP/HTTP request bodies as sent, compressed when gzip is on).";
    SinkLastSuccess = "junction.sink.last_success", "s", Gauge, ["junction.sink", "junction.signal"], Status,
        "agent", "Unix time of the last successful export.";
    SinkQueue = "junction.sink.queue", "{event}", UpDownCounter, ["junction.sink"], Status,
        "agent", "Events waiting for delivery.";
    SinkEventsDropped = "junction.sink.events.dropped", "{event}", Counter, ["junction.sink"], Status,
        "agent", "Events lost before delivery: past the queue bound, or refused by the receiver.";
    HeapAllocated = "junction.memory.heap.allocated", "By", Gauge, [], Status,
        "agent (jemalloc stats.allocated, every 30 s)", "Bytes of the agent's own heap in live allocations; the C code's (the NVML library's) are not in it. Flat while the node is: growth with the same GPUs, processes and targets is a leak.";
    HeapActive = "junction.memory.heap.active", "By", Gauge, [], Status,
        "agent (jemalloc stats.active, every 30 s)", "Bytes of the pages holding the agent's live allocations, with the free slots of their slabs: what it has over junction.memory.heap.allocated is fragmentation.";
    HeapMetadata = "junction.memory.heap.metadata", "By", Gauge, [], Status,
        "agent (jemalloc stats.metadata, every 30 s)", "Bytes of the allocator's own bookkeeping, which it never hands back.";
    HeapResident = "junction.memory.heap.resident", "By", Gauge, [], Status,
        "agent (jemalloc stats.resident, every 30 s)", "Bytes of the pages backing the agent's own heap and the allocator's metadata, read after unused pages are handed back to the kernel.";
    HistoryMemory = "junction.history.memory", "By", Gauge, [], Status,
        "agent (the event history's entries and their strings, every 30 s)", "Bytes the event history (history.jsonl, kept in memory for the health rules) holds in the heap; it grows with XIDs, SXids, signatures and health transitions until health.history_max_bytes drops the oldest half.";
    NvmlTimeouts = "junction.nvml.timeouts", "{timeout}", Counter, [], Status,
        "agent", "NVML calls on this GPU that ran past call_timeout_ms.";
    NvmlStuck = "junction.nvml.stuck", "{state}", Gauge, [], Status,
        "agent", "1 while an NVML call on this GPU has been running past call_timeout_ms.";
    Disabled = "junction.nvml.disabled_features", "{feature}", UpDownCounter, [], Status,
        "agent", "NVML features disabled on this GPU (NOT_SUPPORTED or missing in the driver); `junction inventory` lists them.";
}

impl Metric {
    /// The descriptor.
    pub fn desc(self) -> &'static MetricDesc {
        &REGISTRY[self as usize]
    }
}

/// `METRICS.md`, generated from the registry.
pub fn metrics_markdown() -> String {
    let mut out = String::from(
        "# Metrics\n\n\
         Generated from the metric registry (`collector/src/model/registry.rs`) by `cargo xtask docs`;\n\
         do not edit by hand. Names follow the OpenTelemetry hardware semantic conventions first\n\
         (`hw.*`, semantic-conventions v1.44.0, the schema URL Junction's OTLP resource and scopes\n\
         carry; `tests/e2e/semconv/` checks the registry against them and lists what still\n\
         differs), then `gpu.*`; Prometheus names are the standard OTLP-to-Prometheus translation.\n\
         Every per-GPU series carries `hw.id` (the GPU UUID). Series of a MIG device (`gpu.mig.*`) carry its\n\
         MIG UUID as `hw.id`, with `hw.parent` = the GPU UUID and `gpu.mig.gpu_instance_id`. GPM metrics\n\
         sampled per GPU instance carry the GPU's `hw.id` and `gpu.mig.gpu_instance_id` (a GPU instance with\n\
         several compute instances is sampled once).\n\
         A metric whose NVML call is not supported on a GPU is absent for that GPU (see `junction inventory`).\n\
         Over OTLP with cumulative temporality, a counter's start time is when it began counting: the\n\
         host's boot for the hardware's counters (the driver's, the kernel's, the NICs', this boot's XIDs),\n\
         the agent's start for those Junction counts itself (`junction.*`, `gpu.process.driver.*`,\n\
         `node.daemon.restarts`), and none (unknown) for those that outlive a boot (the lifetime ECC\n\
         count, a BMC's counters); gauges and up-down counters carry the sink's start.\n\n\
         | name | Prometheus name | unit | type | attributes | NVML source | group |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for d in REGISTRY {
        let kind = match d.kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::UpDownCounter => "updowncounter",
        };
        let mut attrs = vec!["hw.id"];
        attrs.extend(d.attrs.iter().copied().filter(|a| *a != "hw.id"));
        if d.name == "junction.source.up" {
            attrs.retain(|a| *a != "hw.id");
        }
        let attrs = attrs
            .iter()
            .map(|a| format!("`{a}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "| `{}` | `{}` | `{}` | {} | {} | {} | {} |",
            d.name,
            d.prometheus_name(),
            d.unit,
            kind,
            attrs,
            d.source,
            d.group.name()
        );
    }
    out.push('\n');
    out.push_str(include_str!("conventions.md"));
    out.push_str("\n## Descriptions\n\n");
    for d in REGISTRY {
        let _ = writeln!(out, "- `{}`: {}", d.name, d.help);
    }
    out.push_str(&crate::sinks::dcgm::fields::markdown());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        let mut names: Vec<String> = REGISTRY.iter().map(MetricDesc::prometheus_name).collect();
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len());
    }

    #[test]
    fn committed_metrics_md_matches_the_registry() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../METRICS.md");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == metrics_markdown(),
            "METRICS.md is out of date: run `cargo xtask docs` and commit it"
        );
    }
}

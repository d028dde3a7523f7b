//! What Junction's BPF programs (`collector-ebpf`) and user space share: the NVIDIA ioctl
//! command values and parameter layouts, the decoder that turns a parameter block into a
//! [`Call`], the records the programs send through the ring buffer and the per-process
//! aggregate they keep, and the names of maps, programs and load-time globals.
//!
//! `#![no_std]` and free of allocation so that the BPF side compiles the same decoder that the
//! user-space unit tests exercise on byte buffers. Layouts and offsets come from the driver's
//! headers (`nv-ioctl-numbers.h`, `nv_escape.h`, `nvos.h`, `uvm_ioctl.h`); only fields that have
//! kept their offsets across driver branches are read.

#![no_std]

pub mod nv;

pub use nv::{Call, Op, ProcStats};

/// Map: per-process aggregates, `tgid (u32) -> ProcStats`.
pub const STATS_MAP: &str = "STATS";
/// Map: calls in flight, `tid (u32) -> Inflight`.
pub const INFLIGHT_MAP: &str = "INFLIGHT";
/// Map: the ring buffer of [`Call`] and [`Exit`] records.
pub const EVENTS_MAP: &str = "EVENTS";
/// Map: counters the programs keep about themselves (`u32 index -> u64`, see [`counter`]).
pub const COUNTERS_MAP: &str = "COUNTERS";

/// Capacity of the per-process map: processes tracked at once.
pub const MAX_PROCESSES: u32 = 8192;
/// Capacity of the in-flight map: threads inside an NVIDIA ioctl at once.
pub const MAX_INFLIGHT: u32 = 16384;
/// Size of the ring buffer (a power of two, a multiple of the page size): 1927 records of
/// 136 bytes (a [`Call`] and its header). Records are sent only for a process's first call on
/// a device, lifecycle calls (allocations, frees, clients, devices), slow calls and exits:
/// tens to thousands a second on a busy node. While records come, the reader drains the ring
/// every 100 ms, and it is woken when the ring is a quarter full, so it holds 100 ms of 19 000
/// records a second before the wake-up, far above that (after a quiet spell the first records
/// wait for the reader's next refresh, at most a second, or for a process's first record on
/// a device, which wakes it). Every page of it is resident in the agent (the reader maps the
/// data twice), so it is not larger than that needs; records lost to a full ring are counted
/// (`junction_ebpf_lost_total`, reason `ring_full`).
pub const RING_BYTES: u32 = 256 << 10;
/// Devices that `watch_devices` may name.
pub const MAX_WATCHED: usize = 8;

/// Indexes into [`COUNTERS_MAP`].
pub mod counter {
    /// Records lost because the ring buffer was full.
    pub const RING_FULL: u32 = 0;
    /// Calls not followed because the in-flight map was full.
    pub const INFLIGHT_FULL: u32 = 1;
    /// Processes not tracked because the per-process map was full.
    pub const STATS_FULL: u32 = 2;
    /// Parameter blocks that could not be read from user memory.
    pub const READ_FAILED: u32 = 3;
    /// Calls in flight now (not a loss: lets `sys_exit_ioctl` skip its lookup when 0).
    pub const INFLIGHT_NOW: u32 = 4;
    /// Number of counters.
    pub const N: u32 = 5;
}

/// Program names (the functions in `collector-ebpf`).
pub mod program {
    /// `tracepoint/syscalls/sys_enter_ioctl`.
    pub const SYS_ENTER_IOCTL: &str = "sys_enter_ioctl";
    /// `tracepoint/syscalls/sys_exit_ioctl`.
    pub const SYS_EXIT_IOCTL: &str = "sys_exit_ioctl";
    /// `tracepoint/sched/sched_process_exit`.
    pub const SCHED_PROCESS_EXIT: &str = "sched_process_exit";
    /// `kprobe` on the driver's ioctl entry points (`nvidia_unlocked_ioctl`,
    /// `uvm_unlocked_ioctl_entry`): `(struct file *, unsigned int cmd, unsigned long arg)`.
    pub const IOCTL_KPROBE: &str = "nv_ioctl_entry";
    /// `kretprobe` on the same entry points.
    pub const IOCTL_KRETPROBE: &str = "nv_ioctl_return";
    /// An empty `sys_enter_ioctl` program: the benchmark's floor.
    pub const EMPTY_ENTER: &str = "empty_enter";
    /// An empty `sys_exit_ioctl` program: the benchmark's floor.
    pub const EMPTY_EXIT: &str = "empty_exit";
}

/// Load-time globals (`EbpfLoader::override_global`).
pub mod global {
    /// `u32`: Junction's own tgid, never traced (it opens every GPU through NVML).
    pub const SELF_TGID: &str = "SELF_TGID";
    /// `u32`: trace only this tgid (0 = every process); for tests and benchmarks.
    pub const ONLY_TGID: &str = "ONLY_TGID";
    /// `u32`: major of `/dev/nvidia*` (195).
    pub const NV_MAJOR: &str = "NV_MAJOR";
    /// `u32`: major of `/dev/nvidia-uvm` (dynamic; 0 = none).
    pub const UVM_MAJOR: &str = "UVM_MAJOR";
    /// `u32`: major of `/dev/nvidia-caps/*` (dynamic; 0 = none).
    pub const CAPS_MAJOR: &str = "CAPS_MAJOR";
    /// `[u32; MAX_WATCHED]`: kernel-encoded device numbers treated as NVIDIA devices (0 = unused).
    pub const WATCHED: &str = "WATCHED";
    /// `Offsets`: kernel struct offsets read from BTF.
    pub const OFFSETS: &str = "OFFSETS";
    /// `u64`: calls slower than this (ns) are sent to user space whatever their kind.
    pub const SLOW_NS: &str = "SLOW_NS";
}

/// Kernel struct offsets, read from `/sys/kernel/btf/vmlinux` at start-up (Rust BPF programs get
/// no CO-RE relocations), for the walk `current->files->fdt->fd[fd]->f_inode->i_rdev`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offsets {
    /// `task_struct.files`.
    pub task_files: u32,
    /// `files_struct.fdt`.
    pub files_fdt: u32,
    /// `fdtable.max_fds`.
    pub fdt_max_fds: u32,
    /// `fdtable.fd`.
    pub fdt_fd: u32,
    /// `file.f_inode`.
    pub file_inode: u32,
    /// `inode.i_rdev`.
    pub inode_rdev: u32,
    /// `task_struct.group_leader`.
    pub task_group_leader: u32,
    /// `task_struct.comm`.
    pub task_comm: u32,
    /// `sched_process_exit`'s `group_dead` field in the tracepoint record (0 = absent: the
    /// thread-group leader's exit ends the process).
    pub exit_group_dead: u32,
    /// 1 once filled in (a program with zero offsets does nothing).
    pub valid: u32,
}

/// What a traced call is on: a `/dev/nvidia*` node, `/dev/nvidia-uvm`, or a watched device
/// (a test / advanced setting: decoded as both, whatever the call returned).
pub mod device {
    /// `/dev/nvidiactl`, `/dev/nvidiaN`, `/dev/nvidia-modeset`, `/dev/nvidia-caps/*`.
    pub const RM: u32 = 1;
    /// `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`.
    pub const UVM: u32 = 2;
    /// A `watch_devices` entry.
    pub const WATCHED: u32 = 3;
}

/// A call waiting for its `sys_exit_ioctl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Inflight {
    /// `bpf_ktime_get_ns` at entry.
    pub ts_ns: u64,
    /// The parameter block (the inner one for `NV_ESC_IOCTL_XFER_CMD`).
    pub params: u64,
    /// The command (the inner one for `NV_ESC_IOCTL_XFER_CMD`).
    pub cmd: u32,
    /// `kernel dev_t` of the file.
    pub rdev: u32,
    /// [`Op`] as u32.
    pub op: u32,
    /// [`device`] kind.
    pub device: u32,
    /// [`flag`] bits known at entry (`XFER`).
    pub flags: u32,
    /// The device's bit in [`ProcStats::devices`] (see [`device_bit`]).
    pub dev_bit: u32,
}

/// A device's bit in [`ProcStats::devices`], so that a process's first call on each device
/// is told without a map lookup: `/dev/nvidiaN` (N < 48) is bit N, a watched device bit
/// 48 + its index, `/dev/nvidia-modeset` 56, `/dev/nvidiactl` 57, `/dev/nvidia-uvm` 58,
/// `/dev/nvidia-uvm-tools` 59; everything else (higher minors, `/dev/nvidia-caps/*`) shares
/// bit 63.
pub mod device_bit {
    /// First watched device.
    pub const WATCHED: u32 = 48;
    /// `/dev/nvidia-modeset`.
    pub const MODESET: u32 = 56;
    /// `/dev/nvidiactl`.
    pub const CTL: u32 = 57;
    /// `/dev/nvidia-uvm`.
    pub const UVM: u32 = 58;
    /// `/dev/nvidia-uvm-tools`.
    pub const UVM_TOOLS: u32 = 59;
    /// Any other.
    pub const OTHER: u32 = 63;
}

/// Record kinds (the first `u32` of every ring-buffer record).
pub mod record {
    /// A [`super::Call`]: a decoded call that changes state (alloc, free, GPU registration,
    /// attach), or any slow call.
    pub const CALL: u32 = 1;
    /// A [`super::Call`] whose only news is that the process used a device it had not used
    /// (rdev), with its cgroup and command name.
    pub const DEVICE: u32 = 2;
    /// An [`super::Exit`]: the process ended; its final aggregates.
    pub const EXIT: u32 = 3;
}

/// Bits of [`Call::flags`].
pub mod flag {
    /// The call was on a watched device: decoded whatever it returned.
    pub const WATCHED: u32 = 1;
    /// Unwrapped from `NV_ESC_IOCTL_XFER_CMD`.
    pub const XFER: u32 = 2;
    /// The syscall succeeded and the driver's status was 0 (or the device is watched).
    pub const OK: u32 = 4;
    /// The call took longer than the slow-call threshold.
    pub const SLOW: u32 = 8;
    /// The parameter block could not be read.
    pub const UNREAD: u32 = 16;
}

/// The end of a process, with its final aggregates (the map entry is deleted).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Exit {
    /// [`record::EXIT`].
    pub kind: u32,
    /// The process.
    pub tgid: u32,
    /// `bpf_ktime_get_ns`.
    pub ts_ns: u64,
    /// Its aggregates at exit.
    pub stats: ProcStats,
}

impl Offsets {
    /// As the loader passes it (the same layout: ten `u32`s).
    pub fn to_words(&self) -> [u32; 10] {
        [
            self.task_files,
            self.files_fdt,
            self.fdt_max_fds,
            self.fdt_fd,
            self.file_inode,
            self.inode_rdev,
            self.task_group_leader,
            self.task_comm,
            self.exit_group_dead,
            self.valid,
        ]
    }
}

/// [`ProcStats`] as `u64` words, as user space reads the map value.
pub const PROC_STATS_WORDS: usize = 3 * nv::N_OPS + 3;

impl ProcStats {
    /// From the map value's words.
    pub fn from_words(w: &[u64; PROC_STATS_WORDS]) -> Self {
        let mut s = Self::default();
        let n = nv::N_OPS;
        s.calls.copy_from_slice(&w[..n]);
        s.failed.copy_from_slice(&w[n..2 * n]);
        s.latency_ns.copy_from_slice(&w[2 * n..3 * n]);
        s.mapped_bytes = w[3 * n];
        s.cgroup_id = w[3 * n + 1];
        s.devices = w[3 * n + 2];
        s
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    #[test]
    fn layouts_are_what_user_space_reads() {
        assert_eq!(core::mem::size_of::<Offsets>(), 40);
        assert_eq!(core::mem::size_of::<ProcStats>(), PROC_STATS_WORDS * 8);
        assert_eq!(core::mem::size_of::<Call>(), 128);
        assert_eq!(core::mem::offset_of!(Exit, stats), 16);
        let mut w = [0u64; PROC_STATS_WORDS];
        for (i, v) in w.iter_mut().enumerate() {
            *v = i as u64;
        }
        let s = ProcStats::from_words(&w);
        assert_eq!(s.calls[0], 0);
        assert_eq!(s.failed[0], nv::N_OPS as u64);
        assert_eq!(s.cgroup_id, (PROC_STATS_WORDS - 2) as u64);
        assert_eq!(s.devices, (PROC_STATS_WORDS - 1) as u64);
    }
}

//! Types and names shared by Junction's BPF programs (`collector-ebpf`) and user space.
//!
//! `#![no_std]` so that the BPF side can use it; the `user` feature is for user-space-only
//! impls (e.g. `aya::Pod`) when the eBPF source lands.

#![no_std]

/// Name of the map counting `ioctl()` calls per thread-group id (`HashMap<u32, u64>`).
pub const IOCTL_COUNTS_MAP: &str = "IOCTL_COUNTS";

/// Capacity of [`IOCTL_COUNTS_MAP`]: processes tracked at once.
pub const MAX_TRACKED_PROCESSES: u32 = 4096;

/// Name of the global that restricts counting to one thread-group id (0 = every process);
/// set at load time with `EbpfLoader::override_global`.
pub const FILTER_TGID_GLOBAL: &str = "FILTER_TGID";

/// The BPF program: attached to `syscalls/sys_enter_ioctl`.
pub const IOCTL_PROGRAM: &str = "sys_enter_ioctl";

//! Junction's BPF programs.
//!
//! For now one tracepoint on `sys_enter_ioctl` that counts `ioctl()` calls per process; the
//! eBPF attribution work replaces it with NVIDIA-ioctl decoding. Privileges: loading needs
//! root (CAP_BPF + CAP_PERFMON) and a mounted tracefs.

#![no_std]
#![no_main]

use aya_ebpf::helpers::bpf_get_current_pid_tgid;
use aya_ebpf::macros::{map, tracepoint};
use aya_ebpf::maps::HashMap;
use aya_ebpf::programs::TracePointContext;
use junction_common::MAX_TRACKED_PROCESSES;

/// `ioctl()` calls per thread-group id.
#[map(name = "IOCTL_COUNTS")]
static IOCTL_COUNTS: HashMap<u32, u64> = HashMap::with_max_entries(MAX_TRACKED_PROCESSES, 0);

/// Count only this tgid (0 = all); set by the loader.
#[unsafe(no_mangle)]
static FILTER_TGID: u32 = 0;

#[tracepoint]
pub fn sys_enter_ioctl(ctx: TracePointContext) -> u32 {
    match try_sys_enter_ioctl(&ctx) {
        Ok(()) | Err(_) => 0,
    }
}

fn try_sys_enter_ioctl(_ctx: &TracePointContext) -> Result<(), i64> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: a read of a global the loader may have rewritten; volatile so that the
    // compiler does not fold the default value in.
    let filter = unsafe { core::ptr::read_volatile(&FILTER_TGID) };
    if filter != 0 && filter != tgid {
        return Ok(());
    }
    match IOCTL_COUNTS.get_ptr_mut(&tgid) {
        // SAFETY: the map value is a u64 that lives as long as the entry. The bpfel target
        // has no atomic RMW in core; two threads of one process racing here can lose a count,
        // which a per-process call rate tolerates.
        Some(p) => unsafe { *p += 1 },
        None => IOCTL_COUNTS.insert(&tgid, &1, 0)?,
    }
    Ok(())
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

//! Junction's BPF programs: NVIDIA driver calls per process.
//!
//! `sys_enter_ioctl` keeps only calls on NVIDIA device files (the file's device number, read
//! through `current->files->fdt->fd[fd]->f_inode->i_rdev` with offsets user space reads from
//! BTF) whose command could be an NVIDIA request, and remembers them per thread;
//! `sys_exit_ioctl` decodes the parameter block with the call's answer, adds to the process's
//! aggregates with atomic adds (exact however many threads call at once) and sends state
//! changes (allocations, frees, GPU registration, first use of a device, slow calls) to user
//! space through a ring buffer. `sched_process_exit` sends a process's final aggregates and
//! forgets it. Where the driver's entry points can be kprobed, `nv_ioctl_entry` /
//! `nv_ioctl_return` do the same from inside the driver, so that other syscalls pay nothing.
//!
//! Loading needs CAP_BPF + CAP_PERFMON (root) and a mounted tracefs for the tracepoints.

#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![allow(internal_features)]

use core::intrinsics::{AtomicOrdering, atomic_or, atomic_xadd};
use core::ptr::read_volatile;

use aya_ebpf::helpers::{
    bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel,
    bpf_probe_read_user_buf,
};
use aya_ebpf::helpers::generated::{
    bpf_get_current_cgroup_id, bpf_get_current_task, bpf_ktime_get_ns,
};
use aya_ebpf::macros::{kprobe, kretprobe, map, tracepoint};
use aya_ebpf::maps::{Array, HashMap, RingBuf};
use aya_ebpf::EbpfContext as _;
use aya_ebpf::programs::{ProbeContext, RetProbeContext, TracePointContext};
use junction_common::nv::{self, Follow, N_OPS, Op, PARAMS_LEN};
use junction_common::{
    Call, Exit, Inflight, MAX_INFLIGHT, MAX_PROCESSES, MAX_WATCHED, Offsets, ProcStats, device_bit,
    RING_BYTES, counter, device, flag, record,
};

#[map(name = "STATS")]
static STATS: HashMap<u32, ProcStats> = HashMap::with_max_entries(MAX_PROCESSES, 0);

#[map(name = "INFLIGHT")]
static INFLIGHT: HashMap<u32, Inflight> = HashMap::with_max_entries(MAX_INFLIGHT, 0);

#[map(name = "EVENTS")]
static EVENTS: RingBuf = RingBuf::with_byte_size(RING_BYTES, 0);

#[map(name = "COUNTERS")]
static COUNTERS: Array<u64> = Array::with_max_entries(counter::N, 0);

// Globals the loader rewrites (`EbpfLoader::override_global`); read with `read_volatile` so
// that the compiler does not fold the defaults in.
#[unsafe(no_mangle)]
static SELF_TGID: u32 = 0;
#[unsafe(no_mangle)]
static ONLY_TGID: u32 = 0;
#[unsafe(no_mangle)]
static NV_MAJOR: u32 = nv::NV_MAJOR;
#[unsafe(no_mangle)]
static UVM_MAJOR: u32 = 0;
#[unsafe(no_mangle)]
static CAPS_MAJOR: u32 = 0;
#[unsafe(no_mangle)]
static WATCHED: [u32; MAX_WATCHED] = [0; MAX_WATCHED];
#[unsafe(no_mangle)]
static OFFSETS: Offsets = Offsets {
    task_files: 0,
    files_fdt: 0,
    fdt_max_fds: 0,
    fdt_fd: 0,
    file_inode: 0,
    inode_rdev: 0,
    task_group_leader: 0,
    task_comm: 0,
    exit_group_dead: 0,
    valid: 0,
};
#[unsafe(no_mangle)]
static SLOW_NS: u64 = 100_000_000;

const BPF_NOEXIST: u64 = 1;

static ZERO_STATS: ProcStats = ProcStats {
    calls: [0; N_OPS],
    failed: [0; N_OPS],
    latency_ns: [0; N_OPS],
    mapped_bytes: 0,
    cgroup_id: 0,
    devices: 0,
};

#[inline(always)]
fn bump(index: u32) {
    bump_by(index, 1);
}

#[inline(always)]
fn bump_by(index: u32, v: u64) {
    if let Some(p) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: a map value pointer the helper returned; atomic add on an aligned u64.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, v) };
    }
}

/// Reads a field of the tracepoint record directly (tracepoint programs may load from their
/// context; no helper call on the path every ioctl takes).
#[inline(always)]
fn tp_u64(ctx: &TracePointContext, off: usize) -> u64 {
    // SAFETY: `off` is inside the syscall tracepoint record (fields at 16, 24, 32).
    unsafe { core::ptr::read_volatile((ctx.as_ptr() as *const u8).add(off) as *const u64) }
}

/// Whether this process is traced at all.
#[inline(always)]
fn traced(tgid: u32) -> bool {
    // SAFETY: reads of globals.
    let (me, only) = unsafe { (read_volatile(&SELF_TGID), read_volatile(&ONLY_TGID)) };
    tgid != me && (only == 0 || only == tgid)
}

/// The [`device`] kind of a kernel `dev_t` and its [`device_bit`], if it is an NVIDIA (or
/// watched) device.
#[inline(always)]
fn device_kind(rdev: u32) -> Option<(u32, u32)> {
    // SAFETY: reads of globals.
    let watched = unsafe { read_volatile(&WATCHED) };
    let mut i = 0;
    while i < MAX_WATCHED {
        if watched[i] != 0 && watched[i] == rdev {
            return Some((device::WATCHED, device_bit::WATCHED + i as u32));
        }
        i += 1;
    }
    let (major, minor) = (rdev >> 20, rdev & 0xF_FFFF);
    // SAFETY: reads of globals.
    let (nv, uvm, caps) = unsafe {
        (
            read_volatile(&NV_MAJOR),
            read_volatile(&UVM_MAJOR),
            read_volatile(&CAPS_MAJOR),
        )
    };
    if major == nv {
        let bit = match minor {
            255 => device_bit::CTL,
            254 => device_bit::MODESET,
            m if m < device_bit::WATCHED => m,
            _ => device_bit::OTHER,
        };
        Some((device::RM, bit))
    } else if caps != 0 && major == caps {
        Some((device::RM, device_bit::OTHER))
    } else if uvm != 0 && major == uvm {
        let bit = if minor == 1 {
            device_bit::UVM_TOOLS
        } else {
            device_bit::UVM
        };
        Some((device::UVM, bit))
    } else {
        None
    }
}

/// `file->f_inode->i_rdev`.
#[inline(always)]
fn file_rdev(file: *const u8, off: &Offsets) -> Option<u32> {
    if file.is_null() {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel checks the address; offsets come from this kernel's BTF.
    unsafe {
        let inode: *const u8 =
            bpf_probe_read_kernel(file.add(off.file_inode as usize) as *const *const u8).ok()?;
        if inode.is_null() {
            return None;
        }
        bpf_probe_read_kernel(inode.add(off.inode_rdev as usize) as *const u32).ok()
    }
}

/// The device number of the current task's file descriptor `fd`.
#[inline(always)]
fn fd_rdev(fd: u64, off: &Offsets) -> Option<u32> {
    // SAFETY: as in `file_rdev`; every pointer is read with bpf_probe_read_kernel.
    unsafe {
        let task = bpf_get_current_task() as *const u8;
        let files: *const u8 =
            bpf_probe_read_kernel(task.add(off.task_files as usize) as *const *const u8).ok()?;
        if files.is_null() {
            return None;
        }
        let fdt: *const u8 =
            bpf_probe_read_kernel(files.add(off.files_fdt as usize) as *const *const u8).ok()?;
        if fdt.is_null() {
            return None;
        }
        let max: u32 = bpf_probe_read_kernel(fdt.add(off.fdt_max_fds as usize) as *const u32).ok()?;
        if fd >= u64::from(max) {
            return None;
        }
        let table: *const *const u8 =
            bpf_probe_read_kernel(fdt.add(off.fdt_fd as usize) as *const *const *const u8).ok()?;
        let file: *const u8 = bpf_probe_read_kernel(table.add(fd as usize)).ok()?;
        file_rdev(file, off)
    }
}

/// Remembers a call on an NVIDIA device until it returns.
#[inline(always)]
fn enter(cmd: u32, arg: u64, rdev: u32, (kind, dev_bit): (u32, u32)) {
    let tid = bpf_get_current_pid_tgid() as u32;
    let mut inf = Inflight {
        // SAFETY: no preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        params: arg,
        cmd,
        rdev,
        op: nv::classify(cmd, kind) as u32,
        device: kind,
        flags: 0,
        dev_bit,
    };
    if kind != device::UVM && cmd == nv::XFER {
        // nv_ioctl_xfer_t {u32 cmd; u32 size; u64 ptr}: the real request is inside.
        let mut x = [0u8; 16];
        // SAFETY: a user-memory read into a stack buffer of the same size.
        if unsafe { bpf_probe_read_user_buf(arg as *const u8, &mut x) }.is_ok() {
            let inner = u32::from_le_bytes([x[0], x[1], x[2], x[3]]);
            inf.cmd = inner;
            inf.params = u64::from_le_bytes([x[8], x[9], x[10], x[11], x[12], x[13], x[14], x[15]]);
            inf.op = nv::classify(inner, device::RM) as u32;
            inf.flags = flag::XFER;
        }
    }
    if INFLIGHT.insert(tid, inf, 0).is_err() {
        bump(counter::INFLIGHT_FULL);
    } else {
        bump(counter::INFLIGHT_NOW);
    }
}

/// Reads the parameter prefix the decoder needs (a constant size per op, never past the
/// block the caller passed).
#[inline(always)]
fn read_params(op: Op, cmd: u32, src: u64, p: &mut [u8; PARAMS_LEN]) -> bool {
    let n = nv::params_len(op, cmd);
    let src = src as *const u8;
    // SAFETY: user-memory reads into prefixes of a stack buffer; each length is a constant.
    let r = unsafe {
        match n {
            0 => return true,
            4 => bpf_probe_read_user_buf(src, &mut p[..4]),
            16 => bpf_probe_read_user_buf(src, &mut p[..16]),
            32 => bpf_probe_read_user_buf(src, &mut p[..32]),
            40 => bpf_probe_read_user_buf(src, &mut p[..40]),
            48 => bpf_probe_read_user_buf(src, &mut p[..48]),
            _ => bpf_probe_read_user_buf(src, &mut p[..PARAMS_LEN]),
        }
    };
    r.is_ok()
}

#[inline(always)]
fn add(p: *mut u64, v: u64) {
    // SAFETY: `p` points into a map value; atomic add on an aligned u64.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, v) };
}

/// The process's aggregates, created on its first call. `true` with it if just created.
#[inline(always)]
fn stats_of(tgid: u32) -> Option<*mut ProcStats> {
    if let Some(p) = STATS.get_ptr_mut(tgid) {
        return Some(p);
    }
    // Another thread of the process may have created it meanwhile: NOEXIST fails, then the
    // lookup finds theirs. (Inserted from a zeroed global: the stack is too small for a copy.)
    if STATS.insert(tgid, &ZERO_STATS, BPF_NOEXIST).is_ok() {
        let p = STATS.get_ptr_mut(tgid)?;
        // SAFETY: a live map value; only this thread has seen the fresh entry's cgroup field.
        unsafe { (*p).cgroup_id = bpf_get_current_cgroup_id() };
        return Some(p);
    }
    let p = STATS.get_ptr_mut(tgid);
    if p.is_none() {
        bump(counter::STATS_FULL);
    }
    p
}

/// Decodes a call that has returned, counts it and tells user space what changed.
#[inline(always)]
fn exit(inf: &Inflight, ret: i64) {
    // SAFETY: no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    let Some(op) = Op::from_u32(inf.op) else {
        return;
    };
    let watched = inf.device == device::WATCHED;
    let mut call = Call {
        kind: record::CALL,
        op: inf.op,
        tgid,
        tid: pid_tgid as u32,
        ts_ns: now,
        latency_ns: now.saturating_sub(inf.ts_ns),
        rdev: inf.rdev,
        cmd: inf.cmd,
        ret,
        flags: inf.flags,
        ..Call::default()
    };
    let mut p = [0u8; PARAMS_LEN];
    let mut follow = None;
    if read_params(op, inf.cmd, inf.params, &mut p) {
        follow = nv::decode(op, inf.cmd, &p, &mut call);
    } else {
        call.flags |= flag::UNREAD;
        bump(counter::READ_FAILED);
    }
    // A watched device answers ENOTTY: its requests are decoded whatever they returned.
    let ok = watched || (ret == 0 && call.status == 0 && call.flags & flag::UNREAD == 0);
    if ok {
        call.flags |= flag::OK;
    }
    if watched {
        call.flags |= flag::WATCHED;
    }
    if ok {
        // SAFETY: user-memory reads of one field the decoder located.
        unsafe {
            match follow {
                Some(Follow::MemorySize(a)) => {
                    call.value =
                        aya_ebpf::helpers::bpf_probe_read_user(a as *const u64).unwrap_or(0)
                }
                Some(Follow::DeviceId(a)) | Some(Follow::EngineType(a)) => {
                    call.extra =
                        aya_ebpf::helpers::bpf_probe_read_user(a as *const u32).unwrap_or(0)
                }
                None => {}
            }
        }
    }
    let slow = call.latency_ns >= unsafe { read_volatile(&SLOW_NS) };
    if slow {
        call.flags |= flag::SLOW;
    }

    let Some(stats) = stats_of(tgid) else {
        return;
    };
    let i = (inf.op as usize) & 15;
    if i < N_OPS {
        // SAFETY: `stats` is a live map value; `i` < N_OPS keeps every offset inside it.
        unsafe {
            add((&raw mut (*stats).calls as *mut u64).add(i), 1);
            if !ok {
                add((&raw mut (*stats).failed as *mut u64).add(i), 1);
            }
            add(
                (&raw mut (*stats).latency_ns as *mut u64).add(i),
                call.latency_ns,
            );
            if ok && op == Op::RmMapMemory {
                add(&raw mut (*stats).mapped_bytes, call.value);
            }
        }
    }

    // The process's first call on this device: a bit in its aggregates, no map lookup. (Two
    // threads racing here may both report it; user space keeps one.)
    let bit = 1u64 << (inf.dev_bit & 63);
    // SAFETY: `stats` is a live map value.
    let first_use = unsafe { read_volatile(&raw const (*stats).devices) } & bit == 0;
    if first_use {
        // SAFETY: as above; atomic or on an aligned u64.
        unsafe { atomic_or::<u64, u64, { AtomicOrdering::Relaxed }>(&raw mut (*stats).devices, bit) };
    }
    if first_use || op.is_lifecycle() || slow {
        // Who it is matters for the first record of a device (user space keeps it) and for
        // slow calls; the other records skip these reads.
        if first_use || slow {
            // SAFETY: no preconditions.
            call.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
            call.comm =
                leader_comm().unwrap_or_else(|| bpf_get_current_comm().unwrap_or([0; 16]));
        }
        if first_use {
            let mut dev = call;
            dev.kind = record::DEVICE;
            // Woken at once, even behind records that did not wake it: user space
            // identifies the process while it still runs.
            emit(&dev, BPF_RB_FORCE_WAKEUP);
        }
        if op.is_lifecycle() || slow {
            emit(&call, wakeup());
        }
    }
}

/// The process's name: its thread-group leader's `comm` (worker threads often name
/// themselves; the process is what is attributed).
#[inline(always)]
fn leader_comm() -> Option<[u8; 16]> {
    // SAFETY: a read of a global; kernel reads through bpf_probe_read_kernel at BTF offsets.
    unsafe {
        let off = read_volatile(&OFFSETS);
        let task = bpf_get_current_task() as *const u8;
        let leader: *const u8 =
            bpf_probe_read_kernel(task.add(off.task_group_leader as usize) as *const *const u8)
                .ok()?;
        if leader.is_null() {
            return None;
        }
        bpf_probe_read_kernel(leader.add(off.task_comm as usize) as *const [u8; 16]).ok()
    }
}

const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;

/// Call records do not wake the reader (it drains the ring every 100 ms while they come, and
/// at its next refresh after a quiet spell) unless the ring is a quarter full: a wake-up per
/// record costs more than the rest of the call's tracing.
#[inline(always)]
fn wakeup() -> u64 {
    // BPF_RB_AVAIL_DATA: bytes not yet consumed.
    if EVENTS.query(0) > u64::from(RING_BYTES / 4) {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

#[inline(always)]
fn emit(call: &Call, flags: u64) {
    if EVENTS.output::<Call>(call, flags).is_err() {
        bump(counter::RING_FULL);
    }
}

#[tracepoint]
pub fn sys_enter_ioctl(ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !traced(tgid) {
        return 0;
    }
    // sys_enter_ioctl: fd@16, cmd@24, arg@32 (8-byte slots).
    let cmd = tp_u64(&ctx, 24) as u32;
    if !nv::maybe_nvidia(cmd) {
        return 0;
    }
    // SAFETY: a read of a global.
    let off = unsafe { read_volatile(&OFFSETS) };
    if off.valid == 0 {
        return 0;
    }
    let (fd, arg) = (tp_u64(&ctx, 16), tp_u64(&ctx, 32));
    let Some(rdev) = fd_rdev(fd, &off) else {
        return 0;
    };
    let Some(kind) = device_kind(rdev) else {
        return 0;
    };
    enter(cmd, arg, rdev, kind);
    0
}

#[tracepoint]
pub fn sys_exit_ioctl(ctx: TracePointContext) -> u32 {
    // sys_exit_ioctl: ret@16.
    finish(|| tp_u64(&ctx, 16) as i64);
    0
}

#[inline(always)]
fn finish(ret: impl FnOnce() -> i64) {
    // Nothing in flight anywhere (the common case on a node): no lookup.
    if COUNTERS
        .get(counter::INFLIGHT_NOW)
        .is_none_or(|n| unsafe { read_volatile(n) } == 0)
    {
        return;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(p) = INFLIGHT.get_ptr(tid) else {
        return;
    };
    // SAFETY: a live map value, copied before the entry is removed.
    let inf = unsafe { *p };
    if INFLIGHT.remove(tid).is_ok() {
        bump_by(counter::INFLIGHT_NOW, u64::MAX);
    }
    exit(&inf, ret());
}

#[kprobe]
pub fn nv_ioctl_entry(ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if !traced(tgid) {
        return 0;
    }
    // long nvidia_unlocked_ioctl(struct file *, unsigned int cmd, unsigned long arg)
    let (Some(file), Some(cmd), Some(arg)) = (
        ctx.arg::<*const u8>(0),
        ctx.arg::<u32>(1),
        ctx.arg::<u64>(2),
    ) else {
        return 0;
    };
    // SAFETY: a read of a global.
    let off = unsafe { read_volatile(&OFFSETS) };
    if off.valid == 0 {
        return 0;
    }
    let Some(rdev) = file_rdev(file, &off) else {
        return 0;
    };
    let Some(kind) = device_kind(rdev) else {
        return 0;
    };
    enter(cmd, arg, rdev, kind);
    0
}

#[kretprobe]
pub fn nv_ioctl_return(ctx: RetProbeContext) -> u32 {
    finish(|| ctx.ret::<i64>());
    0
}

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: a read of a global.
    let off = unsafe { read_volatile(&OFFSETS) };
    let last = if off.exit_group_dead != 0 {
        // SAFETY: a read inside the tracepoint record, at the offset its format gives.
        unsafe { ctx.read_at::<u8>(off.exit_group_dead as usize) }.unwrap_or(0) != 0
    } else {
        pid_tgid as u32 == tgid
    };
    if !last {
        return 0;
    }
    let Some(stats) = STATS.get_ptr(tgid) else {
        return 0;
    };
    if let Some(mut e) = EVENTS.reserve::<Exit>(0) {
        // SAFETY: a live map value copied into a reserved ring-buffer slot of its size.
        unsafe {
            e.write(Exit {
                kind: record::EXIT,
                tgid,
                ts_ns: bpf_ktime_get_ns(),
                stats: *stats,
            });
        }
        e.submit(0);
    } else {
        bump(counter::RING_FULL);
    }
    let _ = STATS.remove(tgid);
    0
}

#[tracepoint]
pub fn empty_enter(_ctx: TracePointContext) -> u32 {
    0
}

#[tracepoint]
pub fn empty_exit(_ctx: TracePointContext) -> u32 {
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

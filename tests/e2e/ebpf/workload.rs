//! The workload the eBPF tests run, in a copy of the test binary: it opens `/dev/null` and
//! issues ioctls carrying NVIDIA command values and parameter structs.

use super::{CLIENT, DEVICE, MIB, READY};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// The 16 raw bytes of a `GPU-…` UUID.
fn raw_uuid(uuid: &str) -> [u8; 16] {
    let hex: String = uuid.trim_start_matches("GPU-").replace('-', "");
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex");
    }
    out
}

/// The "threads" mode: its threads, and the controls and allocations each issues.
pub(super) const THREADS: usize = 8;
pub(super) const CONTROLS_PER_THREAD: usize = 500;
pub(super) const ALLOCS_PER_THREAD: usize = 25;

fn ioctl<T>(fd: i32, cmd: u32, arg: &mut T) {
    // SAFETY: ioctl on /dev/null with a pointer to a live parameter block; /dev/null answers
    // ENOTTY and touches nothing.
    let r = unsafe { libc::ioctl(fd, cmd as libc::c_ulong, arg as *mut T) };
    assert_eq!(r, -1, "/dev/null implements no ioctls");
}

/// `NVOS64_PARAMETERS` (48 bytes). The workload writes its parameter blocks and command values
/// from the driver's headers on its own, not with `junction_common::nv::encode`, so that a wrong
/// offset shared by Junction's encoder and decoder would still fail these tests.
#[repr(C)]
struct Nvos64 {
    h_root: u32,
    h_parent: u32,
    h_new: u32,
    h_class: u32,
    p_alloc: u64,
    p_rights: u64,
    params_size: u32,
    flags: u32,
    status: u32,
    pad: u32,
}

fn alloc(fd: i32, parent: u32, handle: u32, class: u32, params: *mut u8) {
    let mut p = Nvos64 {
        h_root: CLIENT,
        h_parent: parent,
        h_new: handle,
        h_class: class,
        p_alloc: params as u64,
        p_rights: 0,
        params_size: 0,
        flags: 0,
        status: 0,
        pad: 0,
    };
    ioctl(fd, 0xC030_462B, &mut p);
}

fn alloc_memory(fd: i32, handle: u32, bytes: u64) {
    // NV_MEMORY_ALLOCATION_PARAMS (128 bytes), size@64.
    let mut params = [0u8; 128];
    params[64..72].copy_from_slice(&bytes.to_le_bytes());
    alloc(fd, DEVICE, handle, 0x40, params.as_mut_ptr());
}

fn control(fd: i32) {
    // NVOS54_PARAMETERS (32 bytes): NV2080_CTRL_CMD_GPU_GET_PID_INFO.
    let mut p = [0u32; 8];
    p[0] = CLIENT;
    p[1] = DEVICE;
    p[2] = 0x2080_018E;
    ioctl(fd, 0xC020_462A, &mut p);
}

fn setup(fd: i32, uuid: &str) {
    alloc(fd, 0, CLIENT, 0x41, std::ptr::null_mut());
    // NV0080_ALLOC_PARAMETERS: deviceId@0.
    let mut dev = [0u8; 56];
    alloc(fd, CLIENT, DEVICE, 0x80, dev.as_mut_ptr());
    // UVM_REGISTER_GPU_PARAMS (40 bytes): uuid@0, hClient@28.
    let mut reg = [0u8; 40];
    reg[..16].copy_from_slice(&raw_uuid(uuid));
    reg[28..32].copy_from_slice(&CLIENT.to_le_bytes());
    ioctl(fd, 37, &mut reg);
}

/// Not a test: the workload the eBPF tests run (in a copy of this binary), selected by
/// `JUNCTION_WORKLOAD`.
#[test]
#[ignore = "the workload the eBPF tests start; not a test of its own"]
fn workload() {
    // Run with --ignored by hand: nothing to do unless a test started it.
    let Ok(mode) = std::env::var("JUNCTION_WORKLOAD") else {
        return;
    };
    let uuid = std::env::var("JUNCTION_WORKLOAD_UUID").expect("JUNCTION_WORKLOAD_UUID");
    let started = Instant::now();
    if let Ok(procs) = std::env::var("JUNCTION_WORKLOAD_CGROUP") {
        std::fs::write(&procs, std::process::id().to_string()).expect("join the cgroup");
    }
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .expect("open /dev/null");
    let fd = null.as_raw_fd();
    match mode.as_str() {
        "basic" | "short" => {
            setup(fd, &uuid);
            alloc_memory(fd, 0x10, 3 * MIB);
            alloc_memory(fd, 0x11, 5 * MIB);
            // NVOS00_PARAMETERS: hRoot, hObjectParent, hObjectOld, status.
            let mut free = [CLIENT, DEVICE, 0x11, 0];
            ioctl(fd, 0xC010_4629, &mut free);
            for _ in 0..7 {
                control(fd);
            }
        }
        "threads" => {
            setup(fd, &uuid);
            std::thread::scope(|s| {
                for t in 0..THREADS {
                    s.spawn(move || {
                        for i in 0..CONTROLS_PER_THREAD {
                            control(fd);
                            if i % (CONTROLS_PER_THREAD / ALLOCS_PER_THREAD) == 0 {
                                alloc_memory(fd, 0x1000_0000 + (t * 1000 + i) as u32, MIB);
                            }
                        }
                    });
                }
            });
        }
        m => panic!("unknown workload {m}"),
    }
    println!("{READY}");
    std::io::stdout().flush().expect("flush");
    if mode == "short" {
        std::thread::sleep(Duration::from_millis(50).saturating_sub(started.elapsed()));
        return;
    }
    // Until the test closes stdin.
    let mut buf = String::new();
    let _ = std::io::stdin().read_line(&mut buf);
}

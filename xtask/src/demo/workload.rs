//! The demo's GPU workload: a process (`trainer`) that talks to a watched device (`/dev/null`)
//! with the NVIDIA driver's ioctl commands and parameter blocks — a client, a device, a UVM
//! registration of one GPU by UUID, then memory allocated and freed and control calls, once a
//! second, until its stdin closes. `/dev/null` answers ENOTTY; Junction's BPF programs decode
//! a watched device's calls whatever it answers, so the process shows up attributed to the GPU
//! although NVML never lists it.

use std::io::Read;
use std::os::fd::AsRawFd;

use anyhow::{Context, Result};
use junction_common::nv::{self, class};

const CLIENT: u32 = 0xC1D0_0DE0;
const DEVICE: u32 = 0xD000_0DE0;
const MIB: u64 = 1 << 20;

/// `NVOS64_PARAMETERS` (48 bytes).
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

fn ioctl<T>(fd: i32, cmd: u32, arg: &mut T) {
    // SAFETY: an ioctl on /dev/null with a pointer to a live parameter block; /dev/null
    // answers ENOTTY and touches nothing.
    unsafe { libc::ioctl(fd, cmd as libc::c_ulong, arg as *mut T) };
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
    ioctl(fd, nv::RM_ALLOC, &mut p);
}

fn alloc_memory(fd: i32, handle: u32, bytes: u64) {
    // NV_MEMORY_ALLOCATION_PARAMS (128 bytes), the size at MEMORY_SIZE_OFFSET.
    let mut params = [0u8; 128];
    let at = class::MEMORY_SIZE_OFFSET as usize;
    params[at..at + 8].copy_from_slice(&bytes.to_le_bytes());
    alloc(
        fd,
        DEVICE,
        handle,
        class::MEMORY_LOCAL_USER,
        params.as_mut_ptr(),
    );
}

fn free(fd: i32, handle: u32) {
    // NVOS00_PARAMETERS: hRoot, hObjectParent, hObjectOld, status.
    let mut p = [CLIENT, DEVICE, handle, 0];
    ioctl(fd, nv::RM_FREE, &mut p);
}

fn control(fd: i32) {
    // NVOS54_PARAMETERS (32 bytes): NV2080_CTRL_CMD_GPU_GET_PID_INFO.
    let mut p = [0u32; 8];
    p[0] = CLIENT;
    p[1] = DEVICE;
    p[2] = 0x2080_018E;
    ioctl(fd, nv::RM_CONTROL, &mut p);
}

fn raw_uuid(uuid: &str) -> Result<[u8; 16]> {
    let hex: String = uuid.trim_start_matches("GPU-").replace('-', "");
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2).context("short UUID")?, 16)?;
    }
    Ok(out)
}

/// `cargo xtask demo-workload UUID` (run by the demo as `trainer`).
pub fn run(uuid: &str) -> Result<()> {
    if let Ok(procs) = std::env::var("JUNCTION_DEMO_CGROUP") {
        std::fs::write(&procs, std::process::id().to_string()).context("joining the cgroup")?;
    }
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    let fd = null.as_raw_fd();
    alloc(fd, 0, CLIENT, class::ROOTS[2], std::ptr::null_mut());
    let mut dev = [0u8; 56];
    alloc(fd, CLIENT, DEVICE, class::DEVICE, dev.as_mut_ptr());
    // UVM_REGISTER_GPU_PARAMS (40 bytes): uuid@0, hClient@28.
    let mut reg = [0u8; 40];
    reg[..16].copy_from_slice(&raw_uuid(uuid)?);
    reg[28..32].copy_from_slice(&CLIENT.to_le_bytes());
    ioctl(fd, nv::UVM_REGISTER_GPU, &mut reg);
    // A resident 2 GiB, and 256 MiB allocated and freed every second.
    alloc_memory(fd, 0x100, 2048 * MIB);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let _ = std::io::stdin().read(&mut buf);
        let _ = tx.send(());
    });
    let mut handle = 0x1000;
    loop {
        alloc_memory(fd, handle, 256 * MIB);
        for _ in 0..20 {
            control(fd);
        }
        if rx.recv_timeout(std::time::Duration::from_secs(1)).is_ok() {
            return Ok(());
        }
        free(fd, handle);
        handle += 1;
    }
}

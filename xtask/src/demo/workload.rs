//! The demo's GPU workload: a process (`trainer`) that talks to a watched device (`/dev/null`)
//! with the NVIDIA driver's ioctl commands and parameter blocks — a client, a device, a UVM
//! registration of one GPU by UUID, then memory allocated and freed and control calls, once a
//! second, until its stdin closes. `/dev/null` answers ENOTTY; Junction's BPF programs decode
//! a watched device's calls whatever it answers, so the process shows up attributed to the GPU
//! although NVML never lists it.

use std::io::Read;
use std::os::fd::AsRawFd;

use anyhow::{Context, Result};
use junction_common::nv::{self, class, encode};

const CLIENT: u32 = 0xC1D0_0DE0;
const DEVICE: u32 = 0xD000_0DE0;
const MIB: u64 = 1 << 20;

fn ioctl<T>(fd: i32, cmd: u32, arg: &mut T) {
    // SAFETY: an ioctl on /dev/null with a pointer to a live parameter block; /dev/null
    // answers ENOTTY and touches nothing.
    unsafe { libc::ioctl(fd, cmd as libc::c_ulong, arg as *mut T) };
}

fn alloc(fd: i32, parent: u32, handle: u32, class: u32, params: *mut u8) {
    let mut p = encode::rm_alloc(CLIENT, parent, handle, class, params as u64);
    ioctl(fd, nv::RM_ALLOC, &mut p);
}

fn alloc_memory(fd: i32, handle: u32, bytes: u64) {
    let mut params = encode::memory_allocation(bytes);
    alloc(
        fd,
        DEVICE,
        handle,
        class::MEMORY_LOCAL_USER,
        params.as_mut_ptr(),
    );
}

fn free(fd: i32, handle: u32) {
    let mut p = encode::rm_free(CLIENT, DEVICE, handle);
    ioctl(fd, nv::RM_FREE, &mut p);
}

fn control(fd: i32) {
    // NV2080_CTRL_CMD_GPU_GET_PID_INFO.
    let mut p = encode::rm_control(CLIENT, DEVICE, 0x2080_018E);
    ioctl(fd, nv::RM_CONTROL, &mut p);
}

/// `cargo xtask demo-workload UUID` (run by the demo as `trainer`).
pub fn run(uuid: &str) -> Result<()> {
    if let Ok(procs) = std::env::var("JUNCTION_DEMO_CGROUP") {
        std::fs::write(&procs, std::process::id().to_string()).context("joining the cgroup")?;
    }
    // Another watched device where asked (the soak runs two agents side by side).
    let device = std::env::var("JUNCTION_DEMO_DEVICE").unwrap_or_else(|_| "/dev/null".into());
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&device)
        .with_context(|| format!("opening {device}"))?;
    let fd = null.as_raw_fd();
    alloc(fd, 0, CLIENT, class::ROOTS[2], std::ptr::null_mut());
    let mut dev = [0u8; 56];
    alloc(fd, CLIENT, DEVICE, class::DEVICE, dev.as_mut_ptr());
    let uuid = encode::uuid_bytes(uuid).context("not a GPU UUID")?;
    let mut reg = encode::uvm_register_gpu(uuid, CLIENT);
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

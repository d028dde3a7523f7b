//! The `ebpf_bench` example (run by `cargo xtask bench`, as root): what the probes cost.
//!
//! In one process and one run: the cost of `ioctl()` and `getppid()` with nothing attached,
//! with empty programs on the same tracepoints (the floor any syscall tracepoint brings), and
//! with Junction's programs (`/dev/null` watched, traced for this process only); and the
//! user-space CPU the drain thread spends per ring-buffer record. Prints `key=value` lines.

use std::os::fd::AsRawFd;
use std::time::Instant;

use junction_common::nv;

use super::EbpfConfig;
use super::loader::{self, Params};
use crate::model::Model;
use crate::shutdown::Shutdown;

/// The calls measured.
#[derive(Clone, Copy)]
enum Call {
    /// FIONREAD on /dev/null: not an NVIDIA command (rejected on the command alone).
    OtherCmd,
    /// `RM_CONTROL` on /dev/zero: an NVIDIA command on a file that is no NVIDIA device
    /// (rejected after the file's device number is read).
    OtherFd,
    /// `RM_CONTROL` on watched /dev/null: decoded and counted in the kernel.
    Control,
    /// `RM_ALLOC` of memory on watched /dev/null: decoded, counted, and a ring record.
    Alloc,
    /// `getppid()`: an unrelated syscall.
    Getppid,
}

const CALLS: [(Call, &str); 5] = [
    (Call::OtherCmd, "other_cmd"),
    (Call::OtherFd, "other_fd"),
    (Call::Control, "matching_control"),
    (Call::Alloc, "matching_alloc"),
    (Call::Getppid, "getppid"),
];

struct Files {
    null: std::fs::File,
    zero: std::fs::File,
    control: [u32; 8],
    alloc: [u8; 48],
    _memory: Box<[u8; 128]>,
}

impl Files {
    fn open() -> std::io::Result<Self> {
        let rw = |p: &str| std::fs::OpenOptions::new().read(true).write(true).open(p);
        let mut memory = Box::new([0u8; 128]);
        memory[64..72].copy_from_slice(&(1u64 << 20).to_le_bytes());
        let mut alloc = [0u8; 48];
        alloc[0..4].copy_from_slice(&1u32.to_le_bytes());
        alloc[4..8].copy_from_slice(&2u32.to_le_bytes());
        alloc[8..12].copy_from_slice(&3u32.to_le_bytes());
        alloc[12..16].copy_from_slice(&0x40u32.to_le_bytes());
        alloc[16..24].copy_from_slice(&(memory.as_ptr() as u64).to_le_bytes());
        Ok(Self {
            null: rw("/dev/null")?,
            zero: rw("/dev/zero")?,
            control: [1, 2, 0x2080_018E, 0, 0, 0, 0, 0],
            alloc,
            _memory: memory,
        })
    }

    #[inline(never)]
    fn call(&mut self, c: Call) {
        // SAFETY: ioctls on /dev/null and /dev/zero with pointers to live buffers of the
        // sizes the commands say; both devices answer ENOTTY and touch nothing. getppid has
        // no preconditions.
        unsafe {
            match c {
                Call::OtherCmd => {
                    let mut n: libc::c_int = 0;
                    libc::ioctl(self.null.as_raw_fd(), libc::FIONREAD, &mut n);
                }
                Call::OtherFd => {
                    libc::ioctl(
                        self.zero.as_raw_fd(),
                        nv::RM_CONTROL as libc::c_ulong,
                        self.control.as_mut_ptr(),
                    );
                }
                Call::Control => {
                    libc::ioctl(
                        self.null.as_raw_fd(),
                        nv::RM_CONTROL as libc::c_ulong,
                        self.control.as_mut_ptr(),
                    );
                }
                Call::Alloc => {
                    libc::ioctl(
                        self.null.as_raw_fd(),
                        nv::RM_ALLOC as libc::c_ulong,
                        self.alloc.as_mut_ptr(),
                    );
                }
                Call::Getppid => {
                    libc::getppid();
                }
            }
        }
    }

    /// Nanoseconds per call: the median of 5 rounds of `n`.
    fn ns_per_call(&mut self, c: Call, n: u64) -> f64 {
        let mut rounds: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..n {
                    self.call(c);
                }
                t.elapsed().as_nanos() as f64 / n as f64
            })
            .collect();
        rounds.sort_by(f64::total_cmp);
        rounds[2]
    }
}

/// CPU time (user + system) of a thread of this process, in seconds.
fn thread_cpu(thread: libc::pthread_t) -> f64 {
    let mut clock: libc::clockid_t = 0;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a live thread's handle and valid out-pointers.
    unsafe {
        if libc::pthread_getcpuclockid(thread, &mut clock) != 0
            || libc::clock_gettime(clock, &mut ts) != 0
        {
            return 0.0;
        }
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Runs the benchmark with `n` calls per round.
pub fn run(n: u64) -> Result<String, String> {
    let mut f = Files::open().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let measure = |phase: &str, f: &mut Files, out: &mut Vec<String>| {
        for (c, name) in CALLS {
            out.push(format!("{phase}.{name}_ns={:.1}", f.ns_per_call(c, n)));
        }
    };
    measure("detached", &mut f, &mut out);

    let me = std::process::id();
    let config = EbpfConfig {
        watch_devices: vec!["/dev/null".into()],
        attach: "tracepoint".into(),
        ..EbpfConfig::default()
    };
    let params = |floor| Params {
        self_tgid: 0,
        only_tgid: me,
        slow_ns: u64::MAX,
        floor,
    };
    {
        let _floor = loader::load(&config, &params(true)).map_err(|e| e.to_string())?;
        measure("floor", &mut f, &mut out);
    }

    let loaded = loader::load(&config, &params(false)).map_err(|e| e.to_string())?;
    let mut attached = super::drain::attached(loaded)?;
    let model = Model::new();
    let shutdown = Shutdown::default();
    let (m, sd, cfg) = (model.clone(), shutdown.clone(), config.clone());
    let drain = std::thread::spawn(move || super::drain::run(&mut attached, &cfg, &m, &sd));
    let tid = std::os::unix::thread::JoinHandleExt::as_pthread_t(&drain);
    let cpu0 = thread_cpu(tid);
    measure("attached", &mut f, &mut out);
    // Let the drain catch up and publish, then read what it saw.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let cpu = thread_cpu(tid) - cpu0;
    let view = crate::model::view::Snapshot::take(&model);
    let mut calls = 0.0;
    let mut records = 0.0;
    let mut lost = 0.0;
    for (_, samples) in view.view().iter() {
        for (_, s) in samples {
            match s.metric {
                crate::model::Metric::DriverCalls
                    if s.attr("gpu.driver.call") == Some("rm_alloc") =>
                {
                    calls += s.value
                }
                crate::model::Metric::EbpfRecords => records += s.value,
                crate::model::Metric::EbpfLost
                    if s.attr("junction.reason") == Some("ring_full") =>
                {
                    lost += s.value
                }
                _ => {}
            }
        }
    }
    shutdown.trigger();
    let _ = drain.join();
    out.push(format!("drain.alloc_calls={calls:.0}"));
    out.push(format!("drain.records={records:.0}"));
    out.push(format!("drain.ring_full={lost:.0}"));
    out.push(format!("drain.cpu_secs={cpu:.4}"));
    out.push(format!(
        "drain.us_per_record={:.3}",
        cpu * 1e6 / records.max(1.0)
    ));
    out.push(format!("calls_per_round={n}"));
    Ok(out.join("\n"))
}

//! The `/dev/kmsg` reader: one record per `read()` (a buffer well over the kernel's 8 KiB
//! record limit: a smaller one makes the kernel skip the record with EINVAL), non-blocking
//! with `poll()` on the device and the shutdown's descriptor (prompt to stop, and no wake-up
//! on an idle node), EPIPE (records overwritten before they were
//! read) counted from the sequence gap, and a checkpoint (boot id, next sequence number) so
//! that a restart skips what was counted and reads what was written while it was down.
//! `/dev/kmsg` cannot seek to a sequence number: it is read from the start of the ring and
//! records below the checkpoint are skipped (as systemd-journald does).

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use super::Input;
use crate::internal_events::{InternalEvent, KmsgReadFailed};
use crate::model::Model;
use crate::shutdown::Shutdown;

/// Bytes per `read()`: one record is at most 8 KiB (printk's limit) plus its dictionary.
const BUFFER: usize = 16 * 1024;

/// Opens the device (non-blocking).
pub fn open(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// Seconds of the monotonic clock now (what kmsg timestamps count from boot).
fn monotonic_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes a timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The wall-clock time of a record stamped `usec` after boot.
fn wall_time(usec: u64) -> SystemTime {
    let age = monotonic_now().saturating_sub(Duration::from_micros(usec));
    SystemTime::now() - age
}

/// Reads records until shutdown.
pub fn run(file: &mut std::fs::File, input: &Input, model: &Model, shutdown: &Shutdown) {
    let mut buf = vec![0u8; BUFFER];
    let mut next = model.kmsg_next_seq();
    let mut parser = super::parser::Parser::default();
    let fd = file.as_raw_fd();
    // Waits since the last record ([`wait`]).
    let mut quiet = 0u32;
    loop {
        if shutdown.is_triggered() {
            break;
        }
        match file.read(&mut buf) {
            Ok(0) => wait(fd, shutdown, &mut quiet),
            Ok(n) => {
                quiet = 0;
                let Some(rec) = super::record::parse(&buf[..n]) else {
                    continue;
                };
                if rec.seq < next {
                    // Counted before the restart.
                    continue;
                }
                if next > 0 && rec.seq > next {
                    input.lost(rec.seq - next);
                }
                next = rec.seq + 1;
                input.read(1);
                #[cfg(debug_assertions)]
                failpoint(&rec);
                // Counted and moved past in one step (a kill between the two would count
                // the record again, or lose it), and not where another reader has (a second
                // reader is a defect, but must not count a record twice).
                model.kmsg_checkpointed(rec.seq, || {
                    input.record(&mut parser, &rec, wall_time(rec.usec), model);
                });
                input.tick(model);
            }
            Err(e) => match e.raw_os_error() {
                Some(libc::EAGAIN) => {
                    input.tick(model);
                    wait(fd, shutdown, &mut quiet);
                }
                // Overwritten before read: the gap in sequence numbers says how many.
                Some(libc::EPIPE) => {}
                // A record larger than the buffer: the kernel has skipped it.
                Some(libc::EINVAL) => input.lost(1),
                Some(libc::EINTR) => {}
                _ => {
                    KmsgReadFailed { error: &e }.emit(model);
                    if shutdown.sleep(Duration::from_secs(1)) {
                        break;
                    }
                }
            },
        }
    }
    model.flush_xids(true);
}

/// Debug builds only, for the tests of what follows a panic: with
/// `JUNCTION_FAILPOINT_KMSG_PANIC=TEXT`, the reader panics at the first record whose message
/// contains TEXT (once a process).
#[cfg(debug_assertions)]
fn failpoint(rec: &super::record::Record<'_>) {
    static PLAN: std::sync::OnceLock<Option<(String, std::sync::atomic::AtomicBool)>> =
        std::sync::OnceLock::new();
    let plan = PLAN.get_or_init(|| {
        let text = std::env::var("JUNCTION_FAILPOINT_KMSG_PANIC").ok()?;
        Some((text, std::sync::atomic::AtomicBool::new(false)))
    });
    if let Some((text, done)) = plan
        && rec.message.contains(text.as_str())
        && !done.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        panic!("JUNCTION_FAILPOINT_KMSG_PANIC: the kernel-log reader panics here");
    }
}

/// Waits this many times at most 500 ms after a record, each followed by a tick: the
/// counters are published at most every 200 ms and the checkpoint saved at most every second
/// (`model::xid`), so that what the last record left is published and saved within 2 s.
const TICKING_WAITS: u32 = 4;

/// Waits for the device to be readable or the shutdown. For [`TICKING_WAITS`] waits after a
/// record (counted in `quiet`) at most 500 ms each, so that the tick after each publishes
/// and saves what is left; then without a limit: an idle node's kernel log wakes nothing.
fn wait(fd: i32, shutdown: &Shutdown, quiet: &mut u32) {
    let limit = (*quiet < TICKING_WAITS).then_some(Duration::from_millis(500));
    *quiet = quiet.saturating_add(1);
    crate::shutdown::poll_readable(shutdown, &[fd], limit);
}

//! The wait for the next export: a one-shot `CLOCK_MONOTONIC` timerfd that the exporter's
//! runtime waits on as it waits on its sockets.
//!
//! Tokio's timer wheel ends a one-second sleep in two or three wake-ups: it parks until the
//! start of the 64 ms slot that holds the deadline, moves the timer into the millisecond wheel
//! and parks again (strace of the export's thread: `epoll_wait(…, 968)` then `(…, 23)`). A
//! wake-up costs tens of microseconds on a virtual machine, and an export wakes once a
//! second, so that was a third of its switches. The kernel's timer wakes the thread once, at
//! the deadline; meanwhile the runtime still runs the connection's tasks (a receiver that
//! closes an idle connection is seen at once, not at the next send). Where a timerfd cannot
//! be made (a seccomp profile that forbids it), Tokio's sleep is used.

use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;

/// The exporter's wake-up.
pub enum Alarm {
    /// A timerfd registered with the runtime's reactor.
    Timer(AsyncFd<OwnedFd>),
    /// Tokio's timer (no timerfd).
    Sleep,
}

impl Alarm {
    /// A timerfd on the current runtime's reactor, or Tokio's timer where one cannot be made
    /// (said once at debug level: both wait right, the timerfd with fewer wake-ups).
    pub fn new() -> Self {
        match timerfd() {
            Ok(fd) => Alarm::Timer(fd),
            Err(e) => {
                tracing::debug!("OTLP metrics: no timerfd ({e}); Tokio's timer is used");
                Alarm::Sleep
            }
        }
    }

    /// Returns at `when` (at once if it is past).
    pub async fn at(&mut self, when: Instant) {
        if let Alarm::Timer(fd) = self {
            match wait(fd, when).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::debug!(
                        "OTLP metrics: the timerfd failed ({e}); Tokio's timer is used"
                    );
                    *self = Alarm::Sleep;
                }
            }
        }
        tokio::time::sleep_until(when.into()).await;
    }
}

fn timerfd() -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: no pointers; the descriptor returned, if any, is owned here.
    let fd = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just returned to us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: the `OwnedFd` is moved into the `AsyncFd`, which owns it until it is dropped:
    // the descriptor stays open and the same for as long as it is registered.
    Ok(unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }?)
}

/// Arms the timer for the time left until `when` and waits for it to expire. `Instant` is
/// `CLOCK_MONOTONIC` on Linux, but not exposed as a `timespec`, so the timer is relative.
/// timerfd_create(2): a read returns the expirations as 8 bytes, or fails with EAGAIN on a
/// non-blocking descriptor before the first; re-arming with timerfd_settime(2) resets them.
async fn wait(fd: &AsyncFd<OwnedFd>, when: Instant) -> io::Result<()> {
    let left = when.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Ok(());
    }
    arm(fd.get_ref(), left)?;
    loop {
        let mut ready = fd.readable().await?;
        let mut expirations = [0u8; 8];
        // SAFETY: reads at most 8 bytes into the 8-byte buffer.
        let n = unsafe {
            libc::read(
                fd.get_ref().as_raw_fd(),
                expirations.as_mut_ptr().cast(),
                expirations.len(),
            )
        };
        if n == 8 {
            // Drained (a one-shot timer expires once): the next wait does not begin with a
            // read that finds nothing.
            ready.clear_ready();
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => ready.clear_ready(),
            io::ErrorKind::Interrupted => {}
            _ => return Err(e),
        }
    }
}

/// Sets the one-shot timer `left` from now (`left` is not zero: zero would disarm it).
fn arm(fd: &OwnedFd, left: Duration) -> io::Result<()> {
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: left.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: libc::c_long::from(left.subsec_nanos()),
        },
    };
    // SAFETY: `spec` is a valid itimerspec; the old value is not asked for.
    let r = unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    }

    #[test]
    fn the_alarm_wakes_at_its_time_and_never_before() {
        runtime().block_on(async {
            let mut alarm = Alarm::new();
            assert!(matches!(alarm, Alarm::Timer(_)), "a timerfd on Linux");
            for ms in [30u64, 1, 0, 50] {
                let when = Instant::now() + Duration::from_millis(ms);
                // A timer that never fires fails here instead of hanging the test.
                tokio::time::timeout(Duration::from_secs(10), alarm.at(when))
                    .await
                    .unwrap_or_else(|_| panic!("the {ms} ms alarm never went off"));
                assert!(Instant::now() >= when, "woke before its time ({ms} ms)");
            }
            // A time already past returns at once, and the timer is still usable after.
            alarm.at(Instant::now() - Duration::from_millis(5)).await;
            let when = Instant::now() + Duration::from_millis(20);
            alarm.at(when).await;
            assert!(Instant::now() >= when);
            assert!(matches!(alarm, Alarm::Timer(_)));
        });
    }

    #[test]
    fn the_runtime_runs_other_tasks_while_the_alarm_waits() {
        runtime().block_on(async {
            let (tx, rx) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let _ = tx.send(Instant::now());
            });
            let mut alarm = Alarm::new();
            let when = Instant::now() + Duration::from_millis(200);
            tokio::time::timeout(Duration::from_secs(10), alarm.at(when))
                .await
                .expect("the alarm went off");
            let other = rx.await.expect("the other task ran");
            assert!(
                other < when,
                "the other task ran during the wait, not after it"
            );
        });
    }
}

//! One shutdown signal for blocking threads (they sleep on a condition variable, or poll its
//! descriptor beside their own) and async tasks (they await a watch channel): triggering it
//! wakes them all at once.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use crate::model::lock;

#[derive(Debug)]
struct Inner {
    stop: Mutex<bool>,
    wake: Condvar,
    tx: tokio::sync::watch::Sender<bool>,
    /// Signals this one triggers too ([`Shutdown::child`]).
    children: Mutex<Vec<std::sync::Weak<Inner>>>,
    /// An eventfd, readable once triggered ([`Shutdown::fd`]); made on first use.
    fd: OnceLock<Option<OwnedFd>>,
}

/// A cloneable shutdown signal.
#[derive(Debug, Clone)]
pub struct Shutdown(Arc<Inner>);

impl Default for Shutdown {
    fn default() -> Self {
        Self(Arc::new(Inner {
            stop: Mutex::new(false),
            wake: Condvar::new(),
            tx: tokio::sync::watch::Sender::new(false),
            children: Mutex::new(Vec::new()),
            fd: OnceLock::new(),
        }))
    }
}

impl Shutdown {
    /// Asks every thread and task to stop.
    pub fn trigger(&self) {
        *lock(&self.0.stop) = true;
        self.0.wake.notify_all();
        self.0.tx.send_replace(true);
        // After the flag (see `fd`): a descriptor made meanwhile is signalled by its maker.
        if let Some(Some(fd)) = self.0.fd.get() {
            signal(fd);
        }
        let children: Vec<_> = lock(&self.0.children)
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        for c in children {
            Shutdown(c).trigger();
        }
    }

    /// A signal of its own that this one triggers too: the threads of one start of a source,
    /// stopped together when one of them panics, before the source is started again.
    pub fn child(&self) -> Shutdown {
        let child = Shutdown::default();
        {
            let mut children = lock(&self.0.children);
            children.retain(|c| c.strong_count() > 0);
            children.push(Arc::downgrade(&child.0));
        }
        // Registered before the flag is read: a trigger meanwhile either finds it in the list
        // or has set the flag.
        if self.is_triggered() {
            child.trigger();
        }
        child
    }

    /// True once triggered.
    pub fn is_triggered(&self) -> bool {
        *lock(&self.0.stop)
    }

    /// A descriptor that becomes readable (`POLLIN`) once triggered, and stays so, for a
    /// thread that waits in `poll(2)` on descriptors of its own: with it beside them, the wait
    /// needs no timeout to notice a shutdown. `None` if the kernel refused an eventfd (the
    /// caller then polls with a timeout, as before).
    pub fn fd(&self) -> Option<RawFd> {
        let fd = self.0.fd.get_or_init(|| {
            // SAFETY: eventfd(2) with a zero count and valid flags; the result is checked.
            let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            // SAFETY: a descriptor just returned by eventfd and owned by nothing else.
            (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) })
        });
        let fd = fd.as_ref()?;
        // Stored before the flag is read (under its lock, as `trigger` sets it): a trigger
        // meanwhile either finds the descriptor or has set the flag, which is seen here.
        if self.is_triggered() {
            signal(fd);
        }
        Some(fd.as_raw_fd())
    }

    /// Sleeps for `d` or until shutdown; returns true if shutting down.
    pub fn sleep(&self, d: Duration) -> bool {
        let guard = lock(&self.0.stop);
        let (guard, _) = self
            .0
            .wake
            .wait_timeout_while(guard, d, |stop| !*stop)
            .unwrap_or_else(|e| e.into_inner());
        *guard
    }

    /// Resolves once triggered.
    pub async fn wait(&self) {
        let mut rx = self.0.tx.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
    }

    /// `work`'s output, or `None` if shutdown comes first (the work is then dropped).
    pub async fn unless<T>(&self, work: impl std::future::Future<Output = T>) -> Option<T> {
        tokio::select! {
            v = work => Some(v),
            _ = self.wait() => None,
        }
    }

    /// Ticks every `interval` until shutdown, for polls that run one at a time: the first tick
    /// is at once, each next one `interval` after the previous one began (later if a poll ran
    /// longer).
    pub fn ticks(&self, interval: Duration) -> Ticks<'_> {
        Ticks {
            shutdown: self,
            interval,
            next: None,
        }
    }
}

/// Makes the eventfd readable (adds 1 to its count; a count at its maximum is readable too).
fn signal(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: an 8-byte write from a live u64 to an eventfd this signal owns.
    let _ = unsafe { libc::write(fd.as_raw_fd(), (&raw const one).cast(), 8) };
}

/// Waits until one of `fds` is readable, the shutdown's descriptor is, or `timeout` has
/// passed (`None`: no limit unless the shutdown has no descriptor, then 500 ms at most);
/// interrupted waits count as woken. Which descriptors are readable is left to the caller,
/// which reads them without blocking.
pub fn poll_readable(shutdown: &Shutdown, fds: &[RawFd], timeout: Option<Duration>) {
    let own = shutdown.fd();
    let mut set: Vec<libc::pollfd> = fds
        .iter()
        .chain(own.as_ref())
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let limit = match (timeout, own) {
        (Some(t), _) => Some(t),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_millis(500)),
    };
    // Rounded up, so that a wait for a deadline does not wake just before it.
    let ms = limit.map_or(-1, |t| {
        i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
    });
    if shutdown.is_triggered() {
        return;
    }
    // SAFETY: poll(2) on a live array of pollfds for descriptors the caller and the shutdown
    // own for the length of the call.
    unsafe { libc::poll(set.as_mut_ptr(), set.len() as libc::nfds_t, ms) };
}

/// See [`Shutdown::ticks`].
pub struct Ticks<'a> {
    shutdown: &'a Shutdown,
    interval: Duration,
    next: Option<tokio::time::Instant>,
}

impl Ticks<'_> {
    /// Waits for the next tick; false once shutting down.
    pub async fn next(&mut self) -> bool {
        if let Some(at) = self.next
            && self
                .shutdown
                .unless(tokio::time::sleep_until(at))
                .await
                .is_none()
        {
            return false;
        }
        if self.shutdown.is_triggered() {
            return false;
        }
        self.next = Some(tokio::time::Instant::now() + self.interval);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `fd` is readable now.
    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll(2) on one live pollfd, without waiting.
        unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLIN != 0 }
    }

    /// The descriptor is readable once the signal (or its parent) is triggered, also one
    /// made after; a wait with no limit on it and a descriptor of the caller's is woken by
    /// the trigger, and by the caller's descriptor.
    #[test]
    fn the_descriptor_wakes_a_wait_without_a_limit() {
        let parent = Shutdown::default();
        let s = parent.child();
        let fd = s.fd().expect("an eventfd");
        assert!(!readable(fd), "not before the trigger");
        assert_eq!(s.fd(), Some(fd), "one descriptor per signal");

        // The caller's own descriptor wakes it: a pipe with a byte in it.
        let mut ends = [0; 2];
        // SAFETY: pipe(2) into a live array of two descriptors.
        assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
        // SAFETY: a one-byte write from a live byte to the pipe's write end.
        assert_eq!(unsafe { libc::write(ends[1], [1u8].as_ptr().cast(), 1) }, 1);
        poll_readable(&s, &[ends[0]], None);
        // SAFETY: both ends are ours and closed once.
        unsafe {
            libc::close(ends[0]);
            libc::close(ends[1]);
        }

        let waiting = {
            let s = s.clone();
            std::thread::spawn(move || {
                poll_readable(&s, &[], None);
                s.is_triggered()
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        parent.trigger();
        assert!(waiting.join().expect("no panic"), "woken by the trigger");
        assert!(readable(fd), "and stays readable");
        let late = Shutdown::default();
        late.trigger();
        assert!(
            readable(late.fd().expect("an eventfd")),
            "made after the trigger"
        );
    }

    /// A child is triggered with its parent, also one made after the parent was triggered;
    /// triggering a child leaves the parent and the other children running.
    #[test]
    fn a_child_stops_with_its_parent_and_alone() {
        let parent = Shutdown::default();
        let (a, b) = (parent.child(), parent.child());
        a.trigger();
        assert!(a.is_triggered() && !b.is_triggered() && !parent.is_triggered());
        let waiting = {
            let b = b.clone();
            std::thread::spawn(move || b.sleep(Duration::from_secs(30)))
        };
        parent.trigger();
        assert!(
            waiting.join().expect("no panic"),
            "a sleeping child is woken"
        );
        assert!(b.is_triggered());
        assert!(
            parent.child().is_triggered(),
            "made after its parent stopped"
        );
    }
}

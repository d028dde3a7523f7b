//! One shutdown signal for blocking threads (they sleep on a condition variable) and async
//! tasks (they await a watch channel): triggering it wakes both at once.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::model::lock;

#[derive(Debug)]
struct Inner {
    stop: Mutex<bool>,
    wake: Condvar,
    tx: tokio::sync::watch::Sender<bool>,
    /// Signals this one triggers too ([`Shutdown::child`]).
    children: Mutex<Vec<std::sync::Weak<Inner>>>,
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
        }))
    }
}

impl Shutdown {
    /// Asks every thread and task to stop.
    pub fn trigger(&self) {
        *lock(&self.0.stop) = true;
        self.0.wake.notify_all();
        self.0.tx.send_replace(true);
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

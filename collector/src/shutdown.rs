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
        }))
    }
}

impl Shutdown {
    /// Asks every thread and task to stop.
    pub fn trigger(&self) {
        *lock(&self.0.stop) = true;
        self.0.wake.notify_all();
        self.0.tx.send_replace(true);
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

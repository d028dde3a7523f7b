//! The one shape every source and sink has, so that adding one adds a folder and a line in
//! `sources/mod.rs` or `sinks/mod.rs`, never a branch in the commands.
//!
//! A component is started with the whole configuration and a [`Ctx`]; `start` does what must
//! fail loudly at once (a sink's bind) and returns the task that runs it until its shutdown
//! signal. A source that cannot be built (no driver, no privileges) logs why, reports itself
//! down and ends its task: the others go on.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::config::Config;
use crate::model::Model;
use crate::shutdown::Shutdown;

/// How long shutdown waits for each stage (sources, then sinks) to stop.
pub const SHUTDOWN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(3);

/// The most threads the async runtime's blocking pool runs at once (directory reads of the
/// sysfs sources, NVML's start and stop, the pod-name reads, each a poll at a time). Work
/// beyond it waits for a thread; tokio's default, 512, would let a burst leave hundreds of
/// thread stacks behind (glibc keeps a dead thread's stack, with the pages it used, for the
/// next thread).
pub const BLOCKING_THREADS: usize = 16;

/// How long an idle blocking thread waits for work before it ends: longer than the sources'
/// intervals, so that a poll every 10 or 30 s finds the thread the last one ran on, rather
/// than a new thread each time (tokio's default is 10 s). With the default, the soak's
/// blocking threads ended and started again every few seconds, and when new ones met at one
/// moment glibc mapped another stack that stayed (BENCHMARKS.md, "Soak").
pub const BLOCKING_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(120);

/// Sets a runtime's blocking pool to at most `threads` threads that live
/// [`BLOCKING_KEEP_ALIVE`] idle.
pub fn bound_blocking_pool(
    builder: &mut tokio::runtime::Builder,
    threads: usize,
) -> &mut tokio::runtime::Builder {
    builder
        .max_blocking_threads(threads)
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
}

/// A boxed future, for the tables of components.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a running component gets.
#[derive(Clone)]
pub struct Ctx {
    /// The node model it writes (a source) or reads (a sink).
    pub model: Arc<Model>,
    /// Its stop signal: sources are stopped first, then sinks (for their final export).
    pub shutdown: Shutdown,
}

/// Starts a component: returns its running task, or why it could not start.
pub type Start = fn(Arc<Config>, Ctx) -> BoxFuture<anyhow::Result<tokio::task::JoinHandle<()>>>;

/// Collects once into the model, for `junction once` and `junction inventory`.
pub type Once = fn(Arc<Config>, Arc<Model>) -> BoxFuture<anyhow::Result<()>>;

/// Says how a component stands (attached, off and why) for `junction inventory`.
pub type Inspect = fn(Arc<Config>, Arc<Model>) -> BoxFuture<()>;

/// What a source's one collection returns when there is nothing of its kind on this host (no
/// RDMA device, no NVIDIA function on the bus): `junction once` then counts it as not run,
/// neither a success nor a failure.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NothingHere(pub String);

/// A source or a sink.
pub struct Component {
    /// Its name (`junction.source`, the config table's name).
    pub name: &'static str,
    /// Whether the configuration turns it on.
    pub enabled: fn(&Config) -> bool,
    /// Starts it.
    pub start: Start,
    /// One collection (sources that have one).
    pub once: Option<Once>,
    /// A status check for `junction inventory` (components whose state is not data).
    pub inspect: Option<Inspect>,
    /// A stage that derives from what the others collected (the health rules): run after the
    /// one collection of `junction once` / `inventory`, not counted as one.
    pub derive: Option<Inspect>,
    /// Why it is off though the configuration or environment addresses it (an OTLP endpoint
    /// without `enabled = true`): a WARN when `junction run` starts, and its line in
    /// `junction inventory`.
    pub off_but_asked: Option<fn(&Config) -> Option<String>>,
}

/// For every component the configuration leaves off though it addresses it: (its name, why).
pub fn off_but_asked(config: &Config) -> Vec<(&'static str, String)> {
    crate::sources::ALL
        .iter()
        .chain(crate::sinks::ALL)
        .filter(|c| !(c.enabled)(config))
        .filter_map(|c| Some((c.name, (c.off_but_asked?)(config)?)))
        .collect()
}

/// When this process started (Unix ns; the first call fixes it, and `run` makes it early): where
/// the counters Junction counts itself begin.
pub fn started_ns() -> u64 {
    static STARTED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *STARTED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    })
}

/// Waits until `end` for `thread` to end; whether it did (it is joined then). A thread stuck
/// in a call is left behind.
pub fn join_by(thread: std::thread::JoinHandle<()>, end: std::time::Instant) -> bool {
    while !thread.is_finished() && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let done = thread.is_finished();
    if done {
        let _ = thread.join();
    }
    done
}

/// A panic's message (its first 200 characters).
pub fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    text.chars().take(200).collect()
}

/// Panics caught on the threads a source or a sink runs beside its task: the first one's
/// message, and a signal that it came, so that the task can panic with it and be reported
/// down and started again (`cli::supervise`) instead of reading as up while nothing runs.
#[derive(Clone, Default)]
pub struct ThreadPanics(Arc<(std::sync::Mutex<Option<String>>, tokio::sync::Notify)>);

impl ThreadPanics {
    /// Runs `work` on a new thread named `name`; a panic there is caught and recorded as
    /// `thread NAME: message` (the work's state is dropped with the unwind; nothing of it is
    /// used again).
    pub fn spawn(
        &self,
        name: &str,
        work: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let panicked = self.0.clone();
        let thread = name.to_string();
        std::thread::Builder::new()
            .name(thread.clone())
            .spawn(move || {
                if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
                    let message = format!("thread {thread}: {}", panic_message(payload));
                    crate::model::lock(&panicked.0).get_or_insert(message);
                    panicked.1.notify_one();
                }
            })
    }

    /// The first panic's message, once one has come.
    pub async fn first(&self) -> String {
        self.0.1.notified().await;
        crate::model::lock(&self.0.0).clone().unwrap_or_default()
    }
}

/// The threads a source runs beside its task (blocking reads: the eBPF ring, the kernel
/// log). A panic on one of them is the task's own: [`SourceThreads::watch`] stops the others
/// and panics with it, so that the supervisor reports the source down with the message and
/// starts it again. Without this, a thread that died left the source reading as up while
/// nothing read its input; and a restart beside siblings still running ran two readers of
/// the same input.
pub struct SourceThreads {
    handles: Vec<std::thread::JoinHandle<()>>,
    panics: ThreadPanics,
    stop: Shutdown,
}

impl SourceThreads {
    /// Threads that stop at `shutdown`, or when one of them panics.
    pub fn new(shutdown: &Shutdown) -> Self {
        Self {
            handles: Vec::new(),
            panics: ThreadPanics::default(),
            stop: shutdown.child(),
        }
    }

    /// What the threads stop at (the agent's shutdown, or a sibling's panic).
    pub fn stop(&self) -> &Shutdown {
        &self.stop
    }

    /// Runs `work` on a new thread named `name`.
    pub fn spawn(
        &mut self,
        name: &str,
        work: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<()> {
        self.handles.push(self.panics.spawn(name, work)?);
        Ok(())
    }

    /// Until `shutdown`: once a thread has panicked, stops the others, waits for them up to
    /// [`SHUTDOWN_DEADLINE`] and panics with the first one's message. At shutdown, waits for
    /// the threads to end, up to [`SHUTDOWN_DEADLINE`]; one stuck in a call is left behind.
    pub async fn watch(self, shutdown: &Shutdown) {
        let why = shutdown.unless(self.panics.first()).await;
        if why.is_some() {
            self.stop.trigger();
        }
        let handles = self.handles;
        let _ = tokio::task::spawn_blocking(move || {
            let end = std::time::Instant::now() + SHUTDOWN_DEADLINE;
            for t in handles {
                join_by(t, end);
            }
        })
        .await;
        if let Some(why) = why {
            panic!("{why}");
        }
    }
}

/// What a source opened while it still held the capabilities it starts with (the kernel log's
/// descriptor, the BPF programs and their maps), handed to its next start when its run ends
/// before the agent's shutdown (a panic of its thread or a sibling's). After the capability
/// drop that start could not open them again (`EPERM` from `/dev/kmsg` without CAP_SYSLOG, from
/// `bpf()` without CAP_BPF), and the source stayed off until the agent was restarted. At the
/// agent's shutdown the value is dropped.
pub struct Kept<T: Send + 'static> {
    slot: &'static std::sync::Mutex<Option<T>>,
    value: Option<T>,
    shutdown: Shutdown,
}

impl<T: Send + 'static> Kept<T> {
    /// Holds `value`, for `slot` unless `shutdown` (the agent's) has come when it is dropped.
    pub fn new(slot: &'static std::sync::Mutex<Option<T>>, value: T, shutdown: &Shutdown) -> Self {
        Self {
            slot,
            value: Some(value),
            shutdown: shutdown.clone(),
        }
    }

    /// What the last holder left in `slot` (taken).
    pub fn left(slot: &'static std::sync::Mutex<Option<T>>) -> Option<T> {
        crate::model::lock(slot).take()
    }
}

impl<T: Send + 'static> std::ops::Deref for Kept<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value.as_ref().expect("held until dropped")
    }
}

impl<T: Send + 'static> std::ops::DerefMut for Kept<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.value.as_mut().expect("held until dropped")
    }
}

impl<T: Send + 'static> Drop for Kept<T> {
    fn drop(&mut self) {
        if !self.shutdown.is_triggered()
            && let Some(v) = self.value.take()
        {
            *crate::model::lock(self.slot) = Some(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_thread_that_panics_panics_its_task_and_one_that_ends_does_not() {
        let shutdown = Shutdown::default();
        let mut threads = SourceThreads::new(&shutdown);
        threads.spawn("quiet", || {}).expect("spawn");
        let (go, wait) = std::sync::mpsc::channel::<()>();
        threads
            .spawn("reader", move || {
                let _ = wait.recv();
                panic!("ring buffer gone");
            })
            .expect("spawn");
        let s = shutdown.clone();
        let task = tokio::spawn(async move { threads.watch(&s).await });
        // Nothing yet: the quiet thread's end is not a panic.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!task.is_finished());
        go.send(()).expect("the reader waits");
        let e = task.await.expect_err("the task panics with the thread");
        assert!(e.is_panic());
        assert_eq!(
            panic_message(e.into_panic()),
            "thread reader: ring buffer gone"
        );
    }

    #[tokio::test]
    async fn at_shutdown_the_threads_are_waited_for_and_nothing_panics() {
        let shutdown = Shutdown::default();
        let mut threads = SourceThreads::new(&shutdown);
        let stop = shutdown.clone();
        let (done, ended) = std::sync::mpsc::channel();
        threads
            .spawn("reader", move || {
                while !stop.is_triggered() {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                done.send(()).expect("test waits");
            })
            .expect("spawn");
        let s = shutdown.clone();
        let task = tokio::spawn(async move { threads.watch(&s).await });
        shutdown.trigger();
        task.await.expect("no panic at shutdown");
        ended
            .try_recv()
            .expect("the thread had ended when watch returned");
    }

    /// When one thread panics, its sibling is stopped before the task panics, and what the
    /// sibling held is left for the next start, as it was; a run that ends at the agent's
    /// shutdown drops what it holds, and nothing is left.
    #[tokio::test]
    async fn a_panic_stops_the_siblings_and_what_they_held_is_left_for_the_next_start() {
        static SLOT: std::sync::Mutex<Option<(u32, Tracked)>> = std::sync::Mutex::new(None);
        static DROPPED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        struct Tracked;
        impl Drop for Tracked {
            fn drop(&mut self) {
                DROPPED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let shutdown = Shutdown::default();
        let mut threads = SourceThreads::new(&shutdown);
        let (stop, agent) = (threads.stop().clone(), shutdown.clone());
        let (reading, read) = std::sync::mpsc::channel::<()>();
        threads
            .spawn("reader", move || {
                let mut held = Kept::new(&SLOT, (7, Tracked), &agent);
                held.0 += 1;
                reading.send(()).expect("test waits");
                while !stop.sleep(std::time::Duration::from_secs(30)) {}
            })
            .expect("spawn");
        read.recv().expect("the reader holds it");
        threads
            .spawn("parser", || panic!("bad record"))
            .expect("spawn");
        let s = shutdown.clone();
        let e = tokio::spawn(async move { threads.watch(&s).await })
            .await
            .expect_err("the task panics with the thread");
        assert!(e.is_panic());
        let (n, t) = Kept::left(&SLOT).expect("left by the stopped reader");
        assert_eq!(n, 8, "as the thread left it");
        assert_eq!(DROPPED.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert!(Kept::left(&SLOT).is_none(), "taken once");
        assert!(!shutdown.is_triggered());
        // The next run ends at the agent's shutdown: what it holds is dropped.
        let mut threads = SourceThreads::new(&shutdown);
        let (stop, agent) = (threads.stop().clone(), shutdown.clone());
        threads
            .spawn("reader", move || {
                let _held = Kept::new(&SLOT, (n, t), &agent);
                while !stop.sleep(std::time::Duration::from_secs(30)) {}
            })
            .expect("spawn");
        shutdown.trigger();
        threads.watch(&shutdown).await;
        assert_eq!(DROPPED.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(Kept::left(&SLOT).is_none());
    }
}

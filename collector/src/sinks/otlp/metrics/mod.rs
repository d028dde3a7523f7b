//! OTLP metrics straight from the model: every interval the model's snapshot is written as an
//! `ExportMetricsServiceRequest` (`encode/`, the same view, names, units and attributes as
//! `/metrics`) and sent (`send.rs`). A series the model no longer has (a process that ended,
//! a lost GPU's readings) is simply not in the next request, so it stops being exported;
//! nothing is kept per series but, with delta temporality, each counter's last value (saved
//! while running and at the last export, for the next start to go on from: `resume.rs`).
//!
//! With OTLP/HTTP and gzip, the request goes into the compressor a metric at a time: the
//! data points (2.4 MB on the 64-GPU node) are written first, in one pass over the samples,
//! into a buffer kept across exports, and the headers around them after (see `encode/`).
//!
//! One thread of its own ("otlp-metrics"), with a single-threaded Tokio runtime of its own:
//! an export never waits on a source, a slow receiver holds only this thread, and the
//! thread that writes a request also sends it and reads the answer, where a blocking
//! client's thread of its own did (woken twice an export): one thread fewer, and on the
//! 64-GPU node about 6 % less CPU an export (BENCHMARKS.md, "Where a cycle's CPU goes").
//! Between exports the thread waits on a timerfd (`alarm.rs`): one wake-up an interval,
//! where Tokio's timer wheel took two or three. Exports do not catch up: after a slow one the
//! next is an interval later. At shutdown one last export carries the state the sources left.

mod alarm;
pub mod encode;
mod resume;
pub mod send;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use super::settings::Signal;
use super::stats::Stats;
use crate::model::Model;
use crate::model::view::{Lists, Snapshot};
use encode::{Encoder, Envelope};
pub use resume::Resume;
use send::Sender;

/// The running exporter.
pub struct Exporter {
    stop: tokio::sync::oneshot::Sender<()>,
    stopping: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Starts the exporter thread. With `resume` (the sink passes one for delta temporality), the
/// first export goes on from the last one saved, and exports are saved for the next start
/// (`resume.rs`). `boot_ns`: when the host booted, where the hardware's cumulative counters
/// start.
#[expect(
    clippy::too_many_arguments,
    reason = "what the exporter thread is handed, each used once"
)]
pub fn start(
    sender: Sender,
    envelope: Envelope,
    settings: &super::settings::Settings,
    boot_ns: Option<u64>,
    mut resume: Option<Resume>,
    model: Arc<Model>,
    stats: Arc<Stats>,
    panics: &crate::agent::ThreadPanics,
) -> anyhow::Result<Exporter> {
    let mut encoder = Encoder::new(envelope, settings.delta, unix_ns(SystemTime::now()));
    encoder.set_origins(crate::agent::started_ns(), boot_ns);
    if let Some(r) = &resume {
        r.take(&mut encoder);
    }
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let stopping = Arc::new(AtomicBool::new(false));
    let flag = stopping.clone();
    let (interval, timeout) = (settings.interval, settings.metrics.timeout);
    let thread = panics.spawn("otlp-metrics", move || {
        let when = Every { interval, timeout };
        // Its blocking threads (reqwest resolves a host name on one) are named for it.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("otlp-metrics-io")
            .build()
            .unwrap_or_else(|e| panic!("the OTLP metrics exporter's runtime: {e}"));
        runtime.block_on(run(
            sender,
            encoder,
            when,
            (&model, &stats),
            stopped,
            &flag,
            resume.as_mut(),
        ));
    })?;
    Ok(Exporter {
        stop,
        stopping,
        thread,
    })
}

impl Exporter {
    /// The last export, waited for at most `deadline`.
    pub fn stop(self, deadline: Duration) {
        self.stopping.store(true, Ordering::Relaxed);
        let _ = self.stop.send(());
        if !crate::agent::join_by(self.thread, Instant::now() + deadline) {
            tracing::warn!("the last OTLP metric export did not finish in time");
        }
    }
}

/// Debug builds only, for the tests of what follows a panic: with
/// `JUNCTION_FAILPOINT_OTLP_PANIC=N`, the metrics exporter panics after the process's Nth
/// export (once).
#[cfg(debug_assertions)]
fn failpoint() {
    use std::sync::atomic::AtomicU32;
    static EXPORTS: AtomicU32 = AtomicU32::new(0);
    static AT: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| {
        std::env::var("JUNCTION_FAILPOINT_OTLP_PANIC")
            .ok()
            .and_then(|n| n.parse().ok())
    });
    if let Some(at) = *at
        && EXPORTS.fetch_add(1, Ordering::Relaxed) + 1 == at
    {
        panic!("JUNCTION_FAILPOINT_OTLP_PANIC: the OTLP metrics exporter panics here");
    }
}

/// The export interval and the request timeout.
struct Every {
    interval: Duration,
    timeout: Duration,
}

async fn run(
    mut sender: Sender,
    mut encoder: Encoder,
    Every { interval, timeout }: Every,
    (model, stats): (&Model, &Stats),
    mut stopped: tokio::sync::oneshot::Receiver<()>,
    flag: &AtomicBool,
    mut resume: Option<&mut Resume>,
) {
    let mut next = Instant::now() + interval;
    // The view's lists, kept from one export to the next.
    let mut lists = Lists::default();
    let mut alarm = alarm::Alarm::new();
    loop {
        // Stopped, or the exporter dropped: the last export.
        let last = tokio::select! {
            () = alarm.at(next) => false,
            _ = &mut stopped => true,
        };
        let snap = Snapshot::take(model);
        let now = unix_ns(SystemTime::now());
        let stopping = || flag.load(Ordering::Relaxed);
        let outcome = if let Some(z) = sender.gzip() {
            // OTLP/HTTP with gzip: the request compressed as it is written.
            z.start();
            let view = snap.view_in(std::mem::take(&mut lists));
            encoder.encode_to(&view, now, &mut |piece| z.feed(piece));
            lists = view.give_back();
            drop(snap);
            sender.export_gzipped(timeout, stats, &stopping).await
        } else {
            // The encoder's buffer, lent to the sender and taken back.
            let view = snap.view_in(std::mem::take(&mut lists));
            let body = bytes::Bytes::from(encoder.encode_owned(&view, now).0);
            lists = view.give_back();
            drop(snap);
            let outcome = sender.export(body.clone(), timeout, stats, &stopping).await;
            encoder.give_back(body);
            outcome
        };
        stats.export(Signal::Metrics, &outcome);
        if let Some(r) = resume.as_deref_mut() {
            r.keep(&mut encoder, last);
        }
        if last {
            return;
        }
        #[cfg(debug_assertions)]
        failpoint();
        next += interval;
        let now = Instant::now();
        if next <= now {
            next = now + interval;
        }
    }
}

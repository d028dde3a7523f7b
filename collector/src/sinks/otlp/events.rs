//! Events as OTLP log records, sent as they happen: a request carries what arrived within
//! [`LINGER`] of the first of them (a burst, or processes ending ten a second, is one
//! request, not one each). The queue is the model's event log read
//! through this sink's own cursor: the cursor moves only once the receiver has accepted a
//! batch, so events emitted while it is down are delivered once when it is back. Past
//! `max_queued_events` (or the log's capacity) the oldest are dropped and counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _};
use opentelemetry::{InstrumentationScope, Key};
use opentelemetry_otlp::LogExporter;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::logs::{LogBatch, LogExporter as _, SdkLogRecord, SdkLoggerProvider};

use super::settings::Protocol;
use super::stats::{Outcome, Stats};
use super::transport::Classified;
use crate::model::Model;
use crate::model::events::{Event, Severity};

/// Records per request at most.
const BATCH: usize = 512;
/// How long the first pending event waits for others to join its request.
const LINGER: Duration = Duration::from_millis(250);
/// Retry waits: from this, doubling, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// With nothing to send, the thread sleeps until an event is appended or it is stopped
/// (both wake it); this bounds the sleep all the same. It was a second: with no events,
/// the thread woke once a second for nothing, 42 to 55 µs of CPU a second here.
const IDLE_WAIT: Duration = Duration::from_secs(60);

/// The running shipper.
pub struct Shipper {
    stopping: Arc<AtomicBool>,
    thread: JoinHandle<()>,
    model: Arc<Model>,
}

impl Shipper {
    /// Asks for a last delivery of what is pending and waits for it at most `deadline`.
    pub fn stop(self, deadline: Duration) {
        self.stopping.store(true, Ordering::Relaxed);
        self.model.events.wake();
        if !crate::agent::join_by(self.thread, Instant::now() + deadline) {
            tracing::warn!("OTLP events still pending at shutdown were not delivered in time");
        }
    }
}

/// Starts the shipper thread.
pub fn start(
    mut exporter: Classified<LogExporter>,
    resource: Resource,
    model: Arc<Model>,
    stats: Arc<Stats>,
    max_queued: usize,
    runtime: tokio::runtime::Handle,
    panics: &crate::agent::ThreadPanics,
) -> anyhow::Result<Shipper> {
    exporter.exporter.set_resource(&resource);
    let stopping = Arc::new(AtomicBool::new(false));
    let (m, s) = (model.clone(), stopping.clone());
    let thread = panics.spawn("otlp-events", move || {
        run(&exporter, &m, &stats, max_queued as u64, &runtime, &s)
    })?;
    Ok(Shipper {
        stopping,
        thread,
        model,
    })
}

fn run(
    exporter: &Classified<LogExporter>,
    model: &Model,
    stats: &Stats,
    max_queued: u64,
    runtime: &tokio::runtime::Handle,
    stopping: &AtomicBool,
) {
    let provider = SdkLoggerProvider::builder().build();
    let logger = provider.logger("junction");
    let scope = InstrumentationScope::builder("junction")
        .with_version(env!("CARGO_PKG_VERSION"))
        .with_schema_url(super::resource::SCHEMA_URL)
        .build();
    // Where the last shipper's delivered events end (a restarted sink's new shipper), or 0.
    let mut cursor = model.events.oldest();
    let mut backoff: Option<(Instant, Duration)> = None;
    // When the oldest event not yet sent was first seen.
    let mut pending_since: Option<Instant> = None;
    loop {
        let stop = stopping.load(Ordering::Relaxed);
        let head = model.events.head();
        // The queue bound: the oldest beyond it are dropped, and counted.
        if head - cursor > max_queued {
            stats.dropped(head - cursor - max_queued);
            cursor = head - max_queued;
        }
        // What is delivered (or dropped) is freed: the log holds only what is still to go.
        model.events.release(cursor);
        stats.queued(head - cursor);
        if cursor == head {
            if stop {
                return;
            }
            pending_since = None;
            model.events.wait(cursor, stopping, IDLE_WAIT);
            continue;
        }
        let since = *pending_since.get_or_insert_with(Instant::now);
        if !stop && head - cursor < BATCH as u64 && since.elapsed() < LINGER {
            std::thread::sleep(LINGER.saturating_sub(since.elapsed()));
            continue;
        }
        if let Some((until, _)) = backoff
            && Instant::now() < until
        {
            if stop {
                return;
            }
            std::thread::sleep((until - Instant::now()).min(Duration::from_millis(200)));
            continue;
        }
        let batch = model.events.read(cursor, BATCH);
        stats.dropped(batch.lost);
        let records: Vec<SdkLogRecord> = batch.events.iter().map(|e| record(&logger, e)).collect();
        let refs: Vec<(&SdkLogRecord, &InstrumentationScope)> =
            records.iter().map(|r| (r, &scope)).collect();
        let export = exporter.exporter.export(LogBatch::new(&refs));
        // tonic needs the runtime's context; the blocking HTTP client must not have it.
        let r = match exporter.protocol {
            Protocol::Grpc => runtime.block_on(export),
            Protocol::HttpProtobuf => futures_executor::block_on(export),
        };
        let outcome = exporter.classify(&r);
        stats.export(exporter.signal, &outcome);
        match outcome {
            Outcome::Ok => {
                cursor = batch.next;
                backoff = None;
                pending_since = None;
            }
            Outcome::Rejected(_) => {
                // Not retried: these events are lost, and counted.
                stats.dropped(batch.events.len() as u64);
                cursor = batch.next;
                backoff = None;
            }
            Outcome::Retryable(_) => {
                if stop {
                    return;
                }
                let wait = backoff.map_or(FIRST_BACKOFF, |(_, w)| (w * 2).min(MAX_BACKOFF));
                backoff = Some((Instant::now() + wait, wait));
            }
        }
    }
}

/// One event as a log record.
fn record(logger: &opentelemetry_sdk::logs::SdkLogger, e: &Event) -> SdkLogRecord {
    let mut r = logger.create_log_record();
    r.set_timestamp(e.time);
    r.set_observed_timestamp(std::time::SystemTime::now());
    r.set_severity_number(match e.severity {
        Severity::Info => opentelemetry::logs::Severity::Info,
        Severity::Warn => opentelemetry::logs::Severity::Warn,
        Severity::Error => opentelemetry::logs::Severity::Error,
        Severity::Fatal => opentelemetry::logs::Severity::Fatal,
    });
    r.set_severity_text(e.severity.text());
    r.set_event_name(e.name);
    r.set_body(AnyValue::String(e.body.clone().into()));
    r.add_attribute(
        Key::from_static_str("junction.event.sequence"),
        e.seq as i64,
    );
    if let Some(id) = &e.hw_id {
        r.add_attribute(Key::from_static_str("hw.id"), id.clone());
    }
    for (k, v) in &e.attrs {
        r.add_attribute(Key::from_static_str(k), AnyValue::String(v.clone().into()));
    }
    r
}

//! The Prometheus sink: `/metrics` (text exposition 0.0.4) and `/healthz` over HTTP.
//!
//! Needs: a free TCP port (`listen`). Every scrape renders a fresh snapshot of the model, so
//! a stuck NVML call never blocks a scrape (the model is only locked to copy `Arc`s).
//! How it fails: a bind error fails `junction run` at start-up with the address in the message.

pub mod encode;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::agent::Component;
use crate::model::view::Lists;
use crate::model::{Metric, Model, Sample};
use crate::sinks::page::Pages;

/// The Prometheus sink: binds at start (a bad or busy address fails `junction run` at once,
/// naming it), then serves until its shutdown signal.
pub const COMPONENT: Component = Component {
    name: "prometheus",
    enabled: |c| c.sinks.prometheus.enabled,
    start: |c, ctx| {
        Box::pin(async move {
            let listen = &c.sinks.prometheus.listen;
            let listener = bind(listen).await.map_err(|e| {
                anyhow::anyhow!("cannot listen on {listen} (sinks.prometheus.listen): {e}")
            })?;
            tracing::info!(listen = %listen, "serving /metrics and /healthz");
            let stop = ctx.shutdown.clone();
            let gzip = c.sinks.prometheus.gzip;
            Ok(tokio::spawn(async move {
                if let Err(e) =
                    serve(listener, ctx.model, gzip, async move { stop.wait().await }).await
                {
                    tracing::warn!(error = %e, "HTTP server ended with an error");
                }
            }))
        })
    },
    once: None,
    inspect: None,
    derive: None,
    off_but_asked: None,
};

/// Renders the whole model as Prometheus text.
pub fn render(model: &Model) -> String {
    let mut out = String::new();
    render_into(model, &mut out);
    out
}

/// Renders the whole model as Prometheus text into `out` (emptied first).
fn render_into(model: &Model, out: &mut String) {
    let snap = crate::model::view::Snapshot::take(model);
    // Room for the size of the previous scrape, so the buffer rarely grows.
    static LAST_LEN: AtomicUsize = AtomicUsize::new(64 * 1024);
    out.clear();
    out.reserve(LAST_LEN.load(Ordering::Relaxed) + 4096);
    // The view's lists, kept from one scrape to the next (a scrape that finds them taken
    // by another builds its own).
    static LISTS: Mutex<Option<Lists>> = Mutex::new(None);
    let kept = crate::model::lock(&LISTS).take();
    let view = snap.view_in(kept.unwrap_or_default());
    encode::render(&view, out);
    *crate::model::lock(&LISTS) = Some(view.give_back());
    LAST_LEN.store(out.len(), Ordering::Relaxed);
}

/// What the routes hold: the model, and what `/metrics` keeps between scrapes.
#[derive(Clone)]
struct Served {
    model: Arc<Model>,
    pages: Pages,
}

/// Scrapes served: the sink's own telemetry, like the OTLP sink's exports.
static SCRAPES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

async fn metrics(State(Served { model, pages }): State<Served>, request: HeaderMap) -> Response {
    let n = SCRAPES.fetch_add(1, Ordering::Relaxed) + 1;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64().floor());
    let tag = |s: Sample| {
        s.with("junction.sink", "prometheus")
            .with("junction.signal", "metrics")
    };
    model.publish(
        "prometheus",
        "stats",
        vec![
            tag(Sample::new(Metric::SinkExports, n as f64)),
            tag(Sample::new(Metric::SinkExportFailures, 0.0)),
            tag(Sample::new(Metric::SinkLastSuccess, now)),
        ],
    );
    pages.answer(&request, |out| render_into(&model, out))
}

async fn healthz(State(Served { model, .. }): State<Served>) -> impl IntoResponse {
    let sources = model.sources();
    let down: Vec<&str> = sources
        .iter()
        .filter(|(_, up)| !**up)
        .map(|(s, _)| *s)
        .collect();
    if down.is_empty() {
        (StatusCode::OK, "ok\n".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("sources down: {}\n", down.join(", ")),
        )
    }
}

/// Binds the listener (so that a bad address fails at start-up).
pub async fn bind(listen: &str) -> Result<tokio::net::TcpListener, std::io::Error> {
    let addr: SocketAddr = listen.parse().map_err(|e| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{listen:?}: {e}"))
    })?;
    tokio::net::TcpListener::bind(addr).await
}

/// Connections served at once; more are closed as soon as they are accepted. With the
/// header deadline, idle or slow peers hold at most this many descriptors, each for at most
/// [`HEADER_DEADLINE`] (a scrape's own connection is kept alive for [`CONNECTION_LIFETIME`]).
pub const MAX_CONNECTIONS: usize = 64;
/// A request's headers must arrive within this (slow-header peers are closed).
pub const HEADER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);
/// A connection is closed after this, kept alive or not.
pub const CONNECTION_LIFETIME: std::time::Duration = std::time::Duration::from_secs(120);
/// The largest request head read (hyper's smallest buffer).
pub const MAX_REQUEST_HEAD: usize = 8192;

/// Serves until `shutdown` resolves: HTTP/1.1 with a header deadline, a connection cap,
/// a connection lifetime and a request-head limit, so that no peer can starve the agent of
/// descriptors (and with them `/proc` reads, state saves and BMC polls).
pub async fn serve(
    listener: tokio::net::TcpListener,
    model: Arc<Model>,
    gzip: bool,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(Served {
            model,
            pages: Pages::new(gzip),
        });
    serve_app(listener, app, shutdown).await
}

/// Serves `app` with the same bounds (the dcgm-exporter listener shares them).
pub async fn serve_app(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_DEADLINE)
        .max_buf_size(MAX_REQUEST_HEAD);
    let mut refused = 0u64;
    tokio::pin!(shutdown);
    // Peers are read only once the agent holds no more than it needs.
    tokio::select! {
        () = &mut shutdown => return Ok(()),
        () = crate::privileges::gate() => {}
    }
    loop {
        let (stream, _) = tokio::select! {
            () = &mut shutdown => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                // Out of descriptors or a reset before accept: wait a little, go on.
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(
                    refused,
                    max = MAX_CONNECTIONS,
                    "too many connections to /metrics; closing new ones"
                );
            }
            drop(stream);
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, conn).await;
            drop(slot);
        });
    }
    // In-flight scrapes finish (briefly); idle connections close.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), graceful.shutdown()).await;
    Ok(())
}

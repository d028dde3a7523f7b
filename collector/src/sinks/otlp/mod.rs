//! The OTLP sink: the registry's metrics written as OTLP requests straight from the model's
//! latest snapshot (`metrics/`, over gRPC or HTTP/protobuf), and the model's events as OTLP
//! log records (the OpenTelemetry SDK's records, `opentelemetry-otlp`'s log exporters).
//!
//! Needs: a reachable receiver (an OpenTelemetry Collector, Alloy, Mimir, …). It never calls a
//! source: exports read the model. How it fails: a receiver that is down, slow or answers a
//! retryable error (UNAVAILABLE, 429, 503) is retried with backoff; metrics are not queued
//! (the next cumulative export carries the state), events wait in a bounded queue (the model's
//! event log, read through this sink's own cursor) and are delivered once when it is back,
//! the oldest dropped and counted past `max_queued_events`. A rejected request (400,
//! INVALID_ARGUMENT) is not retried: counted, and logged at most once per 10 minutes with the
//! receiver's message. Headers are never logged.

mod events;
mod metrics;
mod resource;
pub mod settings;
mod stats;
mod transport;

use std::sync::Arc;
use std::time::Duration;

use crate::agent::{Component, Ctx};
use crate::config::{Config, Invalid, SecretMap, StringMap, config_section};
use settings::{Settings, parse_protocol, valid_url};
pub use transport::diagnostics_layer;

config_section! {
    /// `[sinks.otlp]`. Each key left empty (or 0) is taken from the standard `OTEL_*`
    /// environment variables, then from the default: the file wins over the environment.
    pub struct OtlpConfig {
        /// Push metrics and events over OTLP. Default: false.
        pub enabled: bool = false,
        /// The receiver's base URL, as in OTEL_EXPORTER_OTLP_ENDPOINT (for http/protobuf,
        /// /v1/metrics and /v1/logs are appended). Empty: OTEL_EXPORTER_OTLP_METRICS_ENDPOINT
        /// / OTEL_EXPORTER_OTLP_LOGS_ENDPOINT (used as is), then
        /// OTEL_EXPORTER_OTLP_ENDPOINT, then http://localhost:4317 (grpc) or
        /// http://localhost:4318 (http/protobuf).
        pub endpoint: String = String::new(),
        /// "grpc" or "http/protobuf". Empty: OTEL_EXPORTER_OTLP_(METRICS_|LOGS_)PROTOCOL,
        /// then "grpc".
        pub protocol: String = String::new(),
        /// Request headers, e.g. { authorization = "Bearer …" }: merged over
        /// OTEL_EXPORTER_OTLP_(METRICS_|LOGS_)HEADERS key by key. Never logged.
        pub headers: SecretMap = SecretMap::default(),
        /// "gzip" or "none". Empty: OTEL_EXPORTER_OTLP_(METRICS_|LOGS_)COMPRESSION, then
        /// "gzip".
        pub compression: String = String::new(),
        /// Per-request timeout in milliseconds. 0: OTEL_EXPORTER_OTLP_(METRICS_|LOGS_)TIMEOUT,
        /// then 10000.
        pub timeout_ms: u64 = 0,
        /// Seconds between metric exports. 0: OTEL_METRIC_EXPORT_INTERVAL (ms), then 15.
        /// Events are sent as they happen (what arrives within 250 ms of the first goes in one
        /// request), not at this interval.
        pub interval_secs: u64 = 0,
        /// "cumulative" or "delta" (counters only; most backends want cumulative). Empty:
        /// OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, then "cumulative". With delta,
        /// each counter's exported value is saved in `state_dir` while the agent runs (at
        /// most every 15 s, and at a clean stop) and the next start in the same boot goes on
        /// from it: after a crash, at most what the last 15 s of exports reported is reported
        /// again.
        /// After a reboot the first export reports each counter's whole value, but for
        /// counters that outlive a reboot (the lifetime ECC count, a BMC's counters).
        pub temporality: String = String::new(),
        /// CA certificates (PEM) to trust for https:// endpoints, besides the built-in roots.
        /// Empty: OTEL_EXPORTER_OTLP_CERTIFICATE.
        pub ca_file: String = String::new(),
        /// Client certificate (PEM) for mutual TLS, with client_key_file. Empty:
        /// OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE.
        pub client_cert_file: String = String::new(),
        /// The client certificate's key (PEM). Empty: OTEL_EXPORTER_OTLP_CLIENT_KEY.
        pub client_key_file: String = String::new(),
        /// service.name. Empty: OTEL_SERVICE_NAME, then "junction".
        pub service_name: String = String::new(),
        /// Resource attributes to add (cluster, region, …), merged over
        /// OTEL_RESOURCE_ATTRIBUTES key by key.
        pub resource_attributes: StringMap = StringMap::default(),
        /// Events waiting for delivery while the receiver is unreachable, at most; past it
        /// the oldest are dropped and counted (junction_sink_events_dropped_total).
        /// Default: 4096.
        pub max_queued_events: u64 = 4096,
    }
}

impl OtlpConfig {
    /// Adds every problem with this section to `out`.
    pub fn validate(&self, prefix: &str, out: &mut Vec<Invalid>) {
        let mut bad = |key: &str, message: String| {
            out.push(Invalid {
                key: format!("{prefix}.{key}"),
                message,
            })
        };
        if !self.endpoint.is_empty() && !valid_url(&self.endpoint) {
            bad(
                "endpoint",
                format!(
                    "{:?} is not an http:// or https:// URL; write e.g. \"http://collector:4317\"",
                    crate::redact::url(&self.endpoint)
                ),
            );
        }
        if !self.protocol.is_empty() && parse_protocol(&self.protocol).is_none() {
            bad(
                "protocol",
                format!("{:?}: use \"grpc\" or \"http/protobuf\"", self.protocol),
            );
        }
        if !matches!(self.compression.as_str(), "" | "gzip" | "none") {
            bad(
                "compression",
                format!("{:?}: use \"gzip\" or \"none\"", self.compression),
            );
        }
        if !matches!(self.temporality.as_str(), "" | "cumulative" | "delta") {
            bad(
                "temporality",
                format!("{:?}: use \"cumulative\" or \"delta\"", self.temporality),
            );
        }
        if self.timeout_ms > 600_000 {
            bad(
                "timeout_ms",
                format!(
                    "{} is out of range; use 1 to 600000 (0 = default)",
                    self.timeout_ms
                ),
            );
        }
        if self.interval_secs > 86_400 {
            bad(
                "interval_secs",
                format!(
                    "{} is more than a day; use 1 to 86400 (0 = default)",
                    self.interval_secs
                ),
            );
        }
        if self.max_queued_events == 0 || self.max_queued_events > 1_000_000 {
            bad(
                "max_queued_events",
                format!(
                    "{} is out of range; use 1 to 1000000",
                    self.max_queued_events
                ),
            );
        }
        for (key, path) in [
            ("ca_file", &self.ca_file),
            ("client_cert_file", &self.client_cert_file),
            ("client_key_file", &self.client_key_file),
        ] {
            if !path.is_empty() && !std::path::Path::new(path).is_file() {
                bad(key, format!("{path:?} does not exist or is not a file"));
            }
        }
        if self.client_cert_file.is_empty() != self.client_key_file.is_empty() {
            bad(
                "client_key_file",
                "give both client_cert_file and client_key_file, or neither".into(),
            );
        }
        for name in self.headers.0.keys() {
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
            {
                bad("headers", format!("{name:?} is not a header name"));
            }
        }
    }
}

/// Why the sink is off though the operator addressed a receiver: an endpoint in
/// `[sinks.otlp]` or an `OTEL_EXPORTER_OTLP_*ENDPOINT` variable with `enabled` not true.
/// Nothing is pushed then, which someone arriving from an OpenTelemetry SDK (where the
/// variable alone turns export on) would not guess; `junction run` says so at start.
pub fn off_but_addressed(
    config: &OtlpConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    if config.enabled {
        return None;
    }
    let fix = "nothing is pushed over OTLP; set enabled = true in [sinks.otlp] to push";
    if !config.endpoint.is_empty() {
        return Some(format!(
            "[sinks.otlp] sets endpoint = {:?} but not enabled = true: {fix}",
            crate::redact::url(&config.endpoint)
        ));
    }
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
    ]
    .into_iter()
    .find_map(|k| {
        env(k).filter(|v| !v.trim().is_empty()).map(|v| {
            format!(
                "{k}={:?} is set but [sinks.otlp] does not set enabled = true: {fix}",
                crate::redact::url(&v)
            )
        })
    })
}

/// The OTLP sink.
pub const COMPONENT: Component = Component {
    name: "otlp",
    enabled: |c| c.sinks.otlp.enabled,
    start: |c, ctx| Box::pin(start(c, ctx)),
    once: None,
    inspect: None,
    derive: None,
    off_but_asked: Some(|c| off_but_addressed(&c.sinks.otlp, &|k| std::env::var(k).ok())),
};

/// The metrics request an export would send for `model` now (`junction once --format
/// otlp`), with the resource the settings make.
pub fn request_now(
    config: &OtlpConfig,
    proc_root: &std::path::Path,
    model: &crate::model::Model,
) -> anyhow::Result<Vec<u8>> {
    let env = |k: &str| std::env::var(k).ok();
    let settings: Settings =
        settings::resolve(config, &env).map_err(|e| anyhow::anyhow!("sinks.otlp: {e}"))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut encoder = metrics::encode::Encoder::new(envelope(&settings), settings.delta, now);
    encoder.set_origins(
        crate::agent::started_ns(),
        crate::model::state::boot_time_ns(proc_root),
    );
    let snap = crate::model::view::Snapshot::take(model);
    Ok(encoder.encode(&snap.view(), now).0.to_vec())
}

fn envelope(settings: &Settings) -> metrics::encode::Envelope {
    metrics::encode::Envelope {
        resource: resource::attributes(settings),
        schema_url: resource::SCHEMA_URL.into(),
        scope: ("junction".into(), env!("CARGO_PKG_VERSION").into()),
    }
}

/// Resolves the settings (a bad `OTEL_*` variable fails the start, naming it), builds the
/// exporters and starts the metric reader and the event shipper.
async fn start(config: Arc<Config>, ctx: Ctx) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let env = |k: &str| std::env::var(k).ok();
    let settings: Settings = settings::resolve(&config.sinks.otlp, &env)
        .map_err(|e| anyhow::anyhow!("sinks.otlp: {e}"))?;
    let resource = resource::build(&settings);
    // The event log is this sink's queue: it holds what is still to be delivered, at most.
    ctx.model.events.set_capacity(settings.max_queued_events);
    let stats = Arc::new(stats::Stats::new(ctx.model.clone()));
    let exporters = transport::build(&settings, &stats).await?;
    tracing::info!(
        metrics = %settings.metrics.endpoint,
        logs = %settings.logs.endpoint,
        protocol = ?settings.metrics.protocol,
        interval_secs = settings.interval.as_secs(),
        "pushing metrics and events over OTLP"
    );
    let panics = crate::agent::ThreadPanics::default();
    let exporter = metrics::start(
        exporters.metrics,
        envelope(&settings),
        &settings,
        crate::model::state::boot_time_ns(&config.proc_root),
        settings
            .delta
            .then(|| metrics::Resume::open(&config.state_dir, &config.proc_root)),
        ctx.model.clone(),
        stats.clone(),
        &panics,
    )?;
    let shipper = events::start(
        exporters.logs,
        resource,
        ctx.model.clone(),
        stats.clone(),
        settings.max_queued_events,
        tokio::runtime::Handle::current(),
        &panics,
    )?;
    Ok(tokio::spawn(async move {
        // Until shutdown, or a panic on either thread: then the other is stopped too (its
        // last delivery made) and this task panics with the thread's message, so that the
        // supervisor reports the sink down and starts it again; delivered events are
        // released from the event log, so the new shipper starts at the first undelivered.
        let panicked = ctx.shutdown.unless(panics.first()).await;
        // The final export: pending events, then the metrics as the sources left them.
        let _ = tokio::task::spawn_blocking(move || {
            shipper.stop(Duration::from_millis(1500));
            exporter.stop(Duration::from_millis(1500));
        })
        .await;
        if let Some(why) = panicked {
            panic!("{why}");
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_addressed_receiver_with_the_sink_off_is_said() {
        let none = |_: &str| None;
        let mut c = OtlpConfig::default();
        assert_eq!(off_but_addressed(&c, &none), None, "nothing addressed");
        c.endpoint = "http://user:secret@collector:4317".into();
        let why = off_but_addressed(&c, &none).expect("said");
        assert!(why.contains("enabled = true"), "{why}");
        assert!(!why.contains("secret"), "credentials redacted: {why}");
        c.enabled = true;
        assert_eq!(off_but_addressed(&c, &none), None, "on: nothing to say");
        let c = OtlpConfig::default();
        let env =
            |k: &str| (k == "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT").then(|| "http://c:4318".into());
        let why = off_but_addressed(&c, &env).expect("said");
        assert!(
            why.starts_with("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT="),
            "{why}"
        );
        let blank = |_: &str| Some(" ".to_string());
        assert_eq!(off_but_addressed(&c, &blank), None);
    }
}

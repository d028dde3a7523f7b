//! The transports, configured from the settings: gRPC through tonic (TLS with the built-in
//! roots and the CA file, client identity, gzip, metadata headers) or HTTP/protobuf through a
//! blocking reqwest client with rustls. Metrics go through the sink's own sender
//! (`metrics/send.rs`); events through `opentelemetry-otlp`'s log exporter, whose HTTP client
//! is wrapped so that every response is seen (status, the receiver's message, bytes on the
//! wire).
//!
//! How an event export failed is told from what the exporter returns: for HTTP, the last
//! response recorded by the wrapper; for gRPC, the status code in the error and the
//! receiver's message, which the exporter reports only in its diagnostic event (captured by
//! [`diagnostics_layer`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{
    Compression, LogExporter, RetryPolicy, WithExportConfig, WithHttpConfig, WithTonicConfig,
};

use super::metrics::send::Sender;
use super::settings::{Protocol, Settings, Signal, Target};
use super::stats::{Outcome, Stats};
use crate::model::lock;

/// The metrics sender and the log exporter (with what tells its failures apart).
pub struct Exporters {
    /// Metrics.
    pub metrics: Sender,
    /// Logs.
    pub logs: Classified<LogExporter>,
}

/// An exporter and the way to classify its failures.
pub struct Classified<E> {
    /// The exporter.
    pub exporter: E,
    /// Its signal.
    pub signal: Signal,
    /// The protocol (decides how failures are read).
    pub protocol: Protocol,
    /// Responses seen by the HTTP client (unused for gRPC).
    pub last_http: Arc<Mutex<Option<HttpOutcome>>>,
}

impl<E> Classified<E> {
    /// What an export's result means.
    pub fn classify(&self, r: &opentelemetry_sdk::error::OTelSdkResult) -> Outcome {
        let e = match r {
            Ok(()) => return Outcome::Ok,
            Err(e) => e.to_string(),
        };
        match self.protocol {
            Protocol::HttpProtobuf => match lock(&self.last_http).take() {
                Some(HttpOutcome::Status { code, body }) if is_rejection(code) => {
                    Outcome::Rejected(format!("HTTP {code}: {body}"))
                }
                Some(HttpOutcome::Status { code, body }) => {
                    Outcome::Retryable(format!("HTTP {code}: {body}"))
                }
                Some(HttpOutcome::Transport(t)) => Outcome::Retryable(t),
                None => Outcome::Retryable(e),
            },
            Protocol::Grpc => {
                let code = e
                    .split("gRPC code: ")
                    .nth(1)
                    .map(|c| c.split(':').next().unwrap_or(c).trim().to_string())
                    .unwrap_or_default();
                let message = take_grpc_message(self.signal).unwrap_or_default();
                let text = match (code.is_empty(), message.is_empty()) {
                    (true, _) => e,
                    (false, true) => code.clone(),
                    (false, false) => format!("{code}: {message}"),
                };
                // The codes the OTLP specification says not to retry.
                if matches!(
                    code.as_str(),
                    "InvalidArgument"
                        | "NotFound"
                        | "PermissionDenied"
                        | "Unauthenticated"
                        | "Unimplemented"
                        | "FailedPrecondition"
                        | "AlreadyExists"
                        | "OutOfRange"
                ) {
                    Outcome::Rejected(text)
                } else {
                    Outcome::Retryable(text)
                }
            }
        }
    }
}

/// 4xx other than 408 and 429 are not worth retrying (OTLP/HTTP specification).
pub fn is_rejection(code: u16) -> bool {
    (400..500).contains(&code) && code != 408 && code != 429
}

/// The last HTTP response (or transport failure) of a signal.
#[derive(Debug, Clone)]
pub enum HttpOutcome {
    /// A response with this status; the body (the receiver's message), cut short.
    Status {
        /// HTTP status.
        code: u16,
        /// Start of the body as text.
        body: String,
    },
    /// No response (refused, timed out, TLS failure).
    Transport(String),
}

/// The reqwest blocking client of `opentelemetry-http`, seeing every request and response.
#[derive(Debug)]
struct RecordingClient {
    inner: reqwest::blocking::Client,
    signal: Signal,
    stats: Arc<Stats>,
    last: Arc<Mutex<Option<HttpOutcome>>>,
}

#[async_trait::async_trait]
impl HttpClient for RecordingClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        self.stats.sent(self.signal, request.body().len());
        let r = self.inner.send_bytes(request).await;
        *lock(&self.last) = Some(match &r {
            Ok(resp) if resp.status().is_success() => return r,
            Ok(resp) => HttpOutcome::Status {
                code: resp.status().as_u16(),
                body: String::from_utf8_lossy(&resp.body()[..resp.body().len().min(512)])
                    .trim()
                    .to_string(),
            },
            Err(e) => HttpOutcome::Transport(chain(e.as_ref())),
        });
        r
    }
}

/// An error and its causes on one line (`error: cause: cause`).
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = c.source();
    }
    out
}

/// A slow exporter retry loop inside one export would hold the reader; the sink retries
/// across exports itself, so the exporter retries little and quickly (still honouring a
/// receiver's Retry-After / RetryInfo within the timeout).
fn retry_policy() -> RetryPolicy {
    RetryPolicy::recommended().with_max_retries(2)
}

/// Builds the metrics sender and the log exporter. gRPC channels are created here, so this
/// runs inside the runtime.
pub async fn build(s: &Settings, stats: &Arc<Stats>) -> anyhow::Result<Exporters> {
    let tls = Tls::load(s)?;
    let metrics = match s.metrics.protocol {
        Protocol::Grpc => Sender::grpc(&s.metrics, &tls)?,
        Protocol::HttpProtobuf => {
            Sender::http(&s.metrics, reqwest_async_client(&s.metrics, &tls)?)?
        }
    };
    let (logs, logs_last) = match s.logs.protocol {
        Protocol::Grpc => (
            grpc(LogExporter::builder().with_tonic(), &s.logs, &tls)?.build()?,
            Arc::default(),
        ),
        Protocol::HttpProtobuf => {
            let (client, last) = http_client(&s.logs, Signal::Logs, &tls, stats).await?;
            (
                http(LogExporter::builder().with_http(), &s.logs, client).build()?,
                last,
            )
        }
    };
    Ok(Exporters {
        metrics,
        logs: Classified {
            exporter: logs,
            signal: Signal::Logs,
            protocol: s.logs.protocol,
            last_http: logs_last,
        },
    })
}

/// The PEM files, read once.
pub struct Tls {
    /// The CA bundle.
    pub ca: Option<Vec<u8>>,
    /// The client certificate and key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl Tls {
    fn load(s: &Settings) -> anyhow::Result<Self> {
        let read = |p: &std::path::Path, what: &str| {
            std::fs::read(p).map_err(|e| {
                anyhow::anyhow!("sinks.otlp: cannot read the {what} {}: {e}", p.display())
            })
        };
        Ok(Self {
            ca: s
                .ca_file
                .as_deref()
                .map(|p| read(p, "CA file"))
                .transpose()?,
            identity: match &s.client_identity {
                Some((c, k)) => Some((read(c, "client certificate")?, read(k, "client key")?)),
                None => None,
            },
        })
    }
}

/// The headers as gRPC metadata.
pub fn grpc_metadata(t: &Target) -> anyhow::Result<tonic::metadata::MetadataMap> {
    let mut metadata = tonic::metadata::MetadataMap::new();
    for (k, v) in &t.headers {
        let key = tonic::metadata::MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
            .map_err(|_| anyhow::anyhow!("sinks.otlp.headers: {k:?} is not a gRPC metadata key"))?;
        let value = v.parse().map_err(|_| {
            anyhow::anyhow!("sinks.otlp.headers: the value of {k:?} is not valid metadata")
        })?;
        metadata.insert(key, value);
    }
    Ok(metadata)
}

/// tonic's TLS settings: the built-in roots, the CA file, the client identity.
pub fn tonic_tls(tls: &Tls) -> tonic::transport::ClientTlsConfig {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let mut c = ClientTlsConfig::new().with_webpki_roots();
    if let Some(ca) = &tls.ca {
        c = c.ca_certificate(Certificate::from_pem(ca));
    }
    if let Some((cert, key)) = &tls.identity {
        c = c.identity(Identity::from_pem(cert, key));
    }
    c
}

fn grpc<B: WithTonicConfig + WithExportConfig>(b: B, t: &Target, tls: &Tls) -> anyhow::Result<B> {
    let mut b = b
        .with_endpoint(&t.endpoint)
        .with_timeout(t.timeout)
        .with_metadata(grpc_metadata(t)?)
        .with_retry_policy(retry_policy());
    if t.gzip {
        b = b.with_compression(Compression::Gzip);
    }
    if t.endpoint.starts_with("https://") {
        b = b.with_tls_config(tonic_tls(tls));
    }
    Ok(b)
}

fn http<B: WithHttpConfig + WithExportConfig>(b: B, t: &Target, client: RecordingClient) -> B {
    let headers: HashMap<String, String> = t
        .headers
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let b = b
        .with_endpoint(&t.endpoint)
        .with_timeout(t.timeout)
        .with_headers(headers)
        .with_retry_policy(retry_policy())
        .with_http_client(client);
    if t.gzip {
        b.with_compression(Compression::Gzip)
    } else {
        b
    }
}

/// The TLS settings of a reqwest client: the CA file's certificates (besides the built-in
/// roots) and the client identity (certificate and key in one PEM).
struct ReqwestTls {
    roots: Vec<reqwest::Certificate>,
    identity: Option<reqwest::Identity>,
}

impl ReqwestTls {
    fn from(tls: &Tls) -> anyhow::Result<Self> {
        let roots = match &tls.ca {
            Some(ca) => reqwest::Certificate::from_pem_bundle(ca)
                .map_err(|e| anyhow::anyhow!("sinks.otlp.ca_file: not PEM certificates: {e}"))?,
            None => Vec::new(),
        };
        let identity = match &tls.identity {
            Some((cert, key)) => {
                let mut pem = cert.clone();
                pem.push(b'\n');
                pem.extend_from_slice(key);
                Some(reqwest::Identity::from_pem(&pem).map_err(|e| {
                    anyhow::anyhow!("sinks.otlp.client_cert_file / client_key_file: {e}")
                })?)
            }
            None => None,
        };
        Ok(Self { roots, identity })
    }
}

/// The settings both reqwest clients are built with (rustls, timeouts, the CA file, the
/// client identity); the async and the blocking builders have the same methods but no
/// trait in common.
macro_rules! reqwest_settings {
    ($builder:expr, $timeout:expr, $tls:expr) => {{
        let mut b = $builder
            .timeout($timeout)
            .connect_timeout($timeout.min(Duration::from_secs(5)))
            .user_agent(concat!("junction/", env!("CARGO_PKG_VERSION")))
            .tls_backend_rustls();
        for cert in $tls.roots {
            b = b.add_root_certificate(cert);
        }
        if let Some(identity) = $tls.identity {
            b = b.identity(identity);
        }
        b
    }};
}

/// The metrics sender's client: async, used on the exporter thread's own runtime, so that
/// the thread that writes a request also sends it and reads the answer.
fn reqwest_async_client(t: &Target, tls: &Tls) -> anyhow::Result<reqwest::Client> {
    let tls = ReqwestTls::from(tls)?;
    Ok(reqwest_settings!(reqwest::Client::builder(), t.timeout, tls).build()?)
}

/// The log exporter's client: blocking (`opentelemetry-http` calls it from the batch
/// processor's thread, outside the runtime), built on a thread of its own, as a blocking
/// client must not be created inside the async runtime.
async fn reqwest_client(t: &Target, tls: &Tls) -> anyhow::Result<reqwest::blocking::Client> {
    let tls = ReqwestTls::from(tls)?;
    let timeout = t.timeout;
    tokio::task::spawn_blocking(move || -> anyhow::Result<reqwest::blocking::Client> {
        Ok(reqwest_settings!(reqwest::blocking::Client::builder(), timeout, tls).build()?)
    })
    .await?
}

/// The log exporter's HTTP client: the reqwest client, recording every response.
async fn http_client(
    t: &Target,
    signal: Signal,
    tls: &Tls,
    stats: &Arc<Stats>,
) -> anyhow::Result<(RecordingClient, Arc<Mutex<Option<HttpOutcome>>>)> {
    let inner = reqwest_client(t, tls).await?;
    let last = Arc::new(Mutex::new(None));
    Ok((
        RecordingClient {
            inner,
            signal,
            stats: stats.clone(),
            last: last.clone(),
        },
        last,
    ))
}

/// The gRPC failure messages reported in the exporters' diagnostic events, per signal.
static GRPC_MESSAGES: Mutex<BTreeMap<Signal, String>> = Mutex::new(BTreeMap::new());

fn take_grpc_message(signal: Signal) -> Option<String> {
    lock(&GRPC_MESSAGES).remove(&signal)
}

/// A tracing layer that keeps the receiver's message from `opentelemetry-otlp`'s
/// `Tonic*Client.ExportFailed` diagnostic events (the exporter's error value carries only
/// the status code). Installed beside the log output, which does not print these events.
pub fn diagnostics_layer<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::filter::{LevelFilter, Targets};
    GrpcMessages.with_filter(Targets::new().with_target("opentelemetry-otlp", LevelFilter::DEBUG))
}

struct GrpcMessages;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for GrpcMessages {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let name = event.metadata().name();
        let signal = match name {
            "TonicLogsClient.ExportFailed" => Signal::Logs,
            _ => return,
        };
        struct Visit(Option<String>);
        impl tracing::field::Visit for Visit {
            fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
                if f.name() == "grpc_message" {
                    self.0 = Some(v.to_string());
                }
            }
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "grpc_message" {
                    self.0 = Some(format!("{v:?}").trim_matches('"').to_string());
                }
            }
        }
        let mut v = Visit(None);
        event.record(&mut v);
        if let Some(m) = v.0.filter(|m| !m.is_empty()) {
            lock(&GRPC_MESSAGES).insert(signal, m);
        }
    }
}

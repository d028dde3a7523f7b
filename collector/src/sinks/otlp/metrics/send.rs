//! Sends an encoded metrics request: OTLP/HTTP (a POST of the protobuf body, gzip level 2 when on,
//! compressed once per export by a compressor kept across exports, through the sink's
//! reqwest client with its TLS settings) or OTLP/gRPC (the `MetricsService/Export` call
//! through a tonic channel, the bytes passed through as the message, gzip by tonic). Both
//! run on the exporter thread's own single-threaded runtime: the thread that encodes a
//! request writes it and reads the answer, with no other thread woken for an export, and
//! the connection it keeps is looked after between exports by the same runtime. Every
//! response is classified: 2xx / OK delivered; HTTP 4xx but 408 and 429, and the gRPC codes
//! the OTLP specification says not to retry, rejected; the rest retryable. A retryable
//! failure is tried again twice within the request timeout, after 100 ms then 200 ms (or
//! what the receiver's `Retry-After` / `RetryInfo` asks, if that fits); past that the next
//! export carries the state.

use std::time::{Duration, Instant};

use bytes::{Buf as _, BufMut as _, Bytes};
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};

use super::super::settings::{Signal, Target};
use super::super::stats::{Outcome, Stats};
use super::super::transport::{Tls, chain, grpc_metadata, is_rejection, tonic_tls};
use crate::sinks::gzip::Gzip;

/// The gRPC method.
const EXPORT: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";
/// Attempts per export at most.
const ATTEMPTS: u32 = 3;
const FIRST_RETRY: Duration = Duration::from_millis(100);

/// Where metrics go, and how.
pub enum Sender {
    /// OTLP/HTTP.
    Http {
        /// The client (TLS, timeouts); its connections live on the runtime that first
        /// uses it, the exporter thread's.
        client: reqwest::Client,
        /// The full URL, with `/v1/metrics` (parsed once, not on every export).
        url: reqwest::Url,
        /// Request headers (never logged).
        headers: reqwest::header::HeaderMap,
        /// The gzip compressor (reset for each export, so that its tables are allocated
        /// once) and the compressed body's buffer, kept between exports; `None`: no gzip.
        gzip: Option<Gzip>,
    },
    /// OTLP/gRPC.
    Grpc {
        /// Where the channel connects (TLS and timeouts set; boxed, as it is large).
        endpoint: Box<Endpoint>,
        /// gzip the messages.
        gzip: bool,
        /// The client, made at the first export on the exporter thread's runtime (a
        /// channel's worker is a task of the runtime that makes it).
        grpc: Option<tonic::client::Grpc<Channel>>,
        /// Metadata sent with every call (never logged).
        metadata: tonic::metadata::MetadataMap,
    },
}

impl Sender {
    /// The HTTP sender over `client`.
    pub fn http(t: &Target, client: reqwest::Client) -> anyhow::Result<Self> {
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in &t.headers {
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| anyhow::anyhow!("sinks.otlp.headers: {k:?} is not a header name"))?;
            let value = reqwest::header::HeaderValue::from_str(v).map_err(|_| {
                anyhow::anyhow!(
                    "sinks.otlp.headers: the value of {k:?} is not a valid header value"
                )
            })?;
            headers.insert(name, value);
        }
        headers.insert(
            reqwest::header::CONTENT_TYPE,
            reqwest::header::HeaderValue::from_static("application/x-protobuf"),
        );
        if t.gzip {
            headers.insert(
                reqwest::header::CONTENT_ENCODING,
                reqwest::header::HeaderValue::from_static("gzip"),
            );
        }
        let url = reqwest::Url::parse(&t.endpoint).map_err(|e| {
            anyhow::anyhow!(
                "sinks.otlp.endpoint {:?}: {e}",
                crate::redact::url(&t.endpoint)
            )
        })?;
        Ok(Sender::Http {
            client,
            url,
            headers,
            gzip: t.gzip.then(Gzip::new),
        })
    }

    /// The gRPC sender (the channel is made and connects at the first export).
    pub fn grpc(t: &Target, tls: &Tls) -> anyhow::Result<Self> {
        let bad = |e: tonic::transport::Error| {
            anyhow::anyhow!(
                "sinks.otlp.endpoint {:?}: {}",
                crate::redact::url(&t.endpoint),
                chain(&e)
            )
        };
        let mut endpoint = Endpoint::from_shared(t.endpoint.clone())
            .map_err(bad)?
            .timeout(t.timeout)
            .connect_timeout(t.timeout.min(Duration::from_secs(5)))
            .user_agent(concat!("junction/", env!("CARGO_PKG_VERSION")))
            .map_err(bad)?;
        if t.endpoint.starts_with("https://") {
            endpoint = endpoint.tls_config(tonic_tls(tls)).map_err(bad)?;
        }
        Ok(Sender::Grpc {
            endpoint: Box::new(endpoint),
            gzip: t.gzip,
            grpc: None,
            metadata: grpc_metadata(t)?,
        })
    }

    /// The compressor, where the request goes as OTLP/HTTP with gzip: the encoder hands it
    /// the request in pieces ([`Gzip::start`], [`Gzip::feed`]), then [`Sender::export_gzipped`]
    /// sends what it made, so that the whole uncompressed request is never held.
    pub fn gzip(&mut self) -> Option<&mut Gzip> {
        match self {
            Sender::Http { gzip: Some(z), .. } => Some(z),
            _ => None,
        }
    }

    /// Sends `body` (an encoded `ExportMetricsServiceRequest`), retrying as the module says
    /// within `timeout`; `stopping` cuts the waits short. Every attempt sends a handle to
    /// the same bytes (no copy of the request per attempt).
    pub async fn export(
        &mut self,
        body: Bytes,
        timeout: Duration,
        stats: &Stats,
        stopping: &dyn Fn() -> bool,
    ) -> Outcome {
        if let Some(z) = self.gzip() {
            // Compressed once for every attempt.
            z.start();
            z.feed(&body);
            return self.export_gzipped(timeout, stats, stopping).await;
        }
        let http_body = matches!(self, Sender::Http { .. }).then(|| body.clone());
        self.send(&body, http_body, timeout, stats, stopping).await
    }

    /// Sends the request the compressor was fed since [`Gzip::start`], as [`Sender::export`]
    /// does.
    pub async fn export_gzipped(
        &mut self,
        timeout: Duration,
        stats: &Stats,
        stopping: &dyn Fn() -> bool,
    ) -> Outcome {
        let http_body = match self.gzip().map(Gzip::finish) {
            Some(Ok(b)) => b,
            Some(Err(e)) => return Outcome::Retryable(format!("gzip: {e}")),
            None => return Outcome::Retryable("gzip: this sender does not compress".into()),
        };
        self.send(&Bytes::new(), Some(http_body), timeout, stats, stopping)
            .await
    }

    /// The attempts: `body` is what gRPC sends, `http_body` what HTTP does.
    async fn send(
        &mut self,
        body: &Bytes,
        mut http_body: Option<Bytes>,
        timeout: Duration,
        stats: &Stats,
        stopping: &dyn Fn() -> bool,
    ) -> Outcome {
        let deadline = Instant::now() + timeout;
        let mut wait = FIRST_RETRY;
        let mut attempt = 1;
        let outcome = loop {
            let (outcome, hint) = self.attempt(body, http_body.as_ref(), stats).await;
            if !matches!(outcome, Outcome::Retryable(_)) || attempt >= ATTEMPTS || stopping() {
                break outcome;
            }
            let pause = hint.unwrap_or(wait);
            if Instant::now() + pause >= deadline {
                break outcome;
            }
            tokio::time::sleep(pause).await;
            wait *= 2;
            attempt += 1;
        };
        if let (Sender::Http { gzip: Some(z), .. }, Some(b)) = (self, http_body.take()) {
            z.keep(b);
        }
        outcome
    }

    /// One attempt: how it ended and how long the receiver asked to wait, if it did.
    async fn attempt(
        &mut self,
        body: &Bytes,
        http_body: Option<&Bytes>,
        stats: &Stats,
    ) -> (Outcome, Option<Duration>) {
        match self {
            Sender::Http {
                client,
                url,
                headers,
                ..
            } => {
                let payload = http_body.cloned().unwrap_or_default();
                stats.sent(Signal::Metrics, payload.len());
                let request = client
                    .post(url.clone())
                    .headers(headers.clone())
                    .body(payload);
                let r = async move {
                    let resp = request.send().await?;
                    let code = resp.status().as_u16();
                    let hint = resp
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    // The body (a partial success, if any) is read so the connection is
                    // reused.
                    Ok::<_, reqwest::Error>((code, hint, body_start(resp).await))
                }
                .await;
                match r {
                    Ok((code, _, _)) if (200..300).contains(&code) => (Outcome::Ok, None),
                    Ok((code, hint, text)) => {
                        let text = String::from_utf8_lossy(&text[..text.len().min(512)])
                            .trim()
                            .to_string();
                        let why = format!("HTTP {code}: {text}");
                        if is_rejection(code) {
                            (Outcome::Rejected(why), None)
                        } else {
                            (Outcome::Retryable(why), hint)
                        }
                    }
                    Err(e) => (Outcome::Retryable(chain(&e)), None),
                }
            }
            Sender::Grpc {
                endpoint,
                gzip,
                grpc,
                metadata,
            } => {
                let mut grpc = grpc
                    .get_or_insert_with(|| {
                        let grpc = tonic::client::Grpc::new(endpoint.connect_lazy());
                        if *gzip {
                            grpc.send_compressed(CompressionEncoding::Gzip)
                                .accept_compressed(CompressionEncoding::Gzip)
                        } else {
                            grpc
                        }
                    })
                    .clone();
                let mut request = tonic::Request::new(body.clone());
                *request.metadata_mut() = metadata.clone();
                let path = tonic::codegen::http::uri::PathAndQuery::from_static(EXPORT);
                let r = async move {
                    grpc.ready()
                        .await
                        .map_err(|e| tonic::Status::unavailable(chain(&e)))?;
                    grpc.unary::<Bytes, (), _>(request, path, Raw).await
                }
                .await;
                match r {
                    Ok(_) => (Outcome::Ok, None),
                    Err(status) => classify(&status),
                }
            }
        }
    }
}

/// At most the first 64 KiB of a response body: what a receiver answers is not ours to
/// hold whole (a partial success is a few hundred bytes, an error message less). A body
/// that fails part way gives what came before.
async fn body_start(mut resp: reqwest::Response) -> Vec<u8> {
    const MOST: usize = 64 * 1024;
    let mut out = Vec::new();
    while out.len() < MOST {
        match resp.chunk().await {
            Ok(Some(c)) => out.extend_from_slice(&c[..c.len().min(MOST - out.len())]),
            Ok(None) | Err(_) => break,
        }
    }
    out
}

/// A gRPC status as an outcome, with the receiver's `RetryInfo` delay if it sent one.
fn classify(status: &tonic::Status) -> (Outcome, Option<Duration>) {
    use tonic::Code;
    use tonic_types::StatusExt as _;
    let code = format!("{:?}", status.code());
    let text = if status.message().is_empty() {
        code
    } else {
        format!("{code}: {}", status.message())
    };
    // The codes the OTLP specification says not to retry.
    let rejected = matches!(
        status.code(),
        Code::InvalidArgument
            | Code::NotFound
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
            | Code::FailedPrecondition
            | Code::AlreadyExists
            | Code::OutOfRange
    );
    if rejected {
        return (Outcome::Rejected(text), None);
    }
    let hint = status.get_details_retry_info().and_then(|r| r.retry_delay);
    (Outcome::Retryable(text), hint)
}

/// The codec of the export call: the request is already protobuf; the response (a possible
/// partial success) is read and let go.
#[derive(Clone, Copy)]
struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = ();
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = ();
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<()>, tonic::Status> {
        let n = src.remaining();
        src.advance(n);
        Ok(Some(()))
    }
}

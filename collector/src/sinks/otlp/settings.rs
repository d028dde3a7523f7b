//! The OTLP settings in effect: the config file first, then the standard `OTEL_*`
//! environment variables, then the defaults. A key set in `[sinks.otlp]` wins; a key left
//! empty (or 0) there is taken from the environment; the signal-specific variables
//! (`OTEL_EXPORTER_OTLP_METRICS_*`, `OTEL_EXPORTER_OTLP_LOGS_*`) win over the general ones.
//! Pure: the environment is passed in, so every rule is unit-tested.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::OtlpConfig;

/// The wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC.
    Grpc,
    /// OTLP/HTTP with protobuf bodies.
    HttpProtobuf,
}

/// Metrics or logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Signal {
    /// Metric data points.
    Metrics,
    /// Log records (events).
    Logs,
}

impl Signal {
    /// `junction.signal`.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
        }
    }

    fn env(self) -> &'static str {
        match self {
            Signal::Metrics => "METRICS",
            Signal::Logs => "LOGS",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Signal::Metrics => "/v1/metrics",
            Signal::Logs => "/v1/logs",
        }
    }
}

/// What one signal is sent with.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The full URL (HTTP: with `/v1/metrics` or `/v1/logs`).
    pub endpoint: String,
    /// Request headers (secrets: never logged).
    pub headers: BTreeMap<String, String>,
    /// The protocol.
    pub protocol: Protocol,
    /// gzip the bodies.
    pub gzip: bool,
    /// Per-request timeout.
    pub timeout: Duration,
}

/// Every setting of the sink, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Metrics.
    pub metrics: Target,
    /// Logs.
    pub logs: Target,
    /// Metric export interval.
    pub interval: Duration,
    /// Delta temporality for counters (cumulative otherwise).
    pub delta: bool,
    /// CA bundle to trust besides the built-in roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key (mutual TLS).
    pub client_identity: Option<(PathBuf, PathBuf)>,
    /// `service.name`.
    pub service_name: String,
    /// Resource attributes the user adds (`OTEL_RESOURCE_ATTRIBUTES`, then the file).
    pub resource_attributes: BTreeMap<String, String>,
    /// Events waiting for delivery, at most.
    pub max_queued_events: usize,
}

/// A setting from the environment that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{variable}={value:?}: {message}")]
pub struct EnvError {
    /// The variable.
    pub variable: String,
    /// Its value (never a header: those are not echoed).
    pub value: String,
    /// What is wrong.
    pub message: String,
}

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);

/// Resolves the settings; `env` looks a variable up.
pub fn resolve(c: &OtlpConfig, env: &dyn Fn(&str) -> Option<String>) -> Result<Settings, EnvError> {
    let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let interval = if c.interval_secs > 0 {
        Duration::from_secs(c.interval_secs)
    } else {
        match var("OTEL_METRIC_EXPORT_INTERVAL") {
            None => DEFAULT_INTERVAL,
            Some(v) => Duration::from_millis(
                v.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|ms| *ms >= 1000)
                    .ok_or_else(|| {
                        bad(
                            "OTEL_METRIC_EXPORT_INTERVAL",
                            v.clone(),
                            "milliseconds, at least 1000",
                        )
                    })?,
            ),
        }
    };
    let delta = match c.temporality.as_str() {
        "" => match var("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE") {
            None => false,
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "cumulative" => false,
                "delta" => true,
                _ => {
                    return Err(bad(
                        "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
                        v.clone(),
                        "use cumulative or delta",
                    ));
                }
            },
        },
        t => t == "delta",
    };
    let file = |set: &str, name: &str| -> Option<PathBuf> {
        if set.is_empty() {
            var(name).map(PathBuf::from)
        } else {
            Some(PathBuf::from(set))
        }
    };
    let ca_file = file(&c.ca_file, "OTEL_EXPORTER_OTLP_CERTIFICATE");
    let cert = file(&c.client_cert_file, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE");
    let key = file(&c.client_key_file, "OTEL_EXPORTER_OTLP_CLIENT_KEY");
    let client_identity = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        (Some(c), None) | (None, Some(c)) => {
            return Err(bad(
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE / OTEL_EXPORTER_OTLP_CLIENT_KEY",
                c.display().to_string(),
                "give both the client certificate and its key, or neither",
            ));
        }
    };
    let service_name = if c.service_name.is_empty() {
        var("OTEL_SERVICE_NAME").unwrap_or_else(|| "junction".into())
    } else {
        c.service_name.clone()
    };
    let mut resource_attributes = BTreeMap::new();
    if let Some(v) = var("OTEL_RESOURCE_ATTRIBUTES") {
        resource_attributes.extend(parse_pairs(&v).ok_or_else(|| {
            bad(
                "OTEL_RESOURCE_ATTRIBUTES",
                v.clone(),
                "write key=value pairs separated by commas",
            )
        })?);
    }
    resource_attributes.extend(
        c.resource_attributes
            .0
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );
    Ok(Settings {
        metrics: target(c, Signal::Metrics, &var)?,
        logs: target(c, Signal::Logs, &var)?,
        interval,
        delta,
        ca_file,
        client_identity,
        service_name,
        resource_attributes,
        max_queued_events: c.max_queued_events.max(1) as usize,
    })
}

fn bad(variable: &str, value: String, message: &str) -> EnvError {
    EnvError {
        variable: variable.into(),
        value,
        message: message.into(),
    }
}

/// One signal's endpoint, protocol, headers, compression and timeout: the file's setting,
/// else the signal's variable, else the general one.
fn target(
    c: &OtlpConfig,
    signal: Signal,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Target, EnvError> {
    let sig = signal.env();
    let specific = |what: &str| format!("OTEL_EXPORTER_OTLP_{sig}_{what}");
    let general = |what: &str| format!("OTEL_EXPORTER_OTLP_{what}");
    // Protocol.
    let protocol = match (
        c.protocol.as_str(),
        var(&specific("PROTOCOL"))
            .map(|v| (specific("PROTOCOL"), v))
            .or_else(|| var(&general("PROTOCOL")).map(|v| (general("PROTOCOL"), v))),
    ) {
        ("", None) => Protocol::Grpc,
        ("", Some((name, v))) => {
            parse_protocol(&v).ok_or_else(|| bad(&name, v.clone(), "use grpc or http/protobuf"))?
        }
        (p, _) => parse_protocol(p).unwrap_or(Protocol::Grpc),
    };
    // Endpoint: the file's base URL; else the signal's URL as is; else the general base.
    let base = |b: &str| match protocol {
        Protocol::Grpc => b.trim_end_matches('/').to_string(),
        Protocol::HttpProtobuf => format!("{}{}", b.trim_end_matches('/'), signal.path()),
    };
    let endpoint = if !c.endpoint.is_empty() {
        base(&c.endpoint)
    } else if let Some(v) = var(&specific("ENDPOINT")) {
        check_url(&specific("ENDPOINT"), &v)?;
        v
    } else if let Some(v) = var(&general("ENDPOINT")) {
        check_url(&general("ENDPOINT"), &v)?;
        base(&v)
    } else {
        base(match protocol {
            Protocol::Grpc => "http://localhost:4317",
            Protocol::HttpProtobuf => "http://localhost:4318",
        })
    };
    // Headers: general, then signal-specific, then the file, key by key.
    let mut headers = BTreeMap::new();
    for name in [general("HEADERS"), specific("HEADERS")] {
        if let Some(v) = var(&name) {
            headers.extend(parse_pairs(&v).ok_or_else(|| EnvError {
                variable: name.clone(),
                value: "(not shown)".into(),
                message: "write key=value pairs separated by commas".into(),
            })?);
        }
    }
    headers.extend(c.headers.0.iter().map(|(k, v)| (k.clone(), v.clone())));
    // Compression.
    let gzip = match c.compression.as_str() {
        "" => match var(&specific("COMPRESSION"))
            .map(|v| (specific("COMPRESSION"), v))
            .or_else(|| var(&general("COMPRESSION")).map(|v| (general("COMPRESSION"), v)))
        {
            None => true,
            Some((name, v)) => match v.trim() {
                "gzip" => true,
                "none" => false,
                _ => return Err(bad(&name, v.clone(), "use gzip or none")),
            },
        },
        other => other == "gzip",
    };
    // Timeout.
    let timeout = if c.timeout_ms > 0 {
        Duration::from_millis(c.timeout_ms)
    } else {
        match var(&specific("TIMEOUT"))
            .map(|v| (specific("TIMEOUT"), v))
            .or_else(|| var(&general("TIMEOUT")).map(|v| (general("TIMEOUT"), v)))
        {
            None => DEFAULT_TIMEOUT,
            Some((name, v)) => Duration::from_millis(
                v.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|ms| (1..=600_000).contains(ms))
                    .ok_or_else(|| bad(&name, v.clone(), "milliseconds, 1 to 600000"))?,
            ),
        }
    };
    Ok(Target {
        endpoint,
        headers,
        protocol,
        gzip,
        timeout,
    })
}

/// `grpc` or `http/protobuf` (the values `OTEL_EXPORTER_OTLP_PROTOCOL` takes).
pub fn parse_protocol(v: &str) -> Option<Protocol> {
    match v.trim() {
        "grpc" => Some(Protocol::Grpc),
        "http/protobuf" => Some(Protocol::HttpProtobuf),
        _ => None,
    }
}

/// An absolute `http://` or `https://` URL.
pub fn valid_url(v: &str) -> bool {
    reqwest::Url::parse(v)
        .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
}

fn check_url(variable: &str, v: &str) -> Result<(), EnvError> {
    if valid_url(v) {
        Ok(())
    } else {
        Err(EnvError {
            variable: variable.into(),
            value: v.into(),
            message: "not an http:// or https:// URL".into(),
        })
    }
}

/// `k=v,k2=v2` with percent-encoded values (the W3C Baggage form the spec uses for
/// `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_RESOURCE_ATTRIBUTES`).
pub fn parse_pairs(v: &str) -> Option<Vec<(String, String)>> {
    v.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=')?;
            let k = k.trim();
            (!k.is_empty()).then(|| (k.to_string(), percent_decode(v.trim())))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        // The two hex digits are read as bytes: text after a `%` may be any UTF-8.
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests;

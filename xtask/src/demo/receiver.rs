//! The demo's OTLP receiver: OTLP/HTTP protobuf on loopback (the benchmark's receiver), each
//! export decoded and written to a file in a compact form, one line per metric export and one
//! per log record (Junction's events), and kept for the live view.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use prost::Message;

use testkit::otlp::{Answer, Handler, Request, Sink};

/// What arrived so far.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// Metric exports.
    pub metric_exports: u64,
    /// Data points in the last metric export.
    pub last_points: u64,
    /// Log records.
    pub log_records: u64,
    /// The last log records, compact (newest last).
    pub recent_logs: Vec<String>,
}

/// A running receiver.
pub struct Receiver {
    pub port: u16,
    seen: Arc<Mutex<Seen>>,
    _sink: Sink,
}

fn value(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a KeyValue> {
    attrs.iter().find(|kv| kv.key == key)
}

fn clock() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "{:02}:{:02}:{:02}",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60
    )
}

impl Receiver {
    /// Listens on a free loopback port, writing what it receives to `out`.
    pub fn start(out: &Path) -> anyhow::Result<Receiver> {
        let file = Arc::new(Mutex::new(std::fs::File::create(out)?));
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let s = seen.clone();
        let handler: Handler = Arc::new(move |req: &Request| {
            let (path, gzip, body) = (req.path.as_str(), req.gzip, req.body.as_slice());
            let mut raw = Vec::new();
            let body = if gzip {
                if flate2::read::GzDecoder::new(body)
                    .read_to_end(&mut raw)
                    .is_err()
                {
                    return Answer::ok();
                }
                raw.as_slice()
            } else {
                body
            };
            let mut lines = Vec::new();
            let mut seen = match s.lock() {
                Ok(g) => g,
                Err(_) => return Answer::ok(),
            };
            if path.ends_with("/v1/metrics") {
                let Ok(req) = ExportMetricsServiceRequest::decode(body) else {
                    return Answer::ok();
                };
                let (mut metrics, mut points) = (0u64, 0u64);
                for rm in &req.resource_metrics {
                    for sm in &rm.scope_metrics {
                        for m in &sm.metrics {
                            metrics += 1;
                            points += match &m.data {
                                Some(Data::Gauge(g)) => g.data_points.len(),
                                Some(Data::Sum(x)) => x.data_points.len(),
                                Some(Data::Histogram(h)) => h.data_points.len(),
                                _ => 0,
                            } as u64;
                        }
                    }
                }
                let resource = req
                    .resource_metrics
                    .first()
                    .and_then(|r| r.resource.as_ref())
                    .map(|r| {
                        ["service.name", "host.name"]
                            .iter()
                            .filter_map(|k| attr(&r.attributes, k))
                            .map(|kv| format!("{}={}", kv.key, value(&kv.value)))
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_default();
                seen.metric_exports += 1;
                seen.last_points = points;
                lines.push(format!(
                    "{} metrics  {metrics} metrics, {points} points  [{resource}]",
                    clock()
                ));
            } else if path.ends_with("/v1/logs") {
                let Ok(req) = ExportLogsServiceRequest::decode(body) else {
                    return Answer::ok();
                };
                for rl in &req.resource_logs {
                    for sl in &rl.scope_logs {
                        for r in &sl.log_records {
                            let name = if r.event_name.is_empty() {
                                attr(&r.attributes, "event.name")
                                    .map(|kv| value(&kv.value))
                                    .unwrap_or_default()
                            } else {
                                r.event_name.clone()
                            };
                            let keys = [
                                "hw.id",
                                "gpu.xid",
                                "gpu.xid.category",
                                "gpu.mig.gpu_instance_id",
                                "process.pid",
                                "process.executable.name",
                                "hw.state",
                                "gpu.health.reason",
                            ];
                            let attrs: Vec<String> = keys
                                .iter()
                                .filter_map(|k| attr(&r.attributes, k))
                                .map(|kv| format!("{}={}", kv.key, value(&kv.value)))
                                .collect();
                            let line = format!(
                                "{} log      {name} {} {}  {}",
                                clock(),
                                r.severity_text,
                                attrs.join(" "),
                                value(&r.body)
                            );
                            seen.log_records += 1;
                            seen.recent_logs.push(line.clone());
                            lines.push(line);
                        }
                    }
                }
                let n = seen.recent_logs.len();
                if n > 200 {
                    seen.recent_logs.drain(..n - 200);
                }
            }
            drop(seen);
            if let Ok(mut f) = file.lock() {
                for l in lines {
                    let _ = writeln!(f, "{l}");
                }
            }
            Answer::ok()
        });
        let sink = Sink::start_with(Some(handler))?;
        Ok(Receiver {
            port: sink.port,
            seen,
            _sink: sink,
        })
    }

    /// A copy of what arrived.
    pub fn seen(&self) -> Seen {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

//! The registry as OpenTelemetry instruments: one observable instrument per metric (gauge,
//! counter or up-down counter, with the registry's name, unit and description), whose
//! callback reports what the model's latest snapshot holds. A series the model no longer has
//! (a process that ended, a lost GPU's readings) is not reported, so it stops being exported.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry::{InstrumentationScope, Key, KeyValue, Value};
use opentelemetry_otlp::MetricExporter;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider, Stream, Temporality};

use super::stats::Stats;
use super::transport::Classified;
use crate::model::registry::Kind;
use crate::model::view::{Snapshot, View};
use crate::model::{Model, REGISTRY, lock};

/// Series per metric the SDK keeps at most; beyond it a metric's further series are reported
/// as one with `otel.metric.overflow = true`. Its default, 2000, is below what a 64-GPU node
/// with NVLink has for one metric (64 × 18 links × 5 error types = 5760). Not much more: the
/// SDK sizes each instrument's table for its limit up front (`HashMap::with_capacity`), and
/// the pages of that table fill in as new series come and go — at 100 000 that was 4 MiB of
/// address space per instrument (667 MB in all under heaptrack), about 10 MiB more RSS on the
/// 8-GPU soak node, and RSS rising on a node where processes come and go (each new process's
/// series landing on pages not touched before; `cargo xtask bench --soak`). At 8192 a table
/// is 512 KiB, filled in within the first few hundred processes.
const MAX_SERIES_PER_METRIC: usize = 8192;

/// Every metric's points at one moment: (value, attributes) per series.
type Points = Vec<Vec<(f64, Vec<KeyValue>)>>;

/// The snapshot the callbacks of one collection share: taken by the first callback, reused
/// by the others (the SDK calls one callback per instrument).
struct Cache {
    model: Arc<Model>,
    last: Mutex<Option<(Instant, Arc<Points>)>>,
}

impl Cache {
    fn points(&self) -> Arc<Points> {
        let mut last = lock(&self.last);
        if let Some((t, p)) = &*last
            && t.elapsed() < Duration::from_millis(500)
        {
            return p.clone();
        }
        let snap = Snapshot::take(&self.model);
        let p = Arc::new(points(&snap.view()));
        *last = Some((Instant::now(), p.clone()));
        p
    }
}

/// The view as OpenTelemetry points, with the same `hw.id` rule as `/metrics`.
fn points(view: &View<'_>) -> Points {
    let mut out: Points = vec![Vec::new(); REGISTRY.len()];
    for (i, samples) in view.iter() {
        out[i] = samples
            .iter()
            .map(|(gpu, s)| {
                let mut attrs = Vec::with_capacity(s.attrs.len() + 1);
                if s.attr("hw.id").is_none() && !gpu.is_empty() {
                    attrs.push(KeyValue::new(
                        Key::from_static_str("hw.id"),
                        gpu.to_string(),
                    ));
                }
                for (k, v) in &s.attrs {
                    attrs.push(KeyValue::new(
                        Key::from_static_str(k),
                        Value::from(v.clone()),
                    ));
                }
                for (k, v) in view.extra(i, gpu, s) {
                    if s.attr(k).is_none() {
                        attrs.push(KeyValue::new(
                            Key::from_static_str(k),
                            Value::from(v.clone()),
                        ));
                    }
                }
                (s.value, attrs)
            })
            .collect();
    }
    out
}

/// Registers one observable instrument per registry metric.
fn register(meter: &Meter, cache: Arc<Cache>) {
    for (i, d) in REGISTRY.iter().enumerate() {
        let c = cache.clone();
        match d.kind {
            Kind::Gauge => {
                meter
                    .f64_observable_gauge(d.name)
                    .with_unit(d.unit)
                    .with_description(d.help)
                    .with_callback(move |o| {
                        for (v, a) in &c.points()[i] {
                            o.observe(*v, a);
                        }
                    })
                    .build();
            }
            Kind::Counter => {
                meter
                    .f64_observable_counter(d.name)
                    .with_unit(d.unit)
                    .with_description(d.help)
                    .with_callback(move |o| {
                        for (v, a) in &c.points()[i] {
                            o.observe(*v, a);
                        }
                    })
                    .build();
            }
            Kind::UpDownCounter => {
                meter
                    .f64_observable_up_down_counter(d.name)
                    .with_unit(d.unit)
                    .with_description(d.help)
                    .with_callback(move |o| {
                        for (v, a) in &c.points()[i] {
                            o.observe(*v, a);
                        }
                    })
                    .build();
            }
        }
    }
}

/// The OTLP metric exporter, counting and classifying every export.
struct Counted(Classified<MetricExporter>);

impl PushMetricExporter for Counted {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let r = self.0.exporter.export(metrics).await;
        self.0.stats.export(self.0.signal, &self.0.classify(&r));
        r
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.exporter.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.exporter.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.0.exporter.temporality()
    }
}

/// Starts the meter provider: a periodic reader exporting every `interval`.
pub fn start(
    exporter: Classified<MetricExporter>,
    resource: Resource,
    interval: Duration,
    model: Arc<Model>,
    _stats: Arc<Stats>,
) -> SdkMeterProvider {
    let reader = PeriodicReader::builder(Counted(exporter))
        .with_interval(interval)
        .build();
    let provider = SdkMeterProvider::builder()
        .with_resource(resource)
        .with_reader(reader)
        .with_view(|_: &opentelemetry_sdk::metrics::Instrument| {
            Stream::builder()
                .with_cardinality_limit(MAX_SERIES_PER_METRIC)
                .build()
                .ok()
        })
        .build();
    let scope = InstrumentationScope::builder("junction")
        .with_version(env!("CARGO_PKG_VERSION"))
        .with_schema_url(super::resource::SCHEMA_URL)
        .build();
    let meter = provider.meter_with_scope(scope);
    register(
        &meter,
        Arc::new(Cache {
            model,
            last: Mutex::new(None),
        }),
    );
    provider
}

/// The final export, then shutdown (blocking: call off the async workers).
pub fn stop(provider: SdkMeterProvider) {
    if let Err(e) = provider.force_flush() {
        tracing::debug!(error = %e, "final OTLP metric export failed");
    }
    let _ = provider.shutdown();
}

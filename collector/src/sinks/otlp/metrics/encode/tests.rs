//! The wire format checked by decoding it with `opentelemetry-proto`'s generated types (what
//! a receiver runs), against the view it was written from.

use std::collections::BTreeMap;
use std::sync::Arc;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use prost::Message as _;

use super::attributes::MAX_STATIC_ATTRIBUTES;
use super::delta::{LIFETIME_RESERVE, MAX_LASTING};
use super::*;
use crate::model::view::Snapshot;
use crate::model::{GpuInfo, Group, Metric, Model, lock};

fn envelope() -> Envelope {
    Envelope {
        resource: vec![
            ("service.name".into(), "junction".into()),
            // Longer than 127 bytes: a two-byte length.
            ("cluster".into(), "c".repeat(300)),
        ],
        schema_url: "https://opentelemetry.io/schemas/1.44.0".into(),
        scope: ("junction".into(), "1.2.3".into()),
    }
}

/// A model with one GPU: a power gauge (and a NaN one), an energy counter, and `n` node
/// event counters with long names.
fn model(energy: f64, events: usize) -> Arc<Model> {
    let model = Model::new();
    let slot = model.add_gpu(GpuInfo {
        uuid: "GPU-1".into(),
        name: "H100".into(),
        ..Default::default()
    });
    lock(&slot).groups[Group::Power.index()] = Arc::new(vec![
        Sample::new(Metric::Power, 612.5).with("hw.type", "gpu"),
        Sample::new(Metric::Power, f64::NAN).with("hw.type", "board"),
        Sample::new(Metric::Energy, energy).with("hw.type", "gpu"),
        // Names an identity attribute itself: keeps its value, the GPU's others follow.
        Sample::new(Metric::Power, 40.0)
            .with("hw.type", "memory")
            .with("hw.name", "HBM3"),
    ]);
    model.publish(
        "test",
        "events",
        (0..events)
            .map(|n| {
                Sample::new(Metric::Events, n as f64)
                    .with("event.name", format!("event.{n}.{}", "x".repeat(n % 200)))
            })
            .collect(),
    );
    model
}

type Points = BTreeMap<(String, Vec<(String, String)>), (f64, u64, u64)>;

/// Every point of a request: (name, attributes) → (value, start, time); and per metric
/// (name, unit, description, kind, temporality).
fn decode(bytes: &[u8]) -> (ExportMetricsServiceRequest, Points) {
    let req = ExportMetricsServiceRequest::decode(bytes).expect("a valid request");
    let mut out = Points::new();
    for rm in &req.resource_metrics {
        for sm in &rm.scope_metrics {
            for m in &sm.metrics {
                let points = match &m.data {
                    Some(metric::Data::Gauge(g)) => &g.data_points,
                    Some(metric::Data::Sum(s)) => &s.data_points,
                    other => panic!("{}: {other:?}", m.name),
                };
                for p in points {
                    let attrs = p
                        .attributes
                        .iter()
                        .map(|kv| {
                            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                                Some(any_value::Value::StringValue(s)) => s.clone(),
                                other => panic!("{other:?}"),
                            };
                            (kv.key.clone(), v)
                        })
                        .collect();
                    let Some(number_data_point::Value::AsDouble(v)) = p.value else {
                        panic!("{} without a double", m.name)
                    };
                    let old = out.insert(
                        (m.name.clone(), attrs),
                        (v, p.start_time_unix_nano, p.time_unix_nano),
                    );
                    assert!(old.is_none(), "one point per series");
                }
            }
        }
    }
    (req, out)
}

fn encode(e: &mut Encoder, m: &Model, now: u64) -> (ExportMetricsServiceRequest, Points, usize) {
    let snap = Snapshot::take(m);
    let view = snap.view();
    let (bytes, n) = e.encode(&view, now);
    let (req, points) = decode(bytes);
    (req, points, n)
}

fn attrs(a: &[(&str, &str)]) -> Vec<(String, String)> {
    a.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_request_holds_every_finite_sample_with_its_attributes_names_and_units() {
    let m = model(1000.0, 300);
    let mut e = Encoder::new(envelope(), false, 5);
    let (req, points, n) = encode(&mut e, &m, 7);
    assert_eq!(n, points.len());
    // The resource, the scope and the schema URLs.
    let rm = &req.resource_metrics[0];
    assert_eq!(req.resource_metrics.len(), 1);
    assert_eq!(rm.schema_url, "https://opentelemetry.io/schemas/1.44.0");
    let res = rm.resource.as_ref().expect("resource");
    assert_eq!(res.attributes.len(), 2);
    assert_eq!(res.attributes[1].key, "cluster");
    let sm = &rm.scope_metrics[0];
    assert_eq!(sm.schema_url, rm.schema_url);
    let scope = sm.scope.as_ref().expect("scope");
    assert_eq!(
        (scope.name.as_str(), scope.version.as_str()),
        ("junction", "1.2.3")
    );
    // The GPU's power: hw.id first, its own attribute, then the identity.
    let ident = [
        ("hw.vendor", "nvidia"),
        ("hw.model", "H100"),
        ("hw.name", "H100"),
    ];
    let mut power = vec![("hw.id", "GPU-1"), ("hw.type", "gpu")];
    power.extend(ident);
    // A gauge's point has no start time (OTLP ignores it on gauges).
    assert_eq!(points[&("hw.power".into(), attrs(&power))], (612.5, 0, 7));
    let memory = [
        ("hw.id", "GPU-1"),
        ("hw.type", "memory"),
        ("hw.name", "HBM3"),
        ("hw.vendor", "nvidia"),
        ("hw.model", "H100"),
    ];
    assert_eq!(points[&("hw.power".into(), attrs(&memory))], (40.0, 0, 7));
    // The NaN is left out, as the SDK leaves it out.
    assert!(
        !points
            .keys()
            .any(|(n, a)| n == "hw.power"
                && a.contains(&("hw.type".to_string(), "board".to_string())))
    );
    // Every one of the 300 long-named counters (a metric of more than 16 KiB).
    for k in 0..300 {
        let name = format!("event.{k}.{}", "x".repeat(k % 200));
        assert_eq!(
            points[&("junction.events".into(), attrs(&[("event.name", &name)]))],
            (k as f64, 5, 7)
        );
    }
    // Every metric's name, unit, description and kind from the registry.
    for metric in &sm.metrics {
        let d = REGISTRY
            .iter()
            .find(|d| d.name == metric.name)
            .expect("registered");
        assert_eq!(
            (metric.unit.as_str(), metric.description.as_str()),
            (d.unit, d.help)
        );
        match (&metric.data, d.kind) {
            (Some(metric::Data::Gauge(_)), Kind::Gauge) => {}
            (Some(metric::Data::Sum(s)), Kind::Counter) => {
                assert!(s.is_monotonic);
                assert_eq!(s.aggregation_temporality, 2, "cumulative");
            }
            (Some(metric::Data::Sum(s)), Kind::UpDownCounter) => {
                assert!(!s.is_monotonic);
                assert_eq!(s.aggregation_temporality, 2);
            }
            (data, kind) => panic!("{}: {data:?} for {kind:?}", metric.name),
        }
    }
    // The same series as the Prometheus page (less the NaN).
    let snap = Snapshot::take(&m);
    let mut page = String::new();
    crate::sinks::prometheus::encode::render(&snap.view(), &mut page);
    let lines = page
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty() && !l.ends_with(" NaN"))
        .count();
    assert_eq!(lines, points.len(), "{page}");
    // The buffer is reused: a second export of the same state is the same bytes.
    let first = e.encode(&snap.view(), 7).0.to_vec();
    assert_eq!(e.encode(&snap.view(), 7).0, &first[..]);
    // Written in pieces (as into the gzip compressor), the same bytes in order: the envelope
    // with the first metric's header, then each metric's points, then its end with the next
    // header; the same count.
    let mut pieces: Vec<Vec<u8>> = Vec::new();
    let count = e.encode_to(&snap.view(), 7, &mut |p| pieces.push(p.to_vec()));
    assert_eq!(count, n);
    assert_eq!(pieces.concat(), first);
    assert!(pieces.iter().all(|p| !p.is_empty()));
    assert_eq!(pieces.len(), 2 * sm.metrics.len() + 1);
    // Each metric's points are a piece of their own: a piece that decodes as a `Gauge`'s or
    // a `Sum`'s data points alone.
    let power = REGISTRY
        .iter()
        .position(|d| d.name == "hw.power")
        .expect("registered");
    let at = sm
        .metrics
        .iter()
        .position(|m| m.name == REGISTRY[power].name)
        .expect("exported");
    let gauge = opentelemetry_proto::tonic::metrics::v1::Gauge::decode(&pieces[2 * at + 1][..])
        .expect("data points");
    assert_eq!(gauge.data_points.len(), 2, "GPU power and memory power");
    // Lent whole (as to an uncompressed sender), the same bytes; given back, the buffer is
    // the next request's; given back while the sender still holds it, not.
    let (owned, count) = e.encode_owned(&snap.view(), 7);
    assert_eq!((owned.as_slice(), count), (&first[..], n));
    let lent = bytes::Bytes::from(owned);
    let at = lent.as_ptr();
    e.give_back(lent);
    assert_eq!(e.encode(&snap.view(), 7).0.as_ptr(), at, "the same buffer");
    let lent = bytes::Bytes::from(e.encode_owned(&snap.view(), 7).0);
    let held = lent.clone();
    e.give_back(lent);
    assert_ne!(e.encode(&snap.view(), 7).0.as_ptr(), held.as_ptr());
    assert_eq!(e.encode(&snap.view(), 7).0, &held[..]);
}

#[test]
fn delta_reports_each_counters_increase_and_forgets_series_that_went() {
    let mut e = Encoder::new(envelope(), true, 5);
    let energy = |p: &Points| {
        p.iter()
            .find(|((n, _), _)| n == "hw.energy")
            .map(|(_, v)| *v)
    };
    let (req, p, _) = encode(&mut e, &model(1000.0, 3), 10);
    let sum = req.resource_metrics[0].scope_metrics[0]
        .metrics
        .iter()
        .find_map(|m| match &m.data {
            Some(metric::Data::Sum(s)) if m.name == "hw.energy" => Some(s.clone()),
            _ => None,
        })
        .expect("hw.energy");
    assert_eq!(sum.aggregation_temporality, 1, "delta");
    // The first export: the whole value, from the sink's start.
    assert_eq!(energy(&p), Some((1000.0, 5, 10)));
    // Then the increase since the previous export, from its time.
    let (_, p, _) = encode(&mut e, &model(1250.0, 3), 20);
    assert_eq!(energy(&p), Some((250.0, 10, 20)));
    // Gauges have no start time; up-down counters stay cumulative.
    let (req, p, _) = encode(&mut e, &model(1250.0, 3), 30);
    assert_eq!(energy(&p), Some((0.0, 20, 30)));
    let status = req.resource_metrics[0].scope_metrics[0]
        .metrics
        .iter()
        .find_map(|m| match &m.data {
            Some(metric::Data::Sum(s)) if m.name == "hw.status" => Some(s.clone()),
            _ => None,
        })
        .expect("hw.status");
    assert_eq!(status.aggregation_temporality, 2);
    assert!(
        status
            .data_points
            .iter()
            .all(|d| d.start_time_unix_nano == 5)
    );
    assert!(
        p.iter()
            .all(|((n, _), (_, start, _))| n != "hw.power" || *start == 0)
    );
    // A counter that went back (a driver reload) reports its new value.
    let (req, p, _) = encode(&mut e, &model(40.0, 3), 40);
    assert_eq!(energy(&p), Some((40.0, 30, 40)));
    // What delta keeps is the last export's counters: 3 event counters, the energy, and the
    // model's own.
    let counters = |req: &ExportMetricsServiceRequest| -> usize {
        req.resource_metrics[0].scope_metrics[0]
            .metrics
            .iter()
            .map(|m| match &m.data {
                Some(metric::Data::Sum(s)) if s.is_monotonic => s.data_points.len(),
                _ => 0,
            })
            .sum()
    };
    assert_eq!(e.tracked(), counters(&req));
    let before = e.tracked();
    assert!(before >= 4);
    let (req, p, _) = encode(&mut e, &model(40.0, 1), 50);
    assert_eq!(
        e.tracked(),
        before - 2,
        "the two counters that went are forgotten"
    );
    assert_eq!(counters(&req), e.tracked());
    assert_eq!(
        p[&(
            "junction.events".into(),
            attrs(&[("event.name", "event.0.")])
        )],
        (0.0, 40, 50)
    );
}

/// A node with one GPU (its lifetime and volatile ECC counts) and, where `bmc` is some, a
/// BMC's energy counter of a power supply.
fn lasting_model(ecc: f64, volatile: f64, bmc: Option<f64>) -> Arc<Model> {
    let model = Model::new();
    let slot = model.add_gpu(GpuInfo {
        uuid: "GPU-1".into(),
        ..Default::default()
    });
    lock(&slot).groups[Group::Errors.index()] = Arc::new(vec![
        Sample::new(Metric::EccErrorsLifetime, ecc).with("error.type", "corrected"),
        Sample::new(Metric::EccErrors, volatile)
            .with("hw.type", "gpu")
            .with("error.type", "corrected"),
    ]);
    if let Some(j) = bmc {
        model.publish(
            "redfish",
            "bmc-a",
            vec![
                Sample::new(Metric::BmcEnergy, j)
                    .with("hw.id", "PSU0")
                    .with("hw.type", "power_supply")
                    .with("junction.target", "bmc-a"),
            ],
        );
    }
    model
}

/// Counters that go on across a reboot (a GPU's lifetime ECC count, a BMC's energy): a start
/// that does not go on from a stopped encoder (after a reboot or a crash) takes their last
/// values and reports their increase, where the driver's counters report their whole value;
/// a kept value also covers a gap in the series, and what is kept is bounded.
#[test]
fn counters_that_outlive_a_reboot_go_on_from_their_kept_values() {
    let value = |p: &Points, name: &str| -> (f64, u64, u64) {
        *p.iter()
            .find(|((n, _), _)| n == name)
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("{name}: {p:?}"))
    };
    let mut before = Encoder::new(envelope(), true, 5);
    assert!(before.lasting_changed().is_none(), "nothing yet");
    let (_, p, _) = encode(&mut before, &lasting_model(3.0, 3.0, Some(1000.0)), 10);
    assert_eq!(
        value(&p, "gpu.ecc.errors.lifetime").0,
        3.0,
        "first seen: whole"
    );
    assert_eq!(value(&p, "bmc.energy").0, 1000.0);
    assert_eq!(before.lasting_changed().map(|v| v.len()), Some(2));
    assert!(before.lasting_changed().is_none(), "said once");
    encode(&mut before, &lasting_model(3.0, 3.0, Some(1000.0)), 15);
    assert!(before.lasting_changed().is_none(), "unchanged");
    let (_, p, _) = encode(&mut before, &lasting_model(4.0, 4.0, Some(1100.0)), 20);
    assert_eq!(value(&p, "gpu.ecc.errors.lifetime").0, 1.0);
    let kept = before.lasting_changed().expect("changed");
    assert_eq!(kept.len(), 2, "the volatile count is not kept: {kept:?}");

    // A reboot: the volatile count started again; the lifetime count and the BMC went on.
    let mut after = Encoder::new(envelope(), true, 30);
    assert_eq!(after.prime_lasting(&kept), 2);
    let (_, p, _) = encode(&mut after, &lasting_model(5.0, 1.0, Some(1500.0)), 40);
    assert_eq!(value(&p, "gpu.ecc.errors.lifetime"), (1.0, 30, 40));
    assert_eq!(value(&p, "bmc.energy"), (400.0, 30, 40));
    assert_eq!(
        value(&p, "hw.errors"),
        (1.0, 30, 40),
        "since the boot: whole"
    );

    // The BMC missed a poll: its series went from the export, and on its return reports its
    // increase since its last value, not its whole value.
    let (_, p, _) = encode(&mut after, &lasting_model(5.0, 1.0, None), 50);
    assert!(p.keys().all(|(n, _)| n != "bmc.energy"));
    let (_, p, _) = encode(&mut after, &lasting_model(5.0, 1.0, Some(1600.0)), 60);
    assert_eq!(value(&p, "bmc.energy"), (100.0, 50, 60));
    // A BMC counter that went back (the BMC was reset): its value.
    let (_, p, _) = encode(&mut after, &lasting_model(5.0, 1.0, Some(20.0)), 70);
    assert_eq!(value(&p, "bmc.energy"), (20.0, 60, 70));

    // Cumulative takes none; at most MAX_LASTING are taken or kept.
    let mut cumulative = Encoder::new(envelope(), false, 5);
    assert_eq!(cumulative.prime_lasting(&kept), 0);
    let many: Vec<(u64, f64)> = (0..MAX_LASTING as u64 + 10).map(|h| (h, 1.0)).collect();
    let mut full = Encoder::new(envelope(), true, 5);
    assert_eq!(full.prime_lasting(&many), MAX_LASTING);
    let (_, p, _) = encode(&mut full, &lasting_model(3.0, 3.0, Some(1000.0)), 10);
    assert_eq!(value(&p, "bmc.energy").0, 1000.0);
    assert_eq!(
        full.lasting_changed().map(|v| v.len()),
        None,
        "no room for new series"
    );

    // BMCs' series fill all but the reserve; a GPU's lifetime count still finds a slot.
    let mut crowded = Encoder::new(envelope(), true, 5);
    let bmcs = Model::new();
    bmcs.publish(
        "redfish",
        "bmc-a",
        (0..MAX_LASTING)
            .map(|n| {
                Sample::new(Metric::BmcEnergy, 1.0)
                    .with("hw.id", format!("PSU{n}"))
                    .with("junction.target", "bmc-a")
            })
            .collect(),
    );
    encode(&mut crowded, &bmcs, 10);
    let kept = crowded.lasting_changed().expect("kept").len();
    assert_eq!(kept, MAX_LASTING - LIFETIME_RESERVE);
    encode(&mut crowded, &lasting_model(3.0, 3.0, None), 20);
    assert_eq!(
        crowded.lasting_changed().map(|v| v.len()),
        Some(kept + 1),
        "the lifetime count is kept"
    );
}

#[test]
fn constant_attributes_are_kept_up_to_a_bound_and_written_as_any_other_past_it() {
    // More distinct constant attributes than are kept: each is written the same bytes either
    // way, and the cache stops at its bound.
    let mut statics = Statics::new();
    let values: Vec<&'static str> = (0..MAX_STATIC_ATTRIBUTES + 100)
        .map(|i| &*Box::leak(format!("v{i}").into_boxed_str()))
        .collect();
    for round in 0..2 {
        for v in &values {
            let value: crate::model::AttrValue = std::borrow::Cow::Borrowed(*v);
            let (mut cached, mut plain) = (Vec::new(), Vec::new());
            statics.write(&mut cached, "gpu.nvlink.link", &value);
            key_value(&mut plain, 7, "gpu.nvlink.link", v);
            assert_eq!(cached, plain, "{v}, round {round}");
        }
    }
    assert_eq!(statics.kept(), MAX_STATIC_ATTRIBUTES);
    // An owned value (a UUID, a process name) is never kept.
    let owned: crate::model::AttrValue = String::from("GPU-1").into();
    statics.write(&mut Vec::new(), "hw.id", &owned);
    assert_eq!(statics.kept(), MAX_STATIC_ATTRIBUTES);
}

/// A restart with delta temporality: the new encoder goes on from the stopped one's last
/// export (its time, each counter's value), so the counters' increases add up across it to
/// what the counters rose by, where a fresh encoder reports the whole value again.
#[test]
fn delta_goes_on_across_a_restart_from_the_last_export() {
    let energy = |p: &Points| {
        p.iter()
            .find(|((n, _), _)| n == "hw.energy")
            .map(|(_, v)| *v)
    };
    let mut before = Encoder::new(envelope(), true, 5);
    encode(&mut before, &model(1000.0, 2), 10);
    let (_, p, _) = encode(&mut before, &model(1250.0, 2), 20);
    assert_eq!(energy(&p), Some((250.0, 10, 20)));
    let (last_ns, series) = before.delta_state().expect("delta keeps state");
    assert_eq!(last_ns, 20);
    assert_eq!(series.len(), before.tracked());

    // Without it, the restarted sink's first point is the whole value again.
    let mut fresh = Encoder::new(envelope(), true, 30);
    let (_, p, _) = encode(&mut fresh, &model(1300.0, 2), 40);
    assert_eq!(energy(&p), Some((1300.0, 30, 40)));

    // With it: the increase since the last export, from that export's time; the event
    // counters too; a series the stopped encoder did not have reports its whole value.
    let mut after = Encoder::new(envelope(), true, 30);
    after.resume(last_ns, &series);
    let (_, p, _) = encode(&mut after, &model(1300.0, 3), 40);
    assert_eq!(energy(&p), Some((50.0, 20, 40)));
    let event = |n: &str| p[&("junction.events".into(), attrs(&[("event.name", n)]))];
    assert_eq!(event("event.1.x"), (0.0, 20, 40));
    assert_eq!(event("event.2.xx"), (2.0, 20, 40), "new since the restart");
    // A counter lower than saved (the driver reloaded while the agent was down): its value.
    let mut reloaded = Encoder::new(envelope(), true, 30);
    reloaded.resume(last_ns, &series);
    let (_, p, _) = encode(&mut reloaded, &model(70.0, 2), 40);
    assert_eq!(energy(&p), Some((70.0, 20, 40)));

    // Cumulative keeps nothing and takes nothing; a state from the future is not used.
    let cumulative = Encoder::new(envelope(), false, 5);
    assert!(cumulative.delta_state().is_none());
    let mut early = Encoder::new(envelope(), true, 15);
    early.resume(last_ns, &series);
    let (_, p, _) = encode(&mut early, &model(1300.0, 2), 40);
    assert_eq!(energy(&p), Some((1300.0, 15, 40)));
}

/// Cumulative counters start where they began counting: the hardware's at the boot, those
/// Junction counts itself at the agent's start, those that outlive a boot (the lifetime ECC
/// count, a BMC's energy) with no start time (unknown). Up-down counters start at the sink's
/// start, gauges have none, and with delta every counter point starts at the previous export.
#[test]
fn cumulative_counters_start_where_they_began_counting() {
    let m = lasting_model(17.0, 2.0, Some(1000.0));
    m.publish(
        "test",
        "events",
        vec![
            Sample::new(Metric::Events, 3.0).with("event.name", "e"),
            // Junction's own count of its requests to a BMC: the agent's, not the BMC's.
            Sample::new(Metric::TargetRequests, 9.0).with("junction.target", "bmc-a"),
        ],
    );
    let slot = m.gpus()[0].clone();
    lock(&slot).groups[Group::Power.index()] = Arc::new(vec![
        Sample::new(Metric::Power, 612.5).with("hw.type", "gpu"),
    ]);
    let start_of = |p: &Points, name: &str| -> Vec<u64> {
        p.iter()
            .filter(|((n, _), _)| n == name)
            .map(|(_, (_, start, _))| *start)
            .collect()
    };

    let mut e = Encoder::new(envelope(), false, 50);
    // The boot at 10, the agent's start at 40, the sink's at 50.
    e.set_origins(40, Some(10));
    let (_, p, _) = encode(&mut e, &m, 60);
    assert_eq!(
        start_of(&p, "hw.errors"),
        [10],
        "the driver's count: the boot"
    );
    assert_eq!(start_of(&p, "junction.events"), [40], "the agent's own");
    assert_eq!(
        start_of(&p, "junction.target.requests"),
        [40],
        "the agent's own"
    );
    assert_eq!(
        start_of(&p, "gpu.ecc.errors.lifetime"),
        [0],
        "outlives the boot"
    );
    assert_eq!(
        start_of(&p, "bmc.energy"),
        [0],
        "a BMC's: outlives the boot"
    );
    assert_eq!(start_of(&p, "hw.power"), [0], "a gauge: none");
    assert!(
        start_of(&p, "hw.status").iter().all(|&s| s == 50),
        "up-down counters: the sink's start"
    );
    // An unknown boot time: the agent's start; origins never later than the sink's start.
    let mut e = Encoder::new(envelope(), false, 50);
    e.set_origins(70, None);
    let (_, p, _) = encode(&mut e, &m, 60);
    assert_eq!(start_of(&p, "hw.errors"), [50]);
    assert_eq!(start_of(&p, "junction.events"), [50]);
    // Delta: every counter point starts at the previous export, origins or not.
    let mut e = Encoder::new(envelope(), true, 50);
    e.set_origins(40, Some(10));
    let (_, p, _) = encode(&mut e, &m, 60);
    for name in ["hw.errors", "junction.events", "gpu.ecc.errors.lifetime"] {
        assert_eq!(start_of(&p, name), [50], "{name}");
    }
}

/// Every counter in the registry is one of the hardware's or one Junction counts itself,
/// and its description does not say otherwise.
#[test]
fn every_counter_is_classed_by_who_counts_it() {
    for d in REGISTRY.iter().filter(|d| d.kind == Kind::Counter) {
        let by_agent = counted_by_the_agent(d.name);
        let help = d.help.to_ascii_lowercase();
        if help.contains("since the agent started") {
            assert!(by_agent, "{}: {}", d.name, d.help);
        }
        if help.contains("since the driver") || help.contains("reset at reboot") {
            assert!(!by_agent, "{}: {}", d.name, d.help);
        }
    }
}

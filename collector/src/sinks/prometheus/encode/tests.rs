use super::*;
use crate::model::view::Snapshot;
use crate::model::{GpuInfo, Metric, Model, Sample};

#[test]
fn values_are_written_in_their_shortest_form() {
    let w = |v: f64| {
        let mut s = String::new();
        write_value(&mut s, v);
        s
    };
    assert_eq!(w(3.8e-322), "3.8e-322");
    assert_eq!(w(0.97), "0.97");
    assert_eq!(w(65_498_251_264.0), "65498251264");
    assert_eq!(w(1.5e25), "1.5e25");
    assert_eq!(w(f64::NAN), "NaN");
    assert_eq!(w(-0.0), "0");
    assert_eq!(w(-42.0), "-42");
    assert_eq!(w(-42.5), "-42.5");
    assert_eq!(w(9_007_199_254_740_991.0), "9007199254740991");
    assert_eq!(w(9_007_199_254_740_992.0), "9007199254740992");
    assert_eq!(w(1.8e19), "18000000000000000000");
    assert_eq!(w(1e-4), "0.0001");
    assert_eq!(w(-0.5), "-0.5");
    assert_eq!(w(4_503_599_627_370_495.5), "4503599627370495.5");
    for v in [3.8e-322, 0.1 + 0.2, 1e-7, 123.456] {
        assert_eq!(w(v).parse::<f64>().ok(), Some(v), "round trip of {v}");
    }
}

/// The decimal path (neither whole nor written with an exponent) over many values of
/// every magnitude it takes: each text parses back to its value, is plain decimal
/// notation, and is no longer than `{}`'s shortest digits.
#[test]
fn fractional_values_round_trip_in_plain_decimal() {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut checked = 0;
    for i in 0..200_000u32 {
        // xorshift64: bit patterns of every exponent, and values a GPU reports.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let v = match i % 3 {
            0 => f64::from_bits(x),
            1 => (x % 10_000_000_000) as f64 / 1024.0,
            _ => (x >> 11) as f64 * 1e-12,
        };
        let a = v.abs();
        if !v.is_finite() || !(1e-4..9.007_199_254_740_992e15).contains(&a) || v.fract() == 0.0 {
            continue;
        }
        let mut s = String::new();
        write_value(&mut s, v);
        assert_eq!(s.parse::<f64>().ok(), Some(v), "{s} for {v:e}");
        assert!(
            s.bytes()
                .all(|b| b.is_ascii_digit() || b == b'.' || b == b'-'),
            "{s} for {v:e}"
        );
        assert!(s.len() <= format!("{v}").len(), "{s} for {v:e}");
        checked += 1;
    }
    assert!(checked > 50_000, "{checked} values took the decimal path");
}

#[test]
fn label_keys_are_mapped_and_values_escaped() {
    let mut keys = Keys::default();
    let mut label = |k: &'static str, v: &str| {
        let mut s = String::new();
        let mut first = true;
        write_label(&mut s, &mut first, keys.get(k), v);
        s
    };
    assert_eq!(label("hw.id", "GPU-1"), r#"hw_id="GPU-1""#);
    assert_eq!(label("k8s.pod-name.x", ""), r#"k8s_pod_name_x="""#);
    assert_eq!(label("plain", "plain"), r#"plain="plain""#);
    assert_eq!(
        label("hw.id", "again"),
        r#"hw_id="again""#,
        "a key seen before"
    );
    assert_eq!(label("a", "x\\y\"z\nw\"\""), r#"a="x\\y\"z\nw\"\"""#);
    assert_eq!(label("a", "\"ünï\\cödé\n"), r#"a="\"ünï\\cödé\n""#);
    // Past the short-value scan (32 bytes and more), escapes near both ends.
    let long = format!("\"{}\\{}\n", "a".repeat(40), "b".repeat(40));
    assert_eq!(
        label("a", &long),
        format!(r#"a="\"{}\\{}\n""#, "a".repeat(40), "b".repeat(40))
    );
    let clean = "c".repeat(64);
    assert_eq!(label("a", &clean), format!(r#"a="{clean}""#));
    let mut s = String::from("x");
    let mut first = false;
    write_label(&mut s, &mut first, "b", "1");
    assert_eq!(s, r#"x,b="1""#);
}

/// A constant label's text is `,name="value"`: as any other label is written after
/// another.
#[test]
fn constant_labels_are_written_as_any_other_and_kept_apart() {
    let (mut keys, mut statics) = (Keys::default(), Statics::default());
    for (k, v) in [
        ("gpu.nvlink.link", "3"),
        ("gpu.nvlink.link", "17"),
        ("network.io.direction", "transmit"),
        ("a.b", "q\"uo\\te\n"),
    ] {
        let mut plain = String::from(",");
        write_label(&mut plain, &mut true, keys.get(k), v);
        assert_eq!(statics.get(k, v, &mut keys), Some(plain.as_str()));
        assert_eq!(statics.get(k, v, &mut keys), Some(plain.as_str()), "kept");
    }
    assert_eq!(statics.text.len(), 4);
}

/// More constant labels than the direct-mapped table has slots (so that many share one),
/// past the bound: each found with its own text every time, none kept past the bound.
#[test]
fn many_constant_labels_each_find_their_own_text_up_to_the_bound() {
    let (mut keys, mut statics) = (Keys::default(), Statics::default());
    let values: Vec<&'static str> = (0..MAX_STATIC_LABELS + 100)
        .map(|i| &*Box::leak(format!("v{i}").into_boxed_str()))
        .collect();
    for round in 0..2 {
        for (i, v) in values.iter().enumerate() {
            let k = if i % 2 == 0 {
                "gpu.nvlink.link"
            } else {
                "hw.type"
            };
            let got = statics.get(k, v, &mut keys).map(str::to_string);
            if i < MAX_STATIC_LABELS {
                let mut plain = String::from(",");
                write_label(&mut plain, &mut true, keys.get(k), v);
                assert_eq!(got, Some(plain), "round {round}, {i}");
            } else {
                assert_eq!(got, None, "round {round}, {i}: past the bound");
            }
        }
    }
    assert_eq!(statics.text.len(), MAX_STATIC_LABELS);
    assert_eq!(statics.index.len(), MAX_STATIC_LABELS);
}

#[test]
fn renders_families_with_hw_id_and_escaped_labels() {
    let model = Model::new();
    let slot = model.add_gpu(GpuInfo {
        uuid: "GPU-1".into(),
        name: "A \"quoted\" GPU".into(),
        ..Default::default()
    });
    crate::model::lock(&slot).groups[crate::model::Group::Power.index()] =
        std::sync::Arc::new(vec![
            Sample::new(Metric::Power, 612.5).with("hw.type", "gpu"),
        ]);
    let snap = Snapshot::of(
        model.snapshot(),
        None,
        &[("nvml", true)],
        vec![std::sync::Arc::new(vec![Sample::new(
            Metric::KmsgLost,
            3.0,
        )])],
        &Default::default(),
    );
    let mut out = String::new();
    render(&snap.view(), &mut out);
    // A node series without labels: no braces.
    assert!(out.contains("\njunction_kmsg_lost_total 3\n"), "{out}");
    assert!(!out.contains("{}"), "{out}");
    // The GPU's identity on its series of the conventions (the empty ones left out).
    let ident =
        "hw_vendor=\"nvidia\",hw_model=\"A \\\"quoted\\\" GPU\",hw_name=\"A \\\"quoted\\\" GPU\"";
    assert!(
            out.contains(&format!(
                "# TYPE hw_power_watts gauge\nhw_power_watts{{hw_id=\"GPU-1\",hw_type=\"gpu\",{ident}}} 612.5\n"
            )),
            "{out}"
        );
    assert!(
        out.contains(&format!(
            "hw_status{{hw_id=\"GPU-1\",hw_type=\"gpu\",hw_state=\"ok\",{ident}}} 1\n"
        )),
        "{out}"
    );
    assert!(
        out.contains("junction_source_up{junction_source=\"nvml\"} 1\n"),
        "{out}"
    );
}

/// The render, put together from texts made once with their separators, writes what a
/// plain render that writes every label of every series writes: series of a GPU with none,
/// one and two constant labels, with a `hw.id` of their own, naming an identity attribute
/// themselves, with values made at run time (escaped); the node's series with labels and
/// without; two GPUs, one whose identity has characters to escape.
#[test]
fn the_render_writes_what_a_plain_render_writes() {
    use std::sync::Arc;
    fn plain(view: &View<'_>, out: &mut String) {
        let names = prometheus_names();
        let mut keys = Keys::default();
        for (i, samples) in view.iter() {
            out.push_str(&names[i].1);
            for (id, s) in samples {
                out.push_str(&names[i].0);
                let mut all: Vec<(&'static str, String)> = Vec::new();
                if !id.is_empty() && s.attr("hw.id").is_none() {
                    all.push(("hw.id", id.to_string()));
                }
                all.extend(s.attrs.iter().map(|(k, v)| (*k, v.to_string())));
                for (k, v) in view.extra(i, id, s) {
                    if s.attr(k).is_none() {
                        all.push((k, v.to_string()));
                    }
                }
                if all.is_empty() {
                    out.push(' ');
                } else {
                    out.push('{');
                    let mut first = true;
                    for (k, v) in &all {
                        write_label(out, &mut first, keys.get(k), v);
                    }
                    out.push_str("} ");
                }
                write_value(out, s.value);
                out.push('\n');
            }
        }
    }
    let model = Model::new();
    for (id, name) in [("GPU-1", "H100"), ("GPU-2", "A \"q\\uoted\"\nGPU")] {
        let slot = model.add_gpu(GpuInfo {
            uuid: id.into(),
            name: name.into(),
            serial: Some(format!("S-{id}")),
            ..Default::default()
        });
        crate::model::lock(&slot).groups[crate::model::Group::Power.index()] = Arc::new(vec![
            Sample::new(Metric::Power, 612.5).with("hw.type", "gpu"),
            Sample::new(Metric::Power, 40.0)
                .with("hw.type", "memory")
                .with("hw.name", "HBM3"),
            Sample::new(Metric::FanSpeed, 0.5)
                .with("hw.id", format!("{id}/fan0"))
                .with("hw.type", "fan"),
            Sample::new(Metric::NvlinkErrors, 3.0)
                .with("gpu.nvlink.link", "7")
                .with("gpu.nvlink.error.type", "replay"),
            Sample::new(Metric::ClockFrequency, 1980.0),
            Sample::new(Metric::ProcessMemory, 1e9)
                .with("process.pid", format!("{}", id.len()))
                .with("process.executable.name", "p\"y\\t\nhon".to_string()),
        ]);
    }
    let node = vec![Arc::new(vec![
        Sample::new(Metric::KmsgLost, 3.0),
        Sample::new(Metric::SinkExports, 2.0).with("junction.sink", "otlp"),
        Sample::new(Metric::SinkExports, 1.0).with("junction.sink", "a\"b".to_string()),
    ])];
    let snap = Snapshot::of(
        model.snapshot(),
        None,
        &[("nvml", true)],
        node,
        &Default::default(),
    );
    let view = snap.view();
    let (mut got, mut want) = (String::new(), String::new());
    render(&view, &mut got);
    plain(&view, &mut want);
    assert_eq!(got, want);
    for needle in [
        "hw_power_watts{hw_id=\"GPU-2\",hw_type=\"gpu\",hw_vendor=\"nvidia\"",
        "hw_fan_speed_ratio{hw_id=\"GPU-1/fan0\",hw_type=\"fan\"} 0.5\n",
        "\njunction_kmsg_lost_total 3\n",
        "junction_sink_exports_total{junction_sink=\"a\\\"b\"} 1\n",
    ] {
        assert!(got.contains(needle), "{needle} in {got}");
    }
}

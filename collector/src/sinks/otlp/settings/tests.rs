use super::*;

fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |k| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    }
}

fn file(f: impl FnOnce(&mut OtlpConfig)) -> OtlpConfig {
    let mut c = OtlpConfig::default();
    f(&mut c);
    c
}

/// Any text after a `%` decodes without a panic (a byte index inside a multi-byte
/// character panicked before).
#[test]
fn percent_decoding_takes_any_text() {
    assert_eq!(percent_decode("a%41%42c"), "aABc");
    for s in ["%é", "%%", "%4", "%", "x%e9%", "%€€", "%4é", "é%41"] {
        let _ = percent_decode(s);
    }
    assert_eq!(percent_decode("é%41"), "éA");
    assert_eq!(percent_decode("%4é"), "%4é");
}

#[test]
fn defaults_without_file_or_environment() {
    let s = resolve(&OtlpConfig::default(), &env(&[])).expect("ok");
    assert_eq!(s.metrics.endpoint, "http://localhost:4317");
    assert_eq!(s.metrics.protocol, Protocol::Grpc);
    assert!(s.metrics.gzip);
    assert_eq!(s.metrics.timeout, Duration::from_secs(10));
    assert_eq!(s.interval, Duration::from_secs(15));
    assert!(!s.delta);
    assert_eq!(s.service_name, "junction");
}

#[test]
fn the_file_wins_over_the_environment_for_the_endpoint() {
    let e = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4317")]);
    let s = resolve(&file(|c| c.endpoint = "http://file:4317".into()), &e).expect("ok");
    assert_eq!(s.metrics.endpoint, "http://file:4317");
    let s = resolve(&OtlpConfig::default(), &e).expect("ok");
    assert_eq!(s.logs.endpoint, "http://env:4317");
}

#[test]
fn http_paths_are_appended_to_base_urls_but_not_to_signal_urls() {
    let e = env(&[
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
        (
            "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
            "http://logs:9000/ingest",
        ),
    ]);
    let s = resolve(&OtlpConfig::default(), &e).expect("ok");
    assert_eq!(s.metrics.endpoint, "http://collector:4318/v1/metrics");
    assert_eq!(s.logs.endpoint, "http://logs:9000/ingest");
    let s = resolve(&file(|c| c.endpoint = "http://file:4318".into()), &e).expect("ok");
    assert_eq!(
        s.logs.endpoint, "http://file:4318/v1/logs",
        "the file's base wins"
    );
}

#[test]
fn the_file_wins_over_the_environment_for_protocol_compression_timeout_interval() {
    let e = env(&[
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "30000"),
        ("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "Delta"),
    ]);
    let s = resolve(&OtlpConfig::default(), &e).expect("ok");
    assert_eq!(s.metrics.protocol, Protocol::HttpProtobuf);
    assert!(!s.metrics.gzip);
    assert_eq!(s.metrics.timeout, Duration::from_millis(2500));
    assert_eq!(s.interval, Duration::from_secs(30));
    assert!(s.delta);
    let c = file(|c| {
        c.protocol = "grpc".into();
        c.compression = "gzip".into();
        c.timeout_ms = 700;
        c.interval_secs = 5;
        c.temporality = "cumulative".into();
    });
    let s = resolve(&c, &e).expect("ok");
    assert_eq!(s.metrics.protocol, Protocol::Grpc);
    assert!(s.metrics.gzip);
    assert_eq!(s.metrics.timeout, Duration::from_millis(700));
    assert_eq!(s.interval, Duration::from_secs(5));
    assert!(!s.delta);
}

#[test]
fn signal_specific_variables_win_over_general_ones() {
    let e = env(&[
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "900"),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "authorization=Bearer%20general,x-a=1",
        ),
        (
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
            "authorization=Bearer metrics",
        ),
    ]);
    let s = resolve(&OtlpConfig::default(), &e).expect("ok");
    assert_eq!(s.logs.timeout, Duration::from_millis(900));
    assert_eq!(s.metrics.timeout, Duration::from_millis(2500));
    assert_eq!(s.metrics.headers["authorization"], "Bearer metrics");
    assert_eq!(s.logs.headers["authorization"], "Bearer general");
    assert_eq!(s.logs.headers["x-a"], "1");
}

#[test]
fn file_headers_and_attributes_win_key_by_key() {
    let e = env(&[
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "authorization=env,x-tenant=env",
        ),
        ("OTEL_RESOURCE_ATTRIBUTES", "cluster=env,region=eu"),
        ("OTEL_SERVICE_NAME", "from-env"),
    ]);
    let c = file(|c| {
        c.headers.0.insert("authorization".into(), "file".into());
        c.resource_attributes
            .0
            .insert("cluster".into(), "prod-a".into());
    });
    let s = resolve(&c, &e).expect("ok");
    assert_eq!(s.metrics.headers["authorization"], "file");
    assert_eq!(s.metrics.headers["x-tenant"], "env");
    assert_eq!(s.resource_attributes["cluster"], "prod-a");
    assert_eq!(s.resource_attributes["region"], "eu");
    assert_eq!(s.service_name, "from-env");
    let s = resolve(&file(|c| c.service_name = "file-name".into()), &e).expect("ok");
    assert_eq!(s.service_name, "file-name");
}

#[test]
fn bad_environment_values_name_the_variable() {
    let e = resolve(
        &OtlpConfig::default(),
        &env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]),
    )
    .expect_err("rejected");
    assert_eq!(e.variable, "OTEL_EXPORTER_OTLP_PROTOCOL");
    let e = resolve(
        &OtlpConfig::default(),
        &env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317")]),
    )
    .expect_err("rejected");
    assert_eq!(e.variable, "OTEL_EXPORTER_OTLP_ENDPOINT");
    let e = resolve(
        &OtlpConfig::default(),
        &env(&[("OTEL_EXPORTER_OTLP_HEADERS", "secret-without-equals")]),
    )
    .expect_err("rejected");
    assert_eq!(e.variable, "OTEL_EXPORTER_OTLP_HEADERS");
    assert!(
        !e.to_string().contains("secret"),
        "header values are not echoed: {e}"
    );
}

#[test]
fn pairs_are_percent_decoded() {
    assert_eq!(
        parse_pairs("a=b%20c, d = e ").expect("pairs"),
        vec![("a".into(), "b c".into()), ("d".into(), "e".into())]
    );
}

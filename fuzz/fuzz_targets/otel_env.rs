//! `OTEL_*` variables: each line of the input is `NAME=value`.
#![no_main]

use std::collections::HashMap;

use junction::sinks::otlp::OtlpConfig;
use junction::sinks::otlp::settings::{parse_pairs, resolve};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let vars: HashMap<String, String> = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            (
                format!("OTEL_{}", k.trim_start_matches("OTEL_")),
                v.to_string(),
            )
        })
        .collect();
    for v in vars.values() {
        let _ = parse_pairs(v);
    }
    let config = OtlpConfig {
        enabled: true,
        ..OtlpConfig::default()
    };
    let _ = resolve(&config, &|k| vars.get(k).cloned());
});

//! The OTLP resource: who is reporting. `service.name`, `service.version`, `host.name`,
//! `host.id` (the machine id), `k8s.node.name` when the downward API sets `K8S_NODE_NAME`,
//! and the attributes the user adds (`OTEL_RESOURCE_ATTRIBUTES`, then the config file).

use std::path::Path;

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;

use super::settings::Settings;

/// The semantic conventions Junction's names follow (`hw.*` from `model/hardware/` of this
/// version), on the resource and on each scope, so that a backend can translate names when
/// the conventions move.
pub const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.44.0";

/// The environment variable a Kubernetes DaemonSet sets from `spec.nodeName`.
pub const NODE_NAME_ENV: &str = "K8S_NODE_NAME";

/// Builds the resource (the event log records').
pub fn build(s: &Settings) -> Resource {
    Resource::builder_empty()
        .with_schema_url(
            attributes(s).into_iter().map(|(k, v)| KeyValue::new(k, v)),
            SCHEMA_URL,
        )
        .build()
}

/// The resource's attributes, in order.
pub fn attributes(s: &Settings) -> Vec<(String, String)> {
    let mut attrs: Vec<(String, String)> = vec![
        ("service.name".into(), s.service_name.clone()),
        ("service.version".into(), env!("CARGO_PKG_VERSION").into()),
    ];
    // The UTS name this process sees: the host's with hostNetwork (as the DaemonSet runs).
    if let Some(h) = read_trimmed(Path::new("/proc/sys/kernel/hostname"))
        .or_else(|| read_trimmed(Path::new("/etc/hostname")))
    {
        attrs.push(("host.name".into(), h));
    }
    // The machine id: a container sees the host's when /etc/machine-id is mounted from it.
    if let Some(id) = read_trimmed(Path::new("/etc/machine-id"))
        .or_else(|| read_trimmed(Path::new("/var/lib/dbus/machine-id")))
    {
        attrs.push(("host.id".into(), id));
    }
    if let Some(node) = std::env::var(NODE_NAME_ENV).ok().filter(|v| !v.is_empty()) {
        attrs.push(("k8s.node.name".into(), node));
    }
    for (k, v) in &s.resource_attributes {
        attrs.retain(|(a, _)| a != k);
        attrs.push((k.clone(), v.clone()));
    }
    attrs
}

fn read_trimmed(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

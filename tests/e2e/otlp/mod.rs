//! The OTLP sink against an OTLP receiver in the test (tonic gRPC services and an HTTP/protobuf
//! handler): the registry's metrics over both protocols, agreeing with `/metrics`
//! (`metrics.rs`); events as log records, delivered exactly once across outages, and a
//! receiver that is down, slow, UNAVAILABLE or rejecting, TLS and headers (`delivery.rs`);
//! delta temporality across restarts, crashes and a reboot (`delta.rs`); here, the precedence
//! of the config file over `OTEL_*`.

mod delivery;
mod delta;
mod metrics;

use std::time::Duration;

use crate::support::otlp::{Receiver, attr};
use crate::support::{self, Agent};

/// A config for the simulator with the OTLP sink pointed at `endpoint`.
fn config(port: u16, otlp: &str) -> String {
    format!(
        "{}\n[sinks.otlp]\nenabled = true\ninterval_secs = 1\n{otlp}\n",
        support::sim_config("current", port, "lost_retry_max_secs = 1")
    )
}

fn start_agent(scenario: &str, otlp: &str) -> Agent {
    Agent::spawn_config(scenario, &config(support::free_port(), otlp))
}

/// The config file wins over `OTEL_EXPORTER_OTLP_ENDPOINT`; without it, the environment
/// applies.
#[test]
fn the_config_file_wins_over_the_environment() {
    let from_env = Receiver::start();
    let from_file = Receiver::start();
    let port = support::free_port();
    let env_url = from_env.http_url();
    let mut agent = Agent::spawn_config_env(
        "h100-training.toml",
        &config(
            port,
            &format!(
                "endpoint = {:?}\nprotocol = \"http/protobuf\"\n",
                from_file.http_url()
            ),
        ),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", env_url.as_str()),
            ("OTEL_SERVICE_NAME", "from-env"),
        ],
    );
    from_file.wait_for(
        Duration::from_secs(20),
        "metrics at the file's endpoint",
        |r| !r.metrics.is_empty(),
    );
    assert_eq!(from_env.with(|r| r.requests), 0);
    let res = from_file.with(|r| {
        r.metrics[0].resource_metrics[0]
            .resource
            .clone()
            .expect("resource")
    });
    assert_eq!(
        attr(&res.attributes, "service.name"),
        Some("from-env"),
        "the file left it unset"
    );
    assert!(agent.terminate().success());

    let port = support::free_port();
    let mut agent = Agent::spawn_config_env(
        "h100-training.toml",
        &config(port, "protocol = \"http/protobuf\"\n"),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", env_url.as_str()),
            ("K8S_NODE_NAME", "gpu-node-17"),
        ],
    );
    from_env.wait_for(
        Duration::from_secs(20),
        "metrics at the environment's endpoint",
        |r| !r.metrics.is_empty(),
    );
    let res = from_env.with(|r| {
        r.metrics[0].resource_metrics[0]
            .resource
            .clone()
            .expect("resource")
    });
    assert_eq!(
        attr(&res.attributes, "k8s.node.name"),
        Some("gpu-node-17"),
        "from the downward API"
    );
    assert!(agent.terminate().success());
}

/// First contact: an endpoint (in the file, or `OTEL_EXPORTER_OTLP_ENDPOINT` as an SDK user
/// would set it) without `enabled = true` pushes nothing, and the agent says so at start,
/// naming the key to set; with `enabled = true` the same receiver gets metrics.
#[test]
fn an_endpoint_without_enabled_says_at_start_that_nothing_is_pushed() {
    let rx = Receiver::start();
    let base = |port| support::sim_config("current", port, "");
    let file = format!(
        "{}\n[sinks.otlp]\ninterval_secs = 1\nendpoint = {:?}\n",
        base(support::free_port()),
        rx.grpc_url()
    );
    let env_only = base(support::free_port());
    let said = |agent: &mut Agent, what: &str| {
        agent.wait_for(Duration::from_secs(30), |m| {
            m.contains("hw_gpu_memory_usage_bytes")
        });
        let log = agent.log();
        let line = log
            .lines()
            .find(|l| l.contains("WARN") && l.contains("nothing is pushed over OTLP"))
            .unwrap_or_else(|| panic!("no warning at start:\n{log}"));
        assert!(line.contains(what), "{line}");
        assert!(line.contains("enabled = true"), "names the fix: {line}");
    };
    let mut a = Agent::spawn_config("h100-training.toml", &file);
    said(&mut a, "[sinks.otlp] sets endpoint");
    let url = rx.grpc_url();
    let mut b = Agent::spawn_config_env(
        "h100-training.toml",
        &env_only,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str())],
    );
    said(&mut b, "OTEL_EXPORTER_OTLP_ENDPOINT=");
    // Both ran a few export intervals' worth: nothing arrived.
    std::thread::sleep(Duration::from_secs(3));
    assert!(rx.with(|r| r.metrics.is_empty() && r.logs.is_empty()));
    assert!(a.terminate().success() && b.terminate().success());
    // Turned on, the same receiver gets metrics: the silence above was the switch.
    let mut c = Agent::spawn_config(
        "h100-training.toml",
        &file.replace("[sinks.otlp]\n", "[sinks.otlp]\nenabled = true\n"),
    );
    rx.wait_for(Duration::from_secs(30), "metrics once enabled", |r| {
        !r.metrics.is_empty()
    });
    assert!(!c.log().contains("nothing is pushed over OTLP"));
    assert!(c.terminate().success());
}

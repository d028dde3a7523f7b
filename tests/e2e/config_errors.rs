//! Bad configuration: exit code 2 and a message naming file, line and key.

use crate::support;

fn check(config: &str, expect: &[&str]) {
    let dir = support::temp_dir();
    let path = dir.join("bad.toml");
    std::fs::write(&path, config).expect("write");
    for cmd in ["validate", "run"] {
        let out = support::output(support::junction().arg("--config").arg(&path).arg(cmd));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{cmd}: exit code; stderr:\n{err}"
        );
        for e in expect {
            let e = e.replace("FILE", &path.display().to_string());
            assert!(err.contains(&e), "{cmd}: expected {e:?} in:\n{err}");
        }
    }
}

#[test]
fn unknown_key() {
    check(
        "[sources.nvml]\nenabled = true\nlibary = \"x\"\n",
        &["FILE:3:1: key `sources.nvml.libary`: unknown field `libary`"],
    );
}

#[test]
fn wrong_type() {
    check(
        "[sources.nvml.groups.power]\ninterval_secs = \"fast\"\n",
        &[
            "FILE:2:17: key `sources.nvml.groups.power.interval_secs`: invalid type: string \"fast\"",
        ],
    );
}

#[test]
fn bad_listen_address() {
    check(
        "[sinks.prometheus]\nlisten = \"localhost\"\n",
        &["FILE:2:1: key `sinks.prometheus.listen`: \"localhost\" is not a socket address"],
    );
}

#[test]
fn missing_library_path() {
    check(
        "[sources.nvml]\nlibrary = \"/nonexistent/libnvidia-ml.so.1\"\n",
        &[
            "FILE:2:1: key `sources.nvml.library`: \"/nonexistent/libnvidia-ml.so.1\" does not exist",
        ],
    );
}

/// Several problems at once are all reported.
#[test]
fn every_problem_at_once() {
    check(
        "[sources.nvml]\nbogus = 1\nlibrary = \"/nonexistent/lib.so\"\n[sinks.prometheus]\nlisten = 5\n",
        &[
            "FILE:2:1: key `sources.nvml.bogus`",
            "FILE:5:10: key `sinks.prometheus.listen`: invalid type",
            "FILE:3:1: key `sources.nvml.library`",
        ],
    );
}

#[test]
fn valid_config_validates() {
    let out = support::output(
        support::junction()
            .arg("--config")
            .arg(support::root().join("config/junction.toml"))
            .arg("validate"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `[sinks.otlp]` is checked like the rest: a bad URL, protocol or file names its key.
#[test]
fn bad_otlp_settings() {
    check(
        "[sinks.otlp]\nenabled = true\nendpoint = \"collector:4317\"\nprotocol = \"http/json\"\nca_file = \"/nonexistent/ca.pem\"\n",
        &[
            "FILE:3:1: key `sinks.otlp.endpoint`: \"collector:4317\" is not an http:// or https:// URL",
            "FILE:4:1: key `sinks.otlp.protocol`: \"http/json\": use \"grpc\" or \"http/protobuf\"",
            "FILE:5:1: key `sinks.otlp.ca_file`",
        ],
    );
}

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

/// Redfish and IPMI targets are checked alike, and every problem in an array of tables names
/// the element and its line.
#[test]
fn bad_bmc_targets() {
    check(
        "[[sources.redfish.targets]]\nname = \"cdu\"\nurl = \"10.0.0.17\"\ntimeout_secs = 0\n\
         [[sources.redfish.targets]]\nname = \"cdu\"\nurl = \"https://10.0.0.18\"\npassword_file = \"/nonexistent/pw\"\n\
         [[sources.ipmi.targets]]\nhost = \"10.0.0.19\"\nprivilege = \"root\"\ninterval_secs = 0\n\
         [[sources.ipmi.targets]]\nhost = \"10.0.0.19\"\npassword_file = \"/nonexistent/pw\"\nintervl_secs = 5\n\
         [[sources.ipmi.targets]]\nhost = \"10.0.0.20\"\ntimeout_secs = \"5s\"\n",
        &[
            "FILE:3:1: key `sources.redfish.targets[0].url`: \"10.0.0.17\" is not an http(s) URL",
            "FILE:4:1: key `sources.redfish.targets[0].timeout_secs`: must be at least 1",
            "FILE:8:1: key `sources.redfish.targets[1].password_file`: \"/nonexistent/pw\" is not a readable file",
            "FILE:6:1: key `sources.redfish.targets[1].name`: two targets are named \"cdu\"",
            "FILE:11:1: key `sources.ipmi.targets[0].privilege`: \"root\": use \"user\", \"operator\" or \"admin\"",
            "FILE:12:1: key `sources.ipmi.targets[0].interval_secs`: must be at least 1",
            "FILE:16:1: key `sources.ipmi.targets[1].intervl_secs`: unknown field `intervl_secs`",
            "FILE:19:16: key `sources.ipmi.targets[2].timeout_secs`: invalid type: string \"5s\"",
        ],
    );
}

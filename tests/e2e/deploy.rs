//! Deployment files: the Kubernetes manifests (parsed, cross-checked, their Junction config
//! validated by the real binary), the systemd unit (`systemd-analyze verify`), and
//! `junction healthcheck` (what the image's HEALTHCHECK runs).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use yaml_rust2::{Yaml, YamlLoader};

use crate::support::{self, Agent};

fn k8s_dir() -> PathBuf {
    support::root().join("config/kubernetes")
}

fn load(name: &str) -> Yaml {
    let path = k8s_dir().join(name);
    let text = std::fs::read_to_string(&path).expect("read manifest");
    let mut docs =
        YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(docs.len(), 1, "{name}: one object per file");
    docs.remove(0)
}

fn s<'a>(y: &'a Yaml, what: &str) -> &'a str {
    y.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {y:?}"))
}

/// The capabilities the DaemonSet adds (`capabilities.add`), as `CAP_…` names.
pub(crate) fn daemonset_capabilities() -> Vec<String> {
    let ds = load("daemonset.yaml");
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    c["securityContext"]["capabilities"]["add"]
        .as_vec()
        .expect("capabilities.add")
        .iter()
        .map(|c| format!("CAP_{}", s(c, "a capability")))
        .collect()
}

#[test]
fn kubernetes_manifests_hang_together() {
    // kustomization lists every manifest in the folder, and only those.
    let k = load("kustomization.yaml");
    let mut listed: Vec<String> = k["resources"]
        .as_vec()
        .expect("resources")
        .iter()
        .map(|r| s(r, "resource").to_string())
        .collect();
    listed.sort();
    let mut present: Vec<String> = std::fs::read_dir(k8s_dir())
        .expect("dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    present.sort();
    assert_eq!(listed, present);
    for f in &present {
        let y = load(f);
        assert!(
            y["apiVersion"].as_str().is_some() && y["kind"].as_str().is_some(),
            "{f}"
        );
        if s(&y["kind"], "kind") != "Namespace" {
            assert_eq!(y["metadata"]["namespace"].as_str(), Some("junction"), "{f}");
        }
    }

    let ds = load("daemonset.yaml");
    assert_eq!(s(&ds["kind"], "kind"), "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    assert_eq!(ds["spec"]["selector"]["matchLabels"], *labels);
    assert_eq!(
        pod["hostPID"].as_bool(),
        Some(true),
        "host pids: NVML and BPF report them"
    );
    assert_eq!(pod["runtimeClassName"].as_str(), Some("nvidia"));
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));
    assert!(pod["nodeSelector"].as_hash().is_some_and(|h| !h.is_empty()));
    assert!(pod["tolerations"].as_vec().is_some_and(|t| !t.is_empty()));
    let sa = load("serviceaccount.yaml");
    assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);

    let c = &pod["containers"][0];
    // Every mount has its volume, and the mounts Junction needs are there.
    let volumes: Vec<&str> = pod["volumes"]
        .as_vec()
        .expect("volumes")
        .iter()
        .map(|v| s(&v["name"], "volume name"))
        .collect();
    let mounts: Vec<(&str, &str)> = c["volumeMounts"]
        .as_vec()
        .expect("volumeMounts")
        .iter()
        .map(|m| (s(&m["name"], "mount name"), s(&m["mountPath"], "mountPath")))
        .collect();
    for (name, _) in &mounts {
        assert!(volumes.contains(name), "mount {name} has no volume");
    }
    for path in [
        "/dev/kmsg",
        "/sys/kernel/btf",
        "/sys/kernel/tracing",
        "/var/lib/junction",
        "/var/lib/kubelet/pod-resources",
        "/var/log/pods",
        "/etc/junction",
        "/var/lib/systemd/pstore",
        "/var/crash",
    ] {
        assert!(
            mounts.iter().any(|(_, p)| *p == path),
            "{path} is not mounted"
        );
    }

    // Least privilege: not privileged, exactly these capabilities, each explained in the
    // header, seccomp unconfined (the default profiles gate bpf() on CAP_SYS_ADMIN).
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"].as_bool(), Some(false));
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(sc["seccompProfile"]["type"].as_str(), Some("Unconfined"));
    assert_eq!(sc["capabilities"]["drop"][0].as_str(), Some("ALL"));
    let caps = daemonset_capabilities();
    assert_eq!(
        caps,
        [
            "CAP_BPF",
            "CAP_PERFMON",
            "CAP_SYSLOG",
            "CAP_SYS_PTRACE",
            "CAP_DAC_READ_SEARCH"
        ]
    );
    let header = std::fs::read_to_string(k8s_dir().join("daemonset.yaml")).expect("read");
    for cap in &caps {
        let bare = cap.trim_start_matches("CAP_");
        assert!(
            header
                .lines()
                .take_while(|l| l.starts_with('#'))
                .any(|l| l.split_whitespace().any(|w| w.trim_matches(',') == bare)),
            "{cap} is not explained in the header"
        );
    }

    // Probes and ports agree with the config's listen address; resources are set.
    let port = c["ports"][0]["containerPort"]
        .as_i64()
        .expect("containerPort");
    assert_eq!(
        c["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/healthz")
    );
    assert_eq!(
        c["readinessProbe"]["httpGet"]["port"],
        c["ports"][0]["name"]
    );
    // Liveness on the metrics port (a BMC that is down is no reason to restart the pod).
    assert_eq!(
        c["livenessProbe"]["tcpSocket"]["port"], c["ports"][0]["name"],
        "liveness on the TCP port"
    );
    assert!(c["resources"]["requests"]["memory"].as_str().is_some());
    assert!(c["resources"]["limits"]["memory"].as_str().is_some());
    // OTLP through the standard variables; the node name from the downward API.
    let env = c["env"].as_vec().expect("env");
    let var = |n: &str| env.iter().find(|e| e["name"].as_str() == Some(n));
    assert!(var("OTEL_EXPORTER_OTLP_ENDPOINT").is_some());
    assert_eq!(
        var("K8S_NODE_NAME").expect("K8S_NODE_NAME")["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        Some("spec.nodeName")
    );
    let config_path = s(
        &var("JUNCTION_CONFIG").expect("JUNCTION_CONFIG")["value"],
        "path",
    );
    assert!(config_path.starts_with("/etc/junction/"));

    // Service and PodMonitor select the pods and name the container's port.
    let svc = load("service.yaml");
    assert_eq!(svc["spec"]["selector"], *labels);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], c["ports"][0]["name"]);
    let pm = load("podmonitor.yaml");
    assert_eq!(pm["spec"]["selector"]["matchLabels"], *labels);
    assert_eq!(
        pm["spec"]["podMetricsEndpoints"][0]["port"],
        c["ports"][0]["name"]
    );

    // The ConfigMap's junction.toml is valid for the real binary and listens on that port.
    let cm = load("configmap.yaml");
    let toml = s(&cm["data"]["junction.toml"], "junction.toml");
    assert!(toml.contains(&format!(":{port}\"")), "listen port {port}");
    let file = support::temp_dir().join("junction.toml");
    std::fs::write(&file, toml).expect("write");
    let out = support::output(
        support::junction()
            .arg("--config")
            .arg(&file)
            .arg("validate"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_systemd_unit_verifies() {
    let Some(analyze) = support::require_tool("systemd-analyze", None) else {
        return;
    };
    let unit = support::root().join("config/systemd/junction.service");
    let text = std::fs::read_to_string(&unit).expect("unit");
    // verify checks that ExecStart's program exists: point it at the built binary.
    let dir = support::temp_dir();
    let copy = dir.join("junction.service");
    std::fs::write(
        &copy,
        text.replace("/usr/local/bin/junction", env!("CARGO_BIN_EXE_junction")),
    )
    .expect("write");
    let out = support::output(Command::new(analyze).arg("verify").arg(&copy));
    let err = String::from_utf8_lossy(&out.stderr);
    // Unknown or misspelt settings are warnings that name the file, with status 0.
    let about_ours: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("junction.service"))
        .collect();
    assert!(
        out.status.success() && about_ours.is_empty(),
        "{}\n{err}",
        out.status
    );
    // The capability bounding set is the one the unit explains.
    let bounding = text
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("CapabilityBoundingSet");
    for cap in bounding.split_whitespace() {
        assert!(
            text.lines().any(|l| l.starts_with('#') && l.contains(cap)),
            "{cap} is not explained"
        );
    }
    assert!(text.contains("NoNewPrivileges=yes"));
    assert!(text.contains("StateDirectory=junction"));
    assert!(
        !text.contains("ProtectKernelLogs=yes"),
        "it would hide /dev/kmsg"
    );
    // A misspelt setting is caught (the check can fail).
    let bad = dir.join("bad.service");
    std::fs::write(
        &bad,
        std::fs::read_to_string(&copy)
            .expect("copy")
            .replace("NoNewPrivileges=yes", "NoNewPrivilegez=yes"),
    )
    .expect("write");
    let out = support::output(
        Command::new(support::require_tool("systemd-analyze", None).expect("tool"))
            .arg("verify")
            .arg(&bad),
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("NoNewPrivilegez"));
}

#[test]
fn healthcheck_says_ok_names_the_sources_down_and_fails_without_an_agent() {
    let mut agent = Agent::start("h100-training.toml", "current");
    let _ = agent.wait_for(Duration::from_secs(10), |m| m.contains("gpu_info"));
    let ok = support::output(
        support::junction()
            .arg("--config")
            .arg(&agent.config)
            .arg("healthcheck"),
    );
    assert!(ok.status.success(), "{:?}", ok);
    assert_eq!(String::from_utf8_lossy(&ok.stdout), "ok\n");
    let port = agent.port;
    assert!(agent.terminate().success());
    let gone = support::output(
        support::junction()
            .args(["healthcheck", "--timeout", "2", "--url"])
            .arg(format!("http://127.0.0.1:{port}/healthz")),
    );
    assert_eq!(gone.status.code(), Some(1));
    let said = String::from_utf8_lossy(&gone.stdout);
    assert!(said.starts_with("unhealthy: no answer from"), "{said}");

    // A source down (no NVML library): exit 1, naming it and no source that is up.
    let port = support::free_port();
    let config = support::sim_config("current", port, "").replace(
        &format!("{:?}", support::sim_lib("current").display().to_string()),
        "\"libnvidia-ml-absent.so.1\"",
    );
    assert!(config.contains("libnvidia-ml-absent.so.1"), "{config}");
    let agent = Agent::spawn_config("h100-training.toml", &config);
    let mut last = None;
    support::wait_until(
        Duration::from_secs(20),
        "the healthcheck names nvml",
        || {
            let out = support::output(
                support::junction()
                    .arg("--config")
                    .arg(&agent.config)
                    .arg("healthcheck"),
            );
            let said = String::from_utf8_lossy(&out.stdout).to_string();
            let done = said.contains("nvml");
            last = Some((out.status.code(), said));
            done
        },
    );
    let (code, said) = last.expect("an answer");
    assert_eq!(code, Some(1), "{said}");
    let down = said
        .split("sources down: ")
        .nth(1)
        .map(|l| l.trim().split(", ").map(str::to_string).collect::<Vec<_>>())
        .unwrap_or_default();
    assert!(down.contains(&"nvml".to_string()), "{said}");
    // The health source is up; the kernel log is up as root (and down, saying why, when the
    // test runs unprivileged).
    assert!(
        down.iter().all(|s| s == "nvml" || s == "kmsg"),
        "only what is down: {said}"
    );
}

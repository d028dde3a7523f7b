//! NVIDIA's Grafana dashboard for dcgm-exporter against a real Prometheus scraping the
//! compatibility listener: every panel's query returns data, on an H100 node and on a MIG
//! node, a row per GPU instance.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Line, compat_config, lines, shared};
use crate::support::prometheus::Prometheus;
use crate::support::{self, Agent};

/// NVIDIA's dashboard (grafana.com 12239, `grafana_dcgm-exporter-dashboard.json`): each
/// panel's query, its `$instance` and `$gpu` filled as Grafana fills an "All" selection of a
/// multi-value variable (every value the variable's `label_values` query finds, as a
/// regex alternation), returns data from a real Prometheus scraping the listener.
#[test]
fn nvidias_dashboard_gets_data_from_every_panel() {
    let (mut agent, _, prom, answers) = dashboard("h100-training.toml", 8);
    let Some(_prom) = prom else { return };
    for (title, n, first) in &answers {
        assert!(*n > 0, "{title} returned nothing");
        if title == "GPU Temperature" {
            assert_eq!(*n, 8);
        }
        if title == "GPU SM Clocks" {
            assert_eq!(first.as_deref(), Some("1980000000"), "Hz from MHz");
        }
    }
    assert!(agent.terminate().success());
}

/// The same dashboard on the MIG node (one H100, GPU instances 3 (3g.40gb) and 5 (2g.20gb,
/// two compute instances)): a row per GPU instance, as dcgm-exporter's; every panel has data
/// but GPU Utilization, which DCGM leaves blank in MIG mode as NVML does.
#[test]
fn nvidias_dashboard_on_a_mig_node_gets_a_row_per_gpu_instance() {
    let (mut agent, dcgm, prom, answers) = dashboard("h100-mig.toml", 2);
    let Some(_prom) = prom else { return };
    for (title, n, _) in &answers {
        match title.as_str() {
            "GPU Utilization" => assert_eq!(*n, 0, "no utilisation in MIG mode"),
            "GPU Temperature" | "GPU Framebuffer Mem Used" | "Tensor Core Utilization" => {
                assert_eq!(*n, 2, "{title}: a row per GPU instance")
            }
            _ => assert!(*n > 0, "{title} returned nothing"),
        }
    }
    let page = support::scrape(dcgm, Duration::from_secs(5)).expect("scrape");
    let row = |name: &str, gi: &str| -> Line {
        lines(&page)
            .into_iter()
            .find(|l| l.name == name && l.labels.iter().any(|(k, v)| k == "GPU_I_ID" && v == gi))
            .unwrap_or_else(|| panic!("no {name} row for GPU instance {gi}:\n{page}"))
    };
    let temp = row("DCGM_FI_DEV_GPU_TEMP", "5");
    let keys: Vec<&str> = temp.labels.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "gpu",
            "UUID",
            "pci_bus_id",
            "device",
            "modelName",
            "GPU_I_PROFILE",
            "GPU_I_ID",
            "Hostname",
            "DCGM_FI_DRIVER_VERSION"
        ],
        "dcgm-exporter's order"
    );
    assert_eq!(temp.labels[5].1, "2g.20gb");
    assert!(
        temp.labels[1].1.starts_with("GPU-"),
        "the parent's UUID: {temp:?}"
    );
    // The instance's own memory and GPM readings; the GPU's temperature on both rows.
    assert_eq!(row("DCGM_FI_DEV_FB_USED", "3").value, "20000");
    assert_eq!(row("DCGM_FI_DEV_FB_USED", "5").value, "1000");
    assert_eq!(row("DCGM_FI_DEV_FB_FREE", "3").value, "20192");
    assert_eq!(
        row("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "3").value,
        "0.400000"
    );
    assert_eq!(
        row("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "5").value,
        "0.000000"
    );
    assert_eq!(
        row("DCGM_FI_DEV_GPU_TEMP", "3").value,
        temp.value,
        "the GPU's temperature on every instance's row"
    );
    assert_eq!(
        lines(&page)
            .iter()
            .filter(|l| l.name == "DCGM_FI_DEV_GPU_TEMP")
            .count(),
        2,
        "compute instances share their GPU instance's row"
    );
    assert!(agent.terminate().success());
}

/// A panel's answer: its title, the series returned, the first one's value.
type Answer = (String, usize, Option<String>);

/// Every panel of NVIDIA's dashboard, its variables filled as Grafana would, against a real
/// Prometheus scraping the compatibility listener on `scenario`: the listener's port and
/// (title, series returned, the first one's value) per panel. `None` for Prometheus where it
/// cannot run outside CI.
fn dashboard(scenario: &str, rows: usize) -> (Agent, u16, Option<Prometheus>, Vec<Answer>) {
    let (port, dcgm) = (support::free_port(), support::free_port());
    let mut agent = Agent::spawn_config(scenario, &compat_config(port, dcgm, ""));
    agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("gpu_sm_activity_ratio") && m.contains(support::NVML_UP)
    });
    let Some(prom) = Prometheus::start(dcgm, None) else {
        return (agent, dcgm, None, Vec::new());
    };
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(shared("grafana_dcgm-exporter-dashboard.json"))
            .expect("dashboard"),
    )
    .expect("json");
    // The variables' values, as their label_values queries find them.
    let mut vars = BTreeMap::new();
    support::wait_until(Duration::from_secs(30), "Prometheus has the series", || {
        prom.result("DCGM_FI_DEV_GPU_TEMP")
            .is_ok_and(|r| r.as_array().is_some_and(|a| a.len() == rows))
    });
    for v in dash["templating"]["list"].as_array().expect("variables") {
        let q = v["query"].as_str().unwrap_or("");
        let Some(inner) = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
        else {
            continue;
        };
        let (metric, label) = inner.rsplit_once(',').expect("label_values(metric, label)");
        let r = prom.result(metric.trim()).expect("variable query");
        let mut values: Vec<String> = r
            .as_array()
            .expect("series")
            .iter()
            .filter_map(|s| s["metric"][label.trim()].as_str().map(str::to_string))
            .collect();
        values.sort();
        values.dedup();
        assert!(!values.is_empty(), "variable {}", v["name"]);
        vars.insert(
            v["name"].as_str().expect("name").to_string(),
            format!("({})", values.join("|")),
        );
    }
    let mut panels = Vec::new();
    fn walk(ps: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for p in ps.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push((p["title"].as_str().unwrap_or("").to_string(), e.to_string()));
                }
            }
            walk(&p["panels"], out);
        }
    }
    walk(&dash["panels"], &mut panels);
    assert!(panels.len() >= 8, "{panels:?}");
    let answers = panels
        .iter()
        .map(|(title, expr)| {
            let mut e = expr.clone();
            for (k, v) in &vars {
                e = e.replace(&format!("${k}"), v);
            }
            let r = prom
                .result(&e)
                .unwrap_or_else(|err| panic!("{title}: {e}: {err}"));
            let n = r.as_array().map_or(0, Vec::len);
            let first = r[0]["value"][1].as_str().map(str::to_string);
            (title.clone(), n, first)
        })
        .collect();
    (agent, dcgm, Some(prom), answers)
}

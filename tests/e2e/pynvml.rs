//! The simulated nodes read through `pynvml` (NVIDIA's Python bindings, the peer's path to
//! NVML) and through Junction: the same values, modes and processes.

use crate::support;

/// `pynvml` (PyPI nvidia-ml-py) reads the same simulator: an independent check of the ABI,
/// on every scenario it can read. Those it cannot: `r535-processes` (pynvml reads 24-byte
/// entries: the defect itself), `future-driver` (the script calls the deprecated
/// `nvmlDeviceGetTemperature`), `old-driver` (no `MemoryInfo_v2`) and the MIG scenarios
/// (no device utilization under MIG).
#[test]
fn pynvml_reads_the_same_values() {
    let python = std::env::var_os("JUNCTION_PYTHON").map(std::path::PathBuf::from);
    let Some(python) = support::require_tool("python-with-pynvml", python) else {
        return;
    };
    for scenario in [
        "h100-training.toml",
        "r545-memory-temp.toml",
        "long-process-name.toml",
        "process-utilization.toml",
        "gpm-nan.toml",
        "gb200-nvl72-tray.toml",
    ] {
        pynvml_agrees(&python, scenario);
    }
}

fn pynvml_agrees(python: &std::path::Path, scenario: &str) {
    let lib = support::sim_lib("current");
    let out = support::output(
        std::process::Command::new(python)
            .arg(support::root().join("tests/pynvml/read.py"))
            .env("LD_LIBRARY_PATH", lib.parent().expect("dir"))
            .env("JUNCTION_NVML_SIM_SCENARIO", support::scenario(scenario)),
    );
    assert!(
        out.status.success(),
        "pynvml script failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let py: serde_json::Value = serde_json::from_slice(&out.stdout).expect("pynvml json");

    let config = support::temp_dir().join("once.toml");
    std::fs::write(
        &config,
        format!(
            "proc_root = {:?}\n[sources.nvml]\nlibrary = {:?}\n",
            support::empty_proc().display().to_string(),
            lib.display().to_string()
        ),
    )
    .expect("config");
    let out = support::output(
        support::junction()
            .env("JUNCTION_NVML_SIM_SCENARIO", support::scenario(scenario))
            .args(["once", "--format", "json", "--config"])
            .arg(&config),
    );
    assert!(
        out.status.success(),
        "junction once failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("junction json");

    let metric = |gpu: &serde_json::Value, name: &str, attr: Option<(&str, &str)>| -> f64 {
        gpu["metrics"]
            .as_array()
            .expect("metrics")
            .iter()
            .find(|m| m["name"] == name && attr.is_none_or(|(k, v)| m["attributes"][k] == v))
            .and_then(|m| m["value"].as_f64())
            .unwrap_or_else(|| panic!("junction has no {name} {attr:?}"))
    };
    let pys = py["gpus"].as_array().expect("py gpus");
    let js = j["gpus"].as_array().expect("junction gpus");
    assert_eq!(pys.len(), js.len());
    for (p, g) in pys.iter().zip(js) {
        let what = format!("{scenario} {}", p["uuid"].as_str().expect("uuid"));
        assert_eq!(g["gpu"]["uuid"], p["uuid"]);
        assert_eq!(g["gpu"]["name"], p["name"]);
        assert_eq!(
            g["gpu"]["pci_bus_id"].as_str().map(str::to_string),
            p["bus_id"]
                .as_str()
                .map(|b| b.to_lowercase()[4..].to_string())
        );
        let eq = |a: f64, b: f64, tol: f64, field: &str| {
            assert!(
                (a - b).abs() <= tol,
                "{what} {field}: junction {a}, pynvml {b}"
            )
        };
        eq(
            metric(g, "hw.gpu.memory.usage", None),
            p["memory_used"].as_f64().expect("mem"),
            0.0,
            "memory used",
        );
        eq(
            metric(g, "hw.gpu.memory.limit", None),
            p["memory_total"].as_f64().expect("mem"),
            0.0,
            "memory total",
        );
        eq(
            metric(g, "hw.gpu.utilization", Some(("hw.gpu.task", "general"))) * 100.0,
            p["gpu_util"].as_f64().expect("util"),
            1e-9,
            "gpu util",
        );
        eq(
            metric(g, "hw.temperature", Some(("hw.sensor_location", "gpu_die"))),
            p["temp_gpu"].as_f64().expect("temp"),
            0.0,
            "die temp",
        );
        // The hot GPU's HBM temperature ramps 2 °C a minute between the two reads.
        eq(
            metric(
                g,
                "hw.temperature",
                Some(("hw.sensor_location", "memory_junction")),
            ),
            p["temp_memory"].as_f64().expect("temp"),
            1.0,
            "hbm temp",
        );
        // Power is a sine of ±40 W over 30 s.
        eq(
            metric(g, "hw.power", None) * 1000.0,
            p["power_mw"].as_f64().expect("power"),
            40_000.0,
            "power",
        );
        eq(
            metric(
                g,
                "gpu.power.limit",
                Some(("gpu.power.limit_type", "enforced")),
            ) * 1000.0,
            p["power_limit_mw"].as_f64().expect("limit"),
            0.0,
            "power limit",
        );
        eq(
            metric(g, "gpu.clock.frequency", Some(("gpu.clock.domain", "sm"))) / 1e6,
            p["clock_sm_mhz"].as_f64().expect("clock"),
            0.0,
            "sm clock",
        );
        eq(
            metric(
                g,
                "gpu.pcie.throughput",
                Some(("network.io.direction", "receive")),
            ) / 1024.0,
            p["pcie_rx_kb"].as_f64().expect("pcie"),
            0.0,
            "pcie rx",
        );
        eq(
            metric(
                g,
                "gpu.ecc.errors.lifetime",
                Some(("error.type", "corrected")),
            ),
            p["ecc_corrected_aggregate"].as_f64().expect("ecc"),
            0.0,
            "ecc",
        );
        let jp = metric(
            g,
            "gpu.process.memory.usage",
            Some((
                "process.pid",
                p["first_pid"].as_u64().expect("pid").to_string().as_str(),
            )),
        );
        eq(
            jp,
            p["first_pid_memory"].as_f64().expect("pid mem"),
            0.0,
            "process memory",
        );
        modes_agree(g, p, &what);
    }
}

/// The configuration and fabric series against what pynvml read.
fn modes_agree(g: &serde_json::Value, p: &serde_json::Value, what: &str) {
    let find = |name: &str, key: Option<(&str, &str)>| -> Option<f64> {
        g["metrics"]
            .as_array()?
            .iter()
            .find(|m| m["name"] == name && key.is_none_or(|(k, v)| m["attributes"][k] == v))
            .and_then(|m| m["value"].as_f64())
    };
    assert_eq!(
        find("gpu.persistence_mode", None),
        p["persistence_mode"].as_f64(),
        "{what} persistence"
    );
    assert_eq!(
        find("gpu.ecc.mode", Some(("gpu.mode.setting", "current"))),
        p["ecc_mode"][0].as_f64(),
        "{what} ecc current"
    );
    assert_eq!(
        find("gpu.ecc.mode", Some(("gpu.mode.setting", "pending"))),
        p["ecc_mode"][1].as_f64(),
        "{what} ecc pending"
    );
    // NVML_COMPUTEMODE_DEFAULT = 0, EXCLUSIVE_THREAD 1, PROHIBITED 2, EXCLUSIVE_PROCESS 3.
    let modes = [
        "default",
        "exclusive_thread",
        "prohibited",
        "exclusive_process",
    ];
    let mode = p["compute_mode"].as_u64().map(|m| modes[m as usize]);
    assert_eq!(
        mode.and_then(|m| find("gpu.compute_mode", Some(("gpu.compute_mode", m)))),
        mode.map(|_| 1.0),
        "{what} compute mode"
    );
    let f = &p["fabric"];
    if f.is_null() || f["state"] == 0 {
        assert_eq!(
            find("gpu.fabric.state", None),
            None,
            "{what}: no fabric series"
        );
        return;
    }
    let states = ["", "not_started", "in_progress", "completed"];
    let state = states[f["state"].as_u64().expect("state") as usize];
    assert_eq!(
        find("gpu.fabric.state", Some(("gpu.fabric.state", state))),
        Some(1.0),
        "{what} fabric state"
    );
    assert_eq!(
        find("gpu.fabric.health_mask", None),
        f["mask"].as_f64(),
        "{what} fabric health mask"
    );
    let clique = f["clique"].as_u64().expect("clique").to_string();
    assert_eq!(
        find(
            "gpu.fabric.info",
            Some(("gpu.fabric.clique_id", clique.as_str()))
        ),
        Some(1.0),
        "{what} clique"
    );
}

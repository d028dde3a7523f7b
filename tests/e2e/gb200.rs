//! A GB200 NVL72 compute tray (`tests/scenarios/gb200-nvl72-tray.toml`) through the real
//! `junction`: the configuration and fabric series with the scenario's values; a BER ramp, a
//! fabric registration that drops to in progress, a route that turns unhealthy, a pending ECC
//! change and lost P2P each raise their reason and clear once the scenario puts them right;
//! a fabric
//! manager the test starts, kills and starts again; and an `[expect]` section with one
//! wrong value per kind, one `config_drift` finding per setting in `junction inventory`.

use std::time::{Duration, Instant};

use crate::support::{self, Agent, parse, value};

const SCENARIO: &str = "gb200-nvl72-tray.toml";

fn reason(page: &str, gpu: &str, code: &str) -> Option<f64> {
    value(
        &parse(page),
        "gpu_health_reason",
        &[("hw_id", gpu), ("gpu_health_reason", code)],
    )
}

/// A process the host source takes for the fabric manager: root's, its executable named
/// `nv-fabricmanager` (a copy of `sleep`).
fn fabric_manager(dir: &std::path::Path) -> FabricManager {
    let exe = dir.join("nv-fabricmanager");
    if !exe.exists() {
        std::fs::copy("/bin/sleep", &exe).expect("copy sleep");
    }
    FabricManager(
        std::process::Command::new(&exe)
            .arg("600")
            .spawn()
            .expect("start the fabric manager"),
    )
}

/// The test's fabric manager, killed when dropped: a failed assertion must not leave it
/// running, where the next run's agent would find it and never see the manager down.
struct FabricManager(std::process::Child);

impl FabricManager {
    fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for FabricManager {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn a_gb200_tray_reports_its_fabric_and_modes_and_each_fault_raises_then_clears() {
    let root = nix_root();
    let dir = support::temp_dir();
    let port = support::free_port();
    let mut cfg = support::sim_config("current", port, "")
        + "\n[health]\ninterval_secs = 1\nclear_after_secs = 2\n\n[sources.host]\ninterval_secs = 1\n";
    if root {
        // The real /proc, where the test's fabric manager runs.
        let (head, rest) = cfg.split_once('\n').expect("a proc_root line");
        assert!(head.starts_with("proc_root"));
        cfg =
            format!("proc_root = \"/proc\"\n{rest}\n[expect]\ndaemons = [\"nv-fabricmanager\"]\n");
    }
    let mut fm = root.then(|| fabric_manager(&dir));
    let started = Instant::now();
    let mut agent = Agent::spawn_config(SCENARIO, &cfg);
    let page = agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("gpu_fabric_state{")
            && m.contains("gpu_persistence_mode{")
            && m.contains(support::NVML_UP)
    });
    let s = parse(&page);
    let uuids = support::uuids(&s);
    assert_eq!(uuids.len(), 4);
    for u in &uuids {
        let v = |name: &str, attrs: &[(&str, &str)]| {
            let mut a = vec![("hw_id", u.as_str())];
            a.extend_from_slice(attrs);
            value(&s, name, &a)
        };
        assert_eq!(v("gpu_persistence_mode", &[]), Some(1.0));
        assert_eq!(
            v("gpu_ecc_mode", &[("gpu_mode_setting", "current")]),
            Some(1.0)
        );
        assert_eq!(
            v("gpu_compute_mode", &[("gpu_compute_mode", "default")]),
            Some(1.0)
        );
        assert_eq!(
            v("gpu_gsp_firmware", &[("hw_firmware_version", "570.133.20")]),
            Some(1.0)
        );
        assert_eq!(
            v(
                "gpu_fabric_info",
                &[
                    ("gpu_fabric_clique_id", "32766"),
                    (
                        "gpu_fabric_cluster_uuid",
                        "5d3f1a0e-9c7b-4e21-a8f4-0b6e2d9c3a17"
                    ),
                    ("gpu_fabric_status", "success"),
                ]
            ),
            Some(1.0)
        );
        assert_eq!(v("gpu_fabric_health_mask", &[]), Some(f64::from(0x11AA)));
        assert_eq!(v("gpu_c2c_link_state", &[("gpu_c2c_link", "0")]), Some(1.0));
    }
    assert_eq!(
        value(
            &s,
            "gpu_fabric_state",
            &[("hw_id", &uuids[0]), ("gpu_fabric_state", "completed")]
        ),
        Some(1.0)
    );
    assert!(
        started.elapsed() < Duration::from_secs(19),
        "the first page came after the faults began"
    );
    assert_eq!(reason(&page, &uuids[1], "fabric_incomplete"), None);
    // From 20 s: GPU 1 registers again, GPU 2's route is unhealthy, GPU 3 has an ECC change
    // pending. Each raises its reason within an interval or two.
    let page = agent.wait_for(Duration::from_secs(40), |m| {
        reason(m, &uuids[0], "nvlink_ber_high") == Some(1.0)
            && reason(m, &uuids[1], "fabric_incomplete") == Some(1.0)
            && reason(m, &uuids[2], "fabric_unhealthy") == Some(1.0)
            && reason(m, &uuids[3], "mode_change_pending") == Some(1.0)
            && reason(m, &uuids[3], "p2p_lost") == Some(1.0)
            && reason(m, &uuids[0], "p2p_lost") == Some(1.0)
    });
    assert!(
        started.elapsed() < Duration::from_secs(45),
        "raised while the faults last"
    );
    let s = parse(&page);
    assert_eq!(
        value(
            &s,
            "gpu_fabric_health",
            &[
                ("hw_id", &uuids[2]),
                ("gpu_fabric_health_check", "route_unhealthy")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "hw_status",
            &[
                ("hw_id", &uuids[2]),
                ("hw_type", "gpu"),
                ("hw_state", "failed")
            ]
        ),
        Some(1.0),
        "DCGM fails a GPU with a true fabric health field"
    );
    assert_eq!(
        reason(&page, &uuids[0], "fabric_incomplete"),
        None,
        "GPU 0's registration is fine"
    );
    let ber = value(
        &s,
        "gpu_nvlink_ber_ratio",
        &[
            ("hw_id", &uuids[0]),
            ("gpu_nvlink_link", "17"),
            ("gpu_nvlink_ber_type", "effective"),
        ],
    )
    .expect("the effective BER of link 17");
    assert!((ber - 5e-12).abs() < 1e-15, "{ber}");
    // FEC history per GPU: each bin summed over its 18 links; bins the driver does not give
    // are absent.
    let fec = |bin: &str| {
        value(
            &s,
            "gpu_nvlink_fec_history_total",
            &[("hw_id", &uuids[0]), ("gpu_nvlink_fec_bin", bin)],
        )
    };
    assert_eq!(fec("2"), Some(7.0 * 18.0), "bin 2: 7 on each of 18 links");
    assert!(fec("0").is_some_and(|n| n > 0.0), "bin 0 counts");
    assert_eq!(fec("3"), None, "no bin 3 from this driver");
    assert_eq!(
        value(
            &s,
            "gpu_p2p_peers",
            &[
                ("hw_id", &uuids[3]),
                ("gpu_p2p_capability", "nvlink"),
                ("gpu_p2p_missing", "0,1,2")
            ]
        ),
        Some(0.0),
        "GPU 3 lost P2P with every peer"
    );
    assert_eq!(
        value(
            &s,
            "hw_status",
            &[
                ("hw_id", &uuids[3]),
                ("hw_type", "gpu"),
                ("hw_state", "failed")
            ]
        ),
        Some(1.0)
    );
    // The fabric manager stops: down on every GPU; started again: a restart, then clear.
    if let Some(f) = fm.as_mut() {
        f.stop();
        agent.wait_for(Duration::from_secs(30), |m| {
            reason(m, &uuids[0], "fabric_manager_down") == Some(1.0)
        });
        fm = Some(fabric_manager(&dir));
        agent.wait_for(Duration::from_secs(30), |m| {
            value(
                &parse(m),
                "node_daemon_restarts_total",
                &[("node_daemon", "nv-fabricmanager")],
            ) == Some(1.0)
        });
    }
    // From 45 s the scenario puts everything right: every reason clears.
    agent.wait_for(Duration::from_secs(60), |m| {
        uuids.iter().all(|u| {
            [
                "nvlink_ber_high",
                "fabric_incomplete",
                "fabric_unhealthy",
                "mode_change_pending",
                "p2p_lost",
                "fabric_manager_down",
            ]
            .iter()
            .all(|c| reason(m, u, c).is_none())
        })
    });
    assert!(agent.terminate().success());
    drop(fm);
}

fn nix_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn an_expect_section_names_every_setting_that_differs() {
    let port = support::free_port();
    let cfg = support::sim_config("current", port, "")
        + r#"
[expect]
persistence_mode = false
ecc = false
compute_mode = "prohibited"
driver_versions = ["580.65.06"]
cuda_versions = ["13.0"]
gsp_firmware_versions = ["580.65.06"]
modules = ["nvidia_peermem"]
daemons = ["nvidia-imex"]
fabric = "in_progress"
gpus = 72
"#;
    let file = support::temp_dir().join("expect.toml");
    std::fs::write(&file, &cfg).expect("config");
    let out = support::output(
        support::junction()
            .env("JUNCTION_NVML_SIM_SCENARIO", support::scenario(SCENARIO))
            .arg("--config")
            .arg(&file)
            .args(["inventory", "--format", "json"]),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let gpus = v["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 4);
    for g in gpus {
        let reasons = g["health"]["reasons"].as_array().expect("reasons");
        let drift: Vec<&serde_json::Value> = reasons
            .iter()
            .filter(|r| r["code"] == "config_drift")
            .collect();
        assert_eq!(drift.len(), 1, "{reasons:?}");
        assert_eq!(drift[0]["state"], "degraded");
        let detail = drift[0]["detail"].as_str().unwrap_or("");
        for setting in [
            "persistence_mode: expected off, is on",
            "ecc: expected off, is on",
            "compute_mode: expected prohibited, is default",
            "driver_versions: 570.133.20 is not one of 580.65.06",
            "cuda_versions: 12.8 is not one of 13.0",
            "gsp_firmware_versions: \"570.133.20\" is not one of 580.65.06",
            "modules: not loaded: nvidia_peermem",
            "daemons: not running: nvidia-imex",
            "fabric: expected in_progress, is completed",
            "gpus: expected 72, NVML lists 4",
        ] {
            assert!(detail.contains(setting), "{setting:?} not in {detail:?}");
        }
        assert_eq!(
            detail.matches("; ").count(),
            9,
            "one entry per setting: {detail}"
        );
    }
    // A setting that is right is not named.
    let ok = cfg.replace("persistence_mode = false", "persistence_mode = true");
    std::fs::write(&file, &ok).expect("config");
    let out = support::output(
        support::junction()
            .env("JUNCTION_NVML_SIM_SCENARIO", support::scenario(SCENARIO))
            .arg("--config")
            .arg(&file)
            .args(["inventory", "--format", "json"]),
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("persistence_mode:"));
}

#[test]
fn gpus_without_a_fabric_report_no_fabric_series_and_log_nothing_new_and_a_gh200_its_c2c_link() {
    for (scenario, variant) in [
        ("h100-training.toml", "current"),
        ("old-driver.toml", "legacy"),
        ("gh200.toml", "current"),
    ] {
        let mut agent = Agent::start(scenario, variant);
        let page = agent.wait_for(Duration::from_secs(30), |m| m.contains("gpu_compute_mode{"));
        assert!(
            !page.contains("gpu_fabric_"),
            "{scenario}: no fabric series"
        );
        assert!(
            !page.contains("gpu_nvlink_fec_history"),
            "{scenario}: no FEC history"
        );
        // The C2C link to the Grace CPU where there is one, and only there.
        let c2c = value(
            &parse(&page),
            "gpu_c2c_link_max_bandwidth_bytes_per_second",
            &[("gpu_c2c_link", "0")],
        );
        assert_eq!(
            c2c,
            (scenario == "gh200.toml").then_some(450e9),
            "{scenario}: C2C"
        );
        assert!(agent.terminate().success());
        let log = std::fs::read_to_string(&agent.stderr).unwrap_or_default();
        assert!(log.contains("NVML"), "{scenario}: the log was read:\n{log}");
        for word in [
            "fabric",
            "gsp",
            "persistence",
            "compute_mode",
            "ecc_mode",
            "fec",
        ] {
            assert!(
                !log.to_lowercase().contains(word),
                "{scenario}: the start-up log names {word}:\n{log}"
            );
        }
    }
}

/// The fabric manager's log, followed: what it held before Junction first looked is not
/// counted; a fatal NVSwitch error appended later is one event and count and a node reason;
/// a restart counts nothing again; a log others may write is not read.
#[test]
fn the_fabric_manager_log_is_followed_from_where_it_was() {
    if !nix_root() {
        return;
    }
    let dir = support::temp_dir();
    let log = dir.join("fabricmanager.log");
    // A line of the reference's form (gpud's example, node-fabric-and-bus.md §4.5).
    let fatal = |port: u32| {
        format!(
            "[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port {port}\n"
        )
    };
    std::fs::write(&log, fatal(1)).expect("log");
    let port = support::free_port();
    let cfg = support::sim_config("current", port, "")
        + &format!(
            "\n[sources.host]\ninterval_secs = 1\nfabric_manager_log = {:?}\n",
            log.display().to_string()
        );
    let count = |m: &str| {
        value(
            &parse(m),
            "kmsg_signature_events_total",
            &[("hw_id", "node"), ("kmsg_signature", "fm_nvswitch_fatal")],
        )
    };
    let mut agent = Agent::spawn_config(SCENARIO, &cfg);
    agent.wait_for(Duration::from_secs(30), |m| m.contains("node_daemon_up{"));
    // Two polls later, the old line is still not counted; a new one is.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        count(&support::scrape(agent.port, Duration::from_secs(5)).expect("scrape")),
        None,
        "written before Junction looked"
    );
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .and_then(|mut f| f.write_all(fatal(2).as_bytes()))
        .expect("append");
    let page = agent.wait_for(Duration::from_secs(30), |m| count(m) == Some(1.0));
    assert!(page.contains("node_health_reason{") && page.contains("nvswitch_fatal"));
    assert!(agent.terminate().success());
    let mut agent = Agent::spawn_config(SCENARIO, &cfg);
    agent.wait_for(Duration::from_secs(30), |m| m.contains("node_daemon_up{"));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        count(&support::scrape(agent.port, Duration::from_secs(5)).expect("scrape")),
        Some(1.0),
        "not again after a restart"
    );
    assert!(agent.terminate().success());
}

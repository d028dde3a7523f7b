//! Real-driver behaviour, one scenario per defect or quirk that production exporters work
//! around, each reproduced by the simulator (a driver-branch build or a run-time quirk).

use std::time::Duration;

use crate::support::{self, Agent, Series, parse, value};

const MIB: f64 = 1024.0 * 1024.0;

fn series<'a>(s: &'a [Series], name: &str, labels: &[(&str, &str)]) -> Vec<&'a Series> {
    s.iter()
        .filter(|x| {
            x.name == name
                && labels
                    .iter()
                    .all(|(k, v)| x.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

/// Guards the R535 process-list defect: 32-byte `_v3` entries on drivers 535.43–535.86.
/// Read as 24-byte entries, every entry after the first is garbage and 40 processes make the
/// driver write past the buffer (a heap-corruption abort).
#[test]
fn r535_process_lists_are_read_with_the_drivers_entry_size() {
    let mut agent = Agent::start("r535-processes.toml", "r535");
    let body = agent.wait_for(Duration::from_secs(20), |m| {
        m.matches("gpu_process_memory_usage_bytes{").count() >= 80
    });
    let s = parse(&body);
    let ids = support::uuids(&s);
    assert_eq!(ids.len(), 2);
    for (g, gpu) in ids.iter().enumerate() {
        let procs = series(&s, "gpu_process_memory_usage_bytes", &[("hw_id", gpu)]);
        assert_eq!(procs.len(), 40, "GPU {g}: {procs:#?}");
        for i in 0..40u32 {
            let pid = (50_000 + i + 1000 * g as u32).to_string();
            let v = value(
                &s,
                "gpu_process_memory_usage_bytes",
                &[("hw_id", gpu), ("process_pid", &pid)],
            );
            assert_eq!(v, Some(f64::from(100 * (i + 1)) * MIB), "GPU {g} pid {pid}");
        }
        assert_eq!(
            value(
                &s,
                "gpu_processes",
                &[("hw_id", gpu), ("gpu_process_type", "compute")]
            ),
            Some(40.0)
        );
        assert!(
            series(
                &s,
                "gpu_process_memory_usage_bytes",
                &[("process_pid", "0")]
            )
            .is_empty(),
            "no pid 0"
        );
    }
    assert!(agent.terminate().success(), "{}", agent.log());
}

/// Guards the R545 memory-temperature defect: `valueType` says double, the payload is the
/// integer. Read by type the HBM temperature is 3.8e-322 °C.
#[test]
fn r545_memory_temperature_is_read_as_the_integer() {
    let mut agent = Agent::start("r545-memory-temp.toml", "current");
    let body = agent.wait_for(Duration::from_secs(10), |m| {
        m.contains("hw_sensor_location=\"memory_junction\"")
    });
    let s = parse(&body);
    let gpu = support::uuids(&s)[0].clone();
    assert_eq!(
        value(
            &s,
            "hw_temperature_celsius",
            &[("hw_id", &gpu), ("hw_sensor_location", "memory_junction")]
        ),
        Some(71.0)
    );
}

/// Guards process names: NVML crops a name to the buffer and succeeds, so a 64-byte buffer
/// names a long venv's python after a directory fragment. With `/proc` visible, its `exe`
/// wins.
#[test]
fn long_process_paths_give_the_executables_name_and_the_cgroup_its_container() {
    let mut agent = Agent::start("long-process-name.toml", "current");
    let body = agent.wait_for(Duration::from_secs(10), |m| {
        m.contains("gpu_process_memory_usage_bytes{")
    });
    let s = parse(&body);
    let p = series(
        &s,
        "gpu_process_memory_usage_bytes",
        &[("process_pid", "41000")],
    );
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].labels["process_executable_name"], "python3.11");
    drop(agent);

    // The same pid visible in a (fake) /proc: its exe link names it.
    let dir = support::temp_dir();
    let proc = dir.join("proc");
    std::fs::create_dir_all(proc.join("41000")).expect("proc dir");
    std::os::unix::fs::symlink("/usr/local/bin/trainer", proc.join("41000/exe")).expect("exe");
    // Its cgroup: a containerd container in a Kubernetes pod (systemd driver, cgroup v2).
    let id = "4f".repeat(32);
    let uid = "0b7a2c5e-9d41-4c8e-a2f3-6e1d5b9c8a70";
    std::fs::write(
        proc.join("41000/cgroup"),
        format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id}.scope\n",
            uid.replace('-', "_")
        ),
    )
    .expect("cgroup");
    let port = support::free_port();
    let config = support::sim_config("current", port, "").replacen(
        &format!(
            "proc_root = {:?}",
            support::empty_proc().display().to_string()
        ),
        &format!("proc_root = {:?}", proc.display().to_string()),
        1,
    );
    let mut agent = Agent::spawn_config("long-process-name.toml", &config);
    let body = agent.wait_for(Duration::from_secs(10), |m| {
        m.contains("gpu_process_memory_usage_bytes{")
    });
    let p = parse(&body);
    let p = series(
        &p,
        "gpu_process_memory_usage_bytes",
        &[("process_pid", "41000")],
    );
    assert_eq!(p[0].labels["process_executable_name"], "trainer");
    // The process table joins NVML's process with its container and pod.
    assert_eq!(p[0].labels["container_id"], id);
    assert_eq!(p[0].labels["k8s_pod_uid"], uid);
}

fn has(body: &str, name: &str, label: &str) -> bool {
    body.lines()
        .any(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
}

/// Guards recoverable feature detection: MIG mode switched on at run time makes the parent
/// GPU answer NOT_SUPPORTED for utilization and remapped rows; switched off again, they come
/// back without an agent restart.
#[test]
fn mig_switched_on_and_off_brings_the_mig_dependent_metrics_back() {
    let mut agent = Agent::start("mig-toggle.toml", "current");
    let general = "hw_gpu_task=\"general\"";
    let body = agent.wait_for(Duration::from_secs(10), |m| {
        has(m, "hw_gpu_utilization_ratio", general)
            && m.contains("gpu_memory_remapped_rows{")
            && m.contains("gpu_mig_mode{")
    });
    assert!(has(&body, "gpu_mig_mode", "} 0"), "MIG starts off");
    // MIG on (at 4 s): MIG devices appear, the parent's utilization and remapped rows go.
    let body = agent.wait_for(Duration::from_secs(20), |m| {
        has(m, "gpu_mig_mode", "} 1")
            && m.contains("gpu_mig_memory_usage_bytes{")
            && !has(m, "hw_gpu_utilization_ratio", general)
            && !m.contains("gpu_memory_remapped_rows{")
    });
    assert!(body.contains("MIG-1f2e3d4c-0000-5000-9000-000000000001"));
    // MIG off (at 10 s): they come back (re-probed at the mode change, not after 10 min).
    agent.wait_for(Duration::from_secs(20), |m| {
        has(m, "gpu_mig_mode", "} 0")
            && has(m, "hw_gpu_utilization_ratio", general)
            && m.contains("gpu_memory_remapped_rows{")
            && !m.contains("gpu_mig_memory_usage_bytes{")
    });
    assert!(
        agent.log().contains("NVML feature available again"),
        "{}",
        agent.log()
    );
    assert!(agent.terminate().success());
}

/// Guards GPM NaN handling: a NaN reading is no reading, not a `NaN` series.
#[test]
fn nan_gpm_values_are_absent() {
    let mut agent = Agent::start("gpm-nan.toml", "current");
    let body = agent.wait_for(Duration::from_secs(10), |m| {
        m.contains("gpu_sm_occupancy_ratio{")
    });
    assert!(!body.contains("gpu_sm_activity_ratio{"), "{body}");
    assert!(!body.contains("NaN"), "no NaN anywhere");
    let s = parse(&body);
    let gpu = support::uuids(&s)[0].clone();
    assert_eq!(
        value(&s, "gpu_sm_occupancy_ratio", &[("hw_id", &gpu)]),
        Some(0.61)
    );
}

/// Guards per-process utilization: the newest entry per pid, nothing stale, nothing over
/// 100 %, no series twice in one scrape; unknown process memory is omitted, not 0.
#[test]
fn per_process_utilization_is_the_newest_sample_per_pid() {
    let mut agent = Agent::start("process-utilization.toml", "current");
    for _ in 0..3 {
        let body = agent.wait_for(Duration::from_secs(10), |m| {
            m.contains("gpu_process_utilization_ratio{")
        });
        let s = parse(&body);
        let mut keys: Vec<String> = s
            .iter()
            .map(|x| format!("{}{:?}", x.name, x.labels))
            .collect();
        let n = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), n, "a series appears twice in one scrape");
        let util = |pid: &str, task: &str| {
            value(
                &s,
                "gpu_process_utilization_ratio",
                &[("process_pid", pid), ("hw_gpu_task", task)],
            )
        };
        // The newest sample (older buffer entries carry half the value).
        assert_eq!(util("41000", "general"), Some(0.91));
        assert_eq!(util("41000", "memory"), Some(0.44));
        assert_eq!(util("41001", "general"), None, "130 % is not a reading");
        assert_eq!(util("41001", "memory"), Some(0.2));
        assert!(
            series(
                &s,
                "gpu_process_utilization_ratio",
                &[("process_pid", "41002")]
            )
            .is_empty(),
            "an idle process has no sample"
        );
        assert!(
            series(
                &s,
                "gpu_process_memory_usage_bytes",
                &[("process_pid", "41001")]
            )
            .is_empty(),
            "unknown memory is omitted"
        );
        assert_eq!(
            value(&s, "gpu_processes", &[("gpu_process_type", "compute")]),
            Some(3.0)
        );
        std::thread::sleep(Duration::from_millis(1100));
    }
}

/// Guards NVML_ERROR_RESET_REQUIRED: the GPU is failed with that reason (as GPUd does), not a
/// counted error on an `ok` GPU; the other GPU goes on.
#[test]
fn reset_required_fails_the_gpu_with_the_reason() {
    let mut agent = Agent::start("reset-required.toml", "current");
    let body = agent.wait_for(Duration::from_secs(20), |m| {
        m.contains("gpu_health_reason{") && m.contains("reset_required")
    });
    let s = parse(&body);
    let ids = support::uuids(&s);
    let (g0, g1) = (ids[0].as_str(), ids[1].as_str());
    assert_eq!(
        value(&s, "hw_status", &[("hw_id", g1), ("hw_state", "failed")]),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "gpu_health_reason",
            &[("hw_id", g1), ("gpu_health_reason", "reset_required")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&s, "hw_status", &[("hw_id", g0), ("hw_state", "ok")]),
        Some(1.0)
    );
    assert_eq!(
        support::scraped_readings_of(&body, g1),
        Vec::<String>::new(),
        "a failed GPU's readings are withdrawn"
    );
    assert!(
        !series(&s, "hw_gpu_memory_usage_bytes", &[("hw_id", g0)]).is_empty(),
        "the other GPU goes on"
    );
    assert!(agent.terminate().success());
}

/// Guards the move to the replacements of what CUDA 13 deprecates: on a driver without the
/// deprecated symbols (and with the renumbered fields of 580.82+), violation time, clock
/// event reasons, temperatures and the die's thresholds are still exported.
#[test]
fn future_driver_without_deprecated_symbols_still_exports_everything() {
    let mut agent = Agent::start("future-driver.toml", "future");
    let body = agent.wait_for(Duration::from_secs(10), |m| {
        m.contains("gpu_violation_time_seconds_total{") && m.contains("gpu_clock_event_active{")
    });
    let s = parse(&body);
    let gpu = support::uuids(&s)[0].clone();
    let on = |name: &str, l: &[(&str, &str)]| {
        let mut labels = vec![("hw_id", gpu.as_str())];
        labels.extend_from_slice(l);
        value(&s, name, &labels)
    };
    let v = |t: &str| {
        on(
            "gpu_violation_time_seconds_total",
            &[("gpu_violation_type", t)],
        )
    };
    assert_eq!(v("thermal"), Some(2.0));
    assert_eq!(
        v("sw_thermal_slowdown"),
        Some(7.0),
        "field 251, numbered 269"
    );
    assert_eq!(v("hw_thermal_slowdown"), Some(3.0));
    assert!(v("power").is_some_and(|p| p >= 5.0));
    let reason = |r: &str| on("gpu_clock_event_active", &[("gpu_clock_event_reason", r)]);
    assert_eq!(reason("sw_power_cap"), Some(1.0));
    assert_eq!(reason("sw_thermal_slowdown"), Some(1.0));
    assert_eq!(reason("gpu_idle"), Some(0.0));
    let t = |loc: &str| on("hw_temperature_celsius", &[("hw_sensor_location", loc)]);
    assert_eq!(t("gpu_die"), Some(64.0));
    assert_eq!(t("memory_junction"), Some(71.0));
    let limit = |loc: &str, kind: &str| {
        on(
            "hw_temperature_limit_celsius",
            &[("hw_sensor_location", loc), ("hw_limit_type", kind)],
        )
    };
    // The die's thresholds come from the T.Limit fields (slowdown -3, shutdown -5 degrees of
    // margin) and the margin (23 below the maximum operating 87 °C), made absolute.
    assert_eq!(
        on(
            "gpu_temperature_margin_celsius",
            &[("hw_sensor_location", "gpu_die")]
        ),
        Some(23.0)
    );
    assert_eq!(limit("gpu_die", "throttled"), Some(90.0));
    assert_eq!(limit("gpu_die", "high.critical"), Some(92.0));
    assert_eq!(limit("gpu_die", "max"), Some(87.0));
    // The memory maximum has only the removed call: nothing makes its T.Limit value absolute,
    // so there is no memory limit rather than a wrong one.
    assert_eq!(limit("memory_junction", "max"), None);
}

/// Guards the current enums and limits: 36 NVLink links (not cut at 18), the DL ECC data
/// counter, the link-recovery fields, per-link feature keys (links without error counters do
/// not switch off the others) and recovery actions by value, with `unknown` for new ones.
#[test]
fn nvlink_limits_and_recovery_actions_follow_the_current_header() {
    let mut agent = Agent::start("nvlink-36.toml", "current");
    let body = agent.wait_for(Duration::from_secs(10), |m| {
        m.contains("gpu_nvlink_link_recovery_total{") && m.contains("gpu_recovery_action{")
    });
    let s = parse(&body);
    let ids = support::uuids(&s);
    let g0 = ids[0].as_str();
    let states = series(&s, "gpu_nvlink_state", &[("hw_id", g0)]);
    assert_eq!(states.len(), 36, "every link up to 36");
    let ecc = |link: &str| {
        value(
            &s,
            "gpu_nvlink_errors_total",
            &[
                ("hw_id", g0),
                ("gpu_nvlink_link", link),
                ("gpu_nvlink_error_type", "ecc_data"),
            ],
        )
    };
    assert_eq!(ecc("29"), Some(6.0));
    assert_eq!(ecc("30"), None, "links 30 and up have no error counters");
    assert_eq!(
        value(
            &s,
            "gpu_nvlink_link_recovery_total",
            &[
                ("hw_id", g0),
                ("gpu_nvlink_link", "35"),
                ("gpu_nvlink_recovery_outcome", "failed")
            ]
        ),
        Some(1.0)
    );
    let action = |gpu: &str, a: &str| {
        value(
            &s,
            "gpu_recovery_action",
            &[("hw_id", gpu), ("gpu_recovery_action", a)],
        )
    };
    assert_eq!(action(g0, "recover_imex_domain"), Some(1.0));
    assert_eq!(action(g0, "unknown"), Some(0.0));
    assert_eq!(action(&ids[1], "unknown"), Some(1.0));
    assert_eq!(action(&ids[1], "none"), Some(0.0));
}

//! The 8x H100 training node: every NVML family on `/metrics` with the scenario's values after
//! unit conversion, MIG instances, fans and GPM. The same values through `pynvml` are in
//! `pynvml`; Prometheus' own tools on the endpoint in `prometheus`.

use std::time::Duration;

use crate::support::{self, Agent, parse, value};

const MIB: f64 = 1024.0 * 1024.0;

fn close(a: Option<f64>, b: f64, what: &str) {
    let a = a.unwrap_or_else(|| panic!("{what}: missing"));
    assert!(
        (a - b).abs() <= b.abs() * 1e-9 + 1e-9,
        "{what}: got {a}, want {b}"
    );
}

fn within(a: Option<f64>, lo: f64, hi: f64, what: &str) {
    let a = a.unwrap_or_else(|| panic!("{what}: missing"));
    assert!((lo..=hi).contains(&a), "{what}: got {a}, want {lo}..={hi}");
}

/// Guards the unit conversions and the attribute scheme of every family.
#[test]
fn every_family_has_the_scenario_values() {
    // The simulator's clock starts after this: counters that grow with time are bounded by it.
    let spawned = std::time::Instant::now();
    let mut agent = Agent::start("h100-training.toml", "current");
    // GPM and process utilization need a second cycle.
    let body = agent.wait_for(Duration::from_secs(20), |m| {
        m.contains("gpu_sm_activity_ratio") && m.contains("gpu_process_utilization_ratio")
    });
    let t = spawned.elapsed().as_secs_f64();
    let s = parse(&body);
    let ids = support::uuids(&s);
    assert_eq!(ids.len(), 8, "eight GPUs");
    let g0 = ids[0].as_str();
    let g5 = ids[5].as_str();
    let id = |g: &'static str| [("hw_id", g)];
    let _ = id;
    let on = |name: &str, gpu: &str, extra: &[(&str, &str)]| {
        let mut l = vec![("hw_id", gpu)];
        l.extend_from_slice(extra);
        value(&s, name, &l)
    };

    // identity
    let info = s
        .iter()
        .find(|x| x.name == "gpu_info" && x.labels["hw_id"] == g0)
        .expect("gpu_info");
    assert_eq!(info.labels["hw_name"], "NVIDIA H100 80GB HBM3");
    assert_eq!(info.labels["gpu_pci_bdf"], "0000:18:00.0");
    assert_eq!(info.labels["hw_driver_version"], "550.54.15");
    assert_eq!(info.labels["gpu_cuda_driver_version"], "12.4");
    close(on("hw_status", g0, &[("hw_state", "ok")]), 1.0, "status ok");
    close(
        on("hw_status", g0, &[("hw_state", "failed")]),
        0.0,
        "status failed",
    );

    // utilization: % -> ratio
    close(
        on(
            "hw_gpu_utilization_ratio",
            g0,
            &[("hw_gpu_task", "general")],
        ),
        0.97,
        "gpu util",
    );
    close(
        on(
            "hw_gpu_utilization_ratio",
            g0,
            &[("hw_gpu_task", "decoder")],
        ),
        0.03,
        "decoder util",
    );
    // The memory controller's busy time, and (OpenTelemetry's hw.gpu.memory.utilization) the
    // fraction of memory in use.
    close(
        on("gpu_memory_activity_ratio", g0, &[]),
        0.48,
        "memory activity",
    );
    close(
        on("hw_gpu_memory_utilization_ratio", g0, &[]),
        62459.0 / 81559.0,
        "memory in use",
    );

    // memory: MiB -> bytes
    close(
        on("hw_gpu_memory_usage_bytes", g0, &[]),
        62459.0 * MIB,
        "memory used",
    );
    close(
        on("hw_gpu_memory_limit_bytes", g0, &[]),
        81559.0 * MIB,
        "memory total",
    );
    close(
        on("gpu_memory_reserved_bytes", g0, &[]),
        509.0 * MIB,
        "memory reserved",
    );
    close(
        on("gpu_memory_free_bytes", g0, &[]),
        (81559.0 - 509.0 - 62459.0) * MIB,
        "memory free",
    );
    close(on("gpu_bar1_usage_bytes", g0, &[]), 37.0 * MIB, "bar1 used");

    // power: mW -> W, mJ -> J
    within(
        on("hw_power_watts", g0, &[("hw_type", "gpu")]),
        572.0,
        652.0,
        "power",
    );
    close(
        on(
            "gpu_power_limit_watts",
            g0,
            &[("gpu_power_limit_type", "enforced")],
        ),
        700.0,
        "power limit",
    );
    close(
        on(
            "gpu_power_limit_watts",
            g0,
            &[("gpu_power_limit_type", "min")],
        ),
        200.0,
        "power min",
    );
    within(
        on("hw_energy_joules_total", g0, &[("hw_type", "gpu")]),
        1.0e6,
        1.2e6,
        "energy",
    );

    // temperatures, including the memory junction climbing on GPU 5
    close(
        on(
            "hw_temperature_celsius",
            g0,
            &[("hw_sensor_location", "gpu_die")],
        ),
        64.0,
        "die temp",
    );
    close(
        on(
            "hw_temperature_celsius",
            g0,
            &[("hw_sensor_location", "memory_junction")],
        ),
        71.0,
        "hbm temp",
    );
    within(
        on(
            "hw_temperature_celsius",
            g5,
            &[("hw_sensor_location", "memory_junction")],
        ),
        74.0,
        94.0,
        "hot hbm",
    );
    close(
        on(
            "hw_temperature_limit_celsius",
            g0,
            &[
                ("hw_sensor_location", "memory_junction"),
                ("hw_limit_type", "max"),
            ],
        ),
        95.0,
        "hbm limit",
    );
    close(
        on(
            "hw_temperature_limit_celsius",
            g0,
            &[
                ("hw_sensor_location", "gpu_die"),
                ("hw_limit_type", "throttled"),
            ],
        ),
        90.0,
        "slowdown",
    );
    close(
        on(
            "gpu_temperature_margin_celsius",
            g0,
            &[("hw_sensor_location", "gpu_die")],
        ),
        23.0,
        "T.Limit margin: 87 °C maximum operating, 64 °C die",
    );

    // clocks: MHz -> Hz; throttle reasons decoded; ns -> s
    close(
        on(
            "gpu_clock_frequency_hertz",
            g0,
            &[("gpu_clock_domain", "sm")],
        ),
        1980e6,
        "sm clock",
    );
    close(
        on(
            "gpu_clock_max_frequency_hertz",
            g0,
            &[("gpu_clock_domain", "memory")],
        ),
        2619e6,
        "max mem clock",
    );
    close(on("gpu_performance_state", g0, &[]), 0.0, "pstate");
    close(
        on(
            "gpu_clock_event_active",
            g5,
            &[("gpu_clock_event_reason", "sw_power_cap")],
        ),
        1.0,
        "power cap on gpu5",
    );
    close(
        on(
            "gpu_clock_event_active",
            g0,
            &[("gpu_clock_event_reason", "sw_power_cap")],
        ),
        0.0,
        "no power cap on gpu0",
    );
    // h100-training.toml: 5e9 ns rising to 5e12 ns over 1e5 s, i.e. 5 s + 0.05 s a second.
    within(
        on(
            "gpu_violation_time_seconds_total",
            g0,
            &[("gpu_violation_type", "power")],
        ),
        5.0,
        5.0 + 0.05 * t * 1.01,
        "power violation (ns to s)",
    );

    // errors
    close(
        on("hw_errors_total", g0, &[("error_type", "corrected")]),
        2.0,
        "ecc volatile",
    );
    close(
        on(
            "gpu_ecc_errors_lifetime_total",
            g0,
            &[("error_type", "corrected")],
        ),
        17.0,
        "ecc aggregate",
    );
    close(
        on(
            "gpu_memory_remapped_rows",
            g0,
            &[("gpu_remap_type", "correctable")],
        ),
        1.0,
        "remapped rows",
    );
    close(
        on("gpu_memory_remap_failure", g0, &[]),
        0.0,
        "remap failure",
    );
    close(
        on(
            "gpu_recovery_action",
            g0,
            &[("gpu_recovery_action", "none")],
        ),
        1.0,
        "recovery none",
    );
    assert!(
        !body.contains("gpu_memory_retired_pages{"),
        "H100 has no page retirement"
    );

    // PCIe: KiB/s -> bytes/s
    close(
        on(
            "gpu_pcie_throughput_bytes_per_second",
            g0,
            &[("network_io_direction", "transmit")],
        ),
        1_250_000.0 * 1024.0,
        "pcie tx",
    );
    // hw.gpu.io: NVML's PCIe byte counters, running at the scenario's throughput since the
    // driver loaded. Both are read in one call, so receive is twice transmit; transmit
    // over its rate is the driver's age in seconds (under a minute here).
    let tx = on(
        "hw_gpu_io_bytes_total",
        g0,
        &[("network_io_direction", "transmit")],
    )
    .expect("hw.gpu.io transmit");
    let rx = on(
        "hw_gpu_io_bytes_total",
        g0,
        &[("network_io_direction", "receive")],
    )
    .expect("hw.gpu.io receive");
    within(
        Some(rx / tx),
        2.0 - 1e-5,
        2.0 + 1e-5,
        "pcie bytes receive / transmit (whole bytes)",
    );
    within(
        Some(tx / (1_250_000.0 * 1024.0)),
        0.0,
        60.0,
        "pcie bytes: seconds of transmit",
    );
    close(on("gpu_pcie_replay_total", g0, &[]), 3.0, "pcie replays");
    close(
        on(
            "gpu_pcie_link_generation",
            g0,
            &[("gpu_pcie_link_state", "max")],
        ),
        5.0,
        "pcie gen",
    );
    close(
        on(
            "gpu_pcie_link_width",
            g0,
            &[("gpu_pcie_link_state", "current")],
        ),
        16.0,
        "pcie width",
    );

    // NVLink: 18 links, KiB -> bytes
    let links = s
        .iter()
        .filter(|x| x.name == "gpu_nvlink_state" && x.labels["hw_id"] == g0)
        .count();
    assert_eq!(links, 18, "NVLink links");
    close(
        on("gpu_nvlink_state", g0, &[("gpu_nvlink_link", "17")]),
        1.0,
        "link 17 up",
    );
    // h100-training.toml: 1e6 KiB rising 1e7 KiB a second; NVML gives whole KiB.
    let tx = on(
        "gpu_nvlink_io_bytes_total",
        g0,
        &[
            ("gpu_nvlink_link", "0"),
            ("network_io_direction", "transmit"),
        ],
    );
    within(
        tx,
        1.0e6 * 1024.0,
        (1.0e6 + 1.0e7 * t * 1.01) * 1024.0,
        "nvlink tx (KiB to bytes)",
    );
    assert_eq!(
        tx.map(|b| b % 1024.0),
        Some(0.0),
        "whole KiB times 1024: {tx:?}"
    );
    close(
        on(
            "gpu_nvlink_errors_total",
            g0,
            &[
                ("gpu_nvlink_link", "3"),
                ("gpu_nvlink_error_type", "crc_flit"),
            ],
        ),
        4.0,
        "crc flit",
    );

    // processes
    close(
        on("gpu_processes", g0, &[("gpu_process_type", "compute")]),
        2.0,
        "process count",
    );
    close(
        on(
            "gpu_process_memory_usage_bytes",
            g0,
            &[("process_pid", "41000")],
        ),
        61440.0 * MIB,
        "process memory",
    );
    let p = s
        .iter()
        .find(|x| x.name == "gpu_process_memory_usage_bytes" && x.labels["process_pid"] == "41000")
        .expect("process");
    assert_eq!(p.labels["process_executable_name"], "python3");
    close(
        on(
            "gpu_process_utilization_ratio",
            g0,
            &[("process_pid", "41000"), ("hw_gpu_task", "general")],
        ),
        0.91,
        "process sm",
    );
    close(
        on(
            "gpu_process_memory_usage_bytes",
            g5,
            &[("process_pid", "46000")],
        ),
        61440.0 * MIB,
        "gpu5 process (pid stride)",
    );

    // MIG and GPM
    close(on("gpu_mig_mode", g0, &[]), 0.0, "mig off");
    close(on("gpu_sm_activity_ratio", g0, &[]), 0.88, "sm activity");
    close(on("gpu_sm_occupancy_ratio", g0, &[]), 0.61, "sm occupancy");
    close(
        on("gpu_pipe_activity_ratio", g0, &[("gpu_pipe", "tensor")]),
        0.54,
        "tensor",
    );
    close(on("gpu_dram_activity_ratio", g0, &[]), 0.47, "dram");
    close(
        on(
            "gpu_gpm_pcie_throughput_bytes_per_second",
            g0,
            &[("network_io_direction", "receive")],
        ),
        2400.0 * MIB,
        "gpm pcie rx",
    );

    // Start-up says once per feature that page retirement is off, naming all eight GPUs and
    // that it is expected on Hopper (not 3 features x 8 GPUs = 24 lines).
    let log = agent.log();
    let retired: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("retired_pages"))
        .collect();
    assert_eq!(retired.len(), 3, "{retired:#?}");
    for l in &retired {
        assert!(
            l.contains("gpus=0,1,2,3,4,5,6,7") && l.contains("expected on Ampere and newer"),
            "{l}"
        );
    }

    // Nothing disabled on a current H100 but page retirement (3 features), the Blackwell
    // link-recovery fields, NVLink5 counters and FEC history, one feature each per link
    // (18 + 18 + 18), the fabric info (no fabric state: no NVSwitch in the scenario) and the
    // C2C links (no Grace).
    close(
        on("junction_nvml_disabled_features", g0, &[]),
        59.0,
        "disabled features",
    );
    assert!(agent.terminate().success());
}

/// The A100 MIG node: instances with their own hw.id, memory and processes.
#[test]
fn mig_instances_are_reported() {
    let mut agent = Agent::start("a100-mig.toml", "current");
    let body = agent.wait_for(Duration::from_secs(20), |m| {
        m.contains("gpu_mig_memory_usage_bytes")
    });
    let s = parse(&body);
    let mig1 = [("hw_id", "MIG-1f2e3d4c-0000-5000-9000-000000000001")];
    close(
        value(&s, "gpu_mig_memory_usage_bytes", &mig1),
        30100.0 * MIB,
        "mig memory used",
    );
    close(
        value(&s, "gpu_mig_memory_limit_bytes", &mig1),
        40192.0 * MIB,
        "mig memory total",
    );
    close(value(&s, "gpu_mig_processes", &mig1), 1.0, "mig processes");
    let m = s
        .iter()
        .find(|x| x.name == "gpu_mig_memory_usage_bytes" && x.labels["hw_id"] == mig1[0].1)
        .expect("mig series");
    assert_eq!(
        m.labels["hw_parent"],
        "GPU-a100a100-0000-4000-8000-000000000001"
    );
    assert_eq!(m.labels["gpu_mig_gpu_instance_id"], "1");
    // The profile, from the MIG device's name ("NVIDIA A100-SXM4-80GB MIG 3g.40gb").
    assert_eq!(m.labels["gpu_mig_profile"], "3g.40gb");
    close(value(&s, "gpu_mig_mode", &[]), 1.0, "mig on");
    let p = s
        .iter()
        .find(|x| x.name == "gpu_process_memory_usage_bytes" && x.labels["process_pid"] == "7202")
        .expect("mig process");
    assert_eq!(p.labels["gpu_mig_gpu_instance_id"], "2");
    assert!(!body.contains("gpu_sm_activity_ratio"), "A100 has no GPM");
}

/// A PCIe card's fans: each a component of its own (`hw.id` `<GPU UUID>/fan<N>`, `hw.type`
/// fan, on its GPU), at the scenario's speed.
#[test]
fn a_cards_fans_are_components_on_their_gpu() {
    let mut agent = Agent::start("l40s-pcie.toml", "current");
    let body = agent.wait_for(Duration::from_secs(20), |m| {
        m.contains("hw_fan_speed_ratio")
    });
    let s = parse(&body);
    let gpu = support::uuids(&s)[0].clone();
    let fans: Vec<_> = s
        .iter()
        .filter(|x| x.name == "hw_fan_speed_ratio")
        .collect();
    assert_eq!(fans.len(), 2, "{fans:?}");
    for (n, f) in fans.iter().enumerate() {
        assert_eq!(f.labels["hw_id"], format!("{gpu}/fan{n}"));
        assert_eq!(f.labels["hw_parent"], gpu);
        assert_eq!(f.labels["hw_type"], "fan");
        assert_eq!(f.labels["hw_name"], format!("fan{n}"));
        assert_eq!(f.labels["hw_sensor_location"], format!("gpu_fan{n}"));
        close(Some(f.value), 0.41, "fan speed");
    }
    assert!(!body.contains("hw_fan_index"));
    assert!(agent.terminate().success());
}

/// GPM per MIG instance on a Hopper GPU: each instance's own activity, under its MIG UUID.
#[test]
fn gpm_per_mig_instance() {
    let mut agent = Agent::start("h100-mig.toml", "current");
    let body = agent.wait_for(Duration::from_secs(20), |m| {
        m.contains("gpu_mig_gpu_instance_id=\"5\"")
            && m.contains("gpu_sm_activity_ratio")
            && m.lines().any(|l| {
                l.starts_with("gpu_sm_activity_ratio")
                    && l.contains("gpu_mig_gpu_instance_id=\"3\"")
            })
    });
    let s = parse(&body);
    let gpu = support::uuids(&s)[0].clone();
    let gi = |n: &'static str| {
        [
            ("hw_id", gpu.clone()),
            ("gpu_mig_gpu_instance_id", n.to_string()),
        ]
    };
    let on = |name: &str, labels: &[(&str, String)]| {
        let l: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        value(&s, name, &l)
    };
    close(
        on("gpu_sm_activity_ratio", &gi("3")),
        0.71,
        "instance 3 SM activity",
    );
    close(
        on("gpu_sm_activity_ratio", &gi("5")),
        0.12,
        "instance 5 SM activity",
    );
    close(
        on("gpu_dram_activity_ratio", &gi("5")),
        0.04,
        "instance 5 DRAM",
    );
    let mut tensor = gi("3").to_vec();
    tensor.push(("gpu_pipe", "tensor".into()));
    close(
        on("gpu_pipe_activity_ratio", &tensor),
        0.40,
        "instance 3 tensor",
    );
    // GPU instance 5 holds two compute instances: sampled once, one series.
    let per_gi = s
        .iter()
        .filter(|x| {
            x.name == "gpu_sm_activity_ratio"
                && x.labels.get("gpu_mig_gpu_instance_id").map(String::as_str) == Some("5")
        })
        .count();
    assert_eq!(per_gi, 1, "one series per GPU instance");
    // Both compute instances of GPU instance 5 are MIG devices with their own memory.
    for uuid in [
        "MIG-4a5b6c7d-0000-5000-9000-000000000002",
        "MIG-4a5b6c7d-0000-5000-9000-000000000003",
    ] {
        let m = s
            .iter()
            .find(|x| x.name == "gpu_mig_memory_usage_bytes" && x.labels["hw_id"] == uuid)
            .unwrap_or_else(|| panic!("MIG device {uuid}"));
        assert_eq!(m.labels["gpu_mig_gpu_instance_id"], "5");
        assert_eq!(m.labels["hw_parent"], gpu);
    }
    // The whole GPU keeps its own GPM series (no instance label).
    let whole: Vec<_> = s
        .iter()
        .filter(|x| {
            x.name == "gpu_sm_activity_ratio"
                && x.labels["hw_id"] == gpu
                && !x.labels.contains_key("gpu_mig_gpu_instance_id")
        })
        .collect();
    assert_eq!(whole.len(), 1, "{whole:?}");
    close(Some(whole[0].value), 0.88, "GPU SM activity");
}

//! The IPMI source end to end against OpenIPMI's `ipmi_sim`, compared with what `ipmitool`
//! reads from the same simulator.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::bmc::{self, IpmiSim};
use crate::support::{self, Agent, parse, value};

use crate::bmc::{config, fixtures};

/// (name, value, unit, thresholds) as `ipmitool sensor` prints them.
type IpmitoolSensor = (String, Option<f64>, String, Vec<(&'static str, f64)>);

fn ipmitool(sim: &IpmiSim) -> Vec<IpmitoolSensor> {
    let out = support::output(std::process::Command::new("ipmitool").args([
        "-I",
        "lanplus",
        "-H",
        "127.0.0.1",
        "-p",
        &sim.server.port.to_string(),
        "-U",
        "monitor",
        "-P",
        "monpass",
        "-L",
        "USER",
        "sensor",
    ]));
    assert!(
        out.status.success(),
        "ipmitool failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').map(str::trim).collect();
            if f.len() < 10 {
                return None;
            }
            let t = |i: usize| f[i].parse::<f64>().ok();
            let mut th = Vec::new();
            for (i, n) in [
                (4, "lower_fatal"),
                (5, "lower_critical"),
                (6, "lower_caution"),
                (7, "upper_caution"),
                (8, "upper_critical"),
                (9, "upper_fatal"),
            ] {
                if let Some(x) = t(i) {
                    th.push((n, x));
                }
            }
            Some((f[0].to_string(), t(1), f[2].to_string(), th))
        })
        .collect()
}

/// IPMI's threshold names (as `ipmitool` heads its columns) as the conventions'
/// `hw.limit_type` (non-critical = degraded; non-recoverable has no name there).
fn spec_limit(t: &str) -> &'static str {
    match t {
        "lower_fatal" => "low.fatal",
        "lower_critical" => "low.critical",
        "lower_caution" => "low.degraded",
        "upper_caution" => "high.degraded",
        "upper_critical" => "high.critical",
        "upper_fatal" => "high.fatal",
        other => panic!("threshold {other}"),
    }
}

/// The metric an `ipmitool` unit column is exported as (IPMI's unit names, written out here
/// on their own).
fn ipmi_metric(unit: &str) -> &'static str {
    match unit {
        "degrees C" => "hw_temperature_celsius",
        "RPM" => "cooling_pump_speed_rpm",
        "Volts" => "hw_voltage_volts",
        "Watts" => "hw_power_watts",
        _ => "cooling_flow_L_per_min",
    }
}

fn ipmi_target(sim: &IpmiSim) -> String {
    let pw = support::temp_dir().join("ipmi-pw");
    std::fs::write(&pw, "monpass\n").expect("pw");
    format!(
        "\n[[sources.ipmi.targets]]\nname = \"sim\"\nhost = \"127.0.0.1\"\nport = {}\nusername = \"monitor\"\npassword_file = {:?}\nworkaround_flags = \"opensesspriv\"\ninterval_secs = 1\ntimeout_secs = 5\n",
        sim.server.port,
        pw.display().to_string()
    )
}

fn have_ipmi_tools() -> bool {
    ["ipmi_sim", "ipmitool", "ipmi-sensors", "sdrcomp"]
        .iter()
        // One guard call per tool, with the /usr/sbin path as its first choice (the guard
        // fails in CI, so a first call on PATH alone would never reach the fallback).
        .all(|t| support::require_tool(t, Some(PathBuf::from("/usr/sbin").join(t))).is_some())
}

/// `ipmi_sim` serving what `emu` writes, and an agent polling it every second (None where
/// the IPMI tools are missing outside CI, where the guard fails instead).
fn agent_on_sim(emu: impl FnOnce() -> String) -> Option<(IpmiSim, Agent)> {
    if !have_ipmi_tools() {
        return None;
    }
    let sim = IpmiSim::start(&emu());
    let agent = Agent::spawn_config(
        "h100-training.toml",
        &config(&ipmi_target(&sim), false, support::free_port()),
    );
    Some((sim, agent))
}

#[test]
fn ipmi_sim_values_equal_ipmitool_and_a_live_change_shows_at_the_next_poll() {
    let Some((sim, mut agent)) =
        agent_on_sim(|| std::fs::read_to_string(fixtures().join("ipmi/sim2.emu")).expect("emu"))
    else {
        return;
    };
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("junction_target_up{junction_source=\"ipmi\",junction_target=\"sim\"} 1")
    });
    let s = parse(&body);
    let reference = ipmitool(&sim);
    assert_eq!(reference.len(), 4, "{reference:?}");
    for (name, v, unit, _) in &reference {
        assert!(v.is_some(), "ipmitool reads {name}: {reference:?}");
        let metric = ipmi_metric(unit);
        let got = value(&s, metric, &[("hw_name", name), ("junction_target", "sim")]);
        assert_eq!(
            got, *v,
            "{name} ({unit}) as {metric}: junction {got:?}, ipmitool {v:?}"
        );
    }
    // Pushed over its critical threshold through the simulator's console (the oracle sees it
    // first: what follows is Junction's part).
    sim.console("sensor_set_value 0x20 0 1 95 1");
    assert_eq!(
        ipmitool(&sim)
            .iter()
            .find(|r| r.0 == "GPU1 Temp")
            .and_then(|r| r.1),
        Some(95.0),
        "the simulator took the change"
    );
    let body = agent.wait_for(Duration::from_secs(15), |m| {
        let s = parse(m);
        value(&s, "hw_temperature_celsius", &[("hw_name", "GPU1 Temp")]) == Some(95.0)
    });
    let s = parse(&body);
    // Its state as the conventions' hw.status of a temperature sensor: failed.
    assert_eq!(
        value(
            &s,
            "hw_status",
            &[
                ("hw_name", "GPU1 Temp"),
                ("hw_type", "temperature"),
                ("hw_state", "failed")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&s, "bmc_sensor_state", &[("hw_name", "GPU1 Temp")]),
        None
    );
}

#[test]
fn ipmi_thresholds_equal_ipmitool_and_a_leak_is_critical() {
    let emu = || {
        format!(
            "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02\nsel_enable 0x20 1000 0x0a\n{}\
         sensor_add 0x20 0 1 0x01 0x01\nsensor_set_value 0x20 0 1 55 0\nsensor_set_threshold 0x20 0 1 settable 111000 100 90 80 0 0 0\n\
         sensor_add 0x20 0 2 0x01 0x01\nsensor_set_value 0x20 0 2 30 0\n\
         sensor_add 0x20 0 3 0x04 0x01\nsensor_set_value 0x20 0 3 60 0\n\
         sensor_add 0x20 0 4 0x0b 0x01\nsensor_set_value 0x20 0 4 84 0\nsensor_set_threshold 0x20 0 4 settable 000011 0 0 0 0 80 120\n\
         sensor_add 0x20 0 5 0x0a 0x03\nsensor_set_bit 0x20 0 5 0 1 0\nmc_enable 0x20\n",
            bmc::sdr_lines(&fixtures().join("ipmi/cooling.sdrs"))
        )
    };
    let Some((sim, mut agent)) = agent_on_sim(emu) else {
        return;
    };
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("cooling_leak_detector_state")
    });
    let s = parse(&body);
    let mut compared = 0;
    for (name, _, unit, thresholds) in ipmitool(&sim) {
        for (t, v) in thresholds {
            compared += 1;
            // A temperature's thresholds as the conventions name them; the rest Junction's.
            let (metric, label, t) = if unit == "degrees C" {
                (
                    "hw_temperature_limit_celsius",
                    "hw_limit_type",
                    spec_limit(t),
                )
            } else {
                ("bmc_sensor_threshold", "bmc_threshold", t)
            };
            assert_eq!(
                value(&s, metric, &[("hw_name", &name), (label, t)]),
                Some(v),
                "{name} {t}"
            );
        }
    }
    // GPU1 Temp has three readable thresholds, the coolant flow two.
    assert_eq!(compared, 5, "thresholds compared with ipmitool");
    // The host's heating margin (the conventions' hw.host.heating_margin): the least, over
    // the temperatures ipmitool reads, of the upper caution (else critical) threshold less
    // the reading.
    let want = ipmitool(&sim)
        .into_iter()
        .filter(|(_, _, unit, _)| unit == "degrees C")
        .filter_map(|(_, v, _, th)| {
            let upper = |n: &str| th.iter().find(|(k, _)| *k == n).map(|(_, x)| *x);
            Some(upper("upper_caution").or_else(|| upper("upper_critical"))? - v?)
        })
        .reduce(f64::min)
        .expect("a temperature with an upper threshold");
    assert_eq!(
        value(&s, "hw_host_heating_margin_celsius", &[]),
        Some(want),
        "heating margin"
    );
    assert_eq!(
        value(
            &s,
            "bmc_sensor_threshold",
            &[
                ("hw_name", "Coolant Flow"),
                ("bmc_threshold", "lower_critical")
            ]
        ),
        Some(40.0)
    );
    assert_eq!(
        value(
            &s,
            "cooling_leak_detector_state",
            &[("hw_name", "Leak Manifold"), ("cooling_leak_state", "ok")]
        ),
        Some(1.0)
    );
    // The flow drops below its lower critical threshold; the manifold gets wet.
    sim.console("sensor_set_value 0x20 0 4 50 1");
    sim.console("sensor_set_bit 0x20 0 5 0 0 0");
    sim.console("sensor_set_bit 0x20 0 5 1 1 1");
    let body = agent.wait_for(Duration::from_secs(15), |m| {
        let s = parse(m);
        value(
            &s,
            "cooling_leak_detector_state",
            &[
                ("hw_name", "Leak Manifold"),
                ("cooling_leak_state", "critical"),
            ],
        ) == Some(1.0)
            && value(&s, "cooling_flow_L_per_min", &[("hw_name", "Coolant Flow")]) == Some(25.0)
    });
    assert_eq!(
        value(
            &parse(&body),
            "bmc_sensor_state",
            &[
                ("hw_name", "Coolant Flow"),
                ("bmc_sensor_state", "critical")
            ]
        ),
        Some(1.0)
    );
}

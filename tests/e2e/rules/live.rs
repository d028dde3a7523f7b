//! The rules and dashboards against a real Prometheus (Debian's) scraping Junction on a
//! simulated node: on a faulty node every rule expression and dashboard query returns data;
//! on a healthy one no alert but the informational ones fires.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{config_dir, dashboard_exprs, promtool, rule_exprs};
use crate::support::bmc::DynamicBmc;
use crate::support::prometheus::{Prometheus, query};
use crate::support::{self, Agent};

fn start_prometheus(target_port: u16) -> Option<Prometheus> {
    Prometheus::start(
        target_port,
        Some(&config_dir().join("prometheus/junction-rules.yml")),
    )
}

/// A cooling loop whose readings a test controls. Faulty: a coolant flow under its critical
/// threshold, a pressure past its caution, a leak warning (it degrades the node's GPUs; a
/// critical one would fail them and hide the forecast's verdict), and a supply temperature
/// rising toward its upper threshold. Healthy: the same sensors and thresholds, each reading
/// well inside them and steady, and the leak detector OK.
fn cdu(faulty: bool) -> DynamicBmc {
    DynamicBmc::start(move |path, t| {
        let (flow, pressure, supply, leak) = if faulty {
            (18.0, 260.0, (30.0 + t * 0.25).round(), "Warning")
        } else {
            (40.0, 180.0, 31.0, "OK")
        };
        let r = "/redfish/v1";
        let sensor = |id: &str, extra: Value| {
            let mut d =
                json!({"@odata.id": format!("{r}/Chassis/CDU/Sensors/{id}"), "Id": id, "Name": id});
            for (k, v) in extra.as_object().expect("object") {
                d[k] = v.clone();
            }
            d
        };
        let members = |base: &str, names: &[&str]| json!({"Members": names.iter().map(|n| json!({"@odata.id": format!("{r}{base}/{n}")})).collect::<Vec<_>>()});
        Some(match path.trim_start_matches(r) {
            "" => json!({"@odata.id": r, "Chassis": {"@odata.id": format!("{r}/Chassis")}}),
            "/Chassis" => members("/Chassis", &["CDU"]),
            "/Chassis/CDU" => {
                json!({"Name": "CDU", "Sensors": {"@odata.id": format!("{r}/Chassis/CDU/Sensors")}, "LeakDetectors": {"@odata.id": format!("{r}/Chassis/CDU/LeakDetectors")}, "ThermalSubsystem": {"@odata.id": format!("{r}/Chassis/CDU/ThermalSubsystem")}})
            }
            "/Chassis/CDU/ThermalSubsystem" => {
                json!({"CoolantConnectors": {"@odata.id": format!("{r}/Chassis/CDU/ThermalSubsystem/CoolantConnectors")}, "Pumps": {"@odata.id": format!("{r}/Chassis/CDU/ThermalSubsystem/Pumps")}})
            }
            "/Chassis/CDU/ThermalSubsystem/CoolantConnectors" => {
                members("/Chassis/CDU/ThermalSubsystem/CoolantConnectors", &["Rack"])
            }
            "/Chassis/CDU/ThermalSubsystem/CoolantConnectors/Rack" => {
                json!({"Name": "Rack loop", "FlowLitersPerMinute": {"Reading": 18}, "SupplyTemperatureCelsius": {"Reading": 31}, "ReturnTemperatureCelsius": {"Reading": 44}, "HeatRemovedkW": {"Reading": 16.2}})
            }
            "/Chassis/CDU/ThermalSubsystem/Pumps" => {
                members("/Chassis/CDU/ThermalSubsystem/Pumps", &["P1"])
            }
            "/Chassis/CDU/ThermalSubsystem/Pumps/P1" => {
                json!({"Name": "Pump 1", "PumpSpeedPercent": {"Reading": 35, "SpeedRPM": 1400}})
            }
            "/Chassis/CDU/Sensors" => {
                members("/Chassis/CDU/Sensors", &["Flow", "Pressure", "Supply"])
            }
            "/Chassis/CDU/Sensors/Flow" => sensor(
                "Flow",
                json!({"Reading": flow, "ReadingType": "LiquidFlowLPM", "ReadingUnits": "L/min", "Thresholds": {"LowerCritical": {"Reading": 20}}}),
            ),
            "/Chassis/CDU/Sensors/Pressure" => sensor(
                "Pressure",
                json!({"Reading": pressure, "ReadingType": "PressurekPa", "ReadingUnits": "kPa", "Thresholds": {"UpperCaution": {"Reading": 250}}}),
            ),
            "/Chassis/CDU/Sensors/Supply" => sensor(
                "Supply",
                json!({"Reading": supply, "ReadingType": "Temperature", "ReadingUnits": "Cel", "PhysicalContext": "LiquidInlet", "Thresholds": {"UpperCaution": {"Reading": 60}}}),
            ),
            "/Chassis/CDU/LeakDetectors" => members("/Chassis/CDU/LeakDetectors", &["Tray"]),
            "/Chassis/CDU/LeakDetectors/Tray" => {
                json!({"Name": "Tray", "DetectorState": leak})
            }
            _ => return None,
        })
    })
}

const KERN_LINES: &str = "Dec  1 00:00:01 node kernel: [100.000001] NVRM: Xid (PCI:0000:2a:00): 48, pid=4242, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU (0x00000000).\n\
         Dec  1 00:00:02 node kernel: [100.000002] NVRM: Xid (PCI:0000:9a:00): 119, pid=4243, name=python3, Timeout after 6s of waiting for RPC response from GPU4 GSP!\n\
         Dec  1 00:00:03 node kernel: [100.000003] NVRM: Xid (PCI:0000:18:00): 13, pid=4244, name=python3, Graphics SM Warp Exception on (GPC 1, TPC 2, SM 0): Illegal Instruction Parameter\n\
         Dec  1 00:00:04 node kernel: [100.000004] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up\n";

/// A kernel-log file Junction follows (empty: it reads what is appended).
fn kmsg_file() -> PathBuf {
    let f = support::temp_dir().join("kern.log");
    std::fs::write(&f, "").expect("kern.log");
    f
}

fn append(f: &Path, text: &str) {
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .append(true)
        .open(f)
        .and_then(|mut h| h.write_all(text.as_bytes()))
        .expect("append");
}

/// The node's sysfs (`testkit::sysfs::hgx`, the simulator's bus addresses) in `sim_config`'s
/// place; `faulty`: mlx5_3's port down.
fn with_sysfs(config: String, faulty: bool) -> String {
    const BUSES: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
    let node = testkit::sysfs::hgx(&support::temp_dir().join("sys"), &BUSES, true);
    if faulty {
        let p = &node.rails[3].1;
        testkit::sysfs::set(&p.join("state"), "1: DOWN");
        testkit::sysfs::set(&p.join("phys_state"), "3: Disabled");
    }
    support::with_sysfs_root(&config, &node.tree.root)
}

fn junction_config(port: u16, cdu: u16, kern: &Path) -> String {
    let unreachable = support::free_port();
    let pw = support::temp_dir().join("pw");
    std::fs::write(&pw, "x\n").expect("pw");
    // Eight NIC ports expected, one down; nine GPUs expected on the bus, eight there.
    with_sysfs(support::sim_config("current", port, ""), true).replace(
        support::EBPF_OFF,
        "[sources.ebpf]\nwatch_devices = [\"/dev/null\"]\nexited_retention_secs = 600\n",
    ) + "\n[sources.nic]\ninterval_secs = 1\nexpected_ports = 8\n\n[sources.pcie]\ninterval_secs = 1\nexpected_gpus = 9\n"
        + &format!(
            "\n[sources.kmsg]\ndevice = \"\"\nfiles = [{:?}]\n\
             \n[[sources.redfish.targets]]\nname = \"cdu\"\nurl = \"http://127.0.0.1:{cdu}\"\ninterval_secs = 1\n\
             \n[[sources.redfish.targets]]\nname = \"down\"\nurl = \"http://127.0.0.1:{unreachable}\"\ninterval_secs = 1\ntimeout_secs = 1\n\
             \n[[sources.ipmi.targets]]\nname = \"down\"\nhost = \"127.0.0.1\"\nport = {unreachable}\nusername = \"x\"\npassword_file = {:?}\ninterval_secs = 2\ntimeout_secs = 1\n\
             \n[health]\ninterval_secs = 1\nforecast_window_secs = 20\nforecast_horizon_secs = 30\nforecast_persist = 3\n",
            kern.display().to_string(),
            pw.display().to_string()
        )
}

/// Queries every expression until each has returned data once (or the deadline); returns
/// those that never did.
fn until_all_have_data(
    prom: &Prometheus,
    exprs: &[(String, String)],
    limit: Duration,
) -> Vec<String> {
    let mut pending: BTreeMap<String, String> = exprs
        .iter()
        .cloned()
        .map(|(n, e)| (format!("{n}: {e}"), e))
        .collect();
    let start = Instant::now();
    let mut errors = Vec::new();
    while !pending.is_empty() && start.elapsed() < limit {
        pending.retain(|name, e| match query(prom, e) {
            Ok(n) => n == 0,
            Err(err) => {
                errors.push(format!("{name}: {err}"));
                false
            }
        });
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        errors.is_empty(),
        "queries Prometheus rejects:\n{}",
        errors.join("\n")
    );
    pending.into_keys().collect()
}

#[test]
fn every_rule_and_dashboard_query_returns_data_against_a_real_prometheus() {
    if crate::ebpf::cannot_run() {
        return;
    }
    let Some(_) = promtool() else { return };
    let port = support::free_port();
    let Some(prom) = start_prometheus(port) else {
        return;
    };
    let cdu = cdu(true);
    let kern = kmsg_file();
    let config = junction_config(port, cdu.port, &kern);
    let mut agent = Agent::spawn_config("faulty-node.toml", &config);
    agent.wait_for(Duration::from_secs(60), |m| m.contains("gpu_info{"));
    // XIDs and an SXid, once: each counter appears at 1, as on a real node, and the XID
    // alerts must fire on that first one.
    std::thread::sleep(Duration::from_secs(3));
    append(&kern, KERN_LINES);
    // A process that uses a GPU through the driver (eBPF attribution on the watched device).
    let workload =
        crate::ebpf::spawn_workload("basic", "GPU-8f6b2c1a-0000-4000-8000-00115dfa5726", 9);

    // What needs the agent gone or a GPU gone is checked afterwards.
    const LATER: [&str; 2] = ["GpuMissing", "JunctionDown"];
    // What needs a component of the agent to panic again and again, which nothing outside
    // can make it do: its expression must be accepted and its input have data here, and
    // promtool's test (junction-rules.test.yml) gives it panics.
    const NEEDS_A_PANIC: &str = "JunctionComponentRestarting";
    let all: Vec<(String, String)> = rule_exprs().into_iter().chain(dashboard_exprs()).collect();
    let now: Vec<(String, String)> = all
        .iter()
        .filter(|(n, _)| !LATER.contains(&n.as_str()) && n != NEEDS_A_PANIC)
        .cloned()
        .collect();
    let panics: Vec<&(String, String)> = all.iter().filter(|(n, _)| n == NEEDS_A_PANIC).collect();
    assert_eq!(panics.len(), 1, "the {NEEDS_A_PANIC} alert: {panics:?}");
    if let Err(e) = query(&prom, &panics[0].1) {
        panic!("Prometheus rejects {NEEDS_A_PANIC}: {e}");
    }
    let input = [(
        "its input".to_string(),
        "junction_source_errors_total".to_string(),
    )];
    let mut missing = until_all_have_data(&prom, &input, Duration::from_secs(60));
    missing.extend(until_all_have_data(&prom, &now, Duration::from_secs(150)));
    let reasons = support::scrape(agent.port, Duration::from_secs(5))
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.starts_with("gpu_health_reason{")
                || (l.starts_with("hw_status{") && !l.ends_with(" 0"))
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        missing.is_empty(),
        "no data for:\n{}\nhealth now:\n{reasons}\njunction log:\n{}",
        missing.join("\n"),
        agent.log()
    );
    workload.finish();

    // The node's last GPU disappears (the driver lists seven after a restart).
    agent.terminate();
    let mut agent = Agent::spawn_config("faulty-node-7.toml", &config);
    agent.wait_for(Duration::from_secs(60), |m| m.contains("gpu_info{"));
    let gone: Vec<(String, String)> = all
        .iter()
        .filter(|(n, _)| n == "GpuMissing")
        .cloned()
        .collect();
    // A renamed alert would leave nothing to check here.
    assert_eq!(gone.len(), 1, "the GpuMissing alert: {gone:?}");
    let missing = until_all_have_data(&prom, &gone, Duration::from_secs(30));
    assert!(missing.is_empty(), "no data for {missing:?}");
    // The agent stops.
    agent.terminate();
    let down: Vec<(String, String)> = all
        .iter()
        .filter(|(n, _)| n == "JunctionDown")
        .cloned()
        .collect();
    assert_eq!(down.len(), 1, "the JunctionDown alert: {down:?}");
    let missing = until_all_have_data(&prom, &down, Duration::from_secs(30));
    assert!(missing.is_empty(), "no data for {missing:?}");
}

/// The names of the alerting rules (not the recording rules) and their severities.
fn alerts() -> BTreeMap<String, String> {
    let text =
        std::fs::read_to_string(config_dir().join("prometheus/junction-rules.yml")).expect("rules");
    let mut out = BTreeMap::new();
    let mut name = None;
    for l in text.lines().map(str::trim_start) {
        if let Some(n) = l.strip_prefix("- alert: ") {
            name = Some(n.trim().to_string());
        } else if l.starts_with("- record: ") {
            name = None;
        } else if let (Some(n), Some(sev)) = (&name, l.strip_prefix("labels: {severity: ")) {
            out.insert(n.clone(), sev.trim_end_matches('}').trim().to_string());
        }
    }
    out
}

/// The other half of the test above: on a node with nothing wrong — the training node's
/// GPUs, none warming, a cooling loop inside every threshold, an empty kernel log — no
/// alerting expression but the informational ones returns a series, for 30 s of scrapes,
/// once Prometheus has every input those expressions read.
#[test]
fn on_a_healthy_node_no_alert_fires() {
    let Some(_) = promtool() else { return };
    let port = support::free_port();
    let Some(prom) = start_prometheus(port) else {
        return;
    };
    let cdu = cdu(false);
    let kern = kmsg_file();
    let config = with_sysfs(support::sim_config("current", port, ""), false)
        + "\n[sources.nic]\ninterval_secs = 1\nexpected_ports = 8\nexpected_rate_gbps = 400\n\n[sources.pcie]\ninterval_secs = 1\nexpected_gpus = 8\n"
        + &format!(
            "\n[sources.kmsg]\ndevice = \"\"\nfiles = [{:?}]\n\
             \n[[sources.redfish.targets]]\nname = \"cdu\"\nurl = \"http://127.0.0.1:{}\"\ninterval_secs = 1\n\
             \n[health]\ninterval_secs = 1\nforecast_window_secs = 20\nforecast_horizon_secs = 30\nforecast_persist = 3\n",
            kern.display().to_string(),
            cdu.port
        );
    let mut agent = Agent::spawn_config("healthy-node.toml", &config);
    agent.wait_for(Duration::from_secs(60), |m| m.contains("gpu_info{"));

    let alerts = alerts();
    let all = rule_exprs();
    let (alerting, recording): (Vec<_>, Vec<_>) =
        all.into_iter().partition(|(n, _)| alerts.contains_key(n));
    assert_eq!(
        alerting.len(),
        alerts.len(),
        "every alert has one expression: {alerts:?}"
    );
    let checked: Vec<(String, String)> = alerting
        .into_iter()
        .filter(|(n, _)| alerts[n] != "info")
        .collect();
    assert!(
        checked.len() >= 15,
        "the rules file lost its alerts: {checked:?}"
    );
    // The inputs first: every recording rule, each GPU's status, the cooling loop's
    // sensors and leak detector, the sources' and the targets' state, and the scrape.
    // No XID happened, so there is no XID counter (it appears with the first).
    let inputs: Vec<(String, String)> = recording
        .into_iter()
        .filter(|(_, e)| !e.contains("gpu_xid_errors_total"))
        .chain(
            [
                ("scrape", "up{job=\"junction\"} == 1"),
                ("gpus", "count(hw_status{hw_type=\"gpu\", junction_target=\"\", hw_state=\"ok\"} == 1) == 8"),
                ("flow", "bmc_sensor_state{hw_type=\"flow\"}"),
                ("pressure", "bmc_sensor_state{hw_type=\"pressure\"}"),
                ("coolant", "hw_temperature_celsius{hw_sensor_location=\"liquid_inlet\"}"),
                ("coolant state", "hw_status{hw_type=\"temperature\", junction_target=\"cdu\"}"),
                ("leak", "cooling_leak_detector_state"),
                ("nic ports", "count(hw_status{hw_type=\"network\", hw_state=\"ok\"} == 1) == 10"),
                ("pcie", "pcie_aer_errors_total"),
                ("targets", "junction_target_up == 1"),
                ("sources", "junction_source_up == 1"),
                ("clock events", "gpu_clock_event_active"),
                ("remapping", "gpu_memory_remap_pending"),
            ]
            .map(|(n, e)| (n.to_string(), e.to_string())),
        )
        .collect();
    let missing = until_all_have_data(&prom, &inputs, Duration::from_secs(90));
    assert!(
        missing.is_empty(),
        "no data for:\n{}\njunction log:\n{}",
        missing.join("\n"),
        agent.log()
    );
    let start = Instant::now();
    let mut fired = BTreeSet::new();
    while start.elapsed() < Duration::from_secs(30) {
        for (name, e) in &checked {
            match query(&prom, e) {
                Ok(0) => {}
                Ok(n) => {
                    fired.insert(format!("{name} ({n} series): {e}"));
                }
                Err(err) => panic!("Prometheus rejects {name}: {err}"),
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        fired.is_empty(),
        "alerts that fire on a healthy node:\n{}",
        fired.into_iter().collect::<Vec<_>>().join("\n")
    );
    assert!(agent.terminate().success());
}

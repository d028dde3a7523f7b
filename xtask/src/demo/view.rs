//! The demo's live view: what one scrape of `/metrics` and the OTLP receiver show, rendered
//! for the screen, and what each part showed, for `--for` and the test.

use std::collections::BTreeMap;

use testkit::prom::{Series, find, gpus_by_index, try_parse};

use super::receiver;

fn one(s: &[Series], name: &str, want: &[(&str, &str)]) -> Option<f64> {
    find(s, name, want).first().map(|x| x.value)
}

/// What the demo's parts showed, for `--for` and the test.
#[derive(Default)]
pub(super) struct Shown {
    pub(super) forecast: Option<String>,
    pub(super) workload: Option<String>,
    pub(super) xids: BTreeMap<u32, String>,
    pub(super) coolant_alarm: Option<String>,
    pub(super) ipmi: Option<String>,
}

fn short(uuid: &str) -> String {
    if uuid.len() > 12 {
        format!("{}…{}", &uuid[..8], &uuid[uuid.len() - 4..])
    } else {
        uuid.to_string()
    }
}

/// Renders the live view from one scrape and what the receiver got; records what was shown.
pub(super) fn view(
    page: &str,
    seen: &receiver::Seen,
    t: f64,
    (listen, missing): (&str, &[(String, String)]),
    notes: &[String],
    shown: &mut Shown,
) -> String {
    let s = try_parse(page).unwrap_or_default();
    let mut out = String::new();
    let gpus = gpus_by_index(&s);
    out.push_str(&format!(
        "Junction demo · {} simulated GPUs · t = {t:.0} s · Ctrl-C stops everything\n",
        gpus.len()
    ));
    // What cannot run, first: where a part is missing from the view, and how to bring it.
    for (part, command) in missing {
        out.push_str(&format!("MISSING: {part}; to bring it: {command}\n"));
    }
    out.push('\n');
    out.push_str(
        "GPU  UUID           util   HBM °C  die °C  health             reasons / forecast\n",
    );
    for (i, id) in &gpus {
        let h = [("hw_id", id.as_str())];
        let util = one(
            &s,
            "hw_gpu_utilization_ratio",
            &[h[0], ("hw_gpu_task", "general")],
        );
        let hbm = one(
            &s,
            "hw_temperature_celsius",
            &[h[0], ("hw_sensor_location", "memory_junction")],
        );
        let die = one(
            &s,
            "hw_temperature_celsius",
            &[h[0], ("hw_sensor_location", "gpu_die")],
        );
        let state = find(&s, "hw_status", &h)
            .iter()
            .find(|x| x.value == 1.0)
            .and_then(|x| x.labels.get("hw_state").cloned())
            .unwrap_or_else(|| "-".into());
        let mut reasons: Vec<String> = find(&s, "gpu_health_reason", &h)
            .iter()
            .filter(|x| x.value == 1.0)
            .filter_map(|x| x.labels.get("gpu_health_reason").cloned())
            .collect();
        if let Some(secs) = one(
            &s,
            "gpu_temperature_time_to_threshold_seconds",
            &[h[0], ("hw_sensor_location", "memory_junction")],
        ) {
            let f = format!("HBM reaches its limit in {secs:.0} s");
            if shown.forecast.is_none() {
                shown.forecast = Some(format!("GPU {i} {f} (at t = {t:.0} s)"));
            }
            reasons.push(f);
        }
        let f = |v: Option<f64>, scale: f64| v.map_or("-".into(), |v| format!("{:.0}", v * scale));
        out.push_str(&format!(
            "{i:<4} {:<14} {:>4}%  {:>6}  {:>6}  {:<18} {}\n",
            short(id),
            f(util, 100.0),
            hbm.map_or("-".into(), |v| format!("{v:.1}")),
            f(die, 1.0),
            state,
            reasons.join(", ")
        ));
    }

    out.push_str("\nProcesses seen by eBPF (driver calls on the GPU device)\n");
    let procs = find(&s, "gpu_process_driver_memory_usage_bytes", &[]);
    if procs.is_empty() {
        out.push_str("  (none yet)\n");
    }
    for p in &procs {
        let l = |k: &str| p.labels.get(k).cloned().unwrap_or_else(|| "-".into());
        let pid = l("process_pid");
        let calls: f64 = find(
            &s,
            "gpu_process_driver_calls_total",
            &[("process_pid", &pid)],
        )
        .iter()
        .map(|x| x.value)
        .sum();
        let gpu = gpus
            .iter()
            .find(|(_, id)| *id == l("hw_id"))
            .map_or("-".to_string(), |(i, _)| i.to_string());
        let container = l("container_id");
        let line = format!(
            "  pid {pid:<7} {:<10} container {:<14} GPU {gpu}  {:.0} MiB live, {calls:.0} driver calls",
            l("process_executable_name"),
            short(&container),
            p.value / 1048576.0
        );
        if shown.workload.is_none() && l("process_executable_name") == "trainer" {
            shown.workload = Some(line.trim().to_string());
        }
        out.push_str(&line);
        out.push('\n');
    }

    out.push_str("\nXID errors (counted from the kernel log; events arrive over OTLP)\n");
    let xids = find(&s, "gpu_xid_errors_total", &[]);
    let mut any = false;
    for x in &xids {
        let id = x.labels.get("hw_id").cloned().unwrap_or_default();
        let Some((i, _)) = gpus.iter().find(|(_, g)| *g == id) else {
            continue;
        };
        any = true;
        let code: u32 = x
            .labels
            .get("gpu_xid")
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let line = format!(
            "GPU {i}  Xid {code:<4} {:<13} x{:.0}",
            x.labels
                .get("gpu_xid_category")
                .cloned()
                .unwrap_or_default(),
            x.value
        );
        shown.xids.entry(code).or_insert_with(|| line.clone());
        out.push_str(&format!("  {line}\n"));
    }
    if !any {
        out.push_str("  (none yet)\n");
    }
    // (A first start reads the whole kernel ring: earlier runs' lines name GPUs by PCI address.)
    for l in seen
        .recent_logs
        .iter()
        .filter(|l| l.contains("gpu.xid") && l.contains("hw.id=GPU-"))
        .rev()
        .take(3)
    {
        out.push_str(&format!(
            "  otlp: {}\n",
            l.chars().take(150).collect::<String>()
        ));
    }

    out.push_str("\nCoolant loop (CDU over Redfish) and board sensors (BMC over IPMI)\n");
    let flows = find(&s, "cooling_flow_L_per_min", &[]);
    let flows = if flows.is_empty() {
        s.iter()
            .filter(|x| x.name.starts_with("cooling_flow"))
            .collect()
    } else {
        flows
    };
    for fl in flows.iter().take(4) {
        let name = fl.labels.get("hw_name").cloned().unwrap_or_default();
        let target = fl
            .labels
            .get("junction_target")
            .cloned()
            .unwrap_or_default();
        out.push_str(&format!("  {target}/{name}: {:.1} L/min\n", fl.value));
    }
    for st in find(&s, "bmc_sensor_state", &[])
        .iter()
        .filter(|x| x.value == 1.0)
    {
        let state = st
            .labels
            .get("bmc_sensor_state")
            .cloned()
            .unwrap_or_default();
        if state == "ok" {
            continue;
        }
        let name = st.labels.get("hw_name").cloned().unwrap_or_default();
        let line = format!("{name} is {state}");
        if name.to_lowercase().contains("flow")
            && (shown.coolant_alarm.is_none() || state == "critical")
            && !shown
                .coolant_alarm
                .as_deref()
                .is_some_and(|a| a.contains("critical"))
        {
            shown.coolant_alarm = Some(format!("{line} (at t = {t:.0} s)"));
        }
        out.push_str(&format!("  ALARM: {line}\n"));
    }
    // A BMC's temperature, voltage or fan sensor past its thresholds (the conventions' state).
    for st in find(&s, "hw_status", &[])
        .iter()
        .filter(|x| x.value == 1.0 && x.labels.contains_key("junction_target"))
    {
        let state = st.labels.get("hw_state").cloned().unwrap_or_default();
        if state != "ok" {
            let name = st.labels.get("hw_name").cloned().unwrap_or_default();
            out.push_str(&format!("  ALARM: {name} is {state}\n"));
        }
    }
    let ipmi: Vec<&Series> = s
        .iter()
        .filter(|x| {
            x.labels.get("junction_target").map(String::as_str) == Some("bmc")
                && x.name == "hw_temperature_celsius"
        })
        .collect();
    for x in ipmi.iter().take(3) {
        let line = format!(
            "bmc/{}: {:.0} °C",
            x.labels.get("hw_name").cloned().unwrap_or_default(),
            x.value
        );
        if shown.ipmi.is_none() {
            shown.ipmi = Some(format!("{line} (at t = {t:.0} s)"));
        }
        out.push_str(&format!("  {line}\n"));
    }

    out.push_str(&format!(
        "\nOTLP receiver: {} metric exports ({} points in the last), {} log records\n",
        seen.metric_exports, seen.last_points, seen.log_records
    ));
    out.push_str(&format!(
        "/metrics: http://{listen}/metrics · OTLP output: target/demo/otlp.log · Junction log: target/demo/junction.log\n\
         dashboards: config/grafana/*.json (import into Grafana with a Prometheus scraping /metrics)\n"
    ));
    for n in notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

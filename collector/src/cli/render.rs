//! What `junction once` and `junction inventory` print: a per-GPU table like `nvidia-smi`,
//! JSON, and the inventory with each GPU's health verdict, reasons and action.

use std::fmt::Write as _;

use crate::model::health::{Reason, action, verdict};
use crate::model::{GpuSlot, Metric, Model};

/// Metric names that have samples on this GPU.
fn supported(g: &GpuSlot) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = g
        .groups
        .iter()
        .flat_map(|v| v.iter())
        .map(|s| s.metric.desc().name)
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

fn health_json(reasons: &[Reason]) -> serde_json::Value {
    serde_json::json!({
        "state": verdict(reasons),
        "action": action(reasons),
        "reasons": reasons,
    })
}

/// `junction once --format json`.
pub fn json(model: &Model) -> serde_json::Value {
    let gpus: Vec<_> = model
        .snapshot()
        .iter()
        .map(|g| {
            let metrics: Vec<_> = g
                .groups
                .iter()
                .flat_map(|v| v.iter())
                .map(|s| {
                    let attrs: serde_json::Map<String, serde_json::Value> = s
                        .attrs
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string().into()))
                        .collect();
                    serde_json::json!({ "name": s.metric.desc().name, "unit": s.metric.desc().unit, "attributes": attrs, "value": s.value })
                })
                .collect();
            let reasons = model.health.reasons(&g.info.uuid);
            serde_json::json!({ "gpu": &*g.info, "health": health_json(&reasons), "metrics": metrics })
        })
        .collect();
    serde_json::json!({ "driver": model.driver(), "gpus": gpus, "bmc": bmc_json(model) })
}

/// What every BMC target reported.
fn bmc_json(model: &Model) -> Vec<serde_json::Value> {
    model
        .bmc_polls()
        .iter()
        .map(|(source, p)| serde_json::json!({ "source": source, "target": p.target, "components": p.components, "readings": p.readings }))
        .collect()
}

/// The unit a BMC reading is shown in.
fn reading_unit(r: &crate::model::bmc::Reading) -> String {
    use crate::model::bmc::Quantity;
    match r.quantity {
        Quantity::Other => r.unit.clone(),
        Quantity::Temperature | Quantity::CoolantTemperature => "C".into(),
        Quantity::Power | Quantity::Heat => "W".into(),
        Quantity::Energy => "J".into(),
        Quantity::Voltage => "V".into(),
        Quantity::FanRpm | Quantity::PumpRpm => "RPM".into(),
        Quantity::Flow => "L/min".into(),
        Quantity::Pressure => "kPa".into(),
        Quantity::FanRatio
        | Quantity::PumpRatio
        | Quantity::Humidity
        | Quantity::Level
        | Quantity::Valve => "ratio".into(),
        Quantity::Leak => String::new(),
    }
}

/// BMC targets' readings, as a table.
fn bmc_table(model: &Model, out: &mut String) {
    for (source, p) in model.bmc_polls() {
        let _ = writeln!(
            out,
            "\nBMC {} ({source}): {} components, {} readings\n{:<44} {:>14} {:<8} {:<8} Where",
            p.target,
            p.components.len(),
            p.readings.len(),
            "Sensor",
            "Reading",
            "Unit",
            "State",
        );
        for r in &p.readings {
            let value = if r.quantity == crate::model::bmc::Quantity::Leak {
                crate::model::bmc::LEAK_STATES
                    .get(r.value as usize)
                    .copied()
                    .unwrap_or("?")
                    .to_string()
            } else if r.value.is_nan() {
                "-".into()
            } else {
                format!("{:.3}", r.value)
                    .trim_end_matches('0')
                    .trim_end_matches('.')
                    .to_string()
            };
            let mut name = r.name.clone();
            if let Some(p) = r.point {
                name = format!("{name} ({p})");
            }
            let name = clip(&name, 44);
            let _ = writeln!(
                out,
                "{:<44} {:>14} {:<8} {:<8} {}",
                name,
                value,
                reading_unit(r),
                r.state.map_or("-", |l| l.as_str()),
                r.parent.as_deref().unwrap_or(&r.id)
            );
        }
    }
}

/// `junction inventory --format json`.
pub fn inventory_json(model: &Model) -> serde_json::Value {
    let gpus: Vec<_> = model
        .snapshot()
        .iter()
        .map(|g| {
            let reasons = model.health.reasons(&g.info.uuid);
            serde_json::json!({
                "gpu": &*g.info,
                "health": health_json(&reasons),
                "rail": model.fabric.rail(&g.info.pci_bus_id),
                "supported_metrics": supported(g),
                "disabled": &*g.disabled,
            })
        })
        .collect();
    serde_json::json!({ "driver": model.driver(), "gpus": gpus, "sources": model.source_details(), "bmc": bmc_json(model) })
}

/// `junction inventory`.
pub fn inventory_table(model: &Model) -> String {
    let mut out = String::new();
    if let Some(d) = model.driver() {
        let _ = writeln!(
            out,
            "Driver {}  CUDA {}  NVML {}",
            d.driver_version,
            d.cuda_version.unwrap_or_default(),
            d.nvml_version.unwrap_or_default()
        );
    }
    for g in &model.snapshot() {
        let i = &g.info;
        let reasons = model.health.reasons(&i.uuid);
        let _ = writeln!(out, "\nGPU {}  {}  {}", i.index, i.uuid, i.name);
        let _ = writeln!(
            out,
            "  pci {}  serial {}  minor {}  vbios {}",
            i.pci_bus_id,
            i.serial.as_deref().unwrap_or("-"),
            i.minor_number
                .map(|m| m.to_string())
                .unwrap_or_else(|| "-".into()),
            i.vbios.as_deref().unwrap_or("-"),
        );
        let rail = model.fabric.rail(&i.pci_bus_id);
        if !rail.is_empty() {
            let r: Vec<String> = rail
                .iter()
                .map(|r| format!("{} ({})", r.device, r.affinity.as_str()))
                .collect();
            let _ = writeln!(out, "  rail {}", r.join(", "));
        }
        let _ = writeln!(
            out,
            "  health {}  action {}",
            verdict(&reasons).as_str(),
            action(&reasons)
        );
        for r in &reasons {
            let _ = writeln!(out, "    {} ({}): {}", r.code, r.state.as_str(), r.detail);
        }
        let _ = writeln!(out, "  supported: {}", supported(g).join(", "));
        if g.disabled.is_empty() {
            let _ = writeln!(out, "  disabled: none");
        } else {
            let _ = writeln!(out, "  disabled:");
            for (feature, why) in g.disabled.iter() {
                let _ = writeln!(out, "    {feature}: {why}");
            }
        }
    }
    for (source, lines) in model.source_details() {
        let _ = writeln!(out, "\nSource {source}:");
        for l in lines {
            let _ = writeln!(out, "  {l}");
        }
    }
    for (source, p) in model.bmc_polls() {
        let _ = writeln!(out, "\nBMC target {} ({source}):", p.target);
        for c in &p.components {
            let health = c.health.map_or("-", |h| h.as_str());
            let _ = writeln!(
                out,
                "  {:<18} {:<40} health {:<8} {}",
                c.hw_type, c.name, health, c.id
            );
        }
        let _ = writeln!(out, "  readings: {}", p.readings.len());
        for n in &p.notes {
            let _ = writeln!(out, "  note: {n}");
        }
    }
    out
}

/// The value of `metric` on a GPU whose attributes match `attrs`.
fn find(g: &GpuSlot, metric: Metric, attrs: &[(&str, &str)]) -> Option<f64> {
    g.groups
        .iter()
        .flat_map(|v| v.iter())
        .find(|s| s.metric == metric && attrs.iter().all(|(k, v)| s.attr(k) == Some(v)))
        .map(|s| s.value)
}

fn fmt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

/// A per-GPU table like `nvidia-smi`, with each GPU's health.
pub fn table(model: &Model) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let mut out = String::new();
    if let Some(d) = model.driver() {
        let _ = writeln!(
            out,
            "Driver {}  CUDA {}",
            d.driver_version,
            d.cuda_version.unwrap_or_default()
        );
    }
    let _ = writeln!(
        out,
        "{:>3}  {:<24} {:<13} {:>5} {:>5} {:>13} {:>19} {:>5} {:>8}  Health",
        "GPU", "Name", "Bus-Id", "Temp", "HBM", "Power/Cap", "Memory-Usage", "Util", "SM-Clock",
    );
    let snap = model.snapshot();
    for g in &snap {
        let temp = find(g, Metric::Temperature, &[("hw.sensor_location", "gpu_die")]);
        let hbm = find(
            g,
            Metric::Temperature,
            &[("hw.sensor_location", "memory_junction")],
        );
        let power = find(g, Metric::Power, &[]);
        let cap = find(
            g,
            Metric::PowerLimit,
            &[("gpu.power.limit_type", "enforced")],
        );
        let used = find(g, Metric::MemoryUsage, &[]);
        let total = find(g, Metric::MemoryLimit, &[]);
        let util = find(g, Metric::Utilization, &[("hw.gpu.task", "general")]);
        let sm = find(g, Metric::ClockFrequency, &[("gpu.clock.domain", "sm")]);
        let name = clip(&g.info.name, 24);
        let reasons = model.health.reasons(&g.info.uuid);
        let _ = writeln!(
            out,
            "{:>3}  {:<24} {:<13} {:>5} {:>5} {:>13} {:>19} {:>5} {:>8}  {}",
            g.info.index,
            name,
            g.info.pci_bus_id,
            fmt(temp, |v| format!("{v:.0}C")),
            fmt(hbm, |v| format!("{v:.0}C")),
            format!(
                "{}/{}",
                fmt(power, |v| format!("{v:.0}W")),
                fmt(cap, |v| format!("{v:.0}W"))
            ),
            format!(
                "{}/{}",
                fmt(used, |v| format!("{:.0}MiB", v / MIB)),
                fmt(total, |v| format!("{:.0}MiB", v / MIB))
            ),
            fmt(util, |v| format!("{:.0}%", v * 100.0)),
            fmt(sm, |v| format!("{:.0}MHz", v / 1e6)),
            verdict(&reasons).as_str(),
        );
    }
    let procs: Vec<_> = snap
        .iter()
        .flat_map(|g| {
            g.groups
                .iter()
                .flat_map(|v| v.iter())
                .filter(|s| s.metric == Metric::ProcessMemory)
                .map(move |s| (g, s))
        })
        .collect();
    if !procs.is_empty() {
        let _ = writeln!(
            out,
            "\nProcesses:\n{:>3}  {:>8}  {:<9} {:<24} {:>12}  {:<12}  {:<36}",
            "GPU", "PID", "Type", "Name", "GPU Memory", "Container", "Pod UID"
        );
        for (g, s) in procs {
            let container: String = s
                .attr("container.id")
                .unwrap_or("-")
                .chars()
                .take(12)
                .collect();
            let _ = writeln!(
                out,
                "{:>3}  {:>8}  {:<9} {:<24} {:>9.0}MiB  {:<12}  {:<36}",
                g.info.index,
                s.attr("process.pid").unwrap_or("-"),
                s.attr("gpu.process.type").unwrap_or("-"),
                s.attr("process.executable.name").unwrap_or("-"),
                s.value / MIB,
                container,
                s.attr("k8s.pod.uid").unwrap_or("-"),
            );
        }
    }
    bmc_table(model, &mut out);
    for g in &snap {
        for r in model.health.reasons(&g.info.uuid) {
            let _ = writeln!(
                out,
                "GPU {}: {} ({}; action: {})",
                g.info.index,
                r.detail,
                r.state.as_str(),
                r.action
            );
        }
    }
    out
}

/// At most `n` characters of outside text (a BMC's sensor name, a GPU's product name), cut at
/// a character, never inside one.
fn clip(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// `junction history`: one line per event, each boot's first line saying which boot it is.
pub fn history_table(entries: &[crate::model::history::Entry]) -> String {
    let mut out = String::new();
    let mut boot = None;
    for e in entries {
        if boot != Some(e.boot.as_str()) {
            boot = Some(e.boot.as_str());
            let _ = writeln!(
                out,
                "boot {}",
                if e.boot.is_empty() { "-" } else { &e.boot }
            );
        }
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(e.ms);
        let pid = e.pid.map(|p| format!(" pid {p}")).unwrap_or_default();
        let _ = writeln!(
            out,
            "  {}  {:<44} {:<9} {:<24}{pid}  {}",
            humantime::format_rfc3339_seconds(t),
            e.id,
            e.kind,
            e.code,
            e.detail
        );
    }
    if entries.is_empty() {
        out.push_str("nothing recorded in this window\n");
    }
    out
}

#[cfg(test)]
mod tests {
    /// Names from a BMC are cut at a character (`truncate` inside one panicked).
    #[test]
    fn clipping_names_never_splits_a_character() {
        let name = "Température de l’entrée du liquide — circuit secondaire °C";
        assert_eq!(super::clip(name, 44).chars().count(), 44);
        assert_eq!(super::clip("ü", 24), "ü");
        for n in 0..80 {
            let _ = super::clip(name, n);
        }
    }
}

//! The nic source's series and its lines in `junction inventory`.

use std::collections::BTreeMap;

use super::read::LinkLayer;
use super::{NicConfig, State, Track};
use crate::model::fabric::Rail;
use crate::model::{HealthState, Metric, Model, Sample};

/// The standard counters that are traffic, not errors.
fn traffic(name: &str) -> Option<(Metric, &'static str, u64)> {
    Some(match name {
        "port_xmit_data" => (Metric::NetworkIo, "transmit", 4),
        "port_rcv_data" => (Metric::NetworkIo, "receive", 4),
        "port_xmit_packets" => (Metric::NetworkPackets, "transmit", 1),
        "port_rcv_packets" => (Metric::NetworkPackets, "receive", 1),
        _ => return None,
    })
}

/// EFA's traffic counters (in `hw_counters/`).
fn efa_traffic(name: &str) -> Option<(Metric, &'static str, u64)> {
    Some(match name {
        "tx_bytes" => (Metric::NetworkIo, "transmit", 1),
        "rx_bytes" => (Metric::NetworkIo, "receive", 1),
        "tx_pkts" => (Metric::NetworkPackets, "transmit", 1),
        "rx_pkts" => (Metric::NetworkPackets, "receive", 1),
        _ => return None,
    })
}

/// Standard counters that count no error.
const NOT_ERRORS: [&str; 5] = [
    "port_xmit_wait",
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "multicast_xmit_packets",
    "multicast_rcv_packets",
];

fn base(key: &str, t: &Track, metric: Metric, value: f64) -> Sample {
    Sample::new(metric, value)
        .with("hw.id", key.to_string())
        .with("hw.type", "network")
        .with("hw.name", t.device.clone())
        .with("nic.port", t.num.to_string())
}

/// Publishes every port's series, each GPU's rail, and the node's shortfall of ports.
pub fn publish(model: &Model, s: &State, rails: &BTreeMap<String, Vec<Rail>>, cfg: &NicConfig) {
    let mut out = Vec::new();
    let mut lines = Vec::new();
    let mut active = 0;
    let gpus: Vec<(String, u32)> = model
        .snapshot()
        .iter()
        .filter_map(|g| {
            Some((
                crate::model::fabric::normalize_bdf(&g.info.pci_bus_id)?,
                g.info.index,
            ))
        })
        .collect();
    for (key, t) in &s.ports {
        let Some(p) = &t.port else { continue };
        let up = t.present && p.up();
        let rate_ok = cfg.expected_rate_gbps <= 0.0
            || p.rate_gbps.is_some_and(|r| r >= cfg.expected_rate_gbps);
        active += usize::from(up && rate_ok && p.link_layer == LinkLayer::InfiniBand);
        out.push(base(key, t, Metric::NetworkUp, f64::from(u8::from(up))));
        if let Some(r) = p.rate_gbps.filter(|_| t.present) {
            out.push(base(key, t, Metric::NetworkBandwidthLimit, r * 1e9 / 8.0));
        }
        for (kind, st) in [("state", &p.state), ("phys_state", &p.phys)] {
            if let Some((code, _)) = st.as_ref().filter(|_| t.present) {
                out.push(
                    base(key, t, Metric::NicPortState, f64::from(*code))
                        .with("nic.port.state_type", kind),
                );
            }
        }
        let netdev = p.netdev.clone().unwrap_or_default();
        out.push(
            base(key, t, Metric::NicInfo, 1.0)
                .with("nic.link_layer", p.link_layer.as_str())
                .with("network.interface.name", netdev.clone())
                .with("nic.pci.bdf", t.info.pci.clone())
                .with("nic.numa_node", t.info.numa.clone())
                .with("hw.firmware_version", t.info.firmware.clone())
                .with("hw.model", t.info.model.clone())
                .with("nic.driver", t.info.driver.clone()),
        );
        counter_samples(key, t, p.link_layer, &mut out);
        let state = t.state.unwrap_or(HealthState::Ok);
        for st in [HealthState::Ok, HealthState::Degraded, HealthState::Failed] {
            out.push(
                base(key, t, Metric::Status, f64::from(u8::from(st == state)))
                    .with("hw.state", st.as_str()),
            );
        }
        for code in t.last_true.keys() {
            out.push(base(key, t, Metric::NicReason, 1.0).with("nic.health.reason", code.as_str()));
        }
        let st = |s: &Option<(u8, String)>| s.as_ref().map_or("-".to_string(), |s| s.1.clone());
        let mut line = format!(
            "{} port {}: {} {}/{} {} Gb/s, pci {}, numa {}, fw {}{} — {}",
            t.device,
            t.num,
            p.link_layer.as_str(),
            st(&p.state),
            st(&p.phys),
            p.rate_gbps.map_or("-".into(), |r| r.to_string()),
            or_dash(&t.info.pci),
            or_dash(&t.info.numa),
            or_dash(&t.info.firmware),
            if netdev.is_empty() {
                String::new()
            } else {
                format!(", netdev {netdev}")
            },
            state.as_str()
        );
        if !t.present {
            line.push_str(" (gone)");
        }
        lines.push(line);
        // The other side of the rail: the GPUs this NIC serves.
        let serves: Vec<String> = gpus
            .iter()
            .filter(|(bdf, _)| {
                rails
                    .get(bdf)
                    .is_some_and(|r| r.iter().any(|r| r.device == t.device))
            })
            .map(|(bdf, index)| format!("GPU {index} ({bdf})"))
            .collect();
        if !serves.is_empty() {
            lines.push(format!("  rail of {}", serves.join(", ")));
        }
        for (code, (_, detail, _)) in &t.last_true {
            lines.push(format!("  {code}: {detail}"));
        }
    }
    for slot in model.snapshot() {
        let Some(rail) =
            crate::model::fabric::normalize_bdf(&slot.info.pci_bus_id).and_then(|b| rails.get(&b))
        else {
            continue;
        };
        for r in rail {
            out.push(
                Sample::new(Metric::GpuRail, 1.0)
                    .with("hw.id", slot.info.uuid.clone())
                    .with("nic.device", r.device.clone())
                    .with("gpu.rail.affinity", r.affinity.as_str()),
            );
        }
    }
    if cfg.expected_ports > 0 && active < cfg.expected_ports as usize {
        out.push(Sample::new(Metric::NodeReason, 1.0).with("node.health.reason", "ports_missing"));
        lines.push(format!(
            "node: {active} port(s) active{}, expected {}",
            if cfg.expected_rate_gbps > 0.0 {
                format!(" at ≥ {} Gb/s", cfg.expected_rate_gbps)
            } else {
                String::new()
            },
            cfg.expected_ports
        ));
    }
    if s.ports.is_empty() {
        lines.insert(0, "no RDMA devices (nothing under class/infiniband)".into());
    }
    model.set_source_detail("nic", lines);
    model.publish("nic", "ports", out);
}

/// A port's counters: traffic as `hw.network.*`, the IBTA error counters as `hw.errors`, the
/// rest as `nic.counter`.
fn counter_samples(key: &str, t: &Track, layer: LinkLayer, out: &mut Vec<Sample>) {
    for ((driver, name), (c, _)) in &t.counters {
        let total = c.total();
        let mapped = if *driver {
            efa_traffic(name).filter(|_| layer == LinkLayer::Efa)
        } else {
            traffic(name)
        };
        if let Some((metric, dir, scale)) = mapped {
            out.push(
                base(key, t, metric, total.saturating_mul(scale) as f64)
                    .with("network.io.direction", dir),
            );
        } else if !*driver && !NOT_ERRORS.contains(&name.as_str()) {
            out.push(
                base(key, t, Metric::EccErrors, total as f64).with("error.type", name.clone()),
            );
        } else {
            out.push(
                base(key, t, Metric::NicCounter, total as f64)
                    .with("nic.counter", name.clone())
                    .with(
                        "nic.counter.source",
                        if *driver { "hw_counters" } else { "counters" },
                    ),
            );
        }
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

//! The node around the GPU end to end: the real `junction` on the simulator's 8-GPU training
//! node, with `sysfs_root` pointing at a tree in the kernel's layout (`testkit::sysfs::hgx`:
//! eight InfiniBand rails behind four two-level PCIe switches, a RoCE port, an EFA device,
//! the GPUs' PCI functions at the simulator's bus addresses with AER files). The tree changes
//! while the agent runs — a port goes down, symbol errors burst, a GPU's link trains down, a
//! fatal AER, a GPU appears on the bus that NVML does not list — and each change must show
//! as its metric and its reason on the right NIC and the right GPU, and on no other.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::{self, Agent, parse, value};
use testkit::sysfs::{self as tree, Node};

const BUSES: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

fn config(port: u16, node: &Node) -> String {
    support::with_sysfs_root(&support::sim_config("current", port, ""), &node.tree.root)
        + "\n[sources.nic]\ninterval_secs = 1\nexpected_rate_gbps = 400\n\
         \n[sources.pcie]\ninterval_secs = 1\nlink_grace_secs = 2\n\
         \n[health]\ninterval_secs = 1\n"
}

/// GPU index → UUID, from `gpu_info`.
fn uuids(page: &str) -> BTreeMap<usize, String> {
    support::uuids(&parse(page))
        .into_iter()
        .enumerate()
        .collect()
}

/// The GPUs (by index) that carry `reason`.
fn gpus_with(page: &str, uuids: &BTreeMap<usize, String>, reason: &str) -> Vec<usize> {
    let s = parse(page);
    uuids
        .iter()
        .filter(|(_, u)| {
            value(
                &s,
                "gpu_health_reason",
                &[("hw_id", u), ("gpu_health_reason", reason)],
            ) == Some(1.0)
        })
        .map(|(i, _)| *i)
        .collect()
}

fn state_of(page: &str, hw_id: &str) -> Option<String> {
    parse(page)
        .into_iter()
        .find(|s| {
            s.name == "hw_status"
                && s.value == 1.0
                && s.labels.get("hw_id").map(String::as_str) == Some(hw_id)
        })
        .and_then(|s| {
            s.labels
                .get("hw_state")
                .map(String::as_str)
                .map(str::to_string)
        })
}

#[test]
fn rails_ports_links_and_aer_move_the_right_nic_and_gpu() {
    let node = tree::hgx(&support::temp_dir().join("sys"), &BUSES, true);
    let port = support::free_port();
    let cfg = config(port, &node);
    let mut agent = Agent::spawn_config("h100-training.toml", &cfg);
    let page = agent.wait_for(Duration::from_secs(60), |m| {
        m.matches("gpu_rail{").count() == 8 && m.contains("pcie_link_width{")
    });
    let ids = uuids(&page);
    assert_eq!(ids.len(), 8);
    let s = parse(&page);
    for (i, u) in &ids {
        let nic = format!("mlx5_{i}");
        assert_eq!(
            value(
                &s,
                "gpu_rail",
                &[
                    ("hw_id", u),
                    ("nic_device", &nic),
                    ("gpu_rail_affinity", "switch")
                ]
            ),
            Some(1.0),
            "GPU {i}'s rail"
        );
        let id = format!("{nic}/1");
        assert_eq!(value(&s, "hw_network_up", &[("hw_id", &id)]), Some(1.0));
        assert_eq!(state_of(&page, &id).as_deref(), Some("ok"));
    }
    assert_eq!(
        value(
            &s,
            "hw_network_bandwidth_limit_bytes_per_second",
            &[("hw_id", "mlx5_0/1")]
        ),
        Some(50e9)
    );
    assert_eq!(
        value(
            &s,
            "nic_info",
            &[
                ("hw_id", "mlx5_8/1"),
                ("network_interface_name", "ens8np0"),
                ("nic_link_layer", "ethernet")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "nic_info",
            &[("hw_id", "efa_0/1"), ("nic_link_layer", "efa")]
        ),
        Some(1.0)
    );
    // `junction inventory` prints each GPU's rail.
    let cfg_file = support::temp_dir().join("inventory.toml");
    std::fs::write(&cfg_file, &cfg).expect("config");
    let out = support::inventory(&cfg_file, Some("h100-training.toml"));
    let text = String::from_utf8_lossy(&out.stdout);
    for (i, u) in &ids {
        let gpu = text
            .split("\nGPU ")
            .find(|b| b.contains(u.as_str()))
            .unwrap_or("");
        assert!(
            gpu.contains(&format!("rail mlx5_{i} (switch)")),
            "GPU {i}:\n{text}"
        );
    }
    assert!(
        text.contains("mlx5_8 port 1: ethernet ACTIVE/LinkUp 100 Gb/s"),
        "{text}"
    );
    assert!(
        text.contains("mlx5_5 port 1: infiniband ACTIVE/LinkUp 400 Gb/s, pci 0000:c5:00.0, numa 1, fw 28.41.1000 — ok\n    rail of GPU 5 (0000:ab:00.0)\n"),
        "{text}"
    );

    // mlx5_3 goes down: the port fails, GPU 3 (and only GPU 3) is degraded by its rail.
    let p3 = &node.rails[3].1;
    tree::set(&p3.join("state"), "1: DOWN");
    tree::set(&p3.join("phys_state"), "3: Disabled");
    let page = agent.wait_for(Duration::from_secs(30), |m| {
        state_of(m, "mlx5_3/1").as_deref() == Some("failed")
            && m.contains("gpu_health_reason=\"rail_degraded\"")
    });
    let s = parse(&page);
    assert_eq!(
        value(&s, "hw_network_up", &[("hw_id", "mlx5_3/1")]),
        Some(0.0)
    );
    assert_eq!(
        value(
            &s,
            "nic_health_reason",
            &[("hw_id", "mlx5_3/1"), ("nic_health_reason", "port_down")]
        ),
        Some(1.0)
    );
    assert_eq!(gpus_with(&page, &ids, "rail_degraded"), vec![3]);
    assert_eq!(state_of(&page, "mlx5_2/1").as_deref(), Some("ok"));

    // A burst of symbol errors on mlx5_5: an error rate on that port, GPU 5 degraded too.
    tree::set(&node.rails[5].1.join("counters/symbol_error"), "500");
    let page = agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("nic_health_reason{") && gpus_with(m, &ids, "rail_degraded") == vec![3, 5]
    });
    let s = parse(&page);
    assert_eq!(
        value(
            &s,
            "nic_health_reason",
            &[("hw_id", "mlx5_5/1"), ("nic_health_reason", "error_rate")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "hw_errors_total",
            &[("hw_id", "mlx5_5/1"), ("error_type", "symbol_error")]
        ),
        Some(500.0)
    );

    // GPU 6's link trains down to x8; a fatal AER on GPU 7.
    tree::set(&node.gpus[6].join("current_link_width"), "8");
    node.tree.aer(
        &node.gpus[7],
        "aer_dev_fatal",
        &[("Surprise Down Error", 1)],
        1,
    );
    let page = agent.wait_for(Duration::from_secs(30), |m| {
        gpus_with(m, &ids, "pcie_link_degraded") == vec![6]
            && gpus_with(m, &ids, "pcie_aer_fatal") == vec![7]
    });
    assert_eq!(state_of(&page, &ids[&7]).as_deref(), Some("failed"));
    let s = parse(&page);
    assert_eq!(
        value(
            &s,
            "pcie_link_width",
            &[("hw_id", &ids[&6]), ("pcie_link_state", "current")]
        ),
        Some(8.0)
    );
    assert_eq!(
        value(
            &s,
            "pcie_aer_error_types_total",
            &[("hw_id", &ids[&7]), ("error_type", "Surprise Down Error")]
        ),
        Some(1.0)
    );

    // An NVIDIA GPU appears on the bus that NVML does not list.
    let rp = "0000:0f:1f.0";
    node.tree.port(&["pci0000:e8", rp], 1);
    let g = node
        .tree
        .function(&["pci0000:e8", rp, "0000:e9:00.0"], 0x10de, 0x030200, 1);
    node.tree
        .link_state(&g, "32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16);
    let page = agent.wait_for(Duration::from_secs(30), |m| {
        state_of(m, "PCI-0000:e9:00").as_deref() == Some("failed")
    });
    let s = parse(&page);
    assert_eq!(
        value(
            &s,
            "gpu_health_reason",
            &[
                ("hw_id", "PCI-0000:e9:00"),
                ("gpu_health_reason", "not_in_nvml")
            ]
        ),
        Some(1.0)
    );
    // None of this touched the GPUs it was not about.
    for i in [0, 1, 2, 4] {
        let reasons: Vec<String> = parse(&page)
            .into_iter()
            .filter(|x| {
                x.name == "gpu_health_reason"
                    && x.labels.get("hw_id").map(String::as_str) == Some(ids[&i].as_str())
            })
            .filter_map(|x| {
                x.labels
                    .get("gpu_health_reason")
                    .map(String::as_str)
                    .map(str::to_string)
            })
            .collect();
        assert!(
            reasons.iter().all(|r| ![
                "rail_degraded",
                "pcie_link_degraded",
                "pcie_aer_fatal",
                "pcie_aer_nonfatal"
            ]
            .contains(&r.as_str())),
            "GPU {i}: {reasons:?}"
        );
    }
    assert!(agent.terminate().success());
}

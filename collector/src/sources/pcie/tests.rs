//! The pcie source against sysfs trees in the kernel's layout (`testkit::sysfs`).

use super::*;
use crate::model::GpuInfo;
use testkit::sysfs::{self as tree, Node};

const BUSES: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

/// A model whose NVML lists the GPUs at `buses`.
fn model_with(buses: &[u8]) -> Arc<Model> {
    let m = Model::new();
    for (i, b) in buses.iter().enumerate() {
        m.add_gpu(GpuInfo {
            index: i as u32,
            uuid: format!("GPU-{i}"),
            pci_bus_id: format!("00000000:{b:02X}:00.0"),
            ..GpuInfo::default()
        });
    }
    m
}

fn config(node: &Node, extra: &str) -> Config {
    let mut c: Config =
        toml::from_str(&format!("[sources.pcie]\nlink_grace_secs = 10\n{extra}")).expect("config");
    c.sysfs_root = node.tree.root.clone();
    c
}

fn value(m: &Model, metric: Metric, hw_id: &str, attrs: &[(&str, &str)]) -> Option<f64> {
    m.sets()
        .iter()
        .flat_map(|s| s.iter())
        .find(|s| {
            s.metric == metric
                && s.attr("hw.id") == Some(hw_id)
                && attrs.iter().all(|(k, v)| s.attr(k) == Some(v))
        })
        .map(|s| s.value)
}

fn codes(m: &Model, bdf: &str) -> Vec<Code> {
    m.fabric.findings(bdf).into_iter().map(|f| f.code).collect()
}

#[test]
fn aer_and_links_on_each_gpus_path_reach_that_gpu() {
    let n = tree::hgx(&testkit::temp_dir().join("sys"), &BUSES, true);
    let m = model_with(&BUSES);
    let c = config(&n, "");
    let mut s = State::default();
    let t0 = Instant::now();
    s.poll(&c, &m, t0);
    for b in BUSES {
        assert!(
            codes(&m, &format!("0000:{b:02x}:00.0")).is_empty(),
            "{b:02x}"
        );
    }
    let gpu = [("pcie.bdf", "0000:18:00.0")];
    assert_eq!(
        value(
            &m,
            Metric::PcieLinkWidth,
            "GPU-0",
            &[("pcie.link.state", "max")]
        ),
        Some(16.0)
    );
    assert_eq!(
        value(
            &m,
            Metric::PcieLinkSpeed,
            "GPU-0",
            &[("pcie.link.state", "current")]
        ),
        Some(32e9)
    );
    assert_eq!(
        value(
            &m,
            Metric::AerErrors,
            "GPU-0",
            &[("pcie.aer.severity", "fatal")]
        ),
        Some(0.0)
    );
    assert_eq!(value(&m, Metric::AerErrors, "GPU-0", &gpu), Some(0.0));

    // GPU 6's link trains down to x8; GPU 5's runs at Gen4 (idle, or a bad slot).
    let g6 = &n.gpus[6];
    tree::set(&g6.join("current_link_width"), "8");
    tree::set(&n.gpus[5].join("current_link_speed"), "16.0 GT/s PCIe");
    // A fatal AER (Surprise Down) logged by the switch port above GPU 7, and non-fatal
    // completion timeouts on GPU 1 itself.
    let above7 = &n.gpu_ports[7][2];
    n.tree.aer(
        above7,
        "aer_dev_fatal",
        &[("Undefined", 0), ("Surprise Down Error", 1)],
        1,
    );
    n.tree
        .aer(&n.gpus[1], "aer_dev_nonfatal", &[("CmpltTO", 3)], 3);
    s.poll(&c, &m, t0 + Duration::from_secs(1));
    assert_eq!(codes(&m, "0000:ba:00.0"), vec![Code::PcieLinkDegraded]);
    assert!(
        codes(&m, "0000:ab:00.0").is_empty(),
        "a slower link waits for its grace"
    );
    assert_eq!(codes(&m, "0000:db:00.0"), vec![Code::PcieAerFatal]);
    assert_eq!(codes(&m, "0000:2a:00.0"), vec![Code::PcieAerNonfatal]);
    assert!(
        codes(&m, "0000:9a:00.0").is_empty(),
        "GPU 4 shares nothing with them"
    );
    let f = m.fabric.findings("0000:db:00.0");
    assert!(f[0].detail.contains("the port"), "{}", f[0].detail);
    assert_eq!(f[0].state, HealthState::Failed);
    // GPU 6 shares GPU 7's switch, but not the leaf port that logged the error.
    assert!(!codes(&m, "0000:ba:00.0").contains(&Code::PcieAerFatal));
    let port_id = format!(
        "PCI-{}",
        above7.file_name().and_then(|f| f.to_str()).expect("a port")
    );
    assert_eq!(
        value(
            &m,
            Metric::AerErrorTypes,
            &port_id,
            &[("error.type", "Surprise Down Error")]
        ),
        Some(1.0)
    );
    // Past the grace, the slow link counts; non-fatal errors that stopped raise nothing new.
    s.poll(&c, &m, t0 + Duration::from_secs(12));
    assert_eq!(codes(&m, "0000:ab:00.0"), vec![Code::PcieLinkDegraded]);
    assert!(codes(&m, "0000:2a:00.0").is_empty());
    assert_eq!(
        codes(&m, "0000:db:00.0"),
        vec![Code::PcieAerFatal],
        "fatal holds until reset"
    );
}

#[test]
fn a_gpu_on_the_bus_that_nvml_does_not_list_fails_and_the_node_counts_its_gpus() {
    let n = tree::hgx(&testkit::temp_dir().join("sys"), &BUSES, true);
    // NVML lists seven: the one at 0000:db:00.0 did not initialise.
    let m = model_with(&BUSES[..7]);
    let c = config(&n, "expected_gpus = 8\n");
    let mut s = State::default();
    s.poll(&c, &m, Instant::now());
    let id = "PCI-0000:db:00";
    assert_eq!(
        value(&m, Metric::Status, id, &[("hw.state", "failed")]),
        Some(1.0)
    );
    assert_eq!(
        value(
            &m,
            Metric::HealthReason,
            id,
            &[("gpu.health.reason", "not_in_nvml")]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&m, Metric::AerErrors, id, &[("pcie.aer.severity", "fatal")]),
        Some(0.0)
    );
    assert!(
        m.sets()
            .iter()
            .flat_map(|s| s.iter())
            .all(|s| s.metric != Metric::NodeReason),
        "8 on the bus"
    );
    // It leaves the bus: the reason clears; the node is one short.
    std::fs::remove_file(n.tree.root.join("bus/pci/devices/0000:db:00.0")).expect("unlink");
    s.poll(&c, &m, Instant::now());
    assert!(m.health.reasons(id).is_empty());
    assert_eq!(
        value(&m, Metric::Status, id, &[("hw.state", "failed")]),
        None
    );
    let node = m.sets().iter().flat_map(|s| s.iter()).any(|s| {
        s.metric == Metric::NodeReason && s.attr("node.health.reason") == Some("gpus_missing")
    });
    assert!(node);
    let lines = m.source_details().get("pcie").cloned().unwrap_or_default();
    assert!(
        lines
            .iter()
            .any(|l| l == "7 NVIDIA GPU(s) on the bus, 7 in NVML, 8 expected"),
        "{lines:?}"
    );
}

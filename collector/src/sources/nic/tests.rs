//! The nic source against sysfs trees in the kernel's layout (`testkit::sysfs`),
//! polled at instants the tests choose.

use super::*;
use crate::model::{GpuInfo, Metric};
use std::path::Path;
use testkit::sysfs::{self as tree, Node};

const BUSES: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

fn model_with_gpus() -> Arc<Model> {
    let m = Model::new();
    for (i, b) in BUSES.iter().enumerate() {
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
        toml::from_str(&format!("[sources.nic]\nclear_after_secs = 5\n{extra}")).expect("config");
    c.sysfs_root = node.tree.root.clone();
    c
}

fn node(switches: bool) -> Node {
    let dir = testkit::temp_dir().join("sys");
    tree::hgx(&dir, &BUSES, switches)
}

/// The value of `metric` for `hw_id` whose attributes include `attrs`.
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

fn rails(m: &Model) -> Vec<Vec<(String, &'static str)>> {
    BUSES
        .iter()
        .map(|b| {
            m.fabric
                .rail(&format!("0000:{b:02x}:00.0"))
                .into_iter()
                .map(|r| (r.device, r.affinity.as_str()))
                .collect()
        })
        .collect()
}

#[test]
fn each_gpu_rail_from_the_switch_it_shares_or_its_numa_node() {
    let n = node(true);
    let m = model_with_gpus();
    State::default().poll(&config(&n, ""), &m, Instant::now());
    for (i, r) in rails(&m).iter().enumerate() {
        assert_eq!(r, &vec![(format!("mlx5_{i}"), "switch")], "GPU {i}");
    }
    assert_eq!(
        value(&m, Metric::GpuRail, "GPU-3", &[("nic.device", "mlx5_3")]),
        Some(1.0)
    );

    // Nothing shared but the NUMA node: every NIC of the GPU's node (the RoCE port's too).
    let n = node(false);
    let m = model_with_gpus();
    State::default().poll(&config(&n, ""), &m, Instant::now());
    let r = rails(&m);
    let names = |r: &[(String, &str)]| {
        r.iter()
            .map(|(d, a)| format!("{d}:{a}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(&r[0]),
        [
            "mlx5_0:numa",
            "mlx5_1:numa",
            "mlx5_2:numa",
            "mlx5_3:numa",
            "mlx5_8:numa"
        ]
    );
    assert_eq!(
        names(&r[7]),
        [
            "efa_0:numa",
            "mlx5_4:numa",
            "mlx5_5:numa",
            "mlx5_6:numa",
            "mlx5_7:numa"
        ]
    );
    // A configured rail wins over the tree.
    let m = model_with_gpus();
    let c = config(&n, "rails = { \"0000:18:00.0\" = \"mlx5_7, mlx5_6\" }\n");
    State::default().poll(&c, &m, Instant::now());
    assert_eq!(
        rails(&m)[0],
        vec![("mlx5_7".into(), "config"), ("mlx5_6".into(), "config")]
    );
}

#[test]
fn ports_their_kinds_and_their_traffic() {
    let n = node(true);
    let m = model_with_gpus();
    State::default().poll(&config(&n, ""), &m, Instant::now());
    let ib = [
        ("hw.type", "network"),
        ("hw.name", "mlx5_0"),
        ("nic.port", "1"),
    ];
    assert_eq!(value(&m, Metric::NetworkUp, "mlx5_0/1", &ib), Some(1.0));
    assert_eq!(
        value(&m, Metric::NetworkBandwidthLimit, "mlx5_0/1", &[]),
        Some(50e9)
    );
    // port_xmit_data counts octets divided by four.
    let tx = [("network.io.direction", "transmit")];
    assert_eq!(value(&m, Metric::NetworkIo, "mlx5_0/1", &tx), Some(4e6));
    assert_eq!(
        value(
            &m,
            Metric::EccErrors,
            "mlx5_0/1",
            &[("error.type", "symbol_error")]
        ),
        Some(0.0)
    );
    assert_eq!(
        value(
            &m,
            Metric::NicCounter,
            "mlx5_0/1",
            &[("nic.counter", "out_of_sequence")]
        ),
        Some(0.0)
    );
    assert_eq!(
        value(
            &m,
            Metric::NicCounter,
            "mlx5_0/1",
            &[("nic.counter", "lifespan")]
        ),
        None
    );
    let info = |id: &str, k: &str, v: &str| value(&m, Metric::NicInfo, id, &[(k, v)]);
    assert_eq!(info("mlx5_0/1", "nic.pci.bdf", "0000:c0:00.0"), Some(1.0));
    assert_eq!(
        info("mlx5_0/1", "hw.firmware_version", "28.41.1000"),
        Some(1.0)
    );
    assert_eq!(info("mlx5_0/1", "nic.driver", "mlx5_core"), Some(1.0));
    assert_eq!(info("mlx5_7/1", "nic.numa_node", "1"), Some(1.0));
    assert_eq!(
        info("mlx5_8/1", "network.interface.name", "ens8np0"),
        Some(1.0)
    );
    assert_eq!(info("mlx5_8/1", "nic.link_layer", "ethernet"), Some(1.0));
    assert_eq!(info("efa_0/1", "nic.link_layer", "efa"), Some(1.0));
    // EFA's traffic is in its driver counters.
    assert_eq!(
        value(
            &m,
            Metric::NetworkIo,
            "efa_0/1",
            &[("network.io.direction", "receive")]
        ),
        Some(8192.0)
    );
    assert_eq!(
        value(&m, Metric::Status, "mlx5_0/1", &[("hw.state", "ok")]),
        Some(1.0)
    );
}

#[test]
fn wraps_and_a_driver_reload_neither_go_back_nor_count_twice() {
    let n = node(true);
    let m = model_with_gpus();
    let c = config(&n, "");
    let mut s = State::default();
    let t0 = Instant::now();
    let port = &n.rails[1].1;
    let ooo = |m: &Model| {
        value(
            m,
            Metric::NicCounter,
            "mlx5_1/1",
            &[("nic.counter", "out_of_sequence")],
        )
    };
    let sym = |m: &Model| {
        value(
            m,
            Metric::EccErrors,
            "mlx5_1/1",
            &[("error.type", "symbol_error")],
        )
    };
    n.tree.counter(
        port,
        "hw_counters",
        "out_of_sequence",
        u64::from(u32::MAX) - 9,
    );
    n.tree.counter(port, "counters", "symbol_error", 7);
    s.poll(&c, &m, t0);
    assert_eq!(ooo(&m), Some(f64::from(u32::MAX) - 9.0));
    // The 32-bit Q-counter wraps: 10 to the top, 5 after it.
    n.tree.counter(port, "hw_counters", "out_of_sequence", 5);
    s.poll(&c, &m, t0 + Duration::from_secs(1));
    assert_eq!(ooo(&m), Some(f64::from(u32::MAX) + 6.0));
    // The driver is reloaded: the device goes, then comes back counting from zero.
    let dev = n.rails[1].0.clone();
    let pci = dev
        .parent()
        .and_then(Path::parent)
        .expect("pci")
        .to_path_buf();
    n.tree.remove_rdma(&dev);
    s.poll(&c, &m, t0 + Duration::from_secs(2));
    assert_eq!(value(&m, Metric::NetworkUp, "mlx5_1/1", &[]), Some(0.0));
    assert_eq!(
        value(
            &m,
            Metric::NicReason,
            "mlx5_1/1",
            &[("nic.health.reason", "port_absent")]
        ),
        Some(1.0)
    );
    assert_eq!(ooo(&m), Some(f64::from(u32::MAX) + 6.0), "kept while gone");
    // Still GPU 1's rail (not its neighbour's NIC): its absence degrades GPU 1.
    assert_eq!(rails(&m)[1], vec![("mlx5_1".to_string(), "switch")]);
    let f = m.fabric.findings("0000:2a:00.0");
    assert!(
        f.iter()
            .any(|f| f.code == Code::RailDegraded && f.detail.contains("port_absent")),
        "{f:?}"
    );
    let dev = n
        .tree
        .rdma(&pci, "mlx5_1", "mlx5_core", "28.41.1000", "MT4129");
    let port = n.tree.ib_port(
        &dev,
        1,
        "4: ACTIVE",
        "5: LinkUp",
        "400 Gb/sec (4X NDR)",
        "InfiniBand",
    );
    n.tree.counter(&port, "hw_counters", "out_of_sequence", 3);
    n.tree.counter(&port, "counters", "symbol_error", 2);
    s.poll(&c, &m, t0 + Duration::from_secs(3));
    assert_eq!(
        ooo(&m),
        Some(f64::from(u32::MAX) + 9.0),
        "3 more, not 3 in all"
    );
    assert_eq!(sym(&m), Some(9.0), "7 before, 2 since");
    assert_eq!(rails(&m)[1], vec![("mlx5_1".to_string(), "switch")]);
    // Absent was a reason; it holds for clear_after_secs, then clears.
    assert_eq!(
        value(&m, Metric::Status, "mlx5_1/1", &[("hw.state", "failed")]),
        Some(1.0)
    );
    s.poll(&c, &m, t0 + Duration::from_secs(9));
    assert_eq!(
        value(&m, Metric::Status, "mlx5_1/1", &[("hw.state", "ok")]),
        Some(1.0)
    );
}

#[test]
fn downs_flaps_rates_and_saturation() {
    let n = node(true);
    let m = model_with_gpus();
    let c = config(&n, "flap_transitions = 2\nexpected_rate_gbps = 400\n");
    let mut s = State::default();
    let t0 = Instant::now();
    let at = |secs: u64| t0 + Duration::from_secs(secs);
    s.poll(&c, &m, at(0));
    let p3 = &n.rails[3].1;
    let set = |p: &Path, f: &str, v: &str| tree::set(&p.join(f), v);
    let reason =
        |m: &Model, id: &str, r: &str| value(m, Metric::NicReason, id, &[("nic.health.reason", r)]);
    // Down, up, down, up: failed while down, then flapping.
    for (i, (st, ph)) in [
        ("1: DOWN", "3: Disabled"),
        ("4: ACTIVE", "5: LinkUp"),
        ("1: DOWN", "2: Polling"),
        ("4: ACTIVE", "5: LinkUp"),
    ]
    .iter()
    .enumerate()
    {
        set(p3, "state", st);
        set(p3, "phys_state", ph);
        s.poll(&c, &m, at(1 + i as u64));
        if i == 0 {
            assert_eq!(reason(&m, "mlx5_3/1", "port_down"), Some(1.0));
            assert_eq!(
                value(&m, Metric::Status, "mlx5_3/1", &[("hw.state", "failed")]),
                Some(1.0)
            );
            let f = m.fabric.findings("0000:5d:00.0");
            assert_eq!(f.len(), 1, "{f:?}");
            assert_eq!(f[0].code, Code::RailDegraded);
            assert!(f[0].detail.contains("mlx5_3 port 1"), "{}", f[0].detail);
            assert!(
                m.fabric.findings("0000:3a:00.0").is_empty(),
                "GPU 2's rail is fine"
            );
        }
    }
    assert_eq!(reason(&m, "mlx5_3/1", "port_flapping"), Some(1.0));
    // A rate below the expected one.
    set(&n.rails[4].1, "rate", "200 Gb/sec (2X NDR)");
    // A burst of symbol errors: 50 in one second.
    n.tree
        .counter(&n.rails[5].1, "counters", "symbol_error", 50);
    // A saturated 4-bit counter raises nothing after its first rise is counted.
    n.tree.counter(
        &n.rails[6].1,
        "counters",
        "excessive_buffer_overrun_errors",
        15,
    );
    s.poll(&c, &m, at(5));
    assert_eq!(reason(&m, "mlx5_4/1", "rate_below_expected"), Some(1.0));
    assert_eq!(reason(&m, "mlx5_5/1", "error_rate"), Some(1.0));
    assert_eq!(
        value(&m, Metric::Status, "mlx5_5/1", &[("hw.state", "degraded")]),
        Some(1.0)
    );
    assert_eq!(
        reason(&m, "mlx5_6/1", "fatal_counter"),
        None,
        "pinned at 15: no rate, no rise"
    );
    assert_eq!(reason(&m, "mlx5_0/1", "error_rate"), None);
    // 120 symbol errors within the hour fail the port.
    n.tree
        .counter(&n.rails[5].1, "counters", "symbol_error", 200);
    s.poll(&c, &m, at(100));
    assert_eq!(
        value(&m, Metric::Status, "mlx5_5/1", &[("hw.state", "failed")]),
        Some(1.0)
    );
    // link_downed rising is fatal at once.
    n.tree.counter(&n.rails[0].1, "counters", "link_downed", 1);
    s.poll(&c, &m, at(101));
    assert_eq!(reason(&m, "mlx5_0/1", "fatal_counter"), Some(1.0));
    // Every change of a port's verdict was an event.
    assert!(m.events.head() >= 5, "{}", m.events.head());
}

#[test]
fn a_node_without_rdma_devices_says_so() {
    let dir = testkit::temp_dir().join("sys");
    let t = tree::Tree::new(&dir);
    let m = model_with_gpus();
    let mut c = Config {
        sysfs_root: t.root.clone(),
        ..Config::default()
    };
    c.sources.nic.expected_ports = 8;
    State::default().poll(&c, &m, Instant::now());
    let d = m.source_details();
    let lines = d.get("nic").expect("nic lines");
    assert!(
        lines.iter().any(|l| l.contains("no RDMA devices")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("0 port(s) active") && l.contains("expected 8")),
        "{lines:?}"
    );
    assert!(
        m.sets()
            .iter()
            .flat_map(|s| s.iter())
            .any(|s| s.metric == Metric::NodeReason
                && s.attr("node.health.reason") == Some("ports_missing"))
    );
}

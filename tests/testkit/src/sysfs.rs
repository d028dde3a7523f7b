//! sysfs trees in the kernel's layout, for the nic and pcie sources: PCI functions under
//! `devices/pci<dddd:bb>/…` with `bus/pci/devices/<bdf>` links to them (as
//! `drivers/pci/probe.c` and the driver core make them), RDMA devices under their PCI function
//! (`<function>/infiniband/<dev>`) linked from `class/infiniband/<dev>`, with `device` linking
//! back (`Documentation/ABI/stable/sysfs-class-infiniband`), and AER files in the function's
//! directory (`Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats`). Values are
//! written in the formats those documents give ("4: ACTIVE", "400 Gb/sec (4X NDR)",
//! "32.0 GT/s PCIe", "<name> <count>" lines ending in TOTAL_ERR_*).

use std::path::{Path, PathBuf};

/// A sysfs tree under a directory of its own.
pub struct Tree {
    /// Its root (what `sysfs_root` points at).
    pub root: PathBuf,
}

/// Writes a sysfs attribute (a newline after the value, as the kernel's `sysfs_emit` does),
/// replacing it in one step so that a reader never sees half a value.
pub fn set(path: &Path, value: &str) {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).expect("attribute dir");
    }
    let tmp = path.with_extension("junction-tmp");
    std::fs::write(&tmp, format!("{value}\n")).expect("write attribute");
    std::fs::rename(&tmp, path).expect("rename attribute");
}

fn link(target: &Path, at: &Path) {
    if let Some(d) = at.parent() {
        std::fs::create_dir_all(d).expect("link dir");
    }
    let _ = std::fs::remove_file(at);
    std::os::unix::fs::symlink(target, at).expect("symlink");
}

impl Tree {
    /// An empty tree at `root`.
    pub fn new(root: &Path) -> Tree {
        let _ = std::fs::remove_dir_all(root);
        for d in [
            "devices",
            "bus/pci/devices",
            "bus/pci/drivers",
            "class/infiniband",
            "class/net",
        ] {
            std::fs::create_dir_all(root.join(d)).expect("tree");
        }
        Tree {
            root: root.to_path_buf(),
        }
    }

    /// A PCI function at `chain` (host bridge first, e.g. `["pci0000:15", "0000:15:01.0",
    /// "0000:16:00.0"]`, the function last) with its vendor, class and NUMA node; the ports
    /// above it must have been made first. Returns its directory.
    pub fn function(&self, chain: &[&str], vendor: u32, class: u32, numa: i32) -> PathBuf {
        let dir = chain
            .iter()
            .fold(self.root.join("devices"), |p, c| p.join(c));
        std::fs::create_dir_all(&dir).expect("function dir");
        set(&dir.join("vendor"), &format!("0x{vendor:04x}"));
        set(&dir.join("class"), &format!("0x{class:06x}"));
        set(&dir.join("numa_node"), &numa.to_string());
        let bdf = chain.last().expect("a function");
        link(&dir, &self.root.join("bus/pci/devices").join(bdf));
        dir
    }

    /// A PCIe port (a bridge, class 0x060400) at `chain`.
    pub fn port(&self, chain: &[&str], numa: i32) -> PathBuf {
        self.function(chain, 0x10b5, 0x060400, numa)
    }

    /// The link attributes of a function.
    pub fn link_state(&self, dev: &Path, speed: &str, width: u32, max_speed: &str, max_width: u32) {
        set(&dev.join("current_link_speed"), speed);
        set(&dev.join("current_link_width"), &width.to_string());
        set(&dev.join("max_link_speed"), max_speed);
        set(&dev.join("max_link_width"), &max_width.to_string());
    }

    /// An AER file (`aer_dev_correctable`, `aer_dev_nonfatal`, `aer_dev_fatal`): the named
    /// bits, then the total.
    pub fn aer(&self, dev: &Path, file: &str, bits: &[(&str, u64)], total: u64) {
        let total_name = match file {
            "aer_dev_correctable" => "TOTAL_ERR_COR",
            "aer_dev_nonfatal" => "TOTAL_ERR_NONFATAL",
            _ => "TOTAL_ERR_FATAL",
        };
        let mut text: Vec<String> = bits.iter().map(|(n, v)| format!("{n} {v}")).collect();
        text.push(format!("{total_name} {total}"));
        set(&dev.join(file), &text.join("\n"));
    }

    /// An RDMA device under the PCI function `pci` (bound to `driver`). Returns its
    /// directory (`<pci>/infiniband/<name>`).
    pub fn rdma(&self, pci: &Path, name: &str, driver: &str, fw: &str, hca: &str) -> PathBuf {
        let dir = pci.join("infiniband").join(name);
        std::fs::create_dir_all(dir.join("ports")).expect("rdma dir");
        set(&dir.join("fw_ver"), fw);
        set(&dir.join("hca_type"), hca);
        set(&dir.join("node_type"), "1: CA");
        link(pci, &dir.join("device"));
        let drv = self.root.join("bus/pci/drivers").join(driver);
        std::fs::create_dir_all(&drv).expect("driver dir");
        link(&drv, &pci.join("driver"));
        link(&dir, &self.root.join("class/infiniband").join(name));
        dir
    }

    /// Removes an RDMA device (its driver unloaded): its class link and its directory.
    pub fn remove_rdma(&self, dev: &Path) {
        let name = dev.file_name().expect("name");
        let _ = std::fs::remove_file(self.root.join("class/infiniband").join(name));
        let _ = std::fs::remove_dir_all(dev);
    }

    /// A port of an RDMA device: state and physical state as `"<n>: <NAME>"`, the rate as
    /// the IB core prints it, the link layer.
    pub fn ib_port(
        &self,
        dev: &Path,
        n: u32,
        state: &str,
        phys: &str,
        rate: &str,
        layer: &str,
    ) -> PathBuf {
        let p = dev.join("ports").join(n.to_string());
        set(&p.join("state"), state);
        set(&p.join("phys_state"), phys);
        set(&p.join("rate"), rate);
        set(&p.join("link_layer"), layer);
        std::fs::create_dir_all(p.join("counters")).expect("counters");
        p
    }

    /// A counter of a port (`dir`: "counters" or "hw_counters").
    pub fn counter(&self, port: &Path, dir: &str, name: &str, value: u64) {
        set(&port.join(dir).join(name), &value.to_string());
    }

    /// A netdev of a PCI function, also named by the port's first GID (RoCE).
    pub fn netdev(&self, pci: &Path, port: &Path, name: &str) {
        let dir = pci.join("net").join(name);
        std::fs::create_dir_all(&dir).expect("netdev");
        set(&dir.join("operstate"), "up");
        link(&dir, &self.root.join("class/net").join(name));
        set(&port.join("gid_attrs/ndevs/0"), name);
        set(&port.join("gid_attrs/types/0"), "RoCE v2");
    }
}

/// An 8-GPU node's PCIe tree and RDMA devices.
pub struct Node {
    /// The tree.
    pub tree: Tree,
    /// Each GPU's PCI function directory (in the order given).
    pub gpus: Vec<PathBuf>,
    /// The ports above each GPU (root port first).
    pub gpu_ports: Vec<Vec<PathBuf>>,
    /// The InfiniBand rails: `mlx5_<i>`'s device directory and its port 1.
    pub rails: Vec<(PathBuf, PathBuf)>,
    /// The RoCE device `mlx5_8`'s port 1 and its netdev name.
    pub roce: (PathBuf, String),
    /// The EFA device `efa_0`'s port 1.
    pub efa: PathBuf,
}

/// Standard counters of an IB port, as a quiet HDR/NDR port shows them.
pub const QUIET: [(&str, u64); 10] = [
    ("symbol_error", 0),
    ("link_downed", 0),
    ("link_error_recovery", 0),
    ("port_rcv_errors", 0),
    ("port_xmit_discards", 0),
    ("excessive_buffer_overrun_errors", 0),
    ("local_link_integrity_errors", 0),
    ("port_xmit_data", 1_000_000),
    ("port_rcv_data", 2_000_000),
    ("port_xmit_packets", 5_000),
];

/// An HGX-style node: the GPUs at `gpu_buses` (domain 0, device 0) and eight InfiniBand
/// NICs `mlx5_0..7` at 400 Gb/s. `switches`: each GPU and its NIC behind one leaf of a
/// two-level PCIe switch (two GPUs and two NICs per switch, four switches on two host
/// bridges, NUMA 0 and 1), so that GPU i's rail is `mlx5_i`; otherwise every GPU and NIC on a
/// root port of its own with nothing shared but the NUMA node (GPUs 0–3 and NICs 0–3 on
/// node 0). Besides: a RoCE port (`mlx5_8`, netdev `ens8np0`) and an EFA device (`efa_0`),
/// each on a host bridge of its own.
pub fn hgx(root: &Path, gpu_buses: &[u8], switches: bool) -> Node {
    let tree = Tree::new(root);
    let mut next_port = 0u32;
    let mut port_name = || {
        let n = next_port;
        next_port += 1;
        format!("0000:{:02x}:1f.{}", n / 8, n % 8)
    };
    let mut gpus = Vec::new();
    let mut gpu_ports = Vec::new();
    let mut rails = Vec::new();
    let nic_bdf = |i: usize| format!("0000:{:02x}:00.0", 0xc0 + i);
    let make_nic = |tree: &Tree, chain: &[&str], i: usize, numa: i32| {
        let pci = tree.function(chain, 0x15b3, 0x020700, numa);
        tree.link_state(&pci, "32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16);
        let name = format!("mlx5_{i}");
        let dev = tree.rdma(&pci, &name, "mlx5_core", "28.41.1000", "MT4129");
        let port = tree.ib_port(
            &dev,
            1,
            "4: ACTIVE",
            "5: LinkUp",
            "400 Gb/sec (4X NDR)",
            "InfiniBand",
        );
        for (c, v) in QUIET {
            tree.counter(&port, "counters", c, v);
        }
        tree.counter(&port, "hw_counters", "out_of_sequence", 0);
        tree.counter(&port, "hw_counters", "lifespan", 10);
        (dev, port)
    };
    for (i, bus) in gpu_buses.iter().enumerate() {
        let numa = if i < gpu_buses.len() / 2 { 0 } else { 1 };
        let gpu_bdf = format!("0000:{bus:02x}:00.0");
        let hb = if switches {
            format!("pci0000:{:02x}", if i < 4 { 0 } else { 0x80 })
        } else {
            format!("pci0000:{:02x}", 0x10 + i)
        };
        let mut chain: Vec<String> = vec![hb.clone()];
        let mut nic_chain: Vec<String> = vec![hb];
        if switches {
            // Root port and upstream port per switch (GPUs 2k and 2k+1); a leaf per pair.
            if i % 2 == 0 {
                let (rp, up) = (port_name(), port_name());
                for c in [&rp, &up] {
                    chain.push(c.clone());
                    tree.port(&chain.iter().map(String::as_str).collect::<Vec<_>>(), numa);
                }
            } else {
                let prev: &Vec<PathBuf> = &gpu_ports[i - 1];
                for p in &prev[..2] {
                    chain.push(
                        p.file_name()
                            .and_then(|f| f.to_str())
                            .expect("a port")
                            .to_string(),
                    );
                }
            }
            for _ in 0..2 {
                chain.push(port_name());
                tree.port(&chain.iter().map(String::as_str).collect::<Vec<_>>(), numa);
            }
            nic_chain = chain.clone();
            let leaf_gpu = port_name();
            let leaf_nic = port_name();
            chain.push(leaf_gpu);
            tree.port(&chain.iter().map(String::as_str).collect::<Vec<_>>(), numa);
            nic_chain.push(leaf_nic);
            tree.port(
                &nic_chain.iter().map(String::as_str).collect::<Vec<_>>(),
                numa,
            );
        } else {
            chain.push(port_name());
            tree.port(&chain.iter().map(String::as_str).collect::<Vec<_>>(), numa);
            nic_chain = vec![format!("pci0000:{:02x}", 0x30 + i), port_name()];
            tree.port(
                &nic_chain.iter().map(String::as_str).collect::<Vec<_>>(),
                numa,
            );
        }
        let ports: Vec<PathBuf> = (1..chain.len())
            .map(|n| {
                chain[..=n]
                    .iter()
                    .fold(tree.root.join("devices"), |p, c| p.join(c))
            })
            .collect();
        chain.push(gpu_bdf);
        let g = tree.function(
            &chain.iter().map(String::as_str).collect::<Vec<_>>(),
            0x10de,
            0x030200,
            numa,
        );
        tree.link_state(&g, "32.0 GT/s PCIe", 16, "32.0 GT/s PCIe", 16);
        for f in ["aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal"] {
            tree.aer(&g, f, &[], 0);
        }
        gpus.push(g);
        gpu_ports.push(ports);
        nic_chain.push(nic_bdf(i));
        rails.push(make_nic(
            &tree,
            &nic_chain.iter().map(String::as_str).collect::<Vec<_>>(),
            i,
            numa,
        ));
    }
    // RoCE and EFA, each on a host bridge of its own.
    let rp = port_name();
    tree.port(&["pci0000:e0", &rp], 0);
    let pci = tree.function(&["pci0000:e0", &rp, "0000:e1:00.0"], 0x15b3, 0x020000, 0);
    let dev = tree.rdma(&pci, "mlx5_8", "mlx5_core", "22.39.1002", "MT4125");
    let port = tree.ib_port(
        &dev,
        1,
        "4: ACTIVE",
        "5: LinkUp",
        "100 Gb/sec (4X EDR)",
        "Ethernet",
    );
    for (c, v) in QUIET {
        tree.counter(&port, "counters", c, v);
    }
    tree.counter(&port, "hw_counters", "roce_adp_retrans", 0);
    tree.netdev(&pci, &port, "ens8np0");
    let rp = port_name();
    tree.port(&["pci0000:f0", &rp], 1);
    let pci = tree.function(&["pci0000:f0", &rp, "0000:f1:00.0"], 0x1d0f, 0x020000, 1);
    let dev = tree.rdma(&pci, "efa_0", "efa", "0.0.0.0", "");
    let efa = tree.ib_port(
        &dev,
        1,
        "4: ACTIVE",
        "5: LinkUp",
        "100 Gb/sec (4X EDR)",
        "Unknown",
    );
    std::fs::create_dir_all(efa.join("hw_counters")).expect("efa counters");
    for (c, v) in [
        ("tx_bytes", 4096),
        ("rx_bytes", 8192),
        ("tx_pkts", 4),
        ("rx_pkts", 8),
        ("retrans_pkts", 0),
    ] {
        tree.counter(&efa, "hw_counters", c, v);
    }
    Node {
        tree,
        gpus,
        gpu_ports,
        rails,
        roce: (port, "ens8np0".to_string()),
        efa,
    }
}

/// Every standard counter the IB core exposes (`drivers/infiniband/core/sysfs.c`).
pub const STANDARD_COUNTERS: [&str; 21] = [
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_xmit_wait",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "unicast_xmit_packets",
    "unicast_rcv_packets",
    "multicast_xmit_packets",
    "multicast_rcv_packets",
];

/// mlx5's port counters (`drivers/infiniband/hw/mlx5/counters.c`).
pub const MLX5_HW_COUNTERS: [&str; 36] = [
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "rx_dct_connect",
    "out_of_buffer",
    "out_of_sequence",
    "duplicate_request",
    "rnr_nak_retry_err",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "req_transport_retries_exceeded",
    "resp_local_length_error",
    "resp_cqe_error",
    "req_cqe_error",
    "req_remote_invalid_request",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rx_icrc_encapsulated",
    "rp_cnp_ignored",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "lifespan",
    "tx_atomic_req",
    "tx_read_req",
    "tx_write_req",
    "rx_icrc_error",
    "cnp_sent",
];

/// Gives a port every standard and mlx5 counter, at `value`.
pub fn every_counter(tree: &Tree, port: &Path, value: u64) {
    for c in STANDARD_COUNTERS {
        tree.counter(port, "counters", c, value);
    }
    for c in MLX5_HW_COUNTERS {
        tree.counter(port, "hw_counters", c, value);
    }
}

//! One read of `/sys/class/infiniband`: every RDMA device (InfiniBand, RoCE and EFA all
//! register there) with its ports, states, rates and counters.

use std::path::Path;

use crate::sources::sysfs::{self, PciPath};

/// At most this many RDMA devices and ports per device.
pub const MAX_DEVICES: usize = 64;
/// At most this many ports of one device.
pub const MAX_PORTS: usize = 8;
/// At most this many counters of one directory.
pub const MAX_COUNTERS: usize = 128;

/// What kind of link a port is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand.
    InfiniBand,
    /// RoCE (`Ethernet`).
    Ethernet,
    /// AWS EFA (the driver is `efa`, or the vendor 0x1d0f): its state files are fixed at
    /// ACTIVE / LinkUp by the driver, so only its counters say anything.
    Efa,
    /// Anything else.
    Unknown,
}

impl LinkLayer {
    /// The `nic.link_layer` value.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkLayer::InfiniBand => "infiniband",
            LinkLayer::Ethernet => "ethernet",
            LinkLayer::Efa => "efa",
            LinkLayer::Unknown => "unknown",
        }
    }
}

/// One port.
#[derive(Debug, Clone, PartialEq)]
pub struct Port {
    /// Its number.
    pub num: u32,
    /// `state` (4: ACTIVE).
    pub state: Option<(u8, String)>,
    /// `phys_state` (5: LinkUp).
    pub phys: Option<(u8, String)>,
    /// `rate` in Gb/s.
    pub rate_gbps: Option<f64>,
    /// `link_layer`.
    pub link_layer: LinkLayer,
    /// The netdev behind a RoCE port.
    pub netdev: Option<String>,
    /// `counters/*`.
    pub counters: Vec<(String, u64)>,
    /// `hw_counters/*` (the driver's).
    pub hw_counters: Vec<(String, u64)>,
}

impl Port {
    /// ACTIVE and LinkUp.
    pub fn up(&self) -> bool {
        self.state.as_ref().is_some_and(|s| s.0 == 4)
            && self.phys.as_ref().is_some_and(|p| p.0 == 5)
    }
}

/// One RDMA device.
#[derive(Debug, Clone, PartialEq)]
pub struct Device {
    /// `mlx5_0`, `efa_0`.
    pub name: String,
    /// Its PCI function and where it sits.
    pub pci: Option<PciPath>,
    /// NUMA node.
    pub numa: Option<u32>,
    /// `fw_ver`.
    pub firmware: Option<String>,
    /// `hca_type` (mlx5: `MT4129`).
    pub model: Option<String>,
    /// The PCI driver (`mlx5_core`, `efa`).
    pub driver: Option<String>,
    /// Its ports.
    pub ports: Vec<Port>,
}

/// Every RDMA device under `root` (a sysfs mount), but those named in `exclude`.
pub fn devices(root: &Path, exclude: &[String]) -> Vec<Device> {
    let class = root.join("class/infiniband");
    sysfs::names(&class)
        .into_iter()
        .filter(|n| !exclude.contains(n))
        .take(MAX_DEVICES)
        .map(|n| device(root, &class.join(&n), n))
        .collect()
}

fn device(root: &Path, dir: &Path, name: String) -> Device {
    let pci_dev = dir.join("device");
    let driver = std::fs::read_link(pci_dev.join("driver"))
        .ok()
        .and_then(|p| p.file_name().and_then(|f| f.to_str()).map(str::to_string))
        .filter(|d| sysfs::plain_name(d));
    let efa = driver.as_deref() == Some("efa")
        || sysfs::read_hex(&pci_dev.join("vendor")) == Some(0x1d0f);
    let netdevs = sysfs::names(&pci_dev.join("net"));
    let ports = sysfs::names(&dir.join("ports"))
        .into_iter()
        .filter_map(|p| p.parse::<u32>().ok())
        .take(MAX_PORTS)
        .map(|num| port(&dir.join("ports").join(num.to_string()), num, efa, &netdevs))
        .collect();
    Device {
        pci: sysfs::pci_path(root, &pci_dev),
        numa: sysfs::numa_node(&pci_dev),
        firmware: sysfs::read(&dir.join("fw_ver")).map(|s| s.chars().take(64).collect()),
        model: sysfs::read(&dir.join("hca_type")).map(|s| s.chars().take(64).collect()),
        driver,
        ports,
        name,
    }
}

fn port(dir: &Path, num: u32, efa: bool, netdevs: &[String]) -> Port {
    let link_layer = if efa {
        LinkLayer::Efa
    } else {
        match sysfs::read(&dir.join("link_layer")).as_deref() {
            Some("InfiniBand") => LinkLayer::InfiniBand,
            Some("Ethernet") => LinkLayer::Ethernet,
            _ => LinkLayer::Unknown,
        }
    };
    // A RoCE port's netdev: its first GID's, else the PCI function's only one.
    let netdev = (link_layer == LinkLayer::Ethernet)
        .then(|| {
            sysfs::read(&dir.join("gid_attrs/ndevs/0"))
                .filter(|n| sysfs::plain_name(n))
                .or_else(|| (netdevs.len() == 1).then(|| netdevs[0].clone()))
        })
        .flatten();
    Port {
        num,
        state: sysfs::read(&dir.join("state")).and_then(|s| sysfs::code_and_name(&s)),
        phys: sysfs::read(&dir.join("phys_state")).and_then(|s| sysfs::code_and_name(&s)),
        rate_gbps: sysfs::read(&dir.join("rate")).and_then(|s| sysfs::rate_gbps(&s)),
        link_layer,
        netdev,
        counters: counters(&dir.join("counters")),
        hw_counters: counters(&dir.join("hw_counters")),
    }
}

/// The counters of a directory (`lifespan` is the cache lifetime, not a counter).
fn counters(dir: &Path) -> Vec<(String, u64)> {
    sysfs::names(dir)
        .into_iter()
        .filter(|n| n != "lifespan")
        .take(MAX_COUNTERS)
        .filter_map(|n| sysfs::read_u64(&dir.join(&n)).map(|v| (n, v)))
        .collect()
}

//! What the sources around the GPU (the RDMA NICs, the PCIe bus) say about each GPU: the
//! conditions the health evaluator turns into reasons (with its hysteresis, like its own
//! rules), and which NICs are each GPU's rail. Keyed by the GPU's PCI address as sysfs writes
//! it (`0000:18:00.0`), since that is how the bus knows a GPU.

use std::collections::BTreeMap;
use std::sync::Mutex;

pub use super::health::Finding;
use super::lock;

/// How close a NIC sits to a GPU on the PCIe tree (best first), as `nvidia-smi topo -m` and
/// `nvmlDeviceGetTopologyCommonAncestor` rank pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Affinity {
    /// Set in the configuration (`sources.nic.rails`).
    Config,
    /// Behind the same PCIe switch (PIX / PXB).
    Switch,
    /// Under the same root port, no switch shared.
    RootPort,
    /// Under the same host bridge (PHB).
    HostBridge,
    /// Only on the same NUMA node (NODE).
    Numa,
}

impl Affinity {
    /// The `gpu.rail.affinity` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Affinity::Config => "config",
            Affinity::Switch => "switch",
            Affinity::RootPort => "root_port",
            Affinity::HostBridge => "host_bridge",
            Affinity::Numa => "numa",
        }
    }
}

/// One NIC of a GPU's rail.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Rail {
    /// The RDMA device (`mlx5_0`, `efa_0`).
    pub device: String,
    /// How it was found.
    pub affinity: Affinity,
    /// Its PCI function (`dddd:bb:dd.f`), where sysfs shows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci: Option<String>,
}

#[derive(Debug, Default)]
struct Inner {
    findings: BTreeMap<&'static str, BTreeMap<String, Vec<Finding>>>,
    rails: BTreeMap<String, Vec<Rail>>,
    paths: BTreeMap<String, Vec<String>>,
}

/// The fabric's view of the GPUs.
#[derive(Debug, Default)]
pub struct Fabric {
    inner: Mutex<Inner>,
}

impl Fabric {
    /// Replaces what `source` finds, per GPU PCI address.
    pub fn set_findings(&self, source: &'static str, by_gpu: BTreeMap<String, Vec<Finding>>) {
        lock(&self.inner).findings.insert(source, by_gpu);
    }

    /// Every source's findings for the GPU at `bdf` (any spelling NVML or sysfs uses).
    pub fn findings(&self, bdf: &str) -> Vec<Finding> {
        let Some(key) = normalize_bdf(bdf) else {
            return Vec::new();
        };
        lock(&self.inner)
            .findings
            .values()
            .filter_map(|m| m.get(&key))
            .flatten()
            .cloned()
            .collect()
    }

    /// Replaces the rails, per GPU PCI address.
    pub fn set_rails(&self, rails: BTreeMap<String, Vec<Rail>>) {
        lock(&self.inner).rails = rails;
    }

    /// Replaces the ports above each GPU (root port first), per GPU PCI address.
    pub fn set_paths(&self, paths: BTreeMap<String, Vec<String>>) {
        lock(&self.inner).paths = paths;
    }

    /// The GPUs (PCI addresses) at `bdf` or behind the port `bdf`.
    pub fn gpus_behind(&self, bdf: &str) -> Vec<String> {
        let Some(b) = normalize_bdf(bdf) else {
            return Vec::new();
        };
        lock(&self.inner)
            .paths
            .iter()
            .filter(|(gpu, up)| **gpu == b || up.contains(&b))
            .map(|(gpu, _)| gpu.clone())
            .collect()
    }

    /// The GPUs (PCI addresses) whose rail holds the NIC at `bdf`.
    pub fn gpus_on_rail_of(&self, bdf: &str) -> Vec<String> {
        let Some(b) = normalize_bdf(bdf) else {
            return Vec::new();
        };
        lock(&self.inner)
            .rails
            .iter()
            .filter(|(_, rail)| rail.iter().any(|r| r.pci.as_deref() == Some(b.as_str())))
            .map(|(gpu, _)| gpu.clone())
            .collect()
    }

    /// The rail of the GPU at `bdf`.
    pub fn rail(&self, bdf: &str) -> Vec<Rail> {
        normalize_bdf(bdf)
            .and_then(|k| lock(&self.inner).rails.get(&k).cloned())
            .unwrap_or_default()
    }
}

/// A PCI address as sysfs writes it (`dddd:bb:dd.f`, lower case, 4-digit domain) from NVML's
/// `%08X:%02X:%02X.0`, its legacy `%04X:…` form or sysfs's own; `None` if it is not one.
pub fn normalize_bdf(s: &str) -> Option<String> {
    let s = s.trim();
    let (domain, rest) = s.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.').unwrap_or((rest, "0"));
    let hex = |v: &str, max: u32| {
        (!v.is_empty() && v.len() <= 8)
            .then(|| u32::from_str_radix(v, 16).ok())
            .flatten()
            .filter(|n| *n <= max)
    };
    Some(format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        hex(domain, 0xFFFF)?,
        hex(bus, 0xFF)?,
        hex(dev, 0x1F)?,
        hex(func, 7)?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_in_every_spelling_meet() {
        for s in [
            "00000000:18:00.0",
            "0000:18:00.0",
            "0000:18:00",
            " 00000000:18:00.0\n",
        ] {
            assert_eq!(normalize_bdf(s).as_deref(), Some("0000:18:00.0"), "{s:?}");
        }
        assert_eq!(
            normalize_bdf("0001:AB:1F.7").as_deref(),
            Some("0001:ab:1f.7")
        );
        for bad in [
            "",
            "18:00.0",
            "0000:18:20.0",
            "0000:118:00.0",
            "x:y:z.0",
            "0000:18:00.8",
        ] {
            assert_eq!(normalize_bdf(bad), None, "{bad:?}");
        }
    }
}

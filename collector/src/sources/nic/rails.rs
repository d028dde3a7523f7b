//! Which NICs are each GPU's rail.

use std::collections::BTreeMap;
use std::path::Path;

use super::NicConfig;
use super::read::Device;
use crate::model::Model;
use crate::model::fabric::{Affinity, Rail, normalize_bdf};
use crate::sources::sysfs;

/// Each GPU's rail: the configured NICs, else the nearest ones on the PCIe tree (behind its
/// switch, else its root port, else its host bridge), else those on its NUMA node.
pub fn rails(
    root: &Path,
    devices: &[Device],
    model: &Model,
    cfg: &NicConfig,
) -> BTreeMap<String, Vec<Rail>> {
    let configured: BTreeMap<String, Vec<String>> = cfg
        .rails
        .0
        .iter()
        .filter_map(|(k, v)| {
            let devs = v
                .split(',')
                .map(|d| d.trim().to_string())
                .filter(|d| !d.is_empty());
            Some((normalize_bdf(k)?, devs.collect()))
        })
        .collect();
    let pci_of = |name: &str| {
        devices
            .iter()
            .find(|d| d.name == name)
            .and_then(|d| d.pci.as_ref())
            .and_then(|p| normalize_bdf(p.bdf()))
    };
    let mut out = BTreeMap::new();
    for slot in model.snapshot() {
        let Some(bdf) = normalize_bdf(&slot.info.pci_bus_id) else {
            continue;
        };
        if let Some(devs) = configured.get(&bdf) {
            let rail = devs
                .iter()
                .map(|d| Rail {
                    device: d.clone(),
                    affinity: Affinity::Config,
                    pci: pci_of(d),
                })
                .collect();
            out.insert(bdf, rail);
            continue;
        }
        let dir = sysfs::pci_dir(root, &bdf);
        let path = sysfs::pci_path(root, &dir);
        let numa = sysfs::numa_node(&dir);
        // (affinity, ports not shared): smaller is nearer.
        let near: Vec<((Affinity, usize), &str)> = devices
            .iter()
            .filter_map(|d| {
                let by_tree = path
                    .as_ref()
                    .zip(d.pci.as_ref())
                    .and_then(|(g, n)| sysfs::affinity(g, n))
                    .map(|(a, shared)| (a, usize::MAX - shared));
                let by_numa =
                    (numa.is_some() && numa == d.numa).then_some((Affinity::Numa, usize::MAX));
                Some((by_tree.or(by_numa)?, d.name.as_str()))
            })
            .collect();
        let Some(best) = near.iter().map(|(a, _)| *a).min() else {
            continue;
        };
        let rail: Vec<Rail> = near
            .iter()
            .filter(|(a, _)| *a == best)
            .take(8)
            .map(|(a, d)| Rail {
                device: d.to_string(),
                affinity: a.0,
                pci: pci_of(d),
            })
            .collect();
        out.insert(bdf, rail);
    }
    out
}

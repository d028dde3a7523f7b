//! One read of the PCI bus in sysfs: the NVIDIA GPUs and NVSwitches, the RDMA/Ethernet NICs,
//! and the ports above each, with their AER counters and link state.

use std::collections::BTreeMap;
use std::path::Path;

use crate::sources::sysfs::{self, PciPath};

/// At most this many PCI functions are looked at.
const MAX_FUNCTIONS: usize = 4096;
/// At most this many named AER error bits per severity.
pub const MAX_BITS: usize = 32;

/// What a function is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// An NVIDIA 3D controller (`0x0302xx`) or VGA controller (`0x0300xx`).
    Gpu,
    /// An NVIDIA bridge of class `0x0680xx`.
    NvSwitch,
    /// An InfiniBand (`0x0207xx`) controller, or a Mellanox / Amazon Ethernet one.
    Nic,
    /// A port above one of those.
    Port,
}

impl Role {
    /// The `hw.type` value.
    pub fn hw_type(self) -> &'static str {
        match self {
            Role::Gpu => "gpu",
            Role::NvSwitch => "nvswitch",
            Role::Nic => "network",
            Role::Port => "pci_bridge",
        }
    }
}

/// The three AER severities, as the sysfs files name them.
pub const SEVERITIES: [(&str, &str, &str); 3] = [
    (
        "correctable",
        "aer_dev_correctable",
        "aer_rootport_total_err_cor",
    ),
    (
        "nonfatal",
        "aer_dev_nonfatal",
        "aer_rootport_total_err_nonfatal",
    ),
    ("fatal", "aer_dev_fatal", "aer_rootport_total_err_fatal"),
];

/// One severity's counts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Aer {
    /// `TOTAL_ERR_*`.
    pub total: Option<u64>,
    /// Each named bit (`RxErr`, `Surprise Down Error`, …).
    pub bits: Vec<(String, u64)>,
    /// A root port's `aer_rootport_total_err_*`.
    pub rootport: Option<u64>,
}

/// Link speed (GT/s) and width (lanes), current and max.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Link {
    /// `current_link_speed`.
    pub speed: Option<f64>,
    /// `max_link_speed`.
    pub max_speed: Option<f64>,
    /// `current_link_width`.
    pub width: Option<u32>,
    /// `max_link_width`.
    pub max_width: Option<u32>,
}

/// One function.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    /// `dddd:bb:dd.f`.
    pub bdf: String,
    /// What it is.
    pub role: Role,
    /// AER per severity (index as [`SEVERITIES`]); empty without AER.
    pub aer: Vec<Aer>,
    /// Link state.
    pub link: Link,
    /// The functions above it (root port first), for a GPU, NVSwitch or NIC.
    pub path: Option<PciPath>,
}

/// The role of a function from its vendor and class.
pub fn role(vendor: u32, class: u32) -> Option<Role> {
    let base = class >> 8;
    match (vendor, base) {
        (0x10de, 0x0302 | 0x0300) => Some(Role::Gpu),
        (0x10de, 0x0680) => Some(Role::NvSwitch),
        (_, 0x0207) | (0x15b3 | 0x1d0f, 0x0200) => Some(Role::Nic),
        _ => None,
    }
}

/// Parses an `aer_dev_*` file: one `<name> <count>` line per bit (names contain spaces),
/// then `TOTAL_ERR_*`.
pub fn parse_aer(text: &str) -> Aer {
    let mut a = Aer::default();
    for line in text.lines().take(64) {
        let Some((name, n)) = line.trim().rsplit_once(char::is_whitespace) else {
            continue;
        };
        let (name, Ok(n)) = (name.trim(), n.parse::<u64>()) else {
            continue;
        };
        if name.starts_with("TOTAL_ERR_") {
            a.total = Some(n);
        } else if !name.is_empty()
            && name.len() <= 48
            && name.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
            && a.bits.len() < MAX_BITS
        {
            a.bits.push((name.to_string(), n));
        }
    }
    a
}

fn read_function(root: &Path, bdf: &str, role: Role) -> Function {
    let dir = sysfs::pci_dir(root, bdf);
    let aer: Vec<Aer> = SEVERITIES
        .iter()
        .map(|(_, dev, rp)| {
            // Current kernels put the files in the device's directory; a proposed layout
            // moves them under `aer/`.
            let text =
                sysfs::read(&dir.join(dev)).or_else(|| sysfs::read(&dir.join("aer").join(dev)));
            let mut a = text.map(|t| parse_aer(&t)).unwrap_or_default();
            a.rootport = sysfs::read_u64(&dir.join(rp));
            a
        })
        .collect();
    let has_aer = aer
        .iter()
        .any(|a| a.total.is_some() || a.rootport.is_some());
    let num = |f: &str| sysfs::read(&dir.join(f)).and_then(|s| s.parse::<u32>().ok());
    let speed = |f: &str| sysfs::read(&dir.join(f)).and_then(|s| sysfs::link_speed_gts(&s));
    Function {
        bdf: bdf.to_string(),
        role,
        aer: if has_aer { aer } else { Vec::new() },
        link: Link {
            speed: speed("current_link_speed"),
            max_speed: speed("max_link_speed"),
            width: num("current_link_width"),
            max_width: num("max_link_width"),
        },
        path: (role != Role::Port)
            .then(|| sysfs::pci_path(root, &dir))
            .flatten(),
    }
}

/// The GPUs, NVSwitches and NICs on the bus, then every port above them (each once).
pub fn functions(root: &Path) -> Vec<Function> {
    let dir = root.join("bus/pci/devices");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut bdfs: Vec<String> = rd
        .filter_map(Result::ok)
        .take(MAX_FUNCTIONS)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| crate::model::fabric::normalize_bdf(n).as_deref() == Some(n.as_str()))
        .collect();
    bdfs.sort();
    let mut out: Vec<Function> = bdfs
        .iter()
        .filter_map(|b| {
            let d = dir.join(b);
            let r = role(
                sysfs::read_hex(&d.join("vendor"))?,
                sysfs::read_hex(&d.join("class"))?,
            )?;
            Some(read_function(root, b, r))
        })
        .collect();
    let ports: BTreeMap<String, ()> = out
        .iter()
        .filter_map(|f| f.path.as_ref())
        .flat_map(|p| p.upstream().iter().cloned())
        .map(|b| (b, ()))
        .collect();
    for b in ports.keys() {
        if !out.iter().any(|f| &f.bdf == b) {
            out.push(read_function(root, b, Role::Port));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aer_files_in_both_spellings_of_the_names() {
        // The ABI document's long names, and the short names current kernels print.
        let long = "Receiver Error 2\nBad TLP 0\nBad DLLP 0\nRELAY_NUM Rollover 0\nReplay Timer Timeout 1\nHeader Log Overflow 0\nTOTAL_ERR_COR 3\n";
        let a = parse_aer(long);
        assert_eq!(a.total, Some(3));
        assert_eq!(a.bits[0], ("Receiver Error".to_string(), 2));
        assert_eq!(a.bits.len(), 6);
        let short = "Undefined 0\nDLP 0\nSDES 1\nTLP 0\nCmpltTO 4\nTOTAL_ERR_FATAL 5\n";
        let a = parse_aer(short);
        assert_eq!(a.total, Some(5));
        assert!(a.bits.contains(&("CmpltTO".to_string(), 4)));
        assert_eq!(parse_aer("garbage\n\n").total, None);
        assert_eq!(role(0x10de, 0x030200), Some(Role::Gpu));
        assert_eq!(role(0x10de, 0x068000), Some(Role::NvSwitch));
        assert_eq!(role(0x10de, 0x040300), None, "the audio function");
        assert_eq!(role(0x15b3, 0x020700), Some(Role::Nic));
        assert_eq!(role(0x8086, 0x020000), None);
    }
}

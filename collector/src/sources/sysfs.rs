//! The kernel's sysfs as the `nic` and `pcie` sources read it: bounded reads of its one-value
//! files, the formats they print (`Documentation/ABI/stable/sysfs-class-infiniband`,
//! `Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats`, `drivers/pci/pci-sysfs.c`),
//! and where a PCI function sits in the PCIe tree. The kernel writes these files, but what a
//! driver names (counters, devices) still bounds what Junction keeps: every listing is capped.

use std::path::{Path, PathBuf};

use crate::model::fabric::{Affinity, normalize_bdf};

/// A sysfs attribute is one page at most; anything larger is not one.
const MAX_FILE: u64 = 64 * 1024;

/// At most this many entries of one directory are looked at.
pub const MAX_ENTRIES: usize = 512;

/// A file's text, trimmed; `None` when it is absent, unreadable or not an attribute.
pub fn read(path: &Path) -> Option<String> {
    use std::io::Read as _;
    let f = std::fs::File::open(path).ok()?;
    let mut s = String::new();
    f.take(MAX_FILE).read_to_string(&mut s).ok()?;
    Some(s.trim().to_string())
}

/// A decimal counter; `None` for anything else (the IB core prints `N/A (no PMA)` when the
/// device does not answer: absent, not zero).
pub fn read_u64(path: &Path) -> Option<u64> {
    read(path)?.parse().ok()
}

/// A `0x`-prefixed hexadecimal attribute (`vendor`, `class`).
pub fn read_hex(path: &Path) -> Option<u32> {
    let s = read(path)?;
    u32::from_str_radix(s.strip_prefix("0x").unwrap_or(&s), 16).ok()
}

/// A device's NUMA node (`-1`, or a missing file: unknown).
pub fn numa_node(dev: &Path) -> Option<u32> {
    read(&dev.join("numa_node"))?
        .parse::<i64>()
        .ok()?
        .try_into()
        .ok()
}

/// The names in a directory, sorted, at most [`MAX_ENTRIES`], each a plain file name of at
/// most 64 bytes of `[A-Za-z0-9_.:-]` (anything else is no name sysfs gives).
pub fn names(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<String> = rd
        .filter_map(Result::ok)
        .take(MAX_ENTRIES * 2)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| plain_name(n))
        .collect();
    v.sort();
    v.truncate(MAX_ENTRIES);
    v
}

/// A name sysfs could have given: short, of the characters device and counter names use.
pub fn plain_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && !n.starts_with('.')
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

/// `"4: ACTIVE"` → (4, "ACTIVE"): the IB port `state` and `phys_state` files.
pub fn code_and_name(s: &str) -> Option<(u8, String)> {
    let (n, name) = s.split_once(':')?;
    Some((
        n.trim().parse().ok()?,
        name.trim().chars().take(32).collect(),
    ))
}

/// `"400 Gb/sec (4X NDR)"`, `"2.5 Gb/sec (1X SDR)"` → Gb/s.
pub fn rate_gbps(s: &str) -> Option<f64> {
    let v: f64 = s.split_whitespace().next()?.parse().ok()?;
    (s.contains("Gb/sec") && v.is_finite() && v >= 0.0).then_some(v)
}

/// `"16.0 GT/s PCIe"`, `"8 GT/s"` (kernels ≤ 5.6), `"Unknown"` → GT/s.
pub fn link_speed_gts(s: &str) -> Option<f64> {
    let v: f64 = s.split_whitespace().next()?.parse().ok()?;
    (s.contains("GT/s") && v.is_finite() && v > 0.0).then_some(v)
}

/// Where a PCI function sits: its host bridge (`pci0000:15`) and the functions from the root
/// port down to itself (`0000:15:01.0`, `0000:16:00.0`, `0000:17:01.0`, `0000:18:00.0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciPath {
    /// The host bridge's directory name.
    pub host_bridge: String,
    /// Root port first, the function itself last.
    pub chain: Vec<String>,
}

impl PciPath {
    /// The function's own address.
    pub fn bdf(&self) -> &str {
        self.chain.last().map_or("", String::as_str)
    }

    /// The ports above the function (root port first).
    pub fn upstream(&self) -> &[String] {
        &self.chain[..self.chain.len().saturating_sub(1)]
    }
}

/// The sysfs directory of the PCI function `bdf`.
pub fn pci_dir(root: &Path, bdf: &str) -> PathBuf {
    root.join("bus/pci/devices").join(bdf)
}

/// Resolves `dev` (a sysfs path that links into `devices/`) to its place in the PCIe tree, as
/// NCCL does (`realpath` of `/sys/bus/pci/devices/<bdf>`).
pub fn pci_path(root: &Path, dev: &Path) -> Option<PciPath> {
    let real = std::fs::canonicalize(dev).ok()?;
    let base = std::fs::canonicalize(root.join("devices")).ok()?;
    let rel = real.strip_prefix(&base).ok()?;
    let mut parts = rel.iter().filter_map(|p| p.to_str());
    let host_bridge = parts.next()?.to_string();
    if !host_bridge.starts_with("pci") {
        return None;
    }
    let chain: Vec<String> = parts
        .take(16)
        .map_while(|p| normalize_bdf(p).filter(|n| n == p))
        .collect();
    (!chain.is_empty()).then_some(PciPath { host_bridge, chain })
}

/// How close two functions are on the tree: a shared switch (two or more shared ports: the
/// root port and a switch's upstream port), a shared root port, a shared host bridge; `None`
/// when they are on different host bridges. With it, how many ports they share: of two NICs
/// behind one switch, the one on the GPU's own leaf shares more.
pub fn affinity(a: &PciPath, b: &PciPath) -> Option<(Affinity, usize)> {
    if a.host_bridge != b.host_bridge {
        return None;
    }
    let shared = a
        .upstream()
        .iter()
        .zip(b.upstream())
        .take_while(|(x, y)| x == y)
        .count();
    let a = match shared {
        0 => Affinity::HostBridge,
        1 => Affinity::RootPort,
        _ => Affinity::Switch,
    };
    Some((a, shared))
}

/// Runs `poll` every `interval` until shutdown, one poll at a time on the blocking pool
/// (directory reads are blocking I/O), the state carried from one to the next; a poll that
/// panics is logged and the next starts from a fresh state. The source is up while it runs.
pub async fn run_blocking<S: Default + Send + 'static>(
    name: &'static str,
    interval: std::time::Duration,
    ctx: crate::agent::Ctx,
    poll: impl Fn(&mut S) + Send + Sync + 'static,
) {
    let poll = std::sync::Arc::new(poll);
    let mut state = S::default();
    ctx.model.set_source_up(name, true);
    let mut ticks = ctx.shutdown.ticks(interval);
    while ticks.next().await {
        let p = poll.clone();
        match tokio::task::spawn_blocking(move || {
            p(&mut state);
            state
        })
        .await
        {
            Ok(s) => state = s,
            Err(e) => {
                tracing::error!(source = name, error = %e, "a poll panicked; starting over");
                state = S::default();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_formats_the_kernel_prints() {
        assert_eq!(code_and_name("4: ACTIVE"), Some((4, "ACTIVE".into())));
        assert_eq!(code_and_name("5: LinkUp"), Some((5, "LinkUp".into())));
        assert_eq!(code_and_name("ACTIVE"), None);
        assert_eq!(rate_gbps("400 Gb/sec (4X NDR)"), Some(400.0));
        assert_eq!(rate_gbps("2.5 Gb/sec (1X SDR)"), Some(2.5));
        assert_eq!(rate_gbps("200 Gb/sec (2X NDR)"), Some(200.0));
        assert_eq!(rate_gbps("fast"), None);
        assert_eq!(link_speed_gts("32.0 GT/s PCIe"), Some(32.0));
        assert_eq!(link_speed_gts("8 GT/s"), Some(8.0));
        assert_eq!(link_speed_gts("Unknown"), None);
        assert!(plain_name("rnr_nak_retry_err") && plain_name("0000:18:00.0"));
        assert!(!plain_name("..") && !plain_name("a b") && !plain_name(&"x".repeat(65)));
    }

    /// The kernel's own sysfs, not a tree written here: every PCI function of this machine
    /// resolves to its host bridge and its chain of ports, ending in itself, and its vendor
    /// and class read as the hexadecimal the kernel prints.
    #[test]
    fn this_machines_pci_bus() {
        let root = Path::new("/sys");
        let listed = names(&root.join("bus/pci/devices"));
        assert!(
            !listed.is_empty() || std::env::var_os("CI").is_none(),
            "CI machines have PCI functions in /sys/bus/pci/devices"
        );
        for bdf in &listed {
            let dir = pci_dir(root, bdf);
            let p = pci_path(root, &dir).unwrap_or_else(|| panic!("{bdf}: no place in the tree"));
            assert!(p.host_bridge.starts_with("pci"), "{bdf}: {p:?}");
            assert_eq!(p.bdf(), bdf);
            assert!(
                read_hex(&dir.join("vendor")).is_some_and(|v| v <= 0xffff),
                "{bdf}: vendor"
            );
            assert!(read_hex(&dir.join("class")).is_some(), "{bdf}: class");
            // The ports above are functions too.
            for up in p.upstream() {
                assert!(listed.contains(up), "{bdf}: {up} above it is not listed");
            }
        }
    }
}

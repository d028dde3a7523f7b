//! What Junction's end-to-end tests, the demo and the benchmarks share, so that each exists
//! once: the Prometheus text parser ([`prom`]), free loopback ports ([`net`]), kernel-log
//! writes ([`kmsg`]), the OTLP/HTTP receiver ([`otlp`]), and the BMCs on loopback ([`bmc`]:
//! sushy-tools, DMTF's mockup server, OpenIPMI's `ipmi_sim`, and misbehaving servers).
//!
//! Setup failures panic with what is missing (these run in tests and tools, never in the
//! agent); where a caller must carry on without a part (the demo), a `try_` form returns
//! the reason instead.

pub mod bmc;
pub mod kmsg;
pub mod net;
pub mod otlp;
pub mod prom;
pub mod sysfs;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

pub use net::{free_port, free_udp_port};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("workspace root")
        .to_path_buf()
}

/// The shared folder beside the repository (`../shared`: other projects' mockups, captures
/// and corpora, which stay there and are read from there).
pub fn shared() -> PathBuf {
    root().join("../shared")
}

/// The unified cgroup hierarchy's mount point (the `cgroup2` line of `/proc/self/mountinfo`).
pub fn cgroup2_root() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines()
        .find(|l| {
            l.split(" - ")
                .nth(1)
                .is_some_and(|r| r.starts_with("cgroup2 "))
        })
        .and_then(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
}

/// A fresh directory for one test's (or one tool run's) files, under the system's temp dir.
pub fn temp_dir() -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "junction-e2e-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// A tool on PATH (or at `path`), or `None` with the reason printed — a failure in CI, where
/// every tool must exist.
pub fn require_tool(name: &str, path: Option<PathBuf>) -> Option<PathBuf> {
    let found = path.filter(|p| p.exists()).or_else(|| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.exists())
        })
    });
    if found.is_none() {
        let msg = format!("{name} is not installed; `cargo xtask test` installs it");
        assert!(std::env::var_os("CI").is_none(), "{msg} (CI must not skip)");
        eprintln!("SKIPPED: {msg}");
    }
    found
}

/// The NVML groups, each collected every `interval_secs` (config tables to append to a
/// config whose `[sources.nvml]` points at the simulator).
pub fn nvml_groups_every(interval_secs: u64) -> String {
    [
        "utilization",
        "memory",
        "power",
        "temperature",
        "clocks",
        "errors",
        "pcie",
        "nvlink",
        "processes",
        "mig",
        "gpm",
        "config",
    ]
    .iter()
    .map(|g| format!("\n[sources.nvml.groups.{g}]\ninterval_secs = {interval_secs}\n"))
    .collect()
}

//! The nic and pcie sources: CPU time of one poll of a composed HGX tree (8 GPUs with their
//! PCIe paths and AER files; 8 or 32 InfiniBand ports, each with every standard and mlx5
//! counter), measured in-process by the `fabric_bench` example.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

/// One measured tree.
pub struct Row {
    pub ports: u64,
    pub counters: u64,
    pub series: u64,
    pub nic_us: f64,
    pub pcie_us: f64,
}

pub fn run(bin: &Path, smoke: bool, dir: &Path) -> Result<Vec<Row>> {
    let example = bin.with_file_name("examples").join("fabric_bench");
    let polls = if smoke { "5" } else { "500" };
    let mut rows = Vec::new();
    for ports in ["8", "32"] {
        let tree = dir.join(format!("sys-{ports}"));
        let out = Command::new(&example)
            .arg(&tree)
            .args(["--ports", ports, "--polls", polls])
            .output()
            .context("running the fabric_bench example")?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let field = |k: &str| {
            text.split_whitespace()
                .find_map(|f| f.strip_prefix(&format!("{k}=")))
                .and_then(|v| v.parse::<f64>().ok())
                .with_context(|| format!("fabric_bench printed no {k}: {text}"))
        };
        rows.push(Row {
            ports: field("ports")? as u64,
            counters: field("counters_per_port")? as u64,
            series: field("series")? as u64,
            nic_us: field("nic_cpu_us")?,
            pcie_us: field("pcie_cpu_us")?,
        });
        let _ = std::fs::remove_dir_all(&tree);
    }
    Ok(rows)
}

pub fn report(rows: &[Row]) -> String {
    let mut out = String::from(
        "\n## NIC and PCIe polls\n\n\
         the `fabric_bench` example: the nic and pcie sources polling a composed sysfs tree in\n\
         the kernel's layout (`testkit::sysfs::hgx`: 8 GPUs behind four two-level PCIe switches\n\
         with AER files and link state, 8 InfiniBand NICs with 1 or 4 ports, each port with all\n\
         21 standard and 35 mlx5 counters), 500 polls in one thread, CPU time of the thread\n\
         (`getrusage(RUSAGE_THREAD)`) per poll. The tree is ordinary files (`target/bench`), not the\n\
         kernel's sysfs: on a real NIC a `counters/` read also costs a firmware command.\n\
         Produced by `cargo xtask bench --fabric` (or `cargo xtask bench`).\n\n\
         | ports | counters per port | series published | nic poll, CPU (µs) | pcie poll, CPU (µs) |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.0} |\n",
            r.ports, r.counters, r.series, r.nic_us, r.pcie_us
        ));
    }
    out
}

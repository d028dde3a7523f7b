//! The dcgm-exporter compatibility listener (`[sinks.dcgm]`): what one scrape of its page
//! costs beside one scrape of `/metrics`, on the 8- and 64-GPU nodes. Three runs per node in
//! the same conditions: collection only, `/metrics` scraped once a second, the compatibility
//! page scraped once a second; a scrape's CPU is its run's less the collection-only run's,
//! per scrape.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use super::{Measurement, measure, spawn_junction};
use crate::sim_config;

/// One node's three runs.
pub struct Node {
    pub gpus: u32,
    pub base: Measurement,
    pub native: Measurement,
    pub compat: Measurement,
}

pub fn run(bin: &Path, lib: &Path, window: Duration, dir: &Path) -> Result<Vec<Node>> {
    let mut nodes = Vec::new();
    for (gpus, scenario, port) in [
        (8, "h100-training.toml", 19501u16),
        (64, "h100-64.toml", 19511),
    ] {
        let mut runs = Vec::new();
        for (i, what) in ["collection only", "/metrics scraped", "compat scraped"]
            .iter()
            .enumerate()
        {
            let native = port + 2 * i as u16;
            let compat = native + 1;
            let mut text = super::fresh_state(dir, native)?;
            text.push_str(&sim_config(lib, &format!("127.0.0.1:{native}"), 1));
            text.push_str(&format!(
                "\n[sources.ebpf]\nenabled = false\n\n[sources.kmsg]\nenabled = false\n\n[sinks.dcgm]\nenabled = true\nlisten = \"127.0.0.1:{compat}\"\nhostname = \"bench\"\n"
            ));
            let config = dir.join(format!("bench-dcgm-{native}.toml"));
            std::fs::write(&config, text)?;
            let child = spawn_junction(bin, scenario, &config)?;
            let label = format!("junction, {gpus} GPUs, dcgm listener on, {what}");
            // The page measured is the one scraped; the baseline counts /metrics' series.
            let (scrape_port, scraped) = match i {
                0 => (native, false),
                1 => (native, true),
                _ => (compat, true),
            };
            let mut m = measure(&label, child, scrape_port, window, scraped)?;
            m.gpus = gpus;
            runs.push(m);
        }
        let compat = runs.pop().context("three runs")?;
        let native = runs.pop().context("three runs")?;
        let base = runs.pop().context("three runs")?;
        nodes.push(Node {
            gpus,
            base,
            native,
            compat,
        });
    }
    Ok(nodes)
}

pub fn report(nodes: &[Node]) -> String {
    let mut out = String::from(
        "\n## dcgm-exporter compatibility output\n\n\
         Command: `cargo xtask bench` (this section alone: `cargo xtask bench --dcgm`).\n\
         `[sinks.dcgm]` on (dcgm-exporter's default counter set), every NVML group at 1 s, three\n\
         runs per node: collection only, `/metrics` scraped once a second, the compatibility page\n\
         scraped once a second. CPU per scrape is the scraped run's CPU less the collection-only\n\
         run's, per scrape; series and bytes are one page's. The compatibility page is written from\n\
         the same model snapshot as `/metrics`, at dcgm-exporter's label set per row.\n\n\
         | GPUs | page | series | bytes | CPU ms per scrape | peak RSS (MiB) |\n\
         |---|---|---|---|---|---|\n",
    );
    for n in nodes {
        let per_scrape = |m: &Measurement| {
            let extra = (m.cpu_secs
                - n.base.cpu_secs * m.window.as_secs_f64() / n.base.window.as_secs_f64())
                * 1000.0;
            extra / f64::from(m.scrapes.max(1))
        };
        for (page, m) in [("`/metrics`", &n.native), ("compatibility", &n.compat)] {
            out.push_str(&format!(
                "| {} | {page} | {} | {} | {:.2} | {:.1} |\n",
                n.gpus,
                m.series,
                m.scrape_bytes,
                per_scrape(m),
                m.peak_rss_kib as f64 / 1024.0
            ));
        }
    }
    out
}

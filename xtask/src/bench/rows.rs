//! The first table of BENCHMARKS.md: its rows (junction on the simulated nodes, nvitop-exporter
//! on the same simulator) and its text.

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use super::measure::{Measurement, Scrape, measure, spawn_junction};
use super::{NVML_ONLY, fresh_state, machine, otlp, state_dir};
use crate::{root, setup, sim_config};

/// The row with every source a root agent runs by default (eBPF attribution, the kernel log,
/// health) besides NVML.
pub(super) const ALL_SOURCES: &str =
    "junction, 8 GPUs, every default source as root (+ eBPF, kernel log; scraped)";

/// The row that starts on an event history at its size bound, as a node's is after weeks.
const FULL_HISTORY: &str =
    "junction, 8 GPUs, started on a full event history (4 MiB, `health.history_max_bytes`)";

/// Fills `state`'s event history to about `bytes` with XIDs of eight GPUs over 30 boots, a
/// line a second from a day ago on (within the default age bound of 14 days): lines of the
/// form the agent writes (`collector/src/model/history.rs`, `Entry`).
pub(super) fn fill_history(state: &std::path::Path, bytes: usize) -> Result<()> {
    use std::fmt::Write as _;
    let from = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64
        - 86_400_000;
    let mut text = String::with_capacity(bytes + 512);
    let mut n = 0u64;
    while text.len() < bytes {
        let _ = writeln!(
            text,
            r#"{{"ms":{},"boot":"{:08x}-6715-4302-86de-6d15c63387c3","id":"GPU-{:08x}-0000-4000-8000-00115dfa5726","kind":"xid","code":"{}","pid":{},"detail":"Graphics Exception: ESR 0x{:x}, channel {}, process {}"}}"#,
            from + n * 1000,
            n % 30,
            n % 8,
            [13, 31, 43, 48, 63, 79, 94][(n % 7) as usize],
            1000 + n % 500,
            (n * 7919) % 65536,
            n % 64,
            1000 + n % 500,
        );
        n += 1;
    }
    std::fs::write(state.join("history.jsonl"), text)?;
    Ok(())
}

/// One benchmark row: label, scenario, GPUs, port, how it is scraped, OTLP compression
/// (none: no OTLP).
type Row = (
    &'static str,
    &'static str,
    u32,
    u16,
    Scrape,
    Option<&'static str>,
);

/// nvitop-exporter on the simulated 8-GPU node for `window`, scraped once a second.
pub(super) fn nvitop_row(lib: &std::path::Path, window: Duration) -> Result<Measurement> {
    let env = setup::test_dependencies()?;
    let exporter = env.python.with_file_name("nvitop-exporter");
    let child = Command::new(&exporter)
        .env(
            "LD_LIBRARY_PATH",
            lib.parent().context("simulator directory")?,
        )
        .env(
            "JUNCTION_NVML_SIM_SCENARIO",
            root().join("tests/scenarios/h100-training.toml"),
        )
        .args([
            "--bind-address",
            "127.0.0.1",
            "--port",
            "19483",
            "--interval",
            "1.0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting nvitop-exporter")?;
    let mut m = measure("nvitop-exporter 1.7.2, 8 GPUs", child, 19483, window, true)?;
    m.gpus = 8;
    Ok(m)
}

/// Which of the first table's rows to run.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Rows {
    All,
    /// The rows the OTLP section reads (not the every-source row, nor the full history's).
    Otlp,
    /// The every-source row alone.
    AllSources,
}

/// The junction rows (NVML and the sinks, each for `window`), those `which` names.
pub(super) fn junction_rows(
    bin: &std::path::Path,
    lib: &std::path::Path,
    dir: &std::path::Path,
    window: Duration,
    which: Rows,
) -> Result<Vec<Measurement>> {
    let mut results = Vec::new();
    let rows: [Row; 12] = [
        (
            "junction, 8 GPUs",
            "h100-training.toml",
            8,
            19481,
            Scrape::Text,
            None,
        ),
        (
            FULL_HISTORY,
            "h100-training.toml",
            8,
            19494,
            Scrape::Text,
            None,
        ),
        (
            "junction, 8 GPUs, collection only (not scraped)",
            "h100-training.toml",
            8,
            19484,
            Scrape::No,
            None,
        ),
        (
            "junction, 64 GPUs",
            "h100-64.toml",
            64,
            19482,
            Scrape::Text,
            None,
        ),
        (
            "junction, 64 GPUs, collection only (not scraped)",
            "h100-64.toml",
            64,
            19485,
            Scrape::No,
            None,
        ),
        (
            "junction, 8 GPUs, scraped asking for gzip (as Prometheus does)",
            "h100-training.toml",
            8,
            19492,
            Scrape::Gzip,
            None,
        ),
        (
            "junction, 64 GPUs, scraped asking for gzip (as Prometheus does)",
            "h100-64.toml",
            64,
            19493,
            Scrape::Gzip,
            None,
        ),
        (
            "junction, 8 GPUs, OTLP/HTTP gzip every 1 s (not scraped)",
            "h100-training.toml",
            8,
            19486,
            Scrape::No,
            Some("gzip"),
        ),
        (
            "junction, 8 GPUs, OTLP/HTTP uncompressed every 1 s (not scraped)",
            "h100-training.toml",
            8,
            19487,
            Scrape::No,
            Some("none"),
        ),
        (
            "junction, 64 GPUs, OTLP/HTTP gzip every 1 s (not scraped)",
            "h100-64.toml",
            64,
            19488,
            Scrape::No,
            Some("gzip"),
        ),
        (
            "junction, 64 GPUs, OTLP/HTTP uncompressed every 1 s (not scraped)",
            "h100-64.toml",
            64,
            19489,
            Scrape::No,
            Some("none"),
        ),
        (
            ALL_SOURCES,
            "h100-training.toml",
            8,
            19491,
            Scrape::Text,
            None,
        ),
    ];
    for (label, scenario, gpus, port, scraped, compression) in rows {
        let wanted = match which {
            Rows::All => true,
            Rows::Otlp => label != ALL_SOURCES && label != FULL_HISTORY,
            Rows::AllSources => label == ALL_SOURCES,
        };
        if !wanted {
            continue;
        }
        let config = dir.join(format!("bench-{port}.toml"));
        let mut text = fresh_state(dir, port)?;
        if label == FULL_HISTORY {
            fill_history(&state_dir(dir, port), 4 << 20)?;
        }
        text.push_str(&sim_config(lib, &format!("127.0.0.1:{port}"), 1));
        if label != ALL_SOURCES {
            text.push_str(NVML_ONLY);
        }
        let sink = match compression {
            Some(c) => {
                let sink = testkit::otlp::Sink::start()?;
                text.push_str(&format!(
                    "\n[sinks.otlp]\nenabled = true\nendpoint = \"http://127.0.0.1:{}\"\nprotocol = \"http/protobuf\"\ninterval_secs = 1\ncompression = {c:?}\n",
                    sink.port
                ));
                Some(sink)
            }
            None => None,
        };
        std::fs::write(&config, text)?;
        let child = spawn_junction(bin, scenario, &config)?;
        let mut m = measure(label, child, port, window, scraped)?;
        m.gpus = gpus;
        if let Some(sink) = sink {
            let c = sink.counts("/v1/metrics");
            m.otlp = Some((c.requests, c.bytes));
        }
        results.push(m);
    }
    Ok(results)
}

pub(super) fn report(
    results: &[Measurement],
    window: Duration,
    command: &str,
    profile: &str,
) -> String {
    let mut out = String::from("# Benchmarks\n\n");
    out.push_str(&format!(
        "Command: `{command}`; {profile} build; machine: {}; measured over {} s after a 2 s warm-up.\n\n",
        machine(),
        window.as_secs()
    ));
    out.push_str(&format!(
        "Every NVML group at a 1 s interval against the NVML simulator (`tests/scenarios/`, a {profile} build of\n\
         `tests/nvml-sim` that runs inside the measured process, so its cost is counted), `/metrics` scraped\n\
         once a second by the benchmark over one kept HTTP/1.1 connection, as Prometheus scrapes (a\n\
         server that answers HTTP/1.0 and closes, as nvitop-exporter's does, is connected to anew each\n\
         time). CPU is the process's CPU time, threads that exited included,\n\
         from a cpuacct cgroup of its own (`cpuacct.usage`, nanoseconds); the ticks column is user +\n\
         system time from `/proc/PID/stat` (10 ms ticks) as a cross-check. Peak RSS is `VmHWM` (for the\n\
         last row it includes the BPF ring buffer Junction maps). Every row but the last runs NVML and the\n\
         sinks only, like the peer: the other sources on by default (eBPF, the kernel log, the NVIDIA\n\
         modules and daemons under /proc, the NIC and PCIe polls, the kubelet's pods) are off, and are\n\
         measured in the last row. nvitop-exporter runs on the same simulator (its pynvml loads it through\n\
         `LD_LIBRARY_PATH`) at `--interval 1.0`. Each row's agent starts on an empty state directory of\n\
         its own, but one: that row's holds an event history at its size bound (4 MiB of XIDs, about\n\
         19,000 lines, from eight GPUs over 30 boots), which the agent reads and rewrites at start, as it\n\
         does on a node after weeks of XIDs.\n\n\
         | process | CPU ms per 1 s cycle | % of one core | % of one core (ticks) | peak RSS (MiB) | series per scrape | scrapes |\n\
         |---|---|---|---|---|---|---|\n"
    ));
    for m in results {
        out.push_str(&table_row(m));
    }
    if let (Some(j), Some(n)) = (
        results.first(),
        results.iter().find(|m| m.label.starts_with("nvitop")),
    ) {
        let ratio = if j.cpu_secs > 0.0 {
            n.cpu_secs / j.cpu_secs
        } else {
            f64::INFINITY
        };
        out.push_str(&format!(
            "\nnvitop-exporter used {ratio:.1}x the CPU of junction on the same 8-GPU node while exporting {} series to junction's {};\n\
             peak RSS {:.1} MiB (nvitop-exporter) vs {:.1} MiB (junction).\n",
            n.series,
            j.series,
            n.peak_rss_kib as f64 / 1024.0,
            j.peak_rss_kib as f64 / 1024.0
        ));
    }
    out.push_str(&otlp::report(results, command));
    out
}

/// One row of the first table.
pub(super) fn table_row(m: &Measurement) -> String {
    format!(
        "| {} | {:.2} | {:.3} | {:.3} | {:.1} | {} | {} |\n",
        m.label,
        m.cpu_ms_per_cycle(),
        m.core_percent(),
        m.tick_cpu_secs * 100.0 / m.window.as_secs_f64(),
        m.peak_rss_kib as f64 / 1024.0,
        m.series,
        m.scrapes
    )
}

//! `cargo xtask bench`: CPU time per collection cycle and peak RSS of the agent on simulated
//! nodes (8 and 64 GPUs, every group at 1 s, scraped once a second), side by side with
//! `nvitop-exporter` on the same simulator. `--smoke` runs each for a few seconds without
//! writing BENCHMARKS.md, so that the benchmark cannot rot.

use std::time::Duration;

use anyhow::{Context, Result};

use crate::{cargo, nvml_sim_profile, root, run as run_cmd, setup};

mod bmc;
mod dcgm;
mod ebpf;
mod fabric;
mod kmsg;
mod measure;
mod otlp;
mod rows;
mod scale;
mod scraper;
mod smaps;
mod soak;

use measure::{Measurement, Scrape, measure, scrape, spawn_junction, spawn_junction_logged};
use rows::{ALL_SOURCES, Rows, junction_rows, nvitop_row, report, table_row};

/// The sources turned off where a row measures NVML and the sinks alone (what nvitop-exporter
/// does): every other source a root agent runs by default (eBPF attribution, the kernel log,
/// the NVIDIA modules and daemons under /proc, the NIC and PCIe polls, the kubelet's pods).
/// The every-source row and the sections below measure those.
pub(crate) const NVML_ONLY: &str = "\n[sources.ebpf]\nenabled = false\n\n[sources.kmsg]\nenabled = false\n\n[sources.host]\nenabled = false\n\n[sources.nic]\nenabled = false\n\n[sources.pcie]\nenabled = false\n\n[sources.kubernetes]\nenabled = false\n";

/// A `state_dir = …` line (the file's first) naming an empty state directory of its own for
/// the agent on `port`: what earlier runs left in the default one (its event history, read
/// at start) would otherwise enter the figures.
pub(crate) fn fresh_state(dir: &std::path::Path, port: u16) -> Result<String> {
    let state = state_dir(dir, port);
    if state.exists() {
        std::fs::remove_dir_all(&state).with_context(|| format!("emptying {}", state.display()))?;
    }
    std::fs::create_dir_all(&state)?;
    Ok(format!("state_dir = {:?}\n", state.display().to_string()))
}

/// The state directory of the agent on `port`.
fn state_dir(dir: &std::path::Path, port: u16) -> std::path::PathBuf {
    dir.join(format!("state-{port}"))
}

pub fn run(smoke: bool) -> Result<()> {
    let window = if smoke {
        Duration::from_secs(3)
    } else {
        Duration::from_secs(60)
    };
    let lib = nvml_sim_profile(!smoke)?;
    let profile = if smoke { "debug" } else { "release" };
    // The every-source row and the eBPF section need the BPF programs in the binary, which
    // embeds them when they are built: without, both would measure an agent without eBPF.
    crate::build_ebpf()?;
    let mut build = cargo();
    build.args(["build", "--quiet", "-p", "junction", "--bins", "--examples"]);
    if !smoke {
        build.arg("--release");
    }
    run_cmd(&mut build)?;
    let bin = root().join("target").join(profile).join("junction");
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let mut results = junction_rows(&bin, &lib, &dir, window, Rows::All)?;
    results.push(nvitop_row(&lib, window)?);

    let compat = dcgm::run(&bin, &lib, window, &dir)?;
    let kmsg = kmsg::run(&bin, &lib, smoke, &dir)?;
    let ebpf = ebpf::run(&bin, smoke)?;
    let bmc = bmc::run(&bin, smoke, &dir)?;
    let fabric = fabric::run(&bin, smoke, &dir)?;
    // How the cost grows with GPUs and processes (checked below).
    let scaled = scale::run(
        &bin,
        &lib,
        &dir,
        if smoke {
            window
        } else {
            Duration::from_secs(30)
        },
        scale::passes(smoke),
    )?;
    // The soak for a few minutes in the smoke run (`cargo xtask bench --soak MINUTES` for
    // the figures).
    let soaked = if smoke {
        soak_runs(&bin, &lib, &dir, 1.5, Duration::from_secs(30))?
    } else {
        Vec::new()
    };
    // The fuzzers run in the test suite for a bounded count; here for a minute each.
    let fuzz_secs = 60;
    let fuzzed = if smoke {
        Vec::new()
    } else {
        crate::fuzz::run_all(u64::MAX / 2, fuzz_secs)?
    };
    let command = if smoke {
        "cargo xtask bench --smoke"
    } else {
        "cargo xtask bench"
    };
    let mut report = report(&results, window, command, profile);
    report.push_str(&dcgm::report(&compat));
    report.push_str(&kmsg::report(&kmsg));
    report.push_str(&ebpf::report(&ebpf));
    report.push_str(&bmc::report(&bmc));
    report.push_str(&fabric::report(&fabric));
    if !fuzzed.is_empty() {
        report.push_str(&crate::fuzz::report(&fuzzed, fuzz_secs));
    }
    report.push_str(&scale::report(
        &scaled,
        if smoke {
            "cargo xtask bench --smoke"
        } else {
            "cargo xtask bench"
        },
        scale::passes(smoke),
    ));
    if !soaked.is_empty() {
        report.push_str(&soak::report(&soaked, "cargo xtask bench --smoke"));
    }
    print!("{report}");
    if !smoke {
        // The soak's figures come from `--soak MINUTES` (an hour or more), its heap profile
        // from a run under heaptrack, the cycle's profile from callgrind, the real host's from
        // `cargo xtask gpu-check` on one: kept as they are.
        if let Ok(old) = std::fs::read_to_string(root().join("BENCHMARKS.md")) {
            for heading in [
                "\n## Soak\n",
                "\n## Soak heap profile\n",
                "\n## Where a cycle's CPU goes\n",
                "\n## On a real GPU host\n",
            ] {
                let Some(start) = old.find(heading) else {
                    continue;
                };
                let end = section_end(&old, start);
                report.push_str(&old[start..end]);
            }
        }
        std::fs::write(root().join("BENCHMARKS.md"), report)?;
        println!("wrote BENCHMARKS.md");
        // Leave the debug simulator in place for the tests.
        crate::nvml_sim()?;
    }
    scale::check(&scaled)
}

/// `cargo xtask bench --otlp`: the rows the OTLP section reads, release build, one minute
/// each; that section of BENCHMARKS.md is replaced, the rest kept.
pub fn run_otlp() -> Result<()> {
    let lib = nvml_sim_profile(true)?;
    build_release(&["--bins"])?;
    let bin = root().join("target/release/junction");
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let results = junction_rows(&bin, &lib, &dir, Duration::from_secs(60), Rows::Otlp)?;
    let section = otlp::report(&results, "cargo xtask bench --otlp");
    print!("{section}");
    replace_section("\n## OTLP export\n", &section)?;
    crate::nvml_sim()?;
    println!("wrote the OTLP section of BENCHMARKS.md");
    Ok(())
}

/// `cargo xtask bench --cpu`: the first table (every junction row, nvitop-exporter's) and the
/// OTLP section, which reads the same rows; release build, the BPF programs built first (the
/// every-source row measures eBPF), one minute each. BENCHMARKS.md from its start to the end
/// of the OTLP section is replaced, the rest kept.
pub fn run_cpu() -> Result<()> {
    let lib = nvml_sim_profile(true)?;
    crate::build_ebpf()?;
    build_release(&["--bins"])?;
    let bin = root().join("target/release/junction");
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let window = Duration::from_secs(60);
    let mut results = junction_rows(&bin, &lib, &dir, window, Rows::All)?;
    results.push(nvitop_row(&lib, window)?);
    let head = report(&results, window, "cargo xtask bench --cpu", "release");
    print!("{head}");
    let path = root().join("BENCHMARKS.md");
    let text = std::fs::read_to_string(&path)?;
    let otlp = text
        .find("\n## OTLP export\n")
        .context("BENCHMARKS.md has no OTLP section")?;
    let end = section_end(&text, otlp);
    std::fs::write(&path, format!("{head}{}", &text[end..]))?;
    crate::nvml_sim()?;
    println!("wrote the first table and the OTLP section of BENCHMARKS.md");
    Ok(())
}

/// The simulator and `junction` for a section's own command: the debug builds with `smoke`,
/// else the release ones. Returns (simulator library, binary).
fn build_junction(smoke: bool) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let lib = nvml_sim_profile(!smoke)?;
    let mut build = cargo();
    build.args(["build", "--quiet", "-p", "junction", "--bins"]);
    if !smoke {
        build.arg("--release");
    }
    run_cmd(&mut build)?;
    let profile = if smoke { "debug" } else { "release" };
    Ok((lib, root().join("target").join(profile).join("junction")))
}

/// `cargo xtask bench --scale`: the scale rows (see `scale`), release build, 30 s each; that
/// section of BENCHMARKS.md is replaced (or added), the rest kept. With `--smoke`: the debug
/// build, 3 s each, nothing written.
pub fn run_scale(smoke: bool) -> Result<()> {
    let (lib, bin) = build_junction(smoke)?;
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let window = Duration::from_secs(if smoke { 3 } else { 30 });
    let passes = scale::passes(smoke);
    let rows = scale::run(&bin, &lib, &dir, window, passes)?;
    let section = scale::report(&rows, "cargo xtask bench --scale", passes);
    print!("{section}");
    if !smoke {
        replace_section("\n## Scale\n", &section)?;
        crate::nvml_sim()?;
        println!("wrote the scale section of BENCHMARKS.md");
    }
    scale::check(&rows)
}

/// Both soak runs (see `soak`), side by side.
fn soak_runs(
    bin: &std::path::Path,
    lib: &std::path::Path,
    dir: &std::path::Path,
    minutes: f64,
    warmup: Duration,
) -> Result<Vec<soak::Run>> {
    // DMTF's Redfish-Mockup-Server serves the CDU (fetched into target/tools if missing).
    crate::setup::redfish_mockup_server()?;
    println!("soak: both runs for {minutes} minutes, side by side");
    let runs: Vec<Result<soak::Run>> = std::thread::scope(|s| {
        let handles: Vec<_> = soak::CHURNS
            .iter()
            .map(|churn| s.spawn(move || soak::run(bin, lib, dir, minutes, warmup, churn)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a soak run panicked")))
            })
            .collect()
    });
    let runs = runs.into_iter().collect::<Result<Vec<_>>>()?;
    for (r, churn) in runs.iter().zip(&soak::CHURNS) {
        r.check(churn)?;
        println!(
            "soak: {}: {} processes started; RSS slope after warm-up {:+.2} MiB/h",
            r.label,
            r.started,
            r.slope_per_hour(|x| x.rss_kib as f64 / 1024.0)
        );
    }
    Ok(runs)
}

/// `cargo xtask bench --soak MINUTES`: each soak run for MINUTES (warm-up: 5 minutes, or a
/// quarter of a shorter run), release build; the soak section of BENCHMARKS.md is replaced
/// (or added), the rest kept.
pub fn run_soak(minutes: f64) -> Result<()> {
    // The venv (Redfish-Mockup-Server's Python), ipmi_sim and FreeIPMI, as for the tests.
    setup::test_dependencies()?;
    crate::build_ebpf()?;
    let lib = nvml_sim_profile(true)?;
    build_release(&["--bins"])?;
    let bin = root().join("target/release/junction");
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let warmup = Duration::from_secs_f64((minutes * 60.0 / 4.0).min(300.0));
    let runs = soak_runs(&bin, &lib, &dir, minutes, warmup)?;
    let section = soak::report(&runs, &format!("cargo xtask bench --soak {minutes}"));
    print!("{section}");
    replace_section("\n## Soak\n", &section)?;
    crate::nvml_sim()?;
    println!("wrote the soak section of BENCHMARKS.md");
    Ok(())
}

/// `cargo xtask bench --bmc`: the BMC polls alone, with the release build; the BMC section
/// of BENCHMARKS.md is replaced, the rest kept.
pub fn run_bmc() -> Result<()> {
    build_release(&["--bins"])?;
    let bin = root().join("target/release/junction");
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let section = bmc::report(&bmc::run(&bin, false, &dir)?);
    print!("{section}");
    replace_section("\n## BMC polls\n", &section)?;
    println!("wrote the BMC section of BENCHMARKS.md");
    Ok(())
}

/// The release build of `junction`'s `targets` (`--bins`, `--examples`).
fn build_release(targets: &[&str]) -> Result<()> {
    run_cmd(
        cargo()
            .args(["build", "--quiet", "--release", "-p", "junction"])
            .args(targets),
    )
}

/// `cargo xtask bench --fabric`: the nic and pcie polls alone, release build; that section
/// of BENCHMARKS.md is replaced (or added), the rest kept.
pub fn run_fabric() -> Result<()> {
    build_release(&["--examples"])?;
    let bin = root().join("target/release/junction");
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let section = fabric::report(&fabric::run(&bin, false, &dir)?);
    print!("{section}");
    replace_section("\n## NIC and PCIe polls\n", &section)?;
    println!("wrote the NIC and PCIe section of BENCHMARKS.md");
    Ok(())
}

/// `cargo xtask bench --dcgm`: the compatibility listener's runs alone, release build; that
/// section of BENCHMARKS.md is replaced (or added), the rest kept. With `--smoke`: the debug
/// build for a few seconds, nothing written.
pub fn run_dcgm(smoke: bool) -> Result<()> {
    let (lib, bin) = build_junction(smoke)?;
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let window = Duration::from_secs(if smoke { 3 } else { 60 });
    let section = dcgm::report(&dcgm::run(&bin, &lib, window, &dir)?);
    print!("{section}");
    if !smoke {
        replace_section("\n## dcgm-exporter compatibility output\n", &section)?;
        // Leave the debug simulator in place for the tests.
        crate::nvml_sim()?;
        println!("wrote the dcgm-exporter compatibility section of BENCHMARKS.md");
    }
    Ok(())
}

/// `cargo xtask bench --kmsg`: the kernel-log benchmarks alone, release build; that section
/// of BENCHMARKS.md is replaced, the rest kept.
pub fn run_kmsg() -> Result<()> {
    let lib = nvml_sim_profile(true)?;
    run_cmd(cargo().args([
        "build",
        "--quiet",
        "--release",
        "-p",
        "junction",
        "--bins",
        "--examples",
    ]))?;
    let bin = root().join("target/release/junction");
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let section = kmsg::report(&kmsg::run(&bin, &lib, false, &dir)?);
    print!("{section}");
    replace_section("\n## Kernel log\n", &section)?;
    println!("wrote the kernel-log section of BENCHMARKS.md");
    Ok(())
}

/// Where the section whose heading (`\n## …`) starts at `start` ends: at the next heading, or
/// the end of `text`.
fn section_end(text: &str, start: usize) -> usize {
    text[start + 1..]
        .find("\n## ")
        .map_or(text.len(), |i| start + 1 + i)
}

/// Replaces the BENCHMARKS.md section that starts with `heading` (appends it if absent).
fn replace_section(heading: &str, section: &str) -> Result<()> {
    let path = root().join("BENCHMARKS.md");
    let text = std::fs::read_to_string(&path)?;
    let out = match text.find(heading) {
        Some(start) => {
            let end = section_end(&text, start);
            format!("{}{}{}", &text[..start], section, &text[end..])
        }
        None => format!(
            "{}{section}",
            text.trim_end_matches('\n').to_string() + "\n"
        ),
    };
    std::fs::write(&path, out)?;
    Ok(())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} cores ({cpu}), Linux {}", kernel.trim())
}

/// `cargo xtask bench --ebpf`: the eBPF section and the first table's every-source row
/// (release build, the BPF programs built first); that section and that row of
/// BENCHMARKS.md are replaced, the rest kept.
pub fn run_ebpf() -> Result<()> {
    let lib = nvml_sim_profile(true)?;
    crate::build_ebpf()?;
    build_release(&["--bins", "--examples"])?;
    let bin = root().join("target/release/junction");
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let figures = ebpf::run(&bin, false)?;
    let section = ebpf::report(&figures);
    let rows = junction_rows(&bin, &lib, &dir, Duration::from_secs(60), Rows::AllSources)?;
    let row = rows
        .first()
        .map(table_row)
        .context("the every-source row")?;
    print!("{section}{row}");
    replace_section("\n## eBPF probes\n", &section)?;
    let path = root().join("BENCHMARKS.md");
    let text = std::fs::read_to_string(&path)?;
    let start = text
        .find(&format!("\n| {ALL_SOURCES} |"))
        .context("BENCHMARKS.md has no every-source row to replace")?
        + 1;
    let end = text[start..]
        .find('\n')
        .map_or(text.len(), |i| start + i + 1);
    std::fs::write(&path, format!("{}{row}{}", &text[..start], &text[end..]))?;
    crate::nvml_sim()?;
    println!("wrote the eBPF section and the every-source row of BENCHMARKS.md");
    Ok(())
}

/// Under every table of rows of the simulated node.
pub(super) const CAVEAT: &str = "\nCaveat: the simulator answers in microseconds; a real driver's NVML calls cost more (tens of µs to ms),\n\
     so these figures are the agent's own overhead, not the NVML time on a real GPU.\n";

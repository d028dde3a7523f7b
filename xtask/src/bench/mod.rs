//! `cargo xtask bench`: CPU time per collection cycle and peak RSS of the agent on simulated
//! nodes (8 and 64 GPUs, every group at 1 s, scraped once a second), side by side with
//! `nvitop-exporter` on the same simulator. `--smoke` runs each for a few seconds without
//! writing BENCHMARKS.md, so that the benchmark cannot rot.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{cargo, nvml_sim_profile, root, run as run_cmd, setup, sim_config};

mod bmc;
mod dcgm;
mod ebpf;
mod fabric;
mod kmsg;
mod scale;
mod smaps;
mod soak;

/// The row with every source a root agent runs by default (eBPF attribution, the kernel log,
/// health) besides NVML.
const ALL_SOURCES: &str =
    "junction, 8 GPUs, every default source as root (+ eBPF, kernel log; scraped)";

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

/// How a measured process is scraped in its window.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scrape {
    /// Not at all.
    No,
    /// `/metrics` once a second, no `Accept-Encoding`: the text.
    Text,
    /// `/metrics` once a second with `Accept-Encoding: gzip`, as Prometheus asks.
    Gzip,
}

impl From<bool> for Scrape {
    fn from(scraped: bool) -> Self {
        if scraped { Scrape::Text } else { Scrape::No }
    }
}

/// What one measured process did.
struct Measurement {
    label: String,
    window: Duration,
    /// From the cpuacct cgroup (ns), or the ticks where there is none.
    cpu_secs: f64,
    /// From /proc/PID/stat (10 ms ticks; includes threads that exited), as a cross-check.
    tick_cpu_secs: f64,
    peak_rss_kib: u64,
    scrapes: u32,
    series: usize,
    /// Bytes of one `/metrics` body.
    scrape_bytes: usize,
    /// How it was scraped, and the bytes of one gzip body (with [`Scrape::Gzip`]).
    scrape: Scrape,
    scrape_gzip_bytes: usize,
    /// OTLP metric requests and their body bytes, for the OTLP rows.
    otlp: Option<(u64, u64)>,
    /// GPUs on the simulated node.
    gpus: u32,
    /// CPU seconds in the window of the threads alive at both ends, by thread name
    /// (`/proc/PID/task/TID/schedstat`, nanoseconds).
    threads: std::collections::BTreeMap<String, f64>,
}

impl Measurement {
    fn cpu_ms_per_cycle(&self) -> f64 {
        // One collection cycle per second (every group at 1 s).
        self.cpu_secs * 1000.0 / self.window.as_secs_f64()
    }
    fn core_percent(&self) -> f64 {
        self.cpu_secs * 100.0 / self.window.as_secs_f64()
    }
    /// CPU seconds of the threads whose name starts with one of `prefixes`.
    fn thread_secs(&self, prefixes: &[&str]) -> f64 {
        self.threads
            .iter()
            .filter(|(name, _)| prefixes.iter().any(|p| name.starts_with(p)))
            .map(|(_, secs)| secs)
            .sum()
    }
}

pub fn run(smoke: bool) -> Result<()> {
    let window = if smoke {
        Duration::from_secs(3)
    } else {
        Duration::from_secs(60)
    };
    let lib = nvml_sim_profile(!smoke)?;
    let profile = if smoke { "debug" } else { "release" };
    let mut build = cargo();
    build.args(["build", "--quiet", "-p", "junction", "--bins", "--examples"]);
    if !smoke {
        build.arg("--release");
    }
    run_cmd(&mut build)?;
    let bin = root().join("target").join(profile).join("junction");
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let mut results = junction_rows(&bin, &lib, &dir, window, false)?;
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
    results.push(m);

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
    let mut report = report(&results, window, smoke, profile);
    report.push_str(&dcgm::report(&compat));
    report.push_str(&kmsg_report(&kmsg));
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
                let end = old[start + 1..]
                    .find("\n## ")
                    .map_or(old.len(), |i| start + 1 + i);
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

/// The junction rows (NVML and the sinks, each for `window`); with `otlp_only`, the rows the
/// OTLP section reads (not the every-source row).
fn junction_rows(
    bin: &std::path::Path,
    lib: &std::path::Path,
    dir: &std::path::Path,
    window: Duration,
    otlp_only: bool,
) -> Result<Vec<Measurement>> {
    let mut results = Vec::new();
    let rows: [Row; 11] = [
        (
            "junction, 8 GPUs",
            "h100-training.toml",
            8,
            19481,
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
        if otlp_only && label == ALL_SOURCES {
            continue;
        }
        let config = dir.join(format!("bench-{port}.toml"));
        let mut text = sim_config(lib, &format!("127.0.0.1:{port}"), 1);
        if label != ALL_SOURCES {
            // NVML and the sinks alone (what nvitop-exporter does): the eBPF and kernel-log
            // sources, on by default as root, are measured in the last row and sections below.
            text.push_str("\n[sources.ebpf]\nenabled = false\n\n[sources.kmsg]\nenabled = false\n");
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

/// `cargo xtask bench --otlp`: the rows the OTLP section reads, release build, one minute
/// each; that section of BENCHMARKS.md is replaced, the rest kept.
pub fn run_otlp() -> Result<()> {
    let lib = nvml_sim_profile(true)?;
    run_cmd(cargo().args(["build", "--quiet", "--release", "-p", "junction", "--bins"]))?;
    let bin = root().join("target/release/junction");
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let results = junction_rows(&bin, &lib, &dir, Duration::from_secs(60), true)?;
    let section = otlp_report(&results, "cargo xtask bench --otlp");
    print!("{section}");
    replace_section("\n## OTLP export\n", &section)?;
    crate::nvml_sim()?;
    println!("wrote the OTLP section of BENCHMARKS.md");
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
    run_cmd(cargo().args(["build", "--quiet", "--release", "-p", "junction", "--bins"]))?;
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
    run_cmd(cargo().args(["build", "--quiet", "--release", "-p", "junction", "--bins"]))?;
    let bin = root().join("target/release/junction");
    let dir = root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let section = bmc::report(&bmc::run(&bin, false, &dir)?);
    print!("{section}");
    replace_section("\n## BMC polls\n", &section)?;
    println!("wrote the BMC section of BENCHMARKS.md");
    Ok(())
}

/// `cargo xtask bench --fabric`: the nic and pcie polls alone, release build; that section
/// of BENCHMARKS.md is replaced (or added), the rest kept.
pub fn run_fabric() -> Result<()> {
    run_cmd(cargo().args([
        "build",
        "--quiet",
        "--release",
        "-p",
        "junction",
        "--examples",
    ]))?;
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
    let section = kmsg_report(&kmsg::run(&bin, &lib, false, &dir)?);
    print!("{section}");
    replace_section("\n## Kernel log\n", &section)?;
    println!("wrote the kernel-log section of BENCHMARKS.md");
    Ok(())
}

/// Replaces the BENCHMARKS.md section that starts with `heading` (appends it if absent).
fn replace_section(heading: &str, section: &str) -> Result<()> {
    let path = root().join("BENCHMARKS.md");
    let text = std::fs::read_to_string(&path)?;
    let out = match text.find(heading) {
        Some(start) => {
            let end = text[start + 1..]
                .find("\n## ")
                .map_or(text.len(), |i| start + 1 + i);
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

/// `junction run` with `config` on the simulated node of `tests/scenarios/<scenario>`, its
/// output discarded.
fn spawn_junction(
    bin: &std::path::Path,
    scenario: &str,
    config: &std::path::Path,
) -> Result<Child> {
    Command::new(bin)
        .env(
            "JUNCTION_NVML_SIM_SCENARIO",
            root().join("tests/scenarios").join(scenario),
        )
        .arg("--config")
        .arg(config)
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting junction")
}

/// Waits for `/metrics`, then scrapes it once a second (or not, with `scraped` false) for
/// `window` and reads the process's CPU time and peak RSS from /proc.
fn measure(
    label: &str,
    mut child: Child,
    port: u16,
    window: Duration,
    scraped: impl Into<Scrape>,
) -> Result<Measurement> {
    let scraped = scraped.into();
    let pid = child.id();
    let result = (|| {
        let ready = Instant::now();
        while scrape(port).is_err() {
            if ready.elapsed() > Duration::from_secs(30) {
                bail!("{label}: /metrics on port {port} did not answer within 30 s");
            }
            if let Some(status) = child.try_wait()? {
                bail!("{label} exited early: {status}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Let the first cycles (and GPM's baseline) settle before measuring.
        std::thread::sleep(Duration::from_secs(2));
        // One scrape outside the window counts the series and their bytes.
        let body = scrape(port)?;
        let series = body
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .count();
        let scrape_gzip_bytes = if scraped == Scrape::Gzip {
            scrape_gzip(port)?
        } else {
            0
        };
        let acct = CpuAcct::attach(pid);
        let acct0 = acct.as_ref().and_then(CpuAcct::secs);
        let cpu0 = cpu_secs(pid)?;
        let threads0 = thread_cpu_secs(pid);
        let start = Instant::now();
        let mut seconds = 0;
        let mut scrapes = 0;
        while start.elapsed() < window {
            match scraped {
                Scrape::No => {}
                Scrape::Text => {
                    scrape(port)?;
                    scrapes += 1;
                }
                Scrape::Gzip => {
                    scrape_gzip(port)?;
                    scrapes += 1;
                }
            }
            seconds += 1;
            std::thread::sleep(Duration::from_secs(seconds).saturating_sub(start.elapsed()));
        }
        let elapsed = start.elapsed();
        let cpu = cpu_secs(pid)? - cpu0;
        let mut threads = std::collections::BTreeMap::new();
        for (tid, (name, end)) in thread_cpu_secs(pid) {
            if let Some((_, begin)) = threads0.get(&tid) {
                *threads.entry(name).or_insert(0.0) += end - begin;
            }
        }
        let precise = match (acct0, acct.as_ref().and_then(CpuAcct::secs)) {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        };
        Ok(Measurement {
            label: label.into(),
            window: elapsed,
            cpu_secs: precise.unwrap_or(cpu),
            tick_cpu_secs: cpu,
            peak_rss_kib: peak_rss_kib(pid)?,
            scrapes,
            series,
            scrape_bytes: body.len(),
            scrape: scraped,
            scrape_gzip_bytes,
            otlp: None,
            gpus: 0,
            threads,
        })
    })();
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = child.wait();
    result
}

/// GET `/metrics` asking for gzip, as Prometheus does; the gzip body's bytes.
fn scrape_gzip(port: u16) -> Result<usize> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept-Encoding: gzip\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("a response head")?;
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    if !head.starts_with("http/1.") || !head.contains(" 200 ") {
        bail!("scrape failed: {}", head.lines().next().unwrap_or_default());
    }
    let body = &raw[end + 4..];
    if !head.contains("content-encoding: gzip") || !body.starts_with(&[0x1f, 0x8b]) {
        bail!("asked for gzip, got: {head}");
    }
    Ok(body.len())
}

fn scrape(port: u16) -> Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    if !body.starts_with("HTTP/1.") || !body.contains(" 200 ") {
        bail!("scrape failed: {}", body.lines().next().unwrap_or_default());
    }
    Ok(body
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default())
}

/// CPU time of a process and every thread it ever had, in nanoseconds, from a cpuacct cgroup
/// of its own (cgroup v1, as on these machines). `None` where no such cgroup can be made; the
/// benchmark then uses the 10 ms ticks of `/proc/PID/stat`.
struct CpuAcct {
    dir: std::path::PathBuf,
}

impl CpuAcct {
    fn attach(pid: u32) -> Option<Self> {
        let dir = std::path::PathBuf::from(format!("/sys/fs/cgroup/cpuacct/junction-bench-{pid}"));
        std::fs::create_dir_all(&dir).ok()?;
        let acct = Self { dir };
        std::fs::write(acct.dir.join("cgroup.procs"), pid.to_string()).ok()?;
        Some(acct)
    }

    fn secs(&self) -> Option<f64> {
        let ns: u64 = std::fs::read_to_string(self.dir.join("cpuacct.usage"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        Some(ns as f64 / 1e9)
    }
}

impl Drop for CpuAcct {
    fn drop(&mut self) {
        // Hand any process still in it back to the root group, then remove it.
        if let (Ok(procs), Some(root)) = (
            std::fs::read_to_string(self.dir.join("cgroup.procs")),
            self.dir.parent(),
        ) {
            for pid in procs.lines() {
                let _ = std::fs::write(root.join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Each thread's name and CPU seconds so far, by thread id (`schedstat`'s first field is the
/// time it ran, in nanoseconds; `comm` its name, cut to 15 bytes).
fn thread_cpu_secs(pid: u32) -> std::collections::BTreeMap<u32, (String, f64)> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let dir = task.path();
        let ns: Option<f64> = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()));
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if let Some(ns) = ns {
            out.insert(tid, (name.trim().to_string(), ns / 1e9));
        }
    }
    out
}

/// User + system CPU seconds of a process (and its exited children).
fn cpu_secs(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the ")" of the command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    Ok(ticks / clock_ticks())
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

fn peak_rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmHWM in /proc/PID/status")
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

fn report(results: &[Measurement], window: Duration, smoke: bool, profile: &str) -> String {
    let mut out = String::from("# Benchmarks\n\n");
    out.push_str(&format!(
        "Command: `cargo xtask bench{}`; {profile} build; machine: {}; measured over {} s after a 2 s warm-up.\n\n",
        if smoke { " --smoke" } else { "" },
        machine(),
        window.as_secs()
    ));
    out.push_str(&format!(
        "Every NVML group at a 1 s interval against the NVML simulator (`tests/scenarios/`, a {profile} build of\n\
         `tests/nvml-sim` that runs inside the measured process, so its cost is counted), `/metrics` scraped\n\
         once a second by the benchmark. CPU is the process's CPU time, threads that exited included,\n\
         from a cpuacct cgroup of its own (`cpuacct.usage`, nanoseconds); the ticks column is user +\n\
         system time from `/proc/PID/stat` (10 ms ticks) as a cross-check. Peak RSS is `VmHWM` (for the\n\
         last row it includes the BPF ring buffer Junction maps). Every row but the last runs NVML and the\n\
         sinks only (eBPF and kernel-log sources off), like the peer. nvitop-exporter runs on the same simulator (its pynvml loads it through\n\
         `LD_LIBRARY_PATH`) at `--interval 1.0`.\n\n\
         | process | CPU ms per 1 s cycle | % of one core | % of one core (ticks) | peak RSS (MiB) | series per scrape | scrapes |\n\
         |---|---|---|---|---|---|---|\n"
    ));
    for m in results {
        out.push_str(&format!(
            "| {} | {:.2} | {:.3} | {:.3} | {:.1} | {} | {} |\n",
            m.label,
            m.cpu_ms_per_cycle(),
            m.core_percent(),
            m.tick_cpu_secs * 100.0 / m.window.as_secs_f64(),
            m.peak_rss_kib as f64 / 1024.0,
            m.series,
            m.scrapes
        ));
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
    out.push_str(&otlp_report(results, "cargo xtask bench"));
    out
}

/// Under every table of rows of the simulated node.
const CAVEAT: &str = "\nCaveat: the simulator answers in microseconds; a real driver's NVML calls cost more (tens of µs to ms),\n\
     so these figures are the agent's own overhead, not the NVML time on a real GPU.\n";

/// The OTLP table: bytes on the wire per export, per data point and per GPU, and CPU per
/// export, beside one `/metrics` scrape of the same state.
/// The threads an OTLP metrics export runs on (`comm` names, cut to 15 bytes).
const EXPORT_THREADS: &[&str] = &["otlp-metrics", "reqwest-interna"];
/// The threads a `/metrics` scrape runs on: the Tokio runtime's.
const SCRAPE_THREADS: &[&str] = &["junction-rt"];

fn otlp_report(results: &[Measurement], command: &str) -> String {
    let base = |gpus: u32| {
        results
            .iter()
            .find(|m| m.gpus == gpus && m.label.contains("collection only"))
    };
    let scraped_as = |gpus: u32, how: Scrape| {
        results.iter().find(move |m| {
            m.gpus == gpus && m.scrape == how && m.scrapes > 0 && m.label.starts_with("junction")
        })
    };
    let scraped = |gpus: u32| scraped_as(gpus, Scrape::Text);
    // CPU per scrape of a row scraped `how`: the runtime's threads (hyper and the render, and
    // gzip when asked), less what they did in the collection-only row, per scrape.
    let cpu_scrape = |gpus: u32, how: Scrape| match (scraped_as(gpus, how), base(gpus)) {
        (Some(s), Some(b)) => Some(
            (s.thread_secs(SCRAPE_THREADS)
                - b.thread_secs(SCRAPE_THREADS) * s.window.as_secs_f64() / b.window.as_secs_f64())
                * 1000.0
                / f64::from(s.scrapes.max(1)),
        ),
        _ => None,
    };
    let mut out = String::from(
        "\n## OTLP export\n\n\
         Produced by `COMMAND` (release build). OTLP/HTTP protobuf to a counting receiver on\n\
         loopback, one export a second, not scraped. Bytes are request bodies as sent (gzip or\n\
         not); data points per export are the series of the same state on `/metrics`. CPU per\n\
         export is what the export's own threads ran (`otlp-metrics` and reqwest's runtime\n\
         thread, `/proc/PID/task/TID/schedstat`) over the minute, per request; CPU per scrape is\n\
         what the Tokio runtime's threads (hyper and the render) ran in the scraped row, less what\n\
         they ran in the collection-only row, per scrape. Both come from the threads alone, so the\n\
         collection's cost, which differs from one run of the agent to the next by more than an\n\
         export costs, does not enter them. An export writes the protobuf\n\
         request straight from the model's snapshot, as `/metrics` writes its text: with gzip\n\
         into the compressor in 64 KiB pieces as it goes (flate2 over zlib-rs, level 2, one\n\
         compressor reset for each export), so the whole uncompressed request is never held;\n\
         without, into a buffer kept across exports that the sender borrows. Where the instructions go\n\
         (callgrind on the running agent, 8-GPU node, OTLP/HTTP gzip once a second, `/metrics`\n\
         scraped once a second as text and once asking for gzip; 29 exports, 41 renders): an\n\
         export 5.38 M instructions on its thread, of which the protobuf encode 1.31 M (was\n\
         2.12 M: what the first pass finds about each point is kept for the second, constant\n\
         attributes are copied, each GPU's identity written once an export), gzip 3.82 M and\n\
         taking the snapshot 0.24 M; a text scrape 1.6 M (the render and its snapshot); a scrape\n\
         asking for gzip 5.6 M (the same, and 3.5 M of gzip and 0.45 M to set up its compressor,\n\
         tower-http's, made anew for each answer). gzip at level 2 costs what it costs on either\n\
         side, two and a half text scrapes: against a scrape that asks for gzip, as Prometheus\n\
         does, an export costs about as much; against a text scrape, it cannot. Level 1 would cut\n\
         gzip by a quarter and make the body 13 % larger (10.3 bytes a point on the 8-GPU node,\n\
         over the 10 a point aimed for). The 64-GPU request's encode (`junction once --format\n\
         otlp`, callgrind): 11.06 M instructions, was 18.17 M. On the\n\
         64-GPU node gzip of the 2.38 MB request takes 1.7 ms in a warm loop on this machine,\n\
         where flate2's default miniz_oxide took 4.6 ms.\n\n\
         The last two columns are the whole agent's (collection and export): its CPU in percent of\n\
         one core and its peak RSS (`VmHWM`). The scrape columns come from rows of their own, not\n\
         exported: `/metrics` as text (no `Accept-Encoding`), and asking for gzip as Prometheus\n\
         does on every scrape (`/metrics` answers it at the same level 2).\n\n\
         | GPUs | compression | bytes per export | data points | bytes per point | bytes per GPU per export | CPU ms per export | `/metrics` bytes | CPU ms per scrape | `/metrics` gzip bytes | CPU ms per gzip scrape | % of one core | peak RSS (MiB) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for m in results {
        let Some((requests, bytes)) = m.otlp else {
            continue;
        };
        let per_export = bytes as f64 / requests.max(1) as f64;
        // The export's own threads (its loop, and reqwest's runtime thread that sends), per
        // request; the scrape's are the runtime's (hyper and the render), less what they did
        // in the collection-only row, per scrape.
        let cpu_export = Some(m.thread_secs(EXPORT_THREADS) * 1000.0 / requests.max(1) as f64);
        let fmt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}"));
        out.push_str(&format!(
            "| {} | {} | {:.0} | {} | {:.2} | {:.0} | {} | {} | {} | {} | {} | {:.2} | {:.1} |\n",
            m.gpus,
            if m.label.contains("gzip") {
                "gzip"
            } else {
                "none"
            },
            per_export,
            m.series,
            per_export / m.series.max(1) as f64,
            per_export / f64::from(m.gpus.max(1)),
            fmt(cpu_export),
            scraped(m.gpus).map_or(0, |s| s.scrape_bytes),
            fmt(cpu_scrape(m.gpus, Scrape::Text)),
            scraped_as(m.gpus, Scrape::Gzip).map_or(0, |s| s.scrape_gzip_bytes),
            fmt(cpu_scrape(m.gpus, Scrape::Gzip)),
            m.core_percent(),
            m.peak_rss_kib as f64 / 1024.0,
        ));
    }
    out.replace("COMMAND", command) + CAVEAT
}

fn kmsg_report(k: &kmsg::Figures) -> String {
    let mut out = String::from(
        "\n## Kernel log\n\n\
         The parser alone on one thread, the signature catalog on (docs/HEALTH.md), over a corpus of\n\
         /dev/kmsg messages where one line in a thousand is an XID or\n\
         SXid and the rest kernel noise (some of it `NVRM:` lines that are not XIDs); the file path\n\
         end to end: lines appended at once to a followed file, timed until `/metrics` counts them\n\
         all (the counter is published five times a second, so short runs round up); the latency\n\
         from writing an XID record to `/dev/kmsg` to its counter changing on `/metrics` (root only).\n\
         A line that passes the first test (a fifth of this corpus: `NVRM: loading …`, `EXT4-fs (…)`)\n\
         is searched for the catalog's literals by a contiguous NFA, under 50 KB of heap where\n\
         aho-corasick's DFA took 600 KB, at about 45 ns more a line (100 against 60 ns).\n\n\
         | measurement | figure |\n|---|---|\n",
    );
    out.push_str(&format!(
        "| parser, mixed corpus ({} lines, {} relevant) | {:.2} million lines/s |\n",
        k.corpus_lines,
        k.relevant,
        k.parser_lines_per_sec / 1e6
    ));
    out.push_str(&format!(
        "| file path end to end ({} lines) | {:.2} million lines/s ({:.2} s) |\n",
        k.file_lines,
        k.file_lines as f64 / k.file_secs / 1e6,
        k.file_secs
    ));
    match k.kmsg_latency {
        Some((p50, p95, n)) => out.push_str(&format!(
            "| `/dev/kmsg` write to `/metrics` ({n} records) | median {p50:.1} ms, p95 {p95:.1} ms |\n"
        )),
        None => out.push_str("| `/dev/kmsg` write to `/metrics` | not measured (needs root) |\n"),
    }
    out
}

//! Measuring one agent: starting it on a simulated node, scraping it, and reading its CPU
//! time (a cpuacct cgroup of its own, each thread's `schedstat`, the ticks of
//! `/proc/PID/stat`) and peak RSS.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::scraper::Scraper;
use crate::root;

/// How a measured process is scraped in its window.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Scrape {
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
pub(super) struct Measurement {
    pub(super) label: String,
    pub(super) window: Duration,
    /// From the cpuacct cgroup (ns), or the ticks where there is none.
    pub(super) cpu_secs: f64,
    /// From /proc/PID/stat (10 ms ticks; includes threads that exited), as a cross-check.
    pub(super) tick_cpu_secs: f64,
    pub(super) peak_rss_kib: u64,
    pub(super) scrapes: u32,
    pub(super) series: usize,
    /// Bytes of one `/metrics` body.
    pub(super) scrape_bytes: usize,
    /// How it was scraped, and the bytes of one gzip body (with [`Scrape::Gzip`]).
    pub(super) scrape: Scrape,
    pub(super) scrape_gzip_bytes: usize,
    /// OTLP metric requests and their body bytes, for the OTLP rows.
    pub(super) otlp: Option<(u64, u64)>,
    /// GPUs on the simulated node.
    pub(super) gpus: u32,
    /// CPU seconds in the window of the threads alive at both ends, by thread name
    /// (`/proc/PID/task/TID/schedstat`, nanoseconds).
    pub(super) threads: std::collections::BTreeMap<String, f64>,
}

impl Measurement {
    pub(super) fn cpu_ms_per_cycle(&self) -> f64 {
        // One collection cycle per second (every group at 1 s).
        self.cpu_secs * 1000.0 / self.window.as_secs_f64()
    }
    pub(super) fn core_percent(&self) -> f64 {
        self.cpu_secs * 100.0 / self.window.as_secs_f64()
    }
    /// CPU seconds of the threads whose name starts with one of `prefixes`.
    pub(super) fn thread_secs(&self, prefixes: &[&str]) -> f64 {
        self.threads
            .iter()
            .filter(|(name, _)| prefixes.iter().any(|p| name.starts_with(p)))
            .map(|(_, secs)| secs)
            .sum()
    }
}

/// `junction run` with `config` on the simulated node of `tests/scenarios/<scenario>`, its
/// output discarded.
pub(super) fn spawn_junction(
    bin: &std::path::Path,
    scenario: &str,
    config: &std::path::Path,
) -> Result<Child> {
    spawn_junction_logged(bin, scenario, config, Stdio::null())
}

/// [`spawn_junction`] with its log (stderr) going to `log`.
pub(super) fn spawn_junction_logged(
    bin: &std::path::Path,
    scenario: &str,
    config: &std::path::Path,
    log: impl Into<Stdio>,
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
        .stderr(log)
        .spawn()
        .context("starting junction")
}

/// Waits for `/metrics`, then scrapes it once a second (or not, with `scraped` false) for
/// `window`, over one kept HTTP/1.1 connection as Prometheus does, and reads the process's
/// CPU time and peak RSS from /proc.
pub(super) fn measure(
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
        // The window's scrapes keep one connection, as Prometheus's do: opened here.
        let mut scraper = Scraper::new(port);
        if scraped != Scrape::No {
            scraper.get(scraped == Scrape::Gzip)?;
        }
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
                    scraper.get(false)?;
                    scrapes += 1;
                }
                Scrape::Gzip => {
                    scraper.get(true)?;
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
pub(super) fn scrape_gzip(port: u16) -> Result<usize> {
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

pub(super) fn scrape(port: u16) -> Result<String> {
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

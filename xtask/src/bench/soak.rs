//! `cargo xtask bench --soak MINUTES`: memory over time on the simulated 8-GPU node with every
//! source and both sinks on, while GPU processes come and go — eBPF watching a device
//! (`/dev/zero`, `/dev/full`: devices no test watches), on which new processes (this binary's `demo-workload`, each in a container-shaped cgroup of
//! its own) issue the NVIDIA driver's ioctls; an Xid in the kernel log every 10 s; a Redfish
//! CDU (DMTF's cooling-unit mockup, served by DMTF's Redfish-Mockup-Server) and an IPMI BMC
//! (OpenIPMI's `ipmi_sim`) polled every 5 s; OTLP/HTTP every second; `/metrics` scraped every
//! 2 s. Two runs side by side (two agents, each watching its own device): one new
//! short-lived process a second, and 100 alive at once, each living 10 s (10 new a second). RSS, threads, descriptors and series are sampled every 10 s; the
//! slope is a least-squares fit after the warm-up.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{scrape, smaps, spawn_junction};
use crate::{root, sim_config};

/// How processes come and go in one run.
pub struct Churn {
    /// What the report calls it.
    pub label: &'static str,
    /// New processes a second.
    pub per_second: usize,
    /// How long each lives (zero: it ends as soon as it has made its calls).
    pub lifetime: Duration,
    /// The device its processes call and its agent watches (the runs go side by side, each
    /// agent seeing only its own processes).
    pub device: &'static str,
    /// Whether its Xid lines go to `/dev/kmsg` (root) rather than a file of its own: one run
    /// writes the kernel log, which both agents read.
    pub xids_to_kmsg: bool,
}

/// The two runs.
pub const CHURNS: [Churn; 2] = [
    Churn {
        label: "one new process a second, each ending at once",
        per_second: 1,
        lifetime: Duration::ZERO,
        device: "/dev/zero",
        xids_to_kmsg: true,
    },
    Churn {
        label: "100 processes alive, each living 10 s (10 new a second)",
        per_second: 10,
        lifetime: Duration::from_secs(10),
        device: "/dev/full",
        xids_to_kmsg: false,
    },
];

/// The sources the soak is about: each must be up after the warm-up.
const SOURCES: &[&str] = &["nvml", "ebpf", "kmsg", "redfish", "ipmi"];

/// One reading of the agent.
#[derive(Clone, Copy)]
pub struct Reading {
    /// Seconds since the agent answered.
    pub secs: f64,
    pub rss_kib: u64,
    pub anon_kib: u64,
    pub threads: u64,
    pub fds: u64,
    pub series: usize,
    /// `junction_ebpf_processes`: processes the eBPF source tracks.
    pub tracked: f64,
    /// `junction_memory_heap_allocated_bytes` and `…_resident_bytes`: the agent's own heap,
    /// live and the pages under it, as jemalloc counts them (published every 30 s).
    pub heap: (f64, f64),
    /// `junction_history_memory_bytes`: the event history's share of the live heap.
    pub history: f64,
}

/// One run's figures.
pub struct Run {
    pub label: &'static str,
    pub minutes: f64,
    pub warmup_secs: f64,
    pub readings: Vec<Reading>,
    /// RSS (`VmRSS`, KiB) every second: (seconds since the agent answered, KiB).
    pub rss_every_second: Vec<(f64, u64)>,
    /// Processes started.
    pub started: u64,
    /// Xid lines written.
    pub xids: u64,
    /// OTLP metric requests received and their bytes.
    pub otlp: (u64, u64),
    /// Peak RSS (VmHWM), KiB.
    pub peak_kib: u64,
    /// Resident memory by kind of mapping (`smaps`) at the first reading after the warm-up
    /// and at the end.
    pub smaps: Option<(smaps::Breakdown, smaps::Breakdown)>,
}

impl Run {
    /// Least-squares slope of `f` over the readings after the warm-up, per hour.
    pub fn slope_per_hour(&self, f: impl Fn(&Reading) -> f64) -> f64 {
        let pts: Vec<(f64, f64)> = self
            .readings
            .iter()
            .filter(|r| r.secs >= self.warmup_secs)
            .map(|r| (r.secs / 3600.0, f(r)))
            .collect();
        slope(&pts)
    }

    /// Least-squares slope, per hour, of the least RSS of each whole minute after the
    /// warm-up: the memory the agent keeps, without the pages of work in flight at a reading.
    pub fn floor_slope_per_hour(&self) -> f64 {
        slope(&minute_floors(&self.rss_every_second, self.warmup_secs))
    }
}

/// The least RSS (MiB) of each whole minute from `from` seconds on, at the minute's middle
/// (hours): a reading in a minute that is cut short (the run's last) is left out, so a
/// minute's floor is always over the same number of readings.
pub fn minute_floors(samples: &[(f64, u64)], from: f64) -> Vec<(f64, f64)> {
    let mut floors: std::collections::BTreeMap<u64, (u64, usize)> = Default::default();
    for &(secs, kib) in samples.iter().filter(|s| s.0 >= from) {
        let e = floors
            .entry(((secs - from) / 60.0) as u64)
            .or_insert((u64::MAX, 0));
        *e = (e.0.min(kib), e.1 + 1);
    }
    let most = floors.values().map(|v| v.1).max().unwrap_or(0);
    floors
        .into_iter()
        .filter(|(_, (_, n))| *n * 10 >= most * 9)
        .map(|(m, (kib, _))| {
            (
                (from + m as f64 * 60.0 + 30.0) / 3600.0,
                kib as f64 / 1024.0,
            )
        })
        .collect()
}

impl Run {
    /// What the smoke run checks (counts, not times): after the warm-up, descriptors and
    /// threads stay within what the agent's pools explain — a descriptor or a thread per
    /// process that lived would add one per process started — and the eBPF source tracks no
    /// more processes than are alive and within their retention.
    pub fn check(&self, churn: &Churn) -> Result<()> {
        let after: Vec<&Reading> = self
            .readings
            .iter()
            .filter(|x| x.secs >= self.warmup_secs)
            .collect();
        if after.len() < 2 {
            bail!("{}: fewer than two readings after the warm-up", self.label);
        }
        let span = |f: &dyn Fn(&Reading) -> u64| {
            let v: Vec<u64> = after.iter().map(|x| f(x)).collect();
            v.iter().max().unwrap_or(&0) - v.iter().min().unwrap_or(&0)
        };
        if span(&|x| x.fds) > 16 {
            bail!(
                "{}: descriptors grew by {} after the warm-up",
                self.label,
                span(&|x| x.fds)
            );
        }
        if span(&|x| x.threads) > 32 {
            bail!(
                "{}: threads grew by {} after the warm-up",
                self.label,
                span(&|x| x.threads)
            );
        }
        // Alive, plus ended ones kept for the default exited_retention_secs (30 s), plus slack.
        let bound = churn.per_second as f64 * (churn.lifetime.as_secs_f64() + 30.0) * 1.5 + 10.0;
        let most = after.iter().map(|x| x.tracked).fold(0.0, f64::max);
        if most > bound {
            bail!(
                "{}: {most} processes tracked, more than {bound:.0}",
                self.label
            );
        }
        Ok(())
    }
}

/// Bytes in a MiB.
const MIB: f64 = 1024.0 * 1024.0;

/// Least-squares slope of y over x (0 for fewer than two points).
pub fn slope(pts: &[(f64, f64)]) -> f64 {
    let n = pts.len() as f64;
    if pts.len() < 2 {
        return 0.0;
    }
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The process running `junction --config <config> run` (under a wrapper).
fn agent_pid(config: &Path) -> Option<u32> {
    let want = config.display().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_string_lossy().parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<String> = cmd
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        (args.first().is_some_and(|a| a.ends_with("/junction")) && args.contains(&want))
            .then_some(pid)
    })
}

/// A workload process and the cgroup it was put in.
struct Workload {
    child: Child,
    born: Instant,
    cgroup: Option<PathBuf>,
}

impl Workload {
    fn end(mut self) {
        // Closing its stdin ends it after its current second.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
        if let Some(d) = &self.cgroup {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Where container-shaped cgroups go: the v1 `pids` hierarchy (`/docker/<id>`, as Docker
/// makes them under cgroupfs), or the unified one (`system.slice/docker-<id>.scope`).
fn cgroup_parent() -> Option<(PathBuf, bool)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut v1 = None;
    for l in info.lines() {
        let Some((left, right)) = l.split_once(" - ") else {
            continue;
        };
        let mount = left.split(' ').nth(4)?;
        if right.starts_with("cgroup2 ") {
            return Some((PathBuf::from(mount).join("system.slice"), true));
        }
        if right.starts_with("cgroup ") && right.split(',').any(|o| o == "pids") {
            v1 = Some((PathBuf::from(mount).join("docker"), false));
        }
    }
    v1
}

/// Starts one workload process registering `uuid`, in a new container cgroup when one can be
/// made.
fn spawn_workload(exe: &Path, uuid: &str, n: u64, churn: &Churn) -> Result<Workload> {
    let mut cmd = Command::new(exe);
    cmd.args(["demo-workload", uuid])
        .env("JUNCTION_DEMO_DEVICE", churn.device)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut cgroup = None;
    if let Some((parent, unified)) = cgroup_parent() {
        let id = format!(
            "{:064x}",
            ((churn.per_second as u128) << 64) | (0x50a1_0000_0000_0000u128 + u128::from(n))
        );
        let dir = if unified {
            parent.join(format!("docker-{id}.scope"))
        } else {
            parent.join(&id)
        };
        if std::fs::create_dir_all(&dir).is_ok() {
            cmd.env("JUNCTION_DEMO_CGROUP", dir.join("cgroup.procs"));
            cgroup = Some(dir);
        }
    }
    let child = cmd.spawn().context("starting a workload process")?;
    Ok(Workload {
        child,
        born: Instant::now(),
        cgroup,
    })
}

/// Runs one soak of `minutes` with the built `junction` at `bin`.
pub fn run(
    bin: &Path,
    lib: &Path,
    dir: &Path,
    minutes: f64,
    warmup: Duration,
    churn: &Churn,
) -> Result<Run> {
    let dir = dir.join(format!("soak-{}", churn.per_second));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let port = testkit::free_port();
    let otlp = testkit::otlp::Sink::start()?;
    let cdu = testkit::bmc::mockup_server(
        &testkit::shared().join("fixtures/redfish/dmtf-public-cooling-unit"),
    )
    .context("DMTF's Redfish-Mockup-Server (cargo xtask test fetches it into target/tools)")?;
    let emu = std::fs::read_to_string(root().join("tests/fixtures/ipmi/sim2.emu"))?;
    let ipmi = testkit::bmc::IpmiSim::try_start(&emu).map_err(anyhow::Error::msg)?;
    let pw = dir.join("ipmi-password");
    std::fs::write(&pw, "monpass\n")?;
    let kmsg = testkit::kmsg::writable() && !kmsg_off();
    let log = dir.join("kern.log");
    std::fs::write(&log, "")?;
    let mut cfg = format!(
        "state_dir = {:?}\n",
        dir.join("state").display().to_string()
    );
    if let Some(bytes) = history_max_bytes() {
        cfg.push_str(&format!("\n[health]\nhistory_max_bytes = {bytes}\n\n"));
    }
    cfg.push_str(&sim_config(lib, &format!("127.0.0.1:{port}"), 1));
    cfg.push_str(&format!(
        "\n[sources.ebpf]\nwatch_devices = [{:?}]\ninterval_secs = 1\n\n\
         [sources.kmsg]\ndevice = {:?}\naccept_user_records = true\nfiles = [{:?}]\n\n\
         [[sources.redfish.targets]]\nname = \"cdu\"\nurl = \"http://127.0.0.1:{}\"\ninterval_secs = 5\n\n\
         [[sources.ipmi.targets]]\nname = \"bmc\"\nhost = \"127.0.0.1\"\nport = {}\nusername = \"monitor\"\n\
         password_file = {:?}\nworkaround_flags = \"opensesspriv\"\ninterval_secs = 5\n\n\
         [sinks.otlp]\nenabled = true\nendpoint = \"http://127.0.0.1:{}\"\nprotocol = \"http/protobuf\"\ninterval_secs = 1\n",
        churn.device,
        if kmsg { "/dev/kmsg" } else { "" },
        log.display().to_string(),
        cdu.port,
        ipmi.server.port,
        pw.display().to_string(),
        otlp.port,
    ));
    let config = dir.join("soak.toml");
    std::fs::write(&config, cfg)?;
    // JUNCTION_SOAK_WRAP (e.g. "heaptrack -o target/bench/soak-%r"): the agent runs under that
    // command, for a heap profile of the soak; the figures are then the agent's own process's.
    // "%r" in it is replaced with the run's new processes a second.
    let wrap = std::env::var("JUNCTION_SOAK_WRAP")
        .unwrap_or_default()
        .replace("%r", &churn.per_second.to_string());
    // The 8x H100 node on a PCI domain of this run's own, so that its Xid lines are its own
    // (the kernel ring keeps them after the run; other agents reading it see another domain).
    let domain = 0x100 + (std::process::id() + churn.per_second as u32 * 0x10) % 0xe000;
    let scenario = dir.join("node.toml");
    let mut node = format!(
        "base = {:?}\n",
        root()
            .join("tests/scenarios/h100-training.toml")
            .display()
            .to_string()
    );
    for bus in [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb] {
        node.push_str(&format!(
            "[[gpus]]\npci_domain = {domain:#06x}\npci_bus = {bus:#04x}\n"
        ));
    }
    std::fs::write(&scenario, node)?;
    let mut agent = if wrap.trim().is_empty() {
        spawn_junction(bin, &scenario.display().to_string(), &config)?
    } else {
        let mut words = wrap.split_whitespace();
        let mut cmd = Command::new(words.next().unwrap_or_default());
        cmd.args(words)
            .arg(bin)
            .arg("--config")
            .arg(&config)
            .arg("run")
            .env("JUNCTION_NVML_SIM_SCENARIO", &scenario)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd.spawn().context("starting the wrapped agent")?
    };
    let mut pid = agent.id();
    let result = (|| {
        let ready = Instant::now();
        let body = loop {
            if let Ok(b) = scrape(port) {
                break b;
            }
            if ready.elapsed() > Duration::from_secs(60) {
                bail!("the soak's agent did not answer on /metrics within 60 s");
            }
            if let Some(st) = agent.try_wait()? {
                bail!("the soak's agent exited: {st}");
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        if !wrap.trim().is_empty() {
            pid = agent_pid(&config).unwrap_or(pid);
        }
        // The first GPU: its UUID for the workload, its PCI address for the Xid lines.
        let series = testkit::prom::parse(&body);
        let info = series
            .iter()
            .find(|s| {
                s.name == "gpu_info" && s.labels.get("gpu_index").map(String::as_str) == Some("0")
            })
            .context("gpu_info of GPU 0 on /metrics")?;
        let label = |k: &str| info.labels.get(k).cloned().unwrap_or_default();
        let uuid = label("hw_id");
        let bdf = label("gpu_pci_bdf");
        let pci = bdf
            .rsplit_once('.')
            .map_or(bdf.as_str(), |(b, _)| b)
            .to_string();
        let exe = std::env::current_exe()?;
        let start = Instant::now();
        let end = Duration::from_secs_f64(minutes * 60.0);
        let mut alive: VecDeque<Workload> = VecDeque::new();
        let mut readings = Vec::new();
        let mut rss_every_second = Vec::new();
        // Sources seen down after the warm-up: a run without one of them has not measured
        // what the report says (an agent built without its BPF object, a BMC that did not
        // answer), and fails instead.
        let mut down = std::collections::BTreeSet::new();
        // `smaps` after the warm-up, and a copy of it every 5 minutes in the run's folder
        // (`smaps-MINUTE.txt`), to look into while a long soak runs.
        let exe_path = bin
            .canonicalize()
            .unwrap_or_else(|_| bin.to_path_buf())
            .display()
            .to_string();
        let mut first_smaps = None;
        let (mut started, mut xids, mut tick) = (0u64, 0u64, 0u64);
        while start.elapsed() < end {
            if let Some(st) = agent.try_wait()? {
                bail!("the soak's agent exited after {:?}: {st}", start.elapsed());
            }
            for _ in 0..churn.per_second {
                let w = spawn_workload(&exe, &uuid, started, churn)?;
                started += 1;
                if churn.lifetime.is_zero() {
                    w.end();
                } else {
                    alive.push_back(w);
                }
            }
            while alive
                .front()
                .is_some_and(|w| w.born.elapsed() >= churn.lifetime)
            {
                if let Some(w) = alive.pop_front() {
                    w.end();
                }
            }
            if tick % 10 == 0 {
                let line = format!(
                    "NVRM: Xid (PCI:{pci}): 13, pid={}, name=trainer, Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Out Of Range Address",
                    100_000 + tick
                );
                if kmsg && churn.xids_to_kmsg {
                    testkit::kmsg::try_write(std::slice::from_ref(&line))?;
                } else {
                    use std::io::Write;
                    let mut f = std::fs::OpenOptions::new().append(true).open(&log)?;
                    writeln!(f, "{line}")?;
                }
                xids += 1;
            }
            rss_every_second.push((start.elapsed().as_secs_f64(), status_kib(pid, "VmRSS:")));
            let body = if tick % 2 == 0 {
                Some(scrape(port)?)
            } else {
                None
            };
            if tick % 10 == 0
                && let Some(body) = &body
            {
                let series = testkit::prom::parse(body);
                if start.elapsed() >= warmup {
                    for source in SOURCES {
                        let up = testkit::prom::value(
                            &series,
                            "junction_source_up",
                            &[("junction_source", source)],
                        );
                        if up != Some(1.0) {
                            down.insert(*source);
                        }
                    }
                }
                let first = start.elapsed() >= warmup && first_smaps.is_none();
                if (first || tick % 300 == 0)
                    && let Some(text) = smaps::read(pid)
                {
                    if first {
                        first_smaps = Some(smaps::breakdown(&text, &exe_path));
                    }
                    if tick % 300 == 0 {
                        let _ = std::fs::write(dir.join(format!("smaps-{}.txt", tick / 60)), text);
                    }
                }
                readings.push(Reading {
                    secs: start.elapsed().as_secs_f64(),
                    rss_kib: status_kib(pid, "VmRSS:"),
                    anon_kib: status_kib(pid, "RssAnon:"),
                    threads: status_kib(pid, "Threads:"),
                    fds: std::fs::read_dir(format!("/proc/{pid}/fd"))
                        .map(|d| d.count() as u64)
                        .unwrap_or(0),
                    series: series.len(),
                    tracked: series
                        .iter()
                        .find(|s| s.name == "junction_ebpf_processes")
                        .map_or(f64::NAN, |s| s.value),
                    heap: (
                        testkit::prom::value(&series, "junction_memory_heap_allocated_bytes", &[])
                            .unwrap_or(f64::NAN),
                        testkit::prom::value(&series, "junction_memory_heap_resident_bytes", &[])
                            .unwrap_or(f64::NAN),
                    ),
                    history: testkit::prom::value(&series, "junction_history_memory_bytes", &[])
                        .unwrap_or(f64::NAN),
                });
            }
            tick += 1;
            std::thread::sleep(Duration::from_secs(tick).saturating_sub(start.elapsed()));
        }
        for w in alive.drain(..) {
            w.end();
        }
        if !down.is_empty() {
            bail!(
                "the soak's run \"{}\": source(s) {down:?} down after the warm-up (junction_source_up); \
                 its figures would not be those of every source on (is the BPF object built into \
                 target/release/junction? `cargo xtask build-ebpf`, then build it again)",
                churn.label
            );
        }
        let last_smaps = smaps::read(pid).map(|text| {
            let _ = std::fs::write(dir.join("smaps-end.txt"), &text);
            smaps::breakdown(&text, &exe_path)
        });
        let c = otlp.counts("/v1/metrics");
        Ok(Run {
            label: churn.label,
            minutes,
            warmup_secs: warmup.as_secs_f64(),
            readings,
            rss_every_second,
            started,
            xids,
            otlp: (c.requests, c.bytes),
            peak_kib: status_kib(pid, "VmHWM:"),
            smaps: first_smaps.zip(last_smaps),
        })
    })();
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let _ = agent.wait();
    drop((cdu, ipmi));
    result
}

/// `JUNCTION_SOAK_KMSG=off`: neither run writes or reads `/dev/kmsg` (each writes its Xid
/// lines to a kernel-log file of its own), so that a soak can run beside the tests, which
/// write the kernel log.
fn kmsg_off() -> bool {
    std::env::var("JUNCTION_SOAK_KMSG").is_ok_and(|v| v == "off")
}

/// `JUNCTION_SOAK_HISTORY_MAX_BYTES=N`: the agents' `health.history_max_bytes` (the event
/// history, which the soak's Xid every 10 s fills toward its bound, 4 MiB by default: with N
/// small it is at its bound within the warm-up, and what else grows shows).
fn history_max_bytes() -> Option<u64> {
    std::env::var("JUNCTION_SOAK_HISTORY_MAX_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// What a soak run with the environment's options changed, in words ("" when none).
fn options() -> String {
    let mut out = Vec::new();
    if kmsg_off() {
        out.push("`JUNCTION_SOAK_KMSG=off`: both runs write their Xid lines to files of their own and neither agent reads `/dev/kmsg`".to_string());
    }
    if let Some(b) = history_max_bytes() {
        out.push(format!("`JUNCTION_SOAK_HISTORY_MAX_BYTES={b}`: the agents' event history bound (`health.history_max_bytes`) is {b} bytes instead of 4 MiB"));
    }
    if out.is_empty() {
        String::new()
    } else {
        format!(" Options of this run: {}.", out.join("; "))
    }
}

/// The BENCHMARKS.md section.
pub fn report(runs: &[Run], command: &str) -> String {
    let mut out = format!(
        "\n## Soak\n\n\
         Produced by `{command}` (release build). The simulated 8-GPU node with every source and\n\
         both sinks on: eBPF watching a device, on which new processes issue the NVIDIA\n\
         driver's ioctls (a client, a device, a UVM registration of GPU 0, 2 GiB allocated, then\n\
         256 MiB allocated and freed and 20 control calls a second), each in a container cgroup\n\
         of its own; an Xid 13 every 10 s (the first run writes them to `/dev/kmsg`, which both\n\
         agents read; the second to a kernel-log file of its own); DMTF's cooling-unit mockup (Redfish)\n\
         and `ipmi_sim` polled every 5 s; OTLP/HTTP every second; `/metrics` scraped every 2 s.\n\
         The two runs go side by side, each agent watching its own device (`/dev/zero`,\n\
         `/dev/full`) and seeing only its own processes, each node on a PCI domain of its own;\n\
         a run fails if NVML, eBPF, the kernel log, Redfish or IPMI is down after the warm-up.\n\
         RSS (`VmRSS`), anonymous RSS, threads and descriptors from `/proc/PID`, series and the\n\
         agent's own heap from the scrape (`junction_memory_heap_allocated_bytes`: bytes in live\n\
         allocations; `…_resident_bytes`: the pages under them after unused ones are handed\n\
         back; jemalloc's counts, published every 30 s) and the event history's share of the live\n\
         heap (`junction_history_memory_bytes`, which grows by design until its bound, 4 MiB of\n\
         file: at an Xid every 10 s, about 40 hours; it is taken from RSS in the column that\n\
         says so), every 10 s; slopes are least-squares fits after the warm-up. RSS is also read every\n\
         second, between the scrapes and the Xid lines: the floor slope is the fit of each whole\n\
         minute's least RSS, the memory the agent keeps without the pages of work in flight at a\n\
         reading (a scrape's 1.2 MB of text, an export, an event). The live heap tells a structure\n\
         that grows from pages the allocator and the kernel keep: RSS moves by half a MiB from one\n\
         reading to the next.{}\n\n\
         | run | minutes | warm-up (min) | processes started | Xid lines | OTLP exports (KiB each) | RSS after warm-up (MiB) | RSS at end (MiB) | RSS slope (MiB/h) | RSS floor slope (MiB/h) | RSS less the event history, slope (MiB/h) | anon RSS slope (MiB/h) | live heap after warm-up → end (MiB) | live heap slope (MiB/h) | live heap less the event history, slope (MiB/h) | heap resident slope (MiB/h) | peak RSS (MiB) | threads (min–max) | descriptors (min–max) | series (min–max) | tracked processes (max) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        options()
    );
    for r in runs {
        let after: Vec<&Reading> = r
            .readings
            .iter()
            .filter(|x| x.secs >= r.warmup_secs)
            .collect();
        let range = |f: &dyn Fn(&Reading) -> u64| {
            let v: Vec<u64> = after.iter().map(|x| f(x)).collect();
            format!(
                "{}–{}",
                v.iter().min().unwrap_or(&0),
                v.iter().max().unwrap_or(&0)
            )
        };
        let mib = |k: u64| k as f64 / 1024.0;
        out.push_str(&format!(
            "| {} | {:.0} | {:.0} | {} | {} | {} ({:.1}) | {:.1} | {:.1} | {:+.2} | {:+.2} | {:+.2} | {:+.2} | {:.2} → {:.2} | {:+.3} | {:+.3} | {:+.2} | {:.1} | {} | {} | {} | {:.0} |\n",
            r.label,
            r.minutes,
            r.warmup_secs / 60.0,
            r.started,
            r.xids,
            r.otlp.0,
            r.otlp.1 as f64 / 1024.0 / r.otlp.0.max(1) as f64,
            after.first().map_or(0.0, |x| mib(x.rss_kib)),
            after.last().map_or(0.0, |x| mib(x.rss_kib)),
            r.slope_per_hour(|x| mib(x.rss_kib)),
            r.floor_slope_per_hour(),
            r.slope_per_hour(|x| mib(x.rss_kib) - x.history / MIB),
            r.slope_per_hour(|x| mib(x.anon_kib)),
            after.first().map_or(f64::NAN, |x| x.heap.0 / MIB),
            after.last().map_or(f64::NAN, |x| x.heap.0 / MIB),
            r.slope_per_hour(|x| x.heap.0 / MIB),
            r.slope_per_hour(|x| (x.heap.0 - x.history) / MIB),
            r.slope_per_hour(|x| x.heap.1 / MIB),
            mib(r.peak_kib),
            range(&|x| x.threads),
            range(&|x| x.fds),
            range(&|x| x.series as u64),
            after.iter().map(|x| x.tracked).fold(0.0, f64::max),
        ));
    }
    let kinds: Vec<(&str, smaps::Breakdown, smaps::Breakdown)> = runs
        .iter()
        .filter_map(|r| r.smaps.map(|(a, b)| (r.label, a, b)))
        .collect();
    if !kinds.is_empty() {
        out.push_str(
            "\nWhere the resident memory lies, after the warm-up and at the end (`/proc/PID/smaps` summed by \
             kind of mapping; `xtask/src/bench/smaps.rs` says how each kind is told):\n\n",
        );
        out.push_str(&smaps::table(&kinds));
    }
    let longest = runs.iter().map(|r| r.minutes).fold(0.0, f64::max) as u64;
    let step = if longest >= 20 { 5 } else { 1 };
    out.push_str(&format!(
        "\nRSS over time (MiB, at the reading every 10 s nearest the minute; least–most of the \
         readings every second in that minute; the live heap in brackets), every {step} minute{} of each run:\n\n| minute |",
        if step == 1 { "" } else { "s" }
    ));
    for r in runs {
        out.push_str(&format!(" {} |", r.label));
    }
    out.push_str("\n|---|");
    for _ in runs {
        out.push_str("---|");
    }
    out.push('\n');
    for m in (0..=longest).step_by(step as usize) {
        out.push_str(&format!("| {m} |"));
        for r in runs {
            let at = r
                .readings
                .iter()
                .min_by(|a, b| {
                    (a.secs - m as f64 * 60.0)
                        .abs()
                        .total_cmp(&(b.secs - m as f64 * 60.0).abs())
                })
                .filter(|x| (x.secs - m as f64 * 60.0).abs() < 30.0);
            match at {
                Some(x) => {
                    let minute: Vec<u64> = r
                        .rss_every_second
                        .iter()
                        .filter(|s| s.0 >= m as f64 * 60.0 && s.0 < (m + 1) as f64 * 60.0)
                        .map(|s| s.1)
                        .collect();
                    let span = match (minute.iter().min(), minute.iter().max()) {
                        (Some(lo), Some(hi)) => {
                            format!("; {:.1}–{:.1}", *lo as f64 / 1024.0, *hi as f64 / 1024.0)
                        }
                        _ => String::new(),
                    };
                    out.push_str(&format!(
                        " {:.1}{span} ({:.2}) |",
                        x.rss_kib as f64 / 1024.0,
                        x.heap.0 / MIB
                    ))
                }
                None => out.push_str(" - |"),
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_is_a_least_squares_fit() {
        let pts: Vec<(f64, f64)> = (0..10)
            .map(|i| (f64::from(i), 3.0 + 0.5 * f64::from(i)))
            .collect();
        assert!((slope(&pts) - 0.5).abs() < 1e-12);
        assert_eq!(slope(&pts[..1]), 0.0);
        let flat: Vec<(f64, f64)> = (0..10)
            .map(|i| (f64::from(i), if i % 2 == 0 { 1.0 } else { 2.0 }))
            .collect();
        assert!(slope(&flat).abs() < 0.05);
    }

    #[test]
    fn a_minute_floor_is_its_least_reading_and_a_short_minute_is_left_out() {
        // From second 300 on: 10 MiB with a spike every 10 s (work in flight at a reading),
        // 1 MiB more each minute, and a last minute of only five readings.
        let samples: Vec<(f64, u64)> = (0u64..=(300 + 3 * 60 + 4))
            .map(|s| {
                let minute = s.saturating_sub(300) / 60;
                let kib = 10 * 1024 + minute * 1024 + if s % 10 == 0 { 4096 } else { 0 };
                (s as f64, kib)
            })
            .collect();
        let floors = minute_floors(&samples, 300.0);
        assert_eq!(
            floors,
            vec![
                (330.0 / 3600.0, 10.0),
                (390.0 / 3600.0, 11.0),
                (450.0 / 3600.0, 12.0),
            ]
        );
        // 1 MiB a minute is 60 MiB an hour.
        assert!((slope(&floors) - 60.0).abs() < 1e-9);
    }
}

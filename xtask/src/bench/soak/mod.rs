//! `cargo xtask bench --soak MINUTES`: memory over time on the simulated 8-GPU node with every
//! source and both sinks on, while GPU processes come and go — eBPF watching a device
//! (`/dev/zero`, `/dev/full`: devices no test watches), on which new processes (this binary's `demo-workload`, each in a container-shaped cgroup of
//! its own) issue the NVIDIA driver's ioctls; an Xid in the kernel log every 10 s; a Redfish
//! CDU (DMTF's cooling-unit mockup, served by DMTF's Redfish-Mockup-Server) and an IPMI BMC
//! (OpenIPMI's `ipmi_sim`) polled every 5 s; OTLP/HTTP every second; `/metrics` scraped every
//! 2 s. Two runs side by side (two agents, each watching its own device): one new
//! short-lived process a second, and 100 alive at once, each living 10 s (10 new a second).
//! RSS, threads, descriptors and series are sampled every 10 s, RSS also every second; the
//! slopes are least-squares fits after the warm-up (`report`).
//! Each run's folder (`target/bench/soak-N`, N its new processes a second) keeps its readings
//! (`readings.csv`, `rss-every-second.csv`) and a copy of `smaps` every 5 minutes.

use std::collections::VecDeque;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{scrape, smaps, spawn_junction_logged};
use crate::{root, sim_config};

mod readings;
mod report;
mod workload;

pub use readings::{Heap, Reading, Run};
use readings::{agent_pid, status_kib};
pub use report::report;
use workload::{Workload, spawn_workload};

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
    // The agent's log, to tell afterwards why a source went down.
    let agent_log = std::fs::File::create(dir.join("agent.log"))?;
    let mut agent = if wrap.trim().is_empty() {
        spawn_junction_logged(bin, &scenario.display().to_string(), &config, agent_log)?
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
            .stderr(agent_log);
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
        // answer), and fails instead (after writing its readings). Each with the seconds it
        // was first seen down at.
        let mut down = std::collections::BTreeMap::new();
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
            // With a small history bound, an Xid a second during the warm-up, so that the
            // history has reached its bound (and dropped its oldest half) before the slopes
            // are fitted: at an Xid every 10 s a 64 KiB bound takes about 30 minutes.
            let xid_every = if history_max_bytes().is_some() && start.elapsed() < warmup {
                1
            } else {
                10
            };
            if tick % xid_every == 0 {
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
                            down.entry(*source)
                                .or_insert_with(|| start.elapsed().as_secs_f64().round());
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
                    heap: Heap::read(&series),
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
        // The readings themselves, for a look beyond the report's fits.
        let mut csv = String::from(
            "secs,rss_kib,anon_kib,threads,fds,series,tracked,heap_allocated,heap_active,heap_metadata,heap_resident,history\n",
        );
        for x in &readings {
            csv.push_str(&format!(
                "{:.1},{},{},{},{},{},{},{},{},{},{},{}\n",
                x.secs,
                x.rss_kib,
                x.anon_kib,
                x.threads,
                x.fds,
                x.series,
                x.tracked,
                x.heap.allocated,
                x.heap.active,
                x.heap.metadata,
                x.heap.resident,
                x.history
            ));
        }
        let _ = std::fs::write(dir.join("readings.csv"), csv);
        let mut csv = String::from("secs,rss_kib\n");
        for (secs, kib) in &rss_every_second {
            csv.push_str(&format!("{secs:.1},{kib}\n"));
        }
        let _ = std::fs::write(dir.join("rss-every-second.csv"), csv);
        if !down.is_empty() {
            bail!(
                "the soak's run \"{}\": source(s) down after the warm-up (junction_source_up), with the \
                 second each was first seen down: {down:?}; its figures would not be those of every \
                 source on (its log: {}; is the BPF object built into target/release/junction? \
                 `cargo xtask build-ebpf`, then build it again)",
                churn.label,
                dir.join("agent.log").display()
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
pub(super) fn kmsg_off() -> bool {
    std::env::var("JUNCTION_SOAK_KMSG").is_ok_and(|v| v == "off")
}

/// `JUNCTION_SOAK_HISTORY_MAX_BYTES=N`: the agents' `health.history_max_bytes` (the event
/// history, which the soak's Xid every 10 s fills toward its bound, 4 MiB by default). With
/// it set, the warm-up writes an Xid a second, so that a small bound (65536: about 245 of the
/// soak's entries) is reached within the warm-up and the slopes show what else grows.
pub(super) fn history_max_bytes() -> Option<u64> {
    std::env::var("JUNCTION_SOAK_HISTORY_MAX_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
}

//! Shared helpers: the simulator library, running the real `junction` binary, scraping
//! `/metrics`, the OTLP receiver's gRPC side, the kubelet. What the demo and the benchmarks
//! need too (the parser, ports, kernel-log writes, the BMCs) is `junction-testkit`'s.

pub mod kubelet;
pub mod otlp;
pub mod prometheus;

pub use testkit::prom::{Series, parse, value};
pub use testkit::{bmc, free_port, require_tool, root, temp_dir};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The `junction` binary under test.
pub fn junction() -> Command {
    Command::new(env!("CARGO_BIN_EXE_junction"))
}

/// A scenario file under `tests/scenarios/`.
pub fn scenario(name: &str) -> PathBuf {
    root().join("tests/scenarios").join(name)
}

/// The simulator library of a build variant ("current" or "legacy"); built with
/// `cargo xtask nvml-sim` if missing (`cargo xtask test` builds it first).
pub fn sim_lib(variant: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    let lib = root()
        .join("target/nvml-sim")
        .join(variant)
        .join("libnvidia-ml.so.1");
    if lib.exists() {
        return lib;
    }
    BUILT.get_or_init(|| {
        let status = Command::new(env!("CARGO"))
            .current_dir(root())
            .args(["run", "--quiet", "-p", "xtask", "--", "nvml-sim"])
            .stdout(Stdio::null())
            .status()
            .expect("run cargo xtask nvml-sim");
        assert!(status.success(), "cargo xtask nvml-sim failed");
    });
    lib
}

/// An empty directory to stand for `/proc`: the simulator's pids are made up, and a real
/// process that happens to have one of them must not lend it its name.
pub fn empty_proc() -> PathBuf {
    let dir = std::env::temp_dir().join("junction-e2e-empty-proc");
    std::fs::create_dir_all(&dir).expect("create empty proc dir");
    dir
}

/// An empty sysfs: what [`sim_config`] points `sysfs_root` at, so that the nic and pcie
/// sources see no devices (the host's NICs or GPUs are not the simulator's).
pub fn empty_sys() -> PathBuf {
    let dir = std::env::temp_dir().join("junction-e2e-empty-sys");
    std::fs::create_dir_all(&dir).expect("create empty sys dir");
    dir
}

/// A [`sim_config`] whose `sysfs_root` is `root` instead of the empty tree.
pub fn with_sysfs_root(config: &str, root: &Path) -> String {
    config.replace(
        &format!("sysfs_root = {:?}", empty_sys().display().to_string()),
        &format!("sysfs_root = {:?}", root.display().to_string()),
    )
}

/// What [`sim_config`] says about eBPF: off, so that tests of other parts do not each load
/// BPF programs (the eBPF tests replace this table).
pub const EBPF_OFF: &str = "[sources.ebpf]\nenabled = false\n";

/// A config that points at the simulator and collects every group every second.
pub fn sim_config(variant: &str, port: u16, extra: &str) -> String {
    let mut s = format!(
        "proc_root = {:?}\nsysfs_root = {:?}\nstate_dir = {:?}\n\n[sources.nvml]\nlibrary = {:?}\ncall_timeout_ms = 500\n{extra}\n{EBPF_OFF}\n[sinks.prometheus]\nlisten = \"127.0.0.1:{port}\"\n",
        empty_proc().display().to_string(),
        empty_sys().display().to_string(),
        temp_dir().join("state").display().to_string(),
        sim_lib(variant).display().to_string()
    );
    s.push_str(&testkit::nvml_groups_every(1));
    s
}

/// The line that says the NVML source is up.
pub const NVML_UP: &str = "junction_source_up{junction_source=\"nvml\"} 1";

/// A running agent; killed on drop.
pub struct Agent {
    pub child: Child,
    pub port: u16,
    pub stderr: PathBuf,
    pub config: PathBuf,
}

impl Agent {
    /// Starts `junction run` on a scenario and waits until `/metrics` has every GPU's first
    /// cycle (the NVML source is up once each GPU has been read once).
    pub fn start(scenario_name: &str, variant: &str) -> Agent {
        let mut agent = Agent::spawn(scenario_name, variant, "");
        agent.wait_for(Duration::from_secs(30), |m| {
            m.contains("hw_gpu_memory_usage_bytes") && m.contains(NVML_UP)
        });
        agent
    }

    /// Starts `junction run` on a scenario, with `extra` lines in `[sources.nvml]`, without
    /// waiting for anything.
    pub fn spawn(scenario_name: &str, variant: &str, extra: &str) -> Agent {
        let port = free_port();
        Agent::spawn_with(
            &scenario(scenario_name),
            &sim_config(variant, port, extra),
            port,
            &[],
        )
    }

    /// Starts `junction run` on a scenario with a config of its own (made with
    /// [`sim_config`], whose port it reads back), without waiting.
    pub fn spawn_config(scenario_name: &str, config: &str) -> Agent {
        Agent::spawn_config_env(scenario_name, config, &[])
    }

    /// [`Agent::spawn_config`] with environment variables.
    pub fn spawn_config_env(scenario_name: &str, config: &str, env: &[(&str, &str)]) -> Agent {
        Agent::spawn_config_path(&scenario(scenario_name), config, env)
    }

    /// [`Agent::spawn_config_env`] with a scenario file anywhere.
    pub fn spawn_config_path(scenario_path: &Path, config: &str, env: &[(&str, &str)]) -> Agent {
        let port = config
            .split("listen = \"127.0.0.1:")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|p| p.parse().ok())
            .expect("a sim_config with a listen port");
        Agent::spawn_with(scenario_path, config, port, env)
    }

    fn spawn_with(
        scenario_path: &Path,
        config_text: &str,
        port: u16,
        env: &[(&str, &str)],
    ) -> Agent {
        let dir = temp_dir();
        let config = dir.join("junction.toml");
        std::fs::write(&config, config_text).expect("write config");
        let stderr = dir.join("stderr.log");
        let child = junction()
            .env("JUNCTION_NVML_SIM_SCENARIO", scenario_path)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .arg("--config")
            .arg(&config)
            .arg("run")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("spawn junction");
        Agent {
            child,
            port,
            stderr,
            config,
        }
    }

    /// Scrapes until `ok(body)` or the deadline (panics with the log on timeout).
    pub fn wait_for(&mut self, limit: Duration, ok: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            if let Ok(body) = scrape(self.port, Duration::from_secs(5))
                && ok(&body)
            {
                return body;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("junction exited early ({status}):\n{}", self.log());
            }
            assert!(
                start.elapsed() < limit,
                "condition not met within {limit:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The agent's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "junction did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `done()` (a marker this test wrote has been seen), polling every 100 ms;
/// panics naming `what` after `limit`. Tests wait for their own markers, never sleep.
pub fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What a GPU that is lost (fallen off the bus, failed) may still be exported with: its
/// identity and state (`model::status_samples`), its health, the agent's own counters about it,
/// and the XID counters (they count what happened to it, and survive restarts).
pub const STATUS_FAMILIES: &[&str] = &[
    "gpu_info",
    "hw_status",
    "gpu_health_reason",
    "gpu_health_action",
    "junction_nvml_timeouts_total",
    "junction_nvml_stuck",
    "junction_nvml_disabled_features",
    "junction_source_errors_total",
    "gpu_xid_errors_total",
    "gpu_xid_last_time_seconds",
];

/// The metric names exported for `hw_id` that are readings, not status (empty for a lost
/// GPU whose readings are all withdrawn).
pub fn readings_of<'a>(
    names: impl IntoIterator<Item = (&'a str, &'a str)>,
    hw_id: &str,
) -> Vec<String> {
    let mut out: Vec<String> = names
        .into_iter()
        .filter(|(_, id)| *id == hw_id)
        .map(|(n, _)| n)
        .filter(|n| !STATUS_FAMILIES.contains(n))
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// [`readings_of`] on a scrape.
pub fn scraped_readings_of(body: &str, hw_id: &str) -> Vec<String> {
    let s = parse(body);
    readings_of(
        s.iter().filter_map(|x| {
            x.labels
                .get("hw_id")
                .map(|id| (x.name.as_str(), id.as_str()))
        }),
        hw_id,
    )
}

/// GET `/metrics` with a timeout.
pub fn scrape(port: u16, timeout: Duration) -> Result<String, ureq::Error> {
    get(port, "/metrics", timeout)
}

/// GET a path with a timeout; non-2xx statuses are errors.
pub fn get(port: u16, path: &str, timeout: Duration) -> Result<String, ureq::Error> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .build()
        .into();
    agent
        .get(&format!("http://127.0.0.1:{port}{path}"))
        .call()?
        .body_mut()
        .read_to_string()
}

/// The GPU UUIDs in index order, from `gpu_info`.
pub fn uuids(series: &[Series]) -> Vec<String> {
    testkit::prom::gpus_by_index(series)
        .into_iter()
        .map(|(_, u)| u)
        .collect()
}

/// Runs a command and returns its output.
pub fn output(cmd: &mut Command) -> Output {
    cmd.output().expect("run command")
}

/// `junction --config CONFIG inventory`, on the simulator scenario `scenario` where one is
/// named (else the config's own library and the simulator's default).
pub fn inventory(config: &Path, scenario: Option<&str>) -> Output {
    let mut cmd = junction();
    if let Some(name) = scenario {
        cmd.env("JUNCTION_NVML_SIM_SCENARIO", self::scenario(name));
    }
    output(cmd.arg("--config").arg(config).arg("inventory"))
}

/// `VmRSS` of `pid` in KiB (0 when it cannot be read: the process is gone).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A row of METRICS.md's registry table (generated from the registry; a drift test keeps it
/// so): name, Prometheus name, unit, kind, attributes.
pub struct RegistryRow {
    pub name: String,
    pub prometheus: String,
    pub unit: String,
    pub kind: String,
    pub attrs: Vec<String>,
}

/// Every row of METRICS.md's registry table (the first table, before the descriptions).
pub fn registry_rows() -> Vec<RegistryRow> {
    let text = std::fs::read_to_string(root().join("METRICS.md")).expect("METRICS.md");
    text.split("\n## ")
        .next()
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cols: Vec<&str> = l
                .split(" | ")
                .map(|c| c.trim_matches(|c| c == '|' || c == ' '))
                .collect();
            let un = |c: &str| c.trim_matches('`').to_string();
            RegistryRow {
                name: un(cols[0]),
                prometheus: un(cols[1]),
                unit: un(cols[2]),
                kind: cols[3].to_string(),
                attrs: cols[4].split(", ").map(un).collect(),
            }
        })
        .collect()
}

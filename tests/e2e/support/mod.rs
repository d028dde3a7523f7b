//! Shared helpers: the simulator library, running the real `junction` binary, scraping and
//! parsing `/metrics`, an OTLP receiver.

pub mod bmc;
pub mod kubelet;
pub mod otlp;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

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

/// A fresh directory for one test's files.
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

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// An empty directory to stand for `/proc`: the simulator's pids are made up, and a real
/// process that happens to have one of them must not lend it its name.
pub fn empty_proc() -> PathBuf {
    let dir = std::env::temp_dir().join("junction-e2e-empty-proc");
    std::fs::create_dir_all(&dir).expect("create empty proc dir");
    dir
}

/// What [`sim_config`] says about eBPF: off, so that tests of other parts do not each load
/// BPF programs (the eBPF tests replace this table).
pub const EBPF_OFF: &str = "[sources.ebpf]\nenabled = false\n";

/// A config that points at the simulator and collects every group every second.
pub fn sim_config(variant: &str, port: u16, extra: &str) -> String {
    let mut s = format!(
        "proc_root = {:?}\nstate_dir = {:?}\n\n[sources.nvml]\nlibrary = {:?}\ncall_timeout_ms = 500\n{extra}\n{EBPF_OFF}\n[sinks.prometheus]\nlisten = \"127.0.0.1:{port}\"\n",
        empty_proc().display().to_string(),
        temp_dir().join("state").display().to_string(),
        sim_lib(variant).display().to_string()
    );
    for g in [
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
    ] {
        s.push_str(&format!("\n[sources.nvml.groups.{g}]\ninterval_secs = 1\n"));
    }
    s
}

/// A running agent; killed on drop.
pub struct Agent {
    pub child: Child,
    pub port: u16,
    pub stderr: PathBuf,
    pub config: PathBuf,
}

impl Agent {
    /// Starts `junction run` on a scenario and waits until `/metrics` has GPU data.
    pub fn start(scenario_name: &str, variant: &str) -> Agent {
        let mut agent = Agent::spawn(scenario_name, variant, "");
        agent.wait_for(Duration::from_secs(30), |m| {
            m.contains("hw_gpu_memory_usage_bytes")
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

/// One series of the exposition format.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the text exposition format (the subset Junction writes).
pub fn parse(text: &str) -> Vec<Series> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (head, value) = line.rsplit_once(' ').expect("value");
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (head, ""),
        };
        let mut map = BTreeMap::new();
        let mut rest = labels;
        while let Some((k, v)) = rest.split_once("=\"") {
            let mut end = 0;
            let bytes = v.as_bytes();
            while end < bytes.len()
                && !(bytes[end] == b'"' && (end == 0 || bytes[end - 1] != b'\\'))
            {
                end += 1;
            }
            map.insert(
                k.trim_start_matches(',').to_string(),
                v[..end].replace("\\\"", "\"").replace("\\\\", "\\"),
            );
            rest = &v[(end + 1).min(v.len())..];
        }
        out.push(Series {
            name: name.to_string(),
            labels: map,
            value: value.parse().expect("number"),
        });
    }
    out
}

/// The value of the one series named `name` whose labels include `labels`.
pub fn value(series: &[Series], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let hits: Vec<&Series> = series
        .iter()
        .filter(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert!(
        hits.len() <= 1,
        "{name} {labels:?} matches {} series: {hits:#?}",
        hits.len()
    );
    hits.first().map(|s| s.value)
}

/// The GPU UUIDs in index order, from `gpu_info`.
pub fn uuids(series: &[Series]) -> Vec<String> {
    let mut v: Vec<(u32, String)> = series
        .iter()
        .filter(|s| s.name == "gpu_info")
        .map(|s| {
            (
                s.labels["gpu_index"].parse().expect("index"),
                s.labels["hw_id"].clone(),
            )
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, u)| u).collect()
}

/// Runs a command and returns its output.
pub fn output(cmd: &mut Command) -> Output {
    cmd.output().expect("run command")
}

/// A tool on PATH, or `None` with the reason printed (a failure in CI, where it must exist).
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

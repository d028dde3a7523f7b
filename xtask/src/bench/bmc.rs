//! The BMC part of the benchmark: what one poll costs (requests, wall time, the agent's CPU)
//! for the DGX H100 Redfish tree with and without `$expand`, served by DMTF's
//! Redfish-Mockup-Server (the copy shipped in the `libredfish` crate on crates.io: it serves
//! `$expand`, which `sushy-static` does not), and for OpenIPMI's `ipmi_sim` read through
//! FreeIPMI.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::measure;
use crate::root;
use testkit::free_port;

/// One measured target.
pub struct Row {
    pub label: String,
    /// Requests (HTTP) or tool runs (IPMI) in one poll.
    pub requests: f64,
    /// Wall time of one poll, seconds (from `junction_target_poll_duration_seconds`).
    pub wall_secs: f64,
    /// The agent's CPU per poll (one poll a second), ms.
    pub cpu_ms: f64,
    /// Readings exported.
    pub readings: usize,
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn base_config(dir: &Path, port: u16) -> String {
    format!(
        "state_dir = {:?}\n[sources.nvml]\nenabled = false\n[sources.kmsg]\nenabled = false\n[sources.ebpf]\nenabled = false\n[sinks.prometheus]\nlisten = \"127.0.0.1:{port}\"\n",
        dir.join("state").display().to_string()
    )
}

/// `junction once` for the per-poll figures; `junction run` for the CPU.
fn measure_target(
    bin: &Path,
    dir: &Path,
    label: &str,
    section: &str,
    window: Duration,
) -> Result<Row> {
    let port = free_port();
    let config = dir.join(format!("bmc-{}.toml", label.replace(' ', "-")));
    std::fs::write(&config, format!("{}{section}", base_config(dir, port)))?;
    let out = Command::new(bin)
        .arg("--config")
        .arg(&config)
        .args(["once", "--format", "prometheus"])
        .output()?;
    if !out.status.success() {
        bail!(
            "{label}: junction once failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let metric = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    let requests = metric("junction_target_requests_total");
    let wall_secs = metric("junction_target_poll_duration_seconds");
    let readings = text
        .lines()
        .filter(|l| {
            !l.starts_with('#')
                && l.contains("junction_target=")
                && !l.starts_with("junction_")
                && !l.starts_with("bmc_")
                && !l.starts_with("hw_status")
        })
        .count();
    let child = Command::new(bin)
        .arg("--config")
        .arg(&config)
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let m = measure(label, child, port, window, false)?;
    Ok(Row {
        label: label.to_string(),
        requests,
        wall_secs,
        cpu_ms: m.cpu_secs * 1000.0 / m.window.as_secs_f64(),
        readings,
    })
}

/// Runs the BMC benchmarks with the built `junction` at `bin`.
pub fn run(bin: &Path, smoke: bool, dir: &Path) -> Result<Vec<Row>> {
    let window = if smoke {
        Duration::from_secs(3)
    } else {
        Duration::from_secs(30)
    };
    let mut rows = Vec::new();
    let dgx = testkit::shared().join("fixtures/redfish/nvidia-dgx-h100");
    rows.extend(redfish_rows(bin, dir, "DGX H100", &dgx, true, window)?);
    // The captures of real BMCs, each with and without `$expand` where it advertises it (the
    // smoke run measures one).
    let trees: &[(&str, &str)] = if smoke {
        &[("Supermicro X13 + HGX H100", "libredfish-supermicro")]
    } else {
        &[
            ("Dell iDRAC R750", "libredfish-dell"),
            ("HPE iLO DL385", "libredfish-hpe"),
            ("Lenovo XCC SR650 V2", "libredfish-lenovo"),
            ("Supermicro X13 + HGX H100", "libredfish-supermicro"),
            ("NVIDIA GB200 compute tray", "libredfish-nvidia-gb200"),
            (
                "NVIDIA GB200 NVLink switch tray",
                "libredfish-nvidia-gbswitch",
            ),
            ("NVIDIA GH200", "libredfish-nvidia-gh200"),
        ]
    };
    for (label, tree) in trees {
        let path = testkit::shared().join("realworld/redfish").join(tree);
        rows.extend(redfish_rows(
            bin,
            dir,
            label,
            &path,
            advertises_expand(&path),
            window,
        )?);
    }

    // IPMI: the simulator with the shared sensors, on free ports.
    let sim_dir = dir.join("ipmi-sim");
    let _ = std::fs::remove_dir_all(&sim_dir);
    std::fs::create_dir_all(sim_dir.join("state"))?;
    let udp = testkit::net::free_udp_port();
    let lan = std::fs::read_to_string(root().join("tests/fixtures/ipmi/lan.conf"))?
        .replace("addr 127.0.0.1 9001", &format!("addr 127.0.0.1 {udp}"))
        .replace("  console 127.0.0.1 9000\n", "");
    std::fs::write(sim_dir.join("lan.conf"), lan)?;
    let sim = Killed(
        Command::new("ipmi_sim")
            .arg("-c")
            .arg(sim_dir.join("lan.conf"))
            .arg("-f")
            .arg(root().join("tests/fixtures/ipmi/sim2.emu"))
            .arg("-s")
            .arg(sim_dir.join("state"))
            .arg("-n")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting ipmi_sim (Debian openipmi)")?,
    );
    std::thread::sleep(Duration::from_secs(1));
    let pw = sim_dir.join("pw");
    std::fs::write(&pw, "monpass\n")?;
    let section = format!(
        "[[sources.ipmi.targets]]\nname = \"sim\"\nhost = \"127.0.0.1\"\nport = {udp}\nusername = \"monitor\"\npassword_file = {:?}\nworkaround_flags = \"opensesspriv\"\ninterval_secs = 1\n",
        pw.display().to_string()
    );
    rows.push(measure_target(
        bin,
        dir,
        "IPMI ipmi_sim (4 sensors), FreeIPMI",
        &section,
        window,
    )?);
    drop(sim);
    Ok(rows)
}

/// Whether a tree's ServiceRoot advertises `$expand` (`ProtocolFeaturesSupported.ExpandQuery`).
fn advertises_expand(tree: &Path) -> bool {
    std::fs::read_to_string(tree.join("redfish/v1/index.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|root| {
            let e = &root["ProtocolFeaturesSupported"]["ExpandQuery"];
            e["Levels"] == serde_json::Value::Bool(true)
                || e["ExpandAll"] == serde_json::Value::Bool(true)
        })
}

/// One tree (tall form) served by DMTF's Redfish-Mockup-Server: a row with `$expand` (where
/// `expand`) and one without.
fn redfish_rows(
    bin: &Path,
    dir: &Path,
    label: &str,
    tree: &Path,
    expand: bool,
    window: Duration,
) -> Result<Vec<Row>> {
    let script = crate::setup::redfish_mockup_server()?;
    let python = root().join("target/venv/bin/python");
    let port = free_port();
    let server = Killed(
        Command::new(&python)
            .arg(&script)
            .args(["-H", "127.0.0.1", "-p", &port.to_string(), "-D"])
            .arg(tree)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the Redfish mockup server")?,
    );
    let start = Instant::now();
    while scrape_root(port).is_err() {
        if start.elapsed() > Duration::from_secs(30) {
            bail!("the Redfish mockup server did not answer for {label}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let modes: &[bool] = if expand { &[true, false] } else { &[false] };
    let mut rows = Vec::new();
    for &e in modes {
        let section = format!(
            "[[sources.redfish.targets]]\nname = \"bmc\"\nurl = \"http://127.0.0.1:{port}\"\ninterval_secs = 1\ntimeout_secs = 30\nexpand = {e}\n"
        );
        let row_label = format!(
            "Redfish {label}, {}",
            if e { "$expand" } else { "no $expand" }
        );
        rows.push(measure_target(bin, dir, &row_label, &section, window)?);
    }
    drop(server);
    Ok(rows)
}

fn scrape_root(port: u16) -> Result<()> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET /redfish/v1 HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    if body.contains(" 200 ") {
        Ok(())
    } else {
        bail!("not ready")
    }
}

/// The BENCHMARKS.md section.
pub fn report(rows: &[Row]) -> String {
    let mut out = String::from(
        "\n## BMC polls\n\n\
         One poll of a target: requests made (HTTP requests; for IPMI, runs of FreeIPMI's\n\
         `ipmi-sensors`), its wall time (`junction_target_poll_duration_seconds` of a `junction once`)\n\
         and the agent's CPU per poll (`junction run` polling once a second; for IPMI this includes\n\
         the `ipmi-sensors` runs, which are in the agent's cgroup). Redfish: the DGX H100 capture\n\
         (10 chassis, 96 sensors, legacy Thermal, a metric report) and the captures of real BMCs in\n\
         `../shared/realworld/redfish/libredfish-*`, each served by DMTF's Redfish-Mockup-Server\n\
         (one request at a time over HTTP/1.0, as many BMCs do), with and without `$expand` where\n\
         the tree's ServiceRoot advertises it. Produced by `cargo xtask bench --bmc` (or\n\
         `cargo xtask bench`).\n\n\
         | target | requests per poll | wall time per poll | agent CPU per poll | readings |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {:.0} | {:.0} ms | {:.1} ms | {} |\n",
            r.label,
            r.requests,
            r.wall_secs * 1000.0,
            r.cpu_ms,
            r.readings
        ));
    }
    out
}

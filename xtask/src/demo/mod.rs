//! `cargo xtask demo`: the whole node on a machine without a GPU, a BMC or a collector.
//!
//! Started, besides Junction on the simulated 8x H100 node (one GPU's HBM climbing toward its
//! limit): a coolant distribution unit over Redfish (`sushy-static` serving DMTF's CDU mockup,
//! whose secondary-loop flow the demo lowers through its thresholds), a BMC over IPMI
//! (`ipmi_sim`, read with FreeIPMI), a workload (`trainer`) that issues NVIDIA-shaped ioctls on
//! a watched device from a Docker-named cgroup, XID lines written to the kernel log (one per
//! category, one from a MIG instance), and an OTLP receiver that writes what it gets to
//! `target/demo/otlp.log`. Parts that need root (eBPF, `/dev/kmsg`, cgroups) or a tool that is
//! missing say so and are skipped; the rest runs.
//!
//! `--for SECS` stops after that long and prints what each part showed (`demo check:` lines);
//! `--plain` prints the view without redrawing the screen. Ctrl-C (SIGINT) or SIGTERM stops
//! everything it started.

mod bmc;
mod node;
mod receiver;
mod view;
pub mod workload;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{build_ebpf, cargo, nvml_sim, root, run};
use bmc::Cdu;
use node::{config, xid_lines};
use testkit::prom::{gpus_by_index, try_parse};
use view::{Shown, view};

/// How the demo runs.
#[derive(Debug, Default)]
pub struct Options {
    /// Stop after this long (non-interactive).
    pub secs: Option<u64>,
    /// Print each view instead of redrawing the screen.
    pub plain: bool,
    /// Use the binaries already built (the tests: nothing is rebuilt under running tests).
    pub no_build: bool,
    /// Where Junction serves `/metrics`.
    pub listen: String,
    /// The Python venv the demo's Redfish server (sushy-tools) lives in; made and filled if
    /// it lacks it. Default: `target/venv`, the one `cargo xtask test` makes.
    pub venv: PathBuf,
}

impl Options {
    /// `--for SECS`, `--plain`.
    pub fn parse(args: &[String]) -> Result<Options> {
        let mut o = Options {
            listen: "127.0.0.1:9474".into(),
            venv: root().join("target/venv"),
            ..Options::default()
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--for" => {
                    let v = it.next().context("--for needs seconds")?;
                    o.secs = Some(v.parse().context("--for SECS")?);
                }
                "--plain" => o.plain = true,
                "--no-build" => o.no_build = true,
                "--listen" => o.listen = it.next().context("--listen needs HOST:PORT")?.clone(),
                "--venv" => o.venv = PathBuf::from(it.next().context("--venv needs a directory")?),
                other => bail!(
                    "unknown demo option {other:?} (use --for SECS, --plain, --no-build, --listen HOST:PORT, --venv DIR)"
                ),
            }
        }
        Ok(o)
    }
}

/// The GPU the workload registers.
const WORKLOAD_GPU: usize = 0;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// A process the demo started: stopped (SIGTERM, then SIGKILL) when dropped.
struct Started {
    name: &'static str,
    child: Child,
}

impl Started {
    fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // Closing stdin ends the workload; SIGTERM the others.
        drop(self.child.stdin.take());
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        self.stop();
    }
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let (head, rest) = body.split_once("\r\n\r\n")?;
    (head.split_whitespace().nth(1) == Some("200")).then(|| rest.to_string())
}

fn wait_port(port: u16, path: &str, child: &mut Child, what: &str) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if http_get(port, path).is_some() {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            bail!("{what} exited: {st}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("{what} did not answer on port {port}")
}

/// `cargo xtask demo [--for SECS] [--plain]`.
pub fn demo(opts: Options) -> Result<()> {
    // SAFETY: installing async-signal-safe handlers that only store to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let dir = root().join("target/demo");
    std::fs::create_dir_all(&dir)?;
    let _ = std::fs::remove_dir_all(dir.join("state"));
    let mut notes: Vec<String> = Vec::new();
    // SAFETY: geteuid has no preconditions.
    let is_root = unsafe { libc::geteuid() } == 0;

    let bpf_object = root().join("collector-ebpf/target/bpfel-unknown-none/release/junction-ebpf");
    if !opts.no_build {
        println!("building the NVML simulator and Junction …");
        nvml_sim()?;
    }
    let bpf = if !is_root {
        notes.push("eBPF attribution, the kernel log and the workload's cgroup need root: skipped (run as root to see them)".into());
        false
    } else if opts.no_build {
        bpf_object.exists()
    } else {
        match build_ebpf() {
            Ok(_) => true,
            Err(e) => {
                notes.push(format!(
                    "eBPF attribution skipped: the BPF programs do not build here ({e:#})"
                ));
                false
            }
        }
    };
    if !opts.no_build {
        run(cargo().args(["build", "--quiet", "-p", "junction"]))?;
    }
    let junction = root().join("target/debug/junction");

    // The Redfish server and the IPMI tools, installed as `cargo xtask test` installs them.
    let deps = crate::setup::demo_dependencies(&opts.venv, is_root);
    if deps.installed.is_empty() {
        println!("demo setup: nothing to install");
    } else {
        println!("demo setup: installed {}", deps.installed.join("; "));
    }

    let mut started: Vec<Started> = Vec::new();
    let receiver = receiver::Receiver::start(&dir.join("otlp.log"))?;

    // The CDU over Redfish.
    let cdu = Cdu::prepare(&dir.join("redfish"));
    let redfish = bmc::start_redfish(deps.sushy.clone(), &cdu, &dir, &mut started, &mut notes)?;

    // The BMC over IPMI.
    let ipmi_sim = bmc::start_ipmi(deps.ipmi, &mut notes);
    let ipmi = ipmi_sim.as_ref().map(|sim| sim.server.port);

    // The node: the demo scenario on a PCI domain of this run's own.
    let (domain, scenario) = node::write_scenario(&dir)?;
    let config_path = dir.join("junction.toml");
    std::fs::write(
        &config_path,
        config(
            &dir,
            is_root,
            bpf,
            redfish,
            ipmi,
            receiver.port,
            &opts.listen,
        ),
    )?;
    let mut child = Command::new(&junction)
        .env("JUNCTION_NVML_SIM_SCENARIO", &scenario)
        .env("JUNCTION_DEMO_IPMI_PASSWORD", "monpass")
        .arg("--config")
        .arg(&config_path)
        .arg("run")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("junction.log"))?)
        .spawn()
        .context("start junction")?;
    let port: u16 = opts
        .listen
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(9474);
    if let Err(e) = wait_port(port, "/metrics", &mut child, "junction") {
        let log = std::fs::read_to_string(dir.join("junction.log")).unwrap_or_default();
        let _ = child.kill();
        let _ = child.wait();
        bail!("{e:#}\n{log}");
    }
    started.push(Started {
        name: "junction",
        child,
    });
    let t0 = Instant::now();
    let uuids: Vec<String> = gpus_by_index(
        &try_parse(&http_get(port, "/metrics").unwrap_or_default()).unwrap_or_default(),
    )
    .into_iter()
    .map(|(_, u)| u)
    .collect();

    // The workload, in a cgroup named like a Docker container's.
    let mut cgroup_dir = None;
    let mut workload_pid = None;
    if bpf && let Some(uuid) = uuids.get(WORKLOAD_GPU) {
        let exe = dir.join("trainer");
        let _ = std::fs::remove_file(&exe);
        std::fs::copy(std::env::current_exe()?, &exe)?;
        let mut cmd = Command::new(&exe);
        cmd.args(["demo-workload", uuid])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(cg) = testkit::cgroup2_root() {
            let id = format!("de0de0{}00", "7a11".repeat(14));
            let d = cg.join("system.slice").join(format!("docker-{id}.scope"));
            if std::fs::create_dir_all(&d).is_ok() {
                cmd.env("JUNCTION_DEMO_CGROUP", d.join("cgroup.procs"));
                cgroup_dir = Some(d);
            }
        }
        let child = cmd.spawn().context("start the workload")?;
        workload_pid = Some(child.id());
        started.push(Started {
            name: "trainer (workload)",
            child,
        });
    }

    let schedule = if is_root {
        xid_lines(domain, workload_pid)
    } else {
        Vec::new()
    };
    let mut next_xid = 0;
    let mut shown = Shown::default();
    let mut last_view = Instant::now() - Duration::from_secs(60);
    let refresh = if opts.plain {
        Duration::from_secs(5)
    } else {
        Duration::from_secs(2)
    };
    let mut flow = 42.0;
    let mut last_flow = Instant::now();
    loop {
        let t = t0.elapsed().as_secs_f64();
        if STOP.load(Ordering::SeqCst) || opts.secs.is_some_and(|s| t >= s as f64) {
            break;
        }
        // One XID every 4 s from t = 8 s.
        if let Some((_, _, line)) = schedule.get(next_xid)
            && t >= 8.0 + 4.0 * next_xid as f64
        {
            next_xid += 1;
            if let Err(e) = testkit::kmsg::try_write(std::slice::from_ref(line)) {
                notes.push(format!("cannot write the kernel log: {e:#}"));
                next_xid = schedule.len();
            }
        }
        // From t = 10 s the coolant flow falls 1 L/min a second, to 12 L/min.
        if redfish.is_some()
            && t >= 10.0
            && flow > 12.0
            && last_flow.elapsed() >= Duration::from_secs(1)
        {
            flow -= 1.0;
            last_flow = Instant::now();
            if let Ok(cdu) = &cdu
                && let Err(e) = cdu.set_flow(flow)
            {
                notes.push(format!("cannot update the CDU mockup: {e:#}"));
            }
        }
        if last_view.elapsed() >= refresh {
            last_view = Instant::now();
            let page = http_get(port, "/metrics").unwrap_or_default();
            let text = view(
                &page,
                &receiver.seen(),
                t,
                (&opts.listen, &deps.missing),
                &notes,
                &mut shown,
            );
            if opts.plain {
                println!("{text}{}", "-".repeat(100));
            } else {
                print!("\x1b[H\x1b[2J{text}");
            }
            let _ = std::io::stdout().flush();
        }
        std::thread::sleep(Duration::from_millis(200));
    }

    // Stop everything, the agent first (its last export), then the rest.
    let mut pids = Vec::new();
    for s in started.iter_mut().rev() {
        pids.push(format!("{}={}", s.name, s.child.id()));
        s.stop();
    }
    drop(started);
    if let Some(sim) = ipmi_sim {
        pids.push(format!("ipmi_sim={}", sim.server.child.id()));
        drop(sim);
    }
    if let Some(d) = cgroup_dir {
        // Its own scope only: system.slice is the host's.
        let _ = std::fs::remove_dir(&d);
    }
    let seen = receiver.seen();
    if opts.secs.is_some() {
        let say = |what: &str, v: Option<&String>| {
            println!(
                "demo check: {what}: {}",
                v.map_or("NOT SEEN".to_string(), |v| format!("seen: {v}"))
            );
        };
        say("forecast", shown.forecast.as_ref());
        say("workload", shown.workload.as_ref());
        for (_, code, _) in xid_lines(domain, workload_pid) {
            say(&format!("xid {code}"), shown.xids.get(&code));
        }
        say("coolant alarm", shown.coolant_alarm.as_ref());
        say("ipmi", shown.ipmi.as_ref());
        let otlp = (seen.metric_exports > 0 && seen.log_records > 0).then(|| {
            format!(
                "{} metric exports, {} log records",
                seen.metric_exports, seen.log_records
            )
        });
        say("otlp", otlp.as_ref());
        for n in &notes {
            println!("demo note: {n}");
        }
    }
    println!("demo started: {}", pids.join(" "));
    // Said only once every process it started is gone.
    let alive: Vec<&String> = pids
        .iter()
        .filter(|p| {
            p.rsplit('=')
                .next()
                .and_then(|n| n.parse::<i32>().ok())
                // SAFETY: kill with signal 0 only checks that the process exists.
                .is_some_and(|pid| unsafe { libc::kill(pid, 0) } == 0)
        })
        .collect();
    if !alive.is_empty() {
        bail!("demo stopped, but these still run: {alive:?}");
    }
    println!("demo stopped: everything it started has exited");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part that cannot run is named in the view's first lines, with the command that
    /// brings it, before anything else.
    #[test]
    fn what_is_missing_comes_first_with_its_command() {
        let missing = [(
            "the IPMI BMC (installing needs root)".to_string(),
            "sudo apt-get install openipmi freeipmi-tools".to_string(),
        )];
        let text = view(
            "",
            &receiver::Seen::default(),
            3.0,
            ("127.0.0.1:9474", &missing),
            &["a note".to_string()],
            &mut Shown::default(),
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("Junction demo"), "{text}");
        assert_eq!(
            lines[1],
            "MISSING: the IPMI BMC (installing needs root); to bring it: sudo apt-get install openipmi freeipmi-tools"
        );
    }
}

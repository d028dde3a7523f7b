//! The container image end to end (as root, with podman and runc): the image `cargo xtask
//! image` built from the `Dockerfile`, run privileged the way the DaemonSet runs it (host pid
//! namespace, the host's NVML library mounted in — here the simulator's), collects NVML, attaches
//! its BPF programs to this kernel and attributes a host workload, counts an XID written to the
//! host's kernel log, drops its capabilities, passes its HEALTHCHECK and stops cleanly on
//! `podman stop`. Run without privileges it still serves NVML and says why the rest is off,
//! and its HEALTHCHECK fails naming the sources that are down.
//!
//! The image is `$JUNCTION_IMAGE`, else `localhost/junction:dev`; `cargo xtask test` builds it
//! first. Outside CI the tests skip when podman or the image is missing; in CI they fail.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::support::{self, parse, value};
use crate::{ebpf, kmsg};

const RUNC: &str = "/usr/sbin/runc";

fn podman() -> Command {
    let mut c = Command::new("podman");
    c.args(["--runtime", RUNC]);
    c
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run podman");
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The image to test, or `None` (skipped outside CI) when it cannot run here.
fn image() -> Option<String> {
    let skip = |why: &str| {
        assert!(
            std::env::var_os("CI").is_none(),
            "{why} (CI runs `cargo xtask test`, which builds it)"
        );
        eprintln!("SKIPPED: {why}");
        None
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip("not root: privileged containers need root");
    }
    let image = std::env::var("JUNCTION_IMAGE").unwrap_or_else(|_| "localhost/junction:dev".into());
    let exists = Command::new("podman")
        .args(["image", "exists", &image])
        .status()
        .is_ok_and(|s| s.success());
    if !exists {
        return skip(&format!("no image {image}: run `cargo xtask image`"));
    }
    Some(image)
}

/// A container removed on drop.
struct Container {
    name: String,
}

impl Container {
    fn start(
        image: &str,
        privileged: bool,
        config: &Path,
        scenario: &Path,
        state: &Path,
    ) -> Container {
        let how: &[&str] = if privileged {
            &["--privileged", "--pid", "host"]
        } else {
            &[]
        };
        Container::start_with(image, how, config, scenario, state)
    }

    /// Starts the image with `how` (podman run options: privileges, namespaces, mounts).
    fn start_with(
        image: &str,
        how: &[&str],
        config: &Path,
        scenario: &Path,
        state: &Path,
    ) -> Container {
        let name = format!("junction-test-{}-{}", std::process::id(), how.len());
        let _ = podman().args(["rm", "-f", &name]).output();
        let lib = support::sim_lib("current");
        let mut c = podman();
        c.args(["run", "-d", "--name", &name, "--network", "host"])
            .args([
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
            ]);
        c.args(how);
        c.arg("-v")
            .arg(format!(
                "{}:/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1:ro",
                lib.display()
            ))
            .arg("-v")
            .arg(format!("{}:/scenario.toml:ro", scenario.display()))
            // A derived scenario names its base by its path here.
            .arg("-v")
            .arg(format!(
                "{0}:{0}:ro",
                support::root().join("tests/scenarios").display()
            ))
            .arg("-v")
            .arg(format!(
                "{}:/etc/junction/junction.toml:ro",
                config.display()
            ))
            .arg("-v")
            .arg(format!("{}:/var/lib/junction", state.display()))
            .args(["-e", "JUNCTION_NVML_SIM_SCENARIO=/scenario.toml"])
            .arg(image);
        run(&mut c);
        Container { name }
    }

    fn logs(&self) -> String {
        let out = podman()
            .args(["logs", &self.name])
            .output()
            .expect("podman logs");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    fn pid(&self) -> u32 {
        let out = run(podman().args(["inspect", "-f", "{{.State.Pid}}", &self.name]));
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a pid")
    }

    /// Runs the image's HEALTHCHECK now: its exit status and what it printed.
    fn healthcheck(&self) -> (bool, String) {
        let out = podman()
            .args(["healthcheck", "run", &self.name])
            .output()
            .expect("podman healthcheck run");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// `podman stop`, then the exit code. The stop timeout (after which podman kills, exit 137)
    /// is 10 s: the agent's shutdown deadline is 3 s for the sources and 3 s for the sinks, so
    /// exit 0 means it stopped within it (plus podman's own margin).
    fn stop(&self) -> i64 {
        run(podman().args(["stop", "-t", "10", &self.name]));
        let out = run(podman().args(["inspect", "-f", "{{.State.ExitCode}}", &self.name]));
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("an exit code")
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "-f", "-t", "2", &self.name]).output();
    }
}

fn wait_metrics(port: u16, c: &Container, ok: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        if let Ok(page) = support::scrape(port, Duration::from_secs(5))
            && ok(&page)
        {
            return page;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not seen within 60 s; container log:\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn files(port: u16, extra: &str) -> (PathBuf, PathBuf) {
    let dir = support::temp_dir();
    let config = dir.join("junction.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = \"/var/lib/junction\"\n\n[sinks.prometheus]\nlisten = \"127.0.0.1:{port}\"\n\n{extra}"
        ),
    )
    .expect("config");
    let state = dir.join("state");
    std::fs::create_dir_all(&state).expect("state dir");
    (config, state)
}

#[test]
fn privileged_the_image_collects_attributes_counts_xids_drops_privileges_and_stops_cleanly() {
    let Some(image) = image() else { return };
    if ebpf::cannot_run() {
        return;
    }
    // The image's metadata: a HEALTHCHECK running `junction healthcheck`, and labels.
    let out = run(podman().args([
        "image",
        "inspect",
        "--format",
        "{{json .Config.Healthcheck}} {{index .Labels \"org.opencontainers.image.title\"}}",
        &image,
    ]));
    let meta = String::from_utf8_lossy(&out.stdout);
    assert!(meta.contains("junction\",\"healthcheck"), "{meta}");
    assert!(meta.trim_end().ends_with(" junction"), "{meta}");

    let port = support::free_port();
    let d = kmsg::domain(9);
    let scenario = kmsg::scenario(d, 4, "");
    let (config, state) = files(
        port,
        "[sources.kmsg]\naccept_user_records = true\n\n[sources.ebpf]\nwatch_devices = [\"/dev/null\"]\ninterval_secs = 1\n",
    );
    let c = Container::start(&image, true, &config, &scenario, &state);
    let page = wait_metrics(port, &c, |m| {
        m.contains("junction_source_up{junction_source=\"ebpf\"} 1")
            && m.contains("junction_source_up{junction_source=\"kmsg\"} 1")
            && m.matches("gpu_info{").count() == 4
    });
    let uuids = support::uuids(&parse(&page));

    // Least privilege inside the container, on every thread.
    let pid = c.pid();
    let kept = format!("{:016x}", (1u64 << 2) | (1u64 << 19));
    let start = Instant::now();
    loop {
        let statuses: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("tasks")
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
            .collect();
        let all = statuses.iter().all(|s| {
            s.contains(&format!("CapEff:\t{kept}"))
                && s.contains(&format!("CapBnd:\t{kept}"))
                && s.contains("NoNewPrivs:\t1")
        });
        if all && !statuses.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "capabilities not dropped:\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // A host workload, attributed by the BPF programs the container attached (host pids).
    let w = ebpf::spawn_workload("basic", &uuids[1], 11);
    ebpf::wait_pid_on(port, w.pid, "uvm_register_gpu", &|| c.logs());
    w.finish();

    // An XID written to the host's kernel log is counted on its GPU.
    kmsg::kmsg_write(&[format!(
        "NVRM: Xid (PCI:{d:04x}:1a:00): 48, pid=4242, name=trainer, An uncorrectable double bit error (DBE) has been detected on GPU"
    )]);
    // (The ring holds other tests' XIDs too, read at the first start: wait for this one.)
    let mine = format!(
        "gpu_xid_errors_total{{hw_id=\"{}\",gpu_xid=\"48\"",
        uuids[2]
    );
    let page = wait_metrics(port, &c, |m| m.contains(&mine));
    assert_eq!(
        value(
            &parse(&page),
            "gpu_xid_errors_total",
            &[("hw_id", &uuids[2]), ("gpu_xid", "48")]
        ),
        Some(1.0),
        "{page}"
    );

    let (healthy, said) = c.healthcheck();
    assert!(healthy, "HEALTHCHECK failed: {said}\n{}", c.logs());

    assert_eq!(c.stop(), 0, "exit code after podman stop:\n{}", c.logs());
    let logs = c.logs();
    assert!(logs.contains("dropped every other capability"), "{logs}");
    assert!(logs.contains("stopped"), "{logs}");
    // The kernel-log checkpoint was written to the state volume, and parses.
    let saved =
        std::fs::read_to_string(state.join("xid.json")).expect("xid.json in the state volume");
    let saved: serde_json::Value = serde_json::from_str(&saved).expect("xid.json is JSON");
    assert!(saved["kmsg_next_seq"].is_u64(), "{saved}");
}

#[test]
fn unprivileged_the_image_serves_nvml_says_why_the_rest_is_off_and_is_unhealthy() {
    let Some(image) = image() else { return };
    let port = support::free_port();
    let (config, state) = files(port, "");
    let scenario = support::scenario("h100-training.toml");
    let c = Container::start(&image, false, &config, &scenario, &state);
    let page = wait_metrics(port, &c, |m| {
        m.contains("hw_gpu_memory_usage_bytes")
            && m.contains("junction_source=\"ebpf\"")
            && m.contains(support::NVML_UP)
    });
    let s = parse(&page);
    assert_eq!(
        value(&s, "junction_source_up", &[("junction_source", "nvml")]),
        Some(1.0)
    );
    assert_eq!(
        value(&s, "junction_source_up", &[("junction_source", "ebpf")]),
        Some(0.0)
    );
    let logs = c.logs();
    assert!(
        logs.contains("CAP_BPF"),
        "the eBPF source names what it lacks:\n{logs}"
    );
    assert!(
        logs.contains("cannot open the kernel log") && logs.contains("mount the host's /dev/kmsg"),
        "the kernel-log source says why it is off:\n{logs}"
    );
    let (healthy, said) = c.healthcheck();
    assert!(!healthy, "unhealthy while sources are down: {said}");
    let out = podman()
        .args(["exec", &c.name, "junction", "healthcheck"])
        .output()
        .expect("exec");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success() && said.contains("ebpf"), "{said}");
    assert_eq!(c.stop(), 0, "{}", c.logs());
}

/// The DaemonSet's securityContext, reproduced with podman: not privileged, every capability
/// dropped but the ones `config/kubernetes/daemonset.yaml` adds, no_new_privs, seccomp
/// unconfined, a read-only root, /dev/kmsg as a device and the host paths it mounts
/// (`tracing`: what is mounted on the container's /sys/kernel/tracing).
fn daemonset_args(caps: &str, tracing: &Path) -> Vec<String> {
    let mut how: Vec<String> = [
        "--pid",
        "host",
        "--cap-drop",
        "ALL",
        "--cap-add",
        caps,
        "--security-opt",
        "no-new-privileges",
        "--security-opt",
        "seccomp=unconfined",
        "--read-only",
        "--device",
        "/dev/kmsg:/dev/kmsg:r",
        "-v",
        "/sys/kernel/btf:/sys/kernel/btf:ro",
        "-v",
        "/sys/fs/cgroup:/sys/fs/cgroup:ro",
    ]
    .map(String::from)
    .to_vec();
    how.push("-v".into());
    how.push(format!("{}:/sys/kernel/tracing:ro", tracing.display()));
    how
}

/// The host's tracefs on /sys/kernel/tracing, as a node has it (systemd mounts it at boot;
/// some hosts have it only under /sys/kernel/debug/tracing): the DaemonSet mounts that path,
/// and without CAP_SYS_ADMIN the agent cannot mount it in the container.
fn host_tracefs() {
    let tracing = Path::new("/sys/kernel/tracing");
    if tracing.join("events").exists() {
        return;
    }
    let out = Command::new("mount")
        .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
        .output()
        .expect("run mount");
    assert!(
        out.status.success() && tracing.join("events").exists(),
        "mounting the host's tracefs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn with_the_daemonsets_capabilities_alone_every_source_runs() {
    let Some(image) = image() else { return };
    if ebpf::cannot_run() {
        return;
    }
    host_tracefs();
    let caps = crate::deploy::daemonset_capabilities().join(",");
    let port = support::free_port();
    let (config, state) = files(
        port,
        "[sources.kmsg]\naccept_user_records = true\n\n[sources.ebpf]\nwatch_devices = [\"/dev/null\"]\ninterval_secs = 1\n",
    );
    let scenario = support::scenario("h100-training.toml");
    let how = daemonset_args(&caps, Path::new("/sys/kernel/tracing"));
    let how: Vec<&str> = how.iter().map(String::as_str).collect();
    let c = Container::start_with(&image, &how, &config, &scenario, &state);
    let page = wait_metrics(port, &c, |m| {
        m.contains("junction_source_up{junction_source=\"ebpf\"}")
            && m.contains("junction_source_up{junction_source=\"kmsg\"}")
            && m.contains(support::NVML_UP)
            && m.contains("gpu_info{")
    });
    let s = parse(&page);
    for source in ["nvml", "kmsg", "ebpf"] {
        assert_eq!(
            value(&s, "junction_source_up", &[("junction_source", source)]),
            Some(1.0),
            "{source} is down with {caps}:\n{}",
            c.logs()
        );
    }
    let uuids = support::uuids(&s);
    let w = ebpf::spawn_workload("basic", &uuids[6], 12);
    ebpf::wait_pid_on(
        port,
        w.pid,
        "process_executable_name=\"nvworkload\"",
        &|| c.logs(),
    );
    w.finish();
    assert_eq!(c.stop(), 0, "{}", c.logs());
}

/// The DaemonSet's set on a host whose /sys/kernel/tracing is not tracefs (an empty
/// directory): the agent cannot mount it without CAP_SYS_ADMIN, so eBPF is off, and it says
/// to mount the host's tracefs, not to grant capabilities it already has; the other sources
/// run.
#[test]
fn with_the_daemonsets_capabilities_and_no_host_tracefs_ebpf_says_to_mount_it() {
    let Some(image) = image() else { return };
    if ebpf::cannot_run() {
        return;
    }
    let caps = crate::deploy::daemonset_capabilities().join(",");
    let port = support::free_port();
    let (config, state) = files(port, "[sources.kmsg]\naccept_user_records = true\n");
    let empty = support::temp_dir();
    let scenario = support::scenario("h100-training.toml");
    let how = daemonset_args(&caps, &empty);
    let how: Vec<&str> = how.iter().map(String::as_str).collect();
    let c = Container::start_with(&image, &how, &config, &scenario, &state);
    let page = wait_metrics(port, &c, |m| {
        m.contains("junction_source_up{junction_source=\"ebpf\"}")
            && m.contains("gpu_info{")
            && m.contains(support::NVML_UP)
    });
    let s = parse(&page);
    for (source, up) in [("nvml", 1.0), ("kmsg", 1.0), ("ebpf", 0.0)] {
        assert_eq!(
            value(&s, "junction_source_up", &[("junction_source", source)]),
            Some(up),
            "{source} with {caps} and no tracefs:\n{}",
            c.logs()
        );
    }
    let logs = c.logs();
    assert!(
        logs.contains("tracefs is not mounted on /sys/kernel/tracing")
            && logs.contains("mount the host's /sys/kernel/tracing")
            && !logs.contains("grant CAP_BPF"),
        "the eBPF source names the missing mount:\n{logs}"
    );
    assert_eq!(c.stop(), 0, "{}", c.logs());
}

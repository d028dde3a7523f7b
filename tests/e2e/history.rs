//! What the node remembers across reboots, end to end: the real `junction` on the simulator,
//! its boot id read from a `/proc` of this test's own (a simulated reboot is a new boot id),
//! XID lines in a followed kernel-log file. The same hardware XID on GPU 0 in two boots
//! fails it for inspection (and GPU 1, with one XID in one boot, is not); once the first
//! boot's XID is older than the window, the reason clears; `junction history` shows both
//! boots, while the agent runs and after it stopped.

use std::path::Path;
use std::time::Duration;

use crate::support::{self, Agent, parse, value};

fn set_boot(proc_dir: &Path, id: &str) {
    let p = proc_dir.join("sys/kernel/random");
    std::fs::create_dir_all(&p).expect("proc dir");
    std::fs::write(p.join("boot_id"), format!("{id}\n")).expect("boot_id");
}

fn append(f: &Path, line: &str) {
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(f)
        .and_then(|mut h| writeln!(h, "{line}"))
        .expect("append");
}

fn config(port: u16, proc_dir: &Path, state: &Path, kern: &Path) -> String {
    config_with(port, proc_dir, state, kern, "", "")
}

/// `kmsg`: more `[sources.kmsg]` lines; `health`: more `[health]` lines.
fn config_with(
    port: u16,
    proc_dir: &Path,
    state: &Path,
    kern: &Path,
    kmsg: &str,
    health: &str,
) -> String {
    let base = support::sim_config("current", port, "").replace(
        &format!(
            "proc_root = {:?}",
            support::empty_proc().display().to_string()
        ),
        &format!("proc_root = {:?}", proc_dir.display().to_string()),
    );
    let (head, rest) = base.split_once("state_dir = ").expect("a state_dir line");
    let rest = rest.split_once('\n').map_or("", |(_, r)| r);
    let base = format!(
        "{head}state_dir = {:?}\n{rest}",
        state.display().to_string()
    );
    format!(
        "{base}\n[sources.kmsg]\ndevice = \"\"\nfiles = [{:?}]\n{kmsg}\n[health]\ninterval_secs = 1\nclear_after_secs = 2\nescalate_boots_window_secs = 25\n{health}",
        kern.display().to_string()
    )
}

fn history(cfg: &Path, gpu: &str) -> String {
    let out = support::output(
        support::junction()
            .arg("--config")
            .arg(cfg)
            .args(["history", "--gpu", gpu, "--since", "1h"]),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

const XID48: &str = "kernel: NVRM: Xid (PCI:0000:{bus}:00): 48, pid=4242, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU (0x00000000).";

#[test]
fn the_same_xid_in_two_boots_escalates_then_clears_once_the_first_is_old() {
    let dir = support::temp_dir();
    let (proc_dir, state) = (dir.join("proc"), dir.join("state"));
    set_boot(&proc_dir, "boot-a");
    let kern_a = dir.join("kern-a.log");
    std::fs::write(&kern_a, "").expect("kern.log");
    let port = support::free_port();
    let cfg = config(port, &proc_dir, &state, &kern_a);
    let mut agent = Agent::spawn_config("h100-training.toml", &cfg);
    let page = agent.wait_for(Duration::from_secs(60), |m| m.contains("gpu_info{"));
    let uuids = support::uuids(&parse(&page));
    append(&kern_a, &XID48.replace("{bus}", "18"));
    agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("gpu_xid_errors_total{")
    });
    assert!(agent.terminate().success());

    // The node reboots: a new boot id, a new kernel log. GPU 0 has the same XID again;
    // GPU 1 has it for the first time.
    set_boot(&proc_dir, "boot-b");
    let kern_b = dir.join("kern-b.log");
    std::fs::write(&kern_b, "").expect("kern.log");
    let cfg = config(port, &proc_dir, &state, &kern_b);
    let cfg_file = dir.join("junction.toml");
    std::fs::write(&cfg_file, &cfg).expect("config");
    let mut agent = Agent::spawn_config("h100-training.toml", &cfg);
    agent.wait_for(Duration::from_secs(60), |m| m.contains("gpu_info{"));
    append(&kern_b, &XID48.replace("{bus}", "18"));
    append(&kern_b, &XID48.replace("{bus}", "2a"));
    let reason = |m: &str, gpu: &str| {
        value(
            &parse(m),
            "gpu_health_reason",
            &[("hw_id", gpu), ("gpu_health_reason", "hardware_inspection")],
        )
    };
    let page = agent.wait_for(Duration::from_secs(30), |m| {
        reason(m, &uuids[0]) == Some(1.0) && m.contains(&format!("hw_id=\"{}\"", uuids[1]))
    });
    assert_eq!(
        reason(&page, &uuids[1]),
        None,
        "one XID in one boot is no pattern"
    );
    // The history names both boots, while the agent runs.
    let text = history(&cfg_file, &uuids[0]);
    let a = text.find("boot boot-a").expect(&text);
    let b = text.find("boot boot-b").expect(&text);
    assert!(a < b, "{text}");
    assert_eq!(text.matches(" xid ").count(), 2, "{text}");
    assert!(text.contains("pid 4242"), "{text}");
    // Quiet from now on: once boot a's XID is older than the window, the reason clears.
    agent.wait_for(Duration::from_secs(60), |m| reason(m, &uuids[0]).is_none());
    assert!(agent.terminate().success());
    // And the history is readable with the agent stopped.
    let text = history(&cfg_file, &uuids[0]);
    assert!(
        text.contains("boot boot-a") && text.contains("boot boot-b"),
        "{text}"
    );
    assert!(
        text.contains("hardware_inspection"),
        "the transition is remembered too: {text}"
    );
}

/// A pstore record as the kernel writes one (fs/pstore/platform.c: the `"%s#%d Part%u\n"`
/// header, then the log in kmsg_dump's syslog form, `<level>[seconds.micros] text`), ending
/// in `panic()`'s line (kernel/panic.c: `"Kernel panic - not syncing: %s\n"`).
fn pstore_record(stamp: &str, why: &str) -> String {
    format!(
        "Panic#1 Part1\n<6>[{stamp}] nvidia-nvlink: Unregistered Nvlink Core, major device number 238\n<4>[{stamp}] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n<0>[{stamp}] Kernel panic - not syncing: {why}\n<0>[{stamp}] Kernel Offset: disabled\n"
    )
}

fn kmsg_count(page: &str, sig: &str) -> Option<f64> {
    value(
        &parse(page),
        "kmsg_signature_events_total",
        &[("hw_id", "node"), ("kmsg_signature", sig)],
    )
}

fn panics_in(state: &Path) -> Vec<String> {
    std::fs::read_to_string(state.join("history.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"kernel_panic\""))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_panic_of_the_boot_before_is_reported_once_and_panics_in_two_boots_flag_the_node() {
    if !crate::kmsg::privileged() {
        return;
    }
    let dir = support::temp_dir();
    let (proc_dir, state, crash) = (dir.join("proc"), dir.join("state"), dir.join("crash"));
    std::fs::create_dir_all(crash.join("202612010930")).expect("crash dir");
    set_boot(&proc_dir, "boot-a");
    let kern = dir.join("kern.log");
    std::fs::write(&kern, "").expect("kern.log");
    let port = support::free_port();
    let kmsg = format!("crash_dirs = [{:?}]\n", crash.display().to_string());
    let cfg = config_with(port, &proc_dir, &state, &kern, &kmsg, "");
    // Boot a: something to remember, so that the history knows the boot.
    let mut agent = Agent::spawn_config("h100-training.toml", &cfg);
    agent.wait_for(Duration::from_secs(60), |m| m.contains("gpu_info{"));
    append(&kern, &XID48.replace("{bus}", "18"));
    agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("gpu_xid_errors_total{")
    });
    assert!(agent.terminate().success());
    // Boot a ends in a panic; pstore kept the record (and a record someone else could have
    // written, in kdump's place, is not read).
    let rec = crash.join("dmesg-ramoops-0");
    std::fs::write(
        &rec,
        pstore_record(" 8813.004211", "Fatal exception in interrupt"),
    )
    .expect("record");
    let forged = crash.join("202612010930/vmcore-dmesg.txt");
    std::fs::write(&forged, pstore_record(" 9.000000", "forged")).expect("forged");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&forged, std::fs::Permissions::from_mode(0o666)).expect("chmod");

    set_boot(&proc_dir, "boot-b");
    std::fs::write(&kern, "").expect("kern.log");
    let mut agent = Agent::spawn_config("h100-training.toml", &cfg);
    let page = agent.wait_for(Duration::from_secs(60), |m| {
        m.contains("gpu_info{") && kmsg_count(m, "kernel_panic").is_some()
    });
    assert_eq!(
        kmsg_count(&page, "kernel_panic"),
        Some(1.0),
        "the forged one is not read"
    );
    let p = panics_in(&state);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].contains("\"boot\":\"boot-a\"") && p[0].contains("Fatal exception in interrupt"),
        "under the boot that crashed: {p:?}"
    );
    assert!(p[0].contains("79, pid="), "with the XID before it: {p:?}");
    // A restart in the same boot does not report it again.
    assert!(agent.terminate().success());
    let mut agent = Agent::spawn_config("h100-training.toml", &cfg);
    let page = agent.wait_for(Duration::from_secs(60), |m| {
        m.contains("gpu_info{") && m.contains("kmsg_signature_events_total{")
    });
    assert_eq!(kmsg_count(&page, "kernel_panic"), Some(1.0));
    assert_eq!(panics_in(&state).len(), 1);
    assert!(agent.terminate().success());
    // Boot b panics too; boot c finds both records (the first was never deleted): only the
    // new one is reported, and two boots that panicked within a week are a node reason.
    std::fs::write(
        crash.join("dmesg-ramoops-1"),
        pstore_record("  611.000042", "hung_task: blocked tasks"),
    )
    .expect("record");
    set_boot(&proc_dir, "boot-c");
    let mut agent = Agent::spawn_config("h100-training.toml", &cfg);
    let page = agent.wait_for(Duration::from_secs(60), |m| {
        m.contains("node_health_reason=\"kernel_panics_repeated\"")
    });
    assert_eq!(
        kmsg_count(&page, "kernel_panic"),
        Some(1.0),
        "this boot: the new one"
    );
    let p = panics_in(&state);
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(p[1].contains("\"boot\":\"boot-b\""), "{p:?}");
    assert!(agent.terminate().success());
}

#[test]
fn a_kill_during_a_flood_of_writes_loses_at_most_the_last_line() {
    let dir = support::temp_dir();
    let (proc_dir, state) = (dir.join("proc"), dir.join("state"));
    set_boot(&proc_dir, "boot-a");
    let kern = dir.join("kern.log");
    std::fs::write(&kern, "").expect("kern.log");
    let port = support::free_port();
    let cfg = config_with(
        port,
        &proc_dir,
        &state,
        &kern,
        "accept_user_records = true\n",
        "history_max_bytes = 65536\n",
    );
    let mut agent = Agent::spawn_config("h100-training.toml", &cfg);
    agent.wait_for(Duration::from_secs(60), |m| m.contains("gpu_info{"));
    // XIDs as fast as the agent reads them, until the history has been compacted at least
    // once and is being appended to; then SIGKILL, in the middle of it.
    let file = state.join("history.jsonl");
    let line = XID48.replace("{bus}", "18");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut written = 0u32;
    loop {
        let batch: String = (0..500).map(|_| format!("{line}\n")).collect();
        {
            use std::io::Write as _;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&kern)
                .expect("kern.log");
            f.write_all(batch.as_bytes()).expect("append");
        }
        written += 500;
        let lines = std::fs::read_to_string(&file).map_or(0, |t| t.lines().count());
        if written >= 5000 && lines > 100 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the history did not grow"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = agent.child.kill();
    let _ = agent.child.wait();
    let text = std::fs::read_to_string(&file).expect("history");
    assert!(
        text.len() <= 65536 + 1024,
        "within its bound: {} bytes",
        text.len()
    );
    let lines: Vec<&str> = text.lines().collect();
    let bad: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| serde_json::from_str::<serde_json::Value>(l).is_err())
        .map(|(i, _)| i)
        .collect();
    assert!(
        bad.is_empty() || bad == [lines.len() - 1],
        "only the last line may be torn: {bad:?} of {}",
        lines.len()
    );
    // The next start mends the file and appends after it; `junction history` reads it.
    let mut agent = Agent::spawn_config("h100-training.toml", &cfg);
    let page = agent.wait_for(Duration::from_secs(60), |m| m.contains("gpu_info{"));
    let uuids = support::uuids(&parse(&page));
    append(&kern, &XID48.replace("{bus}", "2a"));
    agent.wait_for(Duration::from_secs(30), |_| {
        std::fs::read_to_string(&file).is_ok_and(|t| t.contains(&uuids[1]))
    });
    assert!(agent.terminate().success());
    let text = std::fs::read_to_string(&file).expect("history");
    assert!(
        text.lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()),
        "every line whole after the restart"
    );
    let cfg_file = dir.join("junction.toml");
    std::fs::write(&cfg_file, &cfg).expect("config");
    assert!(history(&cfg_file, &uuids[0]).contains(" xid "));
}

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
        "{base}\n[sources.kmsg]\ndevice = \"\"\nfiles = [{:?}]\n\n[health]\ninterval_secs = 1\nclear_after_secs = 2\nescalate_boots_window_secs = 25\n",
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

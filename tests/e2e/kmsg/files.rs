//! Kernel-log files: followed, restarted, rotated and flooded.

use std::time::Duration;

use super::{append, config, domain, scenario, start, xid};
use crate::support::{self, parse, scrape};

/// A kernel-log file (RFC 3164 and RFC 3339 syslog headers): followed, restarted with lines
/// appended meanwhile (counted once), rotated (the new file is read), flooded with 100 000
/// lines of which 100 are XIDs (every one counted, memory flat). A corrupt state file is a
/// warning and a clean start.
#[test]
fn kernel_log_files_follow_restart_rotation_and_floods() {
    let d = domain(3);
    let scen = scenario(d, 2, "");
    let dir = support::temp_dir();
    let log = dir.join("kern.log");
    append(&log, "Nov 30 00:00:00 node kernel: [    1.000] booting\n");
    let state = dir.join("state");
    let port = support::free_port();
    let cfg = config(
        port,
        &state,
        &format!("device = \"\"\nfiles = [{:?}]", log.display().to_string()),
    );
    let mut agent = start(&scen, &cfg);
    let ids = support::uuids(&parse(
        &scrape(agent.port, Duration::from_secs(5)).expect("scrape"),
    ));
    let p0 = format!("{d:04x}:18:00");
    append(
        &log,
        &format!(
            "Nov 30 01:02:03 node kernel: [ 12.345] NVRM: Xid (PCI:{p0}): 13, pid=7, name=a, x\n"
        ),
    );
    agent.wait_for(Duration::from_secs(10), |m| {
        xid(m, &ids[0], "13") == Some(1.0)
    });
    assert!(agent.terminate().success());

    append(
        &log,
        &format!(
            "2026-11-30T01:05:00.000000+00:00 node kernel: NVRM: Xid (PCI:{p0}): 13, pid=8, name=b, y\n"
        ),
    );
    let mut agent = start(&scen, &cfg);
    agent.wait_for(Duration::from_secs(10), |m| {
        xid(m, &ids[0], "13") == Some(2.0)
    });
    // A marker after it: once the marker is counted, everything before it has been read, and
    // the count has not gone past 2 (a replay would).
    append(
        &log,
        &format!(
            "Nov 30 01:05:30 node kernel: NVRM: Xid (PCI:{d:04x}:19:00): 13, pid=1, name=marker, x\n"
        ),
    );
    let body = agent.wait_for(Duration::from_secs(10), |m| {
        xid(m, &ids[1], "13") == Some(1.0)
    });
    assert_eq!(
        xid(&body, &ids[0], "13"),
        Some(2.0),
        "appended while down: counted once"
    );

    // Rotation: the file is renamed and a new one created in its place.
    std::fs::rename(&log, dir.join("kern.log.1")).expect("rotate");
    append(
        &log,
        &format!(
            "Nov 30 01:06:00 node kernel: [  99.000] NVRM: Xid (PCI:{p0}): 31, pid=9, name=c, MMU Fault\n"
        ),
    );
    agent.wait_for(Duration::from_secs(10), |m| {
        xid(m, &ids[0], "31") == Some(1.0)
    });

    // A flood: 100 000 lines, one in a thousand an XID.
    let rss = support::rss_kib(agent.child.id());
    let mut text = String::with_capacity(8 << 20);
    for i in 0..100_000u32 {
        if i % 1000 == 999 {
            text.push_str(&format!(
                "Nov 30 02:00:00 node kernel: [{i}.000] NVRM: Xid (PCI:{d:04x}:19:00): 43, pid={i}, name=flood, channel 1\n"
            ));
        } else {
            text.push_str(&format!(
                "Nov 30 02:00:00 node kernel: [{i}.000] eth0: link is up at 100 Gbps, line {i} of unrelated noise\n"
            ));
        }
    }
    append(&log, &text);
    let body = agent.wait_for(Duration::from_secs(60), |m| {
        xid(m, &ids[1], "43") == Some(100.0)
    });
    assert_eq!(
        xid(&body, &ids[1], "43"),
        Some(100.0),
        "every relevant line"
    );
    let grown = support::rss_kib(agent.child.id()).saturating_sub(rss);
    assert!(grown < 32 * 1024, "RSS grew {grown} KiB over the flood");
    assert!(agent.terminate().success());

    // A corrupt state file: a warning and a clean start.
    std::fs::write(state.join("xid.json"), b"{this is not json").expect("corrupt");
    let mut agent = start(&scen, &cfg);
    let body = agent.wait_for(Duration::from_secs(10), |m| m.contains("hw_status{"));
    assert_eq!(xid(&body, &ids[0], "13"), None, "started clean");
    assert!(
        agent.log().contains("saved state is corrupt"),
        "{}",
        agent.log()
    );
    assert!(agent.terminate().success());

    // An unusable state directory (a file stands there): a warning, and the agent runs.
    let blocked = dir.join("not-a-dir");
    std::fs::write(&blocked, b"x").expect("file");
    let cfg = config(
        port,
        &blocked,
        &format!("device = \"\"\nfiles = [{:?}]", log.display().to_string()),
    );
    let mut agent = start(&scen, &cfg);
    assert!(
        agent.log().contains("state directory is not writable"),
        "{}",
        agent.log()
    );
    assert!(agent.terminate().success());
}

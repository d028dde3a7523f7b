//! Kernel-log signatures beyond XID end to end, through the real `/dev/kmsg` (privileged; CI
//! runs it): the real `junction` on the simulator's training node, its sysfs a composed HGX
//! tree (so that an AER on a port names the GPU behind it), its events going to a receiver of
//! this test's own. Lines are the real ones the catalog was checked on, with this test's own
//! PCI domain where a line names a device that no other agent may act on.

use std::time::Duration;

use crate::support::otlp::{Receiver, records};
use crate::support::{self, Agent, parse, value};
use testkit::sysfs::hgx;

const BUSES: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

/// Every `kmsg.signature` log record of the signature `sig`.
fn events(
    r: &crate::support::otlp::Received,
    sig: &str,
) -> Vec<std::collections::BTreeMap<String, String>> {
    records(r, "kmsg.signature")
        .into_iter()
        .filter(|a| a.get("kmsg.signature").map(String::as_str) == Some(sig))
        .collect()
}

#[test]
fn signatures_through_dev_kmsg_reach_the_right_gpu_process_and_node() {
    if !crate::kmsg::privileged() {
        return;
    }
    let node = hgx(&support::temp_dir().join("sys"), &BUSES, true);
    let rx = Receiver::start();
    let port = support::free_port();
    let state = support::temp_dir().join("state");
    let cfg = support::with_sysfs_root(
        &crate::kmsg::config(port, &state, "accept_user_records = true"),
        &node.tree.root,
    ) + &format!(
        "\n[sources.pcie]\ninterval_secs = 1\n\n[sinks.otlp]\nenabled = true\ninterval_secs = 1\nendpoint = {:?}\nprotocol = \"http/protobuf\"\n",
        rx.http_url()
    );
    let mut agent = Agent::spawn_config("h100-training.toml", &cfg);
    let page = agent.wait_for(Duration::from_secs(60), |m| {
        m.contains("gpu_info{") && m.contains("pcie_link_width{") && m.contains(support::NVML_UP)
    });
    let uuids = support::uuids(&parse(&page));
    let domain = crate::kmsg::domain(7);
    // The port right above GPU 7 logs a fatal AER; a GPU of this test's own
    // domain fails to initialise; the trainer on GPU 2 (pid 43000 in the scenario) is
    // OOM-killed; NVLink training fails; a file system goes read-only.
    let leaf = node.gpu_ports[7][4]
        .file_name()
        .and_then(|f| f.to_str())
        .expect("a port")
        .to_string();
    // First a line of this test's own, so that what the agent replays from the ring (an
    // earlier run's lines, on this boot) is counted before the baseline is taken.
    let rm_id = format!("PCI-{domain:04x}:0a:00");
    crate::kmsg::kmsg_write(&[format!(
        "NVRM: GPU {domain:04x}:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)"
    )]);
    let page = agent.wait_for(Duration::from_secs(30), |m| {
        parse(m).iter().any(|x| {
            x.name == "kmsg_signature_events_total" && x.labels.get("hw_id") == Some(&rm_id)
        })
    });
    let aer_count = |page: &str| {
        value(
            &parse(page),
            "kmsg_signature_events_total",
            &[
                ("hw_id", &format!("PCI-{leaf}")),
                ("kmsg_signature", "pcie_aer_fatal"),
            ],
        )
        .unwrap_or(0.0)
    };
    let before = aer_count(&page);
    let marker = std::process::id() * 10 + 7;
    crate::kmsg::kmsg_write(&[
        format!("pcieport {leaf}: AER: Multiple Uncorrected (Fatal) error received: {leaf}"),
        format!(
            "Out of memory: Killed process 43000 (python3) total-vm:{marker}kB, anon-rss:164992kB, file-rss:52176kB, shmem-rss:92kB, UID:0 pgtables:1372kB oom_score_adj:0"
        ),
        "NVRM: knvlinkDiscoverPostRxDetLinks_GH100: Getting peer0's postRxDetLinkMask failed!"
            .to_string(),
        "EXT4-fs (sdd1): Remounting filesystem read-only".to_string(),
    ]);
    let page = agent.wait_for(Duration::from_secs(30), |m| {
        aer_count(m) > before && m.contains("node_health_reason=\"filesystem_read_only\"")
    });
    let s = parse(&page);
    // The fatal AER fails GPU 7 (the GPU behind the port), and only it.
    let with = |reason: &str| -> Vec<usize> {
        uuids
            .iter()
            .enumerate()
            .filter(|(_, u)| {
                value(
                    &s,
                    "gpu_health_reason",
                    &[("hw_id", u), ("gpu_health_reason", reason)],
                ) == Some(1.0)
            })
            .map(|(i, _)| i)
            .collect()
    };
    assert_eq!(with("pcie_fatal_logged"), vec![7]);
    assert_eq!(
        value(
            &s,
            "kmsg_signature_events_total",
            &[
                ("hw_id", &format!("PCI-{leaf}")),
                ("kmsg_signature", "pcie_aer_fatal")
            ]
        ),
        Some(before + 1.0),
        "one line, counted once"
    );
    assert_eq!(
        value(
            &s,
            "kmsg_signature_events_total",
            &[("hw_id", &rm_id), ("kmsg_signature", "rm_init_failed")]
        ),
        Some(1.0)
    );
    for reason in ["nvlink_training_failed", "filesystem_read_only"] {
        assert_eq!(
            value(&s, "node_health_reason", &[("node_health_reason", reason)]),
            Some(1.0),
            "{reason}"
        );
    }
    // The OOM kill is one event naming the process and the GPU it used.
    let ours = |e: &std::collections::BTreeMap<String, String>| {
        e.get("body")
            .is_some_and(|b| b.contains(&format!("total-vm:{marker}kB")))
    };
    rx.wait_for(Duration::from_secs(30), "the OOM event", |r| {
        events(r, "oom_kill").iter().any(ours)
    });
    let oom = rx.with(|r| events(r, "oom_kill"));
    let mine: Vec<_> = oom.iter().filter(|e| ours(e)).collect();
    assert_eq!(
        mine[0].get("process.pid").map(String::as_str),
        Some("43000")
    );
    assert_eq!(mine.len(), 1, "{oom:?}");
    assert_eq!(
        mine[0].get("process.executable.name").map(String::as_str),
        Some("python3")
    );
    assert_eq!(
        mine[0].get("hw.id"),
        Some(&uuids[2]),
        "the GPU the trainer used: {mine:?}"
    );
    // The held reasons and counts survive a restart of the agent (not a reboot).
    assert!(agent.terminate().success());
    let mut agent = Agent::spawn_config("h100-training.toml", &cfg);
    let page = agent.wait_for(Duration::from_secs(60), |m| {
        m.contains("gpu_info{")
            && m.contains("kmsg_signature_events_total{")
            && m.contains(support::NVML_UP)
    });
    let s = parse(&page);
    assert_eq!(
        value(
            &s,
            "gpu_health_reason",
            &[
                ("hw_id", &uuids[7]),
                ("gpu_health_reason", "pcie_fatal_logged")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "kmsg_signature_events_total",
            &[("hw_id", &rm_id), ("kmsg_signature", "rm_init_failed")]
        ),
        Some(1.0),
        "counted once: not again on restart"
    );
    assert_eq!(
        value(
            &s,
            "node_health_reason",
            &[("node_health_reason", "filesystem_read_only")]
        ),
        Some(1.0)
    );
    assert!(agent.terminate().success());
}

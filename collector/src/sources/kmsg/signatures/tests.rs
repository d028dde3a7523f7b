//! The signature catalog against real lines: those of `../shared/realworld/xid-lines.txt`
//! (checked in the parser's corpus test, by `tests/kmsg/realworld-signatures.tsv`), those the
//! reference `../shared/reference/node-fabric-and-bus.md` quotes from bug reports (picked out
//! here by a fragment), lines composed from the kernel's format strings where no real line is
//! public, and this machine's own kernel ring, which must name no NVIDIA signature.

use super::*;
use crate::model::signatures::Target;
use crate::sources::kmsg::parser::file_line;
use std::collections::BTreeSet;
use std::os::unix::fs::OpenOptionsExt as _;

/// (signature, a fragment of the one backticked line of the reference that shows it).
const FROM_THE_REFERENCE: &[(&str, &str)] = &[
    ("gsp_rpc_timeout", "rpcRecvPoll timedout for fn 76!"),
    (
        "pcie_aer_corrected",
        "AER: Corrected error received: id=0010",
    ),
    (
        "pcie_aer_corrected",
        "AER: Corrected error received: 0000:00:03.0",
    ),
    (
        "pcie_aer_corrected",
        "Correctable error message received from 0000:06:00.0",
    ),
    (
        "pcie_aer_fatal",
        "Multiple Uncorrected (Fatal) error received: 0000:00:03.0",
    ),
    (
        "pcie_aer_nonfatal",
        "Uncorrectable (Non-Fatal) error received from 0000:63:00.0",
    ),
    ("mlx5_fatal", "Will cause a leak of a command resource"),
    (
        "mlx5_fatal",
        "device's health compromised - reached miss count",
    ),
    ("oom_kill", "Killed process 63214 (uwsgi)"),
    (
        "cpu_soft_lockup",
        "soft lockup - CPU#7 stuck for 23s! [pytest:25222]",
    ),
    ("cpu_soft_lockup", "Watchdog detected hard LOCKUP on cpu 3"),
    ("hung_task", "task cache_mgr_event:620917 blocked"),
    ("hung_task", "task nvc:[driver]:5403 blocked"),
    (
        "nvme_timeout",
        "nvme nvme2: I/O 0 QID 0 timeout, reset controller",
    ),
    (
        "nvme_timeout",
        "nvme nvme1: I/O 775 QID 2 timeout, aborting",
    ),
    (
        "nvme_failed",
        "nvme nvme2: Device not ready; aborting reset",
    ),
    ("nvme_failed", "nvme nvme2: Removing after probe failure"),
    (
        "fm_nvswitch_fatal",
        "detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0",
    ),
    ("filesystem_error", "EXT4-fs error (device sdd1)"),
    (
        "filesystem_read_only",
        "EXT4-fs (sdd1): Remounting filesystem read-only",
    ),
    (
        "filesystem_read_only",
        "XFS (dm-11): Corruption of in-memory data detected.  Shutting down filesystem",
    ),
];

/// (signature, a line, the format string it is composed from).
const COMPOSED: &[(&str, &str, &str)] = &[
    (
        "nvidia_module_load_failed",
        "nvidia_peermem: Unknown symbol ib_register_peer_memory_client (err -2)",
        "kernel/module/main.c: pr_warn(\"%s: Unknown symbol %s (err %d)\\n\", …)",
    ),
    (
        "nvidia_module_load_failed",
        "nvidia_fs: disagrees about version of symbol nvidia_p2p_get_pages",
        "kernel/module/version.c: pr_warn(\"%s: disagrees about version of symbol %s\\n\", …)",
    ),
    (
        "fabric_probe_failed",
        "NVRM: _gpuFabricProbeFullSanityCheck: Fabric Probe failed: 0x56",
        "src/nvidia/src/kernel/gpu/gpu_fabric_probe.c: NV_PRINTF(LEVEL_ERROR, \"Fabric Probe failed: 0x%x\\n\", …)",
    ),
    (
        "imex_channels_failed",
        "nv-caps-imex failed to create cdev.",
        "kernel-open/nvidia/nv-caps-imex.c: nv_printf(NV_DBG_ERRORS, \"nv-caps-imex failed to create cdev.\\n\")",
    ),
    (
        "kernel_panic",
        "Kernel panic - not syncing: Fatal exception in interrupt",
        "kernel/panic.c: pr_emerg(\"Kernel panic - not syncing: %s\\n\", buf)",
    ),
    (
        "fm_nvswitch_nonfatal",
        "detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:87:00.0 physical id 2 port 9",
        "gpud fabric-manager/log_matcher.go's regex, in the form of the fatal line the reference quotes",
    ),
    (
        "fm_topology_mismatch",
        "detected number of NVSwitches don't match with any supported system topology, aborting fabric manager",
        "gpud fabric-manager/log_matcher.go: `.*detected number of NVSwitches don't match with any supported system topology.*`",
    ),
    (
        "fm_multicast_team",
        "failed to find the GPU handle 3 in the multicast team request with id 0x1",
        "gpud fabric-manager/log_matcher.go: `.+failed to find the GPU handle \\d+ in the multicast team .*`",
    ),
    (
        "mlx5_degraded",
        "mlx5_core 0000:3b:00.0: Detected insufficient power on the PCIe slot (27W).",
        "drivers/net/ethernet/mellanox/mlx5/core/events.c: \"Detected insufficient power on the PCIe slot (%uW).\\n\"",
    ),
    (
        "mlx5_degraded",
        "mlx5_core 0000:af:00.0 ens1f0np0: TX timeout detected",
        "drivers/net/ethernet/mellanox/mlx5/core/en_main.c: netdev_err(dev, \"TX timeout detected\\n\")",
    ),
];

/// The backticked spans of the reference that contain `fragment`.
fn quoted<'a>(doc: &'a str, fragment: &str) -> Vec<&'a str> {
    doc.split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.contains(fragment))
        .collect()
}

#[test]
fn every_entry_matches_a_real_or_composed_line() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/reference/node-fabric-and-bus.md"
    ))
    .expect("../shared/reference/node-fabric-and-bus.md");
    let mut covered = BTreeSet::new();
    for (id, fragment) in FROM_THE_REFERENCE {
        let lines = quoted(&doc, fragment);
        assert!(
            !lines.is_empty(),
            "the reference quotes no line with {fragment:?}"
        );
        let line = lines[0];
        // A fabric manager line begins with its own `[date] [LEVEL] [tid N] `.
        let message = if id.starts_with("fm_") {
            fm_message(line)
        } else {
            file_line(line).message
        };
        let m = find(message).unwrap_or_else(|| panic!("{id}: nothing in {line:?}"));
        assert_eq!(CATALOG[m.sig].id, *id, "{line}");
        covered.insert(*id);
    }
    for (id, line, _) in COMPOSED {
        let m = find(line).unwrap_or_else(|| panic!("{id}: nothing in {line:?}"));
        assert_eq!(CATALOG[m.sig].id, *id, "{line}");
        covered.insert(*id);
    }
    let realworld = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/kmsg/realworld-signatures.tsv"
    ))
    .expect("tests/kmsg/realworld-signatures.tsv");
    for r in realworld.lines().filter(|r| !r.starts_with('#')) {
        if let Some((_, id)) = r.split_once('\t') {
            covered.insert(CATALOG.iter().find(|s| s.id == id).map_or("?", |s| s.id));
        }
    }
    let missing: Vec<&str> = CATALOG
        .iter()
        .map(|s| s.id)
        .filter(|id| !covered.contains(id))
        .collect();
    assert!(missing.is_empty(), "no line shows {missing:?}");
}

#[test]
fn docs_health_lists_every_entry() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/HEALTH.md"))
        .expect("docs/HEALTH.md");
    let missing: Vec<&str> = CATALOG
        .iter()
        .map(|s| s.id)
        .filter(|id| !doc.contains(&format!("| `{id}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/HEALTH.md has no row for {missing:?}"
    );
}

#[test]
fn what_the_lines_name() {
    let m =
        find("pcieport 0000:00:1d.3: AER: Correctable error message received from 0000:06:00.0")
            .expect("aer");
    assert_eq!(
        (m.pci, m.reporter),
        (Some("0000:06:00.0"), Some("0000:00:1d.3"))
    );
    let m = find("pcieport 0000:00:02.0: AER: Corrected error received: id=0010").expect("old aer");
    assert_eq!(
        (m.pci, m.reporter),
        (Some("0000:00:02.0"), None),
        "the reporting port"
    );
    let m = find(
        "Out of memory: Killed process 25315 (python3) total-vm:1kB, anon-rss:1kB, file-rss:0kB",
    )
    .expect("oom");
    assert_eq!((m.pid, m.comm), (Some(25315), Some("python3")));
    assert_eq!(CATALOG[m.sig].target, Target::Process);
    let m = find("INFO: task nvc:[driver]:5403 blocked for more than 120 seconds.").expect("hung");
    assert_eq!((m.pid, m.comm), (Some(5403), Some("nvc:[driver]")));
    let m = find("XFS (dm-11): Corruption of in-memory data detected.  Shutting down filesystem")
        .expect("xfs");
    assert_eq!(m.dev, Some("dm-11"));
    let m = find("NVRM: GPU6 _kgspLogRpcTimeout: ********************************* GSP Timeout **********************************").expect("gsp");
    assert_eq!(m.rm, Some(6));
    // Near misses: the recoverable stages and the lines around the failures.
    for line in [
        "EXT4-fs (md127p3): re-mounted 0f3cd65a-338b-4574-bba3-ecef214e1917 r/w. Quota mode: none.",
        "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link INIT",
        "oom_reaper: reaped process 345646 (vector), now anon-rss:0kB, file-rss:0kB, shmem-rss:0",
        "pcieport 0000:00:03.0: AER: Root Port link has been reset (0)",
        "nvme nvme0: 8/0/0 default/read/poll queues",
        "NVRM: GPU 0000:0a:00.0: rm_init_adapter failed, device minor number 5",
        "Killed process",
    ] {
        assert_eq!(find(line), None, "{line}");
    }
}

/// This machine's own kernel messages: real, unrelated text. The machine has no NVIDIA
/// driver, no NIC of the catalog's and no PCIe error, so none may match those. Other tests
/// flood the ring with user records (100 000 in the `/dev/kmsg` flood test), which can push
/// every kernel record out of it: then the kernel is made to write one (tmpfs names a mount
/// option it does not know, and the mount fails), so that the test always reads real kernel
/// text whatever ran before it.
#[test]
fn this_machines_kernel_ring_names_no_gpu_or_fabric_signature() {
    if std::fs::File::open("/dev/kmsg").is_err() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs as root and reads /dev/kmsg"
        );
        return;
    }
    let mut records = kernel_records_checked();
    if records == 0 {
        testkit::kmsg::kernel_quotes("junction-unrelated-option");
        records = kernel_records_checked();
    }
    assert!(
        records > 0 || std::env::var_os("CI").is_none(),
        "no kernel record in the ring, even after tmpfs wrote one"
    );
}

/// Reads the ring from its oldest record, checks each of the kernel's own records (facility
/// 0: other tests write user records) against the catalog, and returns how many there were.
fn kernel_records_checked() -> usize {
    use std::io::Read as _;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .expect("/dev/kmsg");
    let mut buf = vec![0u8; 8192];
    let mut records = 0;
    while let Ok(n) = f.read(&mut buf) {
        if n == 0 {
            break;
        }
        let text = String::from_utf8_lossy(&buf[..n]);
        let (head, body) = text.split_once(';').unwrap_or(("", ""));
        let prio: u32 = head
            .split(',')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(u32::MAX);
        if prio >> 3 != 0 {
            continue;
        }
        let message = body.lines().next().unwrap_or("");
        records += 1;
        if let Some(m) = find(message) {
            let s = &CATALOG[m.sig];
            assert!(
                matches!(s.target, Target::Process | Target::Disk | Target::Node)
                    && !message.contains("NVRM")
                    && !s.id.starts_with("gsp")
                    && !s.id.starts_with("nvlink"),
                "{} in {message:?}",
                s.id
            );
        }
    }
    records
}

/// What the matcher holds once built (on a GPU node the first `NVRM:` line builds it) stays
/// small: before, the literal automaton was a 600 KB DFA, twice, and counted repetitions of
/// wide classes (`.{0,200}`, `[^)]{1,64}`) compiled to a megabyte for one pattern; in all
/// 4.5 MB of the agent's heap. Sizes as `regex`'s own engine reports them.
#[test]
fn the_compiled_catalog_stays_small() {
    let lits = MATCHER.literals.memory_usage();
    assert!(lits < 64 << 10, "the literal automaton takes {lits} bytes");
    let mut total = 0;
    for s in CATALOG {
        let n = regex_automata::meta::Regex::new(s.pattern)
            .expect("a catalog pattern")
            .memory_usage();
        println!("{n:>8} {}", s.id);
        assert!(n < 96 << 10, "{} compiles to {n} bytes", s.id);
        total += n;
    }
    println!("{total:>8} in all");
    assert!(total < 1 << 20, "the catalog compiles to {total} bytes");
}

/// A name longer than the kernel's (a process's is at most 15 bytes) is cut where it is
/// taken, at a character boundary, and the line still counts.
#[test]
fn a_long_name_is_cut_not_missed() {
    let comm = format!("{}é{}", "a".repeat(63), "b".repeat(30));
    let line = format!("Out of memory: Killed process 4242 ({comm}) total-vm:1kB");
    let m = find(&line).expect("an oom_kill line");
    assert_eq!(CATALOG[m.sig].id, "oom_kill");
    assert_eq!(m.pid, Some(4242));
    assert_eq!(m.comm, Some("a".repeat(63).as_str()));
    let dev = "d".repeat(40);
    let line = format!("EXT4-fs error (device {dev}): ext4_find_entry:1455: inode #2");
    let m = find(&line).expect("a filesystem_error line");
    assert_eq!(m.dev.map(str::len), Some(32));
}

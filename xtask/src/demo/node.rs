//! The demo's node: the scenario on a PCI domain of the run's own, Junction's config, and the
//! XID lines written to the kernel log.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::root;

/// The PCI buses of the scenario's eight GPUs (`tests/scenarios/h100-training.toml`).
const BUSES: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

/// Writes the demo scenario on a PCI domain of this run's own into `dir`: (the domain, the
/// scenario's path).
pub(super) fn write_scenario(dir: &Path) -> Result<(u32, PathBuf)> {
    let domain = 0x100 + std::process::id() % 0xe000;
    let scenario = dir.join("node.toml");
    std::fs::write(
        &scenario,
        std::fs::read_to_string(root().join("tests/scenarios/demo.toml"))?
            .replace(
                "base = \"h100-training.toml\"",
                &format!(
                    "base = {:?}",
                    root()
                        .join("tests/scenarios/h100-training.toml")
                        .display()
                        .to_string()
                ),
            )
            .replace("0x0de0", &format!("{domain:#06x}")),
    )?;
    Ok((domain, scenario))
}

/// The XID lines, one per category and one from a MIG instance: (GPU index, code, line).
pub(super) fn xid_lines(domain: u32, pid: Option<u32>) -> Vec<(usize, u32, String)> {
    let pci = |i: usize| format!("{domain:04x}:{:02x}:00", BUSES[i]);
    let who = match pid {
        Some(p) => format!("pid={p}, name=trainer"),
        None => "pid=4242, name=python3".to_string(),
    };
    vec![
        (
            0,
            13,
            format!(
                "NVRM: Xid (PCI:{}): 13, {who}, Graphics SM Warp Exception on (GPC 1, TPC 2, SM 0): Out Of Range Address",
                pci(0)
            ),
        ),
        (
            1,
            31,
            format!(
                "NVRM: Xid (PCI:{} GPU-I:03): 31, pid=5151, name=infer, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_34560000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
                pci(1)
            ),
        ),
        (
            2,
            48,
            format!(
                "NVRM: Xid (PCI:{}): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 2, subpartition 0.",
                pci(2)
            ),
        ),
        (
            3,
            119,
            format!(
                "NVRM: Xid (PCI:{}): 119, pid=6262, name=trainer, Timeout after 6s of waiting for RPC response from GPU3 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20800a4c 0x4).",
                pci(3)
            ),
        ),
        (
            6,
            63,
            format!(
                "NVRM: Xid (PCI:{}): 63, pid='<unknown>', name=<unknown>, Row Remapping: New row (0x00000000000c1f20) was marked for remapping",
                pci(6)
            ),
        ),
    ]
}

/// Junction's config for the demo: the parts that run (root's, eBPF, the BMCs' ports) and
/// where it serves and sends.
pub(super) fn config(
    dir: &Path,
    root_parts: bool,
    bpf: bool,
    redfish: Option<u16>,
    ipmi: Option<u16>,
    otlp: u16,
    listen: &str,
) -> String {
    let lib = root().join("target/nvml-sim/current/libnvidia-ml.so.1");
    let mut c = format!(
        "state_dir = {:?}\n\n[sources.nvml]\nlibrary = {:?}\n",
        dir.join("state").display().to_string(),
        lib.display().to_string()
    );
    for g in [
        "utilization",
        "memory",
        "power",
        "temperature",
        "processes",
        "errors",
    ] {
        c.push_str(&format!("[sources.nvml.groups.{g}]\ninterval_secs = 2\n"));
    }
    if root_parts {
        c.push_str("\n[sources.kmsg]\naccept_user_records = true\n");
    } else {
        c.push_str("\n[sources.kmsg]\nenabled = false\n");
    }
    if bpf {
        c.push_str("\n[sources.ebpf]\nwatch_devices = [\"/dev/null\"]\ninterval_secs = 1\n");
    } else {
        c.push_str("\n[sources.ebpf]\nenabled = false\n");
    }
    if let Some(port) = redfish {
        c.push_str(&format!(
            "\n[[sources.redfish.targets]]\nname = \"cdu\"\nurl = \"http://127.0.0.1:{port}\"\ninterval_secs = 2\ntimeout_secs = 5\n"
        ));
    }
    if let Some(port) = ipmi {
        c.push_str(&format!(
            "\n[[sources.ipmi.targets]]\nname = \"bmc\"\nhost = \"127.0.0.1\"\nport = {port}\nusername = \"monitor\"\npassword_env = \"JUNCTION_DEMO_IPMI_PASSWORD\"\nworkaround_flags = \"opensesspriv\"\ninterval_secs = 5\n"
        ));
    }
    c.push_str(&format!(
        "\n[health]\ninterval_secs = 1\nforecast_window_secs = 20\nforecast_horizon_secs = 120\nforecast_persist = 3\n\n[sinks.prometheus]\nlisten = {listen:?}\n\n[sinks.otlp]\nenabled = true\nendpoint = \"http://127.0.0.1:{otlp}\"\nprotocol = \"http/protobuf\"\ninterval_secs = 5\n"
    ));
    c
}

//! The demo's BMCs: a coolant distribution unit over Redfish (`sushy-static` serving a copy of
//! DMTF's CDU mockup, whose secondary-loop flow the demo lowers) and a BMC over IPMI
//! (`ipmi_sim`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::{Started, wait_port};
use crate::root;
use testkit::bmc::IpmiSim;
use testkit::free_port;

/// The CDU mockup copy whose secondary-loop flow the demo lowers.
pub(super) struct Cdu {
    pub(super) dir: PathBuf,
}

impl Cdu {
    const SENSOR: &'static str = "Chassis/CDU/Sensors/SecondaryFlow/index.json";
    const CONNECTOR: &'static str =
        "ThermalEquipment/CDUs/1/SecondaryCoolantConnectors/1/index.json";

    pub(super) fn prepare(dir: &Path) -> Result<Cdu> {
        // DMTF's CDU mockup, from the shared fixtures (other projects' data stays there).
        let from = testkit::shared().join("fixtures/redfish/dmtf-public-cooling-unit");
        if !from.is_dir() {
            bail!("{} is missing", from.display());
        }
        let _ = std::fs::remove_dir_all(dir);
        copy_tree(&from, dir)?;
        let cdu = Cdu {
            dir: dir.to_path_buf(),
        };
        cdu.set_flow(42.0)?;
        Ok(cdu)
    }

    /// Writes the flow reading (and its thresholds: caution below 30, critical below 20).
    pub(super) fn set_flow(&self, lpm: f64) -> Result<()> {
        let path = self.dir.join(Self::SENSOR);
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        v["Reading"] = serde_json::json!(lpm);
        v["Thresholds"] = serde_json::json!({
            "LowerCaution": { "Reading": 30.0 },
            "LowerCritical": { "Reading": 20.0 }
        });
        let health = if lpm < 20.0 {
            "Critical"
        } else if lpm < 30.0 {
            "Warning"
        } else {
            "OK"
        };
        v["Status"]["Health"] = serde_json::json!(health);
        write_atomic(&path, &serde_json::to_string_pretty(&v)?)?;
        let path = self.dir.join(Self::CONNECTOR);
        let mut c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        c["FlowLitersPerMinute"]["Reading"] = serde_json::json!(lpm);
        write_atomic(&path, &serde_json::to_string_pretty(&c)?)
    }
}

fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)?.flatten() {
        let p = e.path();
        let dest = to.join(e.file_name());
        if p.is_dir() {
            copy_tree(&p, &dest)?;
        } else {
            std::fs::copy(&p, &dest)?;
        }
    }
    Ok(())
}

/// Serves the CDU with `sushy` (`sushy-static`, where installed) and returns its port; `None`
/// where it is not installed (the view lists it, with the command that installs it) or did not
/// start (said in `notes`).
pub(super) fn start_redfish(
    sushy: Option<PathBuf>,
    cdu: &Result<Cdu>,
    dir: &Path,
    started: &mut Vec<Started>,
    notes: &mut Vec<String>,
) -> Result<Option<u16>> {
    Ok(match (sushy.filter(|p| p.exists()), cdu) {
        (_, Err(e)) => {
            notes.push(format!("the Redfish CDU is skipped: {e:#}"));
            None
        }
        (Some(sushy), Ok(cdu)) => {
            let port = free_port();
            let mut child = Command::new(sushy)
                .args(["-i", "127.0.0.1", "-p", &port.to_string(), "-m"])
                .arg(&cdu.dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join("sushy-static.log"))?)
                .spawn()
                .context("start sushy-static")?;
            match wait_port(port, "/redfish/v1/", &mut child, "sushy-static") {
                Ok(()) => {
                    started.push(Started {
                        name: "sushy-static",
                        child,
                    });
                    Some(port)
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    notes.push(format!("the Redfish CDU is skipped: {e:#}"));
                    None
                }
            }
        }
        // Listed first in the view, with the command that installs it.
        (None, Ok(_)) => None,
    })
}

/// Starts `ipmi_sim` on the fixture's emulation script where the IPMI tools are installed
/// (`available`); `None` where they are not, or it did not start (said in `notes`).
pub(super) fn start_ipmi(available: bool, notes: &mut Vec<String>) -> Option<IpmiSim> {
    match available {
        true => {
            match std::fs::read_to_string(root().join("tests/fixtures/ipmi/sim2.emu"))
                .map_err(|e| format!("sim2.emu: {e}"))
                .and_then(|emu| IpmiSim::try_start(&emu))
            {
                Ok(sim) => Some(sim),
                Err(e) => {
                    notes.push(format!("the IPMI BMC is skipped: {e}"));
                    None
                }
            }
        }
        // Listed first in the view, with the command that installs it.
        false => None,
    }
}

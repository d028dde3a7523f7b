//! The soak's GPU processes: `demo-workload` copies of this binary, each in a container-shaped
//! cgroup of its own where one can be made.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result};

use super::Churn;

/// A workload process and the cgroup it was put in.
pub(super) struct Workload {
    child: Child,
    pub(super) born: Instant,
    cgroup: Option<PathBuf>,
}

impl Workload {
    pub(super) fn end(mut self) {
        // Closing its stdin ends it after its current second.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
        if let Some(d) = &self.cgroup {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Where container-shaped cgroups go: the v1 `pids` hierarchy (`/docker/<id>`, as Docker
/// makes them under cgroupfs), or the unified one (`system.slice/docker-<id>.scope`).
fn cgroup_parent() -> Option<(PathBuf, bool)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut v1 = None;
    for l in info.lines() {
        let Some((left, right)) = l.split_once(" - ") else {
            continue;
        };
        let mount = left.split(' ').nth(4)?;
        if right.starts_with("cgroup2 ") {
            return Some((PathBuf::from(mount).join("system.slice"), true));
        }
        if right.starts_with("cgroup ") && right.split(',').any(|o| o == "pids") {
            v1 = Some((PathBuf::from(mount).join("docker"), false));
        }
    }
    v1
}

/// Starts one workload process registering `uuid`, in a new container cgroup when one can be
/// made.
pub(super) fn spawn_workload(exe: &Path, uuid: &str, n: u64, churn: &Churn) -> Result<Workload> {
    let mut cmd = Command::new(exe);
    cmd.args(["demo-workload", uuid])
        .env("JUNCTION_DEMO_DEVICE", churn.device)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut cgroup = None;
    if let Some((parent, unified)) = cgroup_parent() {
        let id = format!(
            "{:064x}",
            ((churn.per_second as u128) << 64) | (0x50a1_0000_0000_0000u128 + u128::from(n))
        );
        let dir = if unified {
            parent.join(format!("docker-{id}.scope"))
        } else {
            parent.join(&id)
        };
        if std::fs::create_dir_all(&dir).is_ok() {
            cmd.env("JUNCTION_DEMO_CGROUP", dir.join("cgroup.procs"));
            cgroup = Some(dir);
        }
    }
    let child = cmd.spawn().context("starting a workload process")?;
    Ok(Workload {
        child,
        born: Instant::now(),
        cgroup,
    })
}

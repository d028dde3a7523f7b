//! The host around the driver: which NVIDIA kernel modules are loaded (`/proc/modules`) and
//! which NVIDIA daemons run (`nvidia-persistenced`, `nv-fabricmanager`, `nvidia-imex`,
//! `nv-hostengine`), read under `proc_root`.
//!
//! Who can write it: any process may name itself `nv-fabricmanager`; `daemons` says why that
//! does not make a stopped fabric manager look alive. What is read is bounded: the daemons
//! named here, the modules named here, the first 64 KiB of `/proc/modules`, at most
//! [`daemons::MAX_PROCESSES`] processes.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

mod daemons;
pub mod fmlog;

use crate::agent::{Component, Ctx};
use crate::config::{Config, Invalid, config_section};
use crate::model::{Metric, Model, Sample};

/// The NVIDIA kernel modules reported, loaded or not.
pub const MODULES: &[&str] = &[
    "nvidia",
    "nvidia_uvm",
    "nvidia_modeset",
    "nvidia_drm",
    "nvidia_peermem",
    "nvidia_fs",
];

/// The daemons watched.
pub const DAEMONS: &[&str] = &[
    "nvidia-persistenced",
    "nv-fabricmanager",
    "nvidia-imex",
    "nv-hostengine",
];

config_section! {
    /// `[sources.host]`
    pub struct HostConfig {
        /// Read the loaded NVIDIA kernel modules and the NVIDIA daemons under `proc_root`.
        /// Default: true.
        pub enabled: bool = true,
        /// Seconds between reads.
        pub interval_secs: u64 = 10,
        /// The fabric manager's log, followed for NVSwitch errors and topology mismatches
        /// (`fm_*` signatures); "" not to read it. In a container, mount it read-only.
        pub fabric_manager_log: String = "/var/log/fabricmanager.log".into(),
    }
}

impl HostConfig {
    /// Adds every problem with this section to `out`.
    pub fn validate(&self, prefix: &str, out: &mut Vec<Invalid>) {
        if !self.fabric_manager_log.is_empty() && !self.fabric_manager_log.starts_with('/') {
            out.push(Invalid {
                key: format!("{prefix}.fabric_manager_log"),
                message: format!(
                    "{:?} is not an absolute path; give one (\"/var/log/fabricmanager.log\"), or \"\" not to read it",
                    self.fabric_manager_log
                ),
            });
        }
        if self.interval_secs == 0 {
            out.push(Invalid {
                key: format!("{prefix}.interval_secs"),
                message: "must be at least 1".into(),
            });
        }
    }
}

/// The host source.
pub const COMPONENT: Component = Component {
    name: "host",
    enabled: |c| c.sources.host.enabled,
    start: |c, ctx| Box::pin(async move { Ok(tokio::spawn(run(c, ctx))) }),
    once: Some(|c, model| {
        Box::pin(async move {
            if !State::default().poll(&c.proc_root, &model) {
                return Err(crate::agent::NothingHere(
                    "no NVIDIA kernel module loaded and no NVIDIA daemon running".into(),
                )
                .into());
            }
            Ok(())
        })
    }),
    inspect: None,
    derive: None,
    off_but_asked: None,
};

async fn run(config: Arc<Config>, ctx: Ctx) {
    let interval = Duration::from_secs(config.sources.host.interval_secs.max(1));
    let model = ctx.model.clone();
    crate::sources::sysfs::run_blocking("host", interval, ctx, move |s: &mut State| {
        let _ = s.poll(&config.proc_root, &model);
        let log = &config.sources.host.fabric_manager_log;
        if !log.is_empty() {
            fmlog::poll(log, &model, &mut s.fm_log_warned);
            // The position and what it counted, saved (at most once a second).
            model.flush_xids(false);
        }
    })
    .await;
}

/// What the source remembers between polls.
#[derive(Debug, Default)]
pub struct State {
    daemons: BTreeMap<&'static str, Daemon>,
    /// Said once: the fabric manager log is not root's alone.
    fm_log_warned: bool,
    /// The processes the last poll saw.
    scan: daemons::Scan,
}

#[derive(Debug, Default)]
struct Daemon {
    /// Its pid at the last poll.
    pid: Option<u32>,
    /// Seen running since the agent started.
    seen: bool,
    /// Restarts seen: a new pid, or back after it was gone.
    restarts: u64,
}

impl Daemon {
    fn update(&mut self, now: Option<u32>) {
        match (self.pid, now) {
            (Some(a), Some(b)) if a != b => self.restarts += 1,
            (None, Some(_)) if self.seen => self.restarts += 1,
            _ => {}
        }
        self.seen |= now.is_some();
        self.pid = now;
    }
}

/// The names of the loaded modules in `/proc/modules` text.
pub fn loaded_modules(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

impl State {
    /// Reads the modules and the daemons and publishes them; false if the host has neither
    /// an NVIDIA module loaded nor an NVIDIA daemon running.
    pub fn poll(&mut self, proc: &Path, model: &Model) -> bool {
        let mut out = Vec::new();
        let text = read_capped(&proc.join("modules"), 64 * 1024);
        let loaded = loaded_modules(&text);
        for m in MODULES {
            out.push(
                Sample::new(
                    Metric::KernelModule,
                    f64::from(u8::from(loaded.contains(m))),
                )
                .with("kernel.module", *m),
            );
        }
        let running = self.scan.daemons(proc);
        for d in DAEMONS {
            let st = self.daemons.entry(d).or_default();
            st.update(running.get(d).copied());
            out.push(
                Sample::new(Metric::DaemonUp, f64::from(u8::from(st.pid.is_some())))
                    .with("node.daemon", *d),
            );
            out.push(
                Sample::new(Metric::DaemonRestarts, st.restarts as f64).with("node.daemon", *d),
            );
        }
        model.publish("host", "node", out);
        MODULES.iter().any(|m| loaded.contains(m)) || !running.is_empty()
    }
}

/// The first `max` bytes of a file, as text ("" if unreadable).
fn read_capped(path: &Path, max: u64) -> String {
    use std::io::Read as _;
    let mut s = String::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(max).read_to_string(&mut s);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_are_a_new_pid_or_a_return() {
        let mut d = Daemon::default();
        d.update(None);
        d.update(Some(10));
        assert_eq!(d.restarts, 0, "first seen");
        d.update(Some(10));
        d.update(Some(11));
        assert_eq!(d.restarts, 1, "a new pid");
        d.update(None);
        d.update(Some(12));
        assert_eq!(d.restarts, 2, "gone and back");
    }

    #[test]
    fn the_loaded_modules_are_the_first_word_of_each_line() {
        assert_eq!(
            loaded_modules(
                "nvidia_uvm 1896448 0 - Live 0x0000000000000000 (POE)\nnvidia 56811520 1 nvidia_uvm, Live 0x0 (POE)\n"
            ),
            vec!["nvidia_uvm", "nvidia"]
        );
    }
}

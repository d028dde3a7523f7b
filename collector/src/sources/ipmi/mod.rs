//! The IPMI source: board and cooling sensors (temperatures, fans and pumps, coolant flow,
//! discrete leak sensors) with their thresholds and state, read through FreeIPMI's
//! `ipmi-sensors` — remotely over RMCP+ (lanplus) or in-band through `/dev/ipmi0` when no
//! host is given (the normal case for an agent on the host itself).
//!
//! Why FreeIPMI and not a native client: it is what prometheus' ipmi_exporter runs, it copes
//! with real BMCs' quirks (partial SDR reads, reservations, OEM workarounds via
//! `workaround_flags`), and it caches the SDR per target. The password goes to the tool in a
//! config file readable only by Junction, never on its command line; each run has a hard
//! timeout after which the tool is killed; one run per target at a time.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::agent::{Component as AgentComponent, Ctx};
use crate::config::{Config, Invalid, config_section};
use crate::model::Model;
use crate::model::bmc::{Component, Poll, Reading};
use crate::sources::polled::{self, PollError};

mod sensors;
mod tool;

pub use sensors::parse_line;
use tool::{Workdir, run_tool};

config_section! {
    /// `[[sources.ipmi.targets]]`: one BMC.
    pub struct IpmiTarget {
        /// Name of the target (`junction.target`); default: the host, or "local".
        pub name: String = String::new(),
        /// BMC address for IPMI over LAN; "" reads the local BMC through /dev/ipmi0.
        pub host: String = String::new(),
        /// UDP port of the BMC.
        pub port: u32 = 623,
        /// Account name (a USER-level account is enough to read sensors).
        pub username: String = String::new(),
        /// File holding the password (first line).
        pub password_file: String = String::new(),
        /// Environment variable holding the password (instead of password_file).
        pub password_env: String = String::new(),
        /// Privilege level to ask for: "user", "operator" or "admin".
        pub privilege: String = "user".into(),
        /// "lan_2_0" (RMCP+, lanplus) or "lan" (IPMI 1.5).
        pub driver: String = "lan_2_0".into(),
        /// FreeIPMI workaround flags for BMCs that need them (e.g. "opensesspriv").
        pub workaround_flags: String = String::new(),
        /// Hard limit on one read, seconds: past it the tool is killed.
        pub timeout_secs: u64 = 20,
        /// Seconds between reads.
        pub interval_secs: u64 = 30,
        /// The `ipmi-sensors` program (FreeIPMI, Debian package freeipmi-tools).
        pub tool: String = "ipmi-sensors".into(),
    }
}

config_section! {
    /// `[sources.ipmi]`
    pub struct IpmiConfig {
        /// The targets read (none by default).
        pub targets: Vec<IpmiTarget> = Vec::new(),
    }
}

impl IpmiTarget {
    /// The name used in metrics.
    pub fn display_name(&self) -> String {
        if !self.name.is_empty() {
            self.name.clone()
        } else if self.host.is_empty() {
            "local".into()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl IpmiConfig {
    /// Adds every problem with this section to `out`.
    pub fn validate(&self, prefix: &str, out: &mut Vec<Invalid>) {
        let mut names = std::collections::BTreeSet::new();
        for (i, t) in self.targets.iter().enumerate() {
            let key = |k: &str| format!("{prefix}.targets[{i}].{k}");
            if !matches!(t.privilege.as_str(), "user" | "operator" | "admin") {
                out.push(Invalid {
                    key: key("privilege"),
                    message: format!("{:?}: use \"user\", \"operator\" or \"admin\"", t.privilege),
                });
            }
            if !matches!(t.driver.as_str(), "lan_2_0" | "lan") {
                out.push(Invalid {
                    key: key("driver"),
                    message: format!("{:?}: use \"lan_2_0\" (lanplus) or \"lan\"", t.driver),
                });
            }
            if t.port == 0 || t.port > 65535 {
                out.push(Invalid {
                    key: key("port"),
                    message: format!("{} is not a port", t.port),
                });
            }
            crate::config::check_target(
                &key,
                t.display_name(),
                &t.password_file,
                (t.timeout_secs, t.interval_secs),
                &mut names,
                out,
            );
        }
    }
}

/// The IPMI source.
pub const COMPONENT: AgentComponent = AgentComponent {
    name: "ipmi",
    enabled: |c| !c.sources.ipmi.targets.is_empty(),
    start: |c, ctx| Box::pin(start(c, ctx)),
    once: Some(|c, model| Box::pin(once(c, model))),
    inspect: None,
    derive: None,
    off_but_asked: None,
};

/// Why a read failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The tool ran past the timeout and was killed.
    #[error("no answer within {0} s (ipmi-sensors killed)")]
    Timeout(u64),
    /// The tool is missing.
    #[error("cannot run {0:?}: {1} (install FreeIPMI: apt-get install freeipmi-tools)")]
    Tool(String, String),
    /// The BMC refused the credentials.
    #[error("authentication failed: {0} (check username, password and privilege)")]
    Auth(String),
    /// Anything else the tool said.
    #[error("{0}")]
    Failed(String),
}

impl Error {
    fn kind(&self) -> &'static str {
        match self {
            Error::Timeout(_) => "timeout",
            Error::Tool(..) => "tool",
            Error::Auth(_) => "auth",
            Error::Failed(_) => "protocol",
        }
    }
}

/// One read: the tool under the timeout (again with a fresh SDR cache if the cache is stale).
async fn read(t: &IpmiTarget, w: &Workdir, requests: &mut u64) -> Result<Poll, Error> {
    *requests += 1;
    let out = match run_tool(t, w, false).await {
        Err(Error::Failed(m)) if m.to_ascii_lowercase().contains("cache") => {
            *requests += 1;
            run_tool(t, w, true).await?
        }
        r => r?,
    };
    let target = t.display_name();
    let readings: Vec<Reading> = out.lines().filter_map(|l| parse_line(&target, l)).collect();
    Ok(Poll {
        target: target.clone(),
        components: vec![Component {
            id: target.clone(),
            hw_type: "bmc".into(),
            name: if t.host.is_empty() {
                "local BMC (in-band)".into()
            } else {
                t.host.clone()
            },
            parent: None,
            model: None,
            serial: None,
            health: None,
        }],
        readings,
        notes: Vec::new(),
        // A BMC on IPMI is the host's own.
        host: Some(target.clone()),
    })
}

/// An IPMI target being read.
pub struct Ipmi {
    cfg: IpmiTarget,
    workdir: Workdir,
    requests: AtomicU64,
}

impl polled::Target for Ipmi {
    const SOURCE: &'static str = "ipmi";
    type Config = IpmiTarget;

    fn open(t: &IpmiTarget) -> Result<Self, String> {
        if t.host.is_empty() && !Path::new("/dev/ipmi0").exists() {
            return Err("no /dev/ipmi0 for in-band IPMI: load the drivers (modprobe ipmi_devintf ipmi_si), or give host".into());
        }
        let password = polled::read_secret(&t.password_file, &t.password_env)?;
        Ok(Self {
            cfg: t.clone(),
            workdir: Workdir::new(t, password.as_deref())?,
            requests: AtomicU64::new(0),
        })
    }

    fn name_of(t: &IpmiTarget) -> String {
        t.display_name()
    }

    fn interval(&self) -> Duration {
        Duration::from_secs(self.cfg.interval_secs.max(1))
    }

    /// The tool is killed past `timeout_secs` itself, and may run twice (a stale SDR cache):
    /// the outer bound leaves it room to.
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.timeout_secs.max(1) * 2 + 5)
    }

    fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    async fn poll(&self, _model: &Arc<Model>) -> Result<Poll, PollError> {
        let mut n = 0;
        let r = read(&self.cfg, &self.workdir, &mut n).await;
        self.requests.fetch_add(n, Ordering::Relaxed);
        r.map_err(|e| PollError {
            kind: e.kind(),
            message: e.to_string(),
        })
    }
}

async fn start(config: Arc<Config>, ctx: Ctx) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let targets = config.sources.ipmi.targets.clone();
    tracing::info!(targets = targets.len(), "reading IPMI targets");
    Ok(polled::start::<Ipmi>(targets, &ctx.model, &ctx.shutdown))
}

async fn once(config: Arc<Config>, model: Arc<Model>) -> anyhow::Result<()> {
    polled::once::<Ipmi>(config.sources.ipmi.targets.clone(), model).await
}

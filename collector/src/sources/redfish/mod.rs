//! The Redfish source: liquid-cooling and board thermals from BMCs and coolant distribution
//! units (CDUs). One task per target polls it every `interval_secs`, one poll at a time, each
//! bounded by `timeout_secs`; a target that fails, hangs or answers garbage says why (once per
//! change), reports `junction_target_up` 0, and never holds up the others or any other source.
//!
//! Needs: network access to the BMC, an account (read-only is enough), its password in a file
//! or an environment variable, the BMC's CA when it is not a public one.

pub mod client;
pub mod walk;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent::{Component, Ctx};
use crate::config::{Config, Invalid, config_section};
use crate::internal_events::{InternalEvent, RedfishChassisBlind};
use crate::model::Model;
use crate::model::bmc::Poll;
use crate::sources::polled::{self, PollError};
use client::Client;

config_section! {
    /// `[[sources.redfish.targets]]`: one BMC or CDU.
    pub struct RedfishTarget {
        /// Name of the target (`junction.target`); default: the URL's host.
        pub name: String = String::new(),
        /// The service's base URL, e.g. "https://10.0.0.17" (the path `/redfish/v1` is added).
        pub url: String = String::new(),
        /// Account name ("" for a service without authentication).
        pub username: String = String::new(),
        /// File holding the password (first line; mode 0600 recommended). Never put a password
        /// in this file or on a command line.
        pub password_file: String = String::new(),
        /// Environment variable holding the password (instead of password_file).
        pub password_env: String = String::new(),
        /// "basic" (credentials on every request) or "session" (one Redfish session per target,
        /// created once, re-created when it expires, deleted at shutdown).
        pub auth: String = "basic".into(),
        /// PEM file with the CA that signed the BMC's certificate (besides the public roots).
        pub ca_file: String = String::new(),
        /// Skip certificate verification (logs a warning). For BMCs with self-signed
        /// certificates you cannot replace; prefer ca_file.
        pub insecure: bool = false,
        /// Bound on one whole poll (every request in it), seconds.
        pub timeout_secs: u64 = 20,
        /// Seconds between the starts of two polls (a poll that runs long delays the next,
        /// never overlaps it).
        pub interval_secs: u64 = 30,
        /// Use `$expand` on sensor collections where the service advertises it (one request per
        /// collection instead of one per sensor). Default: true.
        pub expand: bool = true,
        /// Requests in flight at once to this target (BMCs serve few in parallel).
        pub max_concurrent_requests: u32 = 4,
    }
}

config_section! {
    /// `[sources.redfish]`
    pub struct RedfishConfig {
        /// The targets polled (none by default).
        pub targets: Vec<RedfishTarget> = Vec::new(),
    }
}

impl RedfishTarget {
    /// The name used in metrics.
    pub fn display_name(&self) -> String {
        if !self.name.is_empty() {
            return self.name.clone();
        }
        reqwest::Url::parse(&self.url)
            .ok()
            .and_then(|u| {
                u.host_str().map(|h| match u.port() {
                    Some(p) => format!("{h}:{p}"),
                    None => h.to_string(),
                })
            })
            .unwrap_or_else(|| self.url.clone())
    }
}

impl RedfishConfig {
    /// Adds every problem with this section to `out`.
    pub fn validate(&self, prefix: &str, out: &mut Vec<Invalid>) {
        let mut names = std::collections::BTreeSet::new();
        for (i, t) in self.targets.iter().enumerate() {
            let key = |k: &str| format!("{prefix}.targets[{i}].{k}");
            match reqwest::Url::parse(&t.url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {}
                _ => out.push(Invalid {
                    key: key("url"),
                    message: format!(
                        "{:?} is not an http(s) URL; write e.g. \"https://10.0.0.17\"",
                        crate::redact::url(&t.url)
                    ),
                }),
            }
            if !matches!(t.auth.as_str(), "basic" | "session") {
                out.push(Invalid {
                    key: key("auth"),
                    message: format!("{:?}: use \"basic\" or \"session\"", t.auth),
                });
            }
            if !t.password_file.is_empty() && !t.password_env.is_empty() {
                out.push(Invalid {
                    key: key("password_env"),
                    message: "give password_file or password_env, not both".into(),
                });
            }
            if !t.ca_file.is_empty() && !std::path::Path::new(&t.ca_file).is_file() {
                out.push(Invalid {
                    key: key("ca_file"),
                    message: format!("{:?} is not a readable file", t.ca_file),
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

/// The Redfish source.
pub const COMPONENT: Component = Component {
    name: "redfish",
    enabled: |c| !c.sources.redfish.targets.is_empty(),
    start: |c, ctx| Box::pin(start(c, ctx)),
    once: Some(|c, model| Box::pin(once(c, model))),
    inspect: None,
    derive: None,
    off_but_asked: None,
};

/// A Redfish target being polled.
pub struct Redfish {
    cfg: RedfishTarget,
    name: String,
    client: Arc<Client>,
}

impl polled::Target for Redfish {
    const SOURCE: &'static str = "redfish";
    type Config = RedfishTarget;

    fn open(cfg: &RedfishTarget) -> Result<Self, String> {
        let password = polled::read_secret(&cfg.password_file, &cfg.password_env)?;
        if cfg.insecure {
            tracing::warn!(target = %cfg.display_name(), "TLS certificate verification is off for this target (insecure = true)");
        }
        Ok(Self {
            cfg: cfg.clone(),
            name: cfg.display_name(),
            client: Arc::new(Client::new(cfg, password)?),
        })
    }

    fn name_of(cfg: &RedfishTarget) -> String {
        cfg.display_name()
    }

    fn interval(&self) -> Duration {
        Duration::from_secs(self.cfg.interval_secs.max(1))
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.cfg.timeout_secs.max(1))
    }

    fn requests(&self) -> u64 {
        self.client.requests()
    }

    async fn poll(&self, model: &Arc<Model>) -> Result<Poll, PollError> {
        let start = Instant::now();
        let w = walk::walk(
            self.client.clone(),
            &self.name,
            self.cfg.expand,
            model.clone(),
        )
        .await
        .map_err(|e| PollError {
            kind: e.kind(),
            message: e.to_string(),
        })?;
        for (url, declared) in w.misnamed.iter().take(3) {
            tracing::debug!(target = %self.name, url, declared, "resource declares another @odata.id; identified by its URL");
        }
        tracing::debug!(
            target = %self.name,
            components = w.poll.components.len(),
            readings = w.poll.readings.len(),
            failed = w.failed,
            expanded = w.expanded,
            secs = start.elapsed().as_secs_f64(),
            "Redfish poll"
        );
        if !w.poll.notes.is_empty() {
            RedfishChassisBlind {
                target: &self.name,
                notes: &w.poll.notes,
            }
            .emit(model);
        }
        Ok(w.poll)
    }

    async fn close(&self) {
        self.client.logout().await;
    }
}

async fn start(config: Arc<Config>, ctx: Ctx) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let targets = config.sources.redfish.targets.clone();
    tracing::info!(targets = targets.len(), "polling Redfish targets");
    Ok(polled::start::<Redfish>(targets, &ctx.model, &ctx.shutdown))
}

/// `junction once` / `inventory`: every target polled once, in parallel.
async fn once(config: Arc<Config>, model: Arc<Model>) -> anyhow::Result<()> {
    polled::once::<Redfish>(config.sources.redfish.targets.clone(), model).await
}

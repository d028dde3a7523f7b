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
use crate::model::{Metric, Model, Sample};
use crate::shutdown::Shutdown;
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

/// Reads a secret from a file (first line) or an environment variable.
pub fn read_secret(file: &str, env: &str) -> Result<Option<String>, String> {
    if !file.is_empty() {
        let text =
            std::fs::read_to_string(file).map_err(|e| format!("password_file {file:?}: {e}"))?;
        return Ok(Some(text.lines().next().unwrap_or("").to_string()));
    }
    if !env.is_empty() {
        return std::env::var(env)
            .map(Some)
            .map_err(|_| format!("password_env: ${env} is not set"));
    }
    Ok(None)
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
};

/// Per-target counters.
#[derive(Default)]
struct TargetStats {
    requests: u64,
    failures: std::collections::BTreeMap<&'static str, u64>,
}

/// One poll: walks the service under the timeout, records the result.
async fn poll_once(
    t: &RedfishTarget,
    client: &Arc<Client>,
    model: &Arc<Model>,
    stats: &mut TargetStats,
    last_error: &mut Option<String>,
) -> bool {
    let name = t.display_name();
    let start = Instant::now();
    let before = client.requests();
    let result = tokio::time::timeout(
        Duration::from_secs(t.timeout_secs.max(1)),
        walk::walk(client.clone(), &name, t.expand, model.clone()),
    )
    .await
    .unwrap_or(Err(client::Error::Timeout));
    let elapsed = start.elapsed();
    stats.requests += client.requests() - before;
    let ok = match result {
        Ok(w) => {
            if last_error.take().is_some() {
                tracing::info!(target = %name, "Redfish target answers again");
            }
            for (url, declared) in w.misnamed.iter().take(3) {
                tracing::debug!(target = %name, url, declared, "resource declares another @odata.id; identified by its URL");
            }
            tracing::debug!(
                target = %name,
                components = w.poll.components.len(),
                readings = w.poll.readings.len(),
                failed = w.failed,
                expanded = w.expanded,
                secs = elapsed.as_secs_f64(),
                "Redfish poll"
            );
            model.set_bmc("redfish", w.poll);
            true
        }
        Err(e) => {
            *stats.failures.entry(e.kind()).or_default() += 1;
            let msg = e.to_string();
            if last_error.as_deref() != Some(msg.as_str()) {
                tracing::warn!(target = %name, url = %crate::redact::url(&t.url), error = %msg, "Redfish poll failed");
                *last_error = Some(msg);
            }
            false
        }
    };
    let mut samples = vec![
        Sample::new(Metric::TargetUp, f64::from(u8::from(ok))),
        Sample::new(Metric::TargetPollDuration, elapsed.as_secs_f64()),
        Sample::new(Metric::TargetRequests, stats.requests as f64),
    ];
    for (kind, n) in &stats.failures {
        samples.push(Sample::new(Metric::TargetPollFailures, *n as f64).with("error.type", *kind));
    }
    for s in &mut samples {
        s.attrs.push(("junction.source", "redfish".into()));
        s.attrs.push(("junction.target", name.clone().into()));
    }
    model.publish("redfish", format!("{name}:stats"), samples);
    ok
}

fn client_for(t: &RedfishTarget) -> Result<Arc<Client>, String> {
    let password = read_secret(&t.password_file, &t.password_env)?;
    if t.insecure {
        tracing::warn!(target = %t.display_name(), "TLS certificate verification is off for this target (insecure = true)");
    }
    Client::new(t, password).map(Arc::new)
}

async fn run_target(
    t: RedfishTarget,
    model: Arc<Model>,
    shutdown: Shutdown,
    up: crate::model::bmc::TargetsUp,
) {
    let name = t.display_name();
    let client = match client_for(&t) {
        Ok(c) => c,
        Err(e) => {
            up.unusable(&model, &name);
            tracing::error!(target = %name, error = %e, "Redfish target not polled");
            return;
        }
    };
    let interval = Duration::from_secs(t.interval_secs.max(1));
    let mut stats = TargetStats::default();
    let mut last_error = None;
    // One poll at a time: the next starts when this one is over and the interval has passed
    // since it started.
    crate::privileges::gate().await;
    let mut ticks = shutdown.ticks(interval);
    while ticks.next().await {
        let Some(ok) = shutdown
            .unless(poll_once(&t, &client, &model, &mut stats, &mut last_error))
            .await
        else {
            break;
        };
        up.set(&model, &name, ok);
    }
    client.logout().await;
}

async fn start(config: Arc<Config>, ctx: Ctx) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let targets = config.sources.redfish.targets.clone();
    tracing::info!(targets = targets.len(), "polling Redfish targets");
    let up = crate::model::bmc::TargetsUp::new("redfish");
    let mut handles = Vec::new();
    for t in targets {
        handles.push(tokio::spawn(run_target(
            t,
            ctx.model.clone(),
            ctx.shutdown.clone(),
            up.clone(),
        )));
    }
    Ok(tokio::spawn(async move {
        for h in handles {
            let _ = h.await;
        }
    }))
}

/// `junction once` / `inventory`: every target polled once, in parallel.
async fn once(config: Arc<Config>, model: Arc<Model>) -> anyhow::Result<()> {
    let mut set = tokio::task::JoinSet::new();
    for t in config.sources.redfish.targets.clone() {
        let model = model.clone();
        set.spawn(async move {
            let client = client_for(&t).map_err(|e| format!("{}: {e}", t.display_name()))?;
            let mut stats = TargetStats::default();
            let mut err = None;
            let ok = poll_once(&t, &client, &model, &mut stats, &mut err).await;
            client.logout().await;
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "{}: {}",
                    t.display_name(),
                    err.unwrap_or_else(|| "poll failed".into())
                ))
            }
        });
    }
    let mut errors = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(Err(e)) = r {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{}", errors.join("; "))
    }
}

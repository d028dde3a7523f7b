//! Targets polled alike (Redfish BMCs and CDUs, IPMI BMCs, and later anything read the same
//! way): one task per target polls it every interval, one poll at a time (the next starts
//! when this one is over and the interval has passed since it started), each bounded by its
//! timeout; a target that fails says why through [`internal_events`](crate::internal_events)
//! (counted in `junction_source_errors_total`, logged rate-limited), reports
//! `junction_target_up` 0, says when it answers again, and never holds up the others.
//! `junction once` polls every target once, in parallel.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::internal_events::{
    self, InternalEvent, TargetPollFailed, TargetTooLarge, TargetUnusable,
};
use crate::model::bmc::{Poll, TargetsUp};
use crate::model::{Metric, Model, Sample};
use crate::shutdown::Shutdown;

/// Why a poll failed: a kind from a closed set (`error.type`) and the sentence.
#[derive(Debug, Clone)]
pub struct PollError {
    /// `error.type`: timeout, auth, tls, connect, http, protocol, tool.
    pub kind: &'static str,
    /// What happened.
    pub message: String,
}

/// A target polled on a schedule.
pub trait Target: Send + Sync + Sized + 'static {
    /// `junction.source`.
    const SOURCE: &'static str;
    /// Its configuration.
    type Config: Clone + Send + Sync + 'static;

    /// Opens the target (credentials, TLS, work directory); an error names the setting.
    fn open(cfg: &Self::Config) -> Result<Self, String>;

    /// The name of a target (`junction.target`), from its configuration.
    fn name_of(cfg: &Self::Config) -> String;

    /// Seconds between the starts of two polls.
    fn interval(&self) -> Duration;

    /// Bound on one whole poll.
    fn timeout(&self) -> Duration;

    /// Requests made so far.
    fn requests(&self) -> u64;

    /// One poll.
    fn poll(&self, model: &Arc<Model>) -> impl Future<Output = Result<Poll, PollError>> + Send;

    /// At shutdown (a Redfish session is deleted).
    fn close(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Components and readings kept of one target's poll, each. The largest real BMC among the
/// captures in `realworld/redfish` (an NVIDIA GH200's) has about 270 sensors; a BMC that
/// reports more than this (a defect, or a hostile one: an expanded collection of 16 MiB can
/// hold tens of thousands) would otherwise grow every export, the model and the kept OTLP
/// state with it. Past it, the rest are left out and said (`junction_source_errors_total`
/// with `error.type` `too_large`).
pub const MAX_PER_TARGET: usize = 4096;

/// Cuts a poll to [`MAX_PER_TARGET`] components and readings; what was cut, as
/// (what, found).
fn bound(poll: &mut Poll) -> Vec<(&'static str, usize)> {
    let mut cut = Vec::new();
    if poll.components.len() > MAX_PER_TARGET {
        cut.push(("components", poll.components.len()));
        poll.components.truncate(MAX_PER_TARGET);
    }
    if poll.readings.len() > MAX_PER_TARGET {
        cut.push(("readings", poll.readings.len()));
        poll.readings.truncate(MAX_PER_TARGET);
    }
    cut
}

/// One target and what its polls have counted.
struct Polled<T> {
    target: T,
    name: String,
    failures: std::collections::BTreeMap<&'static str, u64>,
    failing: bool,
}

impl<T: Target> Polled<T> {
    fn new(target: T, name: String) -> Self {
        Polled {
            target,
            name,
            failures: Default::default(),
            failing: false,
        }
    }

    /// One poll under the timeout; the result goes into the model. `Err`: why it failed.
    async fn poll_once(&mut self, model: &Arc<Model>) -> Result<(), String> {
        let start = Instant::now();
        let result = tokio::time::timeout(self.target.timeout(), self.target.poll(model))
            .await
            .unwrap_or_else(|_| {
                Err(PollError {
                    kind: "timeout",
                    message: format!(
                        "no answer within timeout_secs ({} s)",
                        self.target.timeout().as_secs()
                    ),
                })
            });
        let elapsed = start.elapsed();
        let outcome = match result {
            Ok(mut poll) => {
                for (what, found) in bound(&mut poll) {
                    TargetTooLarge {
                        source: T::SOURCE,
                        target: &self.name,
                        what,
                        found,
                        kept: MAX_PER_TARGET,
                    }
                    .emit(model);
                }
                if std::mem::take(&mut self.failing) {
                    tracing::info!(source = T::SOURCE, target = %self.name, "target answers again");
                    // Its next failure is news again, whatever the limiter's window.
                    for kind in self.failures.keys() {
                        let failed = TargetPollFailed {
                            source: T::SOURCE,
                            target: &self.name,
                            error_type: kind,
                            error: "",
                        };
                        internal_events::recovered(&failed.key());
                    }
                }
                model.set_bmc(T::SOURCE, poll);
                Ok(())
            }
            Err(e) => {
                self.failing = true;
                *self.failures.entry(e.kind).or_default() += 1;
                TargetPollFailed {
                    source: T::SOURCE,
                    target: &self.name,
                    error_type: e.kind,
                    error: &e.message,
                }
                .emit(model);
                Err(e.message)
            }
        };
        let ok = outcome.is_ok();
        let mut samples = vec![
            Sample::new(Metric::TargetUp, f64::from(u8::from(ok))),
            Sample::new(Metric::TargetPollDuration, elapsed.as_secs_f64()),
            Sample::new(Metric::TargetRequests, self.target.requests() as f64),
        ];
        for (kind, n) in &self.failures {
            samples
                .push(Sample::new(Metric::TargetPollFailures, *n as f64).with("error.type", *kind));
        }
        for s in &mut samples {
            s.attrs.push(("junction.source", T::SOURCE.into()));
            s.attrs.push(("junction.target", self.name.clone().into()));
        }
        model.publish(T::SOURCE, format!("{}:stats", self.name), samples);
        outcome
    }
}

fn open<T: Target>(cfg: &T::Config, model: &Model, up: &TargetsUp) -> Option<Polled<T>> {
    let name = T::name_of(cfg);
    match T::open(cfg) {
        Ok(target) => Some(Polled::new(target, name)),
        Err(e) => {
            up.unusable(model, &name);
            TargetUnusable {
                source: T::SOURCE,
                target: &name,
                error: &e,
            }
            .emit(model);
            None
        }
    }
}

async fn run<T: Target>(cfg: T::Config, model: Arc<Model>, shutdown: Shutdown, up: TargetsUp) {
    let Some(mut p) = open::<T>(&cfg, &model, &up) else {
        return;
    };
    crate::privileges::gate().await;
    let mut ticks = shutdown.ticks(p.target.interval());
    while ticks.next().await {
        let Some(outcome) = shutdown.unless(p.poll_once(&model)).await else {
            break;
        };
        up.set(&model, &p.name, outcome.is_ok());
    }
    p.target.close().await;
}

/// Starts one task per target; the handle ends when they all have.
pub fn start<T: Target>(
    targets: Vec<T::Config>,
    model: &Arc<Model>,
    shutdown: &Shutdown,
) -> tokio::task::JoinHandle<()> {
    let up = TargetsUp::new(T::SOURCE);
    let handles: Vec<_> = targets
        .into_iter()
        .map(|cfg| tokio::spawn(run::<T>(cfg, model.clone(), shutdown.clone(), up.clone())))
        .collect();
    tokio::spawn(async move {
        for h in handles {
            let _ = h.await;
        }
    })
}

/// `junction once` / `inventory`: every target polled once, in parallel; an error names each
/// target that failed and why.
pub async fn once<T: Target>(targets: Vec<T::Config>, model: Arc<Model>) -> anyhow::Result<()> {
    let mut set = tokio::task::JoinSet::new();
    for cfg in targets {
        let model = model.clone();
        set.spawn(async move {
            let name = T::name_of(&cfg);
            let target = T::open(&cfg).map_err(|e| format!("{name}: {e}"))?;
            let mut p = Polled::new(target, name.clone());
            let r = p.poll_once(&model).await;
            p.target.close().await;
            r.map_err(|e| format!("{name}: {e}"))
        });
    }
    let mut errors = Vec::new();
    while let Some(r) = set.join_next().await {
        if let Ok(Err(e)) = r {
            errors.push(e);
        }
    }
    errors.sort();
    if errors.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{}", errors.join("; "))
    }
}

/// A target's password: the first line of `file`, or the variable `env`; none if neither is
/// given. An error names the setting and what is wrong with it.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::bmc::{Quantity, Reading, Scope};

    /// A target whose every poll reports `n` temperature readings.
    struct Flood {
        n: usize,
    }

    impl Target for Flood {
        const SOURCE: &'static str = "redfish";
        type Config = usize;

        fn open(n: &usize) -> Result<Self, String> {
            Ok(Flood { n: *n })
        }
        fn name_of(_: &usize) -> String {
            "flood".into()
        }
        fn interval(&self) -> Duration {
            Duration::from_secs(1)
        }
        fn timeout(&self) -> Duration {
            Duration::from_secs(5)
        }
        fn requests(&self) -> u64 {
            1
        }
        async fn poll(&self, _: &Arc<Model>) -> Result<Poll, PollError> {
            let readings = (0..self.n)
                .map(|i| Reading {
                    id: format!("flood:/Sensors/{i}"),
                    hw_type: "temperature".into(),
                    name: format!("T{i}"),
                    parent: None,
                    quantity: Quantity::Temperature,
                    value: 40.0,
                    unit: "Cel".into(),
                    location: None,
                    point: None,
                    thresholds: Vec::new(),
                    state: None,
                    scope: Scope::Auto,
                })
                .collect();
            Ok(Poll {
                target: "flood".into(),
                readings,
                ..Poll::default()
            })
        }
    }

    /// A target that reports more readings than are kept of one: the first MAX_PER_TARGET
    /// go into the model, the poll still counts as answered, and the cut is counted; one
    /// within the bound is kept whole and counts nothing.
    #[tokio::test]
    async fn a_target_is_kept_to_its_bound_and_the_cut_is_counted() {
        let key = |m: &Model| {
            m.errors.get(&internal_events::Key {
                source: "redfish",
                stage: "poll",
                error_type: "too_large",
                subject: internal_events::Subject::Target("flood".into()),
            })
        };
        for (n, kept, cut) in [(MAX_PER_TARGET * 4, MAX_PER_TARGET, 1), (300, 300, 0)] {
            let model = Arc::new(Model::new());
            let mut p = Polled::new(Flood::open(&n).expect("open"), "flood".into());
            assert!(p.poll_once(&model).await.is_ok(), "answered");
            let polls = model.bmc_polls();
            assert_eq!(polls.len(), 1);
            assert_eq!(polls[0].1.readings.len(), kept, "{n} reported");
            assert_eq!(key(&model), cut, "{n} reported");
        }
    }
}

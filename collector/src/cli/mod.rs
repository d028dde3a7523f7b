//! The commands: `run`, `once` and `inventory`. Sources and sinks come from their tables
//! (`sources::ALL`, `sinks::ALL`); nothing here knows any one of them.

mod render;

use std::sync::Arc;

use anyhow::Context as _;

use crate::agent::{Ctx, SHUTDOWN_DEADLINE};
use crate::config::Config;
use crate::model::Model;
use crate::shutdown::Shutdown;
use crate::sinks::prometheus;
use crate::{Format, InventoryFormat, sinks, sources};
use render::{inventory_json, inventory_table, json, table};

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(2).thread_name("junction-rt");
    crate::agent::bound_blocking_pool(&mut builder, crate::agent::BLOCKING_THREADS)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// `junction healthcheck`: GET `/healthz` of a running agent; the answer when it is 200.
pub fn healthcheck(
    config: &Config,
    url: Option<String>,
    timeout: std::time::Duration,
) -> anyhow::Result<String> {
    let url = match url {
        Some(u) => u,
        None => {
            let listen = &config.sinks.prometheus.listen;
            let mut addr: std::net::SocketAddr = listen
                .parse()
                .with_context(|| format!("sinks.prometheus.listen {listen:?}"))?;
            if addr.ip().is_unspecified() {
                addr.set_ip(if addr.is_ipv4() {
                    std::net::Ipv4Addr::LOCALHOST.into()
                } else {
                    std::net::Ipv6Addr::LOCALHOST.into()
                });
            }
            format!("http://{addr}/healthz")
        }
    };
    let client = reqwest::blocking::Client::builder()
        .timeout(timeout)
        .build()
        .context("HTTP client")?;
    let answer = client
        .get(&url)
        .send()
        .with_context(|| format!("no answer from {url}"))?;
    let status = answer.status();
    let body = answer.text().unwrap_or_default();
    if status.is_success() {
        Ok(body)
    } else {
        anyhow::bail!("{url} answered {status}: {}", body.trim())
    }
}

/// `junction run`: start the sinks, then the sources; stop on SIGTERM or SIGINT.
///
/// The signal handlers and the sinks come first, so that a slow or hanging source start-up
/// (NVML takes seconds per GPU without persistence mode) neither hides the endpoint nor
/// ignores SIGTERM.
pub fn run(config: Config) -> anyhow::Result<()> {
    crate::agent::started_ns();
    naming(&config);
    let rt = runtime()?;
    let result = rt.block_on(serve(Arc::new(config)));
    // A source still starting (a hung nvmlInit) is not waited for.
    rt.shutdown_timeout(SHUTDOWN_DEADLINE);
    result
}

async fn serve(config: Arc<Config>) -> anyhow::Result<()> {
    let mut signals = Signals::new();
    let model = Model::new();
    model.processes.set_proc_root(config.proc_root.clone());
    model.history.set_bounds(
        config.health.history_max_bytes,
        std::time::Duration::from_secs(config.health.history_max_age_secs),
    );
    model.open_state(&config.state_dir, &config.proc_root);
    let (stop_sources, stop_sinks) = (Shutdown::default(), Shutdown::default());
    // Nothing reads untrusted input until the capabilities it does not need are gone.
    crate::privileges::close_gate();
    for (component, why) in crate::agent::off_but_asked(&config) {
        tracing::warn!(component, "{why}");
    }
    // Events are held for the sink that ships them (OTLP sets its queue bound when it
    // starts); with none, a short tail.
    model
        .events
        .set_capacity(crate::model::events::EventLog::UNSHIPPED);
    let mut sink_tasks = Vec::new();
    for sink in sinks::ALL.iter().filter(|s| (s.enabled)(&config)) {
        let ctx = Ctx {
            model: model.clone(),
            shutdown: stop_sinks.clone(),
        };
        // A sink that cannot start (a busy port) fails the command, naming what to fix.
        let task = (sink.start)(config.clone(), ctx.clone()).await?;
        sink_tasks.push((
            sink.name,
            supervise(sink, Kind::Sink, config.clone(), ctx, task),
        ));
    }
    let mut source_tasks = Vec::new();
    for source in sources::ALL.iter().filter(|s| (s.enabled)(&config)) {
        let ctx = Ctx {
            model: model.clone(),
            shutdown: stop_sources.clone(),
        };
        match (source.start)(config.clone(), ctx.clone()).await {
            Ok(task) => source_tasks.push((
                source.name,
                supervise(source, Kind::Source, config.clone(), ctx, task),
            )),
            // One failing source never stops the others.
            Err(e) => {
                model.set_source_up(source.name, false);
                tracing::error!(source = source.name, error = %format!("{e:#}"), "source failed to start; going on without it");
            }
        }
    }
    // Everything that needed privileges is loaded and open: keep only what is still used.
    if config.drop_privileges {
        let dropped = crate::privileges::drop_all_but(&crate::privileges::KEEP)
            .and_then(|kept| crate::privileges::verify(kept).map(|n| (kept, n)));
        match dropped {
            Ok((0, _)) => {}
            Ok((kept, threads)) => tracing::info!(
                kept = %crate::privileges::names(kept),
                threads,
                "started; dropped every other capability (verified on every thread)"
            ),
            // Reported as a source down, so that the health check and the endpoint say so.
            Err(e) => {
                tracing::error!(error = %e, "could not drop capabilities; the privileges check is down");
                model.set_source_up("privileges", false);
                model.set_source_detail(
                    "privileges",
                    vec![format!("capabilities not dropped: {e}")],
                );
            }
        }
    }
    crate::privileges::open_gate();
    let release = tokio::spawn(crate::allocator::release_periodically(
        model.clone(),
        stop_sinks.clone(),
    ));
    signals.wait().await;
    tracing::info!("shutting down");
    // Sources first, then the sinks (which may make a final export of what the sources left).
    stop_sources.trigger();
    wait_all("source", source_tasks).await;
    stop_sinks.trigger();
    wait_all("sink", sink_tasks).await;
    let _ = release.await;
    tracing::info!("stopped");
    Ok(())
}

/// Whether a supervised component is a source or a sink.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Source,
    Sink,
}

/// Watches a source's or a sink's task: one that panics is reported down with the panic's
/// message (`junction inventory`, `junction_source_up` under the component's name, the log)
/// and started again, after 1 s, then twice as long each time up to a minute. A task that
/// ends by itself (a source that found nothing to read) is not restarted. A restarted source
/// says again whether it is up; a restarted sink is up once its start has succeeded (a sink
/// has no `junction_source_up` series until it has panicked once).
fn supervise(
    source: &'static crate::agent::Component,
    kind: Kind,
    config: Arc<Config>,
    ctx: Ctx,
    first: tokio::task::JoinHandle<()>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut task = first;
        let mut backoff = std::time::Duration::from_secs(1);
        let mut restarts = 0u64;
        loop {
            let ended = task.await;
            if ctx.shutdown.is_triggered() {
                return;
            }
            let why = match ended {
                Err(e) if e.is_panic() => crate::agent::panic_message(e.into_panic()),
                _ => return,
            };
            restarts += 1;
            let what = if kind == Kind::Sink { "sink" } else { "source" };
            use crate::internal_events::InternalEvent as _;
            crate::internal_events::ComponentPanicked {
                component: source.name,
                kind: what,
                why: &why,
                restarts,
                backoff,
            }
            .emit(&ctx.model);
            loop {
                ctx.model.set_source_up(source.name, false);
                ctx.model.set_source_detail(
                    source.name,
                    vec![format!("panicked ({why}); restarted {restarts} time(s)")],
                );
                if ctx
                    .shutdown
                    .unless(tokio::time::sleep(backoff))
                    .await
                    .is_none()
                {
                    return;
                }
                backoff = (backoff * 2).min(std::time::Duration::from_secs(60));
                match (source.start)(config.clone(), ctx.clone()).await {
                    Ok(t) => {
                        task = t;
                        if kind == Kind::Sink {
                            ctx.model.set_source_up(source.name, true);
                            ctx.model.set_source_detail(
                                source.name,
                                vec![format!("restarted {restarts} time(s); last panic: {why}")],
                            );
                        }
                        break;
                    }
                    Err(e) => {
                        tracing::error!(component = source.name, error = %format!("{e:#}"), "{what} failed to restart; trying again in {backoff:?}")
                    }
                }
            }
        }
    })
}

/// Waits for tasks under [`SHUTDOWN_DEADLINE`]; one that does not stop is left behind.
async fn wait_all(kind: &str, tasks: Vec<(&'static str, tokio::task::JoinHandle<()>)>) {
    let deadline = tokio::time::Instant::now() + SHUTDOWN_DEADLINE;
    for (name, task) in tasks {
        if tokio::time::timeout_at(deadline, task).await.is_err() {
            tracing::warn!(
                kind,
                name,
                "did not stop within the shutdown deadline; left behind"
            );
        }
    }
}

/// SIGTERM and SIGINT, registered as soon as the runtime starts.
struct Signals {
    term: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate())
            .inspect_err(
                |e| tracing::warn!(error = %e, "cannot watch SIGTERM; stopping on SIGINT only"),
            )
            .ok();
        Self { term }
    }

    async fn wait(&mut self) {
        match &mut self.term {
            Some(term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

/// One collection by every enabled source that has one. A source that fails is reported;
/// the command fails only if nothing could be collected. With `inspect` (`junction
/// inventory`), each source's outcome is recorded for the Sources section, and the model is
/// returned even when every collection failed, with the failures, so that what the other
/// sources see is printed beside the error.
fn collect_once(config: Config, inspect: bool) -> anyhow::Result<(Arc<Model>, Vec<String>)> {
    let config = Arc::new(config);
    let model = Model::new();
    model.processes.set_proc_root(config.proc_root.clone());
    let rt = runtime()?;
    let result = rt.block_on(async {
        let mut failures = Vec::new();
        let mut status: Vec<(&'static str, String)> = Vec::new();
        let mut ran = 0;
        for source in sources::ALL {
            if !(source.enabled)(&config) {
                status.push((source.name, "off in the configuration".into()));
                continue;
            }
            let Some(once) = source.once else {
                status.push((source.name, "on; runs under `junction run` only".into()));
                continue;
            };
            ran += 1;
            match once(config.clone(), model.clone()).await {
                Ok(()) => status.push((source.name, "on; collected".into())),
                // Nothing of its kind here: not run.
                Err(e) if e.downcast_ref::<crate::agent::NothingHere>().is_some() => {
                    ran -= 1;
                    status.push((source.name, format!("on; nothing here: {e:#}")));
                }
                Err(e) => {
                    status.push((source.name, format!("on; failed: {e:#}")));
                    failures.push(format!("{} source failed: {e:#}", source.name));
                }
            }
        }
        for c in sources::ALL.iter().filter(|s| (s.enabled)(&config)) {
            if let Some(derive) = c.derive {
                derive(config.clone(), model.clone()).await;
            }
        }
        if inspect {
            for c in sources::ALL.iter().chain(sinks::ALL) {
                if let Some(check) = c.inspect {
                    check(config.clone(), model.clone()).await;
                }
            }
            let details = model.source_details();
            for (name, line) in status {
                let mut lines = vec![line];
                lines.extend(details.get(name).cloned().unwrap_or_default());
                model.set_source_detail(name, lines);
            }
            for (component, why) in crate::agent::off_but_asked(&config) {
                model.set_source_detail(component, vec![why]);
            }
            // Partial failures are in the Sources section; a total one fails the command.
            let total = ran > 0 && failures.len() == ran;
            return Ok(if total { failures } else { Vec::new() });
        }
        match (ran, failures.len()) {
            (0, _) => anyhow::bail!("no source is enabled: nothing to collect"),
            (n, f) if f == n => anyhow::bail!("{}", failures.join("\n")),
            _ => {
                for f in failures {
                    eprintln!("junction: {f}");
                }
                Ok(Vec::new())
            }
        }
    });
    rt.shutdown_timeout(SHUTDOWN_DEADLINE);
    result.map(|f| (model, f))
}

/// How the sinks name and label what they export (process-wide, set once before any
/// export): the previous release's Prometheus names, the GPU's identity attributes.
fn naming(config: &Config) {
    prometheus::encode::set_legacy_names(config.sinks.legacy_names);
    crate::model::events::set_legacy_names(config.sinks.legacy_names);
    crate::model::view::set_identity_attributes(config.sinks.identity_attributes);
}

/// `junction once`: one collection, printed.
pub fn once(config: Config, format: Format) -> anyhow::Result<()> {
    naming(&config);
    let otlp = (matches!(format, Format::Otlp))
        .then(|| (config.sinks.otlp.clone(), config.proc_root.clone()));
    let (model, _) = collect_once(config, false)?;
    if let Some((otlp, proc_root)) = otlp {
        use std::io::Write as _;
        let bytes = crate::sinks::otlp::request_now(&otlp, &proc_root, &model)?;
        std::io::stdout().write_all(&bytes)?;
        return Ok(());
    }
    let text = match format {
        Format::Otlp => unreachable!("written above"),
        Format::Prometheus => prometheus::render(&model),
        Format::Json => serde_json::to_string_pretty(&json(&model))? + "\n",
        Format::Table => table(&model),
    };
    print!("{text}");
    Ok(())
}

/// `junction inventory`: GPUs, supported and disabled features, health.
pub fn inventory(config: Config, format: InventoryFormat) -> anyhow::Result<()> {
    let (model, failed) = collect_once(config, true)?;
    match format {
        InventoryFormat::Json => {
            println!("{}", serde_json::to_string_pretty(&inventory_json(&model))?)
        }
        InventoryFormat::Table => print!("{}", inventory_table(&model)),
    }
    // Every collection failed: printed above with the rest, and the exit status says so.
    if !failed.is_empty() {
        anyhow::bail!("{}", failed.join("\n"));
    }
    Ok(())
}

/// `junction history`: the state directory's event history, filtered.
pub fn history(
    config: &Config,
    gpu: Option<&str>,
    since: &str,
    format: InventoryFormat,
) -> anyhow::Result<()> {
    let window = humantime::parse_duration(since)
        .map_err(|e| anyhow::anyhow!("--since {since:?}: {e} (write e.g. 3d, 12h or 30m)"))?;
    let path = config.state_dir.join(crate::model::history::FILE);
    if !path.exists() {
        anyhow::bail!(
            "{} does not exist: the agent has recorded nothing there yet (state_dir = {:?})",
            path.display(),
            config.state_dir.display().to_string()
        );
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let from = now.saturating_sub(window.as_millis() as u64);
    let entries: Vec<_> = crate::model::history::read(&path)
        .into_iter()
        .filter(|e| e.ms >= from && gpu.is_none_or(|g| e.id == g))
        .collect();
    match format {
        InventoryFormat::Json => println!("{}", serde_json::to_string_pretty(&entries)?),
        InventoryFormat::Table => print!("{}", render::history_table(&entries)),
    }
    Ok(())
}

#[cfg(test)]
mod tests;

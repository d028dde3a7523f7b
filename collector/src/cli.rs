//! The commands: `run`, `once` and `inventory`. Sources and sinks come from their tables
//! (`sources::ALL`, `sinks::ALL`); nothing here knows any one of them.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::Context as _;

use crate::agent::{Ctx, SHUTDOWN_DEADLINE};
use crate::config::Config;
use crate::model::{GpuSlot, Metric, Model};
use crate::shutdown::Shutdown;
use crate::sinks::prometheus;
use crate::{Format, InventoryFormat, sinks, sources};

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("junction-rt")
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// `junction run`: start the sinks, then the sources; stop on SIGTERM or SIGINT.
///
/// The signal handlers and the sinks come first, so that a slow or hanging source start-up
/// (NVML takes seconds per GPU without persistence mode) neither hides the endpoint nor
/// ignores SIGTERM.
pub fn run(config: Config) -> anyhow::Result<()> {
    let rt = runtime()?;
    let result = rt.block_on(serve(Arc::new(config)));
    // A source still starting (a hung nvmlInit) is not waited for.
    rt.shutdown_timeout(SHUTDOWN_DEADLINE);
    result
}

async fn serve(config: Arc<Config>) -> anyhow::Result<()> {
    let mut signals = Signals::new();
    let model = Model::new();
    let (stop_sources, stop_sinks) = (Shutdown::default(), Shutdown::default());
    let mut sink_tasks = Vec::new();
    for sink in sinks::ALL.iter().filter(|s| (s.enabled)(&config)) {
        let ctx = Ctx {
            model: model.clone(),
            shutdown: stop_sinks.clone(),
        };
        // A sink that cannot start (a busy port) fails the command, naming what to fix.
        let task = (sink.start)(config.clone(), ctx).await?;
        sink_tasks.push((sink.name, task));
    }
    let mut source_tasks = Vec::new();
    for source in sources::ALL.iter().filter(|s| (s.enabled)(&config)) {
        let ctx = Ctx {
            model: model.clone(),
            shutdown: stop_sources.clone(),
        };
        match (source.start)(config.clone(), ctx).await {
            Ok(task) => source_tasks.push((source.name, task)),
            // One failing source never stops the others.
            Err(e) => {
                model.set_source_up(source.name, false);
                tracing::error!(source = source.name, error = %format!("{e:#}"), "source failed to start; going on without it");
            }
        }
    }
    signals.wait().await;
    tracing::info!("shutting down");
    // Sources first, then the sinks (which may make a final export of what the sources left).
    stop_sources.trigger();
    wait_all("source", source_tasks).await;
    stop_sinks.trigger();
    wait_all("sink", sink_tasks).await;
    tracing::info!("stopped");
    Ok(())
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
/// the command fails only if nothing could be collected.
fn collect_once(config: Config) -> anyhow::Result<Arc<Model>> {
    let config = Arc::new(config);
    let model = Model::new();
    let rt = runtime()?;
    let result = rt.block_on(async {
        let mut failures = Vec::new();
        let mut ran = 0;
        for source in sources::ALL.iter().filter(|s| (s.enabled)(&config)) {
            let Some(once) = source.once else { continue };
            ran += 1;
            if let Err(e) = once(config.clone(), model.clone()).await {
                failures.push(format!("{} source failed: {e:#}", source.name));
            }
        }
        match (ran, failures.len()) {
            (0, _) => anyhow::bail!("no source is enabled: nothing to collect"),
            (n, f) if f == n => anyhow::bail!("{}", failures.join("\n")),
            _ => {
                for f in failures {
                    eprintln!("junction: {f}");
                }
                Ok(())
            }
        }
    });
    rt.shutdown_timeout(SHUTDOWN_DEADLINE);
    result.map(|()| model)
}

/// `junction once`: one collection, printed.
pub fn once(config: Config, format: Format) -> anyhow::Result<()> {
    let model = collect_once(config)?;
    let text = match format {
        Format::Prometheus => prometheus::render(&model),
        Format::Json => serde_json::to_string_pretty(&json(&model))? + "\n",
        Format::Table => table(&model),
    };
    print!("{text}");
    Ok(())
}

/// `junction inventory`: GPUs, supported and disabled features.
pub fn inventory(config: Config, format: InventoryFormat) -> anyhow::Result<()> {
    let model = collect_once(config)?;
    let snap = model.snapshot();
    match format {
        InventoryFormat::Json => {
            let gpus: Vec<_> = snap
                .iter()
                .map(|g| {
                    serde_json::json!({
                        "gpu": g.info,
                        "state": g.state,
                        "reason": g.reason.as_ref().map(|r| &r.1),
                        "supported_metrics": supported(g),
                        "disabled": g.disabled,
                    })
                })
                .collect();
            let doc = serde_json::json!({ "driver": model.driver(), "gpus": gpus });
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
        InventoryFormat::Table => {
            let mut out = String::new();
            if let Some(d) = model.driver() {
                let _ = writeln!(
                    out,
                    "Driver {}  CUDA {}  NVML {}",
                    d.driver_version,
                    d.cuda_version.unwrap_or_default(),
                    d.nvml_version.unwrap_or_default()
                );
            }
            for g in &snap {
                let i = &g.info;
                let _ = writeln!(out, "\nGPU {}  {}  {}", i.index, i.uuid, i.name);
                let _ = writeln!(
                    out,
                    "  pci {}  serial {}  minor {}  vbios {}  state {}",
                    i.pci_bus_id,
                    i.serial.as_deref().unwrap_or("-"),
                    i.minor_number
                        .map(|m| m.to_string())
                        .unwrap_or_else(|| "-".into()),
                    i.vbios.as_deref().unwrap_or("-"),
                    g.state.as_str()
                );
                if let Some((_, r)) = &g.reason {
                    let _ = writeln!(out, "  reason: {r}");
                }
                let _ = writeln!(out, "  supported: {}", supported(g).join(", "));
                if g.disabled.is_empty() {
                    let _ = writeln!(out, "  disabled: none");
                } else {
                    let _ = writeln!(out, "  disabled:");
                    for (feature, why) in &g.disabled {
                        let _ = writeln!(out, "    {feature}: {why}");
                    }
                }
            }
            print!("{out}");
        }
    }
    Ok(())
}

/// Metric names that have samples on this GPU.
fn supported(g: &GpuSlot) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = g
        .groups
        .iter()
        .flat_map(|v| v.iter())
        .map(|s| s.metric.desc().name)
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

fn json(model: &Model) -> serde_json::Value {
    let gpus: Vec<_> = model
        .snapshot()
        .iter()
        .map(|g| {
            let metrics: Vec<_> = g
                .groups
                .iter()
                .flat_map(|v| v.iter())
                .map(|s| {
                    let attrs: serde_json::Map<String, serde_json::Value> =
                        s.attrs.iter().map(|(k, v)| (k.to_string(), v.to_string().into())).collect();
                    serde_json::json!({ "name": s.metric.desc().name, "unit": s.metric.desc().unit, "attributes": attrs, "value": s.value })
                })
                .collect();
            serde_json::json!({ "gpu": g.info, "state": g.state, "reason": g.reason.as_ref().map(|r| &r.1), "metrics": metrics })
        })
        .collect();
    serde_json::json!({ "driver": model.driver(), "gpus": gpus })
}

/// The value of `metric` on a GPU whose attributes match `attrs`.
fn find(g: &GpuSlot, metric: Metric, attrs: &[(&str, &str)]) -> Option<f64> {
    g.groups
        .iter()
        .flat_map(|v| v.iter())
        .find(|s| s.metric == metric && attrs.iter().all(|(k, v)| s.attr(k) == Some(v)))
        .map(|s| s.value)
}

fn fmt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

/// A per-GPU table like `nvidia-smi`.
fn table(model: &Model) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let mut out = String::new();
    if let Some(d) = model.driver() {
        let _ = writeln!(
            out,
            "Driver {}  CUDA {}",
            d.driver_version,
            d.cuda_version.unwrap_or_default()
        );
    }
    let _ = writeln!(
        out,
        "{:>3}  {:<24} {:<13} {:>5} {:>5} {:>13} {:>19} {:>5} {:>8}  State",
        "GPU", "Name", "Bus-Id", "Temp", "HBM", "Power/Cap", "Memory-Usage", "Util", "SM-Clock",
    );
    let snap = model.snapshot();
    for g in &snap {
        let temp = find(g, Metric::Temperature, &[("hw.sensor_location", "gpu_die")]);
        let hbm = find(
            g,
            Metric::Temperature,
            &[("hw.sensor_location", "memory_junction")],
        );
        let power = find(g, Metric::Power, &[]);
        let cap = find(
            g,
            Metric::PowerLimit,
            &[("gpu.power.limit_type", "enforced")],
        );
        let used = find(g, Metric::MemoryUsage, &[]);
        let total = find(g, Metric::MemoryLimit, &[]);
        let util = find(g, Metric::Utilization, &[("hw.gpu.task", "general")]);
        let sm = find(g, Metric::ClockFrequency, &[("gpu.clock.domain", "sm")]);
        let mut name = g.info.name.clone();
        name.truncate(24);
        let _ = writeln!(
            out,
            "{:>3}  {:<24} {:<13} {:>5} {:>5} {:>13} {:>19} {:>5} {:>8}  {}",
            g.info.index,
            name,
            g.info.pci_bus_id,
            fmt(temp, |v| format!("{v:.0}C")),
            fmt(hbm, |v| format!("{v:.0}C")),
            format!(
                "{}/{}",
                fmt(power, |v| format!("{v:.0}W")),
                fmt(cap, |v| format!("{v:.0}W"))
            ),
            format!(
                "{}/{}",
                fmt(used, |v| format!("{:.0}MiB", v / MIB)),
                fmt(total, |v| format!("{:.0}MiB", v / MIB))
            ),
            fmt(util, |v| format!("{:.0}%", v * 100.0)),
            fmt(sm, |v| format!("{:.0}MHz", v / 1e6)),
            g.state.as_str(),
        );
    }
    let procs: Vec<_> = snap
        .iter()
        .flat_map(|g| {
            g.groups
                .iter()
                .flat_map(|v| v.iter())
                .filter(|s| s.metric == Metric::ProcessMemory)
                .map(move |s| (g, s))
        })
        .collect();
    if !procs.is_empty() {
        let _ = writeln!(
            out,
            "\nProcesses:\n{:>3}  {:>8}  {:<9} {:<24} {:>12}",
            "GPU", "PID", "Type", "Name", "GPU Memory"
        );
        for (g, s) in procs {
            let _ = writeln!(
                out,
                "{:>3}  {:>8}  {:<9} {:<24} {:>9.0}MiB",
                g.info.index,
                s.attr("process.pid").unwrap_or("-"),
                s.attr("gpu.process.type").unwrap_or("-"),
                s.attr("process.executable.name").unwrap_or("-"),
                s.value / MIB
            );
        }
    }
    for g in snap.iter().filter(|g| g.reason.is_some()) {
        let _ = writeln!(
            out,
            "GPU {}: {}",
            g.info.index,
            g.reason.as_ref().map(|r| r.1.as_str()).unwrap_or_default()
        );
    }
    out
}

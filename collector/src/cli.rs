//! The commands: `run`, `once` and `inventory`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use crate::config::Config;
use crate::model::{GpuSlot, Metric, Model};
use crate::sinks::prometheus;
use crate::sources::nvml::{NvmlSource, Shutdown};
use crate::{Format, InventoryFormat};

/// How long shutdown waits for sources to stop.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(3);

/// `junction run`: start the sinks, then the sources; stop on SIGTERM or SIGINT.
///
/// The signal handlers and `/metrics` come first, so that a slow or hanging NVML start-up
/// (seconds per GPU without persistence mode) neither hides the endpoint nor ignores SIGTERM.
pub fn run(config: Config) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("junction-rt")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = rt.block_on(serve(config));
    // A source still starting (a hung nvmlInit) is not waited for.
    rt.shutdown_timeout(SHUTDOWN_DEADLINE);
    result
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let signals = Signals::new();
    let model = Model::new();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let server = if config.sinks.prometheus.enabled {
        let listen = &config.sinks.prometheus.listen;
        let listener = prometheus::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen} (sinks.prometheus.listen)"))?;
        tracing::info!(listen = %listen, "serving /metrics and /healthz");
        let mut rx = stop_rx.clone();
        let model = model.clone();
        Some(tokio::spawn(async move {
            prometheus::serve(listener, model, async move {
                let _ = rx.wait_for(|stop| *stop).await;
            })
            .await
        }))
    } else {
        None
    };

    let shutdown = Shutdown::default();
    let mut workers = None;
    let mut signals = signals;
    if config.sources.nvml.enabled {
        // Down until it has started: /healthz answers 503 meanwhile.
        model.set_source_up("nvml", false);
        let (cfg, m, sd) = (config.sources.nvml.clone(), model.clone(), shutdown.clone());
        let proc_root = config.proc_root.clone();
        let start =
            tokio::task::spawn_blocking(move || NvmlSource::build(&cfg, &proc_root, m).map(|s| s.start(sd)));
        tokio::select! {
            started = start => match started {
                Ok(Ok(w)) => workers = Some(w),
                Ok(Err(e)) => {
                    // One failing source never stops the others: report it and keep serving.
                    tracing::error!(error = %format!("{:#}", anyhow::Error::from(e)), "NVML source failed to start; serving without it");
                }
                Err(e) => tracing::error!(error = %e, "NVML start-up task failed; serving without it"),
            },
            () = signals.wait() => return stop(shutdown, stop_tx, server, None).await,
        }
    }
    signals.wait().await;
    stop(shutdown, stop_tx, server, workers).await
}

/// Shutdown in order: sources, then the HTTP server, each under the deadline.
async fn stop(
    shutdown: Shutdown,
    stop_tx: tokio::sync::watch::Sender<bool>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    workers: Option<crate::sources::nvml::Workers>,
) -> anyhow::Result<()> {
    tracing::info!("shutting down");
    shutdown.trigger();
    let _ = stop_tx.send(true);
    if let Some(server) = server {
        match tokio::time::timeout(SHUTDOWN_DEADLINE, server).await {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "HTTP server ended with an error"),
            Err(_) => tracing::warn!("HTTP server did not stop within the deadline"),
            _ => {}
        }
    }
    if let Some(w) = workers {
        tokio::task::spawn_blocking(move || w.stop(SHUTDOWN_DEADLINE))
            .await
            .ok();
    }
    tracing::info!("stopped");
    Ok(())
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

fn collect_once(config: &Config) -> anyhow::Result<Arc<Model>> {
    anyhow::ensure!(
        config.sources.nvml.enabled,
        "sources.nvml is disabled: nothing to collect"
    );
    let model = Model::new();
    let source = NvmlSource::build(&config.sources.nvml, &config.proc_root, model)?;
    Ok(source.collect_once())
}

/// `junction once`: one collection, printed.
pub fn once(config: Config, format: Format) -> anyhow::Result<()> {
    let model = collect_once(&config)?;
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
    let model = collect_once(&config)?;
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

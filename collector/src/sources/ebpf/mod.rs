//! The eBPF source: which process uses which GPU, and how, from the NVIDIA driver's ioctls.
//!
//! BPF programs (`collector-ebpf`) watch `ioctl()` on NVIDIA device files, decode the driver
//! requests that matter (object allocation and free, controls, mappings, GPU registration),
//! keep exact per-process aggregates in the kernel and send state changes through a ring
//! buffer. Here the records become, per process, an RM object tree, live driver memory and
//! contexts per GPU, and call counts and latency, joined with the model's process table
//! (name, container, pod) and exported per (GPU, process) — for processes too short-lived
//! for NVML's sampling too.
//!
//! Needs: root (CAP_BPF, CAP_PERFMON), kernel BTF, tracefs (mounted if missing). Without
//! them: one line with the reason and the fix, and Junction runs without it.

pub mod bench;
pub mod btf;
pub mod confine;
mod drain;
pub mod loader;
pub mod tracker;

use std::sync::Arc;

use crate::agent::{Component, Ctx, Kept};
use crate::config::{Config, Invalid, config_section};
use crate::internal_events::{EbpfMismatch, EbpfUnavailable, EbpfWatchSkipped, InternalEvent};
use crate::model::Model;

config_section! {
    /// `[sources.ebpf]`
    pub struct EbpfConfig {
        /// Trace NVIDIA driver calls per process with eBPF (needs root: CAP_BPF and
        /// CAP_PERFMON, and kernel BTF). Without the privileges Junction says why and runs
        /// without it. Default: true.
        pub enabled: bool = true,
        /// Advanced / test setting: device nodes to treat as NVIDIA devices besides
        /// `/dev/nvidia*`, `/dev/nvidia-uvm*` and `/dev/nvidia-caps/*` (at most 8). Requests
        /// on them are decoded whatever the call returned (no device without a GPU
        /// implements the NVIDIA ioctls: they answer ENOTTY). Default: [].
        pub watch_devices: Vec<String> = Vec::new(),
        /// How to attach: "auto" (kprobes on the driver's ioctl entry points where the kernel
        /// has kprobes and the nvidia modules are loaded, so that other syscalls pay nothing;
        /// else the syscall tracepoints), "tracepoint", or "kprobe" (falls back to the
        /// tracepoints where kprobes cannot attach). Default: "auto".
        pub attach: String = "auto".into(),
        /// Processes exported at most (the most recently active first); the rest are
        /// tracked but not exported. Default: 256.
        pub max_processes: u32 = 256,
        /// How long an ended process's series stay, so that a process that lived 50 ms is
        /// still scraped once. Default: 30.
        pub exited_retention_secs: u64 = 30,
        /// How often per-process aggregates are read from the kernel and published.
        /// Default: 1.
        pub interval_secs: u64 = 1,
        /// Driver calls slower than this are recorded as `gpu.driver.slow_call` events.
        /// Default: 1000.
        pub slow_call_ms: u64 = 1000,
    }
}

impl EbpfConfig {
    /// Adds every problem with this section to `out`.
    pub fn validate(&self, prefix: &str, out: &mut Vec<Invalid>) {
        if !self.enabled {
            return;
        }
        if !matches!(self.attach.as_str(), "auto" | "tracepoint" | "kprobe") {
            out.push(Invalid {
                key: format!("{prefix}.attach"),
                message: format!(
                    "{:?} is not an attach mode; use \"auto\", \"tracepoint\" or \"kprobe\"",
                    self.attach
                ),
            });
        }
        if self.watch_devices.len() > junction_common::MAX_WATCHED {
            out.push(Invalid {
                key: format!("{prefix}.watch_devices"),
                message: format!(
                    "{} devices given; at most {} can be watched",
                    self.watch_devices.len(),
                    junction_common::MAX_WATCHED
                ),
            });
        }
        for (i, d) in self.watch_devices.iter().enumerate() {
            if let Err(e) = loader::kernel_rdev(std::path::Path::new(d)) {
                out.push(Invalid {
                    key: format!("{prefix}.watch_devices"),
                    message: format!(
                        "entry {i} ({d:?}): {e}; give the path of a device node, e.g. \"/dev/null\""
                    ),
                });
            }
        }
        if self.max_processes == 0 {
            out.push(Invalid {
                key: format!("{prefix}.max_processes"),
                message: "must be at least 1".into(),
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

/// The eBPF source.
pub const COMPONENT: Component = Component {
    name: "ebpf",
    // Always started: when it is off, it says so (and why).
    enabled: |_| true,
    start: |c, ctx| Box::pin(start(c, ctx)),
    once: None,
    inspect: Some(|c, model| {
        Box::pin(async move {
            let _ = tokio::task::spawn_blocking(move || check(&c.sources.ebpf, &model)).await;
        })
    }),
    derive: None,
    off_but_asked: None,
};

fn params(c: &EbpfConfig) -> loader::Params {
    loader::Params {
        self_tgid: std::process::id(),
        only_tgid: 0,
        slow_ns: c.slow_call_ms.saturating_mul(1_000_000),
        floor: false,
    }
}

/// What `junction inventory` shows about the source.
fn describe(loaded: &loader::Loaded) -> Vec<String> {
    let mut lines = vec![format!(
        "on: {} mode",
        match loaded.mode {
            loader::Mode::Kprobe => "kprobe (driver entry points)",
            loader::Mode::Tracepoint => "tracepoint (syscalls)",
        }
    )];
    for a in &loaded.attached {
        lines.push(format!("attached: {a}"));
    }
    for (_, d) in &loaded.devices {
        lines.push(format!("devices: {d}"));
    }
    if let Some(why) = &loaded.kprobe_note {
        lines.push(format!("kprobe path not used: {why}"));
    }
    lines.push(match &loaded.confined {
        confine::Confined::Yes => {
            "loader: kept from the kernel's BTF by Landlock (the offsets read beforehand)".into()
        }
        confine::Confined::No(why) => format!("loader: parsed the kernel's BTF ({why})"),
    });
    lines
}

/// For `junction inventory`: loads and attaches, records what is attached, detaches.
fn check(c: &EbpfConfig, model: &Model) {
    if !c.enabled {
        model.set_source_detail("ebpf", vec!["off: sources.ebpf.enabled = false".into()]);
        return;
    }
    match loader::load(c, &params(c)) {
        Ok(mut loaded) => {
            let mut lines = describe(&loaded);
            if loaded.mode == loader::Mode::Tracepoint {
                // The kprobe programs cannot run here, but the verifier must accept them.
                lines.push(match loader::verify_kprobe_programs(&mut loaded.bpf) {
                    Ok(()) => "kprobe programs: accepted by the verifier".into(),
                    Err(e) => format!("kprobe programs: rejected: {e}"),
                });
            }
            model.set_source_detail("ebpf", lines);
        }
        Err(e) => model.set_source_detail("ebpf", vec![format!("off: {e}")]),
    }
}

/// The source off, and why.
fn off(model: &Model, why: &dyn std::fmt::Display) {
    model.set_source_up("ebpf", false);
    model.set_source_detail("ebpf", vec![format!("off: {why}")]);
}

/// Loads and attaches the programs and takes the maps the drain reads; `None` (said, and the
/// source off) where that fails.
async fn attach(c: &EbpfConfig, model: &Model) -> anyhow::Result<Option<drain::Attached>> {
    let (p, cc) = (params(c), c.clone());
    let loaded = match tokio::task::spawn_blocking(move || loader::load(&cc, &p)).await? {
        Ok(l) => l,
        Err(e) => {
            EbpfUnavailable { error: &e }.emit(model);
            off(model, &e);
            return Ok(None);
        }
    };
    for (path, error) in &loaded.skipped {
        EbpfWatchSkipped { path, error }.emit(model);
    }
    tracing::info!(
        attached = %loaded.attached.join(", "),
        "eBPF attribution on"
    );
    match drain::attached(loaded) {
        Ok(a) => Ok(Some(a)),
        Err(e) => {
            EbpfMismatch { error: &e }.emit(model);
            off(model, &e);
            Ok(None)
        }
    }
}

/// The attached programs and their maps while the drain holds them, left here by a drain that
/// panicked for the next start.
static ATTACHED: std::sync::Mutex<Option<drain::Attached>> = std::sync::Mutex::new(None);

async fn start(config: Arc<Config>, ctx: Ctx) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let c = config.sources.ebpf.clone();
    if !c.enabled {
        tracing::info!("eBPF attribution is off (sources.ebpf.enabled = false)");
        ctx.model
            .set_source_detail("ebpf", vec!["off: sources.ebpf.enabled = false".into()]);
        return Ok(tokio::spawn(async {}));
    }
    // Loaded again only where no earlier start left the programs attached: after the
    // capability drop, a start that follows a panic could not load them (CAP_BPF).
    let attached = match Kept::left(&ATTACHED) {
        Some(a) => {
            tracing::info!("eBPF attribution on again, with the programs still attached");
            a
        }
        None => match attach(&c, &ctx.model).await? {
            Some(a) => a,
            None => return Ok(tokio::spawn(async {})),
        },
    };
    ctx.model
        .set_source_detail("ebpf", describe(&attached.loaded));
    ctx.model.set_source_up("ebpf", true);
    let mut attached = Kept::new(&ATTACHED, attached, &ctx.shutdown);
    // A panic on the drain's thread panics this task: the source is reported down and started
    // again, with the programs and maps the drain held.
    let mut threads = crate::agent::SourceThreads::new(&ctx.shutdown);
    let (model, shutdown) = (ctx.model.clone(), threads.stop().clone());
    threads.spawn("ebpf", move || {
        drain::run(&mut attached, &c, &model, &shutdown)
    })?;
    Ok(tokio::spawn(async move {
        threads.watch(&ctx.shutdown).await;
    }))
}

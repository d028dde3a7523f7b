//! dcgm-exporter's names, for the dashboards, alerts and autoscalers written for it: a second
//! listener (by default on dcgm-exporter's port, 9400) whose `/metrics` serves the fields of
//! dcgm-exporter's default counter set (or of the user's own counters file, in its CSV
//! format), computed from the NVML readings Junction already takes, with dcgm-exporter's
//! labels in its order, its units and its value formats (`LABELS-AND-UNITS.md` in
//! `../shared/realworld/dcgm-consumers/dcgm-exporter/`):
//!
//! `NAME{gpu="0",UUID="GPU-…",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="…",Hostname="…",DCGM_FI_DRIVER_VERSION="…",container="…",err_code="…",err_msg="…",hpc_job="…",namespace="…",pod="…"} VALUE`
//!
//! — `gpu` the NVML index, `device` `nvidia` and it, `Hostname` from `hostname`, else
//! `$NODE_NAME`, else the host's name; the label fields (sorted) then the attributes (sorted):
//! `container`/`namespace`/`pod` only on a GPU a pod holds (the kubernetes source), `hpc_job`
//! from `hpc_job_mapping_dir` (a file per GPU index holding its job ids, one row per job),
//! `err_code`/`err_msg` only on `DCGM_FI_DEV_XID_ERRORS`. Integers for DCGM's INT64 fields,
//! six decimals for its DOUBLE ones; counters without `_total`; a field with no reading on a
//! GPU has no line.

pub mod counters;
pub mod fields;

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::get;

use crate::agent::Component;
use crate::config::{Invalid, config_section};
use crate::model::{GpuSlot, Metric, Model, Sample};
use counters::Selected;
use fields::{Kind, Source};

config_section! {
    /// `[sinks.dcgm]`: dcgm-exporter's names on a listener of their own.
    pub struct DcgmConfig {
        /// Serve dcgm-exporter's names. Default: false.
        pub enabled: bool = false,
        /// Address and port (dcgm-exporter's is 9400; its path, `/metrics`, is the same).
        pub listen: String = "0.0.0.0:9400".into(),
        /// A counters file in dcgm-exporter's CSV format (`-f`); "" serves its default set.
        pub counters: String = String::new(),
        /// The `Hostname` label; "" takes `$NODE_NAME`, else the host's name.
        pub hostname: String = String::new(),
        /// dcgm-exporter's `--hpc-job-mapping-dir`: a file per GPU index, each holding the job
        /// ids on that GPU (written by Slurm prolog/epilog): the `hpc_job` label. "": none.
        pub hpc_job_mapping_dir: String = String::new(),
        /// Answer a scraper that asks for gzip with a gzip page (as `sinks.prometheus.gzip`).
        /// Default: true.
        pub gzip: bool = true,
    }
}

impl DcgmConfig {
    /// Adds every problem with this section to `out`.
    pub fn validate(&self, prefix: &str, out: &mut Vec<Invalid>) {
        if !self.enabled {
            return;
        }
        if let Err(e) = self.fields() {
            out.push(Invalid {
                key: format!("{prefix}.counters"),
                message: e,
            });
        }
    }

    /// The fields served.
    pub fn fields(&self) -> Result<Vec<Selected>, String> {
        if self.counters.is_empty() {
            return Ok(counters::default_set());
        }
        let text = std::fs::read_to_string(&self.counters)
            .map_err(|e| format!("{}: {e}", self.counters))?;
        counters::parse_csv(&text).map_err(|e| format!("{}: {e}", self.counters))
    }
}

/// What a scrape needs besides the model.
struct Served {
    model: Arc<Model>,
    fields: Vec<Selected>,
    hostname: String,
    hpc_dir: String,
    pages: crate::sinks::page::Pages,
}

/// The sink.
pub const COMPONENT: Component = Component {
    name: "dcgm",
    enabled: |c| c.sinks.dcgm.enabled,
    start: |c, ctx| {
        Box::pin(async move {
            let cfg = &c.sinks.dcgm;
            let fields = cfg
                .fields()
                .map_err(|e| anyhow::anyhow!("sinks.dcgm.counters: {e}"))?;
            let none: Vec<&str> = fields
                .iter()
                .filter(|s| matches!(s.field.source, Source::None(_)))
                .map(|s| s.field.name)
                .collect();
            if !none.is_empty() {
                tracing::info!(fields = %none.join(","), "dcgm-exporter fields with no NVML reading are not served (METRICS.md)");
            }
            let listener = super::prometheus::bind(&cfg.listen).await.map_err(|e| {
                anyhow::anyhow!("cannot listen on {} (sinks.dcgm.listen): {e}", cfg.listen)
            })?;
            tracing::info!(listen = %cfg.listen, "serving dcgm-exporter's names on /metrics");
            let served = Arc::new(Served {
                model: ctx.model.clone(),
                fields,
                hostname: hostname(&cfg.hostname),
                hpc_dir: cfg.hpc_job_mapping_dir.clone(),
                pages: crate::sinks::page::Pages::new(cfg.gzip),
            });
            let app = Router::new()
                .route("/metrics", get(metrics))
                .with_state(served);
            let stop = ctx.shutdown.clone();
            Ok(tokio::spawn(async move {
                if let Err(e) =
                    super::prometheus::serve_app(listener, app, async move { stop.wait().await })
                        .await
                {
                    tracing::warn!(error = %e, "dcgm listener ended with an error");
                }
            }))
        })
    },
    once: None,
    inspect: None,
    derive: None,
    off_but_asked: None,
};

/// `hostname`, else `$NODE_NAME`, else the kernel's host name.
fn hostname(configured: &str) -> String {
    if !configured.is_empty() {
        return configured.to_string();
    }
    std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_default()
}

async fn metrics(State(s): State<Arc<Served>>, request: HeaderMap) -> Response {
    s.pages.answer(&request, |out| {
        render(&s.model, &s.fields, &s.hostname, &s.hpc_dir, out)
    })
}

/// A label value escaped as the text format wants.
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// NVML's spelling of a PCI address: `DDDDDDDD:BB:DD.F`, upper case.
fn nvml_bdf(bdf: &str) -> String {
    crate::model::fabric::normalize_bdf(bdf)
        .map(|b| format!("0000{}", b.to_uppercase()))
        .unwrap_or_default()
}

/// The job ids on GPU `index` from the mapping directory (at most 16, 4 KiB read).
fn hpc_jobs(dir: &str, index: u32) -> Vec<String> {
    use std::io::Read as _;
    if dir.is_empty() {
        return Vec::new();
    }
    let mut text = String::new();
    if let Ok(f) = std::fs::File::open(std::path::Path::new(dir).join(index.to_string())) {
        let _ = f.take(4096).read_to_string(&mut text);
    }
    text.split_whitespace()
        .filter(|j| j.len() <= 64 && j.bytes().all(|b| b.is_ascii_graphic() && b != b'"'))
        .take(16)
        .map(str::to_string)
        .collect()
}

/// A GPU's samples by metric, gathered once per render: each field looks up its metric's few
/// samples rather than scanning all of the GPU's.
struct Samples<'a>(Vec<Vec<&'a Sample>>);

impl<'a> Samples<'a> {
    fn of(slot: &'a GpuSlot) -> Self {
        let mut by = vec![Vec::new(); crate::model::REGISTRY.len()];
        for s in slot.groups.iter().flat_map(|g| g.iter()) {
            by[s.metric as usize].push(s);
        }
        Self(by)
    }

    fn get(&self, m: Metric) -> impl Iterator<Item = &'a Sample> + '_ {
        self.0[m as usize].iter().copied()
    }
}

/// One row of the page (a GPU, or a GPU instance of a MIG-enabled GPU): its samples, its
/// GPU instance, the fixed head of its lines and one tail per job.
struct Row<'a> {
    slot: &'a GpuSlot,
    samples: &'a Samples<'a>,
    gi: Option<String>,
    head: String,
    tails: Vec<String>,
}

/// A GPU-level sample: the metric with these attributes, not a MIG instance's.
fn gpu_value(slot: &Samples<'_>, m: Metric, attrs: &[(&str, &str)]) -> Option<f64> {
    slot.get(m)
        .find(|s| {
            s.metric == m
                && s.attr("gpu.mig.gpu_instance_id").is_none()
                && attrs.iter().all(|(k, v)| s.attr(k) == Some(v))
        })
        .map(|s| s.value)
        .filter(|v| v.is_finite())
}

/// One GPU instance of a MIG-enabled GPU: its id, its profile, its MIG devices' UUIDs (one
/// per compute instance; dcgm-exporter's rows are per GPU instance).
struct Instance {
    id: String,
    profile: String,
    uuids: Vec<String>,
}

/// The GPU instances whose profile is known, in id order.
fn instances(slot: &Samples<'_>) -> Vec<Instance> {
    let mut out: Vec<Instance> = Vec::new();
    for s in slot.get(Metric::MigMemoryLimit) {
        let (Some(id), Some(profile), Some(uuid)) = (
            s.attr("gpu.mig.gpu_instance_id"),
            s.attr("gpu.mig.profile"),
            s.attr("hw.id"),
        ) else {
            continue;
        };
        match out.iter_mut().find(|i| i.id == id) {
            Some(i) => i.uuids.push(uuid.to_string()),
            None => out.push(Instance {
                id: id.to_string(),
                profile: profile.to_string(),
                uuids: vec![uuid.to_string()],
            }),
        }
    }
    out.sort_by_key(|i| i.id.parse::<u64>().unwrap_or(u64::MAX));
    out
}

/// A field's value on a GPU instance's row: the instance's own memory and GPM readings, the
/// GPU's for what the GPU as a whole reports (temperature, power, clocks).
fn instance_value(slot: &Samples<'_>, m: Metric, attrs: &[(&str, &str)], gi: &str) -> Option<f64> {
    let own = |metric: Metric, attrs: &[(&str, &str)]| {
        slot.get(metric)
            .find(|s| {
                s.metric == metric
                    && s.attr("gpu.mig.gpu_instance_id") == Some(gi)
                    && attrs.iter().all(|(k, v)| s.attr(k) == Some(v))
            })
            .map(|s| s.value)
            .filter(|v| v.is_finite())
    };
    match m {
        Metric::MemoryUsage => own(Metric::MigMemoryUsage, &[]),
        Metric::MemoryLimit => own(Metric::MigMemoryLimit, &[]),
        Metric::MemoryFree => {
            Some((own(Metric::MigMemoryLimit, &[])? - own(Metric::MigMemoryUsage, &[])?).max(0.0))
        }
        // The GPU's reservation and copy-engine utilisation are not an instance's.
        Metric::MemoryReserved | Metric::MemoryActivity => None,
        Metric::GpmSmActivity
        | Metric::GpmSmOccupancy
        | Metric::GpmGraphicsActivity
        | Metric::GpmPipeActivity
        | Metric::GpmDramActivity
        | Metric::GpmPcieThroughput
        | Metric::GpmNvlinkThroughput => own(m, attrs),
        _ => gpu_value(slot, m, attrs),
    }
}

/// The pods holding each GPU (by UUID): (container, namespace, pod).
fn pods(model: &Model) -> Vec<(String, [String; 3])> {
    let mut out = Vec::new();
    for set in model.sets() {
        for s in set.iter().filter(|s| s.metric == Metric::PodGpuAllocation) {
            let a = |k: &str| s.attr(k).unwrap_or("").to_string();
            out.push((
                a("hw.id"),
                [
                    a("k8s.container.name"),
                    a("k8s.namespace.name"),
                    a("k8s.pod.name"),
                ],
            ));
        }
    }
    out
}

/// The whole page, written to `out`.
pub fn render(model: &Model, fields: &[Selected], hostname: &str, hpc_dir: &str, out: &mut String) {
    let slots = model.snapshot();
    let driver = model.driver().map(|d| d.driver_version).unwrap_or_default();
    let pods = pods(model);
    let labels: Vec<&Selected> = fields.iter().filter(|s| s.kind == Kind::Label).collect();
    // The fixed part of each row's lines (a GPU's, or each GPU instance's on a MIG-enabled
    // GPU), and its attributes but XID's.
    let indexed: Vec<Samples<'_>> = slots.iter().map(Samples::of).collect();
    let mut heads: Vec<Row<'_>> = Vec::new();
    for (slot, samples) in slots.iter().zip(&indexed) {
        let i = &slot.info;
        let insts = instances(samples);
        let rows: Vec<Option<&Instance>> = if insts.is_empty() {
            vec![None]
        } else {
            insts.iter().map(Some).collect()
        };
        for inst in rows {
            let mut h = format!(
                "gpu=\"{}\",UUID=\"{}\",pci_bus_id=\"{}\",device=\"nvidia{}\",modelName=\"{}\"",
                i.index,
                esc(&i.uuid),
                nvml_bdf(&i.pci_bus_id),
                i.index,
                esc(&i.name)
            );
            if let Some(g) = inst {
                let _ = write!(
                    h,
                    ",GPU_I_PROFILE=\"{}\",GPU_I_ID=\"{}\"",
                    esc(&g.profile),
                    esc(&g.id)
                );
            }
            if !hostname.is_empty() {
                let _ = write!(h, ",Hostname=\"{}\"", esc(hostname));
            }
            for l in &labels {
                if matches!(l.field.source, Source::Driver) && !driver.is_empty() {
                    let _ = write!(h, ",{}=\"{}\"", l.field.name, esc(&driver));
                }
            }
            let jobs = hpc_jobs(hpc_dir, i.index);
            // A pod holding one of the instance's MIG devices, else the GPU.
            let pod = inst
                .and_then(|g| {
                    pods.iter()
                        .find(|(id, _)| g.uuids.contains(id))
                        .map(|(_, p)| p)
                })
                .or_else(|| pods.iter().find(|(id, _)| *id == i.uuid).map(|(_, p)| p));
            // One row per job (dcgm-exporter duplicates a GPU's rows per job), or one.
            let per_job = if jobs.is_empty() {
                vec![None]
            } else {
                jobs.iter().map(Some).collect()
            };
            let tails = per_job
                .into_iter()
                .map(|job| {
                    let mut t = Vec::new();
                    if let Some(p) = pod {
                        t.push(("container", p[0].clone()));
                    }
                    if let Some(j) = job {
                        t.push(("hpc_job", j.clone()));
                    }
                    if let Some(p) = pod {
                        t.push(("namespace", p[1].clone()));
                        t.push(("pod", p[2].clone()));
                    }
                    t.iter()
                        .map(|(k, v)| format!(",{k}=\"{}\"", esc(v)))
                        .collect::<String>()
                })
                .collect();
            heads.push(Row {
                slot,
                samples,
                gi: inst.map(|g| g.id.clone()),
                head: h,
                tails,
            });
        }
    }
    out.reserve(256 * fields.len() * slots.len().max(1));
    for sel in fields.iter().filter(|s| s.kind != Kind::Label) {
        let mut lines = String::new();
        for Row {
            slot,
            samples,
            gi,
            head,
            tails,
        } in &heads
        {
            let (value, xid) = match sel.field.source {
                Source::Nvml(m, attrs, k) => {
                    let v = match gi {
                        Some(gi) => instance_value(samples, m, attrs, gi),
                        None => gpu_value(samples, m, attrs),
                    };
                    (v.map(|v| v * k), None)
                }
                Source::Sum(m, k) => {
                    let mut any = false;
                    let sum: f64 = samples
                        .get(m)
                        .inspect(|_| any = true)
                        .map(|s| s.value)
                        .sum();
                    (any.then_some(sum * k), None)
                }
                Source::LastXid => {
                    let code = model.last_xid(&slot.info.uuid).unwrap_or(0);
                    (Some(f64::from(code)), Some(code))
                }
                Source::Driver | Source::None(_) => (None, None),
            };
            let Some(v) = value else { continue };
            let v = if sel.field.int {
                format!("{}", v.round() as i64)
            } else {
                format!("{v:.6}")
            };
            for tail in tails {
                let _ = write!(lines, "{}{{{head}", sel.field.name);
                // err_code / err_msg sort between container and hpc_job.
                let (before, after) =
                    match tail.find(",hpc_job=").or_else(|| tail.find(",namespace=")) {
                        Some(i) => tail.split_at(i),
                        None => (tail.as_str(), ""),
                    };
                lines.push_str(before);
                if let Some(code) = xid {
                    // dcgm-exporter's xidErrCodeToText, or its `unknownErr`.
                    let msg = if crate::model::xid_catalog::is_catalogued(code) {
                        crate::model::xid_catalog::lookup(code)
                            .description
                            .to_string()
                    } else {
                        "unknownErr".to_string()
                    };
                    let _ = write!(lines, ",err_code=\"{code}\",err_msg=\"{}\"", esc(&msg));
                }
                let _ = writeln!(lines, "{after}}} {v}");
            }
        }
        if !lines.is_empty() {
            let _ = writeln!(out, "# HELP {} {}", sel.field.name, sel.help);
            let _ = writeln!(out, "# TYPE {} {}", sel.field.name, sel.kind.as_str());
            out.push_str(&lines);
        }
    }
}

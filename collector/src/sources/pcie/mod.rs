//! The pcie source: the PCIe path of every GPU, NVSwitch and NIC — AER counters and link
//! speed and width of each function and of the ports above it — and the NVIDIA GPUs on the
//! bus that NVML does not list. A fatal AER on a GPU's path fails the GPU; non-fatal AER
//! errors, or a link trained below its maximum (width at once, speed after
//! `link_grace_secs`, since idle GPUs lower their link speed), degrade it. A GPU on the bus
//! but not in NVML (fallen off before Junction started, or the driver did not attach) is a
//! component of its own, `hw.id` `PCI-dddd:bb:dd`, failed with `not_in_nvml`.

pub mod read;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent::{Component, Ctx};
use crate::config::{Config, Invalid, config_section};
use crate::model::events::{NewEvent, Severity};
use crate::model::fabric::normalize_bdf;
use crate::model::health::{Action, Code, Finding};
use crate::model::{HealthState, Metric, Model, Sample};
use crate::sources::nic::counters::{Counter, Width};
use read::{Function, Role, SEVERITIES};

config_section! {
    /// `[sources.pcie]`
    pub struct PcieConfig {
        /// Read the PCI bus in `<sysfs_root>/bus/pci/devices`. Default: true.
        pub enabled: bool = true,
        /// Seconds between reads.
        pub interval_secs: u64 = 30,
        /// A GPU link slower than its maximum for this long degrades the GPU (its width
        /// below the maximum does at once).
        pub link_grace_secs: u64 = 300,
        /// NVIDIA GPUs the node must have on its bus; 0: not checked.
        pub expected_gpus: u32 = 0,
    }
}

impl PcieConfig {
    /// Adds every problem with this section to `out`.
    pub fn validate(&self, prefix: &str, out: &mut Vec<Invalid>) {
        if self.interval_secs == 0 {
            out.push(Invalid {
                key: format!("{prefix}.interval_secs"),
                message: "must be at least 1".into(),
            });
        }
    }
}

/// The pcie source.
pub const COMPONENT: Component = Component {
    name: "pcie",
    enabled: |c| c.sources.pcie.enabled,
    start: |c, ctx| Box::pin(async move { Ok(tokio::spawn(run(c, ctx))) }),
    once: Some(|c, model| {
        Box::pin(async move {
            if c.sources.nvml.enabled {
                model.wait_inventory(Duration::from_secs(5));
            }
            let mut s = State::default();
            s.poll(&c, &model, Instant::now());
            if s.functions == 0 {
                return Err(crate::agent::NothingHere(
                    "no NVIDIA GPU, NVSwitch or RDMA NIC on the PCI bus".into(),
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
    let interval = Duration::from_secs(config.sources.pcie.interval_secs.max(1));
    // GPUs on the bus are compared with NVML's list: the first read waits until NVML has made
    // it (at most NVML's own start-up deadline), and a shutdown meanwhile is not held up.
    if config.sources.nvml.enabled {
        let limit = Duration::from_secs(config.sources.nvml.init_timeout_secs.max(1));
        let (model, shutdown) = (ctx.model.clone(), ctx.shutdown.clone());
        let waited =
            tokio::task::spawn_blocking(move || model.wait_inventory_unless(limit, &shutdown))
                .await;
        if matches!(waited, Ok(None)) {
            return;
        }
    }
    let model = ctx.model.clone();
    crate::sources::sysfs::run_blocking("pcie", interval, ctx, move |s: &mut State| {
        s.poll(&config, &model, Instant::now());
    })
    .await;
}

/// At most this many counters are kept (functions that came and went included).
const MAX_COUNTERS: usize = 16384;

/// What the source remembers between reads.
#[derive(Default)]
pub struct State {
    counters: BTreeMap<(String, usize, Option<String>), Counter>,
    slow_since: BTreeMap<String, Instant>,
    absent: BTreeSet<String>,
    missing_said: bool,
    /// Functions of the last read (GPUs, NVSwitches, NICs and the ports above them).
    functions: usize,
}

impl State {
    fn count(&mut self, key: (String, usize, Option<String>), raw: u64) -> (u64, u64) {
        let full = self.counters.len() >= MAX_COUNTERS;
        match self.counters.get_mut(&key) {
            Some(c) => {
                let d = c.update(raw, Width::Wide);
                (c.total(), d)
            }
            None => {
                if !full {
                    self.counters.insert(key, Counter::new(raw));
                }
                (raw, 0)
            }
        }
    }

    /// One read: AER and links on every GPU's path, the GPUs NVML lacks, the node's count.
    pub fn poll(&mut self, config: &Config, model: &Model, now: Instant) {
        let cfg = &config.sources.pcie;
        let functions = read::functions(&config.sysfs_root);
        self.functions = functions.len();
        let nvml: BTreeMap<String, String> = model
            .snapshot()
            .into_iter()
            .filter_map(|s| Some((normalize_bdf(&s.info.pci_bus_id)?, s.info.uuid.clone())))
            .collect();
        let id = |f: &Function| match (f.role, nvml.get(&f.bdf)) {
            (_, Some(uuid)) => uuid.clone(),
            (Role::Gpu, None) => gpu_id(&f.bdf),
            _ => format!("PCI-{}", f.bdf),
        };
        let mut out = Vec::new();
        // Per function: what its counters did in this read (fatal total, non-fatal delta).
        let mut events: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for f in &functions {
            self.samples(f, id(f), &mut out, &mut events);
        }
        let paths = functions
            .iter()
            .filter(|f| f.role == Role::Gpu)
            .map(|f| {
                let up = f
                    .path
                    .as_ref()
                    .map(|p| p.upstream().to_vec())
                    .unwrap_or_default();
                (f.bdf.clone(), up)
            })
            .collect();
        model.fabric.set_paths(paths);
        let findings = self.findings(&functions, &events, cfg, now);
        model.fabric.set_findings("pcie", findings);
        self.not_in_nvml(model, &functions, &nvml, &mut out);
        let on_bus = functions.iter().filter(|f| f.role == Role::Gpu).count();
        let missing = cfg.expected_gpus > 0 && on_bus < cfg.expected_gpus as usize;
        if missing {
            out.push(
                Sample::new(Metric::NodeReason, 1.0).with("node.health.reason", "gpus_missing"),
            );
        }
        if missing != self.missing_said {
            self.missing_said = missing;
            let body = if missing {
                format!(
                    "{on_bus} NVIDIA GPU(s) on the PCI bus, expected {}",
                    cfg.expected_gpus
                )
            } else {
                format!(
                    "all {} expected NVIDIA GPUs are on the PCI bus",
                    cfg.expected_gpus
                )
            };
            let sev = if missing {
                Severity::Error
            } else {
                Severity::Info
            };
            model.events.append(
                NewEvent::now(sev, "node.gpus.count", body)
                    .with("node.health.reason", "gpus_missing"),
            );
        }
        let mut lines: Vec<String> = functions
            .iter()
            .filter(|f| f.role != Role::Port)
            .map(|f| describe(f, &id(f), &functions))
            .collect();
        lines.push(format!(
            "{on_bus} NVIDIA GPU(s) on the bus, {} in NVML{}",
            nvml.len(),
            if cfg.expected_gpus > 0 {
                format!(", {} expected", cfg.expected_gpus)
            } else {
                String::new()
            }
        ));
        model.set_source_detail("pcie", lines);
        model.publish("pcie", "bus", out);
    }

    /// A function's AER and link series; what its AER counters did goes into `events`
    /// (fatal total, non-fatal delta).
    fn samples(
        &mut self,
        f: &Function,
        hw_id: String,
        out: &mut Vec<Sample>,
        events: &mut BTreeMap<String, (u64, u64)>,
    ) {
        let base = |m: Metric, v: f64| {
            Sample::new(m, v)
                .with("hw.id", hw_id.clone())
                .with("hw.type", f.role.hw_type())
                .with("pcie.bdf", f.bdf.clone())
        };
        for (i, a) in f.aer.iter().enumerate() {
            let sev = SEVERITIES[i].0;
            if let Some(t) = a.total {
                let (total, delta) = self.count((f.bdf.clone(), i, None), t);
                out.push(base(Metric::AerErrors, total as f64).with("pcie.aer.severity", sev));
                let e = events.entry(f.bdf.clone()).or_default();
                match sev {
                    "fatal" => e.0 = total,
                    "nonfatal" => e.1 = delta,
                    _ => {}
                }
            }
            for (bit, n) in &a.bits {
                let (total, _) = self.count((f.bdf.clone(), i, Some(bit.clone())), *n);
                out.push(
                    base(Metric::AerErrorTypes, total as f64)
                        .with("pcie.aer.severity", sev)
                        .with("error.type", bit.clone()),
                );
            }
            if let Some(rp) = a.rootport {
                let (total, _) = self.count((f.bdf.clone(), i + 3, None), rp);
                out.push(
                    base(Metric::AerRootPortErrors, total as f64).with("pcie.aer.severity", sev),
                );
            }
        }
        let l = &f.link;
        for (state, speed, width) in [
            ("current", l.speed, l.width),
            ("max", l.max_speed, l.max_width),
        ] {
            if let Some(s) = speed {
                out.push(base(Metric::PcieLinkSpeed, s * 1e9).with("pcie.link.state", state));
            }
            if let Some(w) = width {
                out.push(base(Metric::PcieLinkWidth, f64::from(w)).with("pcie.link.state", state));
            }
        }
    }

    /// What each GPU's path says, keyed by the GPU's address.
    fn findings(
        &mut self,
        functions: &[Function],
        events: &BTreeMap<String, (u64, u64)>,
        cfg: &PcieConfig,
        now: Instant,
    ) -> BTreeMap<String, Vec<Finding>> {
        let mut out: BTreeMap<String, Vec<Finding>> = BTreeMap::new();
        for g in functions.iter().filter(|f| f.role == Role::Gpu) {
            let chain: Vec<&str> = g
                .path
                .as_ref()
                .map(|p| p.upstream().iter().map(String::as_str).collect())
                .unwrap_or_default();
            let v = out.entry(g.bdf.clone()).or_default();
            for bdf in chain.iter().copied().chain([g.bdf.as_str()]) {
                let Some(&(fatal, nonfatal)) = events.get(bdf) else {
                    continue;
                };
                let whose = if bdf == g.bdf {
                    "the GPU".to_string()
                } else {
                    format!("the port {bdf} above it")
                };
                if fatal > 0 {
                    v.push(Finding {
                        code: Code::PcieAerFatal,
                        state: HealthState::Failed,
                        action: Action::DrainAndService,
                        detail: format!("{fatal} fatal AER error(s) logged by {whose}"),
                    });
                }
                if nonfatal > 0 {
                    v.push(Finding {
                        code: Code::PcieAerNonfatal,
                        state: HealthState::Degraded,
                        action: Action::None,
                        detail: format!("{nonfatal} new non-fatal AER error(s) logged by {whose}"),
                    });
                }
            }
            let l = g.link;
            if let (Some(w), Some(max)) = (l.width, l.max_width)
                && w < max
            {
                v.push(link_finding(format!("x{w} of x{max}")));
            }
            match (l.speed, l.max_speed) {
                (Some(s), Some(max)) if s < max => {
                    let since = *self.slow_since.entry(g.bdf.clone()).or_insert(now);
                    if now.saturating_duration_since(since)
                        >= Duration::from_secs(cfg.link_grace_secs)
                    {
                        v.push(link_finding(format!(
                            "{s} GT/s of {max} GT/s for {} s",
                            now.saturating_duration_since(since).as_secs()
                        )));
                    }
                }
                _ => {
                    self.slow_since.remove(&g.bdf);
                }
            }
            if v.is_empty() {
                out.remove(&g.bdf);
            }
        }
        self.slow_since
            .retain(|b, _| functions.iter().any(|f| &f.bdf == b));
        out
    }

    /// GPUs on the bus that NVML does not list: raised (and cleared once NVML lists them or
    /// they leave the bus), with their `hw.status`.
    fn not_in_nvml(
        &mut self,
        model: &Model,
        functions: &[Function],
        nvml: &BTreeMap<String, String>,
        out: &mut Vec<Sample>,
    ) {
        let absent: BTreeSet<String> = functions
            .iter()
            .filter(|f| f.role == Role::Gpu && !nvml.contains_key(&f.bdf))
            .map(|f| gpu_id(&f.bdf))
            .collect();
        for id in &absent {
            model.raise(
                id,
                Code::NotInNvml,
                HealthState::Failed,
                Action::RebootNode,
                format!(
                    "an NVIDIA GPU at {} is on the PCI bus but NVML does not list it (the driver did not attach, or it fell off the bus)",
                    &id[4..]
                ),
            );
        }
        for gone in self.absent.difference(&absent) {
            model.clear(gone, Code::NotInNvml);
        }
        for id in &absent {
            let reasons = model.health.reasons(id);
            let state = crate::model::health::verdict(&reasons);
            for s in HealthState::ALL {
                out.push(
                    Sample::new(Metric::Status, f64::from(u8::from(s == state)))
                        .with("hw.id", id.clone())
                        .with("hw.type", "gpu")
                        .with("hw.state", s.as_str()),
                );
            }
            for r in &reasons {
                out.push(
                    Sample::new(Metric::HealthReason, 1.0)
                        .with("hw.id", id.clone())
                        .with("hw.type", "gpu")
                        .with("gpu.health.reason", r.code.as_str()),
                );
            }
        }
        self.absent = absent;
    }
}

/// The `hw.id` of a GPU NVML does not know: `PCI-dddd:bb:dd`, as the kernel log's XID lines
/// name it (so that their counters and reasons meet).
fn gpu_id(bdf: &str) -> String {
    format!("PCI-{}", bdf.get(..10).unwrap_or(bdf))
}

fn link_finding(detail: String) -> Finding {
    Finding {
        code: Code::PcieLinkDegraded,
        state: HealthState::Degraded,
        action: Action::None,
        detail: format!("the GPU's PCIe link trained below its maximum: {detail}"),
    }
}

/// One line of `junction inventory` for a function and its path.
fn describe(f: &Function, id: &str, all: &[Function]) -> String {
    let l = f.link;
    let link = match (l.speed, l.width, l.max_speed, l.max_width) {
        (Some(s), Some(w), Some(ms), Some(mw)) => format!("{s} GT/s x{w} (max {ms} GT/s x{mw})"),
        _ => "link -".into(),
    };
    let aer: Vec<String> = f
        .aer
        .iter()
        .zip(SEVERITIES)
        .filter_map(|(a, (s, _, _))| a.total.map(|t| format!("{s} {t}")))
        .collect();
    let path: Vec<String> = f
        .path
        .as_ref()
        .map(|p| {
            p.upstream()
                .iter()
                .map(|b| {
                    let errs: u64 = all
                        .iter()
                        .find(|x| &x.bdf == b)
                        .map(|x| x.aer.iter().filter_map(|a| a.total).sum())
                        .unwrap_or(0);
                    if errs > 0 {
                        format!("{b} (AER {errs})")
                    } else {
                        b.clone()
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    format!(
        "{} {} {id}: {link}, AER {}, path {}",
        f.role.hw_type(),
        f.bdf,
        if aer.is_empty() {
            "-".into()
        } else {
            aer.join(" / ")
        },
        if path.is_empty() {
            "-".into()
        } else {
            path.join(" → ")
        }
    )
}

#[cfg(test)]
mod tests;

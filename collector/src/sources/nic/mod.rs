//! The nic source: the node's RDMA ports (InfiniBand, RoCE, EFA — all under
//! `/sys/class/infiniband`), their state, rate and counters; a health verdict per port
//! (`rules.rs`); and which NICs are each GPU's rail, from the PCIe tree. A port that is not
//! ok degrades the GPUs of its rail (`rail_degraded`, through the health evaluator).
//!
//! sysfs is written by the kernel, but what drivers name there still bounds what is kept:
//! at most 64 devices, 8 ports each, 128 counters per directory, names of sysfs's own
//! characters. A node with no RDMA device reports nothing and says so in `junction inventory`.

pub(crate) mod counters;
mod publish;
mod rails;
pub mod read;
pub mod rules;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent::{Component, Ctx};
use crate::config::{Config, Invalid, StringMap, config_section};
use crate::model::events::{NewEvent, Severity};
use crate::model::fabric::{Rail, normalize_bdf};
use crate::model::health::{Action, Code, Finding};
use crate::model::{HealthState, Model};
use counters::{Counter, Width};
use read::{Device, LinkLayer, Port};
use rules::{COUNTER_RULES, History, NicCode};

config_section! {
    /// `[sources.nic]`
    pub struct NicConfig {
        /// Read the RDMA devices in `<sysfs_root>/class/infiniband`. Default: true.
        pub enabled: bool = true,
        /// Seconds between reads.
        pub interval_secs: u64 = 10,
        /// RDMA devices to leave out (e.g. the NVSwitch management functions of an HGX
        /// board, which appear as `mlx5_*` and refuse counter reads).
        pub exclude_devices: Vec<String> = Vec::new(),
        /// InfiniBand ports that must be ACTIVE / LinkUp (at `expected_rate_gbps`, when set);
        /// 0: only ports once seen up are expected up. As GPUd, RoCE and EFA ports are not
        /// counted. GPUd's default for 8-GPU H100 / B200 nodes is 8 ports at 400 Gb/s.
        pub expected_ports: u32 = 0,
        /// The rate (Gb/s) an up InfiniBand port must run at; 0: any.
        pub expected_rate_gbps: f64 = 0.0,
        /// Down→up transitions within `flap_window_secs` that make a port flapping (GPUd:
        /// three flaps in twelve hours).
        pub flap_transitions: u32 = 3,
        /// See `flap_transitions`.
        pub flap_window_secs: u64 = 43200,
        /// A port's reason clears once its condition has been absent this long (GPUd keeps
        /// a dropped port's reason ten minutes after it is back).
        pub clear_after_secs: u64 = 600,
        /// A GPU's rail where the PCIe tree says nothing: GPU PCI address
        /// (`0000:18:00.0`) → RDMA devices, comma-separated (`"mlx5_0,mlx5_1"`).
        pub rails: StringMap = StringMap::default(),
    }
}

impl NicConfig {
    /// Adds every problem with this section to `out`.
    pub fn validate(&self, prefix: &str, out: &mut Vec<Invalid>) {
        if self.interval_secs == 0 || self.flap_window_secs == 0 {
            out.push(Invalid {
                key: format!("{prefix}.interval_secs"),
                message: "interval_secs and flap_window_secs must be at least 1".into(),
            });
        }
        if !(self.expected_rate_gbps >= 0.0 && self.expected_rate_gbps.is_finite()) {
            out.push(Invalid {
                key: format!("{prefix}.expected_rate_gbps"),
                message: "a rate in Gb/s, 0 or more (e.g. 400)".into(),
            });
        }
        for k in self.rails.0.keys() {
            if normalize_bdf(k).is_none() {
                out.push(Invalid {
                    key: format!("{prefix}.rails"),
                    message: format!(
                        "{k:?} is no PCI address; write it as sysfs does, e.g. \"0000:18:00.0\""
                    ),
                });
            }
        }
    }
}

/// The nic source.
pub const COMPONENT: Component = Component {
    name: "nic",
    enabled: |c| c.sources.nic.enabled,
    start: |c, ctx| Box::pin(async move { Ok(tokio::spawn(run(c, ctx))) }),
    once: Some(|c, model| {
        Box::pin(async move {
            let mut s = State::default();
            s.poll(&c, &model, Instant::now());
            if s.ports.is_empty() {
                return Err(crate::agent::NothingHere("no RDMA devices".into()).into());
            }
            Ok(())
        })
    }),
    inspect: None,
    derive: None,
    off_but_asked: None,
};

async fn run(config: Arc<Config>, ctx: Ctx) {
    let interval = Duration::from_secs(config.sources.nic.interval_secs.max(1));
    let model = ctx.model.clone();
    crate::sources::sysfs::run_blocking("nic", interval, ctx, move |s: &mut State| {
        s.poll(&config, &model, Instant::now());
    })
    .await;
}

/// At most this many ports are tracked (those of devices that came and went included).
const MAX_TRACKED: usize = 512;

/// What the source remembers between reads.
#[derive(Default)]
pub struct State {
    ports: BTreeMap<String, Track>,
    /// Every device seen (without its ports): a device that is gone stays its GPUs' rail,
    /// so that its absence degrades them rather than moving the rail to a neighbour.
    known: BTreeMap<String, Device>,
}

/// One port over time.
#[derive(Default)]
struct Track {
    device: String,
    num: u32,
    present: bool,
    seen_up: bool,
    up: Option<bool>,
    ups: VecDeque<Instant>,
    counters: BTreeMap<(bool, String), (Counter, Width)>,
    history: BTreeMap<&'static str, History>,
    last_true: BTreeMap<NicCode, (HealthState, String, Instant)>,
    state: Option<HealthState>,
    port: Option<Port>,
    info: Info,
}

/// A port's device, as last seen.
#[derive(Default, Clone)]
struct Info {
    pci: String,
    numa: String,
    firmware: String,
    model: String,
    driver: String,
}

impl State {
    /// One read: ports, counters, verdicts, rails, and what they mean for the GPUs.
    pub fn poll(&mut self, config: &Config, model: &Model, now: Instant) {
        let cfg = &config.sources.nic;
        let root = config.sysfs_root.as_path();
        let devices = read::devices(root, &cfg.exclude_devices);
        for t in self.ports.values_mut() {
            t.present = false;
        }
        for d in &devices {
            if self.known.contains_key(&d.name) || self.known.len() < 2 * read::MAX_DEVICES {
                let lite = Device {
                    ports: Vec::new(),
                    ..d.clone()
                };
                self.known.insert(d.name.clone(), lite);
            }
        }
        for d in &devices {
            for p in &d.ports {
                let key = format!("{}/{}", d.name, p.num);
                if !self.ports.contains_key(&key) && self.ports.len() >= MAX_TRACKED {
                    continue;
                }
                let t = self.ports.entry(key).or_insert_with(|| Track {
                    device: d.name.clone(),
                    num: p.num,
                    ..Track::default()
                });
                t.info = Info {
                    pci: d
                        .pci
                        .as_ref()
                        .map(|p| p.bdf().to_string())
                        .unwrap_or_default(),
                    numa: d.numa.map(|n| n.to_string()).unwrap_or_default(),
                    firmware: d.firmware.clone().unwrap_or_default(),
                    model: d.model.clone().unwrap_or_default(),
                    driver: d.driver.clone().unwrap_or_default(),
                };
                t.observe(p, now, cfg.flap_window_secs);
            }
        }
        let expected = cfg.expected_ports > 0;
        for (key, t) in &mut self.ports {
            let findings = t.findings(cfg, expected);
            t.settle(
                model,
                key,
                findings,
                now,
                Duration::from_secs(cfg.clear_after_secs),
            );
        }
        let known: Vec<Device> = self.known.values().cloned().collect();
        let rails = rails::rails(root, &known, model, cfg);
        model.fabric.set_findings("nic", self.gpu_findings(&rails));
        publish::publish(model, self, &rails, cfg);
        model.fabric.set_rails(rails);
    }

    /// `rail_degraded` for every GPU whose rail has a port that is not ok.
    fn gpu_findings(&self, rails: &BTreeMap<String, Vec<Rail>>) -> BTreeMap<String, Vec<Finding>> {
        let mut out: BTreeMap<String, Vec<Finding>> = BTreeMap::new();
        for (gpu, rail) in rails {
            for t in self.ports.values() {
                let Some(state) = t.state.filter(|s| *s != HealthState::Ok) else {
                    continue;
                };
                if !rail.iter().any(|r| r.device == t.device) {
                    continue;
                }
                let why: Vec<&str> = t.last_true.keys().map(|c| c.as_str()).collect();
                out.entry(gpu.clone()).or_default().push(Finding {
                    code: Code::RailDegraded,
                    state: HealthState::Degraded,
                    action: Action::None,
                    detail: format!(
                        "{} port {} of this GPU's rail is {}: {}",
                        t.device,
                        t.num,
                        state.as_str(),
                        why.join(", ")
                    ),
                });
            }
        }
        out
    }
}

impl Track {
    fn observe(&mut self, p: &Port, now: Instant, flap_window: u64) {
        self.present = true;
        for (driver, list) in [(false, &p.counters), (true, &p.hw_counters)] {
            for (name, raw) in list {
                let width = if driver {
                    counters::driver_width(name, *raw)
                } else {
                    counters::standard_width(name)
                };
                let key = (driver, name.clone());
                let total = match self.counters.get_mut(&key) {
                    Some((c, w)) => {
                        *w = width;
                        c.update(*raw, width);
                        c.total()
                    }
                    None => {
                        self.counters.insert(key, (Counter::new(*raw), width));
                        *raw
                    }
                };
                let saturated = self.counters[&(driver, name.clone())].0.saturated(width);
                if let Some(r) = COUNTER_RULES.iter().find(|r| r.counter == name) {
                    let h = self.history.entry(r.counter).or_default();
                    if saturated {
                        *h = History::default();
                    } else {
                        h.push(now, total);
                    }
                }
            }
        }
        let up = p.up();
        if self.up == Some(false) && up {
            self.ups.push_back(now);
        }
        let window = Duration::from_secs(flap_window);
        while self
            .ups
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > window)
            || self.ups.len() > 1024
        {
            self.ups.pop_front();
        }
        self.seen_up |= up;
        self.up = Some(up);
        self.port = Some(p.clone());
    }

    fn findings(&self, cfg: &NicConfig, expected: bool) -> Vec<(NicCode, HealthState, String)> {
        let mut out = Vec::new();
        let Some(p) = &self.port else {
            return out;
        };
        if !self.present {
            out.push((
                NicCode::PortAbsent,
                HealthState::Failed,
                "the port is gone from sysfs (device removed or driver unloaded)".into(),
            ));
            return out;
        }
        if !p.up() && (self.seen_up || (expected && p.link_layer == LinkLayer::InfiniBand)) {
            let name = |s: &Option<(u8, String)>| s.as_ref().map_or("-".into(), |s| s.1.clone());
            out.push((
                NicCode::PortDown,
                HealthState::Failed,
                format!("state {}, phys_state {}", name(&p.state), name(&p.phys)),
            ));
        }
        if p.up()
            && cfg.expected_rate_gbps > 0.0
            && p.link_layer == LinkLayer::InfiniBand
            && let Some(r) = p.rate_gbps.filter(|r| *r < cfg.expected_rate_gbps)
        {
            out.push((
                NicCode::RateBelowExpected,
                HealthState::Degraded,
                format!("{r} Gb/s, expected {} Gb/s", cfg.expected_rate_gbps),
            ));
        }
        if cfg.flap_transitions > 0 && self.ups.len() >= cfg.flap_transitions as usize {
            out.push((
                NicCode::PortFlapping,
                HealthState::Degraded,
                format!(
                    "{} down/up transitions within {} s",
                    self.ups.len(),
                    cfg.flap_window_secs
                ),
            ));
        }
        for r in COUNTER_RULES {
            if let Some(why) = self
                .history
                .get(r.counter)
                .and_then(|h| h.exceeds(r.threshold))
            {
                let code = if matches!(r.threshold, rules::Threshold::AnyIncrease) {
                    NicCode::FatalCounter
                } else {
                    NicCode::ErrorRate
                };
                out.push((code, r.state, format!("{}: {why}", r.counter)));
            }
        }
        out
    }

    /// Raises what holds now, keeps what held within `hold`, and says when the verdict moves.
    fn settle(
        &mut self,
        model: &Model,
        key: &str,
        findings: Vec<(NicCode, HealthState, String)>,
        now: Instant,
        hold: Duration,
    ) {
        for (code, state, detail) in findings {
            let e = self
                .last_true
                .entry(code)
                .or_insert((state, String::new(), now));
            // The worse of two findings of one code (symbol errors: per second and per hour).
            if e.2 != now || state.rank() >= e.0.rank() {
                *e = (state, detail, now);
            }
        }
        self.last_true
            .retain(|_, (_, _, t)| now.saturating_duration_since(*t) < hold || *t == now);
        let state = self
            .last_true
            .values()
            .map(|(s, _, _)| *s)
            .max_by_key(|s| s.rank())
            .unwrap_or(HealthState::Ok);
        let before = self.state.replace(state);
        if before.is_some_and(|b| b != state) || (before.is_none() && state != HealthState::Ok) {
            let why: Vec<String> = self
                .last_true
                .iter()
                .map(|(c, (_, d, _))| format!("{c} ({d})"))
                .collect();
            let before = before.unwrap_or(HealthState::Ok);
            let body = if why.is_empty() {
                format!(
                    "NIC port {key} is {} (was {})",
                    state.as_str(),
                    before.as_str()
                )
            } else {
                format!(
                    "NIC port {key} is {} (was {}): {}",
                    state.as_str(),
                    before.as_str(),
                    why.join("; ")
                )
            };
            let severity = match state {
                HealthState::Failed => Severity::Error,
                HealthState::Ok => Severity::Info,
                _ => Severity::Warn,
            };
            let (name, previous) = crate::model::events::status_change_names();
            model.events.append(
                NewEvent::now(severity, name, body)
                    .about(key.to_string())
                    .with("hw.type", "network")
                    .with("hw.state", state.as_str())
                    .with(previous, before.as_str()),
            );
        }
    }
}

#[cfg(test)]
mod tests;

//! One input of the kernel-log source (the device, or the followed files): what it counts,
//! and how a record or a line becomes XIDs, events and health reasons in the model.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::parser::{self, Detail, Parsed, Parser};
use super::record;
use crate::model::xid::{Report, Via};
use crate::model::xid_catalog::recovery_action;
use crate::model::{AttrValue, Metric, Model, Sample};

/// What one input (the device, or the files) counts and how it hands lines on.
pub struct Input {
    via: Via,
    accept_user_records: bool,
    read: AtomicU64,
    lost: AtomicU64,
    warned_ignored: std::sync::atomic::AtomicBool,
    last_tick: Mutex<Option<Instant>>,
    stats: Arc<Stats>,
}

/// Both inputs' counters, published together.
#[derive(Default)]
pub struct Stats {
    kmsg: AtomicU64,
    file: AtomicU64,
    lost: AtomicU64,
    ignored_kmsg: AtomicU64,
    ignored_file: AtomicU64,
}

impl Input {
    pub(super) fn new(via: Via, accept_user_records: bool, stats: Arc<Stats>) -> Self {
        Self {
            via,
            accept_user_records,
            read: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            warned_ignored: std::sync::atomic::AtomicBool::new(false),
            last_tick: Mutex::new(None),
            stats,
        }
    }

    pub(super) fn read(&self, n: u64) {
        self.read.fetch_add(n, Ordering::Relaxed);
        match self.via {
            Via::File => self.stats.file.fetch_add(n, Ordering::Relaxed),
            _ => self.stats.kmsg.fetch_add(n, Ordering::Relaxed),
        };
    }

    pub(super) fn lost(&self, n: u64) {
        self.lost.fetch_add(n, Ordering::Relaxed);
        self.stats.lost.fetch_add(n, Ordering::Relaxed);
    }

    /// A record the kernel did not write (or too long to read), not parsed; said once.
    pub(super) fn ignored(&self, why: &str) {
        match self.via {
            Via::File => self.stats.ignored_file.fetch_add(1, Ordering::Relaxed),
            _ => self.stats.ignored_kmsg.fetch_add(1, Ordering::Relaxed),
        };
        if !self.warned_ignored.swap(true, Ordering::Relaxed) {
            tracing::info!(
                input = self.via.as_str(),
                "kernel-log {why}: not read for XIDs (counted in junction_kmsg_ignored_total; set sources.kmsg.accept_user_records = true only where nobody but root can write to the log)"
            );
        }
    }

    /// Five times a second at most: publish the counters (the checkpoint is saved at most
    /// once a second).
    pub(super) fn tick(&self, model: &Model) {
        {
            let mut t = crate::model::lock(&self.last_tick);
            if t.is_some_and(|t| t.elapsed() < Duration::from_millis(200)) {
                return;
            }
            *t = Some(Instant::now());
        }
        let s = &self.stats;
        model.publish(
            "kmsg",
            "stats",
            vec![
                Sample::new(Metric::KmsgRecords, s.kmsg.load(Ordering::Relaxed) as f64)
                    .with("junction.input", "kmsg"),
                Sample::new(Metric::KmsgRecords, s.file.load(Ordering::Relaxed) as f64)
                    .with("junction.input", "file"),
                Sample::new(Metric::KmsgLost, s.lost.load(Ordering::Relaxed) as f64),
                Sample::new(
                    Metric::KmsgIgnored,
                    s.ignored_kmsg.load(Ordering::Relaxed) as f64,
                )
                .with("junction.input", "kmsg"),
                Sample::new(
                    Metric::KmsgIgnored,
                    s.ignored_file.load(Ordering::Relaxed) as f64,
                )
                .with("junction.input", "file"),
            ],
        );
        model.flush_xids(false);
    }

    /// Parses one line of a followed file: only the kernel's lines (by their syslog tag),
    /// unless `accept_user_records`.
    pub(super) fn file_line(
        &self,
        parser: &mut Parser,
        line: &str,
        time: SystemTime,
        model: &Model,
    ) {
        let l = parser::file_line(line);
        if l.origin != parser::Origin::Kernel && !self.accept_user_records {
            self.ignored("file lines without the kernel's syslog tag (kernel:)");
            return;
        }
        self.line(parser, l.message, time, model);
    }

    /// One `/dev/kmsg` record: parsed if the kernel wrote it (or `accept_user_records`).
    pub(super) fn record(
        &self,
        parser: &mut Parser,
        rec: &record::Record<'_>,
        time: SystemTime,
        model: &Model,
    ) {
        if rec.facility != 0 && !self.accept_user_records {
            self.ignored("records of a facility other than the kernel's");
        } else {
            self.line(parser, &rec.message, time, model);
        }
    }

    /// Parses one kernel message and records what it says.
    fn line(&self, parser: &mut Parser, line: &str, time: SystemTime, model: &Model) {
        match parser.line(line) {
            Parsed::Other | Parsed::SXidCompanion => {}
            Parsed::Signature(m) => {
                model.record_signature(crate::model::xid::signatures::SignatureReport {
                    sig: m.sig,
                    via: Some(self.via),
                    pci: m.pci.map(str::to_string),
                    reporter: m.reporter.map(str::to_string),
                    dev: m.dev.map(str::to_string),
                    pid: m.pid,
                    comm: m.comm.map(str::to_string),
                    rm: m.rm,
                    message: line.trim().to_string(),
                    time: Some(time),
                    boot: None,
                });
            }
            Parsed::GpuUuid(pci, uuid) => {
                model.learn_gpu_uuid(&pci.to_string(), uuid);
            }
            Parsed::BusLine(pci) => {
                model.record_xid(Report {
                    via: self.via,
                    bus_line: true,
                    pci: Some(pci.to_string()),
                    uuid: None,
                    code: 79,
                    time,
                    pid: None,
                    process: None,
                    gpu_instance: None,
                    compute_instance: None,
                    message: line.trim().to_string(),
                    attrs: Vec::new(),
                    fatal: None,
                    recovery_action: None,
                });
            }
            Parsed::SXid(s) => {
                model.record_sxid(
                    self.via,
                    &s.switch,
                    s.code,
                    s.fatal,
                    s.link,
                    line.trim().to_string(),
                );
            }
            Parsed::Xid(x) => {
                let mut attrs: Vec<(&'static str, AttrValue)> = Vec::new();
                let mut fatal = None;
                let mut action = None;
                match &x.detail {
                    Detail::None => {}
                    Detail::CausedBy(c) => attrs.push(("gpu.xid.caused_by", c.to_string().into())),
                    Detail::RecoveryAction { from, to } => {
                        action = Some(*to);
                        attrs.push(("gpu.recovery_action", recovery_action(*to).into()));
                        attrs.push((
                            "gpu.recovery_action.previous",
                            recovery_action(*from).into(),
                        ));
                    }
                    Detail::MemoryError { reset, drain_reset } => {
                        attrs.push(("gpu.xid.reset_required", yes(*reset)));
                        attrs.push(("gpu.xid.drain_and_reset_required", yes(*drain_reset)));
                    }
                    Detail::NvLink5 {
                        unit,
                        fatal: f,
                        link,
                    } => {
                        fatal = Some(*f);
                        attrs.push(("gpu.xid.unit", unit.clone().into()));
                        attrs.push(("gpu.nvlink.link", link.to_string().into()));
                    }
                    Detail::Dbe { phys_addr } => {
                        if let Some(a) = phys_addr {
                            attrs.push(("gpu.memory.address", a.clone().into()));
                        }
                    }
                    Detail::Retirement { row_remap } => attrs.push((
                        "gpu.xid.memory",
                        if *row_remap {
                            "row_remap"
                        } else {
                            "page_retirement"
                        }
                        .into(),
                    )),
                }
                model.record_xid(Report {
                    via: self.via,
                    bus_line: false,
                    pci: Some(x.pci.to_string()),
                    uuid: None,
                    code: x.code,
                    time,
                    pid: x.pid,
                    process: x.process.map(str::to_string),
                    gpu_instance: x.gpu_instance,
                    compute_instance: x.compute_instance,
                    message: line.trim().to_string(),
                    attrs,
                    fatal,
                    recovery_action: action,
                });
            }
        }
    }
}

fn yes(b: bool) -> AttrValue {
    if b { "true" } else { "false" }.into()
}

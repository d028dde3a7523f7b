//! What a soak records of its agent: a reading every 10 s, the heap as jemalloc counts it, a
//! run's figures and the counts the smoke run checks; the agent's process and its `/proc`
//! status fields.

use std::path::Path;

use anyhow::{Result, bail};

use super::Churn;
use crate::bench::smaps;

/// One reading of the agent.
#[derive(Clone, Copy)]
pub struct Reading {
    /// Seconds since the agent answered.
    pub secs: f64,
    pub rss_kib: u64,
    pub anon_kib: u64,
    pub threads: u64,
    pub fds: u64,
    pub series: usize,
    /// `junction_ebpf_processes`: processes the eBPF source tracks.
    pub tracked: f64,
    /// `junction_memory_heap_*_bytes`: the agent's own heap as jemalloc counts it (published
    /// every 30 s).
    pub heap: Heap,
    /// `junction_history_memory_bytes`: the event history's share of the live heap.
    pub history: f64,
}

/// The agent's heap as jemalloc counts it, bytes (`junction_memory_heap_*_bytes`).
#[derive(Clone, Copy)]
pub struct Heap {
    /// In live allocations.
    pub allocated: f64,
    /// The pages holding them, their slabs' free slots included.
    pub active: f64,
    /// jemalloc's own bookkeeping.
    pub metadata: f64,
    /// Resident pages under all of it.
    pub resident: f64,
}

impl Heap {
    pub(super) fn read(series: &[testkit::prom::Series]) -> Heap {
        let v = |part: &str| {
            testkit::prom::value(series, &format!("junction_memory_heap_{part}_bytes"), &[])
                .unwrap_or(f64::NAN)
        };
        Heap {
            allocated: v("allocated"),
            active: v("active"),
            metadata: v("metadata"),
            resident: v("resident"),
        }
    }
}

/// One run's figures.
pub struct Run {
    pub label: &'static str,
    pub minutes: f64,
    pub warmup_secs: f64,
    pub readings: Vec<Reading>,
    /// RSS (`VmRSS`, KiB) every second: (seconds since the agent answered, KiB).
    pub rss_every_second: Vec<(f64, u64)>,
    /// Processes started.
    pub started: u64,
    /// Xid lines written.
    pub xids: u64,
    /// OTLP metric requests received and their bytes.
    pub otlp: (u64, u64),
    /// Peak RSS (VmHWM), KiB.
    pub peak_kib: u64,
    /// Resident memory by kind of mapping (`smaps`) at the first reading after the warm-up
    /// and at the end.
    pub smaps: Option<(smaps::Breakdown, smaps::Breakdown)>,
}

impl Run {
    /// What the smoke run checks (counts, not times): after the warm-up, descriptors and
    /// threads stay within what the agent's pools explain — a descriptor or a thread per
    /// process that lived would add one per process started — and the eBPF source tracks no
    /// more processes than are alive and within their retention.
    pub fn check(&self, churn: &Churn) -> Result<()> {
        let after: Vec<&Reading> = self
            .readings
            .iter()
            .filter(|x| x.secs >= self.warmup_secs)
            .collect();
        if after.len() < 2 {
            bail!("{}: fewer than two readings after the warm-up", self.label);
        }
        let span = |f: &dyn Fn(&Reading) -> u64| {
            let v: Vec<u64> = after.iter().map(|x| f(x)).collect();
            v.iter().max().unwrap_or(&0) - v.iter().min().unwrap_or(&0)
        };
        if span(&|x| x.fds) > 16 {
            bail!(
                "{}: descriptors grew by {} after the warm-up",
                self.label,
                span(&|x| x.fds)
            );
        }
        if span(&|x| x.threads) > 32 {
            bail!(
                "{}: threads grew by {} after the warm-up",
                self.label,
                span(&|x| x.threads)
            );
        }
        // Alive, plus ended ones kept for the default exited_retention_secs (30 s), plus slack.
        let bound = churn.per_second as f64 * (churn.lifetime.as_secs_f64() + 30.0) * 1.5 + 10.0;
        let most = after.iter().map(|x| x.tracked).fold(0.0, f64::max);
        if most > bound {
            bail!(
                "{}: {most} processes tracked, more than {bound:.0}",
                self.label
            );
        }
        Ok(())
    }
}

pub(super) fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The process running `junction --config <config> run` (under a wrapper).
pub(super) fn agent_pid(config: &Path) -> Option<u32> {
    let want = config.display().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_string_lossy().parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<String> = cmd
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        (args.first().is_some_and(|a| a.ends_with("/junction")) && args.contains(&want))
            .then_some(pid)
    })
}

//! The soak's figures: the slopes it fits and the section of BENCHMARKS.md it writes.

use super::{Heap, Reading, Run, history_max_bytes, kmsg_off};
use crate::bench::smaps;

impl Run {
    /// Least-squares slope of `f` over the readings after the warm-up, per hour.
    pub fn slope_per_hour(&self, f: impl Fn(&Reading) -> f64) -> f64 {
        self.fit_per_hour(f).0
    }

    /// [`fit`] of `f` over the readings after the warm-up, per hour: the slope and its
    /// standard error.
    pub fn fit_per_hour(&self, f: impl Fn(&Reading) -> f64) -> (f64, f64) {
        let pts: Vec<(f64, f64)> = self
            .readings
            .iter()
            .filter(|r| r.secs >= self.warmup_secs)
            .map(|r| (r.secs / 3600.0, f(r)))
            .collect();
        fit(&pts)
    }

    /// Least-squares slope, per hour, of the least RSS of each whole minute after the
    /// warm-up: the memory the agent keeps, without the pages of work in flight at a reading.
    /// With its standard error, as [`fit`].
    pub fn floor_fit_per_hour(&self) -> (f64, f64) {
        fit(&minute_floors(&self.rss_every_second, self.warmup_secs))
    }
}

/// The least RSS (MiB) of each whole minute from `from` seconds on, at the minute's middle
/// (hours): a reading in a minute that is cut short (the run's last) is left out, so a
/// minute's floor is always over the same number of readings.
pub fn minute_floors(samples: &[(f64, u64)], from: f64) -> Vec<(f64, f64)> {
    let mut floors: std::collections::BTreeMap<u64, (u64, usize)> = Default::default();
    for &(secs, kib) in samples.iter().filter(|s| s.0 >= from) {
        let e = floors
            .entry(((secs - from) / 60.0) as u64)
            .or_insert((u64::MAX, 0));
        *e = (e.0.min(kib), e.1 + 1);
    }
    let most = floors.values().map(|v| v.1).max().unwrap_or(0);
    floors
        .into_iter()
        .filter(|(_, (_, n))| *n * 10 >= most * 9)
        .map(|(m, (kib, _))| {
            (
                (from + m as f64 * 60.0 + 30.0) / 3600.0,
                kib as f64 / 1024.0,
            )
        })
        .collect()
}

/// Bytes in a MiB.
const MIB: f64 = 1024.0 * 1024.0;

/// Least-squares slope of y over x and its standard error, sqrt(residual variance / Sxx):
/// 0 and NaN for fewer than two points, the error NaN for two. It takes the points as
/// independent; neighbouring readings of a process's memory are not, so it is a lower bound
/// on how far the slope could be from the process's own.
pub fn fit(pts: &[(f64, f64)]) -> (f64, f64) {
    let n = pts.len() as f64;
    if pts.len() < 2 {
        return (0.0, f64::NAN);
    }
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx == 0.0 {
        return (0.0, f64::NAN);
    }
    let b = sxy / sxx;
    if pts.len() < 3 {
        return (b, f64::NAN);
    }
    let rss: f64 = pts
        .iter()
        .map(|p| (p.1 - my - b * (p.0 - mx)).powi(2))
        .sum();
    (b, (rss / (n - 2.0) / sxx).sqrt())
}

/// What a soak run with the environment's options changed, in words ("" when none).
fn options() -> String {
    let mut out = Vec::new();
    if kmsg_off() {
        out.push("`JUNCTION_SOAK_KMSG=off`: both runs write their Xid lines to files of their own and neither agent reads `/dev/kmsg`".to_string());
    }
    if let Some(b) = history_max_bytes() {
        out.push(format!("`JUNCTION_SOAK_HISTORY_MAX_BYTES={b}`: the agents' event history bound (`health.history_max_bytes`) is {b} bytes instead of 4 MiB, and the warm-up writes an Xid a second (not every 10 s) to fill it"));
    }
    if out.is_empty() {
        String::new()
    } else {
        format!(" Options of this run: {}.", out.join("; "))
    }
}

/// The BENCHMARKS.md section.
pub fn report(runs: &[Run], command: &str) -> String {
    let mut out = format!(
        "\n## Soak\n\n\
         Produced by `{command}` (release build). The simulated 8-GPU node with every source and\n\
         both sinks on: eBPF watching a device, on which new processes issue the NVIDIA\n\
         driver's ioctls (a client, a device, a UVM registration of GPU 0, 2 GiB allocated, then\n\
         256 MiB allocated and freed and 20 control calls a second), each in a container cgroup\n\
         of its own; an Xid 13 every 10 s (the first run writes them to `/dev/kmsg`, which both\n\
         agents read; the second to a kernel-log file of its own); DMTF's cooling-unit mockup (Redfish)\n\
         and `ipmi_sim` polled every 5 s; OTLP/HTTP every second; `/metrics` scraped every 2 s.\n\
         The two runs go side by side, each agent watching its own device (`/dev/zero`,\n\
         `/dev/full`) and seeing only its own processes, each node on a PCI domain of its own;\n\
         a run fails if NVML, eBPF, the kernel log, Redfish or IPMI is down after the warm-up.\n\
         RSS (`VmRSS`), anonymous RSS, threads and descriptors from `/proc/PID`, series and the\n\
         agent's own heap from the scrape (`junction_memory_heap_allocated_bytes`: bytes in live\n\
         allocations; `…_resident_bytes`: the pages under them after unused ones are handed\n\
         back; jemalloc's counts, published every 30 s) and the event history's share of the live\n\
         heap (`junction_history_memory_bytes`, which grows by design until its bound, 4 MiB of\n\
         file: at an Xid every 10 s, about 40 hours; it is taken from RSS in the column that\n\
         says so), every 10 s; slopes are least-squares fits after the warm-up, the RSS slopes with\n\
         their standard error (the readings taken as independent, which neighbouring ones are\n\
         not: a lower bound on the fit's uncertainty). RSS is also read every\n\
         second, before that second's Xid line and scrape: the floor slope is the fit of each whole\n\
         minute's least RSS, the memory the agent keeps without the pages of work in flight at a\n\
         reading (a scrape's 1.2 MB of text, an export, an event). The live heap tells a structure\n\
         that grows from pages the allocator and the kernel keep: RSS moves by half a MiB from one\n\
         reading to the next.{}\n\n\
         | run | minutes | warm-up (min) | processes started | Xid lines | OTLP exports (KiB each) | RSS after warm-up (MiB) | RSS at end (MiB) | RSS slope ± s.e. (MiB/h) | RSS floor slope ± s.e. (MiB/h) | RSS less the event history, slope (MiB/h) | anon RSS slope (MiB/h) | live heap after warm-up → end (MiB) | live heap slope (MiB/h) | live heap less the event history, slope (MiB/h) | heap resident slope (MiB/h) | peak RSS (MiB) | threads (min–max) | descriptors (min–max) | series (min–max) | tracked processes (max) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        options()
    );
    for r in runs {
        let after: Vec<&Reading> = r
            .readings
            .iter()
            .filter(|x| x.secs >= r.warmup_secs)
            .collect();
        let range = |f: &dyn Fn(&Reading) -> u64| {
            let v: Vec<u64> = after.iter().map(|x| f(x)).collect();
            format!(
                "{}–{}",
                v.iter().min().unwrap_or(&0),
                v.iter().max().unwrap_or(&0)
            )
        };
        let mib = |k: u64| k as f64 / 1024.0;
        let pm = |(b, se): (f64, f64)| format!("{b:+.2} ± {se:.2}");
        out.push_str(&format!(
            "| {} | {:.0} | {:.0} | {} | {} | {} ({:.1}) | {:.1} | {:.1} | {} | {} | {:+.2} | {:+.2} | {:.2} → {:.2} | {:+.3} | {:+.3} | {:+.2} | {:.1} | {} | {} | {} | {:.0} |\n",
            r.label,
            r.minutes,
            r.warmup_secs / 60.0,
            r.started,
            r.xids,
            r.otlp.0,
            r.otlp.1 as f64 / 1024.0 / r.otlp.0.max(1) as f64,
            after.first().map_or(0.0, |x| mib(x.rss_kib)),
            after.last().map_or(0.0, |x| mib(x.rss_kib)),
            pm(r.fit_per_hour(|x| mib(x.rss_kib))),
            pm(r.floor_fit_per_hour()),
            r.slope_per_hour(|x| mib(x.rss_kib) - x.history / MIB),
            r.slope_per_hour(|x| mib(x.anon_kib)),
            after.first().map_or(f64::NAN, |x| x.heap.allocated / MIB),
            after.last().map_or(f64::NAN, |x| x.heap.allocated / MIB),
            r.slope_per_hour(|x| x.heap.allocated / MIB),
            r.slope_per_hour(|x| (x.heap.allocated - x.history) / MIB),
            r.slope_per_hour(|x| x.heap.resident / MIB),
            mib(r.peak_kib),
            range(&|x| x.threads),
            range(&|x| x.fds),
            range(&|x| x.series as u64),
            after.iter().map(|x| x.tracked).fold(0.0, f64::max),
        ));
    }
    let kinds: Vec<(&str, smaps::Breakdown, smaps::Breakdown)> = runs
        .iter()
        .filter_map(|r| r.smaps.map(|(a, b)| (r.label, a, b)))
        .collect();
    if !kinds.is_empty() {
        out.push_str(
            "\nWhere the resident memory lies, after the warm-up and at the end (`/proc/PID/smaps` summed by \
             kind of mapping; `xtask/src/bench/smaps.rs` says how each kind is told):\n\n",
        );
        out.push_str(&smaps::table(&kinds));
    }
    out.push_str(&heap_table(runs));
    let longest = runs.iter().map(|r| r.minutes).fold(0.0, f64::max) as u64;
    let step = if longest >= 20 { 5 } else { 1 };
    out.push_str(&format!(
        "\nRSS over time (MiB, at the reading every 10 s nearest the minute; least–most of the \
         readings every second in that minute; the live heap in brackets), every {step} minute{} of each run:\n\n| minute |",
        if step == 1 { "" } else { "s" }
    ));
    for r in runs {
        out.push_str(&format!(" {} |", r.label));
    }
    out.push_str("\n|---|");
    for _ in runs {
        out.push_str("---|");
    }
    out.push('\n');
    for m in (0..=longest).step_by(step as usize) {
        out.push_str(&format!("| {m} |"));
        for r in runs {
            let at = r
                .readings
                .iter()
                .min_by(|a, b| {
                    (a.secs - m as f64 * 60.0)
                        .abs()
                        .total_cmp(&(b.secs - m as f64 * 60.0).abs())
                })
                .filter(|x| (x.secs - m as f64 * 60.0).abs() < 30.0);
            match at {
                Some(x) => {
                    let minute: Vec<u64> = r
                        .rss_every_second
                        .iter()
                        .filter(|s| s.0 >= m as f64 * 60.0 && s.0 < (m + 1) as f64 * 60.0)
                        .map(|s| s.1)
                        .collect();
                    let span = match (minute.iter().min(), minute.iter().max()) {
                        (Some(lo), Some(hi)) => {
                            format!("; {:.1}–{:.1}", *lo as f64 / 1024.0, *hi as f64 / 1024.0)
                        }
                        _ => String::new(),
                    };
                    out.push_str(&format!(
                        " {:.1}{span} ({:.2}) |",
                        x.rss_kib as f64 / 1024.0,
                        x.heap.allocated / MIB
                    ))
                }
                None => out.push_str(" - |"),
            }
        }
        out.push('\n');
    }
    out
}

/// jemalloc's resident pages by what holds them, after the warm-up and at the end, with the
/// slope of each after the warm-up: live blocks, the free slots of their slabs (active less
/// allocated: fragmentation), jemalloc's bookkeeping, and the rest (unused pages not yet
/// handed back).
fn heap_table(runs: &[Run]) -> String {
    type Part = (&'static str, fn(&Heap) -> f64);
    const PARTS: [Part; 5] = [
        ("live allocations (`allocated`)", |h| h.allocated),
        (
            "free slots of their slabs (`active` less `allocated`)",
            |h| h.active - h.allocated,
        ),
        ("bookkeeping (`metadata`)", |h| h.metadata),
        ("the rest (`resident` less `active` and `metadata`)", |h| {
            h.resident - h.active - h.metadata
        }),
        ("resident (`resident`)", |h| h.resident),
    ];
    let mut out = String::from(
        "\njemalloc's resident pages by what holds them (`junction_memory_heap_*_bytes`, after the \
         warm-up and at the end; the slope is the fit of every reading after the warm-up):\n\n\
         | run | part | after warm-up (KiB) | at end (KiB) | slope (KiB/h) |\n|---|---|---|---|---|\n",
    );
    for r in runs {
        let after: Vec<&Reading> = r
            .readings
            .iter()
            .filter(|x| x.secs >= r.warmup_secs && !x.heap.metadata.is_nan())
            .collect();
        let (Some(first), Some(last)) = (after.first(), after.last()) else {
            continue;
        };
        for (name, part) in PARTS {
            out.push_str(&format!(
                "| {} | {name} | {:.0} | {:.0} | {:+.0} |\n",
                r.label,
                part(&first.heap) / 1024.0,
                part(&last.heap) / 1024.0,
                // Rounded first, so that a slope of nothing reads +0, not -0.
                r.slope_per_hour(|x| part(&x.heap) / 1024.0).round() + 0.0,
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_is_a_least_squares_fit() {
        let pts: Vec<(f64, f64)> = (0..10)
            .map(|i| (f64::from(i), 3.0 + 0.5 * f64::from(i)))
            .collect();
        assert!((fit(&pts).0 - 0.5).abs() < 1e-12);
        assert_eq!(fit(&pts[..1]).0, 0.0);
        let flat: Vec<(f64, f64)> = (0..10)
            .map(|i| (f64::from(i), if i % 2 == 0 { 1.0 } else { 2.0 }))
            .collect();
        assert!(fit(&flat).0.abs() < 0.05);
    }

    #[test]
    fn the_fit_gives_the_slope_its_standard_error() {
        // Worked by hand: Sxx 5, Sxy 6, slope 1.2; residuals -0.2, 0.6, -0.6, 0.2 (sum of
        // squares 0.8); standard error sqrt(0.8 / 2 / 5).
        let (b, se) = fit(&[(0.0, 0.0), (1.0, 2.0), (2.0, 2.0), (3.0, 4.0)]);
        assert!((b - 1.2).abs() < 1e-12);
        assert!((se - 0.08f64.sqrt()).abs() < 1e-12);
        // On a line the error is none; with two points it is not known.
        assert_eq!(fit(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]), (2.0, 0.0));
        assert!(fit(&[(0.0, 1.0), (1.0, 3.0)]).1.is_nan());
    }

    #[test]
    fn the_heap_table_splits_the_resident_pages_by_what_holds_them() {
        // Two hours of readings after a one-minute warm-up: 4 MiB live, 1 MiB more in the
        // slabs' free slots each hour, 2 MiB of bookkeeping and 64 KiB not handed back.
        let reading = |secs: f64| {
            let h = secs / 3600.0;
            let heap = Heap {
                allocated: 4.0 * MIB,
                active: (5.0 + h) * MIB,
                metadata: 2.0 * MIB,
                resident: (7.0 + h) * MIB + 65536.0,
            };
            Reading {
                secs,
                rss_kib: 0,
                anon_kib: 0,
                threads: 0,
                fds: 0,
                series: 0,
                tracked: 0.0,
                heap,
                history: 0.0,
            }
        };
        let run = Run {
            label: "r",
            minutes: 121.0,
            warmup_secs: 60.0,
            readings: [0.0, 60.0, 3660.0, 7260.0].map(reading).to_vec(),
            rss_every_second: Vec::new(),
            started: 0,
            xids: 0,
            otlp: (0, 0),
            peak_kib: 0,
            smaps: None,
        };
        let table = heap_table(&[run]);
        for row in [
            "| r | live allocations (`allocated`) | 4096 | 4096 | +0 |",
            "| r | free slots of their slabs (`active` less `allocated`) | 1041 | 3089 | +1024 |",
            "| r | bookkeeping (`metadata`) | 2048 | 2048 | +0 |",
            "| r | the rest (`resident` less `active` and `metadata`) | 64 | 64 | +0 |",
            "| r | resident (`resident`) | 7249 | 9297 | +1024 |",
        ] {
            assert!(table.contains(row), "{row} not in\n{table}");
        }
    }

    #[test]
    fn a_minute_floor_is_its_least_reading_and_a_short_minute_is_left_out() {
        // From second 300 on: 10 MiB with a spike every 10 s (work in flight at a reading),
        // 1 MiB more each minute, and a last minute of only five readings.
        let samples: Vec<(f64, u64)> = (0u64..=(300 + 3 * 60 + 4))
            .map(|s| {
                let minute = s.saturating_sub(300) / 60;
                let kib = 10 * 1024 + minute * 1024 + if s % 10 == 0 { 4096 } else { 0 };
                (s as f64, kib)
            })
            .collect();
        let floors = minute_floors(&samples, 300.0);
        assert_eq!(
            floors,
            vec![
                (330.0 / 3600.0, 10.0),
                (390.0 / 3600.0, 11.0),
                (450.0 / 3600.0, 12.0),
            ]
        );
        // 1 MiB a minute is 60 MiB an hour.
        assert!((fit(&floors).0 - 60.0).abs() < 1e-9);
    }
}

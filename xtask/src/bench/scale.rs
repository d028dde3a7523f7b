//! How Junction's cost grows with the node: GPUs (8, 16, 32, 64) and NVML processes (0, 100,
//! 500 on 8 GPUs), NVML and the sinks only, every group at 1 s, scraped every second. Each
//! row's node is written from the 8x H100 training scenario, made uniform (no GPU with an
//! override of its own), so that a row differs from the next only in what is counted.
//!
//! The check ([`check`]) compares the rows of one run with each other, never with a time:
//! the CPU each GPU adds between 32 and 64 GPUs may be at most [`GROWTH`] times what each
//! added between 8 and 32 (a cost that grows with the square of the GPUs gives 2.4x), and
//! likewise each process between 100 and 500 against each between 0 and 100.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};

use super::{Measurement, measure, spawn_junction};
use crate::{root, sim_config};

/// How much more a GPU or a process may add at the large end than at the small one.
pub const GROWTH: f64 = 2.0;

/// The noise of one row's CPU, in ms per cycle, over a 3 s window (the smoke run's); a
/// longer window's is smaller in proportion. The check gives both ends of a comparison this
/// much benefit of the doubt: the small end's cost per unit is read as high as its rows'
/// difference plus this, the large end's as low as their difference less this, each spread
/// over the units between the rows. In eleven CI runs' smoke rows, the 8-GPU node with 16
/// processes and with none differed by up to 0.6 ms a cycle, and the 0-process row ranged
/// 5.8 to 7.9 between runs. 100 processes added 0.98 to 2.85 ms a cycle over six recent
/// runs; with the small end floored at this noise but the large end taken as
/// measured, one of them (0.98 ms, then 9.55 ms for the next 400) failed a linear cost.
const ROW_NOISE_MS_3S: f64 = 1.0;

/// One row: GPUs, processes on the node, and what was measured.
pub struct Row {
    pub gpus: u32,
    pub processes: u32,
    pub m: Measurement,
}

/// The scenario of a uniform node with `gpus` GPUs and `processes` NVML processes (spread
/// over the GPUs; `None` keeps the training node's two a GPU).
fn scenario(dir: &Path, gpus: u32, processes: Option<u32>) -> Result<String> {
    let base = root().join("tests/scenarios/h100-training.toml");
    let mut text = format!(
        "base = {:?}\ngpu_count = {gpus}\n",
        base.display().to_string()
    );
    match processes {
        None => text.push_str("gpus = []\n"),
        Some(n) => {
            text.push_str("gpus = [\n");
            for g in 0..gpus {
                // GPU g gets its share, the first n % gpus GPUs one more.
                let share = n / gpus + u32::from(g < n % gpus);
                let procs: Vec<String> = (0..share)
                    .map(|k| {
                        format!(
                            "{{ pid = {}, name = \"python3\", kind = \"compute\", used_mib = 1024, sm_util = 10, mem_util = 5 }}",
                            600_000 + g * 1000 + k
                        )
                    })
                    .collect();
                text.push_str(&format!("  {{ processes = [{}] }},\n", procs.join(", ")));
            }
            text.push_str("]\n");
        }
    }
    let name = match processes {
        None => format!("scale-{gpus}-gpus.toml"),
        Some(n) => format!("scale-{gpus}-gpus-{n}-processes.toml"),
    };
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path.display().to_string())
}

/// How many times a run measures each row (see [`run`]): three in the smoke run's short rows,
/// once in the full run's 30 s ones.
pub fn passes(smoke: bool) -> u32 {
    // Five, not three: over twelve clean-clone CI runs (2026-12-06 and 07) with three, one
    // measured the 0-process row above the 100-process one (7.87 against 7.52 ms a cycle) and
    // failed the check on a linear cost.
    if smoke { 5 } else { 1 }
}

/// Measures every row for `window`, `passes` times (every row, then every row again), and
/// keeps each row's lowest CPU per cycle. Other work on the machine only ever adds to a
/// row's CPU: with 3 s rows one smoke run measured the 0-process row at 7.54 ms a cycle and
/// the next at 9.78, so that the 100 processes' difference (about 0.8 ms) was at times
/// three times itself and the check compared noise. The lowest of a few passes is the
/// row's cost with the least of that in it.
pub fn run(bin: &Path, lib: &Path, dir: &Path, window: Duration, passes: u32) -> Result<Vec<Row>> {
    let mut best: Vec<Row> = Vec::new();
    for pass in 0..passes.max(1) {
        let rows = run_once(bin, lib, dir, window, pass)?;
        if best.is_empty() {
            best = rows;
            continue;
        }
        for (b, r) in best.iter_mut().zip(rows) {
            if r.m.cpu_ms_per_cycle() < b.m.cpu_ms_per_cycle() {
                *b = r;
            }
        }
    }
    Ok(best)
}

/// Every row once (`pass` picks the rows' ports, so that no pass waits on the last one's).
fn run_once(bin: &Path, lib: &Path, dir: &Path, window: Duration, pass: u32) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    let shapes: [(u32, Option<u32>); 7] = [
        (8, None),
        (16, None),
        (32, None),
        (64, None),
        (8, Some(0)),
        (8, Some(100)),
        (8, Some(500)),
    ];
    for (n, (gpus, processes)) in shapes.into_iter().enumerate() {
        let port = 19520 + 10 * pass as u16 + n as u16;
        let scenario = scenario(dir, gpus, processes)?;
        let config = dir.join(format!("scale-{port}.toml"));
        let mut text = super::fresh_state(dir, port)?;
        text.push_str(&sim_config(lib, &format!("127.0.0.1:{port}"), 1));
        text.push_str(super::NVML_ONLY);
        std::fs::write(&config, text)?;
        let label = format!("{gpus} GPUs, {} processes", processes.unwrap_or(2 * gpus));
        let child = spawn_junction(bin, &scenario, &config)?;
        let mut m = measure(&label, child, port, window, true)?;
        m.gpus = gpus;
        rows.push(Row {
            gpus,
            processes: processes.unwrap_or(2 * gpus),
            m,
        });
    }
    Ok(rows)
}

/// CPU a unit adds between two rows, in ms per cycle, as measured.
fn marginal(a: &Row, b: &Row, units: impl Fn(&Row) -> u32) -> f64 {
    bound(a, b, units, 0.0)
}

/// CPU a unit adds between two rows, in ms per cycle, with `sign` times the rows' noise
/// ([`ROW_NOISE_MS_3S`] for their window) added to their difference: +1 reads it as high
/// as the noise allows, -1 as low.
fn bound(a: &Row, b: &Row, units: impl Fn(&Row) -> u32, sign: f64) -> f64 {
    let d = f64::from(units(b).saturating_sub(units(a)).max(1));
    let secs =
        a.m.window
            .as_secs_f64()
            .max(b.m.window.as_secs_f64())
            .max(1.0);
    let noise = ROW_NOISE_MS_3S * 3.0 / secs;
    (b.m.cpu_ms_per_cycle() - a.m.cpu_ms_per_cycle() + sign * noise) / d
}

/// The GPU rows (8, 16, 32, 64) and the process rows (0, 100, 500), as [`run`] makes them.
fn split(rows: &[Row]) -> (Vec<&Row>, Vec<&Row>) {
    let gpu: Vec<&Row> = rows.iter().take(4).collect();
    let proc: Vec<&Row> = rows.iter().skip(4).collect();
    (gpu, proc)
}

/// Fails where a GPU or a process costs more than [`GROWTH`] times as much at the large end.
pub fn check(rows: &[Row]) -> Result<()> {
    let (gpu, proc) = split(rows);
    if gpu.len() != 4 || proc.len() != 3 {
        bail!("scale: expected 4 GPU rows and 3 process rows");
    }
    // The small end over 8 to 32 GPUs, not 8 to 16: the difference of two rows 8 GPUs apart
    // is within the noise of a short run on a shared machine (a smoke run once measured
    // 0.056 ms a GPU there against 1.066 between 32 and 64, with every row's CPU inflated by
    // other work). A cost quadratic in GPUs still gives 2.4x here.
    let small = bound(gpu[0], gpu[2], |r| r.gpus, 1.0);
    let large = bound(gpu[2], gpu[3], |r| r.gpus, -1.0);
    if large > GROWTH * small {
        bail!(
            "scale: a GPU adds at least {large:.3} ms per cycle between 32 and 64 GPUs against at most {small:.3} ms between 8 and 32, the rows' noise counted (more than {GROWTH}x): the cost grows faster than the GPUs"
        );
    }
    let small = bound(proc[0], proc[1], |r| r.processes, 1.0);
    let large = bound(proc[1], proc[2], |r| r.processes, -1.0);
    if large > GROWTH * small {
        bail!(
            "scale: a process adds at least {large:.4} ms per cycle between 100 and 500 against at most {small:.4} ms between 0 and 100, the rows' noise counted (more than {GROWTH}x): the cost grows faster than the processes"
        );
    }
    Ok(())
}

/// The BENCHMARKS.md section.
pub fn report(rows: &[Row], command: &str, passes: u32) -> String {
    let passes = if passes > 1 {
        format!(" (the lowest CPU of {passes} passes over the rows)")
    } else {
        String::new()
    };
    let mut s = format!(
        "\n## Scale\n\nProduced by `{command}`. NVML and the sinks only, every group at 1 s, \
         `/metrics` scraped every second, {} s a row{passes}; the nodes are the 8x H100 training \
         node made uniform, with 8 to 64 GPUs (two processes each), then 8 GPUs with 0, 100 \
         and 500 processes in all. CPU as in the first table (a cpuacct cgroup). \"Added\" is \
         the CPU per cycle each GPU or process adds over the row above; the check (`cargo \
         xtask bench --smoke` runs it) fails where that, at the large end (32 to 64 GPUs, 100 \
         to 500 processes), is more than {GROWTH}x what it is at the small end (8 to 32 GPUs, \
         0 to 100 processes), with a row's noise ({ROW_NOISE_MS_3S} ms a cycle over a 3 s \
         window, less in proportion over a longer one) added to the small end's difference \
         and taken off the large end's.\n\n\
         | GPUs | processes | CPU ms per cycle | CPU ms per GPU | added per GPU or process (ms) | series | peak RSS (MiB) |\n\
         |---|---|---|---|---|---|---|\n",
        rows.first().map_or(0, |r| r.m.window.as_secs())
    );
    let (gpu, proc) = split(rows);
    for group in [&gpu, &proc] {
        for (i, r) in group.iter().enumerate() {
            let added = match i {
                0 => "—".to_string(),
                _ if group.len() == 4 => format!("{:.3}", marginal(group[i - 1], r, |r| r.gpus)),
                _ => format!("{:.4}", marginal(group[i - 1], r, |r| r.processes)),
            };
            s.push_str(&format!(
                "| {} | {} | {:.2} | {:.3} | {added} | {} | {:.1} |\n",
                r.gpus,
                r.processes,
                r.m.cpu_ms_per_cycle(),
                r.m.cpu_ms_per_cycle() / f64::from(r.gpus),
                r.m.series,
                r.m.peak_rss_kib as f64 / 1024.0
            ));
        }
    }
    s.push_str(&format!(
        "\nCheck: {}.\n",
        match check(rows) {
            Ok(()) => "passed".to_string(),
            Err(e) => format!("failed: {e}"),
        }
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::measure::Scrape;

    fn row(gpus: u32, processes: u32, ms_per_cycle: f64, window_secs: u64) -> Row {
        let window = Duration::from_secs(window_secs);
        Row {
            gpus,
            processes,
            m: Measurement {
                label: String::new(),
                window,
                cpu_secs: ms_per_cycle * window.as_secs_f64() / 1000.0,
                tick_cpu_secs: 0.0,
                peak_rss_kib: 0,
                scrapes: 0,
                series: 0,
                scrape_bytes: 0,
                scrape: Scrape::Text,
                scrape_gzip_bytes: 0,
                otlp: None,
                gpus,
                threads: Default::default(),
            },
        }
    }

    /// The rows of a run: GPUs at `per_gpu(n)` ms, processes at `per_proc(n)` ms on 8 GPUs.
    fn rows(per_gpu: impl Fn(f64) -> f64, per_proc: impl Fn(f64) -> f64, secs: u64) -> Vec<Row> {
        let mut v: Vec<Row> = [8, 16, 32, 64]
            .into_iter()
            .map(|g| row(g, 2 * g, 1.0 + per_gpu(f64::from(g)), secs))
            .collect();
        v.extend(
            [0, 100, 500]
                .into_iter()
                .map(|p| row(8, p, 1.0 + per_gpu(8.0) + per_proc(f64::from(p)), secs)),
        );
        v
    }

    #[test]
    fn linear_costs_pass_and_quadratic_ones_fail() {
        for secs in [3, 30] {
            let linear = rows(|g| 0.1 * g, |p| 0.002 * p, secs);
            assert!(check(&linear).is_ok(), "{secs} s: linear");
            let gpus_squared = rows(|g| 0.01 * g * g, |p| 0.002 * p, secs);
            let e = check(&gpus_squared).expect_err("GPUs squared");
            assert!(e.to_string().contains("a GPU adds"), "{e}");
            let processes_squared = rows(|g| 0.1 * g, |p| 0.0001 * p * p, secs);
            let e = check(&processes_squared).expect_err("processes squared");
            assert!(e.to_string().contains("a process adds"), "{e}");
        }
    }

    /// The smoke run of one CI: the 0-process row high by its noise, which made the cost
    /// between 0 and 100 processes look like 0.0026 ms a process.
    #[test]
    fn a_small_end_within_the_rows_noise_is_not_read_as_growth() {
        let mut v = rows(|g| 0.7 * g, |_| 0.0, 3);
        for (r, ms) in v[4..].iter_mut().zip([7.61, 7.86, 14.89]) {
            *r = row(8, r.processes, ms, 3);
        }
        assert!(check(&v).is_ok(), "{:?}", check(&v).err());
        // Over a 30 s window the same figures are ten times the noise: growth.
        let mut v = rows(|g| 0.7 * g, |_| 0.0, 30);
        for (r, ms) in v[4..].iter_mut().zip([7.61, 7.86, 14.89]) {
            *r = row(8, r.processes, ms, 30);
        }
        assert!(check(&v).is_err());
    }

    /// The smoke run of a CI that failed a linear cost: 100 processes measured at 0.98 ms a
    /// cycle (six runs measured 0.98 to 2.85), the next 400 at 9.55 (5.9 to 11.0).
    #[test]
    fn the_small_end_low_by_its_noise_is_not_read_as_growth() {
        let mut v = rows(|g| 0.6 * g, |_| 0.0, 3);
        for (r, ms) in v[4..].iter_mut().zip([6.67, 7.65, 17.20]) {
            *r = row(8, r.processes, ms, 3);
        }
        assert!(check(&v).is_ok(), "{:?}", check(&v).err());
    }
}

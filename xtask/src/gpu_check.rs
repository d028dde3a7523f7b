//! `cargo xtask gpu-check`: on a host with an NVIDIA GPU, compares what Junction reads through
//! the real driver with what `nvidia-smi` and (where installed) `pynvml` read on the same host,
//! field by field, with stated tolerances; exits non-zero on a mismatch. Then it starts
//! `junction run` with fewer and fewer sources and reports where its memory goes on this host.
//! On a host without a GPU it says so and exits 0 (CI runs it that way, as a dry run).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{cargo, root, run};

/// One compared field: nvidia-smi's query name, Junction's metric and attribute, the factor
/// from Junction's unit to nvidia-smi's, and the tolerance (absolute, in nvidia-smi's unit).
struct Field {
    smi: &'static str,
    metric: &'static str,
    attr: Option<(&'static str, &'static str)>,
    to_smi: f64,
    tolerance: f64,
    why: &'static str,
}

const MIB: f64 = 1024.0 * 1024.0;

const FIELDS: &[Field] = &[
    Field {
        smi: "utilization.gpu",
        metric: "hw.gpu.utilization",
        attr: Some(("hw.gpu.task", "general")),
        to_smi: 100.0,
        tolerance: 15.0,
        why: "%, sampled at different moments",
    },
    Field {
        smi: "utilization.memory",
        metric: "gpu.memory.activity",
        attr: None,
        to_smi: 100.0,
        tolerance: 15.0,
        why: "%, sampled at different moments",
    },
    Field {
        smi: "memory.total",
        metric: "hw.gpu.memory.limit",
        attr: None,
        to_smi: 1.0 / MIB,
        tolerance: 1.0,
        why: "MiB, rounding",
    },
    Field {
        smi: "memory.used",
        metric: "hw.gpu.memory.usage",
        attr: None,
        to_smi: 1.0 / MIB,
        tolerance: 256.0,
        why: "MiB, allocations between reads",
    },
    Field {
        smi: "power.draw",
        metric: "hw.power",
        attr: None,
        to_smi: 1.0,
        tolerance: 60.0,
        why: "W, power moves between reads",
    },
    Field {
        smi: "power.limit",
        metric: "gpu.power.limit",
        attr: Some(("gpu.power.limit_type", "enforced")),
        to_smi: 1.0,
        tolerance: 1.0,
        why: "W",
    },
    Field {
        smi: "temperature.gpu",
        metric: "hw.temperature",
        attr: Some(("hw.sensor_location", "gpu_die")),
        to_smi: 1.0,
        tolerance: 3.0,
        why: "°C",
    },
    Field {
        smi: "temperature.memory",
        metric: "hw.temperature",
        attr: Some(("hw.sensor_location", "memory_junction")),
        to_smi: 1.0,
        tolerance: 3.0,
        why: "°C",
    },
    Field {
        smi: "clocks.sm",
        metric: "gpu.clock.frequency",
        attr: Some(("gpu.clock.domain", "sm")),
        to_smi: 1e-6,
        tolerance: 200.0,
        why: "MHz, boost moves",
    },
    Field {
        smi: "clocks.mem",
        metric: "gpu.clock.frequency",
        attr: Some(("gpu.clock.domain", "memory")),
        to_smi: 1e-6,
        tolerance: 50.0,
        why: "MHz",
    },
    Field {
        smi: "clocks.max.sm",
        metric: "gpu.clock.max_frequency",
        attr: Some(("gpu.clock.domain", "sm")),
        to_smi: 1e-6,
        tolerance: 0.5,
        why: "MHz",
    },
    Field {
        smi: "ecc.errors.corrected.aggregate.total",
        metric: "gpu.ecc.errors.lifetime",
        attr: Some(("error.type", "corrected")),
        to_smi: 1.0,
        tolerance: 0.0,
        why: "count (corrected)",
    },
    Field {
        smi: "pcie.link.width.max",
        metric: "gpu.pcie.link.width",
        attr: Some(("gpu.pcie.link.state", "max")),
        to_smi: 1.0,
        tolerance: 0.0,
        why: "lanes",
    },
    Field {
        smi: "pcie.link.gen.max",
        metric: "gpu.pcie.link.generation",
        attr: Some(("gpu.pcie.link.state", "max")),
        to_smi: 1.0,
        tolerance: 0.0,
        why: "generation",
    },
];

/// Fields that not every nvidia-smi knows, each compared with a query of its own (one unknown
/// name fails a whole query).
const OPTIONAL_FIELDS: &[Field] = &[Field {
    smi: "temperature.gpu.tlimit",
    metric: "gpu.temperature.margin",
    attr: Some(("hw.sensor_location", "gpu_die")),
    to_smi: 1.0,
    // On an H200 that a CUDA program had been heating for seconds, Junction's margin and
    // nvidia-smi's, read a second apart, were 4 °C apart (27 and 23: the T.Limit follows a
    // hotter sensor than the die temperature and moves faster); idle, 50 and 51.
    tolerance: 5.0,
    why: "°C of T.Limit margin, which moves fast under a changing load",
}];

/// nvidia-smi's rows of each of [`OPTIONAL_FIELDS`], each from a query of its own (empty for a
/// field this nvidia-smi does not know). Read right after Junction's collection, as the fixed
/// fields are.
fn query_optional() -> Vec<Vec<BTreeMap<String, String>>> {
    OPTIONAL_FIELDS
        .iter()
        .map(|f| {
            let out = Command::new("nvidia-smi")
                .arg(format!("--query-gpu=uuid,{}", f.smi))
                .arg("--format=csv,noheader,nounits")
                .output();
            match out {
                Ok(o) if o.status.success() => {
                    parse_csv(&String::from_utf8_lossy(&o.stdout), &["uuid", f.smi])
                }
                _ => Vec::new(),
            }
        })
        .collect()
}

/// Compares [`OPTIONAL_FIELDS`] with their rows from [`query_optional`]; returns the
/// mismatches. A field this nvidia-smi does not know has no rows.
fn compare_optional(
    j: &BTreeMap<String, serde_json::Value>,
    rows: &[Vec<BTreeMap<String, String>>],
) -> usize {
    let mut failures = 0;
    for (f, rows) in OPTIONAL_FIELDS.iter().zip(rows) {
        for row in rows {
            let uuid = row.get("uuid").cloned().unwrap_or_default();
            if let Some(gpu) = j.get(&uuid) {
                failures += usize::from(!compare_field(&uuid, gpu, row, f));
            }
        }
    }
    failures
}

/// One field of one GPU, compared and printed as a row; false on a mismatch.
fn compare_field(
    uuid: &str,
    gpu: &serde_json::Value,
    row: &BTreeMap<String, String>,
    f: &Field,
) -> bool {
    let smi_v = row.get(f.smi).and_then(|v| v.trim().parse::<f64>().ok());
    let j_v = metric(gpu, f.metric, f.attr).map(|v| v * f.to_smi);
    let (result, bad) = match (j_v, smi_v) {
        (Some(a), Some(b)) if (a - b).abs() <= f.tolerance => ("ok", false),
        (Some(_), Some(_)) => ("MISMATCH", true),
        (None, None) => ("n/a", false),
        (Some(_), None) => ("smi n/a", false),
        (None, Some(_)) => ("MISSING", true),
    };
    println!(
        "{uuid:<40} {:<38} {:>14} {:>14} {result:>9}  ±{} {}",
        f.smi,
        j_v.map_or("-".into(), |v| format!("{v:.1}")),
        smi_v.map_or("-".into(), |v| format!("{v:.1}")),
        f.tolerance,
        f.why
    );
    !bad
}

/// A setting nvidia-smi prints as a word: its query name, Junction's metric, and where
/// Junction keeps the setting (`Value(attr)`: the series' value, 1 for `Enabled`; `Label(key)`:
/// the label of the series whose value is 1).
struct Setting {
    smi: &'static str,
    metric: &'static str,
    how: How,
}

enum How {
    Value(Option<(&'static str, &'static str)>),
    Label(&'static str),
}

const SETTINGS: &[Setting] = &[
    Setting {
        smi: "persistence_mode",
        metric: "gpu.persistence_mode",
        how: How::Value(None),
    },
    Setting {
        smi: "ecc.mode.current",
        metric: "gpu.ecc.mode",
        how: How::Value(Some(("gpu.mode.setting", "current"))),
    },
    Setting {
        smi: "ecc.mode.pending",
        metric: "gpu.ecc.mode",
        how: How::Value(Some(("gpu.mode.setting", "pending"))),
    },
    Setting {
        smi: "mig.mode.current",
        metric: "gpu.mig.mode",
        how: How::Value(None),
    },
    Setting {
        smi: "mig.mode.pending",
        metric: "gpu.mig.mode.pending",
        how: How::Value(None),
    },
    Setting {
        smi: "compute_mode",
        metric: "gpu.compute_mode",
        how: How::Label("gpu.compute_mode"),
    },
    Setting {
        smi: "fabric.state",
        metric: "gpu.fabric.state",
        how: How::Label("gpu.fabric.state"),
    },
];

/// nvidia-smi's word for a setting as Junction spells it (`Enabled` → `1`, `In Progress` →
/// `in_progress`, `Exclusive_Process` → `exclusive_process`).
fn smi_word(w: &str) -> String {
    match w.trim() {
        "Enabled" => "1".into(),
        "Disabled" => "0".into(),
        other => other.to_lowercase().replace(' ', "_"),
    }
}

/// Compares the settings, each with a query of its own (an nvidia-smi that does not know a
/// field, such as `fabric.state` before R550, fails only that one); returns the mismatches.
fn compare_settings(j: &BTreeMap<String, serde_json::Value>) -> usize {
    let mut failures = 0;
    for s in SETTINGS {
        let out = Command::new("nvidia-smi")
            .arg(format!("--query-gpu=uuid,{}", s.smi))
            .arg("--format=csv,noheader,nounits")
            .output();
        let Some(out) = out.ok().filter(|o| o.status.success()) else {
            println!(
                "{:<40} {:<38} {:>14} {:>14} {:>9}",
                "*", s.smi, "", "", "smi n/a"
            );
            continue;
        };
        for row in parse_csv(&String::from_utf8_lossy(&out.stdout), &["uuid", s.smi]) {
            let uuid = row.get("uuid").cloned().unwrap_or_default();
            let smi_v = row.get(s.smi).map(|w| smi_word(w));
            let j_v = j.get(&uuid).and_then(|g| match s.how {
                How::Value(attr) => metric(g, s.metric, attr).map(|v| format!("{v:.0}")),
                How::Label(key) => label(g, s.metric, key),
            });
            let (result, bad) = match (&j_v, &smi_v) {
                (Some(a), Some(b)) if a == b => ("ok", false),
                (Some(_), Some(_)) => ("MISMATCH", true),
                (None, None) => ("n/a", false),
                (Some(_), None) => ("smi n/a", false),
                (None, Some(_)) => ("MISSING", true),
            };
            failures += usize::from(bad);
            println!(
                "{uuid:<40} {:<38} {:>14} {:>14} {result:>9}  exact",
                s.smi,
                j_v.as_deref().unwrap_or("-"),
                smi_v.as_deref().unwrap_or("-"),
            );
        }
    }
    failures
}

/// The `key` label of the `name` series whose value is 1.
fn label(gpu: &serde_json::Value, name: &str, key: &str) -> Option<String> {
    gpu["metrics"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == name && m["value"].as_f64() == Some(1.0))
        .and_then(|m| m["attributes"][key].as_str())
        .map(str::to_string)
}

/// Runs the check; `Ok` on a host without a GPU (dry run). `junction`: a built binary to
/// check (a GPU host without a Rust toolchain); `None` builds the release binary here.
pub fn run_check(junction: Option<PathBuf>) -> Result<()> {
    let smi = Command::new("nvidia-smi").arg("-L").output();
    let gpus = match smi {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.starts_with("GPU "))
            .count(),
        Ok(_) | Err(_) => 0,
    };
    if gpus == 0 {
        println!(
            "gpu-check: no NVIDIA GPU on this host (nvidia-smi is missing or lists no GPU): \
             dry run, nothing compared"
        );
        return Ok(());
    }
    let junction = match junction {
        Some(path) => {
            println!("gpu-check: {gpus} GPU(s); checking {}", path.display());
            path
        }
        None => {
            println!("gpu-check: {gpus} GPU(s); building junction");
            run(cargo().args(["build", "--release", "--quiet", "-p", "junction"]))?;
            root().join("target/release/junction")
        }
    };
    let j = junction_once(&junction)?;
    let query: Vec<&str> = std::iter::once("uuid")
        .chain(FIELDS.iter().map(|f| f.smi))
        .collect();
    let out = Command::new("nvidia-smi")
        .arg(format!("--query-gpu={}", query.join(",")))
        .arg("--format=csv,noheader,nounits")
        .output()
        .context("running nvidia-smi --query-gpu")?;
    if !out.status.success() {
        bail!(
            "nvidia-smi --query-gpu failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let smi_rows = parse_csv(&String::from_utf8_lossy(&out.stdout), &query);
    let optional_rows = query_optional();
    let procs = Command::new("nvidia-smi")
        .args([
            "--query-compute-apps=gpu_uuid,pid,used_memory",
            "--format=csv,noheader,nounits",
        ])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    let mut failures = 0;
    println!(
        "\n{:<40} {:<38} {:>14} {:>14} {:>9}  tolerance",
        "GPU", "field", "junction", "nvidia-smi", "result"
    );
    for row in &smi_rows {
        let uuid = row.get("uuid").cloned().unwrap_or_default();
        let Some(gpu) = j.get(&uuid) else {
            println!(
                "{uuid:<40} {:<38} {:>14} {:>14} {:>9}",
                "gpu", "absent", "present", "MISMATCH"
            );
            failures += 1;
            continue;
        };
        for f in FIELDS {
            failures += usize::from(!compare_field(&uuid, gpu, row, f));
        }
    }
    for line in procs.lines() {
        let cols: Vec<&str> = line.split(',').map(str::trim).collect();
        let [uuid, pid, used] = cols[..] else {
            continue;
        };
        let j_used = j
            .get(uuid)
            .and_then(|g| metric(g, "gpu.process.memory.usage", Some(("process.pid", pid))))
            .map(|v| v / MIB);
        let smi_used = used.parse::<f64>().ok();
        let (result, bad) = match (j_used, smi_used) {
            (Some(a), Some(b)) if (a - b).abs() <= 64.0 => ("ok", false),
            (None, _) => ("MISSING", true),
            _ => ("MISMATCH", true),
        };
        failures += usize::from(bad);
        println!(
            "{uuid:<40} {:<38} {:>14} {:>14} {result:>9}  ±64 MiB",
            format!("process {pid} memory"),
            j_used.map_or("-".into(), |v| format!("{v:.0}")),
            used
        );
    }
    failures += compare_optional(&j, &optional_rows);
    failures += compare_settings(&j);
    pynvml_cross_check(&junction)?;
    memory_split(&junction)?;
    if failures > 0 {
        bail!("gpu-check: {failures} field(s) disagree");
    }
    println!("\ngpu-check: every field agrees within its tolerance");
    Ok(())
}

/// The source sets [`memory_split`] starts `junction run` with: a name, and the config lines
/// that switch sources off.
const SOURCE_SETS: &[(&str, &str)] = &[
    ("every default source", ""),
    ("no eBPF", "[sources.ebpf]\nenabled = false\n"),
    (
        "no eBPF, no kernel log",
        "[sources.ebpf]\nenabled = false\n[sources.kmsg]\nenabled = false\n",
    ),
    (
        "no eBPF, kernel log or NVML",
        "[sources.ebpf]\nenabled = false\n[sources.kmsg]\nenabled = false\n[sources.nvml]\nenabled = false\n",
    ),
];

/// Where `junction run`'s memory goes on this host: each source set for 7 s with one scrape,
/// then its peak and resident memory (`/proc/PID/status`), anonymous and file-backed
/// (`smaps_rollup`) and threads, as a table (BENCHMARKS.md, "On a real GPU host"). The
/// simulator's rows cannot show what a real driver's library allocates.
fn memory_split(junction: &Path) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("junction-gpu-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    println!(
        "\n`junction run`, 7 s after start and one scrape, by sources:\n\n| sources | peak RSS (MiB) | RSS (MiB) | anonymous (MiB) | file-backed PSS (MiB) | threads | left behind at SIGTERM |\n|---|---|---|---|---|---|---|"
    );
    for (name, off) in SOURCE_SETS {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let config = dir.join("junction.toml");
        std::fs::write(
            &config,
            format!(
                "state_dir = {:?}\n[sinks.prometheus]\nlisten = \"127.0.0.1:{port}\"\n{off}",
                dir.join("state")
            ),
        )?;
        let log = dir.join("junction.log");
        let mut child = Command::new(junction)
            .args(["--config".as_ref(), config.as_os_str(), "run".as_ref()])
            .stdout(std::fs::File::create(&log)?)
            .stderr(std::fs::File::create(dir.join("junction.err"))?)
            .spawn()
            .context("starting junction run")?;
        std::thread::sleep(std::time::Duration::from_secs(6));
        let _ = Command::new("curl")
            .args(["-s", "-o", "/dev/null"])
            .arg(format!("http://127.0.0.1:{port}/metrics"))
            .status();
        std::thread::sleep(std::time::Duration::from_secs(1));
        let proc_dir = Path::new("/proc").join(child.id().to_string());
        let status = std::fs::read_to_string(proc_dir.join("status")).unwrap_or_default();
        let rollup = std::fs::read_to_string(proc_dir.join("smaps_rollup")).unwrap_or_default();
        let kib = |text: &str, key: &str| -> Option<f64> {
            text.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        };
        let mib = |v: Option<f64>| v.map_or("-".into(), |k| format!("{:.1}", k / 1024.0));
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let _ = child.wait();
        let text = std::fs::read_to_string(dir.join("junction.err")).unwrap_or_default()
            + &std::fs::read_to_string(&log).unwrap_or_default();
        let left: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("left behind"))
            .filter_map(|l| l.split("name=").nth(1))
            .collect();
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} |",
            mib(kib(&status, "VmHWM:")),
            mib(kib(&status, "VmRSS:")),
            mib(kib(&rollup, "Anonymous:")),
            mib(kib(&rollup, "Pss_File:")),
            kib(&status, "Threads:").map_or("-".into(), |t| t.to_string()),
            if left.is_empty() {
                "none".to_string()
            } else {
                left.join(", ")
            },
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `junction once --format json`, as GPU UUID → metrics.
fn junction_once(junction: &Path) -> Result<BTreeMap<String, serde_json::Value>> {
    let out = Command::new(junction)
        .args(["once", "--format", "json"])
        .output()
        .context("running junction once")?;
    if !out.status.success() {
        bail!(
            "junction once failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(doc["gpus"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| {
            (
                g["gpu"]["uuid"].as_str().unwrap_or_default().to_string(),
                g.clone(),
            )
        })
        .collect())
}

/// The value of a metric in `junction once` JSON for one GPU.
fn metric(gpu: &serde_json::Value, name: &str, attr: Option<(&str, &str)>) -> Option<f64> {
    gpu["metrics"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == name && attr.is_none_or(|(k, v)| m["attributes"][k] == v))
        .and_then(|m| m["value"].as_f64())
}

/// `nvidia-smi --format=csv,noheader,nounits` rows as maps from the query names.
fn parse_csv(text: &str, query: &[&str]) -> Vec<BTreeMap<String, String>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            query
                .iter()
                .zip(l.split(','))
                .filter(|(_, v)| !matches!(v.trim(), "[N/A]" | "N/A" | "[Not Supported]"))
                .map(|(k, v)| (k.to_string(), v.trim().to_string()))
                .collect()
        })
        .collect()
}

/// The same through pynvml, when a Python with it is on this host (the test venv or the
/// system's); skipped with a note otherwise.
fn pynvml_cross_check(junction: &Path) -> Result<()> {
    let venv = root().join("target/venv/bin/python");
    let python = if venv.exists() {
        venv
    } else {
        "python3".into()
    };
    let ok = Command::new(&python)
        .args(["-c", "import pynvml"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!("\npynvml: not installed here; its cross-check is skipped");
        return Ok(());
    }
    let out = Command::new(&python)
        .arg(root().join("tests/pynvml/read.py"))
        .output()
        .context("running tests/pynvml/read.py")?;
    if !out.status.success() {
        println!(
            "\npynvml: read.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return Ok(());
    }
    let py: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let j = junction_once(junction)?;
    println!("\npynvml cross-check (die temperature ±3 °C, memory total exact):");
    for p in py["gpus"].as_array().into_iter().flatten() {
        let uuid = p["uuid"].as_str().unwrap_or_default();
        let g = j.get(uuid);
        let t =
            g.and_then(|g| metric(g, "hw.temperature", Some(("hw.sensor_location", "gpu_die"))));
        let total = g.and_then(|g| metric(g, "hw.gpu.memory.limit", None));
        println!(
            "  {uuid}: die {:?} vs {}, memory total {:?} vs {}",
            t, p["temp_gpu"], total, p["memory_total"]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_csv_rows_map_to_the_query() {
        let q = ["uuid", "utilization.gpu", "temperature.memory"];
        let rows = parse_csv("GPU-1, 97, [N/A]\nGPU-2, 3, 71\n", &q);
        assert_eq!(rows[0]["utilization.gpu"], "97");
        assert!(!rows[0].contains_key("temperature.memory"));
        assert_eq!(rows[1]["temperature.memory"], "71");
    }

    #[test]
    fn metrics_are_found_by_name_and_attribute() {
        let g = serde_json::json!({"metrics": [
            {"name": "hw.temperature", "attributes": {"hw.sensor_location": "gpu_die"}, "value": 64.0},
            {"name": "hw.temperature", "attributes": {"hw.sensor_location": "memory_junction"}, "value": 71.0},
        ]});
        assert_eq!(
            metric(
                &g,
                "hw.temperature",
                Some(("hw.sensor_location", "memory_junction"))
            ),
            Some(71.0)
        );
        assert_eq!(metric(&g, "hw.power", None), None);
    }
}

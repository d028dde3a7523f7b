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

mod compare;

use compare::{FIELDS, MIB, compare_field, compare_optional, compare_settings, query_optional};

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
pub(super) fn metric(
    gpu: &serde_json::Value,
    name: &str,
    attr: Option<(&str, &str)>,
) -> Option<f64> {
    gpu["metrics"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == name && attr.is_none_or(|(k, v)| m["attributes"][k] == v))
        .and_then(|m| m["value"].as_f64())
}

/// `nvidia-smi --format=csv,noheader,nounits` rows as maps from the query names.
pub(super) fn parse_csv(text: &str, query: &[&str]) -> Vec<BTreeMap<String, String>> {
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

//! Fuzzing every parser of outside input (`fuzz/`, libFuzzer through `cargo fuzz`): builds the
//! targets with nightly, seeds each corpus from the project's fixtures and the real-world
//! captures in `../shared/realworld/` (read there, never copied into the repository), and runs
//! each target for a bounded number of inputs and seconds. A crash, a panic, a failed
//! invariant (the followed-file position, the XID state's caps) or an input past the memory
//! limit fails the run.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{root, run};

/// The targets, and what each reads.
pub const TARGETS: &[(&str, &str)] = &[
    ("kmsg_line", "kernel-log file lines, into the model"),
    ("kmsg_record", "`/dev/kmsg` records"),
    ("followed_file", "a followed file written in pieces"),
    (
        "redfish_walk",
        "a whole Redfish walk against a BMC serving the input",
    ),
    ("ipmi_sensors", "`ipmi-sensors` output"),
    ("config_file", "the configuration file"),
    ("otel_env", "`OTEL_*` variables"),
    ("pod_resources", "the kubelet's pod-resources answer"),
];

/// What one target's run did.
pub struct Outcome {
    /// The target.
    pub target: &'static str,
    /// Inputs run.
    pub execs: u64,
    /// Seconds.
    pub secs: f64,
    /// Corpus files and bytes afterwards.
    pub corpus: (usize, u64),
}

/// Builds the targets (installing cargo-fuzz if missing); returns the binaries' folder.
pub fn build() -> Result<PathBuf> {
    let ok = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!("installing cargo-fuzz (a minute or two)");
        run(Command::new("cargo").env_remove("CARGO_TARGET_DIR").args([
            "install",
            "cargo-fuzz",
            "--version",
            "0.13.2",
            "--locked",
        ]))?;
    }
    // Without a sanitizer: the parsers are safe Rust; what is looked for is panics, failed
    // invariants, unbounded memory and time.
    run(Command::new("rustup")
        .current_dir(root().join("fuzz"))
        .env_remove("CARGO_TARGET_DIR")
        .args([
            "run", "nightly", "cargo", "fuzz", "build", "-O", "-s", "none",
        ]))
    .context("building the fuzz targets (needs the nightly toolchain)")?;
    Ok(root().join("fuzz/target/x86_64-unknown-linux-gnu/release"))
}

fn shared() -> PathBuf {
    root().join("../shared/realworld")
}

fn put(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    std::fs::write(dir.join(name), bytes).with_context(|| format!("seed {name}"))
}

/// Kernel-log lines: the project's own fixture (the `expected | line` pairs) and the
/// real-world corpus.
fn kmsg_lines() -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(t) = std::fs::read_to_string(root().join("tests/fixtures/kmsg/lines.txt")) {
        out.extend(
            t.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| l.split_once(" | ").map(|(_, x)| x.to_string())),
        );
    }
    if let Ok(t) = std::fs::read_to_string(shared().join("xid-lines.txt")) {
        out.extend(t.lines().map(str::to_string));
    }
    out
}

/// A real Redfish tree as one input: `{"/redfish/v1/...": document}`.
fn packed_tree(tree: &Path) -> Option<String> {
    let mut map = serde_json::Map::new();
    let base = tree.join("redfish/v1");
    let mut stack = vec![base.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).ok()?.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let rel = p.strip_prefix(tree).ok()?.to_string_lossy().to_string();
            let key = format!(
                "/{}",
                rel.trim_end_matches("/index.json")
                    .trim_end_matches(".json")
            );
            let doc: serde_json::Value = std::fs::read(&p)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())?;
            map.insert(key, doc);
        }
    }
    Some(serde_json::Value::Object(map).to_string())
}

/// Writes the seed inputs of every target into `corpus/<target>/`.
fn seed(corpus: &Path) -> Result<()> {
    let dir = |t: &str| -> Result<PathBuf> {
        let d = corpus.join(t);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    };
    let lines = kmsg_lines();
    let (kl, kr, ff) = (
        dir("kmsg_line")?,
        dir("kmsg_record")?,
        dir("followed_file")?,
    );
    for (i, l) in lines.iter().enumerate() {
        put(
            &kl,
            &format!("seed-{i}"),
            format!("Dec  1 00:00:00 node kernel: {l}").as_bytes(),
        )?;
        put(
            &kr,
            &format!("seed-{i}"),
            format!("6,{i},{},-;{l}\n", i * 1000).as_bytes(),
        )?;
    }
    put(&kl, "seed-all", lines.join("\n").as_bytes())?;
    let mut stream = vec![7u8];
    stream.extend(
        lines
            .iter()
            .take(40)
            .flat_map(|l| format!("{l}\n").into_bytes()),
    );
    put(&ff, "seed-stream", &stream)?;
    let ipmi = dir("ipmi_sensors")?;
    for e in std::fs::read_dir(shared().join("ipmi"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "txt")
            && !p.to_string_lossy().contains("LICENSE")
            && let Ok(b) = std::fs::read(&p)
        {
            put(&ipmi, &e.file_name().to_string_lossy(), &b)?;
        }
    }
    let rf = dir("redfish_walk")?;
    for e in std::fs::read_dir(shared().join("redfish"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.path().join("redfish/v1").is_dir()
            && let Some(t) = packed_tree(&e.path())
        {
            put(&rf, &e.file_name().to_string_lossy(), t.as_bytes())?;
        }
    }
    let cf = dir("config_file")?;
    if let Ok(b) = std::fs::read(root().join("config/junction.toml")) {
        put(&cf, "junction.toml", &b)?;
    }
    let oe = dir("otel_env")?;
    put(
        &oe,
        "seed",
        b"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317\nOTEL_EXPORTER_OTLP_HEADERS=a=b%20c,d=%E2%82%AC\nOTEL_RESOURCE_ATTRIBUTES=k8s.node.name=n1,host.name=h\nOTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf\nOTEL_EXPORTER_OTLP_TIMEOUT=5000\nOTEL_METRIC_EXPORT_INTERVAL=1000\n",
    )?;
    dir("pod_resources")?;
    Ok(())
}

fn corpus_size(d: &Path) -> (usize, u64) {
    std::fs::read_dir(d).map_or((0, 0), |rd| {
        rd.flatten()
            .filter_map(|e| e.metadata().ok())
            .fold((0, 0), |(n, b), m| (n + 1, b + m.len()))
    })
}

/// Runs every target for at most `runs` inputs and `secs` seconds each.
pub fn run_all(runs: u64, secs: u64) -> Result<Vec<Outcome>> {
    let bin = build()?;
    let corpus = root().join("target/fuzz-corpus");
    seed(&corpus)?;
    let mut out = Vec::new();
    for (t, what) in TARGETS {
        let d = corpus.join(t);
        let start = std::time::Instant::now();
        let o = Command::new(bin.join(t))
            .arg(&d)
            .args([
                format!("-runs={runs}"),
                format!("-max_total_time={secs}"),
                "-rss_limit_mb=1024".into(),
                "-malloc_limit_mb=512".into(),
                "-timeout=20".into(),
                "-max_len=4194304".into(),
                "-print_final_stats=1".into(),
            ])
            .output()
            .with_context(|| format!("running fuzz target {t}"))?;
        let log = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() {
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!("fuzz target {t} ({what}) failed:\n{}", tail.join("\n"));
        }
        let execs = log
            .lines()
            .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let o = Outcome {
            target: t,
            execs,
            secs: start.elapsed().as_secs_f64(),
            corpus: corpus_size(&d),
        };
        println!(
            "fuzz {t}: {} inputs in {:.1} s ({:.0}/s), corpus {} files, {} KiB",
            o.execs,
            o.secs,
            o.execs as f64 / o.secs.max(1e-9),
            o.corpus.0,
            o.corpus.1 / 1024
        );
        out.push(o);
    }
    Ok(out)
}

/// The BENCHMARKS.md section.
pub fn report(outcomes: &[Outcome], secs: u64) -> String {
    let mut s = format!(
        "\n## Fuzzing\n\nEvery parser of outside input under libFuzzer (`fuzz/`, built with `cargo fuzz build -O -s none`), \
         each for {secs} s from a corpus seeded with the project's fixtures and the real-world captures in \
         `../shared/realworld/` (kernel-log lines, IPMI outputs, 17 Redfish trees packed one per input). \
         No target crashed, panicked, broke an invariant or passed 512 MiB for one input. \
         `cargo xtask test` runs each for a bounded count on every CI run. \
         Produced by `cargo xtask fuzz --secs {secs} --write` (or `cargo xtask bench`).\n\n\
         | target | reads | inputs | inputs/s | corpus files | corpus KiB |\n|---|---|---:|---:|---:|---:|\n"
    );
    for o in outcomes {
        let what = TARGETS
            .iter()
            .find(|(t, _)| *t == o.target)
            .map_or("", |(_, w)| *w);
        s.push_str(&format!(
            "| `{}` | {what} | {} | {:.0} | {} | {} |\n",
            o.target,
            o.execs,
            o.execs as f64 / o.secs.max(1e-9),
            o.corpus.0,
            o.corpus.1 / 1024
        ));
    }
    s
}

//! `cargo xtask`: building the BPF programs and the NVML simulator, the demo, the test suite
//! (installing what it needs) and the benchmarks.

mod bench;
mod demo;
mod fuzz;
mod gpu_check;
mod image;
mod setup;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

const USAGE: &str = "usage: cargo xtask <command>

commands:
  build-ebpf        build the BPF programs (installs nightly rust-src, LLVM 22 and bpf-linker if missing)
  nvml-sim          build the NVML simulator library (one build per driver branch) and print its path
  docs              regenerate METRICS.md, docs/CONFIG.md and config/junction.toml
  demo [--for SECS] [--plain] [--venv DIR]
                    the whole node: Junction on a simulated 8-GPU node, a Redfish CDU whose flow
                    drops, an IPMI BMC, an ioctl workload, XIDs, an OTLP receiver; a live view
  test              install what the tests need, then run every check and test
  bench [--smoke]   measure CPU and memory per collection; writes BENCHMARKS.md (not with --smoke)
  bench --soak MIN  memory over MIN minutes with every source on and processes coming and going;
                    rewrites BENCHMARKS.md's soak section
  bench --bmc       the BMC polls alone; rewrites BENCHMARKS.md's BMC section
  bench --otlp      the OTLP export rows alone (beside a scrape of the same state); rewrites that
                    section of BENCHMARKS.md
  bench --cpu       the first table (every junction row beside nvitop-exporter) and the OTLP
                    section, which reads the same rows; rewrites both in BENCHMARKS.md
  bench --fabric    the NIC and PCIe polls alone; rewrites that section of BENCHMARKS.md
  bench --ebpf      the eBPF probes' cost and the every-source row (BPF programs built first);
                    rewrites that section and that row of BENCHMARKS.md
  bench --kmsg      the kernel-log benchmarks alone; rewrites that section of BENCHMARKS.md
  bench --scale     the cost at 8 to 64 GPUs and 0 to 500 processes, checked for growing faster
                    than either; rewrites that section of BENCHMARKS.md
  bench --dcgm      the dcgm-exporter compatibility page's cost per scrape beside /metrics; rewrites
                    that section of BENCHMARKS.md
  fuzz [--secs N] [--write]
                    fuzz every parser of outside input for N seconds each (default 60); --write
                    puts the figures in BENCHMARKS.md's fuzzing section
  image             build the container image with podman from the Dockerfile; prints its reference last
  gpu-check         on a GPU host, compare junction with nvidia-smi and pynvml (a dry run without a GPU);
                    --junction PATH checks that binary instead of building one
";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cmd = args.first().map(String::as_str).unwrap_or("");
    let rest = &args[args.len().min(1)..];
    match cmd {
        "build-ebpf" => build_ebpf().map(|p| println!("{}", p.display())),
        "nvml-sim" => nvml_sim().map(|p| println!("{}", p.display())),
        "docs" => docs(),
        "demo" => demo::demo(demo::Options::parse(rest)?),
        "demo-workload" => demo::workload::run(rest.first().map(String::as_str).unwrap_or("")),
        "test" => test(),
        "bench" if rest.iter().any(|a| a == "--soak") => {
            let minutes = rest
                .iter()
                .position(|a| a == "--soak")
                .and_then(|i| rest.get(i + 1))
                .context("--soak takes a number of minutes, e.g. --soak 60")?
                .parse::<f64>()
                .context("--soak takes a number of minutes, e.g. --soak 60")?;
            bench::run_soak(minutes)
        }
        "bench" if rest.iter().any(|a| a == "--bmc") => bench::run_bmc(),
        "bench" if rest.iter().any(|a| a == "--otlp") => bench::run_otlp(),
        "bench" if rest.iter().any(|a| a == "--cpu") => bench::run_cpu(),
        "bench" if rest.iter().any(|a| a == "--ebpf") => bench::run_ebpf(),
        "bench" if rest.iter().any(|a| a == "--scale") => {
            bench::run_scale(rest.iter().any(|a| a == "--smoke"))
        }
        "bench" if rest.iter().any(|a| a == "--fabric") => bench::run_fabric(),
        "bench" if rest.iter().any(|a| a == "--kmsg") => bench::run_kmsg(),
        "bench" if rest.iter().any(|a| a == "--dcgm") => {
            bench::run_dcgm(rest.iter().any(|a| a == "--smoke"))
        }
        "bench" => bench::run(rest.iter().any(|a| a == "--smoke")),
        "image" => image::build().map(|r| println!("{r}")),
        "fuzz" => fuzz_command(rest),
        "gpu-check" => gpu_check::run_check(
            rest.iter()
                .position(|a| a == "--junction")
                .map(|i| {
                    rest.get(i + 1)
                        .map(std::path::PathBuf::from)
                        .context("--junction takes the path of a built junction binary")
                })
                .transpose()?,
        ),
        _ => {
            eprint!("{USAGE}");
            if cmd.is_empty() || cmd == "help" || cmd == "--help" {
                Ok(())
            } else {
                bail!("unknown command {cmd:?}")
            }
        }
    }
}

/// `cargo xtask fuzz [--secs N] [--write]`.
fn fuzz_command(args: &[String]) -> Result<()> {
    let secs = args
        .iter()
        .position(|a| a == "--secs")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse::<u64>().context("--secs takes a number of seconds"))
        .transpose()?
        .unwrap_or(60);
    let outcomes = fuzz::run_all(u64::MAX / 2, secs)?;
    let section = fuzz::report(&outcomes, secs);
    print!("{section}");
    if args.iter().any(|a| a == "--write") {
        let path = root().join("BENCHMARKS.md");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let kept = match text.find("\n## Fuzzing\n") {
            Some(i) => {
                let rest = &text[i + 1..];
                let end = rest[3..].find("\n## ").map(|j| i + 1 + 3 + j);
                format!("{}{}", &text[..i], end.map_or("", |e| &text[e..]))
            }
            None => text,
        };
        std::fs::write(
            &path,
            format!(
                "{}{section}",
                kept.trim_end_matches('\n').to_string() + "\n"
            ),
        )?;
        println!("wrote the fuzzing section of BENCHMARKS.md");
    }
    Ok(())
}

/// The workspace root: where this binary was built, or, for a binary carried to another host
/// (`gpu-check` on a GPU host without a Rust toolchain), the current directory.
pub fn root() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    if built.join("Cargo.toml").exists() {
        built
    } else {
        std::env::current_dir().unwrap_or(built)
    }
}

/// Runs a command, failing with its name if it fails.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

/// Builds the BPF object and checks that it is an eBPF ELF.
fn build_ebpf() -> Result<PathBuf> {
    let path_env = setup::bpf_toolchain()?;
    let dir = root().join("collector-ebpf");
    // rustup picks nightly from collector-ebpf/rust-toolchain.toml; CARGO/RUSTC from the outer
    // stable cargo must not leak in.
    let mut c = Command::new("cargo");
    c.current_dir(&dir)
        .env("PATH", path_env)
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO_TARGET_DIR")
        .args(["build", "--release", "--locked"]);
    run(&mut c)?;
    let obj = dir.join("target/bpfel-unknown-none/release/junction-ebpf");
    let bytes = std::fs::read(&obj).with_context(|| format!("cannot read {}", obj.display()))?;
    // ELF magic, and e_machine (offset 18, little endian) = 247 (EM_BPF).
    if bytes.len() < 20
        || &bytes[..4] != b"\x7fELF"
        || u16::from_le_bytes([bytes[18], bytes[19]]) != 247
    {
        bail!("{} is not an eBPF ELF object", obj.display());
    }
    Ok(obj)
}

/// Builds every simulator variant (driver branch) into
/// `target/nvml-sim/{current,legacy,r535,future}/libnvidia-ml.so.1` (debug builds, for the
/// tests and the demo).
pub fn nvml_sim() -> Result<PathBuf> {
    nvml_sim_profile(false)
}

/// [`nvml_sim`] with a choice of profile: release builds go to `target/nvml-sim-release/`,
/// for the benchmarks (the simulator's own cost runs inside the measured process and must
/// stay small), where a test run that rebuilds the debug ones cannot replace them mid-run.
pub fn nvml_sim_profile(release: bool) -> Result<PathBuf> {
    let out = root().join(if release {
        "target/nvml-sim-release"
    } else {
        "target/nvml-sim"
    });
    let profile = if release { "release" } else { "debug" };
    for (variant, features) in [
        ("legacy", Some("legacy")),
        ("r535", Some("r535")),
        ("future", Some("future")),
        ("current", None),
    ] {
        let mut c = cargo();
        c.args(["build", "--quiet", "-p", "nvml-sim"]);
        if release {
            c.arg("--release");
        }
        if let Some(f) = features {
            c.args(["--features", f]);
        }
        run(&mut c)?;
        let dir = out.join(variant);
        std::fs::create_dir_all(&dir)?;
        let dest = dir.join("libnvidia-ml.so.1");
        // Copy to a temporary name and rename, so that a running reader never sees half a file.
        let tmp = dir.join(format!(".libnvidia-ml.so.1.{}.tmp", std::process::id()));
        std::fs::copy(
            root().join("target").join(profile).join("libnvidia_ml.so"),
            &tmp,
        )?;
        std::fs::rename(&tmp, &dest)?;
    }
    Ok(out.join("current/libnvidia-ml.so.1"))
}

fn junction_output(args: &[&str]) -> Result<String> {
    let out = cargo()
        .args(["run", "--quiet", "-p", "junction", "--"])
        .args(args)
        .output()?;
    if !out.status.success() {
        bail!(
            "junction {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

fn docs() -> Result<()> {
    for (which, path) in [
        ("metrics", "METRICS.md"),
        ("config", "docs/CONFIG.md"),
        ("example", "config/junction.toml"),
    ] {
        let text = junction_output(&["docs", which])?;
        let dest = root().join(path);
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&dest, text)?;
        println!("wrote {path}");
    }
    Ok(())
}

/// The config the demo and the benchmarks use: the simulator library, everything at `interval`.
pub fn sim_config(lib: &Path, listen: &str, interval_secs: u64) -> String {
    let mut s = format!(
        "[sources.nvml]\nlibrary = {:?}\n\n[sinks.prometheus]\nlisten = {listen:?}\n",
        lib.display().to_string()
    );
    if interval_secs > 0 {
        s.push_str(&testkit::nvml_groups_every(interval_secs));
    }
    s
}

fn test() -> Result<()> {
    let env = setup::test_dependencies()?;
    run(cargo().args(["fmt", "--all", "--check"]))?;
    // Before anything compiles Junction: it embeds the object when it exists.
    let obj = build_ebpf()?;
    println!("BPF object: {}", obj.display());
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--quiet",
        "--",
        "-D",
        "warnings",
    ]))?;
    let sim = nvml_sim()?;
    println!("NVML simulator: {}", sim.display());
    // Every parser of outside input, for a bounded count (longer in `cargo xtask bench`).
    fuzz::run_all(100_000, 20)?;
    bench::run(true)?;
    // The container tests run the image built from the Dockerfile.
    let image = image::build()?;
    println!("container image: {image}");
    // cargo-nextest runs every test in its own process and ends with one summary line; plain
    // `cargo test` where it is not installed.
    let nextest = cargo()
        .args(["nextest", "--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let mut c = cargo();
    if nextest {
        c.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        c.args(["test", "--workspace", "--no-fail-fast"]);
    }
    c.env("JUNCTION_PYTHON", &env.python)
        .env("JUNCTION_IMAGE", &image);
    run(&mut c)?;
    // The real-GPU comparison: a dry run here (no GPU), kept from rotting.
    gpu_check::run_check(None)
}

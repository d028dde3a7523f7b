//! Installing what the tests need, idempotently: Debian packages, the BPF toolchain and a
//! Python venv. Each step checks first and does nothing when the thing is already there.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::{root, run};

/// Pinned Python packages: the independent NVML reader, the peer exporter, and the Redfish
/// servers (`sushy-static`, `sushy-emulator`).
const PYTHON_PACKAGES: &[&str] = &[
    "nvidia-ml-py==13.615.71",
    "nvitop-exporter==1.7.2",
    SUSHY,
    // What DMTF's Redfish-Mockup-Server (the benchmark's $expand-capable BMC) imports.
    "requests==2.34.2",
    "grequests==0.7.0",
];
/// The LLVM that bpf-linker links against.
const LLVM_BIN: &str = "/usr/lib/llvm-22/bin";

/// What the test run needs to know.
pub struct TestEnv {
    /// The venv's python, with `pynvml`.
    pub python: PathBuf,
}

fn quiet_ok(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Installs Debian packages that are missing (needs root).
pub fn apt(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            let out = Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output();
            !out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!(
        "installing Debian packages: {} (apt-get, a minute or two)",
        missing.join(" ")
    );
    run(Command::new("apt-get").args(["update", "-qq"])).context("apt-get update (needs root)")?;
    run(Command::new("apt-get")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing))
    .context("apt-get install (needs root)")
}

/// Nightly rust-src, LLVM 22 and bpf-linker. Returns the PATH to build the BPF crate with.
pub fn bpf_toolchain() -> Result<String> {
    let sysroot = Command::new("rustc")
        .args(["+nightly", "--print", "sysroot"])
        .output();
    let sysroot = match sysroot {
        Ok(o) if o.status.success() => PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()),
        _ => bail!("no nightly toolchain: `rustup toolchain install nightly` first"),
    };
    if !sysroot.join("lib/rustlib/src/rust/library/core").exists() {
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    apt(&[
        "llvm-22-dev",
        "libpolly-22-dev",
        "libzstd-dev",
        "zlib1g-dev",
    ])?;
    let path = format!("{LLVM_BIN}:{}", std::env::var("PATH").unwrap_or_default());
    if !quiet_ok(
        Command::new("bpf-linker")
            .arg("--version")
            .env("PATH", &path),
    ) {
        println!("installing bpf-linker (a few minutes)");
        run(Command::new("cargo")
            .env("PATH", &path)
            .env_remove("CARGO_TARGET_DIR")
            .args([
                "install",
                "bpf-linker",
                "--version",
                "0.13.0",
                "--no-default-features",
                "--features",
                "llvm-22",
            ]))?;
    }
    Ok(path)
}

/// The Debian packages the IPMI parts need: the simulator (`ipmi_sim`) and the tools Junction
/// runs (FreeIPMI's `ipmi-sensors`).
pub const IPMI_PACKAGES: &[&str] = &["openipmi", "freeipmi-tools"];

/// The Redfish servers (`sushy-static`, `sushy-emulator`).
pub const SUSHY: &str = "sushy-tools==2.2.0";

/// A Python venv at `venv` with `packages`, made and filled only where `ready` (run with the
/// venv's python) says something is missing: `Ok(true)` where it installed anything. Says what
/// it installs and about how long that takes.
pub fn python_venv(venv: &Path, packages: &[&str], ready: &[&str]) -> Result<bool> {
    let python = venv.join("bin/python");
    let present = python.exists()
        && ready.iter().all(|check| {
            if let Some(file) = check.strip_prefix("file:") {
                venv.join(file).exists()
            } else {
                quiet_ok(Command::new(&python).args(["-c", check]))
            }
        });
    if present {
        return Ok(false);
    }
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(venv))
            .with_context(|| format!("creating the Python venv {}", venv.display()))?;
    }
    println!(
        "installing into {} from PyPI: {} (about a minute the first time)",
        venv.display(),
        packages.join(" ")
    );
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(packages))
    .with_context(|| format!("pip install {} into {}", packages.join(" "), venv.display()))?;
    Ok(true)
}

/// Everything `cargo xtask test` needs besides the BPF toolchain.
pub fn test_dependencies() -> Result<TestEnv> {
    // promtool comes with Debian's prometheus package; the IPMI simulator and the IPMI tools
    // Junction runs (FreeIPMI) and compares with (ipmitool).
    let mut packages = vec!["prometheus", "ipmitool", "systemd"];
    packages.extend_from_slice(IPMI_PACKAGES);
    // systemd: systemd-analyze verifies the unit file.
    apt(&packages)?;
    let venv = root().join("target/venv");
    python_venv(
        &venv,
        PYTHON_PACKAGES,
        &[
            "import pynvml, nvitop_exporter",
            "import grequests",
            "file:bin/sushy-static",
        ],
    )?;
    redfish_mockup_server()?;
    Ok(TestEnv {
        python: venv.join("bin/python"),
    })
}

/// What the demo could set up: `sushy-static` (or why not), whether the IPMI tools are there,
/// what it installed, and for each part it cannot run, the one command that brings it.
pub struct DemoEnv {
    /// The venv's `sushy-static`.
    pub sushy: Option<PathBuf>,
    /// `ipmi_sim` and `ipmi-sensors` are installed.
    pub ipmi: bool,
    /// What this run installed (empty on a second run).
    pub installed: Vec<String>,
    /// (part, the command that brings it) for each part that cannot run.
    pub missing: Vec<(String, String)>,
}

fn have(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .any(|d| d.join(tool).is_file())
}

/// What `cargo xtask demo` needs, installed the way `cargo xtask test` installs it (the same
/// steps): the venv at `venv` with sushy-tools, and as root Debian's openipmi and
/// freeipmi-tools. Nothing fails here: a part that cannot be set up is listed with the command
/// that would bring it, and the demo runs the rest.
pub fn demo_dependencies(venv: &Path, is_root: bool) -> DemoEnv {
    let mut env = DemoEnv {
        sushy: None,
        ipmi: false,
        installed: Vec::new(),
        missing: Vec::new(),
    };
    match python_venv(venv, &[SUSHY], &["file:bin/sushy-static"]) {
        Ok(installed) => {
            if installed {
                env.installed
                    .push(format!("{SUSHY} into {}", venv.display()));
            }
            env.sushy = Some(venv.join("bin/sushy-static"));
        }
        Err(e) => env.missing.push((
            format!("the Redfish CDU (sushy-tools: {e:#})"),
            format!(
                "python3 -m venv {v} && {v}/bin/pip install {SUSHY}",
                v = venv.display()
            ),
        )),
    }
    let tools = || have("ipmi_sim") && have("ipmi-sensors");
    if !tools() {
        if is_root {
            match apt(IPMI_PACKAGES) {
                Ok(()) => env.installed.push(IPMI_PACKAGES.join(" ")),
                Err(e) => env.missing.push((
                    format!("the IPMI BMC ({e:#})"),
                    format!("apt-get install {}", IPMI_PACKAGES.join(" ")),
                )),
            }
        } else {
            env.missing.push((
                "the IPMI BMC (ipmi_sim, ipmi-sensors are not installed; installing needs root)"
                    .into(),
                format!("sudo apt-get install {}", IPMI_PACKAGES.join(" ")),
            ));
        }
    }
    env.ipmi = tools();
    env
}

/// DMTF's Redfish-Mockup-Server, as shipped in the `libredfish` crate on crates.io (it is not
/// on PyPI), fetched once into `target/tools/`: the benchmark serves the DGX tree with it (it
/// serves `$expand`), the tests log in and out of its SessionService.
pub fn redfish_mockup_server() -> Result<PathBuf> {
    let dir = root().join("target/tools");
    let script = dir.join("redfishMockupServer.py");
    if script.exists() {
        return Ok(script);
    }
    std::fs::create_dir_all(&dir)?;
    let python = root().join("target/venv/bin/python");
    let status = Command::new(&python)
        .args([
            "-c",
            "import io,sys,tarfile,urllib.request\n\
             data = urllib.request.urlopen('https://static.crates.io/crates/libredfish/libredfish-0.2.0.crate').read()\n\
             t = tarfile.open(fileobj=io.BytesIO(data))\n\
             f = t.extractfile('libredfish-0.2.0/tests/redfishMockupServer.py').read()\n\
             open(sys.argv[1], 'wb').write(f)",
        ])
        .arg(&script)
        .status()
        .context("fetching the Redfish mockup server from crates.io")?;
    if !status.success() || !script.exists() {
        bail!("cannot fetch redfishMockupServer.py from the libredfish crate");
    }
    Ok(script)
}

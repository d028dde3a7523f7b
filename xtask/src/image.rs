//! `cargo xtask image`: the container image, built with podman from the `Dockerfile`.
//!
//! The base is a Debian bookworm made by debootstrap from the configured Debian mirror and
//! imported into podman (no public registry is needed); the build context holds the release
//! binary (with the BPF programs embedded) and the default config. podman runs with runc (crun
//! fails on hybrid cgroups) and explicit ulimits (raising them needs CAP_SYS_RESOURCE).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::{build_ebpf, cargo, root, run, setup};

/// The local base image.
pub const BASE: &str = "localhost/debian:bookworm-minbase";
/// The image `cargo xtask image` builds.
pub const IMAGE: &str = "localhost/junction:dev";
/// The runtime podman must use here.
pub const RUNC: &str = "/usr/sbin/runc";
/// The limits podman must set instead of raising them.
pub const ULIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
];

/// podman with the runtime this machine needs.
pub fn podman() -> Command {
    let mut c = Command::new("podman");
    c.args(["--runtime", RUNC]);
    c
}

fn image_exists(name: &str) -> bool {
    podman()
        .args(["image", "exists", name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The first Debian mirror apt is configured with (deb822 or one-line sources).
fn debian_mirror() -> String {
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = std::fs::read_dir("/etc/apt/sources.list.d") {
        files.extend(dir.flatten().map(|e| e.path()));
    }
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for line in text.lines().map(str::trim) {
            let url = if let Some(rest) = line.strip_prefix("URIs:") {
                rest.split_whitespace().next()
            } else if let Some(rest) = line.strip_prefix("deb ") {
                rest.split_whitespace().find(|w| w.contains("://"))
            } else {
                None
            };
            if let Some(u) = url
                && u.contains("debian")
                && !u.contains("security")
            {
                return u.to_string();
            }
        }
    }
    "http://deb.debian.org/debian".into()
}

/// Makes the base image when it is missing.
fn base_image() -> Result<()> {
    if image_exists(BASE) {
        return Ok(());
    }
    let dir = root().join("target/image");
    let rootfs = dir.join("rootfs");
    if rootfs.exists() {
        std::fs::remove_dir_all(&rootfs).context("removing a half-made rootfs")?;
    }
    std::fs::create_dir_all(&dir)?;
    let mirror = debian_mirror();
    println!("making {BASE} with debootstrap from {mirror} (about a minute)");
    run(Command::new("debootstrap")
        .args(["--variant=minbase", "bookworm"])
        .arg(&rootfs)
        .arg(&mirror)
        .stdout(Stdio::null()))
    .context("debootstrap (needs root)")?;
    let tar = Command::new("tar")
        .arg("-C")
        .arg(&rootfs)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .context("tar")?;
    let status = podman()
        .args(["import", "-", BASE])
        .stdin(tar.stdout.context("tar output")?)
        .stdout(Stdio::null())
        .status()
        .context("podman import")?;
    if !status.success() {
        bail!("podman import failed: {status}");
    }
    std::fs::remove_dir_all(&rootfs).ok();
    Ok(())
}

/// Builds the image and returns its reference.
pub fn build() -> Result<String> {
    setup::apt(&["podman", "runc", "debootstrap"])?;
    // The binary embeds the BPF object when it exists at compile time: build it first.
    build_ebpf()?;
    run(cargo().args(["build", "--release", "--locked", "-p", "junction"]))?;
    let context = root().join("target/image/context");
    std::fs::create_dir_all(&context)?;
    copy(
        &root().join("target/release/junction"),
        &context.join("junction"),
    )?;
    copy(
        &root().join("config/junction.toml"),
        &context.join("junction.toml"),
    )?;
    base_image()?;
    let version = env!("CARGO_PKG_VERSION");
    let mut c = podman();
    c.args(["build", "--format", "docker", "--quiet"])
        .args(ULIMITS)
        .args(["--build-arg", &format!("BASE={BASE}")])
        .args(["--build-arg", &format!("VERSION={version}")])
        .args(["-t", IMAGE, "-f"])
        .arg(root().join("Dockerfile"))
        .arg(&context);
    run(&mut c)?;
    // Each build leaves the image it replaced and its first stage untagged; remove those of
    // this Dockerfile (labelled), and nothing else of the machine's.
    for label in [
        "org.opencontainers.image.title=junction",
        "io.junction.stage=artifacts",
    ] {
        let pruned = podman()
            .args(["image", "prune", "--force", "--filter"])
            .arg(format!("label={label}"))
            .stdout(std::process::Stdio::null())
            .status();
        if !pruned.is_ok_and(|s| s.success()) {
            eprintln!(
                "xtask image: could not remove the untagged images labelled {label} (left as they are)"
            );
        }
    }
    Ok(IMAGE.to_string())
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(())
}

//! The eBPF part of the benchmark (root only): the `ebpf_bench` example measures, in one run, the
//! cost of `ioctl()` and `getppid()` with nothing attached, with empty programs on the same
//! tracepoints (the floor), and with Junction's programs; and the drain thread's CPU per
//! ring-buffer record.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

/// `key=value` figures from the `ebpf_bench` example, or why there are none.
pub type Figures = Result<BTreeMap<String, f64>, String>;

/// Runs it with the built `junction` at `bin`.
pub fn run(bin: &Path, smoke: bool) -> Result<Figures> {
    let calls = if smoke { "20000" } else { "200000" };
    let out = Command::new(bin.with_file_name("examples").join("ebpf_bench"))
        .args(["--calls", calls])
        .output()
        .context("running the ebpf_bench example")?;
    // Without root (or BPF) junction says why: reported, not fatal.
    if !out.status.success() {
        return Ok(Err(format!(
            "not measured: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let text = String::from_utf8(out.stdout)?;
    let figures = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter_map(|(k, v)| v.trim().parse().ok().map(|v| (k.to_string(), v)))
        .collect();
    Ok(Ok(figures))
}

/// The BENCHMARKS.md section.
pub fn report(f: &Figures) -> String {
    let mut out = String::from(
        "\n## eBPF probes\n\n\
         the `ebpf_bench` example (run by this benchmark as root): in one process and one run, the\n\
         median of 5 rounds of back-to-back calls with nothing attached, with empty programs on\n\
         `syscalls/sys_{enter,exit}_ioctl` (the floor: what any program on these tracepoints\n\
         costs), and with Junction's programs attached as the agent attaches them here\n\
         (tracepoints: this kernel has no kprobes), `/dev/null` watched, tracing this process\n\
         only. Calls: an ioctl whose command cannot be NVIDIA's (FIONREAD, rejected on the\n\
         command), an NVIDIA command on a file that is no NVIDIA device (`/dev/zero`: rejected\n\
         after the fd → file → inode walk), `RM_CONTROL` and `RM_ALLOC` (memory) on the watched\n\
         device (decoded and counted; the alloc also sends a ring-buffer record), and `getppid`\n\
         (no program on its tracepoint: the tax any syscall tracepoint brings to all syscalls).\n\n",
    );
    let f = match f {
        Ok(f) => f,
        Err(why) => {
            out.push_str(why);
            out.push('\n');
            return out;
        }
    };
    let g = |k: &str| f.get(k).copied().unwrap_or(f64::NAN);
    out.push_str(
        "| call | detached (ns) | floor: empty programs (ns) | Junction's programs (ns) | added over the floor (ns) |\n|---|---|---|---|---|\n",
    );
    for (key, label) in [
        ("other_cmd", "ioctl, not an NVIDIA command"),
        ("other_fd", "ioctl, NVIDIA command on another device"),
        ("matching_control", "ioctl `RM_CONTROL` on a watched device"),
        (
            "matching_alloc",
            "ioctl `RM_ALLOC` (memory) on a watched device",
        ),
        ("getppid", "getppid"),
    ] {
        let (d, fl, a) = (
            g(&format!("detached.{key}_ns")),
            g(&format!("floor.{key}_ns")),
            g(&format!("attached.{key}_ns")),
        );
        out.push_str(&format!(
            "| {label} | {d:.0} | {fl:.0} | {a:.0} | {:+.0} |\n",
            a - fl
        ));
    }
    out.push_str(&format!(
        "\nDrain: {:.0} ring-buffer records read with {:.0} lost (ring full), {:.3} s of the drain\n\
         thread's CPU: {:.3} µs per record. {} calls per round.\n",
        g("drain.records"),
        g("drain.ring_full"),
        g("drain.cpu_secs"),
        g("drain.us_per_record"),
        g("calls_per_round"),
    ));
    let added = |k: &str| g(&format!("attached.{k}_ns")) - g(&format!("floor.{k}_ns"));
    out.push_str(&format!(
        "\nAims: a non-matching ioctl within 50 ns of the floor — {:+.0} ns for a command that cannot be\n\
         NVIDIA's ({}), {:+.0} ns for an NVIDIA command on another device ({}: the six kernel reads of\n\
         the fd walk); under 1 µs added per matching ioctl over none attached (the floor included) — {:+.0} ns for `RM_CONTROL` ({}), {:+.0} ns\n\
         for `RM_ALLOC` with its record ({}).\n",
        added("other_cmd"),
        met(added("other_cmd") <= 50.0),
        added("other_fd"),
        met(added("other_fd") <= 50.0),
        g("attached.matching_control_ns") - g("detached.matching_control_ns"),
        met(g("attached.matching_control_ns") - g("detached.matching_control_ns") < 1000.0),
        g("attached.matching_alloc_ns") - g("detached.matching_alloc_ns"),
        met(g("attached.matching_alloc_ns") - g("detached.matching_alloc_ns") < 1000.0),
    ));
    out
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "not met" }
}

//! What reading the kernel's BTF costs in resident memory at start-up, each way the eBPF
//! source could read it: Junction's own offsets reader (`junction`); aya's parse (`aya`),
//! which aya 0.14's `EbpfLoader::new()` runs whether or not the object needs it (`loader`:
//! that constructor on a thread of its own); and that constructor on the thread the eBPF
//! source loads on, which Landlock keeps from reading the file (`confined`,
//! `sources::ebpf::confine`). Prints the peak RSS (`VmHWM`) before and after, and the RSS
//! once the memory is freed and released. Each way in its own process, as the agent's
//! allocator (jemalloc) would hold it.
//!
//! Usage: `btf_peak junction|aya|loader|confined [FILE]` (FILE defaults to
//! /sys/kernel/btf/vmlinux; `loader` and `confined` read that path, as aya does).

use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A `/proc/self/status` field in KiB.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(which), file) = (
        args.first(),
        args.get(1)
            .cloned()
            .unwrap_or_else(|| "/sys/kernel/btf/vmlinux".to_string()),
    ) else {
        eprintln!("usage: btf_peak junction|aya|loader|confined [FILE]");
        return ExitCode::from(2);
    };
    let before = status_kib("VmHWM:");
    let ok = match which.as_str() {
        "junction" => std::fs::File::open(&file)
            .map_err(|e| e.to_string())
            .and_then(|f| {
                junction::sources::ebpf::btf::offsets(f)
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
        "aya" => aya::Btf::parse_file(&file, aya::Endianness::default())
            .map(drop)
            .map_err(|e| e.to_string()),
        "loader" => std::thread::scope(|s| s.spawn(|| drop(aya::EbpfLoader::new())).join())
            .map_err(|_| "the thread panicked".to_string()),
        "confined" => {
            use junction::sources::ebpf::confine;
            confine::run_without(std::path::Path::new(confine::KERNEL_BTF), || {
                drop(aya::EbpfLoader::new())
            })
            .map_err(|e| e.to_string())
            .and_then(|((), confined)| match confined {
                confine::Confined::Yes => Ok(()),
                confine::Confined::No(why) => Err(format!("not confined: {why}")),
            })
        }
        _ => {
            eprintln!("usage: btf_peak junction|aya|loader|confined [FILE]");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = ok {
        eprintln!("btf_peak: {file}: {e}");
        return ExitCode::FAILURE;
    }
    let peak = status_kib("VmHWM:");
    junction::allocator::release();
    println!(
        "reader={which} peak_before_kib={before} peak_after_kib={peak} added_kib={} rss_after_release_kib={}",
        peak.saturating_sub(before),
        status_kib("VmRSS:")
    );
    ExitCode::SUCCESS
}

//! What reading the kernel's BTF costs in resident memory at start-up, each way the eBPF
//! source reads it: Junction's own offsets reader (`junction`) and aya's parse, which
//! `EbpfLoader::new()` runs whether or not the object needs it (`aya`). Prints the peak RSS
//! (`VmHWM`) before and after, and the RSS once the memory is freed and released. Each way in
//! its own process, as the agent's allocator (jemalloc) would hold it.
//!
//! Usage: `btf_peak junction|aya [FILE]` (FILE defaults to /sys/kernel/btf/vmlinux).

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
        eprintln!("usage: btf_peak junction|aya [FILE]");
        return ExitCode::from(2);
    };
    let before = status_kib("VmHWM:");
    let ok = match which.as_str() {
        "junction" => std::fs::read(&file)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                junction::sources::ebpf::btf::Btf::parse(&b)
                    .and_then(|b| b.offsets())
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }),
        "aya" => aya::Btf::parse_file(&file, aya::Endianness::default())
            .map(drop)
            .map_err(|e| e.to_string()),
        _ => {
            eprintln!("usage: btf_peak junction|aya [FILE]");
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

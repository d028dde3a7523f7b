//! What the eBPF probes cost per ioctl and per unrelated syscall, and the drain's CPU per
//! record (run by `cargo xtask bench`; needs root): prints `key=value` figures.
//!
//! Usage: `ebpf_bench [--calls N]`

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let calls = match args.iter().position(|a| a == "--calls") {
        Some(i) => match args.get(i + 1).and_then(|v| v.parse().ok()) {
            Some(n) => n,
            None => {
                eprintln!("ebpf_bench: --calls needs a number");
                return ExitCode::from(2);
            }
        },
        None => 200_000,
    };
    match junction::sources::ebpf::bench::run(calls) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ebpf_bench: {e}");
            ExitCode::FAILURE
        }
    }
}

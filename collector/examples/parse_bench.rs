//! The kernel-log parser alone: parses every line of FILE `--rounds N` times on one thread
//! and prints `lines=… relevant=… secs=… lines_per_sec=…` (run by `cargo xtask bench`).
//!
//! Usage: `parse_bench FILE [--rounds N]`

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(file) = args.first() else {
        eprintln!("usage: parse_bench FILE [--rounds N]");
        return ExitCode::from(2);
    };
    let rounds = match args.iter().position(|a| a == "--rounds") {
        Some(i) => match args.get(i + 1).and_then(|v| v.parse().ok()) {
            Some(n) => n,
            None => {
                eprintln!("parse_bench: --rounds needs a number");
                return ExitCode::from(2);
            }
        },
        None => 5,
    };
    match junction::sources::kmsg::parse_bench(std::path::Path::new(file), rounds) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("parse_bench: {file}: {e}");
            ExitCode::FAILURE
        }
    }
}

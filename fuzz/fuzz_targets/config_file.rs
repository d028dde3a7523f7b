//! The configuration file: any text is a configuration or a list of errors, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Err(e) = junction::config::parse_str(&text, std::path::Path::new("fuzz.toml")) {
        let _ = e.to_string();
    }
});

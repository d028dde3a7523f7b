//! `ipmi-sensors` output lines.
#![no_main]

use junction::sources::ipmi::parse_line;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for line in text.lines() {
        let _ = parse_line("bmc", line);
    }
});

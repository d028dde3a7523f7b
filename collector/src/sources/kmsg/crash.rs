//! Kernel panics of earlier boots, read once at start from what the crashed kernel left: the
//! pstore records (`/sys/fs/pstore/dmesg-<backend>-<id>`, or where systemd-pstore archives
//! them, `/var/lib/systemd/pstore/<stamp>/dmesg-…`) and kdump's dumps
//! (`/var/crash/<dir>/vmcore-dmesg.txt` from makedumpfile, `/var/crash/<stamp>/dmesg.<stamp>`
//! from kdump-tools). A record's panic line (`Kernel panic - not syncing: …`, the kernel's
//! `panic()` text) is a `kernel_panic` signature of the boot before this one: an event, its
//! counter, and an entry in the history under that boot.
//!
//! Only root and the kernel write those directories, and a file that someone else owns or
//! may write is not read. Each panic is reported once: the panic lines already reported
//! (the line with its printk stamp, which a copy of the record keeps) are kept in the state
//! directory (`crashes.json`, the last 64), so that neither a restart nor the next boot, nor
//! systemd-pstore moving the record, reports it again.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::model::Model;
use crate::model::signatures;
use crate::model::xid::Via;
use crate::model::xid::signatures::SignatureReport;

/// Files looked at per directory (and per subdirectory).
const MAX_FILES: usize = 256;
/// Bytes read of a record (its end: the panic is at the end).
const MAX_BYTES: u64 = 1 << 20;
/// Panics remembered as reported.
const MAX_SEEN: usize = 64;
/// The state file's name (without `.json`).
const SEEN: &str = "crashes";

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Seen {
    lines: Vec<String>,
}

/// Whether a file name is a crash record's.
fn is_record(name: &str) -> bool {
    // pstore's compressed records it could not decompress (`.enc.z`) are not text.
    (name.starts_with("dmesg-") && !name.ends_with(".enc.z"))
        || name.starts_with("dmesg.")
        || name == "vmcore-dmesg.txt"
}

/// The records under `dir`: in it and one level down, root's and written by nobody else.
fn records(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let list = |d: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(d)
            .map(|r| r.flatten().take(MAX_FILES).map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    for p in list(dir) {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let files = if meta.is_dir() { list(&p) } else { vec![p] };
        for f in files {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !is_record(name) {
                continue;
            }
            match std::fs::symlink_metadata(&f) {
                Ok(m) if m.is_file() && m.uid() == 0 && m.mode() & 0o022 == 0 => out.push(f),
                Ok(m) if m.is_file() => tracing::warn!(
                    file = %f.display(),
                    "a crash record that root does not own, or that others may write: not read"
                ),
                _ => {}
            }
        }
    }
    out.sort();
    out
}

/// A record line's message: without pstore's `<level>` and the printk stamp.
fn message(line: &str) -> &str {
    let l = line.trim_start();
    let l = match l.strip_prefix('<').and_then(|r| r.split_once('>')) {
        Some((lvl, rest))
            if !lvl.is_empty() && lvl.len() <= 3 && lvl.bytes().all(|b| b.is_ascii_digit()) =>
        {
            rest
        }
        _ => l,
    };
    super::parser::file_line(l).message
}

/// The panic a record shows: (the line as written, its message), and the last XID line
/// before it.
fn panic_of(text: &str) -> Option<(String, String, Option<String>)> {
    let sig = signatures::index_of("kernel_panic")?;
    let mut last_xid = None;
    for line in text.lines() {
        let m = message(line);
        if m.starts_with("NVRM: Xid ") {
            last_xid = Some(m.chars().take(200).collect::<String>());
        }
        if super::signatures::find(m).is_some_and(|f| f.sig == sig) {
            return Some((
                line.trim().chars().take(300).collect(),
                m.chars().take(300).collect(),
                last_xid,
            ));
        }
    }
    None
}

/// Reads the last `MAX_BYTES` of a file as text.
fn tail(path: &Path) -> Option<String> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(MAX_BYTES)))
        .ok()?;
    let mut buf = Vec::new();
    f.take(MAX_BYTES).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// The boot before this one, as the history knows it: the last boot it saw start, else the
/// last boot anything happened in (but a crash record's, which names an older boot).
fn previous_boot(model: &Model) -> String {
    let now = model.boot_id();
    let entries = model.history.entries();
    let before = |boots_only: bool| {
        entries.iter().rev().find(|e| {
            e.boot != now
                && if boots_only {
                    e.kind == "boot"
                } else {
                    e.code != "kernel_panic"
                }
        })
    };
    before(true)
        .or_else(|| before(false))
        .map_or_else(|| "earlier".to_string(), |e| e.boot.to_string())
}

/// Reports every panic in `dirs` not reported before; returns how many it reported.
pub fn scan(dirs: &[String], model: &Model) -> usize {
    let mut seen: Seen = model
        .with_state(|s| s.load(SEEN))
        .flatten()
        .unwrap_or_default();
    let Some(sig) = signatures::index_of("kernel_panic") else {
        return 0;
    };
    let before = previous_boot(model);
    let mut reported = 0;
    for dir in dirs {
        for file in records(Path::new(dir)) {
            let Some((key, msg, xid)) = tail(&file).as_deref().and_then(panic_of) else {
                continue;
            };
            if seen.lines.contains(&key) {
                continue;
            }
            let time = std::fs::metadata(&file)
                .and_then(|m| m.modified())
                .unwrap_or_else(|_| SystemTime::now());
            let message = match &xid {
                Some(x) => format!(
                    "{msg} (recovered from {}; the last XID before it: {x})",
                    file.display()
                ),
                None => format!("{msg} (recovered from {})", file.display()),
            };
            tracing::warn!(file = %file.display(), boot = %before, "a kernel panic of an earlier boot: {msg}");
            model.record_signature(SignatureReport {
                sig,
                via: Some(Via::Crash),
                message,
                time: Some(time),
                boot: Some(before.clone()),
                ..SignatureReport::default()
            });
            seen.lines.push(key);
            reported += 1;
        }
    }
    if reported > 0 {
        let drop = seen.lines.len().saturating_sub(MAX_SEEN);
        seen.lines.drain(..drop);
        if let Some(Err((file, e))) = model.with_state(|s| s.store(SEEN, &seen)) {
            tracing::warn!(file = %file.display(), error = %e, "cannot save which kernel panics were reported: a restart reports them again");
        }
    }
    reported
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_lines_read_as_the_kernel_wrote_them() {
        // fs/pstore/platform.c writes "%s#%d Part%u\n" and then kmsg_dump_get_buffer()'s
        // syslog form: "<%u>" and the printk stamp "[%5lu.%06lu] " (kernel/printk/printk.c).
        let pstore = "Panic#1 Part1\n<6>[ 8812.100000] nvidia-nvlink: Unregistered Nvlink Core\n<4>[ 8812.220001] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n<0>[ 8813.004211] Kernel panic - not syncing: Fatal exception in interrupt\n<0>[ 8813.004300] Kernel Offset: disabled\n";
        let (key, msg, xid) = panic_of(pstore).expect("a panic");
        assert_eq!(
            msg,
            "Kernel panic - not syncing: Fatal exception in interrupt"
        );
        assert!(key.starts_with("<0>[ 8813.004211]"), "{key}");
        assert!(xid.expect("an XID").contains("79, pid="));
        // makedumpfile --dump-dmesg: the printk stamp alone.
        let kdump = "[  401.337101] sysrq: Trigger a crash\n[  401.337233] Kernel panic - not syncing: sysrq triggered crash\n";
        assert_eq!(
            panic_of(kdump).map(|p| p.1),
            Some("Kernel panic - not syncing: sysrq triggered crash".to_string())
        );
        // An oops that did not panic, a clean shutdown's dump: nothing.
        assert_eq!(
            panic_of(
                "Oops#1 Part1\n<4>[ 1.0] BUG: kernel NULL pointer dereference, address: 0000000000000000\n"
            ),
            None
        );
        assert!(is_record("dmesg-efi-172844106701001") && is_record("dmesg-ramoops-0"));
        assert!(is_record("vmcore-dmesg.txt") && is_record("dmesg.202611301200"));
        assert!(!is_record("dmesg-efi-1.enc.z") && !is_record("console-ramoops-0"));
    }
}

//! The fabric manager's log (`/var/log/fabricmanager.log`): NVSwitch fatal and non-fatal
//! errors, a topology that matches no supported system, GPUs lost from a multicast team —
//! the catalog's `fm_*` signatures (`model::signatures`), each an event, a counter and, for
//! the fatal ones, a node reason.
//!
//! Followed by position: each poll reads the lines appended since the last (at most 1 MiB),
//! a rotated or truncated file from its start; the position is saved with what it counted, so
//! that a restart neither counts a line twice nor skips one. A log seen for the first time is
//! read from its end: what the fabric manager wrote before Junction first looked is not new.
//! Only a log root owns and nobody else may write is read (the fabric manager runs as root).
//! One poll at a time reads it in the process ([`FileLease`]): a poll that a restart of the
//! source left behind still in its read keeps the file, and the next start's poll skips its
//! turn rather than count the same lines again.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::time::SystemTime;

use crate::model::Model;
use crate::model::xid::signatures::SignatureReport;
use crate::model::xid::{Checkpoint, FileCursor, FileLease, Via};
use crate::sources::kmsg::signatures::{find, fm_message};

/// Bytes read per poll.
const MAX_READ: u64 = 1 << 20;
/// A longer line is skipped.
const MAX_LINE: usize = 64 * 1024;

/// Reads what the log gained since the last poll; returns the signatures recorded.
pub fn poll(path: &str, model: &Model, warned: &mut bool) -> usize {
    let Ok(meta) = std::fs::metadata(path) else {
        return 0;
    };
    if meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        if !std::mem::replace(warned, true) {
            tracing::warn!(
                file = path,
                "the fabric manager log is not root's alone (others may write it): not read"
            );
        }
        return 0;
    }
    let Some(_lease) = FileLease::take(path) else {
        tracing::debug!(
            file = path,
            "another poll is reading the fabric manager log; skipped"
        );
        return 0;
    };
    let start = match model.file_cursor(path) {
        Some(c) if c.inode == meta.ino() && c.offset <= meta.len() => c.offset,
        // Rotated or truncated: from the start of the new file.
        Some(_) => 0,
        // Never seen: from its end.
        None => {
            model.set_file_cursor(
                path,
                FileCursor {
                    inode: meta.ino(),
                    offset: meta.len(),
                },
            );
            return 0;
        }
    };
    let Ok(mut f) = std::fs::File::open(Path::new(path)) else {
        return 0;
    };
    if f.seek(SeekFrom::Start(start)).is_err() {
        return 0;
    }
    let mut buf = Vec::new();
    if f.take(MAX_READ).read_to_end(&mut buf).is_err() {
        return 0;
    }
    let path_arc: std::sync::Arc<str> = path.into();
    let mut offset = start;
    let mut found = 0;
    // Only whole lines: a line the fabric manager is still writing waits for the next poll.
    let whole = buf.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    for raw in buf[..whole].split_inclusive(|b| *b == b'\n') {
        offset += raw.len() as u64;
        let at = Checkpoint::File(
            path_arc.clone(),
            FileCursor {
                inode: meta.ino(),
                offset,
            },
        );
        let line = String::from_utf8_lossy(&raw[..raw.len().min(MAX_LINE)]);
        let message = fm_message(&line);
        model.checkpointed(at, || {
            if raw.len() > MAX_LINE {
                return;
            }
            if let Some(m) = find(message) {
                found += 1;
                model.record_signature(SignatureReport {
                    sig: m.sig,
                    via: Some(Via::File),
                    message: message.to_string(),
                    time: Some(SystemTime::now()),
                    ..SignatureReport::default()
                });
            }
        });
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Metric;
    use std::io::Write as _;

    fn counted(m: &Model) -> f64 {
        m.sets()
            .iter()
            .flat_map(|s| s.iter())
            .filter(|s| s.metric == Metric::KmsgSignatures)
            .map(|s| s.value)
            .sum()
    }

    fn fatal(port: u32) -> String {
        // The reference's line (gpud's example, node-fabric-and-bus.md §4.5), port varied.
        format!(
            "[Jul 23 2024 07:53:55] [ERROR] [tid 841] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port {port}\n"
        )
    }

    /// A poll that finds the log held by another (a poll a restart left behind) skips its
    /// turn and moves nothing; the lines it skipped are counted once, by the next poll.
    #[test]
    fn a_log_another_poll_is_reading_is_left_to_it() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(std::env::var_os("CI").is_none(), "CI runs this as root");
            eprintln!("skipped: only a root-owned log is read");
            return;
        }
        let dir = std::env::temp_dir().join(format!("junction-fmlog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("fabricmanager.log").to_string_lossy().to_string();
        std::fs::write(&path, fatal(1)).expect("log");
        let m = Model::default();
        let mut warned = false;
        assert_eq!(
            poll(&path, &m, &mut warned),
            0,
            "read from its end at first"
        );
        let append = |s: String| {
            std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .expect("open")
                .write_all(s.as_bytes())
                .expect("write");
        };
        append(fatal(2));
        let before = m.file_cursor(&path);
        let other = FileLease::take(&path).expect("nobody reads it");
        assert_eq!(poll(&path, &m, &mut warned), 0);
        assert_eq!(m.file_cursor(&path), before, "the position is not moved");
        assert_eq!(counted(&m), 0.0);
        drop(other);
        assert_eq!(poll(&path, &m, &mut warned), 1);
        assert_eq!(counted(&m), 1.0);
        assert_eq!(poll(&path, &m, &mut warned), 0, "not again");
        assert_eq!(counted(&m), 1.0);
        assert!(FileLease::take(&path).is_some(), "given back after a poll");
        assert!(!warned);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

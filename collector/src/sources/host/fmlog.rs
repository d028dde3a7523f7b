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

use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::time::SystemTime;

use crate::model::Model;
use crate::model::xid::signatures::SignatureReport;
use crate::model::xid::{Checkpoint, FileCursor, Via};
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

//! Kernel-log files, followed like `tail -F`. `linemux` (inotify) says when a file grew or was
//! replaced; the lines are read here, from a position of our own, (inode, bytes consumed),
//! saved with the XID counters. `linemux` alone keeps no position (a restart would miss or
//! replay lines) and misses a rotation whose new file is written before it has re-armed its
//! directory watch; reading from our own handle keeps the rest of a rotated file (still
//! readable through the open handle) and starts the new one at its first byte. A 250 ms
//! check backs the notifications up.
//!
//! At start-up, what was appended to the same file while Junction was down is read first;
//! after a rotation while it was down, the new file is read from its start; without a saved
//! position the file's past is not read (as `tail -f`).

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::Input;
use super::parser::Parser;
use crate::internal_events::{InternalEvent, KmsgFileFailed};
use crate::model::Model;
use crate::model::xid::{Checkpoint, FileCursor};
use crate::shutdown::Shutdown;

/// The longest line read (the kernel's own records are at most 8 KiB); a longer one is
/// skipped whole and counted as ignored, never held.
pub const MAX_LINE: usize = 64 * 1024;

struct Followed {
    path: Arc<str>,
    parser: Parser,
    reader: Option<BufReader<std::fs::File>>,
    /// The position after the last complete line (what a restart resumes from).
    cursor: FileCursor,
    /// The bytes of a line whose newline has not been written yet.
    partial: Vec<u8>,
    /// Bytes of an over-long line already skipped.
    skipped: u64,
}

impl Followed {
    fn open(path: &str, saved: Option<FileCursor>) -> Self {
        let mut f = Followed {
            path: path.into(),
            parser: Parser::default(),
            reader: None,
            cursor: FileCursor::default(),
            partial: Vec::new(),
            skipped: 0,
        };
        let Ok(file) = std::fs::File::open(path) else {
            return f;
        };
        let Ok(meta) = file.metadata() else { return f };
        let from = match saved {
            None => meta.len(),
            Some(c) if c.inode == meta.ino() && c.offset <= meta.len() => c.offset,
            // Rotated or truncated while Junction was down.
            Some(_) => 0,
        };
        let mut r = BufReader::with_capacity(64 * 1024, file);
        if r.seek(SeekFrom::Start(from)).is_ok() {
            f.cursor = FileCursor {
                inode: meta.ino(),
                offset: from,
            };
            f.reader = Some(r);
        }
        f
    }

    /// Reads every complete line up to the end. Each line is counted and the position moved
    /// past it as one step; bytes that are not UTF-8 are replaced, not dropped.
    fn drain(&mut self, input: &Input, model: &Model) {
        let Some(r) = &mut self.reader else { return };
        loop {
            let room = (MAX_LINE + 1).saturating_sub(self.partial.len()) as u64;
            match r.by_ref().take(room).read_until(b'\n', &mut self.partial) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    KmsgFileFailed {
                        path: &self.path,
                        error: &e,
                    }
                    .emit(model);
                    break;
                }
            }
            if self.partial.last() == Some(&b'\n') {
                self.cursor.offset += self.partial.len() as u64 + self.skipped;
                let at = Checkpoint::File(self.path.clone(), self.cursor.clone());
                input.read(1);
                if self.skipped > 0 {
                    model.checkpointed(at, || input.ignored("lines over 64 KiB"));
                } else {
                    let text = String::from_utf8_lossy(&self.partial[..self.partial.len() - 1]);
                    let parser = &mut self.parser;
                    model.checkpointed(at, || {
                        input.file_line(parser, &text, SystemTime::now(), model);
                    });
                }
                input.tick(model);
                self.partial.clear();
                self.skipped = 0;
            } else if self.partial.len() > MAX_LINE {
                // Over-long: skipped up to its newline, never held.
                self.skipped += self.partial.len() as u64;
                self.partial.clear();
            } else {
                // The end of the file, in the middle of a line: the rest comes later.
                break;
            }
        }
    }

    /// Follows a rotation (another inode at the path) or a truncation.
    fn recheck(&mut self, input: &Input, model: &Model) {
        let Ok(meta) = std::fs::metadata(&*self.path) else {
            return;
        };
        if self.reader.is_some() && meta.ino() == self.cursor.inode {
            if meta.len() < self.cursor.offset + self.partial.len() as u64 + self.skipped {
                // Truncated in place: from the start.
                if let Some(r) = &mut self.reader
                    && r.seek(SeekFrom::Start(0)).is_ok()
                {
                    self.cursor.offset = 0;
                    self.partial.clear();
                    self.skipped = 0;
                }
            }
            return;
        }
        // The rest of the old file first (its handle still reads it), then the new one.
        self.drain(input, model);
        let file = std::fs::File::open(&*self.path);
        if let Err(e) = &file
            && e.kind() != std::io::ErrorKind::NotFound
        {
            KmsgFileFailed {
                path: &self.path,
                error: e,
            }
            .emit(model);
        }
        if let Ok(file) = file {
            self.reader = Some(BufReader::with_capacity(64 * 1024, file));
            self.cursor = FileCursor {
                inode: meta.ino(),
                offset: 0,
            };
            self.partial.clear();
            self.skipped = 0;
            self.parser = Parser::default();
        }
    }
}

/// Follows the files until shutdown.
pub async fn run(paths: Vec<String>, input: Input, model: Arc<Model>, shutdown: Shutdown) {
    let mut notify = match linemux::MuxedLines::new() {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the kernel-log files (inotify); checking them every 250 ms instead");
            None
        }
    };
    let mut followed = Vec::new();
    for path in paths {
        if let Some(n) = &mut notify
            && let Err(e) = n.add_file(&path).await
        {
            tracing::warn!(file = %path, error = %e, "cannot watch the kernel-log file; checking it every 250 ms instead");
        }
        let mut f = Followed::open(&path, model.file_cursor(&path));
        f.drain(&input, &model);
        model.set_file_cursor(&f.path, f.cursor.clone());
        tracing::info!(file = %path, "following the kernel-log file");
        followed.push(f);
    }
    let mut check = tokio::time::interval(Duration::from_millis(250));
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let woke = async {
            match &mut notify {
                Some(n) => n.next_line().await.map(|_| ()),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shutdown.wait() => break,
            _ = check.tick() => {
                for f in &mut followed {
                    f.recheck(&input, &model);
                    f.drain(&input, &model);
                    model.set_file_cursor(&f.path, f.cursor.clone());
                }
                input.tick(&model);
            }
            r = woke => {
                if r.is_err() {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                for f in &mut followed {
                    f.drain(&input, &model);
                }
            }
        }
    }
    for f in &mut followed {
        f.drain(&input, &model);
        model.set_file_cursor(&f.path, f.cursor.clone());
    }
    model.flush_xids(true);
}

/// Appends `chunks` one by one to a new file in `dir`, following it as the source does after
/// each; checks that the saved position is always the end of the last complete line, and
/// that no more than [`MAX_LINE`] bytes of an unfinished line are ever held. For the fuzz
/// target.
#[doc(hidden)]
pub fn follow_chunks(model: &Model, dir: &std::path::Path, chunks: &[&[u8]]) {
    use std::io::Write as _;
    let path = dir.join("followed.log");
    let _ = std::fs::remove_file(&path);
    let Ok(mut w) = std::fs::File::create(&path) else {
        return;
    };
    let input = Input::new(super::Via::File, true, Arc::new(super::Stats::default()));
    let mut f = Followed::open(&path.to_string_lossy(), Some(FileCursor::default()));
    let mut written: Vec<u8> = Vec::new();
    for c in chunks {
        if w.write_all(c).is_err() {
            return;
        }
        written.extend_from_slice(c);
        f.drain(&input, model);
        let complete = written
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i as u64 + 1);
        assert_eq!(
            f.cursor.offset, complete,
            "the position is the last complete line's end"
        );
        assert!(
            f.partial.len() <= MAX_LINE + 1,
            "an unfinished line is held only up to the cap"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Metric;
    use crate::model::xid::Via;
    use std::io::Write;

    fn xids(m: &Model) -> f64 {
        m.sets()
            .iter()
            .flat_map(|s| s.iter())
            .filter(|s| s.metric == Metric::XidErrors)
            .map(|s| s.value)
            .sum()
    }

    /// A line written in pieces is read once, whole, and the saved position is the end of
    /// the last complete line at every step; a line with bytes that are not UTF-8 still
    /// counts; a line over [`MAX_LINE`] is skipped whole, never held.
    #[test]
    fn partial_lines_bad_bytes_and_long_lines_keep_the_position_exact() {
        let dir = std::env::temp_dir().join(format!("junction-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("kern.log");
        std::fs::write(&path, b"").expect("file");
        let path = path.to_string_lossy().to_string();
        let m = Model::default();
        let input = Input::new(Via::File, false, Arc::new(super::super::Stats::default()));
        let mut f = Followed::open(&path, Some(FileCursor::default()));
        let mut w = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        let line = b"Dec  1 11:00:00 node kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=1, x\n";
        let mut written = 0u64;
        for piece in [&line[..10], &line[10..30], &line[30..50], &line[50..]] {
            w.write_all(piece).expect("write");
            written += piece.len() as u64;
            f.drain(&input, &m);
            let done = if written == line.len() as u64 {
                written
            } else {
                0
            };
            assert_eq!(f.cursor.offset, done, "after {written} bytes");
        }
        assert_eq!(xids(&m), 1.0);
        let mut bad =
            b"Dec  1 11:00:01 node kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=2, \xff\xfe\n"
                .to_vec();
        w.write_all(&bad).expect("write");
        f.drain(&input, &m);
        assert_eq!(
            xids(&m),
            2.0,
            "a line with bytes that are not UTF-8 still counts"
        );
        written += bad.len() as u64;
        bad = vec![b'x'; MAX_LINE * 3];
        bad.push(b'\n');
        w.write_all(&bad).expect("write");
        written += bad.len() as u64;
        w.write_all(line).expect("write");
        written += line.len() as u64;
        f.drain(&input, &m);
        assert_eq!(f.cursor.offset, written);
        assert!(f.partial.capacity() <= 2 * MAX_LINE + 2);
        assert_eq!(xids(&m), 3.0, "the line after the long one");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

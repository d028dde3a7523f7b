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
//!
//! One reader a file in the process: a reader that a restart of the source left behind (a
//! sibling thread's panic stopped it, and it was still in a read past the shutdown deadline)
//! keeps its file until it ends, and the next start's reader waits for it, then goes on from
//! the position it saved, instead of counting the same lines again. A reader reads at most
//! [`MAX_TURN`] bytes of a file before it looks at the shutdown signal again, so a backlog
//! of gigabytes neither holds a stop past its deadline nor is read twice.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::Input;
use super::parser::Parser;
use crate::internal_events::{InternalEvent, KmsgFileFailed};
use crate::model::Model;
use crate::model::xid::{Checkpoint, FileCursor, FileLease};
use crate::shutdown::Shutdown;

/// The longest line read (the kernel's own records are at most 8 KiB); a longer one is
/// skipped whole and counted as ignored, never held.
pub const MAX_LINE: usize = 64 * 1024;

/// The most bytes of one file read in one turn, between two looks at the shutdown signal.
pub const MAX_TURN: u64 = 4 * 1024 * 1024;

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

    /// Reads every complete line up to the end, or [`MAX_TURN`] bytes: true when it stopped
    /// for the latter, with more to read. Each line is counted and the position moved past it
    /// as one step; bytes that are not UTF-8 are replaced, not dropped.
    fn drain(&mut self, input: &Input, model: &Model) -> bool {
        let Some(r) = &mut self.reader else {
            return false;
        };
        let start = self.cursor.offset + self.partial.len() as u64 + self.skipped;
        loop {
            if self.cursor.offset + self.partial.len() as u64 + self.skipped - start >= MAX_TURN {
                return true;
            }
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
        false
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
        // The rest of the old file first (its handle still reads it), then the new one (at a
        // later turn, if the rest is more than one).
        if self.drain(input, model) {
            return;
        }
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
    for path in &paths {
        if let Some(n) = &mut notify
            && let Err(e) = n.add_file(path).await
        {
            tracing::warn!(file = %path, error = %e, "cannot watch the kernel-log file; checking it every 250 ms instead");
        }
    }
    // Each file once no other reader of the process has it (see the module's documentation);
    // a path listed twice is one file, read once (it would wait for itself).
    let mut waiting = paths;
    let mut seen = BTreeSet::new();
    waiting.retain(|p| seen.insert(p.clone()));
    let mut followed: Vec<(FileLease, Followed)> = Vec::new();
    let mut backlog = take_free(&mut waiting, &mut followed, &input, &model, true);
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
            biased;
            () = shutdown.wait() => break,
            _ = check.tick() => {
                backlog = take_free(&mut waiting, &mut followed, &input, &model, false);
                for (_, f) in &mut followed {
                    f.recheck(&input, &model);
                    backlog |= f.drain(&input, &model);
                    model.set_file_cursor(&f.path, f.cursor.clone());
                }
                input.tick(&model);
            }
            r = woke => {
                if r.is_err() {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                backlog = drain_all(&mut followed, &input, &model);
            }
            // A turn for files with more to read, after a look at the signal.
            () = std::future::ready(()), if backlog => {
                backlog = drain_all(&mut followed, &input, &model);
            }
        }
    }
    // One last turn each; what is left is read at the next start, from the saved position.
    for (_, f) in &mut followed {
        f.drain(&input, &model);
        model.set_file_cursor(&f.path, f.cursor.clone());
    }
    model.flush_xids(true);
}

/// A turn of each followed file; true when one has more to read.
fn drain_all(followed: &mut [(FileLease, Followed)], input: &Input, model: &Model) -> bool {
    let mut more = false;
    for (_, f) in followed {
        more |= f.drain(input, model);
    }
    more
}

/// Opens the files of `waiting` that no other reader has, from their saved positions, and
/// reads a turn of each; true when one has more to read. The first time, says which files
/// wait.
fn take_free(
    waiting: &mut Vec<String>,
    followed: &mut Vec<(FileLease, Followed)>,
    input: &Input,
    model: &Model,
    first: bool,
) -> bool {
    let mut more = false;
    waiting.retain(|path| {
        let Some(lease) = FileLease::take(path) else {
            if first {
                tracing::warn!(file = %path, "the kernel-log file is still read by the source's previous start (a reader left behind at its restart); following it once that reader stops");
            }
            return true;
        };
        let mut f = Followed::open(path, model.file_cursor(path));
        more |= f.drain(input, model);
        model.set_file_cursor(&f.path, f.cursor.clone());
        tracing::info!(file = %path, "following the kernel-log file");
        followed.push((lease, f));
        false
    });
    more
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
        while f.drain(&input, model) {}
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

    fn append(path: &str, bytes: &[u8]) {
        std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .expect("open")
            .write_all(bytes)
            .expect("write");
    }

    fn xid_line(pid: u32) -> String {
        format!("Dec  1 11:00:00 node kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid={pid}, x\n")
    }

    /// A reader that a restart of the source left behind keeps its file: the next start's
    /// reader does not read it meanwhile, and once the old one stops goes on from the
    /// position it saved. Every line is counted once (with two readers at once, the second
    /// line would be counted by both).
    #[test]
    fn a_file_still_read_by_the_previous_start_is_followed_once_that_reader_stops() {
        let dir = std::env::temp_dir().join(format!("junction-lease-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("kern.log").to_string_lossy().to_string();
        std::fs::write(&path, b"").expect("file");
        let m = Arc::new(Model::default());
        let stats = Arc::new(super::super::Stats::default());
        // The previous start's reader: it holds the file and has counted its first line.
        let lease = FileLease::take(&path).expect("no reader yet");
        let input = Input::new(Via::File, false, stats.clone());
        let mut old = Followed::open(&path, Some(FileCursor::default()));
        append(&path, xid_line(1).as_bytes());
        assert!(!old.drain(&input, &m));
        assert_eq!(xids(&m), 1.0);

        // The next start's.
        let shutdown = Shutdown::default();
        let next = {
            let (m, sd, path) = (m.clone(), shutdown.clone(), path.clone());
            let input = Input::new(Via::File, false, stats);
            std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime")
                    .block_on(run(vec![path], input, m, sd));
            })
        };
        append(&path, xid_line(2).as_bytes());
        std::thread::sleep(Duration::from_millis(1200));
        assert_eq!(xids(&m), 1.0, "not read while the old reader has the file");
        // The old reader was held, not dead: it reads the second line, then ends.
        assert!(!old.drain(&input, &m));
        assert_eq!(xids(&m), 2.0);
        drop(old);
        drop(lease);
        append(&path, xid_line(3).as_bytes());
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while xids(&m) < 3.0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(xids(&m), 3.0, "the third line, once; the second not again");
        shutdown.trigger();
        next.join().expect("the reader ends");
        assert!(
            FileLease::take(&path).is_some(),
            "given back when the reader ends"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A backlog larger than a turn is read in turns of at most [`MAX_TURN`] bytes, each
    /// ending at a line's end, and all of it is counted once.
    #[test]
    fn a_backlog_is_read_in_turns() {
        let dir = std::env::temp_dir().join(format!("junction-turns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("kern.log").to_string_lossy().to_string();
        let filler = format!("{}\n", "y".repeat(999));
        let mut text = String::new();
        let mut written = 0;
        while (text.len() as u64) < MAX_TURN * 5 / 2 {
            for _ in 0..100 {
                text.push_str(&filler);
            }
            written += 1;
            text.push_str(&xid_line(written));
        }
        std::fs::write(&path, &text).expect("file");
        let m = Model::default();
        let input = Input::new(Via::File, false, Arc::new(super::super::Stats::default()));
        let mut f = Followed::open(&path, Some(FileCursor::default()));
        let mut turns = 0;
        let mut last = 0;
        while f.drain(&input, &m) {
            turns += 1;
            let read = f.cursor.offset - last;
            assert!(
                (MAX_TURN..MAX_TURN + 1000).contains(&read),
                "{read} bytes a turn"
            );
            assert_eq!(text.as_bytes()[f.cursor.offset as usize - 1], b'\n');
            last = f.cursor.offset;
        }
        assert_eq!(turns, 2);
        assert_eq!(f.cursor.offset, text.len() as u64);
        assert_eq!(xids(&m), f64::from(written));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

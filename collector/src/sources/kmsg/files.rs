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

use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::Input;
use super::parser::Parser;
use crate::model::Model;
use crate::model::xid::FileCursor;
use crate::shutdown::Shutdown;

struct Followed {
    path: String,
    parser: Parser,
    reader: Option<BufReader<std::fs::File>>,
    cursor: FileCursor,
    /// The start of a line whose newline has not been written yet.
    partial: String,
}

impl Followed {
    fn open(path: &str, saved: Option<FileCursor>) -> Self {
        let mut f = Followed {
            path: path.to_string(),
            parser: Parser::default(),
            reader: None,
            cursor: FileCursor::default(),
            partial: String::new(),
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

    /// Reads every complete line up to the end.
    fn drain(&mut self, input: &Input, model: &Model) {
        let Some(r) = &mut self.reader else { return };
        let mut line = std::mem::take(&mut self.partial);
        loop {
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    self.cursor.offset += n as u64;
                    if !line.ends_with('\n') {
                        // Not complete yet: keep it for the next read (its bytes are
                        // counted once it is).
                        self.cursor.offset -= line.len() as u64;
                        break;
                    }
                    input.read(1);
                    input.line(
                        &mut self.parser,
                        line.trim_end_matches('\n'),
                        SystemTime::now(),
                        model,
                    );
                    line.clear();
                }
            }
        }
        self.partial = line;
    }

    /// Follows a rotation (another inode at the path) or a truncation.
    fn recheck(&mut self, input: &Input, model: &Model) {
        let Ok(meta) = std::fs::metadata(&self.path) else {
            return;
        };
        if self.reader.is_some() && meta.ino() == self.cursor.inode {
            if meta.len() < self.cursor.offset {
                // Truncated in place: from the start.
                if let Some(r) = &mut self.reader
                    && r.seek(SeekFrom::Start(0)).is_ok()
                {
                    self.cursor.offset = 0;
                    self.partial.clear();
                }
            }
            return;
        }
        // The rest of the old file first (its handle still reads it), then the new one.
        self.drain(input, model);
        if let Ok(file) = std::fs::File::open(&self.path) {
            self.reader = Some(BufReader::with_capacity(64 * 1024, file));
            self.cursor = FileCursor {
                inode: meta.ino(),
                offset: 0,
            };
            self.partial.clear();
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

//! What the node remembers across reboots: an event history in the state directory
//! (`history.jsonl`, one JSON object a line), keyed by the boot id, holding each GPU's XIDs,
//! the NVSwitches' SXids, the kernel-log signatures and the health transitions, by GPU UUID
//! (so that it follows a GPU that moved bus address). Appended one whole line per write;
//! bounded by age (`health.history_max_age_secs`, 14 days) and size
//! (`health.history_max_bytes`, 4 MiB): past the size, the oldest half is dropped and the file
//! rewritten atomically. A line a kill cut short is skipped when the file is read: at most the
//! last event is lost, and nothing else is. At start only the file's last `max_bytes` are read,
//! a buffer at a time, and a rewrite writes entry by entry: neither holds the file's text, so
//! the history costs at start what it costs after (a full one read whole and rewritten through
//! a second copy had put about 15 MiB on the 8-GPU node's peak RSS).

use std::collections::HashSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::lock;

/// The file's name in the state directory.
pub const FILE: &str = "history.jsonl";

/// A string many entries hold alike (the boot, the GPU, the kind, the code): the history
/// keeps one allocation of each ([`History::append`] and [`History::open`] share it), so that
/// an entry costs its time, its detail and a pointer for each. Reads and compares as a `str`.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shared(Arc<str>);

impl Shared {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for Shared {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Shared {
    fn from(s: &str) -> Self {
        Shared(s.into())
    }
}

impl From<String> for Shared {
    fn from(s: String) -> Self {
        Shared(s.into())
    }
}

impl PartialEq<str> for Shared {
    fn eq(&self, o: &str) -> bool {
        *self.0 == *o
    }
}

impl PartialEq<&str> for Shared {
    fn eq(&self, o: &&str) -> bool {
        *self.0 == **o
    }
}

impl PartialEq<String> for Shared {
    fn eq(&self, o: &String) -> bool {
        *self.0 == **o
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.0, f)
    }
}

impl std::fmt::Display for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for Shared {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Shared {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Shared::from)
    }
}

/// One remembered event.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Entry {
    /// Unix time, milliseconds (an integer, so that it reads back as written).
    pub ms: u64,
    /// The boot it happened in.
    pub boot: Shared,
    /// The GPU (UUID, or `PCI-…` for one NVML does not know), switch, component or `node`.
    pub id: Shared,
    /// `xid`, `sxid`, `signature`, `health`.
    pub kind: Shared,
    /// The XID or SXid code, the signature, or the new state and reason.
    pub code: Shared,
    /// The process, where the line named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// A sentence (at most 200 characters).
    #[serde(default)]
    pub detail: String,
}

impl Entry {
    /// An entry now.
    pub fn now(boot: &str, id: &str, kind: &str, code: impl Into<String>, detail: &str) -> Entry {
        let code: String = code.into();
        Entry {
            ms: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            boot: capped(boot, 64).into(),
            id: capped(id, 96).into(),
            kind: kind.into(),
            code: capped(&code, 64).into(),
            pid: None,
            detail: capped(detail, 200).to_string(),
        }
    }
}

/// The first `n` characters of `s`.
fn capped(s: &str, n: usize) -> &str {
    s.char_indices().nth(n).map_or(s, |(at, _)| &s[..at])
}

/// The one copy of each [`Shared`] string the entries hold.
#[derive(Debug, Default)]
struct Strings(HashSet<Arc<str>>);

impl Strings {
    /// Points `e`'s shared strings at the kept copies (keeping theirs where new).
    fn share(&mut self, e: &mut Entry) {
        for s in [&mut e.boot, &mut e.id, &mut e.kind, &mut e.code] {
            match self.0.get(&*s.0) {
                Some(kept) => s.0 = kept.clone(),
                None => {
                    self.0.insert(s.0.clone());
                }
            }
        }
    }

    /// Forgets the strings no entry holds any more (after entries were dropped).
    fn prune(&mut self) {
        self.0.retain(|s| Arc::strong_count(s) > 1);
    }

    /// Bytes: each string with its reference counts, and the set's slots.
    fn memory(&self) -> usize {
        let each = 2 * std::mem::size_of::<usize>();
        self.0.iter().map(|s| s.len() + each).sum::<usize>()
            + self.0.capacity() * (std::mem::size_of::<Arc<str>>() + 1)
    }
}

#[derive(Debug, Default)]
struct Inner {
    max_bytes: u64,
    max_age: Duration,
    path: Option<PathBuf>,
    file: Option<std::fs::File>,
    /// Handed out as it is by [`History::entries`] (the health source reads it every
    /// cycle); a change copies it only while a reader still holds the last one, so that
    /// the history is held once, not once here and once for the readers.
    entries: Arc<Vec<Entry>>,
    strings: Strings,
    bytes: u64,
}

/// The history.
#[derive(Debug)]
pub struct History {
    inner: Mutex<Inner>,
}

impl Default for History {
    fn default() -> Self {
        Self::new(4 << 20, Duration::from_secs(14 * 86400))
    }
}

/// The longest line read back. An entry's fields are capped (boot 64, id 96, code 64 and
/// detail 200 characters), so one of ours is well under this; a longer line is skipped as it
/// is read, never held whole.
const MAX_LINE: usize = 4096;

/// Reads a history file: every whole line that parses, oldest first.
pub fn read(path: &Path) -> Vec<Entry> {
    let mut entries = Vec::new();
    read_tail(path, u64::MAX, &mut |e| entries.push(e));
    entries
}

/// Hands `each` every whole line of the file's last `max_bytes` that parses, oldest first:
/// the file is read a buffer at a time, never whole, and what lies before its last
/// `max_bytes` (older entries, which the size bound would drop) is not read at all.
fn read_tail(path: &Path, max_bytes: u64, each: &mut dyn FnMut(Entry)) {
    use std::io::{BufRead as _, Read as _, Seek as _};
    let Ok(mut f) = std::fs::File::open(path) else {
        return;
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let mut r = std::io::BufReader::with_capacity(64 * 1024, &mut f);
    if len > max_bytes {
        // Back one byte from the cut, then to the end of the line it falls in: a line that
        // starts right at the cut is kept whole.
        if r.seek(std::io::SeekFrom::Start(len - max_bytes - 1))
            .is_err()
            || skip_line(&mut r).is_err()
        {
            return;
        }
    }
    let mut line = Vec::with_capacity(512);
    loop {
        line.clear();
        match (&mut r)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.len() > MAX_LINE && line.last() != Some(&b'\n') {
            if skip_line(&mut r).is_err() {
                return;
            }
            continue;
        }
        if let Ok(e) = serde_json::from_slice::<Entry>(&line) {
            each(e);
        }
    }
}

/// Reads past the next newline (or to the end), holding none of it.
fn skip_line(r: &mut impl std::io::BufRead) -> std::io::Result<()> {
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(at) => {
                r.consume(at + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                r.consume(n);
            }
        }
    }
}

/// Counts the bytes written to it: a line's length without writing the line anywhere.
struct Count(u64);

impl std::io::Write for Count {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len() as u64;
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Bytes of `e`'s line, its newline included.
fn line_len(e: &Entry) -> u64 {
    let mut n = Count(0);
    // Writing an entry (strings and integers) into a counter cannot fail.
    let _ = serde_json::to_writer(&mut n, e);
    n.0 + 1
}

/// Writes `entries` one line each into `f`, through a buffer.
fn write_lines(f: &mut std::fs::File, entries: &[Entry]) -> std::io::Result<()> {
    let mut w = std::io::BufWriter::with_capacity(64 * 1024, f);
    for e in entries {
        serde_json::to_writer(&mut w, e)?;
        w.write_all(b"\n")?;
    }
    w.flush()
}

impl History {
    /// An empty history that keeps nothing on disk until [`History::open`].
    pub fn new(max_bytes: u64, max_age: Duration) -> Self {
        Self {
            inner: Mutex::new(Inner {
                max_bytes: max_bytes.max(4096),
                max_age,
                ..Inner::default()
            }),
        }
    }

    /// Sets the bounds (before [`History::open`]).
    pub fn set_bounds(&self, max_bytes: u64, max_age: Duration) {
        let mut i = lock(&self.inner);
        i.max_bytes = max_bytes.max(4096);
        i.max_age = max_age;
    }

    /// Opens `dir/history.jsonl`: reads what it holds (within the bounds), rewrites it
    /// compacted, and appends from then on. Without a directory nothing is kept on disk.
    pub fn open(&self, dir: Option<&Path>) {
        let mut i = lock(&self.inner);
        let Some(dir) = dir else { return };
        let path = dir.join(FILE);
        // Only the file's last `max_bytes` can be kept; each entry's strings are shared as it
        // is read, so that no entry's own copies outlive it.
        let mut entries = Vec::new();
        let mut strings = Strings::default();
        read_tail(&path, i.max_bytes, &mut |mut e| {
            strings.share(&mut e);
            entries.push(e);
        });
        i.strings = strings;
        i.entries = Arc::new(entries);
        i.path = Some(path);
        let max = i.max_bytes;
        self.compact(&mut i, max);
    }

    /// Remembers an entry.
    pub fn append(&self, mut e: Entry) {
        let mut i = lock(&self.inner);
        i.strings.share(&mut e);
        let Ok(mut line) = serde_json::to_string(&e) else {
            return;
        };
        line.push('\n');
        i.bytes += line.len() as u64;
        Arc::make_mut(&mut i.entries).push(e);
        if i.bytes > i.max_bytes {
            let half = i.max_bytes / 2;
            self.compact(&mut i, half);
            return;
        }
        if let Some(f) = i.file.as_mut()
            && f.write_all(line.as_bytes()).is_err()
        {
            tracing::warn!(
                "cannot append to the event history; it is kept in memory until the next rewrite"
            );
            i.file = None;
        }
    }

    /// Drops what is past the age bound and the oldest entries past `target` bytes, then
    /// rewrites the file in one step (a temporary file renamed over it).
    fn compact(&self, i: &mut Inner, target: u64) {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let oldest = now.saturating_sub(i.max_age.as_millis() as u64);
        Arc::make_mut(&mut i.entries).retain(|e| e.ms >= oldest);
        // The newest entries whose lines fit in `target`: measured, not written out, so that
        // a rewrite holds no second copy of the history.
        let mut keep = i.entries.len();
        let mut bytes: u64 = 0;
        for (n, e) in i.entries.iter().enumerate().rev() {
            let l = line_len(e);
            if bytes + l > target {
                break;
            }
            bytes += l;
            keep = n;
        }
        if keep > 0 {
            Arc::make_mut(&mut i.entries).drain(..keep);
        }
        i.strings.prune();
        i.bytes = bytes;
        let Some(path) = i.path.clone() else { return };
        let entries = &i.entries;
        let written = super::state::write_atomically(&path, |f| write_lines(f, entries))
            .and_then(|()| std::fs::OpenOptions::new().append(true).open(&path));
        match written {
            Ok(f) => i.file = Some(f),
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot write the event history; it is kept in memory only");
                i.file = None;
            }
        }
    }

    /// Every entry, oldest first (shared, not copied).
    pub fn entries(&self) -> Arc<Vec<Entry>> {
        lock(&self.inner).entries.clone()
    }

    /// Bytes the history holds in memory: its entries (the list's whole capacity), their
    /// details' buffers, and the one copy of each string they share. What the bound on the
    /// file's size (`health.history_max_bytes`) comes to in the heap.
    pub fn memory(&self) -> u64 {
        let i = lock(&self.inner);
        let details: usize = i.entries.iter().map(|e| e.detail.capacity()).sum();
        (i.entries.capacity() * std::mem::size_of::<Entry>() + details + i.strings.memory()) as u64
    }
}

#[cfg(test)]
mod tests;

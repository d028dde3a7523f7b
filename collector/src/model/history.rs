//! What the node remembers across reboots: an event history in the state directory
//! (`history.jsonl`, one JSON object a line), keyed by the boot id, holding each GPU's XIDs,
//! the NVSwitches' SXids, the kernel-log signatures and the health transitions, by GPU UUID
//! (so that it follows a GPU that moved bus address). Appended one whole line per write;
//! bounded by age (`health.history_max_age_secs`, 14 days) and size
//! (`health.history_max_bytes`, 4 MiB): past the size, the oldest half is dropped and the file
//! rewritten atomically. A line a kill cut short is skipped when the file is read: at most the
//! last event is lost, and nothing else is.

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

/// Reads a history file: every whole line that parses, oldest first.
pub fn read(path: &Path) -> Vec<Entry> {
    std::fs::read_to_string(path)
        .map(|t| {
            t.lines()
                .filter_map(|l| serde_json::from_str::<Entry>(l).ok())
                .collect()
        })
        .unwrap_or_default()
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
        let mut entries = read(&path);
        i.strings = Strings::default();
        for e in &mut entries {
            i.strings.share(e);
        }
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
        let lines: Vec<String> = i
            .entries
            .iter()
            .filter_map(|e| serde_json::to_string(e).ok())
            .collect();
        let mut keep = lines.len();
        let mut bytes: u64 = 0;
        for (n, l) in lines.iter().enumerate().rev() {
            if bytes + l.len() as u64 + 1 > target {
                break;
            }
            bytes += l.len() as u64 + 1;
            keep = n;
        }
        let drop = keep.min(i.entries.len());
        if drop > 0 {
            Arc::make_mut(&mut i.entries).drain(..drop);
        }
        i.strings.prune();
        i.bytes = bytes;
        let Some(path) = i.path.clone() else { return };
        let tmp = path.with_extension("jsonl.tmp");
        let text: String = lines[drop..].iter().map(|l| format!("{l}\n")).collect();
        let written = std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &path))
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
mod tests {
    use super::*;

    #[test]
    fn entries_share_their_strings_and_memory_counts_them_once() {
        let dir = testkit::temp_dir();
        let h = History::new(64 * 1024, Duration::from_secs(86400));
        h.open(Some(&dir));
        assert_eq!(h.memory(), 0);
        let detail = "fell off the bus";
        h.append(Entry::now("boot", "GPU-1", "xid", "79", detail));
        let one = h.memory();
        let least = std::mem::size_of::<Entry>() + detail.len() + "bootGPU-1xid79".len();
        assert!(one >= least as u64, "{one}");
        for _ in 0..99 {
            h.append(Entry::now("boot", "GPU-1", "xid", "79", detail));
        }
        // Each further entry: its place in the list (which doubles) and its detail, no
        // copy of the boot, the GPU, the kind or the code.
        let each = (std::mem::size_of::<Entry>() + detail.len()) as u64;
        let hundred = h.memory();
        assert!(
            (99 * each + one..2 * 100 * each + one).contains(&hundred),
            "{hundred} for 100 entries of {each} and one of {one}"
        );
        let same = |e: &[Entry]| {
            let (a, b) = (&e[0], &e[e.len() - 1]);
            [
                (&a.boot, &b.boot),
                (&a.id, &b.id),
                (&a.kind, &b.kind),
                (&a.code, &b.code),
            ]
            .iter()
            .all(|(x, y)| Arc::ptr_eq(&x.0, &y.0))
        };
        assert!(same(&h.entries()), "one copy of each string");
        // Read back from the file: shared the same way.
        let again = History::new(64 * 1024, Duration::from_secs(86400));
        again.open(Some(&dir));
        assert_eq!(again.entries().len(), 100);
        assert!(same(&again.entries()), "one copy of each string, read back");
        assert_eq!(again.memory(), hundred, "as much memory, read back");
    }

    #[test]
    fn a_string_no_entry_holds_is_forgotten() {
        let h = History::new(4096, Duration::from_secs(86400));
        h.append(Entry::now("boot-a", "GPU-1", "xid", "79", "before"));
        let kept = |h: &History, s: &str| lock(&h.inner).strings.0.contains(s);
        assert!(kept(&h, "boot-a"));
        // Past the bound the oldest half goes, and with it the first boot's only entry.
        for n in 0..200u32 {
            h.append(Entry::now("boot-b", "GPU-1", "xid", n.to_string(), "after"));
        }
        assert!(h.entries().iter().all(|e| e.boot == "boot-b"));
        assert!(
            !kept(&h, "boot-a"),
            "the first boot's id is gone with its entry"
        );
        assert!(!kept(&h, "0"), "and the codes of dropped entries");
        assert!(kept(&h, "boot-b") && kept(&h, "199"));
    }

    #[test]
    fn entries_are_shared_until_the_next_change() {
        let h = History::new(64 * 1024, Duration::from_secs(86400));
        h.append(Entry::now("b", "GPU-1", "xid", "79", "fell off the bus"));
        let a = h.entries();
        assert!(Arc::ptr_eq(&a, &h.entries()), "no copy per read");
        h.append(Entry::now("b", "GPU-1", "xid", "48", "DBE"));
        let b = h.entries();
        assert_eq!(
            b.iter().map(|e| e.code.as_str()).collect::<Vec<_>>(),
            ["79", "48"]
        );
        assert_eq!(a.len(), 1, "what was handed out stays as it was");
        drop((a, b));
        let held = Arc::as_ptr(&h.entries());
        h.append(Entry::now("b", "GPU-1", "xid", "31", "MMU"));
        let c = h.entries();
        assert_eq!(
            Arc::as_ptr(&c),
            held,
            "changed in place, not copied, while no reader holds it"
        );
        assert_eq!(c.len(), 3);
        assert_eq!(
            Arc::strong_count(&c),
            2,
            "one copy in memory: the history's, shared with the one reader"
        );
    }

    #[test]
    fn a_flood_stays_in_its_bounds_and_a_torn_line_loses_only_itself() {
        let dir = testkit::temp_dir();
        let h = History::new(64 * 1024, Duration::from_secs(86400));
        h.open(Some(&dir));
        for n in 0..100_000u32 {
            h.append(Entry::now(
                "boot-a",
                "GPU-1",
                "xid",
                n.to_string(),
                "an XID",
            ));
        }
        let size = std::fs::metadata(dir.join(FILE)).expect("file").len();
        assert!(size <= 64 * 1024, "{size} bytes");
        let on_disk = read(&dir.join(FILE));
        let mem = h.entries();
        assert_eq!(on_disk.len(), mem.len(), "memory and file hold as many");
        let differ = on_disk.iter().zip(mem.iter()).position(|(a, b)| a != b);
        assert_eq!(
            differ,
            None,
            "memory and file agree: {:?}",
            differ.map(|i| (&on_disk[i], &mem[i]))
        );
        assert_eq!(
            on_disk.last().map(|e| e.code.as_str()),
            Some("99999"),
            "the newest kept"
        );
        // A kill in the middle of a write: half a line at the end.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join(FILE))
            .expect("open");
        f.write_all(br#"{"ms":1000,"boot":"boot-a","id":"GPU-1","ki"#)
            .expect("torn");
        drop(f);
        let h2 = History::new(64 * 1024, Duration::from_secs(86400));
        h2.open(Some(&dir));
        assert!(
            h2.entries()[..] == on_disk[..],
            "everything but the torn line"
        );
        h2.append(Entry::now("boot-b", "GPU-1", "xid", "48", "after"));
        assert_eq!(
            read(&dir.join(FILE)).len(),
            on_disk.len() + 1,
            "the file was mended"
        );
        // Old entries age out.
        let h3 = History::new(64 * 1024, Duration::from_secs(1));
        let mut old = Entry::now("boot-0", "GPU-1", "xid", "48", "long ago");
        old.ms -= 10_000;
        h3.open(Some(&dir));
        h3.append(old);
        h3.open(Some(&dir));
        assert!(h3.entries().iter().all(|e| e.boot != "boot-0"));
    }
}

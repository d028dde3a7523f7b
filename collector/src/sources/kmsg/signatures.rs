//! Finding the catalog's signatures (`model::signatures`) in kernel messages: one
//! Aho-Corasick pass over the line for every entry's literals, and an entry's pattern only
//! where one of its literals is there, so that unrelated lines cost one scan.

use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use regex::Regex;

use crate::model::signatures::CATALOG;

/// How every catalog line begins (the kernel message's first word), or, for AER messages
/// (whose first word is the reporting driver's name), the text they all carry: the cheap
/// test a line must pass before the literals are searched. The tests feed a real or
/// composed line of every entry through [`find`], so an entry this misses fails them.
const STARTS: &[&str] = &[
    "NVRM: ",
    "GSP task",
    // The modules' own messages (`nvidia_peermem: Unknown symbol …`, `nvidia: …`) and
    // peermem's callback; not `nvidia-modeset:`'s routine lines.
    "nvidia_",
    "nvidia: ",
    "nvidia-peermem ",
    "mlx5_core ",
    "Out of memory",
    "Memory cgroup out of memory",
    "watchdog: ",
    "BUG: soft lockup",
    "NMI watchdog",
    "INFO: task ",
    "nvme nvme",
    "EXT4-fs ",
    "XFS (",
    "Kernel panic - not syncing",
    "nv-caps-imex ",
    // The fabric manager's log lines, once their `[date] [LEVEL] [tid N] ` is cut
    // (`fm_message`).
    "detected NVSwitch ",
    "detected number of NVSwitches",
    "failed to find the GPU handle",
];
static AER: LazyLock<memchr::memmem::Finder<'static>> =
    LazyLock::new(|| memchr::memmem::Finder::new(" AER: "));

/// A fabric manager log line's message: without its `[Jul 23 2024 07:53:55] [ERROR] [tid 841] `.
pub fn fm_message(line: &str) -> &str {
    let mut rest = line.trim_start();
    for _ in 0..3 {
        match rest.strip_prefix('[').and_then(|r| r.split_once("] ")) {
            Some((_, r)) => rest = r,
            None => break,
        }
    }
    rest.trim_end()
}

/// Whether `line` can be one of the catalog's.
fn plausible(line: &str) -> bool {
    STARTS.iter().any(|p| line.starts_with(p)) || AER.find(line.as_bytes()).is_some()
}

struct Matcher {
    /// Every literal there, overlapping. A contiguous NFA: the DFA aho-corasick would pick
    /// for these 50 literals takes 600 KB of the heap, this under 50 KB, for about 45 ns
    /// more a line searched (100 against 60 here), and only lines that pass [`plausible`]
    /// are searched: a kernel writes tens of lines a second.
    literals: AhoCorasick,
    /// Literal index → catalog index.
    owner: Vec<usize>,
    patterns: Vec<Regex>,
}

static MATCHER: LazyLock<Matcher> = LazyLock::new(|| {
    assert!(CATALOG.len() <= 128, "the candidate set is a u128");
    let mut lits = Vec::new();
    let mut owner = Vec::new();
    for (i, s) in CATALOG.iter().enumerate() {
        for a in s.anchors {
            lits.push(*a);
            owner.push(i);
        }
    }
    Matcher {
        literals: AhoCorasick::builder()
            .kind(Some(AhoCorasickKind::ContiguousNFA))
            .match_kind(MatchKind::Standard)
            .build(&lits)
            .expect("the catalog's literals"),
        owner,
        patterns: CATALOG
            .iter()
            .map(|s| Regex::new(s.pattern).expect("a catalog pattern"))
            .collect(),
    }
});

/// Bytes kept of a process name (the kernel's are at most 15) and of a disk's name.
const COMM_MAX: usize = 64;
const DEV_MAX: usize = 32;

/// `s` cut to at most `max` bytes, at a character boundary.
fn capped(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A signature found in a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigMatch<'a> {
    /// Index in the catalog.
    pub sig: usize,
    /// The PCI function the line is about (an AER message's source, else the `pci` group).
    pub pci: Option<&'a str>,
    /// The port that printed an AER message about another function.
    pub reporter: Option<&'a str>,
    /// A disk or file system.
    pub dev: Option<&'a str>,
    /// A process.
    pub pid: Option<u32>,
    /// Its name.
    pub comm: Option<&'a str>,
    /// The driver's own GPU number (`GPU6` in `NVRM: GPU6 …`).
    pub rm: Option<u32>,
}

/// The first catalog entry (in catalog order) whose pattern matches `line`.
pub fn find(line: &str) -> Option<SigMatch<'_>> {
    if !plausible(line) {
        return None;
    }
    let m = &*MATCHER;
    // The entries with a literal here, as a bit set: tried in catalog order, no allocation.
    let mut candidates = 0u128;
    for hit in m.literals.find_overlapping_iter(line) {
        candidates |= 1 << m.owner[hit.pattern().as_usize()];
    }
    if candidates == 0 {
        return None;
    }
    (0..CATALOG.len())
        .filter(|i| candidates & (1 << i) != 0)
        .find_map(|i| {
            let c = m.patterns[i].captures(line)?;
            let g = |n: &str| c.name(n).map(|x| x.as_str());
            Some(SigMatch {
                sig: i,
                pci: g("src").or(g("pci")),
                reporter: g("src").and(g("pci")),
                dev: g("dev").or(g("xdev")).map(|d| capped(d, DEV_MAX)),
                pid: g("pid").and_then(|p| p.parse().ok()),
                comm: g("comm").map(|c| capped(c, COMM_MAX)),
                rm: g("rm").and_then(|p| p.parse().ok()),
            })
        })
}

#[cfg(test)]
mod tests;

//! Where a process's resident memory lies, from `/proc/PID/smaps`: the soak reads it after the
//! warm-up and at the end, so that RSS that grows at a flat live heap can be put in its place.
//!
//! The kernel merges adjacent anonymous mappings with the same flags, so mappings are not
//! matched one to one between readings; they are summed by kind:
//! - `binary`: pages of the agent's own executable (code and data read from the file);
//! - `libraries and maps`: other file-backed mappings (the NVML library, glibc, …) and the
//!   BPF maps the agent maps (`anon_inode:bpf-map`: the ring buffer's pages);
//! - `[heap]`: glibc's main arena (the `brk` heap), which C code in the process — the NVML
//!   library — allocates from; Junction's own heap is jemalloc's, in anonymous mappings;
//! - `glibc arenas`: glibc's other arenas, each a mapping starting at a 64 MiB boundary with
//!   an inaccessible (`---p`) reserve after it that ends at the next;
//! - `thread stacks`: writable anonymous mappings right after an inaccessible guard of at most
//!   64 KiB (how glibc's `pthread_create` lays a stack out);
//! - `[stack]`: the main thread's stack;
//! - `other anonymous`: the rest — jemalloc's extents and anything else mapped anonymously.

use std::fmt::Write as _;

/// One mapping.
#[derive(Clone, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    perms: String,
    /// The path, `[heap]`, `[stack]`, … or empty.
    name: String,
    rss_kib: u64,
    anon_kib: u64,
}

/// The kinds, in the order the report lists them.
pub const KINDS: [&str; 7] = [
    "binary",
    "libraries and maps",
    "[heap]",
    "glibc arenas",
    "thread stacks",
    "[stack]",
    "other anonymous",
];

/// Resident KiB by kind (`KINDS`' order): (RSS, anonymous).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Breakdown(pub [(u64, u64); KINDS.len()]);

fn parse(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if let Some((a, b)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
        {
            let perms = words.next().unwrap_or_default().to_string();
            // offset, device, inode, then the name (which may hold spaces).
            let name = words.skip(3).collect::<Vec<_>>().join(" ");
            out.push(Mapping {
                start,
                end,
                perms,
                name,
                rss_kib: 0,
                anon_kib: 0,
            });
            continue;
        }
        let mut kib = || {
            words
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        if let Some(m) = out.last_mut() {
            match first {
                "Rss:" => m.rss_kib = kib(),
                "Anonymous:" => m.anon_kib = kib(),
                _ => {}
            }
        }
    }
    out
}

/// Sums `smaps` text by kind; `exe` is the agent's executable's path.
pub fn breakdown(text: &str, exe: &str) -> Breakdown {
    const ARENA: u64 = 64 << 20;
    let maps = parse(text);
    // A binary replaced while it runs reads `PATH (deleted)`.
    let deleted = format!("{exe} ");
    let mut out = Breakdown::default();
    for (i, m) in maps.iter().enumerate() {
        let prev = i.checked_sub(1).map(|j| &maps[j]);
        let next = maps.get(i + 1);
        let kind = if m.name == exe || m.name.starts_with(&deleted) {
            0
        } else if m.name.starts_with('/') || m.name.starts_with("anon_inode:") {
            1
        } else if m.name == "[heap]" {
            2
        } else if m.name.is_empty()
            && m.start.is_multiple_of(ARENA)
            && next.is_some_and(|n| {
                n.start == m.end && n.perms.starts_with("---") && n.end.is_multiple_of(ARENA)
            })
        {
            3
        } else if m.name.is_empty()
            && m.perms.starts_with("rw")
            && prev.is_some_and(|p| {
                p.end == m.start && p.perms.starts_with("---") && p.end - p.start <= 64 << 10
            })
        {
            4
        } else if m.name == "[stack]" {
            5
        } else if m.name.starts_with('[') {
            // [vdso], [vvar], [vsyscall]: neither grow.
            1
        } else {
            6
        };
        out.0[kind].0 += m.rss_kib;
        out.0[kind].1 += m.anon_kib;
    }
    out
}

/// Reads `/proc/PID/smaps` (`None` when it cannot be read).
pub fn read(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()
}

/// The report's lines for one run: each kind after the warm-up and at the end (KiB).
pub fn table(rows: &[(&str, Breakdown, Breakdown)]) -> String {
    let mut out = String::from(
        "| run | kind | RSS after warm-up (KiB) | RSS at end (KiB) | change (KiB) | of which anonymous (KiB) |\n|---|---|---|---|---|---|\n",
    );
    for (label, a, b) in rows {
        for (k, kind) in KINDS.iter().enumerate() {
            let _ = writeln!(
                out,
                "| {label} | {kind} | {} | {} | {:+} | {:+} |",
                a.0[k].0,
                b.0[k].0,
                b.0[k].0 as i64 - a.0[k].0 as i64,
                b.0[k].1 as i64 - a.0[k].1 as i64,
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(range: &str, perms: &str, name: &str, rss: u64, anon: u64) -> String {
        format!(
            "{range} {perms} 00000000 00:00 0          {name}\nSize: 4 kB\nRss: {rss} kB\nPss: {rss} kB\nAnonymous: {anon} kB\nVmFlags: rd wr\n"
        )
    }

    #[test]
    fn each_mapping_is_counted_once_by_its_kind() {
        let text = [
            map("5600000000-5600001000", "r-xp", "/usr/bin/junction", 900, 0),
            map("5600001000-5600002000", "rw-p", "/usr/bin/junction", 10, 10),
            map("5600100000-5600200000", "rw-p", "[heap]", 300, 300),
            // A glibc arena: 64 MiB aligned, its reserve up to the next boundary.
            map("7f0004000000-7f0004100000", "rw-p", "", 120, 120),
            map("7f0004100000-7f0008000000", "---p", "", 0, 0),
            // A thread stack: a 4 KiB guard, then the stack.
            map("7f0010000000-7f0010001000", "---p", "", 0, 0),
            map("7f0010001000-7f0010201000", "rw-p", "", 40, 40),
            // jemalloc's extents.
            map("7f0020000000-7f0020400000", "rw-p", "", 2000, 2000),
            map(
                "7f0030000000-7f0030100000",
                "r--p",
                "/usr/lib/libc.so.6",
                500,
                0,
            ),
            map("7ffd00000000-7ffd00021000", "rw-p", "[stack]", 24, 24),
            map(
                "7ffd00050000-7ffd00060000",
                "r--s",
                "anon_inode:bpf-map",
                64,
                0,
            ),
            map("7ffd00100000-7ffd00102000", "r-xp", "[vdso]", 8, 0),
        ]
        .concat();
        let b = breakdown(&text, "/usr/bin/junction");
        assert_eq!(
            b.0,
            [
                (910, 10),
                (572, 0),
                (300, 300),
                (120, 120),
                (40, 40),
                (24, 24),
                (2000, 2000)
            ]
        );
        assert!(table(&[("r", b, b)]).contains("| r | [heap] | 300 | 300 | +0 | +0 |"));
    }
}

//! Finding the catalog's signatures (`model::signatures`) in kernel messages: one
//! Aho-Corasick pass over the line for every entry's literals, and an entry's pattern only
//! where one of its literals is there, so that unrelated lines cost one scan.

use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, MatchKind};
use regex::Regex;

use crate::model::signatures::CATALOG;

struct Matcher {
    literals: AhoCorasick,
    /// Literal index → catalog index.
    owner: Vec<usize>,
    patterns: Vec<Regex>,
}

static MATCHER: LazyLock<Matcher> = LazyLock::new(|| {
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
    let m = &*MATCHER;
    let mut candidates: Vec<usize> = Vec::new();
    for hit in m.literals.find_overlapping_iter(line) {
        let i = m.owner[hit.pattern().as_usize()];
        if !candidates.contains(&i) {
            candidates.push(i);
        }
    }
    candidates.sort_unstable();
    candidates.into_iter().find_map(|i| {
        let c = m.patterns[i].captures(line)?;
        let g = |n: &str| c.name(n).map(|x| x.as_str());
        Some(SigMatch {
            sig: i,
            pci: g("src").or(g("pci")),
            reporter: g("src").and(g("pci")),
            dev: g("dev").or(g("xdev")),
            pid: g("pid").and_then(|p| p.parse().ok()),
            comm: g("comm"),
            rm: g("rm").and_then(|p| p.parse().ok()),
        })
    })
}

#[cfg(test)]
mod tests;

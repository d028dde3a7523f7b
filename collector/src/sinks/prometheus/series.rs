//! Each series' text from one render to the next: a series whose metric, GPU and attributes
//! are what they were at the same place in the last render has its `name{labels` copied
//! instead of written again, and only its value (and its GPU's identity, which can change)
//! is written anew.
//!
//! A series matches only on an exact comparison of everything its text is made of (its
//! GPU's id and each attribute's key and value, byte for byte), never on a hash: a label
//! value a tenant chooses (a process name, a pod's) cannot make another series' text be
//! written for it.

use crate::model::Sample;

/// The text and what it was made of, by metric and by place in the metric's list.
pub(super) struct Series {
    /// The address of the name table these were written with (legacy names or not).
    names: usize,
    families: Vec<Vec<Entry>>,
    /// Each entry's `name{labels` text.
    text: String,
    /// The ids and the attribute values that are not `'static`, copied.
    values: String,
    /// Each entry's attribute keys and values.
    attrs: Vec<(&'static str, Value)>,
    /// Entries in use, and entries replaced or dropped since the arenas were last emptied
    /// (their text still in them).
    live: usize,
    stale: usize,
}

/// Past this many stale entries (and more stale than live), the arenas are emptied and the
/// next render writes every series anew: memory stays within about twice the text in use.
const MIN_STALE: usize = 256;

#[derive(Clone, Copy, PartialEq, Eq)]
struct Span {
    at: u32,
    len: u32,
}

#[derive(Clone, Copy)]
enum Value {
    Static(&'static str),
    Copied(Span),
}

#[derive(Clone, Copy)]
struct Entry {
    /// `None`: not kept (a series that names an identity attribute itself is written anew
    /// every time: its text depends on its GPU's identity).
    kept: Option<Kept>,
}

#[derive(Clone, Copy)]
pub(super) struct Kept {
    id: Span,
    attrs: (u32, u32),
    text: Span,
    /// Whether the sample carries its own `hw.id`.
    pub own_id: bool,
    /// Whether the text has a label after its `{`.
    pub labels: bool,
}

/// The last id found equal to a kept one in this render (the snapshot's string by address,
/// and the span it equals): a metric's series go GPU by GPU, so most ids are compared once.
#[derive(Default)]
pub(super) struct Seen {
    id: (usize, usize),
    span: Option<Span>,
}

impl Series {
    pub(super) const fn new() -> Self {
        Self {
            names: 0,
            families: Vec::new(),
            text: String::new(),
            values: String::new(),
            attrs: Vec::new(),
            live: 0,
            stale: 0,
        }
    }

    /// Starts a render with the name table `names` (`metrics` entries).
    pub(super) fn begin(&mut self, names: usize, metrics: usize) {
        if self.names != names {
            self.clear();
            self.names = names;
        }
        if self.families.len() < metrics {
            self.families.resize_with(metrics, Vec::new);
        }
    }

    /// Ends a render: empties the arenas when most of what they hold is stale.
    pub(super) fn end(&mut self) {
        if self.stale > MIN_STALE && self.stale > self.live {
            self.clear();
        }
    }

    fn clear(&mut self) {
        self.families.iter_mut().for_each(Vec::clear);
        self.text.clear();
        self.values.clear();
        self.attrs.clear();
        self.live = 0;
        self.stale = 0;
    }

    /// The kept text of series `n` of metric `metric` where it was made of exactly `id` and
    /// `s`'s attributes.
    pub(super) fn find(
        &self,
        metric: usize,
        n: usize,
        id: &str,
        s: &Sample,
        seen: &mut Seen,
    ) -> Option<(Kept, &str)> {
        let k = self.families.get(metric)?.get(n)?.kept?;
        let same_id = (seen.id == (id.as_ptr() as usize, id.len()) && seen.span == Some(k.id))
            || self.span(&self.values, k.id) == id;
        if !same_id {
            return None;
        }
        *seen = Seen {
            id: (id.as_ptr() as usize, id.len()),
            span: Some(k.id),
        };
        let attrs = &self.attrs[k.attrs.0 as usize..k.attrs.1 as usize];
        let same = attrs.len() == s.attrs.len()
            && attrs.iter().zip(&s.attrs).all(|((k1, v1), (k2, v2))| {
                same(k1, k2)
                    && match v1 {
                        Value::Static(v) => same(v, v2),
                        Value::Copied(span) => self.span(&self.values, *span) == v2.as_ref(),
                    }
            });
        same.then(|| (k, self.span(&self.text, k.text)))
    }

    /// Keeps `text` as series `n` of `metric`, made of `id` and `s`'s attributes (`None`:
    /// forgets what was kept there).
    pub(super) fn keep(
        &mut self,
        metric: usize,
        n: usize,
        made_of: Option<(&str, &Sample, bool, bool)>,
        text: &str,
        seen: &mut Seen,
    ) {
        let kept = made_of.and_then(|(id, s, own_id, labels)| {
            let id_span = match seen.span {
                Some(span) if seen.id == (id.as_ptr() as usize, id.len()) => span,
                _ => push(&mut self.values, id)?,
            };
            *seen = Seen {
                id: (id.as_ptr() as usize, id.len()),
                span: Some(id_span),
            };
            let from = u32::try_from(self.attrs.len()).ok()?;
            for (k, v) in &s.attrs {
                let v = match v {
                    std::borrow::Cow::Borrowed(v) => Value::Static(v),
                    std::borrow::Cow::Owned(v) => Value::Copied(push(&mut self.values, v)?),
                };
                self.attrs.push((k, v));
            }
            let to = u32::try_from(self.attrs.len()).ok()?;
            Some(Kept {
                id: id_span,
                attrs: (from, to),
                text: push(&mut self.text, text)?,
                own_id,
                labels,
            })
        });
        let family = &mut self.families[metric];
        let entry = Entry { kept };
        if let Some(old) = family.get_mut(n) {
            if old.kept.is_some() {
                self.stale += 1;
                self.live -= 1;
            }
            *old = entry;
        } else {
            // Series are kept in order: `n` is the list's length here.
            family.push(entry);
        }
        if kept.is_some() {
            self.live += 1;
        }
    }

    /// Forgets the series of `metric` from place `len` on (the list is shorter now).
    pub(super) fn truncate(&mut self, metric: usize, len: usize) {
        let family = &mut self.families[metric];
        if family.len() > len {
            let gone = family[len..].iter().filter(|e| e.kept.is_some()).count();
            family.truncate(len);
            self.stale += gone;
            self.live -= gone;
        }
    }

    fn span<'a>(&self, arena: &'a str, span: Span) -> &'a str {
        &arena[span.at as usize..(span.at + span.len) as usize]
    }

    /// Entries kept (for tests).
    #[cfg(test)]
    pub(super) fn live(&self) -> usize {
        self.live
    }

    /// Entries replaced or dropped since the arenas were last emptied (for tests).
    #[cfg(test)]
    pub(super) fn stale(&self) -> usize {
        self.stale
    }
}

/// Appends `s` to `arena` (`None` past 4 GiB: that series is not kept).
fn push(arena: &mut String, s: &str) -> Option<Span> {
    let at = u32::try_from(arena.len()).ok()?;
    let len = u32::try_from(s.len()).ok()?;
    at.checked_add(len)?;
    arena.push_str(s);
    Some(Span { at, len })
}

/// Equal strings, by address first (the keys and most values are the same constants).
fn same(a: &str, b: &str) -> bool {
    (std::ptr::eq(a.as_ptr(), b.as_ptr()) && a.len() == b.len()) || a == b
}

impl Default for Series {
    fn default() -> Self {
        Self::new()
    }
}

//! The Prometheus text exposition format (0.0.4), rendered from a model snapshot.

use std::fmt::Write as _;

use crate::model::REGISTRY;
use crate::model::naming::LEGACY_PROMETHEUS_NAMES;
use crate::model::view::View;

/// Renders the exposition text.
///
/// A series' line is put together from texts made once with their separators: its GPU's
/// `{hw_id="…"` (once a GPU each render), each constant label as `,name="value"` (once for the
/// process), its GPU's identity as `,…} ` (once a GPU each render); a line of a GPU's series
/// with one constant label is four copies and its value, where writing each brace and comma
/// took nine.
pub fn render(families: &View<'_>, out: &mut String) {
    let names = prometheus_names();
    let mut identities = Identities::default();
    let mut ids = IdLabels::default();
    // The label names mapped by earlier renders (a render running meanwhile maps its own).
    let mut labels = std::mem::take(&mut *crate::model::lock(&LABELS));
    for (i, samples) in families.iter() {
        let (name, header) = (names[i].0.as_str(), names[i].1.as_str());
        out.push_str(header);
        for (id, s) in samples {
            out.push_str(name);
            let open = out.len();
            // One pass over the sample's keys: its own `hw.id` (a MIG instance's, a fan's),
            // and whether it names an identity attribute itself.
            let (mut own_id, mut names_identity) = (false, false);
            for (k, _) in &s.attrs {
                if *k == "hw.id" {
                    own_id = true;
                } else if k.starts_with("hw.") && crate::model::view::IDENTITY_KEYS.contains(k) {
                    names_identity = true;
                }
            }
            let keys = &mut labels.keys;
            let mut first = if !id.is_empty() && !own_id {
                out.push_str(ids.get(id, keys));
                false
            } else {
                out.push('{');
                true
            };
            for (k, v) in &s.attrs {
                let known = match v {
                    std::borrow::Cow::Borrowed(v) => labels.statics.get(k, v, &mut labels.keys),
                    std::borrow::Cow::Owned(_) => None,
                };
                match known {
                    // `,name="value"`.
                    Some(text) => {
                        out.push_str(if first { &text[1..] } else { text });
                        first = false;
                    }
                    None => write_label(out, &mut first, labels.keys.get(k), v),
                }
            }
            let keys = &mut labels.keys;
            let extra = if own_id || id.is_empty() {
                &[][..]
            } else {
                families.identity_of(i, id)
            };
            let mut closed = false;
            if !extra.is_empty() {
                if !names_identity {
                    // A GPU's identity is the same on each of its series: written once, with
                    // the series' end, `,…} ` (after its `hw_id`, which `extra` implies).
                    out.push_str(identities.get(extra, keys));
                    closed = true;
                } else {
                    for (k, v) in extra {
                        if s.attr(k).is_none() {
                            write_label(out, &mut first, keys.get(k), v);
                        }
                    }
                }
            }
            if !closed {
                if out.len() == open + 1 {
                    // No label: `name value`, not `name{} value` (which some parsers refuse).
                    out.truncate(open);
                    out.push(' ');
                } else {
                    out.push_str("} ");
                }
            }
            write_value(out, s.value);
            out.push('\n');
        }
    }
    *crate::model::lock(&LABELS) = labels;
}

/// What renders map once for the process and keep: label names, and the text of labels whose
/// value is a constant.
#[derive(Default)]
struct Labels {
    keys: Keys,
    statics: Statics,
}

/// Kept across renders (a render running meanwhile maps its own).
static LABELS: std::sync::Mutex<Labels> = std::sync::Mutex::new(Labels {
    keys: Keys::new(),
    statics: Statics::new(),
});

/// At most this many constant labels are kept (there are a few hundred: enum values, link
/// and fan indices); past it, labels are written as any other.
const MAX_STATIC_LABELS: usize = 4096;

/// The text `,name="value"` of labels whose key and value are both `&'static str`s (an enum
/// value, an index name), escaped once for the process instead of on every series. Looked
/// up about 2,000 times a scrape on the 8-GPU node: a direct-mapped table by the value's and
/// the key's addresses answers nearly all of them with one comparison, ahead of the hash
/// map (whose hashing of the four words took about half of a lookup's instructions).
struct Statics {
    /// The labels' text, by the key's and the value's address and length.
    text: Vec<(StaticId, Box<str>)>,
    /// Where each label is in `text`.
    index: std::collections::HashMap<StaticId, u32, foldhash::fast::FixedState>,
    /// Index + 1 into `text` (0: empty) by a hash of the addresses; a slot keeps the first
    /// label that took it, the others are found through `index`.
    slots: [u32; 1024],
}

/// A constant label: its key's and its value's address and length.
type StaticId = (usize, usize, usize, usize);

impl Default for Statics {
    fn default() -> Self {
        Self::new()
    }
}

impl Statics {
    const fn new() -> Self {
        Self {
            text: Vec::new(),
            index: std::collections::HashMap::with_hasher(foldhash::fast::FixedState::with_seed(0)),
            slots: [0; 1024],
        }
    }

    fn get(&mut self, key: &'static str, value: &'static str, keys: &mut Keys) -> Option<&str> {
        let id = (
            key.as_ptr() as usize,
            key.len(),
            value.as_ptr() as usize,
            value.len(),
        );
        let slot = (id.2 ^ id.3.rotate_left(48) ^ id.0.rotate_left(21))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            >> 54;
        let hit = self.slots[slot]
            .checked_sub(1)
            .filter(|&i| self.text[i as usize].0 == id);
        if let Some(i) = hit {
            return Some(&self.text[i as usize].1);
        }
        let i = match self.index.get(&id) {
            Some(&i) => i,
            None if self.text.len() >= MAX_STATIC_LABELS => return None,
            None => {
                let mut text = String::from(",");
                write_label(&mut text, &mut true, keys.get(key), value);
                let i = self.text.len() as u32;
                self.text.push((id, text.into_boxed_str()));
                self.index.insert(id, i);
                i
            }
        };
        if self.slots[slot] == 0 {
            self.slots[slot] = i + 1;
        }
        Some(&self.text[i as usize].1)
    }
}

/// Each GPU's `hw_id="…"` label as text after the series' `{`, rendered on first use in a
/// scrape (keyed by the view's string, one per GPU; consecutive series are mostly the same
/// GPU's).
#[derive(Default)]
struct IdLabels {
    rendered: Vec<(usize, String)>,
    last: usize,
}

impl IdLabels {
    fn get(&mut self, id: &str, keys: &mut Keys) -> &str {
        let key = id.as_ptr() as usize;
        let at = match self.rendered.get(self.last) {
            Some((k, _)) if *k == key => self.last,
            _ => match self.rendered.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    // Room for `hw_id="GPU-<uuid>"` (a scrape renders one per GPU anew; grown
                    // from nothing, each took three reallocations).
                    let mut text = String::with_capacity(64);
                    text.push('{');
                    write_label(&mut text, &mut true, keys.get("hw.id"), id);
                    self.rendered.push((key, text));
                    self.rendered.len() - 1
                }
            },
        };
        self.last = at;
        &self.rendered[at].1
    }
}

/// Each GPU's identity labels as text, `,…} ` (a comma before, the series' labels' end
/// after), rendered on first use in a scrape (keyed by the view's slice, one per GPU;
/// consecutive series are mostly the same GPU's).
#[derive(Default)]
struct Identities {
    rendered: Vec<(usize, String)>,
    last: usize,
}

impl Identities {
    fn get(&mut self, attrs: &[(&'static str, crate::model::AttrValue)], keys: &mut Keys) -> &str {
        let key = attrs.as_ptr() as usize;
        let at = match self.rendered.get(self.last) {
            Some((k, _)) if *k == key => self.last,
            _ => match self.rendered.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    // Room for the usual identity (vendor, model, name, serial, ...), which
                    // grew by doubling from nothing on every scrape.
                    let mut text = String::with_capacity(256);
                    let mut first = false;
                    for (k, v) in attrs {
                        write_label(&mut text, &mut first, keys.get(k), v);
                    }
                    text.push_str("} ");
                    self.rendered.push((key, text));
                    self.rendered.len() - 1
                }
            },
        };
        self.last = at;
        &self.rendered[at].1
    }
}

/// Attribute keys as Prometheus label names ('.' and '-' become '_'), each mapped once: the
/// keys are the registry's and the sources' constants, a few dozen, each on thousands of
/// series.
struct Keys {
    /// (address, length) of a key, and its label name.
    mapped: Vec<(usize, usize, String)>,
    /// Direct-mapped index into `mapped` by the key's address (0: empty; else index + 1).
    slots: [u16; 256],
}

impl Default for Keys {
    fn default() -> Self {
        Self::new()
    }
}

impl Keys {
    const fn new() -> Self {
        Self {
            mapped: Vec::new(),
            slots: [0; 256],
        }
    }

    fn get(&mut self, key: &'static str) -> &str {
        let id = (key.as_ptr() as usize, key.len());
        let slot = (id.0 ^ id.1).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56;
        let hit = match self.slots[slot] {
            0 => None,
            n => Some(usize::from(n) - 1).filter(|&i| (self.mapped[i].0, self.mapped[i].1) == id),
        };
        let at = match hit {
            Some(i) => i,
            None => {
                let i = match self.mapped.iter().position(|(p, l, _)| (*p, *l) == id) {
                    Some(i) => i,
                    None => {
                        self.mapped.push((id.0, id.1, key.replace(['.', '-'], "_")));
                        self.mapped.len() - 1
                    }
                };
                if self.slots[slot] == 0 {
                    self.slots[slot] = u16::try_from(i + 1).unwrap_or(0);
                }
                i
            }
        };
        &self.mapped[at].2
    }
}

/// Writes `name="value"` (after a comma unless first); `name` is already a label name.
fn write_label(out: &mut String, first: &mut bool, name: &str, value: &str) {
    if !*first {
        out.push(',');
    }
    *first = false;
    out.push_str(name);
    out.push_str("=\"");
    // Most values are short ids and enum values with nothing to escape: a plain scan of them
    // costs less than setting up memchr's.
    let bytes = value.as_bytes();
    if bytes.len() < 32 && !bytes.iter().any(|&b| matches!(b, b'\\' | b'"' | b'\n')) {
        out.push_str(value);
        out.push('"');
        return;
    }
    // The matched bytes are ASCII, so each cut is at a character boundary.
    let mut rest = value;
    while let Some(i) = memchr::memchr3(b'\\', b'"', b'\n', rest.as_bytes()) {
        out.push_str(&rest[..i]);
        out.push_str(match rest.as_bytes()[i] {
            b'\\' => "\\\\",
            b'"' => "\\\"",
            _ => "\\n",
        });
        rest = &rest[i + 1..];
    }
    out.push_str(rest);
    out.push('"');
}

/// Whether `/metrics` serves the names of [`LEGACY_PROMETHEUS_NAMES`] instead
/// (`[sinks] legacy_names`; set once at start).
static LEGACY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Serves the earlier releases' names where a name changed (`legacy_names`).
pub fn set_legacy_names(on: bool) {
    LEGACY.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The Prometheus name of each metric of the registry and its `# HELP` and `# TYPE` lines,
/// computed once (each way).
fn prometheus_names() -> &'static [(String, String)] {
    static NAMES: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();
    static OLD: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();
    if LEGACY.load(std::sync::atomic::Ordering::Relaxed) {
        OLD.get_or_init(|| {
            let mut names = prometheus_names_now();
            for (m, old) in LEGACY_PROMETHEUS_NAMES {
                names[*m as usize] = (*old).to_string();
            }
            with_headers(names)
        })
    } else {
        NAMES.get_or_init(|| with_headers(prometheus_names_now()))
    }
}

fn prometheus_names_now() -> Vec<String> {
    REGISTRY.iter().map(|d| d.prometheus_name()).collect()
}

fn with_headers(names: Vec<String>) -> Vec<(String, String)> {
    names
        .into_iter()
        .zip(REGISTRY)
        .map(|(name, d)| {
            let header = format!(
                "# HELP {name} {}\n# TYPE {name} {}\n",
                escape_help(d.help),
                d.prometheus_type()
            );
            (name, header)
        })
        .collect()
}

fn write_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v.abs() < 9.007_199_254_740_992e15 && (v as i64) as f64 == v {
        // A whole number (the test is two conversions: `fract` is a call into libm here,
        // once for each of a scrape's thousands of values).
        out.push_str(itoa::Buffer::new().format(v as i64));
    } else if v.abs() < 1e-4 || v.abs() >= 1e21 {
        // Shortest round-trip digits with an exponent, as Go's strconv 'g' writes them; `{}`
        // would spell 3.8e-322 with 320 zeros.
        let _ = write!(out, "{v:e}");
    } else if v.abs() < 9.007_199_254_740_992e15 {
        // Not whole: shortest round-trip digits in plain decimal notation, as `{}` writes
        // them but at a quarter of its instructions (zmij). Where two digit strings of the
        // shortest length both round-trip, the last digit may differ from `{}`'s: either
        // parses to `v`.
        out.push_str(zmij::Buffer::new().format_finite(v));
    } else {
        // Whole numbers from 2^53 to 1e21, all digits written out (zmij would add ".0").
        let _ = write!(out, "{v}");
    }
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests;

//! Loading a config file and reporting every problem at once, each with file, line and key.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;
use toml::de::{DeTable, DeValue, ValueDeserializer};

use super::Config;

/// One problem in a config file.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    /// The file (or `<string>`).
    pub file: PathBuf,
    /// 1-based line and column, when the problem has a place.
    pub line: Option<(usize, usize)>,
    /// Dotted key, when known.
    pub key: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some((line, col)) = self.line {
            write!(f, ":{line}:{col}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": key `{key}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Every problem found in a config file.
#[derive(Debug, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Reads and checks a config file.
pub fn load_file(path: &Path) -> Result<Config, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            file: path.to_owned(),
            line: None,
            key: None,
            message: format!("cannot read the config file: {e}"),
        }])
    })?;
    parse_str(&text, path)
}

/// Parses and checks config text; `file` names it in errors.
pub fn parse_str(text: &str, file: &Path) -> Result<Config, ConfigErrors> {
    let err =
        |span: Option<std::ops::Range<usize>>, key: Option<String>, message: String| ConfigError {
            file: file.to_owned(),
            line: span.map(|s| line_col(text, s.start)),
            key,
            message,
        };
    let (root, syntax) = DeTable::parse_recoverable(text);
    if !syntax.is_empty() {
        return Err(ConfigErrors(
            syntax
                .into_iter()
                .map(|e| err(e.span(), None, e.message().trim().to_string()))
                .collect(),
        ));
    }
    let original = root.clone();
    let mut errors = Vec::new();
    let mut table = root;
    // serde stops at the first error: record it, drop the offending key and try again, so that
    // one run reports every bad key. Bounded by the number of keys.
    let config = loop {
        let de = ValueDeserializer::from(Spanned::new(
            table.span(),
            DeValue::Table(table.get_ref().clone()),
        ));
        match Config::deserialize(de) {
            Ok(c) => break Some(c),
            Err(e) => {
                let span = e.span();
                let path = span
                    .clone()
                    .and_then(|s| remove_key_at(table.get_mut(), &s));
                let message = e.message().trim().to_string();
                errors.push(err(span, path.clone(), message));
                if path.is_none() || errors.len() > 200 {
                    break None;
                }
            }
        }
    };
    if let Some(config) = &config {
        for inv in config.validate() {
            let span = span_of(original.get_ref(), &inv.key);
            errors.push(err(span, Some(inv.key), inv.message));
        }
    }
    match config {
        Some(c) if errors.is_empty() => Ok(c),
        _ => Err(ConfigErrors(errors)),
    }
}

/// One step of a key path: a table's key, or an element of an array of tables.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
}

/// A path as the errors write it: `sources.redfish.targets[1].url`.
fn dotted(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Step::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Removes the deepest key whose key or value span contains `span`; returns its path. An
/// error on a whole element of an array of tables removes the array.
fn remove_key_at(table: &mut DeTable<'_>, span: &std::ops::Range<usize>) -> Option<String> {
    let mut path = find_key_at(table, span)?;
    while matches!(path.last(), Some(Step::Index(_))) {
        path.pop();
    }
    let (Step::Key(last), parents) = path.split_last()? else {
        return None;
    };
    let mut t = table;
    let mut steps = parents.iter();
    while let Some(step) = steps.next() {
        let Step::Key(k) = step else { return None };
        t = match t.get_mut(k.as_str())?.get_mut() {
            DeValue::Table(inner) => inner,
            DeValue::Array(items) => {
                let Some(Step::Index(i)) = steps.next() else {
                    return None;
                };
                match items.get_mut(*i)?.get_mut() {
                    DeValue::Table(inner) => inner,
                    _ => return None,
                }
            }
            _ => return None,
        };
    }
    t.remove(last.as_str());
    Some(dotted(&path))
}

/// The path of the deepest key whose key or value span contains `span`, through tables and
/// arrays of tables.
fn find_key_at(table: &DeTable<'_>, span: &std::ops::Range<usize>) -> Option<Vec<Step>> {
    let contains =
        |s: std::ops::Range<usize>| s.start <= span.start && span.end <= s.end.max(s.start + 1);
    for (k, v) in table.iter() {
        let inner = match v.get_ref() {
            DeValue::Table(inner) => find_key_at(inner, span),
            DeValue::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
                let DeValue::Table(inner) = item.get_ref() else {
                    return None;
                };
                let mut p = find_key_at(inner, span)?;
                p.insert(0, Step::Index(i));
                Some(p)
            }),
            _ => None,
        };
        if let Some(mut p) = inner {
            p.insert(0, Step::Key(k.get_ref().to_string()));
            return Some(p);
        }
        if contains(k.span()) || contains(v.span()) {
            return Some(vec![Step::Key(k.get_ref().to_string())]);
        }
    }
    None
}

/// The span of a key for semantic errors (`a.b[1].c`): the key itself, or where the path is
/// not all in the file (a default, a derived name), the deepest part of it that is.
fn span_of(table: &DeTable<'_>, path: &str) -> Option<std::ops::Range<usize>> {
    let mut span = None;
    let mut t = Some(table);
    for part in path.split('.') {
        let mut pieces = part.split('[');
        let name = pieces.next()?;
        let Some((k, v)) = t.and_then(|t| t.get_key_value(name)) else {
            return span;
        };
        span = Some(k.span());
        let mut v = v;
        for index in pieces {
            let Some(item) = index
                .trim_end_matches(']')
                .parse::<usize>()
                .ok()
                .and_then(|i| v.get_ref().as_array()?.get(i))
            else {
                return span;
            };
            span = Some(item.span());
            v = item;
        }
        t = match v.get_ref() {
            DeValue::Table(inner) => Some(inner),
            _ => None,
        };
    }
    span
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1)
        + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        match parse_str(text, Path::new("j.toml")) {
            Ok(_) => Vec::new(),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn empty_file_is_the_default() {
        let c = parse_str("", Path::new("j.toml")).expect("valid");
        assert_eq!(c, Config::default());
    }

    #[test]
    fn every_error_is_reported_with_line_and_key() {
        let e = errors(
            "[sources.nvml]\nbogus = 1\ncall_timeout_ms = \"soon\"\n\n[sinks.prometheus]\nlisten = \"nowhere\"\n",
        );
        assert_eq!(e.len(), 3, "{e:#?}");
        assert!(
            e[0].starts_with("j.toml:2:1: key `sources.nvml.bogus`: unknown field `bogus`"),
            "{}",
            e[0]
        );
        assert!(
            e[1].starts_with("j.toml:3:19: key `sources.nvml.call_timeout_ms`: invalid type"),
            "{}",
            e[1]
        );
        assert!(
            e[2].starts_with(
                "j.toml:6:1: key `sinks.prometheus.listen`: \"nowhere\" is not a socket address"
            ),
            "{}",
            e[2]
        );
    }

    #[test]
    fn unknown_section_is_named() {
        let e = errors("[sources.nvlm]\nenabled = true\n");
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(
            e[0].contains("key `sources.nvlm`") && e[0].contains("unknown field `nvlm`"),
            "{}",
            e[0]
        );
    }

    /// A file both the kernel-log source and the host source would read (one saved
    /// position for two readers) is refused, naming the key and the fix.
    #[test]
    fn the_fabric_manager_log_is_not_a_kernel_log_file_too() {
        let e = errors("[sources.kmsg]\nfiles = [\"/var/log/fabricmanager.log\"]\n");
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(
            e[0].starts_with("j.toml:2:1: key `sources.kmsg.files`: \"/var/log/fabricmanager.log\" is the fabric manager's log")
                && e[0].contains("take it out of sources.kmsg.files"),
            "{}",
            e[0]
        );
        let elsewhere = "[sources.kmsg]\nfiles = [\"/var/log/fabricmanager.log\"]\n\
                         [sources.host]\nfabric_manager_log = \"/var/log/fm/fabricmanager.log\"\n";
        assert!(parse_str(elsewhere, Path::new("j.toml")).is_ok());
        // The same file however its path is spelt; "" (not read) matches nothing.
        let spelt = "[sources.kmsg]\nfiles = [\"/var/log//fabricmanager.log\"]\n";
        assert_eq!(errors(spelt).len(), 1);
        let off = "[sources.kmsg]\nfiles = [\"\"]\n[sources.host]\nfabric_manager_log = \"\"\n";
        let e = errors(off);
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(e[0].contains("give an absolute path"), "{}", e[0]);
    }

    /// One kernel-log file listed twice, however spelt or through a link, is refused (it
    /// would be followed twice and its XIDs counted twice); two files are not.
    #[test]
    fn a_kernel_log_file_is_listed_once() {
        let spelt = "[sources.kmsg]\nfiles = [\"/var/log/kern.log\", \"/var/log/./kern.log\"]\n";
        let e = errors(spelt);
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(
            e[0].starts_with(
                "j.toml:2:1: key `sources.kmsg.files`: entry 1 (\"/var/log/./kern.log\") is the same file as entry 0 (\"/var/log/kern.log\"): list it once"
            ),
            "{}",
            e[0]
        );
        let dir = std::env::temp_dir().join(format!("junction-kmsg-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (log, link, other) = (
            dir.join("kern.log"),
            dir.join("kernel"),
            dir.join("other.log"),
        );
        std::fs::write(&log, "").expect("log");
        std::fs::write(&other, "").expect("other");
        std::os::unix::fs::symlink(&log, &link).expect("link");
        let files = |a: &Path, b: &Path| format!("[sources.kmsg]\nfiles = [{a:?}, {b:?}]\n");
        let e = errors(&files(&log, &link));
        assert_eq!(e.len(), 1, "{e:#?}");
        assert!(e[0].contains("is the same file as entry 0"), "{}", e[0]);
        assert_eq!(errors(&files(&log, &other)), Vec::<String>::new());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn syntax_errors_have_a_line() {
        let e = errors("[sinks.prometheus\nlisten = 1\n");
        assert!(!e.is_empty());
        assert!(e[0].starts_with("j.toml:1:"), "{}", e[0]);
    }
}

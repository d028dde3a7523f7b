//! The example config and the config reference, generated from the config types so that they
//! cannot drift from the code (tests compare them with the committed copies).

use std::fmt::Write as _;

use super::{Config, Describe, FieldDoc};

/// A config section with its scalar keys, as the walker visits it.
struct Section<'a> {
    /// Dotted path, e.g. `sources.nvml`.
    path: String,
    /// The section's own documentation.
    doc: &'static str,
    /// Its scalar keys (nested sections are visited on their own).
    scalars: Vec<&'a FieldDoc>,
    /// The default values.
    defaults: std::borrow::Cow<'a, toml::Table>,
    /// An array of tables (`[[path]]`): none by default; `defaults` are one element's.
    array: bool,
}

/// Visits every section that has scalar keys, depth first, in declaration order.
fn walk<'a>(
    table: &'a toml::Table,
    fields: &'a [FieldDoc],
    path: &str,
    doc: &'static str,
    visit: &mut impl FnMut(Section<'a>),
) {
    let scalars: Vec<&FieldDoc> = fields.iter().filter(|f| (f.nested)().is_none()).collect();
    if !scalars.is_empty() {
        visit(Section {
            path: path.to_string(),
            doc,
            scalars,
            defaults: std::borrow::Cow::Borrowed(table),
            array: false,
        });
    }
    for f in fields {
        let Some(nested) = (f.nested)() else {
            continue;
        };
        let sub = if path.is_empty() {
            f.name.to_string()
        } else {
            format!("{path}.{}", f.name)
        };
        match (table.get(f.name), (f.element_defaults)()) {
            (Some(toml::Value::Table(t)), _) => walk(t, nested, &sub, f.doc, visit),
            (_, Some(element)) => visit(Section {
                path: sub,
                doc: f.doc,
                scalars: nested.iter().collect(),
                defaults: std::borrow::Cow::Owned(element),
                array: true,
            }),
            _ => {}
        }
    }
}

fn defaults() -> toml::Table {
    toml::Table::try_from(Config::default()).unwrap_or_default()
}

/// `config/junction.toml`: every key with its default and its documentation as comments.
pub fn example_config() -> String {
    let mut out = String::from(
        "# Junction configuration: every key with its default value.\n\
         # Generated from the config types by `cargo xtask docs`; do not edit by hand.\n",
    );
    let table = defaults();
    walk(&table, Config::fields().unwrap_or(&[]), "", "", &mut |s| {
        out.push('\n');
        comment(&mut out, s.doc);
        // Top-level keys come first, before any table. An array of tables has no element by
        // default: it is shown commented out.
        let hash = if s.array { "# " } else { "" };
        if s.array {
            let _ = writeln!(out, "# [[{}]]", s.path);
        } else if !s.path.is_empty() {
            let _ = writeln!(out, "[{}]", s.path);
        }
        for f in s.scalars {
            if let Some(v) = s.defaults.get(f.name) {
                comment(&mut out, f.doc);
                let _ = writeln!(out, "{hash}{} = {v}", f.name);
            }
        }
    });
    out
}

fn comment(out: &mut String, doc: &str) {
    for line in doc.lines() {
        let line = line.trim();
        if line.is_empty() {
            out.push_str("#\n");
        } else {
            let _ = writeln!(out, "# {line}");
        }
    }
}

/// `docs/CONFIG.md`: one table per section.
pub fn reference() -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from the config types by `cargo xtask docs`; do not edit by hand.\n\n\
         Junction reads one TOML file (`junction --config FILE`). Every key is optional; a missing\n\
         key takes the default shown. Unknown keys are errors. `junction validate --config FILE`\n\
         checks a file and reports every problem with its line and key (exit code 2).\n\
         The example `config/junction.toml` lists the same keys with their defaults.\n",
    );
    let table = defaults();
    walk(&table, Config::fields().unwrap_or(&[]), "", "", &mut |s| {
        let title = if s.path.is_empty() {
            "Top level".to_string()
        } else if s.array {
            format!("`[[{}]]` (one table per entry; none by default)", s.path)
        } else {
            format!("`[{}]`", s.path)
        };
        let _ = writeln!(out, "\n## {title}\n");
        let doc = s.doc.lines().map(str::trim).collect::<Vec<_>>().join(" ");
        if !doc.trim().is_empty() {
            let _ = writeln!(out, "{}\n", doc.trim());
        }
        let _ = writeln!(out, "| key | type | default | meaning |\n|---|---|---|---|");
        for f in s.scalars {
            let default = s
                .defaults
                .get(f.name)
                .map(|v| v.to_string())
                .unwrap_or_default();
            let doc = f.doc.lines().map(str::trim).collect::<Vec<_>>().join(" ");
            let _ = writeln!(
                out,
                "| `{}` | `{}` | `{}` | {} |",
                f.name,
                f.ty,
                default.replace('|', "\\|"),
                doc.trim()
            );
        }
    });
    out
}

#[cfg(test)]
mod tests {
    fn committed(path: &str) -> String {
        std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR")))
            .unwrap_or_default()
    }

    #[test]
    fn committed_example_config_matches_the_defaults() {
        assert!(
            committed("config/junction.toml") == super::example_config(),
            "config/junction.toml is out of date: run `cargo xtask docs` and commit it"
        );
    }

    #[test]
    fn committed_reference_matches_the_config_types() {
        assert!(
            committed("docs/CONFIG.md") == super::reference(),
            "docs/CONFIG.md is out of date: run `cargo xtask docs` and commit it"
        );
    }

    #[test]
    fn example_config_parses_to_the_defaults() {
        let parsed = super::super::load::parse_str(
            &super::example_config(),
            std::path::Path::new("example"),
        );
        assert_eq!(parsed.ok(), Some(super::Config::default()));
    }
}

//! The alert rules and dashboards: `promtool check rules` and `promtool test rules`; every
//! metric they name is in the registry; every dashboard is importable; and against a real
//! Prometheus (Debian's) scraping Junction on a simulated faulty node, every rule expression
//! and every dashboard query returns data — those that need a GPU to disappear or Junction to
//! stop, once that has been done; on a healthy node, no alert but the informational ones.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};

use crate::support;

mod live;

fn config_dir() -> PathBuf {
    support::root().join("config")
}

fn promtool() -> Option<PathBuf> {
    support::require_tool("promtool", None)
}

/// Every PromQL expression of the rules (recording and alerting), by name.
fn rule_exprs() -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(config_dir().join("prometheus/junction-rules.yml")).expect("rules");
    // The rules file is YAML; its `expr:` values are plain or `|` blocks.
    let mut out = Vec::new();
    let mut name = String::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        let t = l.trim_start();
        if let Some(n) = t
            .strip_prefix("- alert: ")
            .or_else(|| t.strip_prefix("- record: "))
        {
            name = n.trim().to_string();
        } else if let Some(e) = t.strip_prefix("expr: ") {
            let indent = l.len() - t.len();
            let expr = if e.trim() == "|" {
                let mut block = Vec::new();
                while let Some(n) = lines.peek() {
                    if n.trim().is_empty() || n.len() - n.trim_start().len() <= indent {
                        break;
                    }
                    block.push(n.trim().to_string());
                    lines.next();
                }
                block.join(" ")
            } else {
                e.trim().to_string()
            };
            out.push((name.clone(), expr));
        }
    }
    out
}

/// Every dashboard target's expression with Grafana's variables filled in, by dashboard and
/// panel.
fn dashboard_exprs() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for d in dashboards() {
        let (file, doc) = d;
        for p in doc["panels"].as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                let e = t["expr"].as_str().expect("expr");
                let e = e
                    .replace("$__rate_interval", "1m")
                    .replace("$__interval", "15s")
                    .replace("$cluster", ".*")
                    .replace("$node", ".*")
                    .replace("$gpu", ".*");
                out.push((format!("{file}: {}", p["title"].as_str().unwrap_or("")), e));
            }
        }
    }
    out
}

fn dashboards() -> Vec<(String, Value)> {
    let mut v: Vec<(String, Value)> = std::fs::read_dir(config_dir().join("grafana"))
        .expect("grafana dir")
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).expect("read");
            (
                e.file_name().to_string_lossy().into_owned(),
                serde_json::from_str(&text).unwrap_or_else(|err| panic!("{:?}: {err}", e.path())),
            )
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Metric names an expression uses: what is left after removing strings, label matchers,
/// ranges and `by`/`on`/`without`/`ignoring` lists, that is not a function, keyword or number.
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Drop "...", {...} and [...].
    let mut flat = String::new();
    let (mut depth_brace, mut depth_bracket, mut in_str) = (0, 0, false);
    for c in expr.chars() {
        match c {
            '"' if depth_brace == 0 => in_str = !in_str,
            _ if in_str => {}
            '{' => depth_brace += 1,
            '}' => depth_brace -= 1,
            '[' => depth_bracket += 1,
            ']' => depth_bracket -= 1,
            _ if depth_brace > 0 || depth_bracket > 0 => {}
            c => flat.push(c),
        }
        if c == '}' || c == ']' {
            flat.push(' ');
        }
    }
    // Drop label lists after by / on / without / ignoring / group_left / group_right.
    let mut out = String::new();
    let mut rest = flat.as_str();
    while let Some(pos) = [
        "by",
        "on",
        "without",
        "ignoring",
        "group_left",
        "group_right",
    ]
    .iter()
    .filter_map(|k| {
        let mut from = 0;
        while let Some(p) = rest[from..].find(k) {
            let at = from + p;
            let before = rest[..at].chars().last();
            let after = rest[at + k.len()..].trim_start().chars().next();
            if before.is_none_or(|b| !b.is_ascii_alphanumeric() && b != '_') && after == Some('(') {
                return Some((at, k.len()));
            }
            from = at + k.len();
        }
        None
    })
    .min()
    {
        out.push_str(&rest[..pos.0]);
        let after = &rest[pos.0 + pos.1..];
        let close = after.find(')').map_or(after.len(), |c| c + 1);
        rest = &after[close..];
    }
    out.push_str(rest);
    let mut names = BTreeSet::new();
    let chars: Vec<char> = out.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].is_ascii_alphabetic() || chars[i] == '_' || chars[i] == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace()).copied();
            let keyword = ["and", "or", "unless", "offset", "bool", "humanizeDuration"]
                .contains(&word.as_str());
            if next != Some('(') && !keyword && (word.contains('_') || word == "up") {
                names.insert(word);
            }
            continue;
        }
        i += 1;
    }
    names
}

#[test]
fn rules_pass_promtool_and_every_metric_they_and_the_dashboards_name_exists() {
    let Some(promtool) = promtool() else {
        return;
    };
    let dir = config_dir().join("prometheus");
    for args in [
        vec!["check", "rules", "junction-rules.yml"],
        vec!["test", "rules", "junction-rules.test.yml"],
    ] {
        let out = support::output(Command::new(&promtool).current_dir(&dir).args(&args));
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The registry's Prometheus names (METRICS.md is generated from it and checked against it).
    let metrics = std::fs::read_to_string(support::root().join("METRICS.md")).expect("METRICS.md");
    let known: BTreeSet<String> = metrics
        .lines()
        .filter_map(|l| l.split('|').nth(2))
        .map(|c| c.trim().trim_matches('`').to_string())
        .filter(|c| !c.is_empty())
        .collect();
    let records: BTreeSet<String> = rule_exprs()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n.contains(':'))
        .collect();
    let mut unknown = Vec::new();
    for (what, e) in rule_exprs().into_iter().chain(dashboard_exprs()) {
        for m in metric_names(&e) {
            // Label names used in selectors are inside braces; `up` is Prometheus' own.
            if !known.contains(&m) && !records.contains(&m) && m != "up" {
                unknown.push(format!("{what}: {m}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "not in the registry:\n{}",
        unknown.join("\n")
    );
    // Every alert links a runbook that exists.
    let runbooks =
        std::fs::read_to_string(support::root().join("docs/RUNBOOKS.md")).expect("runbooks");
    for (name, _) in rule_exprs().into_iter().filter(|(n, _)| !n.contains(':')) {
        assert!(
            runbooks.contains(&format!("\n## {name}\n")),
            "no runbook for {name}"
        );
    }
    // Every dashboard is importable: uid, title, schema version, the datasource variable, and
    // no hard-coded datasource.
    let ds = json!({"type": "prometheus", "uid": "${datasource}"});
    for (file, d) in dashboards() {
        for key in ["uid", "title", "schemaVersion", "panels", "templating"] {
            assert!(!d[key].is_null(), "{file}: {key}");
        }
        let vars: Vec<&str> = d["templating"]["list"]
            .as_array()
            .expect("vars")
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        for v in ["datasource", "cluster", "node"] {
            assert!(vars.contains(&v), "{file}: variable {v}");
        }
        for p in d["panels"]
            .as_array()
            .expect("panels")
            .iter()
            .filter(|p| p["type"] != "row")
        {
            assert_eq!(p["datasource"], ds, "{file}: {}", p["title"]);
            for t in p["targets"].as_array().expect("targets") {
                assert_eq!(t["datasource"], ds, "{file}: {}", p["title"]);
            }
        }
    }
}

//! Junction's names against OpenTelemetry's hardware conventions themselves
//! (semantic-conventions v1.44.0, `model/hardware/`, in `../shared/realworld/semconv-hardware/`):
//! every registry entry (METRICS.md, generated from the registry) whose name the conventions
//! define has their instrument and unit, carries their required attributes, and uses only
//! attribute names they define in their `hw.*` namespace; on the simulated node, every value of
//! an attribute the conventions enumerate is one of their members. A deviation not listed in
//! [`KNOWN`] fails the build; each listed one names the item of the conventions check
//! (`../shared/reference/semconv-check.md`) that will remove it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use yaml_rust2::{Yaml, YamlLoader};

use crate::support::{self, Agent, parse};

/// Deviations still open, each with the conventions-check item that fixes it: (metric or
/// `*`, attribute, value or `*`).
const KNOWN: &[(&str, &str, &str, &str)] = &[
    // None open on the simulated node. (D8's rest, BMC sensor kinds as hw.type of hw.power,
    // is not on it: this test runs NVML only.)
];

fn known(metric: &str, attr: &str, value: &str) -> bool {
    KNOWN
        .iter()
        .any(|(m, a, v, _)| (*m == "*" || *m == metric) && *a == attr && (*v == "*" || *v == value))
}

/// What the conventions say about one metric.
#[derive(Debug, Default)]
struct SpecMetric {
    instrument: String,
    unit: String,
    /// Attribute → its requirement level ("required", "recommended", "conditionally_required", …).
    attrs: BTreeMap<String, String>,
}

struct Spec {
    metrics: BTreeMap<String, SpecMetric>,
    /// Every attribute the conventions define, with its members where it is an enum.
    attributes: BTreeMap<String, Option<BTreeSet<String>>>,
}

fn level(y: &Yaml) -> String {
    match y {
        Yaml::String(s) => s.clone(),
        Yaml::Hash(h) => h
            .keys()
            .next()
            .and_then(Yaml::as_str)
            .unwrap_or("")
            .to_string(),
        _ => "recommended".into(),
    }
}

fn spec() -> Spec {
    let dir = testkit::shared().join("realworld/semconv-hardware");
    let mut docs = Vec::new();
    for e in std::fs::read_dir(&dir).expect("the conventions' model files") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "yaml") {
            let text = std::fs::read_to_string(&p).expect("read");
            docs.extend(YamlLoader::load_from_str(&text).expect("yaml"));
        }
    }
    // Attribute groups (for ref_group) and the attribute registry.
    let mut groups: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut attributes = BTreeMap::new();
    let attr_list = |list: &Yaml| -> Vec<(Option<String>, Option<String>, String)> {
        list.as_vec()
            .into_iter()
            .flatten()
            .map(|a| {
                (
                    a["ref"].as_str().map(str::to_string),
                    a["ref_group"].as_str().map(str::to_string),
                    level(&a["requirement_level"]),
                )
            })
            .collect()
    };
    for d in &docs {
        for g in d["groups"]
            .as_vec()
            .into_iter()
            .flatten()
            .chain(d["attribute_groups"].as_vec().into_iter().flatten())
        {
            let id = g["id"].as_str().unwrap_or("").to_string();
            let mut refs = Vec::new();
            for a in g["attributes"].as_vec().into_iter().flatten() {
                if let Some(name) = a["id"].as_str() {
                    let members = a["type"]["members"].as_vec().map(|ms| {
                        ms.iter()
                            .filter_map(|m| m["value"].as_str().map(str::to_string))
                            .collect()
                    });
                    attributes.insert(name.to_string(), members);
                }
                if let Some(r) = a["ref"].as_str() {
                    refs.push((r.to_string(), level(&a["requirement_level"])));
                }
                if let Some(r) = a["ref_group"].as_str() {
                    refs.push((format!("group:{r}"), String::new()));
                }
            }
            groups.insert(id, refs);
        }
    }
    fn expand(
        groups: &BTreeMap<String, Vec<(String, String)>>,
        refs: &[(String, String)],
        out: &mut BTreeMap<String, String>,
    ) {
        for (r, l) in refs {
            match r.strip_prefix("group:") {
                Some(g) => expand(groups, groups.get(g).map_or(&[][..], Vec::as_slice), out),
                None => {
                    out.insert(r.clone(), l.clone());
                }
            }
        }
    }
    let mut metrics = BTreeMap::new();
    for d in &docs {
        for m in d["metrics"].as_vec().into_iter().flatten() {
            let Some(name) = m["name"].as_str() else {
                continue;
            };
            let refs: Vec<(String, String)> = attr_list(&m["attributes"])
                .into_iter()
                .map(|(r, g, l)| match (r, g) {
                    (Some(r), _) => (r, l),
                    (None, Some(g)) => (format!("group:{g}"), l),
                    (None, None) => (String::new(), l),
                })
                .collect();
            let mut attrs = BTreeMap::new();
            expand(&groups, &refs, &mut attrs);
            metrics.insert(
                name.to_string(),
                SpecMetric {
                    instrument: m["instrument"].as_str().unwrap_or("").to_string(),
                    unit: m["unit"].as_str().unwrap_or("").to_string(),
                    attrs,
                },
            );
        }
    }
    Spec {
        metrics,
        attributes,
    }
}

#[test]
fn every_spec_name_has_the_spec_instrument_unit_and_attributes() {
    let spec = spec();
    assert!(
        spec.metrics.contains_key("hw.gpu.utilization") && spec.attributes.contains_key("hw.type"),
        "the conventions were read"
    );
    let mut checked = 0;
    let mut wrong = Vec::new();
    for support::RegistryRow {
        name,
        unit,
        kind,
        attrs,
        ..
    } in support::registry_rows()
    {
        let Some(m) = spec.metrics.get(&name) else {
            // Not a spec name: it must not sit in the spec's namespace as if it were.
            if name.starts_with("hw.") {
                wrong.push(format!(
                    "{name}: in hw.* but not a metric of the conventions"
                ));
            }
            continue;
        };
        checked += 1;
        if kind != m.instrument {
            wrong.push(format!(
                "{name}: {kind}, the conventions say {}",
                m.instrument
            ));
        }
        if unit != m.unit {
            wrong.push(format!(
                "{name}: unit {unit}, the conventions say {}",
                m.unit
            ));
        }
        for (a, l) in &m.attrs {
            if l == "required" && !attrs.contains(a) {
                wrong.push(format!("{name}: lacks the required attribute {a}"));
            }
        }
        for a in &attrs {
            if a.starts_with("hw.") && !spec.attributes.contains_key(a) && !known(&name, a, "*") {
                wrong.push(format!(
                    "{name}: {a} is not an attribute of the conventions"
                ));
            }
        }
    }
    assert!(checked >= 13, "{checked} spec names checked");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_enumerated_value_on_the_simulated_node_is_the_specs() {
    let spec = spec();
    let reg = support::registry_rows();
    let mut agent = Agent::start("h100-training.toml", "current");
    let body = agent.wait_for(Duration::from_secs(30), |m| {
        m.contains("hw_temperature_limit_celsius") && m.contains("hw_status{")
    });
    // Prometheus name → the registry name; label → attribute.
    let by_prom: BTreeMap<&str, (&str, &Vec<String>)> = reg
        .iter()
        .map(|r| (r.prometheus.as_str(), (r.name.as_str(), &r.attrs)))
        .collect();
    let mut wrong = BTreeSet::new();
    let mut seen = 0;
    for s in parse(&body) {
        let Some((name, attrs)) = by_prom.get(s.name.as_str()) else {
            continue;
        };
        if !spec.metrics.contains_key(*name) {
            continue;
        }
        for a in attrs.iter() {
            let Some(Some(members)) = spec.attributes.get(a) else {
                continue;
            };
            let Some(v) = s.labels.get(&a.replace('.', "_")) else {
                continue;
            };
            seen += 1;
            if !members.contains(v) && !known(name, a, v) {
                wrong.insert(format!(
                    "{name}{{{a}={v:?}}}: the conventions list {members:?}"
                ));
            }
        }
    }
    assert!(seen > 50, "enumerated values checked: {seen}");
    assert!(
        wrong.is_empty(),
        "{}",
        wrong.into_iter().collect::<Vec<_>>().join("\n")
    );
    assert!(agent.terminate().success());
}

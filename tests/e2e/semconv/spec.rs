//! The hardware conventions' YAML (`model/hardware/` of semantic-conventions v1.44.0) read
//! into what the tests compare: each metric's instrument, unit and attributes with their
//! requirement levels, and every attribute with its members where it is an enum.

use std::collections::{BTreeMap, BTreeSet};

use yaml_rust2::{Yaml, YamlLoader};

/// What the conventions say about one metric.
#[derive(Debug, Default)]
pub(super) struct SpecMetric {
    pub(super) instrument: String,
    pub(super) unit: String,
    /// Attribute → its requirement level ("required", "recommended", "conditionally_required", …).
    pub(super) attrs: BTreeMap<String, String>,
}

pub(super) struct Spec {
    pub(super) metrics: BTreeMap<String, SpecMetric>,
    /// Every attribute the conventions define, with its members where it is an enum.
    pub(super) attributes: BTreeMap<String, Option<BTreeSet<String>>>,
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

pub(super) fn spec() -> Spec {
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
        // Two shapes: `metrics:` entries with `name`, and `groups:` of `type: metric` with
        // `metric_name` (host-metrics.yaml), whose attributes come from `extends`.
        let grouped = d["groups"]
            .as_vec()
            .into_iter()
            .flatten()
            .filter(|g| g["type"].as_str() == Some("metric"));
        for m in d["metrics"].as_vec().into_iter().flatten().chain(grouped) {
            let Some(name) = m["name"].as_str().or_else(|| m["metric_name"].as_str()) else {
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
            let mut refs = refs;
            if let Some(e) = m["extends"].as_str() {
                refs.push((format!("group:{e}"), String::new()));
            }
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

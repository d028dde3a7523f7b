//! The Prometheus text exposition format, as Junction writes it, parsed into series.

use std::collections::BTreeMap;

/// One series of the exposition format.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses a page; an error names the first line that is not `name{labels} value`.
pub fn try_parse(text: &str) -> Result<Vec<Series>, String> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (head, value) = line
            .rsplit_once(' ')
            .ok_or_else(|| format!("no value: {line}"))?;
        let (name, labels) = match head.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (head, ""),
        };
        let mut map = BTreeMap::new();
        let mut rest = labels;
        while let Some((k, v)) = rest.split_once("=\"") {
            let mut end = 0;
            let bytes = v.as_bytes();
            while end < bytes.len()
                && !(bytes[end] == b'"' && (end == 0 || bytes[end - 1] != b'\\'))
            {
                end += 1;
            }
            map.insert(
                k.trim_start_matches(',').to_string(),
                v[..end].replace("\\\"", "\"").replace("\\\\", "\\"),
            );
            rest = &v[(end + 1).min(v.len())..];
        }
        out.push(Series {
            name: name.to_string(),
            labels: map,
            value: value.parse().map_err(|_| format!("not a number: {line}"))?,
        });
    }
    Ok(out)
}

/// [`try_parse`], panicking on a malformed line (a test's page must be well formed).
pub fn parse(text: &str) -> Vec<Series> {
    try_parse(text).unwrap_or_else(|e| panic!("{e}"))
}

/// The series named `name` whose labels include `want`.
pub fn find<'a>(s: &'a [Series], name: &str, want: &[(&str, &str)]) -> Vec<&'a Series> {
    s.iter()
        .filter(|x| {
            x.name == name
                && want
                    .iter()
                    .all(|(k, v)| x.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

/// The value of the one series named `name` whose labels include `labels` (panics if more
/// than one matches: the test asked an ambiguous question).
pub fn value(series: &[Series], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let hits = find(series, name, labels);
    assert!(
        hits.len() <= 1,
        "{name} {labels:?} matches {} series: {hits:#?}",
        hits.len()
    );
    hits.first().map(|s| s.value)
}

/// (index, UUID) of every GPU on a page, by index, from `gpu_info`.
pub fn gpus_by_index(series: &[Series]) -> Vec<(u32, String)> {
    let mut v: Vec<(u32, String)> = find(series, "gpu_info", &[])
        .iter()
        .filter_map(|s| {
            Some((
                s.labels.get("gpu_index")?.parse().ok()?,
                s.labels.get("hw_id")?.clone(),
            ))
        })
        .collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_with_quotes_and_commas() {
        let s = parse("# HELP x y\na{b=\"1,2\",c=\"say \\\"hi\\\"\"} 3\nz 4.5\n");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].labels["b"], "1,2");
        assert_eq!(s[0].labels["c"], "say \"hi\"");
        assert_eq!(value(&s, "z", &[]), Some(4.5));
        assert!(try_parse("broken").is_err());
    }
}

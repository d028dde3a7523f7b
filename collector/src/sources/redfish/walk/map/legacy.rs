//! The legacy resources (`Thermal`), read for what the newer ones do not give.

use serde_json::Value;

use super::{Ids, array, health, num, text};
use crate::model::bmc::{self, Quantity, Reading};

/// A legacy `Thermal` resource of the chassis `parent`: its temperatures and fans.
pub fn legacy_thermal(ids: Ids<'_>, th: &Value, parent: &str) -> Vec<Reading> {
    let mut out = Vec::new();
    for t in array(th, "Temperatures") {
        let Some(value) = t.get("ReadingCelsius").and_then(num) else {
            continue;
        };
        let rid = t.get("@odata.id").and_then(Value::as_str).unwrap_or("");
        let thresholds = legacy_thresholds(t, 1.0);
        out.push(Reading {
            id: ids.of(rid),
            hw_type: "temperature".into(),
            name: text(t, "Name").unwrap_or(rid).to_string(),
            parent: Some(parent.to_string()),
            quantity: Quantity::Temperature,
            value,
            unit: "Cel".into(),
            location: text(t, "PhysicalContext").map(bmc::snake),
            point: None,
            state: Reading::level(value, &thresholds, health(t)),
            thresholds,
        });
    }
    for f in array(th, "Fans") {
        let Some(value) = f.get("Reading").and_then(num) else {
            continue;
        };
        let rid = f.get("@odata.id").and_then(Value::as_str).unwrap_or("");
        let percent = text(f, "ReadingUnits") == Some("Percent");
        let (q, factor) = if percent {
            (Quantity::FanRatio, 0.01)
        } else {
            (Quantity::FanRpm, 1.0)
        };
        let thresholds = legacy_thresholds(f, factor);
        let value = bmc::scale(value, factor);
        out.push(Reading {
            id: ids.of(rid),
            hw_type: "fan".into(),
            name: text(f, "Name")
                .or_else(|| text(f, "FanName"))
                .unwrap_or(rid)
                .to_string(),
            parent: Some(parent.to_string()),
            quantity: q,
            value,
            unit: text(f, "ReadingUnits").unwrap_or("RPM").to_string(),
            location: None,
            point: None,
            state: Reading::level(value, &thresholds, health(f)),
            thresholds,
        });
    }
    out
}

/// Legacy `Thermal` thresholds (`UpperThresholdNonCritical`, …).
pub fn legacy_thresholds(v: &Value, factor: f64) -> Vec<(&'static str, f64)> {
    [
        ("UpperThresholdNonCritical", "upper_caution"),
        ("UpperThresholdCritical", "upper_critical"),
        ("UpperThresholdFatal", "upper_fatal"),
        ("LowerThresholdNonCritical", "lower_caution"),
        ("LowerThresholdCritical", "lower_critical"),
        ("LowerThresholdFatal", "lower_fatal"),
    ]
    .into_iter()
    .filter_map(|(k, n)| v.get(k).and_then(num).map(|x| (n, bmc::scale(x, factor))))
    .collect()
}

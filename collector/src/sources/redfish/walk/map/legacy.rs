//! The legacy resources (`Thermal`, `Power`), read for the kinds of reading the newer ones do
//! not give a chassis.

use serde_json::Value;

use super::{Chassis, Ids, array, health, num, temperature, text};
use crate::model::bmc::{self, Component, Quantity, Reading, Scope};

/// A legacy `Thermal` resource of the chassis `parent`: its temperatures and fans.
pub fn legacy_thermal(ids: Ids<'_>, th: &Value, parent: &str) -> Vec<Reading> {
    let mut out = Vec::new();
    for t in array(th, "Temperatures") {
        let Some(value) = t.get("ReadingCelsius").and_then(num) else {
            continue;
        };
        let rid = t.get("@odata.id").and_then(Value::as_str).unwrap_or("");
        let name = text(t, "Name").unwrap_or(rid).to_string();
        let quantity = temperature(&name);
        let thresholds = legacy_thresholds(t, 1.0);
        out.push(legacy_reading(
            ids,
            t,
            name,
            parent,
            (quantity, value, "Cel"),
            thresholds,
        ));
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
        let name = text(f, "Name")
            .or_else(|| text(f, "FanName"))
            .unwrap_or(rid)
            .to_string();
        let unit = text(f, "ReadingUnits").unwrap_or("RPM");
        let thresholds = legacy_thresholds(f, factor);
        let mut r = legacy_reading(
            ids,
            f,
            name,
            parent,
            (q, bmc::scale(value, factor), unit),
            thresholds,
        );
        // Without a location, as the newer model's fans are.
        r.location = None;
        out.push(r);
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

/// One entry of a legacy array (`Temperatures`, `Fans`, `PowerControl`, `PowerSupplies`,
/// `Voltages`) as a reading of the chassis `parent`: identified by its `@odata.id`, its
/// state from its thresholds or its health.
fn legacy_reading(
    ids: Ids<'_>,
    entry: &Value,
    name: String,
    parent: &str,
    (quantity, value, unit): (Quantity, f64, &str),
    thresholds: Vec<(&'static str, f64)>,
) -> Reading {
    let rid = entry.get("@odata.id").and_then(Value::as_str).unwrap_or("");
    Reading {
        id: ids.of(rid),
        hw_type: quantity.sensor_type().into(),
        name,
        parent: Some(parent.to_string()),
        quantity,
        value,
        unit: unit.into(),
        location: text(entry, "PhysicalContext").map(bmc::snake),
        point: None,
        state: Reading::level(value, &thresholds, health(entry)),
        thresholds,
        scope: Default::default(),
    }
}

/// What a legacy `Power` resource of the chassis `parent` gives: power (`PowerControl`:
/// consumed, with its limit as a threshold; the average, minimum and maximum of its
/// interval; `PowerSupplies`: input and output watts) and voltages (`Voltages`, a supply's
/// line input voltage), each kind apart so that the caller takes only the kinds the newer
/// resources do not give; the supplies as components.
pub struct LegacyPower {
    /// Power readings.
    pub power: Vec<Reading>,
    /// Voltage readings.
    pub voltage: Vec<Reading>,
    /// The power supplies.
    pub supplies: Vec<Component>,
}

/// A legacy `Power` resource of the chassis `parent`.
pub fn legacy_power(ids: Ids<'_>, doc: &Value, chassis: &Chassis) -> LegacyPower {
    let parent = chassis.id.as_str();
    // PowerControl is the chassis' total.
    let total = chassis.total_scope();
    let mut out = LegacyPower {
        power: Vec::new(),
        voltage: Vec::new(),
        supplies: Vec::new(),
    };
    for c in array(doc, "PowerControl") {
        let name = text(c, "Name").unwrap_or("chassis power").to_string();
        let limit = c
            .get("PowerLimit")
            .and_then(|l| l.get("LimitInWatts"))
            .and_then(num);
        if let Some(w) = c.get("PowerConsumedWatts").and_then(num) {
            let thresholds = limit.map(|l| vec![("power_limit", l)]).unwrap_or_default();
            let mut r = legacy_reading(
                ids,
                c,
                name.clone(),
                parent,
                (Quantity::Power, w, "W"),
                thresholds,
            );
            r.scope = total;
            out.power.push(r);
        }
        let metrics = c.get("PowerMetrics");
        for (key, what) in [
            ("AverageConsumedWatts", "average"),
            ("MinConsumedWatts", "minimum"),
            ("MaxConsumedWatts", "maximum"),
        ] {
            if let Some(w) = metrics.and_then(|m| m.get(key)).and_then(num) {
                let mut r = legacy_reading(
                    ids,
                    c,
                    format!("{name} ({what})"),
                    parent,
                    (Quantity::Power, w, "W"),
                    Vec::new(),
                );
                // An interval statistic of the same draw: never summed with it.
                r.scope = Scope::Aside;
                out.power.push(r);
            }
        }
    }
    for p in array(doc, "PowerSupplies") {
        let rid = p.get("@odata.id").and_then(Value::as_str).unwrap_or("");
        let name = text(p, "Name")
            .or_else(|| text(p, "MemberId"))
            .unwrap_or(rid)
            .to_string();
        out.supplies.push(Component {
            id: ids.of(rid),
            hw_type: "power_supply".into(),
            name: name.clone(),
            parent: Some(parent.to_string()),
            model: text(p, "Model").map(str::to_string),
            serial: text(p, "SerialNumber").map(str::to_string),
            health: health(p),
        });
        for (key, what, q) in [
            ("PowerInputWatts", "input", Quantity::Power),
            ("PowerOutputWatts", "output", Quantity::Power),
            ("LineInputVoltage", "input", Quantity::Voltage),
        ] {
            if let Some(v) = p.get(key).and_then(num) {
                let mut r = legacy_reading(
                    ids,
                    p,
                    format!("{name} ({what})"),
                    parent,
                    (q, v, if q == Quantity::Voltage { "V" } else { "W" }),
                    Vec::new(),
                );
                r.hw_type = "power_supply".into();
                if key == "PowerOutputWatts" {
                    r.scope = Scope::SupplyOutput;
                }
                if q == Quantity::Voltage {
                    out.voltage.push(r);
                } else {
                    out.power.push(r);
                }
            }
        }
    }
    for v in array(doc, "Voltages") {
        let Some(volts) = v.get("ReadingVolts").and_then(num) else {
            continue;
        };
        let rid = v.get("@odata.id").and_then(Value::as_str).unwrap_or("");
        let name = text(v, "Name").unwrap_or(rid).to_string();
        out.voltage.push(legacy_reading(
            ids,
            v,
            name,
            parent,
            (Quantity::Voltage, volts, "V"),
            legacy_thresholds(v, 1.0),
        ));
    }
    out
}

//! TelemetryService metric reports.

use serde_json::Value;

use super::{Chassis, Ids, Out, array, num, strip};
use crate::model::bmc::{Quantity, Reading};

/// A `MetricReport` (NVIDIA HGX style): each fresh value as an excerpt of the sensor it names;
/// `chassis` tells which chassis a sensor path belongs to.
pub fn metric_report(
    ids: Ids<'_>,
    report: &Value,
    chassis: impl Fn(&str) -> Option<Chassis>,
) -> Out {
    let mut out = Out::default();
    for mv in array(report, "MetricValues") {
        let stale = mv
            .get("Oem")
            .and_then(|o| o.get("Nvidia"))
            .and_then(|n| n.get("MetricValueStale"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let (Some(prop), Some(value)) = (
            mv.get("MetricProperty").and_then(Value::as_str),
            mv.get("MetricValue").and_then(num),
        ) else {
            continue;
        };
        if stale {
            continue;
        }
        let uri = strip(prop).to_string();
        let name = uri.rsplit('/').next().unwrap_or(&uri).to_string();
        let lname = name.to_ascii_lowercase();
        let quantity = if lname.contains("temp") {
            Quantity::Temperature
        } else if lname.contains("energy") {
            Quantity::Energy
        } else if lname.contains("power") {
            Quantity::Power
        } else if lname.contains("voltage") {
            Quantity::Voltage
        } else {
            Quantity::Other
        };
        // The sensor's chassis: a GPU's readings carry its UUID.
        let owner = uri
            .split("/Chassis/")
            .nth(1)
            .and_then(|r| r.split('/').next())
            .and_then(|c| chassis(&format!("/redfish/v1/Chassis/{c}")));
        let (id, t, parent) = match owner {
            Some(Chassis { id, .. }) => (ids.of(&uri), quantity.sensor_type(), Some(id)),
            None => (ids.of(&uri), quantity.sensor_type(), None),
        };
        out.excerpts.push((
            Some(uri),
            Reading {
                id,
                hw_type: t.to_string(),
                name,
                parent,
                quantity,
                value,
                unit: String::new(),
                location: None,
                point: None,
                thresholds: Vec::new(),
                state: None,
                scope: Default::default(),
            },
        ));
    }
    out
}

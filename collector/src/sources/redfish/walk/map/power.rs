//! The newer power resources: `PowerSubsystem` → `PowerSupplies` → each supply (a component)
//! and its `Metrics` (input and output power, input voltage; excerpts of the sensors they
//! name, dropped where those sensors were read).

use serde_json::Value;

use super::{Ids, Origin, Out, Owner, Prop, prop, text};
use crate::model::bmc::{Quantity, Scope};

const SUPPLY_METRICS: &[Prop] = &[
    prop("InputPowerWatts", Quantity::Power, 1.0),
    prop("OutputPowerWatts", Quantity::Power, 1.0),
    prop("InputVoltage", Quantity::Voltage, 1.0),
    prop("EnergykWh", Quantity::Energy, 3.6e6),
];

/// A `PowerSupply` of the chassis `parent`: its component, and (with `metrics`, its
/// `PowerSupplyMetrics`) its readings.
pub fn power_supply(
    ids: Ids<'_>,
    url: &str,
    doc: &Value,
    parent: &str,
    metrics: Option<&Value>,
) -> Out {
    let mut out = Out::default();
    let id = out.resource(ids, url, doc, "power_supply", Some(parent));
    let Some(m) = metrics else { return out };
    let name = text(doc, "Name").unwrap_or(url);
    for p in SUPPLY_METRICS {
        let what = p.key.trim_end_matches("Watts").trim_end_matches("Voltage");
        let label = format!("{name} ({})", what.to_ascii_lowercase());
        let owner = Owner {
            id: &id,
            hw_type: "power_supply",
            name: &label,
            parent: Some(parent),
        };
        let before = out.excerpts.len();
        out.props(m, owner, std::slice::from_ref(p), Origin::Mirror);
        if p.key == "OutputPowerWatts" {
            for (_, r) in &mut out.excerpts[before..] {
                r.scope = Scope::SupplyOutput;
            }
        }
    }
    out
}

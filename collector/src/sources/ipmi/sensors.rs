//! Reading `ipmi-sensors`' output: one sensor a line, with its thresholds and state, and
//! what the sensor is about from its name and type.

use crate::model::bmc::{Level, Quantity, Reading, Scope};

fn threshold_names() -> [&'static str; 6] {
    [
        "lower_fatal",
        "lower_critical",
        "lower_caution",
        "upper_caution",
        "upper_critical",
        "upper_fatal",
    ]
}

/// One line of `ipmi-sensors --comma-separated-output --output-sensor-state
/// --output-sensor-thresholds`: `ID,Name,Type,State,Reading,Units,Lower NR,Lower C,Lower NC,
/// Upper NC,Upper C,Upper NR,Event`.
pub fn parse_line(target: &str, line: &str) -> Option<Reading> {
    let fields: Vec<&str> = line.split(',').collect();
    if fields.len() < 13 {
        return None;
    }
    // A name with commas: everything between the id and the last eleven fields.
    let n = fields.len();
    let name = fields[1..n - 11].join(",");
    let rest = &fields[n - 11..];
    let (ty, state, reading, units, event) = (rest[0], rest[1], rest[2], rest[3], rest[10]);
    let mut level = match state {
        "Nominal" => Some(Level::Ok),
        "Warning" => Some(Level::Warning),
        "Critical" => Some(Level::Critical),
        _ => None,
    };
    let value: Option<f64> = reading.parse().ok().filter(|v: &f64| v.is_finite());
    let lname = name.to_ascii_lowercase();
    let (quantity, factor) = if lname.contains("leak") && value.is_none() {
        // A generic digital discrete leak sensor FreeIPMI has no interpretation for: its
        // asserted state is the leak.
        if level.is_none() {
            if event.contains("'State Asserted'") {
                level = Some(Level::Critical);
            } else if event.contains("'State Deasserted'") {
                level = Some(Level::Ok);
            }
        }
        (Quantity::Leak, 1.0)
    } else {
        match units {
            "C" | "degrees C" => (Quantity::Temperature, 1.0),
            "RPM" if lname.contains("pump") => (Quantity::PumpRpm, 1.0),
            "RPM" => (Quantity::FanRpm, 1.0),
            "L per minute" | "liters per minute" => (Quantity::Flow, 1.0),
            "W" | "Watts" => (Quantity::Power, 1.0),
            "V" | "Volts" => (Quantity::Voltage, 1.0),
            "kPa" => (Quantity::Pressure, 1.0),
            _ => (Quantity::Other, 1.0),
        }
    };
    let thresholds = threshold_names()
        .into_iter()
        .zip(&rest[4..10])
        .filter_map(|(n, v)| v.parse::<f64>().ok().map(|x| (n, x * factor)))
        .collect();
    let value = match quantity {
        Quantity::Leak => match level {
            Some(Level::Ok) => 0.0,
            Some(Level::Warning) => 1.0,
            Some(Level::Critical) => 2.0,
            None => 3.0,
        },
        _ => value.map_or(f64::NAN, |v| v * factor),
    };
    let (location, scope) = ipmi_context(&lname, ty);
    Some(Reading {
        id: format!("{target}:sensor/{}", name.trim()),
        hw_type: if quantity == Quantity::Other {
            crate::model::bmc::snake(&ty.replace(' ', ""))
        } else {
            quantity.sensor_type().to_string()
        },
        name: name.trim().to_string(),
        parent: Some(target.to_string()),
        quantity,
        value,
        unit: units.to_string(),
        location,
        point: None,
        thresholds,
        state: if quantity == Quantity::Leak {
            None
        } else {
            level
        },
        scope: if quantity == Quantity::Power {
            scope
        } else {
            Scope::Auto
        },
    })
}

/// What an IPMI sensor is about, from its name (lower case) and SDR sensor type: the SDR
/// carries an entity ID, which `ipmi-sensors` does not print, so the names BMC vendors give
/// decide: `hw.sensor_location` (cpu, memory, gpu, power_supply, fan, liquid_inlet,
/// liquid_outlet, intake) and, for a
/// power sensor, whether it is the host's total (`Pwr Consumption`, `Total Power`, `System
/// Power`, `Avg Power`) or a supply's output.
fn ipmi_context(lname: &str, ty: &str) -> (Option<String>, Scope) {
    let words: Vec<&str> = lname
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let has = |w: &str| words.contains(&w);
    let starts = |p: &str| words.iter().any(|x| x.starts_with(p));
    let supply = ty == "Power Supply"
        || has("psu")
        || has("ps")
        || lname.contains("power supply")
        || words.iter().any(|w| {
            w.strip_prefix("psu")
                .or_else(|| w.strip_prefix("ps"))
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        });
    let location = if supply {
        Some("power_supply")
    } else if starts("cpu") || has("proc") || has("processor") || has("soc") {
        Some("cpu")
    } else if starts("gpu") {
        Some("gpu")
    } else if has("mem") || has("memory") || starts("dimm") {
        Some("memory")
    } else if starts("fan") {
        Some("fan")
    } else if has("coolant") || has("liquid") || has("water") {
        if has("inlet") || has("supply") {
            Some("liquid_inlet")
        } else if has("outlet") || has("return") {
            Some("liquid_outlet")
        } else {
            None
        }
    } else if has("inlet") || has("ambient") || has("intake") {
        Some("intake")
    } else {
        None
    };
    let scope = if supply {
        if has("out") || has("output") {
            Scope::SupplyOutput
        } else {
            Scope::Auto
        }
    } else if location.is_none()
        && (has("total")
            || has("system")
            || has("sys")
            || has("consumption")
            || has("node")
            || has("avg")
            || words == ["power"])
    {
        Scope::Host
    } else {
        Scope::Auto
    };
    (location.map(str::to_string), scope)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipmi_sensors_lines() {
        let r = parse_line(
            "bmc",
            "2,GPU1 Temp,Temperature,Critical,95.00,C,N/A,N/A,N/A,80.00,90.00,100.00,0018h",
        )
        .expect("parsed");
        assert_eq!(r.quantity, Quantity::Temperature);
        assert_eq!(r.value, 95.0);
        assert_eq!(r.state, Some(Level::Critical));
        assert_eq!(
            r.thresholds,
            vec![
                ("upper_caution", 80.0),
                ("upper_critical", 90.0),
                ("upper_fatal", 100.0)
            ]
        );
        let f = parse_line("bmc", "5,Coolant Flow,Other Units Based Sensor,Nominal,42.00,L per minute,N/A,N/A,N/A,N/A,N/A,N/A,0000h").expect("flow");
        assert_eq!((f.quantity, f.value), (Quantity::Flow, 42.0));
        let p = parse_line(
            "bmc",
            "4,Pump1 Tach,Fan,Nominal,3000.00,RPM,N/A,N/A,N/A,N/A,N/A,N/A,0000h",
        )
        .expect("pump");
        assert_eq!(p.quantity, Quantity::PumpRpm);
        let l = parse_line(
            "bmc",
            "9,Leak Sensor, Cold Plate,OEM Reserved,Critical,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,0002h",
        )
        .expect("leak");
        assert_eq!(
            (l.quantity, l.value, l.name.as_str()),
            (Quantity::Leak, 2.0, "Leak Sensor, Cold Plate")
        );
        let dry = parse_line(
            "bmc",
            "6,Leak Manifold,Cooling Device,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,'State Deasserted'",
        )
        .expect("dry");
        assert_eq!(dry.value, 0.0);
        let wet = parse_line(
            "bmc",
            "6,Leak Manifold,Cooling Device,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,N/A,'State Asserted'",
        )
        .expect("wet");
        assert_eq!(wet.value, 2.0);
        assert!(parse_line("bmc", "garbage").is_none());
    }
}

//! Prometheus names of the registry's metrics: the standard OTLP-to-Prometheus translation
//! (Prometheus' `otlptranslator` with suffixes), and the names earlier releases served.

use super::Metric;
use super::registry::{Kind, MetricDesc};

impl MetricDesc {
    /// The Prometheus name under the standard OTLP-to-Prometheus translation (Prometheus'
    /// `otlptranslator` with suffixes): unit suffix, `_ratio` for unit-1 gauges, `_total` for
    /// monotonic counters.
    pub fn prometheus_name(&self) -> String {
        let mut name: String = self
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        while name.contains("__") {
            name = name.replace("__", "_");
        }
        if let Some(suffix) = unit_suffix(self.unit, self.kind)
            && !name.split('_').any(|w| w == suffix)
            && !name.ends_with(&format!("_{suffix}"))
        {
            name.push('_');
            name.push_str(&suffix);
        }
        if self.kind == Kind::Counter && !name.ends_with("_total") {
            name.push_str("_total");
        }
        name
    }

    /// The Prometheus type.
    pub fn prometheus_type(&self) -> &'static str {
        match self.kind {
            Kind::Counter => "counter",
            Kind::Gauge | Kind::UpDownCounter => "gauge",
        }
    }
}

/// otlptranslator's `unitMap` (v1.0.0): the units it spells out; any other unit is kept as
/// written (`L`, `kPa`).
fn unit_word(u: &str) -> Option<&'static str> {
    Some(match u {
        "d" => "days",
        "h" => "hours",
        "min" => "minutes",
        "s" => "seconds",
        "ms" => "milliseconds",
        "us" => "microseconds",
        "ns" => "nanoseconds",
        "By" => "bytes",
        "KiBy" => "kibibytes",
        "MiBy" => "mebibytes",
        "GiBy" => "gibibytes",
        "TiBy" => "tibibytes",
        "KBy" => "kilobytes",
        "MBy" => "megabytes",
        "GBy" => "gigabytes",
        "TBy" => "terabytes",
        "m" => "meters",
        "V" => "volts",
        "A" => "amperes",
        "J" => "joules",
        "W" => "watts",
        "g" => "grams",
        "Cel" => "celsius",
        "Hz" => "hertz",
        "%" => "percent",
        _ => return None,
    })
}

/// otlptranslator's `perUnitMap` (v1.0.0): the units after a slash it spells out.
fn per_word(u: &str) -> Option<&'static str> {
    Some(match u {
        "s" => "second",
        "m" => "minute",
        "h" => "hour",
        "d" => "day",
        "w" => "week",
        "mo" => "month",
        "y" => "year",
        _ => return None,
    })
}

/// The Prometheus names earlier releases gave the metrics whose name changed (the translation
/// made exact; a name moved out of the conventions' `k8s.*` namespace): `[sinks]
/// legacy_names` serves these instead for one release.
pub const LEGACY_PROMETHEUS_NAMES: &[(Metric, &str)] = &[
    (Metric::CoolantFlow, "cooling_flow_liters_per_minute"),
    (Metric::CoolantPressure, "cooling_pressure_kilopascals"),
    (Metric::PodGpuAllocation, "k8s_pod_gpu_allocation"),
];

fn unit_suffix(unit: &str, kind: Kind) -> Option<String> {
    if unit == "1" {
        return (kind == Kind::Gauge).then(|| "ratio".to_string());
    }
    if unit.starts_with('{') {
        return None;
    }
    match unit.split_once('/') {
        Some((a, b)) => {
            let main = unit_word(a)
                .map(str::to_string)
                .unwrap_or_else(|| a.to_string());
            let per = per_word(b)
                .map(str::to_string)
                .unwrap_or_else(|| b.to_string());
            Some(format!("{main}_per_{per}"))
        }
        None => Some(
            unit_word(unit)
                .map(str::to_string)
                .unwrap_or_else(|| unit.to_string()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metric;
    use super::super::registry::{Group, Kind, MetricDesc};

    #[test]
    fn prometheus_names_follow_the_translation() {
        let n = |m: Metric| m.desc().prometheus_name();
        assert_eq!(n(Metric::Utilization), "hw_gpu_utilization_ratio");
        assert_eq!(n(Metric::MemoryUsage), "hw_gpu_memory_usage_bytes");
        assert_eq!(n(Metric::Power), "hw_power_watts");
        assert_eq!(n(Metric::Energy), "hw_energy_joules_total");
        assert_eq!(n(Metric::Temperature), "hw_temperature_celsius");
        assert_eq!(n(Metric::Status), "hw_status");
        assert_eq!(n(Metric::EccErrors), "hw_errors_total");
        assert_eq!(n(Metric::FanSpeed), "hw_fan_speed_ratio");
        assert_eq!(
            n(Metric::PcieThroughput),
            "gpu_pcie_throughput_bytes_per_second"
        );
        assert_eq!(n(Metric::ViolationTime), "gpu_violation_time_seconds_total");
        assert_eq!(n(Metric::ClockFrequency), "gpu_clock_frequency_hertz");
        assert_eq!(n(Metric::Info), "gpu_info");
        // Units otlptranslator does not spell out are kept as written.
        assert_eq!(n(Metric::CoolantFlow), "cooling_flow_L_per_min");
        assert_eq!(n(Metric::CoolantPressure), "cooling_pressure_kPa");
        assert_eq!(n(Metric::HostEnergy), "hw_host_energy_joules_total");
        assert_eq!(n(Metric::FanRpmLimit), "hw_fan_speed_limit_rpm");
        // otlptranslator's own cases (v1.0.0, UnderscoreEscapingWithSuffixes).
        let t = |name: &'static str, unit: &'static str, kind: Kind| {
            MetricDesc {
                name,
                unit,
                kind,
                attrs: &[],
                help: "",
                source: "",
                group: Group::Status,
            }
            .prometheus_name()
        };
        assert_eq!(t("system.io", "By", Kind::Counter), "system_io_bytes_total");
        assert_eq!(t("speed", "m/s", Kind::Gauge), "speed_meters_per_second");
        assert_eq!(
            t("cpu.utilization", "1", Kind::Gauge),
            "cpu_utilization_ratio"
        );
        assert_eq!(t("hits", "1", Kind::Counter), "hits_total");
        assert_eq!(t("requests", "{request}", Kind::Counter), "requests_total");
        assert_eq!(t("uptime", "d", Kind::Gauge), "uptime_days");
        assert_eq!(t("rate", "By/mo", Kind::Gauge), "rate_bytes_per_month");
        assert_eq!(
            t("http.server.duration", "ms", Kind::Gauge),
            "http_server_duration_milliseconds"
        );
    }
}

use std::sync::Arc;

use super::*;
use crate::model::{GpuInfo, Group};

fn slot(samples: Vec<Sample>) -> GpuSlot {
    let mut s = GpuSlot::new(GpuInfo::default());
    s.groups[Group::Errors.index()] = Arc::new(samples);
    s
}

fn codes(v: &[Finding]) -> Vec<(&'static str, HealthState, &'static str)> {
    v.iter()
        .map(|x| (x.code.as_str(), x.state, x.action.as_str()))
        .collect()
}

/// Rule by rule, what DCGM's health watches (PASS / WARN / FAIL) and GPUd (Healthy /
/// Degraded / Unhealthy, with its suggested action) decide, and what Junction decides.
#[test]
fn agrees_with_dcgm_and_gpud() {
    use HealthState::{Degraded, Failed};
    let ecc = |ty: &'static str, n: f64| {
        Sample::new(Metric::EccErrors, n)
            .with("hw.type", "gpu")
            .with("error.type", ty)
    };
    let temp = |loc: &'static str, v: f64| {
        Sample::new(Metric::Temperature, v).with("hw.sensor_location", loc)
    };
    let limit = |loc: &'static str, ty: &'static str, v: f64| {
        Sample::new(Metric::TemperatureLimit, v)
            .with("hw.sensor_location", loc)
            .with("hw.limit_type", ty)
    };
    let recovery = |name: &'static str| {
        [
            "none",
            "gpu_reset",
            "node_reboot",
            "drain_p2p",
            "drain_and_reset",
        ]
        .map(|n| {
            Sample::new(Metric::RecoveryAction, f64::from(u8::from(n == name)))
                .with("gpu.recovery_action", n)
        })
        .to_vec()
    };
    let clock = |r: &'static str| {
        vec![Sample::new(Metric::ClockEvent, 1.0).with("gpu.clock.event.reason", r)]
    };
    // (case, DCGM, GPUd, samples, rates, Junction's verdict)
    type Row = (
        &'static str,
        &'static str,
        &'static str,
        Vec<Sample>,
        Rates,
        Vec<(&'static str, HealthState, &'static str)>,
    );
    let rows: Vec<Row> = vec![
        (
            "volatile DBE",
            "FAIL",
            "-",
            vec![ecc("uncorrected", 1.0)],
            Rates::default(),
            vec![("ecc_uncorrectable", Failed, "reset_gpu")],
        ),
        (
            "corrected ECC only",
            "PASS",
            "Healthy (counted, no verdict)",
            vec![ecc("corrected", 5000.0)],
            Rates::default(),
            vec![],
        ),
        (
            "row remap failed",
            "FAIL",
            "Unhealthy, HARDWARE_INSPECTION",
            vec![Sample::new(Metric::RemapFailure, 1.0)],
            Rates::default(),
            vec![("remap_failed", Failed, "drain_and_service")],
        ),
        (
            "row remap pending",
            "-",
            "Unhealthy, REBOOT_SYSTEM",
            vec![Sample::new(Metric::RemapPending, 1.0)],
            Rates::default(),
            vec![("remap_pending", Degraded, "reboot_node")],
        ),
        (
            "retirement pending",
            "WARN",
            "-",
            vec![Sample::new(Metric::RetiredPending, 1.0)],
            Rates::default(),
            vec![("retired_pages_pending", Degraded, "reset_gpu")],
        ),
        (
            "63 retired pages",
            "FAIL",
            "-",
            vec![
                Sample::new(Metric::RetiredPages, 40.0),
                Sample::new(Metric::RetiredPages, 23.0),
            ],
            Rates::default(),
            vec![("retired_pages_excess", Failed, "drain_and_service")],
        ),
        (
            "recovery action reset",
            "FAIL",
            "-",
            recovery("gpu_reset"),
            Rates::default(),
            vec![("recovery_action", Failed, "reset_gpu")],
        ),
        (
            "recovery action reboot",
            "FAIL",
            "Unhealthy, REBOOT_SYSTEM",
            recovery("node_reboot"),
            Rates::default(),
            vec![("recovery_action", Failed, "reboot_node")],
        ),
        (
            "recovery action drain and reset",
            "FAIL",
            "-",
            recovery("drain_and_reset"),
            Rates::default(),
            vec![("recovery_action", Failed, "reset_gpu")],
        ),
        (
            "recovery action drain P2P",
            "WARN",
            "-",
            recovery("drain_p2p"),
            Rates::default(),
            vec![("recovery_action", Degraded, "drain_and_service")],
        ),
        (
            "recovery action none",
            "PASS",
            "Healthy",
            recovery("none"),
            Rates::default(),
            vec![],
        ),
        (
            "thermal violation rising",
            "WARN",
            "-",
            vec![],
            Rates {
                thermal_violation_rising: true,
                ..Rates::default()
            },
            vec![("thermal_slowdown", Degraded, "none")],
        ),
        (
            "HW thermal slowdown",
            "WARN",
            "Unhealthy at ≥ 0.6/min",
            clock("hw_thermal_slowdown"),
            Rates::default(),
            vec![("thermal_slowdown", Degraded, "none")],
        ),
        (
            "HW slowdown",
            "-",
            "Unhealthy at ≥ 0.6/min",
            clock("hw_slowdown"),
            Rates::default(),
            vec![("hw_slowdown", Degraded, "none")],
        ),
        (
            "die over slowdown",
            "-",
            "Degraded (GPU_MAX)",
            vec![temp("gpu_die", 91.0), limit("gpu_die", "throttled", 90.0)],
            Rates::default(),
            vec![("temperature_over_slowdown", Degraded, "none")],
        ),
        (
            "HBM over its maximum",
            "-",
            "Degraded (MEM_MAX)",
            vec![
                temp("memory_junction", 96.0),
                limit("memory_junction", "max", 95.0),
            ],
            Rates::default(),
            vec![("temperature_over_slowdown", Degraded, "none")],
        ),
        (
            "HBM under its maximum",
            "PASS",
            "Healthy",
            vec![
                temp("memory_junction", 90.0),
                limit("memory_junction", "max", 95.0),
            ],
            Rates::default(),
            vec![],
        ),
        (
            "PCIe replays 20/min (Gen4 x16 limit 16)",
            "WARN",
            "-",
            vec![],
            Rates {
                pcie_replays_per_min: Some(20.0),
                ..Rates::default()
            },
            vec![("pcie_replay_rate", Degraded, "none")],
        ),
        (
            "PCIe replays 10/min",
            "PASS",
            "-",
            vec![],
            Rates {
                pcie_replays_per_min: Some(10.0),
                ..Rates::default()
            },
            vec![],
        ),
        (
            "Xid 94",
            "WARN",
            "-",
            vec![],
            Rates {
                xids: vec![94],
                ..Rates::default()
            },
            vec![("xid_contained", Degraded, "restart_app")],
        ),
        (
            "Xid 63",
            "WARN",
            "-",
            vec![],
            Rates {
                xids: vec![63],
                ..Rates::default()
            },
            vec![("xid_retirement", Degraded, "none")],
        ),
        (
            "corrected ECC rising",
            "WARN (placeholder rate)",
            "Healthy (no verdict)",
            vec![],
            Rates {
                ecc_corrected_per_hour: Some((500.0, 20.0)),
                ..Rates::default()
            },
            vec![("ecc_correctable_rising", Degraded, "none")],
        ),
        (
            "a signal that cannot be read",
            "-",
            "-",
            vec![],
            Rates {
                unreadable: vec!["ecc_uncorrected_volatile".into()],
                ..Rates::default()
            },
            vec![("signal_unreadable", Degraded, "none")],
        ),
    ];
    for (case, dcgm, gpud, samples, rates, want) in rows {
        let got = codes(&evaluate(&slot(samples), &rates, 100.0));
        assert_eq!(got, want, "{case} (DCGM {dcgm}, GPUd {gpud})");
        // Where DCGM fails a GPU, Junction fails it; where DCGM warns, Junction degrades.
        let worst = got.iter().map(|x| x.1).max_by_key(|s| match s {
            HealthState::Ok => 0,
            HealthState::Degraded => 1,
            HealthState::PredictedFailure => 2,
            HealthState::Failed => 3,
        });
        match dcgm {
            "FAIL" => assert_eq!(worst, Some(Failed), "{case}"),
            d if d.starts_with("WARN") => assert_eq!(worst, Some(Degraded), "{case}"),
            "PASS" => assert_eq!(worst, None, "{case}"),
            _ => {}
        }
    }
}

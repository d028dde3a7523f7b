//! Counting, de-duplication, bounds and held reasons, through the model.

use super::*;
use crate::model::HealthState;

fn report(via: Via, code: u32) -> Report {
    Report {
        via,
        bus_line: false,
        pci: Some("0000:3b:00".into()),
        uuid: None,
        code,
        time: SystemTime::now(),
        pid: None,
        process: None,
        gpu_instance: None,
        compute_instance: None,
        message: format!("NVRM: Xid (PCI:0000:3b:00): {code}, test"),
        attrs: Vec::new(),
        fatal: None,
        recovery_action: None,
    }
}

fn count(m: &Model, id: &str, code: u32) -> u64 {
    lock(&m.xids.inner)
        .saved
        .counters
        .get(id)
        .and_then(|c| c.get(&code))
        .copied()
        .unwrap_or(0)
}

#[test]
fn two_paths_count_once_and_one_path_counts_every_line() {
    let m = Model::default();
    m.learn_gpu_uuid_checked("0000:3b:00", "GPU-aaaa");
    assert!(m.record_xid(report(Via::Kmsg, 13)));
    assert!(
        !m.record_xid(report(Via::Nvml, 13)),
        "the other path: a duplicate"
    );
    assert!(
        m.record_xid(report(Via::Kmsg, 13)),
        "a second line is a second XID"
    );
    assert!(m.record_xid(report(Via::Nvml, 31)));
    assert_eq!(count(&m, "GPU-aaaa", 13), 2);
    assert_eq!(count(&m, "GPU-aaaa", 31), 1);
    // An Xid 79 line and the bus line that follows it: one occurrence.
    assert!(m.record_xid(report(Via::Kmsg, 79)));
    let mut bus = report(Via::Kmsg, 0);
    bus.bus_line = true;
    assert!(!m.record_xid(bus));
    assert_eq!(count(&m, "GPU-aaaa", 79), 1);
    assert_eq!(
        crate::model::health::verdict(&m.health.reasons("GPU-aaaa")),
        HealthState::Failed
    );
}

/// Kernel log, file and NVML: one XID however many paths report it, the Xid 79 line
/// and its bus line included.
#[test]
fn three_paths_count_once() {
    let m = Model::default();
    m.learn_gpu_uuid_checked("0000:3b:00", "GPU-aaaa");
    let bus = |via| Report {
        bus_line: true,
        ..report(via, 0)
    };
    assert!(m.record_xid(report(Via::Kmsg, 79)));
    for r in [
        bus(Via::Kmsg),
        report(Via::File, 79),
        bus(Via::File),
        report(Via::Nvml, 79),
    ] {
        assert!(!m.record_xid(r.clone()), "{r:?}");
    }
    assert_eq!(count(&m, "GPU-aaaa", 79), 1);
    // Two XIDs each seen by all three paths: two.
    for _ in 0..2 {
        for via in [Via::Kmsg, Via::File, Via::Nvml] {
            m.record_xid(report(via, 13));
        }
    }
    assert_eq!(count(&m, "GPU-aaaa", 13), 2);
    assert!(m.record_sxid(
        Via::Kmsg,
        "0000:05:00.0",
        20034,
        Some(true),
        None,
        "x".into()
    ));
    assert!(!m.record_sxid(
        Via::File,
        "0000:05:00.0",
        20034,
        Some(true),
        None,
        "x".into()
    ));
}

/// Nothing a line says can grow the state without bound: GPU ids, XID codes, switches,
/// SXid codes and learned UUIDs are capped, and a UUID is learned only for an NVIDIA
/// device on the PCI bus.
#[test]
fn what_lines_create_is_bounded() {
    let m = Model::default();
    m.add_gpu(crate::model::GpuInfo {
        uuid: "GPU-real".into(),
        pci_bus_id: "0000:18:00.0".into(),
        ..Default::default()
    });
    for i in 0..1000u32 {
        let mut r = report(Via::Kmsg, 13);
        r.pci = Some(format!("{:04x}:{:02x}:00", 0x100 + i / 256, i % 256));
        m.record_xid(r);
        m.record_xid(report(Via::Kmsg, 1000 + i));
        m.record_sxid(
            Via::Kmsg,
            &format!("{i:04x}:05:00.0"),
            12028,
            None,
            None,
            "x".into(),
        );
        m.record_sxid(
            Via::Kmsg,
            "0000:06:00.0",
            30000 + i,
            Some(false),
            None,
            "x".into(),
        );
    }
    let mut r = report(Via::Kmsg, 13);
    r.pci = Some("0000:18:00".into());
    m.record_xid(r);
    let i = lock(&m.xids.inner);
    assert!(
        i.saved.counters.len() <= MAX_UNKNOWN + 2,
        "{}",
        i.saved.counters.len()
    );
    assert_eq!(
        i.saved.counters["GPU-real"][&13], 1,
        "the inventory's GPU is always counted"
    );
    let codes: Vec<u32> = i
        .saved
        .counters
        .values()
        .flat_map(|c| c.keys().copied())
        .collect();
    assert!(
        codes.iter().all(|c| *c == 13 || *c == OTHER_XID),
        "{codes:?}"
    );
    assert!(
        i.saved.sxid.len() <= MAX_SWITCHES + 1,
        "{}",
        i.saved.sxid.len()
    );
    assert!(i.saved.sxid.values().all(|c| c.len() <= MAX_SXID_CODES + 2));
    drop(i);
    // The PCI address is on no bus here: nothing learned.
    assert!(!m.learn_gpu_uuid("0000:99:00", "GPU-deadbeef-0000-4000-8000-000000000000"));
    for i in 0..1000u32 {
        m.learn_gpu_uuid_checked(&format!("{i:04x}:99:00"), "GPU-x");
    }
    assert_eq!(lock(&m.xids.inner).pci_uuid.len(), MAX_LEARNED);
    assert!(
        !m.learn_gpu_uuid_checked("0000:18:00", "GPU-forged"),
        "the inventory's own"
    );
    assert!(
        !m.learn_gpu_uuid_checked("0000:77:00", "GPU-real"),
        "another GPU's UUID"
    );
}

/// An Xid 154 "to none" does not clear the reason while NVML still reports an action.
#[test]
fn xid_154_to_none_does_not_clear_what_nvml_still_reports() {
    let m = Model::default();
    let slot = m.add_gpu(crate::model::GpuInfo {
        uuid: "GPU-b".into(),
        pci_bus_id: "0000:3b:00.0".into(),
        ..Default::default()
    });
    let mut r = report(Via::Kmsg, 154);
    r.recovery_action = Some(1);
    m.record_xid(r);
    lock(&slot).groups[0] = std::sync::Arc::new(vec![
        Sample::new(Metric::RecoveryAction, 1.0).with("gpu.recovery_action", "gpu_reset"),
        Sample::new(Metric::RecoveryAction, 0.0).with("gpu.recovery_action", "none"),
    ]);
    let mut r = report(Via::Kmsg, 154);
    r.recovery_action = Some(0);
    m.record_xid(r);
    assert_eq!(
        m.health.reasons("GPU-b")[0].code.as_str(),
        "xid_154",
        "held"
    );
    lock(&slot).groups[0] = std::sync::Arc::new(vec![
        Sample::new(Metric::RecoveryAction, 0.0).with("gpu.recovery_action", "gpu_reset"),
        Sample::new(Metric::RecoveryAction, 1.0).with("gpu.recovery_action", "none"),
    ]);
    let mut r = report(Via::Kmsg, 154);
    r.recovery_action = Some(0);
    m.record_xid(r);
    assert!(m.health.reasons("GPU-b").is_empty(), "NVML agrees: cleared");
}

#[test]
fn xid_154_raises_and_clears_by_value() {
    let m = Model::default();
    m.learn_gpu_uuid_checked("0000:3b:00", "GPU-b");
    let mut r = report(Via::Kmsg, 154);
    r.recovery_action = Some(1);
    m.record_xid(r);
    let reasons = m.health.reasons("GPU-b");
    assert_eq!(reasons[0].code.as_str(), "xid_154");
    assert_eq!(reasons[0].action.as_str(), "reset_gpu");
    let mut r = report(Via::Kmsg, 154);
    r.recovery_action = Some(0);
    m.record_xid(r);
    assert!(m.health.reasons("GPU-b").is_empty());
}

#[test]
fn the_xids_dcgm_fails_a_gpu_for_fail_it_until_a_reset() {
    // DCGM's health watch fails a GPU for Xid 48, 74, 79, 95, 119, 120, 140; 94 only warns
    // (the health rules degrade it), application XIDs do nothing to the GPU.
    for (code, reason, action) in [
        (48, "xid_fatal", "reset_gpu"),
        (74, "xid_fatal", "drain_and_service"),
        (79, "xid_79", "reboot_node"),
        (95, "xid_fatal", "reset_gpu"),
        (119, "xid_fatal", "reset_gpu"),
        (120, "xid_fatal", "reset_gpu"),
        (140, "xid_fatal", "reset_gpu"),
    ] {
        let m = Model::default();
        m.learn_gpu_uuid_checked("0000:3b:00", "GPU-b");
        m.record_xid(report(Via::Kmsg, code));
        let reasons = m.health.reasons("GPU-b");
        assert_eq!(reasons.len(), 1, "Xid {code}: {reasons:?}");
        assert_eq!(
            (
                reasons[0].code.as_str(),
                reasons[0].state,
                reasons[0].action.as_str()
            ),
            (reason, HealthState::Failed, action),
            "Xid {code}"
        );
        // A reset clears what a reset cures; Xid 79 holds until the node reboots.
        m.gpu_recovered("GPU-b");
        assert_eq!(
            m.health.reasons("GPU-b").is_empty(),
            code != 79,
            "Xid {code} after a reset"
        );
    }
    for code in [13, 31, 43, 45, 94] {
        let m = Model::default();
        m.learn_gpu_uuid_checked("0000:3b:00", "GPU-b");
        m.record_xid(report(Via::Kmsg, code));
        assert!(m.health.reasons("GPU-b").is_empty(), "Xid {code}");
    }
}

#[test]
fn a_nic_line_names_the_gpus_of_its_rail_and_a_crash_is_remembered_under_its_boot() {
    use crate::model::fabric::{Affinity, Rail};
    use crate::model::signatures::index_of;
    use crate::model::xid::signatures::SignatureReport;
    let m = Model::default();
    for (i, bus) in [0x18u8, 0x2a].iter().enumerate() {
        m.add_gpu(crate::model::GpuInfo {
            index: i as u32,
            uuid: format!("GPU-{i}"),
            pci_bus_id: format!("0000:{bus:02x}:00.0"),
            ..Default::default()
        });
    }
    let rail = |dev: &str, pci: &str| Rail {
        device: dev.into(),
        affinity: Affinity::Switch,
        pci: Some(pci.into()),
    };
    m.fabric.set_rails(
        [
            (
                "0000:18:00.0".to_string(),
                vec![rail("mlx5_0", "0000:c0:00.0")],
            ),
            (
                "0000:2a:00.0".to_string(),
                vec![rail("mlx5_1", "0000:c1:00.0")],
            ),
        ]
        .into(),
    );
    let sig = index_of("mlx5_degraded").expect("mlx5_degraded");
    assert!(m.record_signature(SignatureReport {
        sig,
        via: Some(Via::Kmsg),
        pci: Some("0000:c1:00.0".into()),
        message: "mlx5_core 0000:c1:00.0 ens1f0np0: TX timeout detected".into(),
        ..SignatureReport::default()
    }));
    let events = m.events.read(0, 10).events;
    let e = events.last().expect("an event");
    assert_eq!(e.hw_id.as_deref(), Some("PCI-0000:c1:00.0"), "the NIC");
    let attr = |k: &str| {
        e.attrs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    };
    assert_eq!(attr("gpu.ids").as_deref(), Some("GPU-1"), "its rail's GPU");
    // A panic of an earlier boot goes into the history under that boot, at its time.
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    assert!(m.record_signature(SignatureReport {
        sig: index_of("kernel_panic").expect("kernel_panic"),
        via: Some(Via::Crash),
        message: "Kernel panic - not syncing: Fatal exception".into(),
        time: Some(when),
        boot: Some("boot-before".into()),
        ..SignatureReport::default()
    }));
    let h = m.history.entries();
    let p = h.last().expect("a history entry");
    assert_eq!(
        (p.boot.as_str(), p.code.as_str(), p.ms),
        ("boot-before", "kernel_panic", 1_700_000_000_000)
    );
}

/// A `/dev/kmsg` record is counted once, whichever reader comes upon it first; a later
/// record still is.
#[test]
fn a_kmsg_record_is_counted_once_by_two_readers() {
    let m = Model::new();
    let mut counted = 0;
    for seq in [5, 5, 6, 4, 6] {
        m.kmsg_checkpointed(seq, || counted += 1);
    }
    assert_eq!(counted, 2, "5 and 6, once each");
    assert_eq!(m.kmsg_next_seq(), 7);
}

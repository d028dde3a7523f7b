use super::gpu::ecc_per_hour;
use super::*;
use crate::sources::readings::Readings;

#[test]
fn an_evaluation_appends_to_the_history_without_copying_it() {
    use crate::model::{GpuInfo, Group, lock};
    let model = Model::new();
    for _ in 0..100 {
        model.remember("GPU-0", "xid", "13", "an earlier XID");
    }
    let slot = model.add_gpu(GpuInfo {
        uuid: "GPU-1".into(),
        ..Default::default()
    });
    lock(&slot).groups[Group::Errors.index()] = std::sync::Arc::new(vec![
        Sample::new(Metric::RemappedRows, 2.0).with("gpu.remap.type", "correctable"),
    ]);
    let before = std::sync::Arc::as_ptr(&model.history.entries());
    Evaluator::new(HealthConfig::default(), drift::ExpectConfig::default()).evaluate(&model);
    let after = model.history.entries();
    assert!(
        after.iter().any(|e| e.kind == "memory" && e.id == "GPU-1"),
        "the GPU's memory repairs were appended"
    );
    // Appended while no reader held the entries: in place, not into a copy of them all.
    assert_eq!(std::sync::Arc::as_ptr(&after), before);
}

#[test]
fn xid_counts_are_read_per_gpu_and_code_from_the_published_sets() {
    let model = Model::new();
    model.publish(
        "kmsg",
        "xid",
        vec![
            Sample::new(Metric::XidErrors, 3.0)
                .with("hw.id", "GPU-0")
                .with("gpu.xid", "79"),
            Sample::new(Metric::XidErrors, 1.0)
                .with("hw.id", "GPU-1")
                .with("gpu.xid", "13"),
            // Codes outside the catalog are counted together as "other": no code.
            Sample::new(Metric::XidErrors, 5.0)
                .with("hw.id", "GPU-1")
                .with("gpu.xid", "other"),
            Sample::new(Metric::XidLast, 1.0e9).with("hw.id", "GPU-0"),
        ],
    );
    let counts = xid_counts(&model);
    let want = BTreeMap::from([
        (("GPU-0".to_string(), 79), 3.0),
        (("GPU-1".to_string(), 13), 1.0),
    ]);
    assert_eq!(counts, want);
}

#[test]
fn the_ecc_rate_compares_the_hours_from_a_reading_a_minute() {
    // Evaluations every 10 s: 100 corrected errors an hour for two hours, then 500.
    let t0 = Instant::now();
    let mut ecc = Readings::default();
    let (mut total, mut most, mut rate) = (0.0, 0, None);
    for i in 0..3 * 360u64 {
        let s = i * 10;
        total += if s < 7200 { 100.0 } else { 500.0 } / 360.0;
        rate = ecc_per_hour(&mut ecc, t0 + Duration::from_secs(s), total);
        if s < 2990 {
            assert_eq!(rate, None, "no rate before 50 minutes ({s} s)");
        }
        most = most.max(ecc.len());
    }
    let (now, before) = rate.expect("a rate after three hours");
    // The last hour starts at the first reading within it, up to a minute late; the hour
    // before ends there (its last reading is the first at 500 an hour: 1.4 more).
    assert!((490.0..=500.5).contains(&now), "{now}");
    assert!((97.0..=102.0).contains(&before), "{before}");
    // Two hours at a reading a minute, and the last minute's (126): 720 were kept before.
    assert!(most <= 7 + 121, "{most} readings kept");
}

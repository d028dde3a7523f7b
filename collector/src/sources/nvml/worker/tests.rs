use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Busy, entered, publish, returned, watchdog};
use crate::model::{GpuInfo, Group, Metric, Model, Sample, lock};

/// A call is marked stuck once the watchdog has seen that same call (by its number, not
/// its name) in flight for the deadline: never before it has run that long, and not for
/// a run of short calls however long the GPU stays busy.
#[test]
fn a_call_is_stuck_once_the_watchdog_has_seen_it_in_flight_for_the_deadline() {
    let model = Model::new();
    let slot = model.add_gpu(GpuInfo::default());
    let busy = Arc::new(Mutex::new(Busy::default()));
    let watched = [(slot.clone(), busy.clone())];
    let timeout = Duration::from_millis(40);
    let stuck = || lock(&busy).stuck;

    // Short calls of the same name one after the other, each seen by a round: none held.
    for _ in 0..3 {
        entered(&busy, "nvmlDeviceGetPowerUsage");
        watchdog(&watched, timeout, &model);
        std::thread::sleep(timeout * 3 / 4);
        assert!(!returned(&busy, &slot, &model));
    }
    entered(&busy, "nvmlDeviceGetPowerUsage");
    watchdog(&watched, timeout, &model);
    assert!(!stuck(), "a new call is not the last one");

    // Seen, then seen again a deadline later: stuck, counted once, cleared at its return.
    std::thread::sleep(timeout);
    watchdog(&watched, timeout, &model);
    assert!(stuck());
    watchdog(&watched, timeout, &model);
    {
        let s = lock(&slot);
        assert_eq!(
            s.stuck.map(|(call, _)| call),
            Some("nvmlDeviceGetPowerUsage")
        );
        assert_eq!(s.timeouts, 1, "marked once");
    }
    assert!(returned(&busy, &slot, &model), "it was held");
    assert!(lock(&slot).stuck.is_none() && !stuck());

    // No call in flight between rounds: nothing is marked.
    std::thread::sleep(timeout);
    watchdog(&watched, timeout, &model);
    assert!(!stuck());
}

/// Calls returning while the watchdog marks them (a deadline of zero: a call seen twice
/// is stuck): every mark is of a call's own name, each one is found by that call's
/// return (as many marks as held returns), and nothing is left marked or raised.
#[test]
fn marks_racing_returns_leave_nothing_behind() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let model = Model::new();
    let slot = model.add_gpu(GpuInfo {
        uuid: "GPU-race".into(),
        ..GpuInfo::default()
    });
    let busy = Arc::new(Mutex::new(Busy::default()));
    let watched = [(slot.clone(), busy.clone())];
    let names = ["nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature", "x"];
    let done = AtomicBool::new(false);
    let held = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                watchdog(&watched, Duration::ZERO, &model);
                if let Some((call, _)) = lock(&slot).stuck {
                    assert!(names.contains(&call), "marked {call:?}");
                }
            }
        });
        let mut held = 0u32;
        // Until the watchdog has marked enough calls to have raced (bounded by a count).
        for i in 0..2_000_000usize {
            entered(&busy, names[i % names.len()]);
            if i % 3 == 0 {
                std::thread::yield_now();
            }
            held += u32::from(returned(&busy, &slot, &model));
            if held >= 200 {
                break;
            }
        }
        done.store(true, Ordering::Relaxed);
        watcher.join().expect("the watchdog did not panic");
        held
    });
    let s = lock(&slot);
    assert!(held > 0, "the watchdog marked no call");
    assert_eq!(s.timeouts, u64::from(held), "each mark found by its return");
    assert!(s.stuck.is_none() && !lock(&busy).stuck);
    assert!(model.health.reasons("GPU-race").is_empty());
}

#[test]
fn a_set_a_reader_held_past_its_replacement_is_freed_by_the_collecting_thread() {
    let model = Model::new();
    let slot = model.add_gpu(GpuInfo::default());
    let power = |v| vec![Sample::new(Metric::Power, v)];
    let held = |slot: &std::sync::Mutex<crate::model::GpuSlot>| {
        Arc::clone(&lock(slot).groups[Group::Power.index()])
    };
    // Nothing else holds it: freed at its replacement.
    publish(&slot, Group::Power, power(1.0));
    let first = Arc::downgrade(&held(&slot));
    publish(&slot, Group::Power, power(2.0));
    assert!(first.upgrade().is_none());
    // A reader (a snapshot) holds it past its replacement: when the reader lets go, it
    // is still held here, and freed at the next publish.
    let reader = held(&slot);
    let second = Arc::downgrade(&reader);
    publish(&slot, Group::Power, power(3.0));
    drop(reader);
    assert!(second.upgrade().is_some(), "left for the collecting thread");
    publish(&slot, Group::Power, power(4.0));
    assert!(second.upgrade().is_none(), "freed at the next publish");
    // A reader that never lets go keeps its own: no growth past the bound.
    let forever: Vec<_> = (0..super::MAX_RETIRED + 10)
        .map(|i| {
            let r = held(&slot);
            publish(&slot, Group::Power, power(i as f64));
            r
        })
        .collect();
    super::RETIRED.with_borrow(|r| assert_eq!(r.len(), super::MAX_RETIRED));
    drop(forever);
    publish(&slot, Group::Power, power(0.0));
    super::RETIRED.with_borrow(|r| assert!(r.is_empty()));
}

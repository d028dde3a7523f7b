//! The tracker on calls made up in the test: holdings, caps, exits and learning devices.

use super::*;
use junction_common::nv::{N_OPS, RM_ALLOC};

const UUID: [u8; 16] = [0x11; 16];

fn call(op: Op, client: u32, parent: u32, handle: u32, class: u32, value: u64) -> Call {
    Call {
        kind: record::CALL,
        op: op as u32,
        tgid: 100,
        tid: 100,
        flags: flag::OK,
        cmd: RM_ALLOC,
        client,
        parent,
        handle,
        class,
        value,
        comm: *b"train\0\0\0\0\0\0\0\0\0\0\0",
        ..Call::default()
    }
}

fn none(_: u32) -> Option<String> {
    None
}

#[test]
fn memory_follows_the_tree_and_frees_take_subtrees() {
    let mut t = Tracker::default();
    let mut n = Vec::new();
    // client 1, device 2 (instance 0), subdevice 3, memory 10 and 11 under the device,
    // memory 12 under the subdevice.
    t.call(&call(Op::RmAlloc, 1, 0, 1, 0x41, 0), &mut n);
    let mut dev = call(Op::RmAlloc, 1, 1, 2, class::DEVICE, 0);
    dev.extra = 0;
    t.call(&dev, &mut n);
    t.call(&call(Op::RmAlloc, 1, 2, 3, class::SUBDEVICE, 0), &mut n);
    t.call(&call(Op::RmAlloc, 1, 2, 10, 0x40, 1 << 20), &mut n);
    t.call(&call(Op::RmAlloc, 1, 2, 11, 0x3E, 2 << 20), &mut n);
    t.call(&call(Op::RmAlloc, 1, 3, 12, 0x40, 4 << 20), &mut n);
    // VA reservations do not count.
    t.call(&call(Op::RmAlloc, 1, 2, 13, 0x50A0, 1 << 40), &mut n);
    let mut reg = call(Op::UvmRegisterGpu, 1, 0, 0, 0, 0);
    reg.uuid = UUID;
    t.call(&reg, &mut n);
    let g = uuid_string(&UUID);
    assert!(n.contains(&Note::GpuRegistered {
        tgid: 100,
        uuid: g.clone()
    }));
    let p = &t.procs[&100];
    assert_eq!(p.allocated, 7 << 20);
    assert_eq!(t.holdings(p, &none)[&g].memory, 7 << 20);
    // Freeing the subdevice frees the memory under it.
    t.call(&call(Op::RmFree, 1, 2, 3, 0, 0), &mut n);
    let p = &t.procs[&100];
    assert_eq!(
        (p.freed, t.holdings(p, &none)[&g].memory),
        (4 << 20, 3 << 20)
    );
    // A failed call changes nothing.
    let mut failed = call(Op::RmFree, 1, 2, 10, 0, 0);
    failed.flags = 0;
    t.call(&failed, &mut n);
    assert_eq!(t.holdings(&t.procs[&100], &none)[&g].memory, 3 << 20);
    // Freeing the client frees the rest.
    t.call(&call(Op::RmFree, 1, 0, 1, 0, 0), &mut n);
    let p = &t.procs[&100];
    assert_eq!((p.allocated, p.freed), (7 << 20, 7 << 20));
    // Still registered with the GPU (the registration outlives the client here), 0 bytes.
    assert_eq!(t.holdings(p, &none).get(&g).map(|h| h.memory), None);
}

#[test]
fn device_instances_are_learned_across_processes() {
    let mut t = Tracker {
        minors: BTreeMap::from([(0, uuid_string(&UUID))]),
        ..Tracker::default()
    };
    let mut n = Vec::new();
    // The teacher opened /dev/nvidia0, the GPU it registers.
    let mut open = call(Op::RmAlloc, 0, 0, 0, 0, 0);
    open.kind = record::DEVICE;
    open.rdev = 195 << 20;
    t.call(&open, &mut n);
    let mut dev = call(Op::RmAlloc, 1, 1, 2, class::DEVICE, 0);
    dev.extra = 3;
    t.call(&dev, &mut n);
    let mut reg = call(Op::UvmRegisterGpu, 1, 0, 0, 0, 0);
    reg.uuid = UUID;
    t.call(&reg, &mut n);
    // Another process with two GPUs registered: device instance 3 is UUID.
    let mut other = call(Op::RmAlloc, 7, 7, 8, class::DEVICE, 0);
    other.tgid = 200;
    other.extra = 3;
    t.call(&other, &mut n);
    let mut mem = call(Op::RmAlloc, 7, 8, 9, 0x40, 5 << 20);
    mem.tgid = 200;
    t.call(&mem, &mut n);
    for u in [UUID, [0x22; 16]] {
        let mut r = call(Op::UvmRegisterGpu, 7, 0, 0, 0, 0);
        r.tgid = 200;
        r.uuid = u;
        t.call(&r, &mut n);
    }
    let h = t.holdings(&t.procs[&200], &none);
    assert_eq!(h[&uuid_string(&UUID)].memory, 5 << 20);
    assert_eq!(h[&uuid_string(&[0x22; 16])].memory, 0);
}

/// A process that claims an instance for a GPU whose device it never opened (or with
/// another GPU's device open) teaches nothing: another process's memory on that instance
/// is not moved to the GPU it named.
#[test]
fn a_lying_teacher_misleads_nobody_else() {
    for opened in [None, Some(1u32)] {
        let mut t = Tracker {
            minors: BTreeMap::from([(0, uuid_string(&UUID)), (1, uuid_string(&[0x22; 16]))]),
            ..Tracker::default()
        };
        let mut n = Vec::new();
        if let Some(m) = opened {
            let mut open = call(Op::RmAlloc, 0, 0, 0, 0, 0);
            open.kind = record::DEVICE;
            open.rdev = (195 << 20) | m;
            t.call(&open, &mut n);
        }
        let mut dev = call(Op::RmAlloc, 1, 1, 2, class::DEVICE, 0);
        dev.extra = 3;
        t.call(&dev, &mut n);
        let mut reg = call(Op::UvmRegisterGpu, 1, 0, 0, 0, 0);
        reg.uuid = UUID;
        t.call(&reg, &mut n);
        let mut other = call(Op::RmAlloc, 7, 7, 8, class::DEVICE, 0);
        other.tgid = 200;
        other.extra = 3;
        t.call(&other, &mut n);
        let mut mem = call(Op::RmAlloc, 7, 8, 9, 0x40, 5 << 20);
        mem.tgid = 200;
        t.call(&mem, &mut n);
        let h = t.holdings(&t.procs[&200], &none);
        assert!(h.is_empty(), "opened {opened:?}: {h:?}");
    }
}

#[test]
fn the_minor_names_the_gpu_when_nothing_else_does() {
    let mut t = Tracker::default();
    let mut n = Vec::new();
    let mut d = call(Op::RmAlloc, 0, 0, 0, 0, 0);
    d.kind = record::DEVICE;
    d.rdev = (195 << 20) | 3;
    t.call(&d, &mut n);
    assert_eq!(
        n,
        vec![Note::Started {
            tgid: 100,
            rdev: d.rdev
        }]
    );
    t.call(&call(Op::RmAlloc, 1, 1, 5, 0x40, 1 << 30), &mut n);
    let minor = |m: u32| (m == 3).then(|| "GPU-three".to_string());
    let h = t.holdings(&t.procs[&100], &minor);
    assert_eq!(h["GPU-three"].memory, 1 << 30);
    // nvidiactl (minor 255) is no GPU, even for a resolver that would name one for it.
    let mut ctl = d;
    ctl.rdev = (195 << 20) | 255;
    t.call(&ctl, &mut n);
    let any = |m: u32| Some(format!("GPU-minor-{m}"));
    let h = t.holdings(&t.procs[&100], &any);
    assert!(!h.contains_key("GPU-minor-255"), "{h:?}");
    assert!(h.contains_key("GPU-minor-3"));
}

/// A hostile process: a flood of fake objects, sizes past any GPU, GPUs the node does
/// not have, a free of a deep tree, a fork flood. Its figures may be wrong; the tracker
/// stays bounded and names only the inventory's GPUs.
#[test]
fn a_hostile_process_cannot_grow_the_tracker_or_invent_gpus() {
    let mut t = Tracker {
        inventory: BTreeSet::from([uuid_string(&UUID)]),
        max_object_bytes: 80 << 30,
        ..Tracker::default()
    };
    let mut n = Vec::new();
    for h in 0..(MAX_OBJECTS as u32 + 5000) {
        t.call(&call(Op::RmAlloc, 1, h, h + 1, 0x40, u64::MAX), &mut n);
    }
    let p = &t.procs[&100];
    assert_eq!(p.objects.len(), MAX_OBJECTS);
    let each: u64 = 80 << 30;
    assert_eq!(
        p.allocated,
        (MAX_OBJECTS as u64 + 5000) * each,
        "each clamped"
    );
    let mut fake = call(Op::UvmRegisterGpu, 1, 0, 0, 0, 0);
    fake.uuid = [0x99; 16];
    t.call(&fake, &mut n);
    let mut real = call(Op::UvmRegisterGpu, 1, 0, 0, 0, 0);
    real.uuid = UUID;
    t.call(&real, &mut n);
    let h = t.holdings(&t.procs[&100], &none);
    assert_eq!(h.len(), 1, "only the inventory's GPU: {:?}", h.keys());
    let one = &h[&uuid_string(&UUID)];
    assert_eq!(
        one.memory,
        MAX_OBJECTS as u64 * each,
        "only the objects kept are live"
    );
    // Sizes add without wrapping.
    let mut t3 = Tracker::default();
    t3.call(&call(Op::RmAlloc, 1, 1, 2, 0x40, u64::MAX), &mut n);
    t3.call(&call(Op::RmAlloc, 1, 1, 3, 0x40, u64::MAX), &mut n);
    assert_eq!(t3.procs[&100].allocated, u64::MAX, "saturated, not wrapped");
    // Each object counted at most the largest GPU's memory.
    let mut t2 = Tracker {
        max_object_bytes: 80 << 30,
        ..Tracker::default()
    };
    t2.call(&call(Op::RmAlloc, 1, 1, 2, 0x40, u64::MAX), &mut n);
    assert_eq!(t2.procs[&100].allocated, 80 << 30);
    // Freeing the root of the 16384-deep chain frees it all, in one linear walk.
    t.call(&call(Op::RmFree, 1, 0, 1, 0, 0), &mut n);
    assert!(t.procs[&100].objects.is_empty());
    // A fork flood: at most MAX_PROCS tracked.
    for tgid in 0..(MAX_PROCS as u32 + 100) {
        let mut c = call(Op::RmAlloc, 1, 1, 2, 0x40, 1);
        c.tgid = 1000 + tgid;
        t.call(&c, &mut n);
    }
    assert_eq!(t.procs.len(), MAX_PROCS);
}

#[test]
fn contexts_slow_calls_and_exit() {
    let mut t = Tracker::default();
    let mut n = Vec::new();
    let mut reg = call(Op::UvmRegisterGpu, 1, 0, 0, 0, 0);
    reg.uuid = UUID;
    t.call(&reg, &mut n);
    let mut tsg = call(Op::RmAlloc, 1, 2, 20, class::CHANNEL_GROUP, 0);
    tsg.extra = class::ENGINE_GRAPHICS;
    t.call(&tsg, &mut n);
    let mut copy = call(Op::RmAlloc, 1, 2, 21, class::CHANNEL_GROUP, 0);
    copy.extra = 9;
    t.call(&copy, &mut n);
    t.call(&call(Op::RmAlloc, 1, 2, 22, 0x40, 3 << 20), &mut n);
    assert_eq!(
        t.holdings(&t.procs[&100], &none)[&uuid_string(&UUID)],
        Holding {
            memory: 3 << 20,
            contexts: 1
        }
    );
    let mut slow = call(Op::RmControl, 1, 0, 2, 0, 0x2080_018E);
    slow.flags |= flag::SLOW;
    slow.latency_ns = 2_000_000_000;
    t.call(&slow, &mut n);
    assert!(n.contains(&Note::Slow {
        tgid: 100,
        op: Op::RmControl,
        command: 0x2080_018E,
        latency: Duration::from_secs(2)
    }));
    let mut stats = ProcStats::default();
    stats.calls[0] = 3;
    t.exit(
        &Exit {
            kind: record::EXIT,
            tgid: 100,
            ts_ns: 0,
            stats,
        },
        &mut n,
    );
    assert_eq!(n.last(), Some(&Note::Ended { tgid: 100 }));
    assert_eq!(t.procs[&100].stats.calls[..N_OPS][0], 3);
    // Its end freed what it held (the driver does so as its descriptors close, with no
    // RM_FREE): zero held on its GPU, which stays listed, and the bytes counted as freed.
    assert_eq!(
        t.holdings(&t.procs[&100], &none)[&uuid_string(&UUID)],
        Holding::default()
    );
    assert_eq!(t.procs[&100].allocated, 3 << 20);
    assert_eq!(t.procs[&100].freed, 3 << 20);
    // Map reads after the exit do not overwrite the final aggregates.
    t.stats(100, ProcStats::default());
    assert_eq!(t.procs[&100].stats.calls[0], 3);
    assert_eq!(t.expire(Duration::from_secs(60)).len(), 0);
    assert_eq!(t.expire(Duration::ZERO).len(), 1);
    assert!(t.procs.is_empty());
}

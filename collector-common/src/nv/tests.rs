use super::*;

fn block(fields: &[(usize, &[u8])]) -> [u8; PARAMS_LEN] {
    let mut p = [0u8; PARAMS_LEN];
    for (off, bytes) in fields {
        p[*off..*off + bytes.len()].copy_from_slice(bytes);
    }
    p
}

#[test]
fn command_values_match_the_ioc_encoding() {
    // _IOWR('F', nr, size) = 0xC0000000 | size << 16 | 'F' << 8 | nr.
    let iowr = |nr: u32, size: u32| 0xC000_0000 | size << 16 | 0x46 << 8 | nr;
    assert_eq!(RM_ALLOC, iowr(0x2B, 48));
    assert_eq!(RM_ALLOC_V21, iowr(0x2B, 32));
    assert_eq!(RM_FREE, iowr(0x29, 16));
    assert_eq!(RM_CONTROL, iowr(0x2A, 32));
    assert_eq!(RM_MAP_MEMORY, iowr(0x4E, 56));
    assert_eq!(XFER, iowr(0xD3, 16));
    assert_eq!(REGISTER_FD, iowr(0xC9, 4));
}

#[test]
fn classify_by_device_kind() {
    use crate::device::{RM, UVM, WATCHED};
    assert_eq!(classify(RM_ALLOC, RM), Op::RmAlloc);
    assert_eq!(classify(RM_ALLOC_V21, RM), Op::RmAlloc);
    assert_eq!(classify(RM_FREE, RM), Op::RmFree);
    assert_eq!(classify(0xC00446D4, RM), Op::AttachGpus);
    assert_eq!(classify(0xC00846D4, RM), Op::AttachGpus);
    assert_eq!(classify(0xC04846D2, RM), Op::OtherRm);
    // UVM numbers mean nothing on an RM node, RM values nothing on the UVM node.
    assert_eq!(classify(37, RM), Op::OtherRm);
    assert_eq!(classify(37, UVM), Op::UvmRegisterGpu);
    assert_eq!(classify(RM_ALLOC, UVM), Op::OtherUvm);
    assert_eq!(classify(UVM_INITIALIZE, UVM), Op::UvmInitialize);
    // A watched device is both.
    assert_eq!(classify(37, WATCHED), Op::UvmRegisterGpu);
    assert_eq!(classify(RM_CONTROL, WATCHED), Op::RmControl);
    assert_eq!(classify(UVM_INITIALIZE, WATCHED), Op::UvmInitialize);
}

#[test]
fn prefilter_passes_nvidia_and_drops_common_ioctls() {
    for cmd in [RM_ALLOC, RM_FREE, XFER, 0xC04846C8, 37, 1, UVM_INITIALIZE] {
        assert!(maybe_nvidia(cmd), "{cmd:#x}");
    }
    // TCGETS, FIONREAD, TIOCGWINSZ, BLKGETSIZE64, SIOCGIFADDR, a DRM ioctl.
    for cmd in [0x5401, 0x541B, 0x5413, 0x8008_1272, 0x8915, 0xC010_6400] {
        assert!(!maybe_nvidia(cmd), "{cmd:#x}");
    }
}

#[test]
fn rm_alloc_nvos64_memory() {
    let p = block(&[
        (0, &0xC1D0_0001u32.to_le_bytes()),
        (4, &0xCAFE_0002u32.to_le_bytes()),
        (8, &0xCAFE_0010u32.to_le_bytes()),
        (12, &0x40u32.to_le_bytes()),
        (16, &0x7fff_0000_1000u64.to_le_bytes()),
        (40, &0u32.to_le_bytes()),
    ]);
    let mut c = Call::default();
    let f = decode(Op::RmAlloc, RM_ALLOC, &p, &mut c);
    assert_eq!(f, Some(Follow::MemorySize(0x7fff_0000_1000 + 64)));
    assert_eq!(
        (c.client, c.parent, c.handle, c.class, c.status),
        (0xC1D0_0001, 0xCAFE_0002, 0xCAFE_0010, 0x40, 0)
    );
}

#[test]
fn what_encode_writes_decode_reads() {
    let mut p = [0u8; PARAMS_LEN];
    p[..48].copy_from_slice(&encode::rm_alloc(1, 2, 3, class::MEMORY_LOCAL_USER, 0x5000));
    let mut c = Call::default();
    assert_eq!(
        decode(Op::RmAlloc, RM_ALLOC, &p, &mut c),
        Some(Follow::MemorySize(0x5000 + 64))
    );
    assert_eq!((c.client, c.parent, c.handle, c.class), (1, 2, 3, 0x40));
    let m = encode::memory_allocation(3 << 20);
    assert_eq!(m[64..72], (3u64 << 20).to_le_bytes());
    let uuid = encode::uuid_bytes("GPU-8f6b2c1a-0000-4000-8000-00115dfa5726").expect("uuid");
    assert_eq!(uuid[0], 0x8f);
    assert_eq!(uuid[15], 0x26);
    assert_eq!(encode::uuid_bytes("GPU-8f6b"), None);
    assert_eq!(encode::uvm_register_gpu(uuid, 7)[28], 7);
}

#[test]
fn rm_alloc_nvos21_status_and_classes() {
    let p = block(&[
        (12, &0x80u32.to_le_bytes()),
        (16, &0x1000u64.to_le_bytes()),
        (28, &0x1Fu32.to_le_bytes()),
    ]);
    let mut c = Call::default();
    assert_eq!(
        decode(Op::RmAlloc, RM_ALLOC_V21, &p, &mut c),
        Some(Follow::DeviceId(0x1000))
    );
    assert_eq!(c.status, 0x1F);
    let p = block(&[
        (12, &0xA06Cu32.to_le_bytes()),
        (16, &0x2000u64.to_le_bytes()),
    ]);
    assert_eq!(
        decode(Op::RmAlloc, RM_ALLOC, &p, &mut c),
        Some(Follow::EngineType(0x2000 + 12))
    );
    // Virtual memory reserves address space: no size read; no pointer, no read.
    let p = block(&[
        (12, &0x50A0u32.to_le_bytes()),
        (16, &0x2000u64.to_le_bytes()),
    ]);
    assert_eq!(decode(Op::RmAlloc, RM_ALLOC, &p, &mut c), None);
    let p = block(&[(12, &0x40u32.to_le_bytes())]);
    assert_eq!(decode(Op::RmAlloc, RM_ALLOC, &p, &mut c), None);
}

#[test]
fn free_control_map_uvm() {
    let mut c = Call::default();
    let p = block(&[
        (0, &1u32.to_le_bytes()),
        (4, &2u32.to_le_bytes()),
        (8, &3u32.to_le_bytes()),
        (12, &0x56u32.to_le_bytes()),
    ]);
    decode(Op::RmFree, RM_FREE, &p, &mut c);
    assert_eq!((c.client, c.parent, c.handle, c.status), (1, 2, 3, 0x56));

    let mut c = Call::default();
    let p = block(&[
        (0, &1u32.to_le_bytes()),
        (4, &9u32.to_le_bytes()),
        (8, &0x2080_018Eu32.to_le_bytes()),
        (28, &0u32.to_le_bytes()),
    ]);
    decode(Op::RmControl, RM_CONTROL, &p, &mut c);
    assert_eq!((c.client, c.handle, c.value), (1, 9, 0x2080_018E));

    let mut c = Call::default();
    let p = block(&[(8, &7u32.to_le_bytes()), (24, &(2u64 << 20).to_le_bytes())]);
    decode(Op::RmMapMemory, RM_MAP_MEMORY, &p, &mut c);
    assert_eq!((c.handle, c.value), (7, 2 << 20));

    let mut c = Call::default();
    let uuid: [u8; 16] = core::array::from_fn(|i| i as u8 * 17);
    let p = block(&[
        (0, &uuid),
        (24, &5i32.to_le_bytes()),
        (28, &0xC1D0_0001u32.to_le_bytes()),
        (36, &0u32.to_le_bytes()),
    ]);
    decode(Op::UvmRegisterGpu, UVM_REGISTER_GPU, &p, &mut c);
    assert_eq!((c.uuid, c.extra, c.client), (uuid, 5, 0xC1D0_0001));

    let mut c = Call::default();
    let p = block(&[(0, &0x0300u32.to_le_bytes()), (4, &0x0400u32.to_le_bytes())]);
    decode(Op::AttachGpus, 0xC00846D4, &p, &mut c);
    assert_eq!((c.value, c.extra), (0x0300, 2));
    assert_eq!(params_len(Op::AttachGpus, 0xC00846D4), 4);
}

#[test]
fn params_len_never_exceeds_the_block() {
    for op in Op::ALL {
        for cmd in [RM_ALLOC, RM_ALLOC_V21, 0xC00446D4, 0xC10046D4] {
            assert!(params_len(op, cmd) <= PARAMS_LEN);
        }
    }
    assert_eq!(params_len(Op::RmAlloc, RM_ALLOC_V21), 32);
    assert_eq!(params_len(Op::RmAlloc, RM_ALLOC), 48);
}

#[test]
fn uuid_formats_like_nvml() {
    let raw = [
        0x7a, 0x3c, 0x2b, 0x11, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a,
        0xff,
    ];
    let mut out = [0u8; 40];
    format_uuid(&raw, &mut out);
    assert_eq!(
        core::str::from_utf8(&out).ok(),
        Some("GPU-7a3c2b11-0001-0203-0405-060708090aff")
    );
}

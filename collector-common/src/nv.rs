//! NVIDIA driver ioctls: command values, the operations Junction tells apart, and the decoder
//! of their parameter blocks.
//!
//! RM requests are `_IOWR('F', nr, size)` and the driver checks only the number and the size,
//! so an exact command value is a strong filter. `nvidia-uvm` commands are plain integers
//! (no `_IOC` encoding) and mean something only on the UVM device. Every function here is
//! `#[inline(always)]` and works on fixed-size arrays so that the BPF verifier accepts it.

/// `NV_MAJOR_DEVICE_NUMBER`: `/dev/nvidia0..N`, `/dev/nvidiactl` (minor 255),
/// `/dev/nvidia-modeset` (254).
pub const NV_MAJOR: u32 = 195;

/// `NV_IOCTL_MAGIC`.
pub const NV_IOCTL_MAGIC: u32 = 0x46;

/// `NV_ESC_RM_ALLOC` with `NVOS64_PARAMETERS` (48 bytes).
pub const RM_ALLOC: u32 = 0xC030_462B;
/// `NV_ESC_RM_ALLOC` with `NVOS21_PARAMETERS` (32 bytes).
pub const RM_ALLOC_V21: u32 = 0xC020_462B;
/// `NV_ESC_RM_FREE` (`NVOS00_PARAMETERS`, 16 bytes).
pub const RM_FREE: u32 = 0xC010_4629;
/// `NV_ESC_RM_CONTROL` (`NVOS54_PARAMETERS`, 32 bytes).
pub const RM_CONTROL: u32 = 0xC020_462A;
/// `NV_ESC_RM_MAP_MEMORY` (`nv_ioctl_nvos33_parameters_with_fd`, 56 bytes).
pub const RM_MAP_MEMORY: u32 = 0xC038_464E;
/// `NV_ESC_IOCTL_XFER_CMD` (`nv_ioctl_xfer_t {u32 cmd; u32 size; u64 ptr}`, 16 bytes): a
/// request whose parameters are larger than `_IOC_SIZE` can say.
pub const XFER: u32 = 0xC010_46D3;
/// `NV_ESC_REGISTER_FD` (`nv_ioctl_register_fd_t {int ctl_fd}`, 4 bytes).
pub const REGISTER_FD: u32 = 0xC004_46C9;
/// `NV_ESC_ATTACH_GPUS_TO_FD`'s number; its size is 4 × the number of GPU ids.
pub const ATTACH_GPUS_NR: u32 = 0xD4;
/// `UVM_INITIALIZE` (`UVM_INITIALIZE_PARAMS {u64 flags; u32 rmStatus}`, 16 bytes).
pub const UVM_INITIALIZE: u32 = 0x3000_0001;
/// `UVM_DEINITIALIZE`.
pub const UVM_DEINITIALIZE: u32 = 0x3000_0002;
/// `UVM_REGISTER_GPU` (`UVM_REGISTER_GPU_PARAMS`, 40 bytes: `gpu_uuid[16]@0`, `rmCtrlFd@24`,
/// `hClient@28`, `rmStatus@36`).
pub const UVM_REGISTER_GPU: u32 = 37;
/// `UVM_UNREGISTER_GPU` (`gpu_uuid[16]@0`, `rmStatus@16`).
pub const UVM_UNREGISTER_GPU: u32 = 38;
/// The largest `nvidia-uvm` command number (`UVM_IS_8_SUPPORTED`).
pub const UVM_MAX_NR: u32 = 2047;

/// Classes (`hClass`) that mean something for attribution (`class/*.h`).
pub mod class {
    /// `NV01_ROOT`, `NV01_ROOT_NON_PRIV`, `NV01_ROOT_CLIENT`: a new RM client.
    pub const ROOTS: [u32; 3] = [0x0, 0x1, 0x41];
    /// `NV01_DEVICE_0`: the process attaches to a GPU (`deviceId@0` of the parameters).
    pub const DEVICE: u32 = 0x80;
    /// `NV20_SUBDEVICE_0`.
    pub const SUBDEVICE: u32 = 0x2080;
    /// `NV01_MEMORY_LOCAL_USER`: video memory.
    pub const MEMORY_LOCAL_USER: u32 = 0x40;
    /// `NV01_MEMORY_SYSTEM`: system memory mapped for the GPU.
    pub const MEMORY_SYSTEM: u32 = 0x3E;
    /// `KEPLER_CHANNEL_GROUP_A`: a TSG, a context per engine (`engineType@12`).
    pub const CHANNEL_GROUP: u32 = 0xA06C;
    /// `NV2080_ENGINE_TYPE_GRAPHICS`: the graphics/compute engine.
    pub const ENGINE_GRAPHICS: u32 = 1;
    /// `NV_MEMORY_ALLOCATION_PARAMS.size`: the requested (in) and actual (out) size.
    pub const MEMORY_SIZE_OFFSET: u32 = 64;

    /// Whether a class allocates memory whose size is `NV_MEMORY_ALLOCATION_PARAMS.size`
    /// (`NV50_MEMORY_VIRTUAL` reserves address space only and is not counted).
    #[inline(always)]
    pub fn is_memory(class: u32) -> bool {
        class == MEMORY_LOCAL_USER || class == MEMORY_SYSTEM
    }

    /// Whether a class is a GPFIFO channel (`*_CHANNEL_GPFIFO_A`: low byte 0x6F).
    #[inline(always)]
    pub fn is_channel(class: u32) -> bool {
        class & 0xFF == 0x6F && class >= 0x906F
    }
}

/// The operations Junction counts apart.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    /// `NV_ESC_RM_ALLOC`.
    RmAlloc = 0,
    /// `NV_ESC_RM_FREE`.
    RmFree = 1,
    /// `NV_ESC_RM_CONTROL`.
    RmControl = 2,
    /// `NV_ESC_RM_MAP_MEMORY`.
    RmMapMemory = 3,
    /// `NV_ESC_REGISTER_FD`.
    RegisterFd = 4,
    /// `NV_ESC_ATTACH_GPUS_TO_FD`.
    AttachGpus = 5,
    /// `UVM_INITIALIZE`.
    UvmInitialize = 6,
    /// `UVM_REGISTER_GPU`.
    UvmRegisterGpu = 7,
    /// Any other request on an RM device node.
    OtherRm = 8,
    /// Any other request on the UVM device.
    OtherUvm = 9,
}

/// Number of [`Op`]s.
pub const N_OPS: usize = 10;

impl Op {
    /// Every op, in index order.
    pub const ALL: [Op; N_OPS] = [
        Op::RmAlloc,
        Op::RmFree,
        Op::RmControl,
        Op::RmMapMemory,
        Op::RegisterFd,
        Op::AttachGpus,
        Op::UvmInitialize,
        Op::UvmRegisterGpu,
        Op::OtherRm,
        Op::OtherUvm,
    ];

    /// The op with this index.
    #[inline(always)]
    pub fn from_u32(v: u32) -> Option<Op> {
        if (v as usize) < N_OPS {
            Some(Self::ALL[v as usize])
        } else {
            None
        }
    }

    /// Its name (the `gpu.driver.call` attribute).
    pub fn name(self) -> &'static str {
        match self {
            Op::RmAlloc => "rm_alloc",
            Op::RmFree => "rm_free",
            Op::RmControl => "rm_control",
            Op::RmMapMemory => "rm_map_memory",
            Op::RegisterFd => "register_fd",
            Op::AttachGpus => "attach_gpus",
            Op::UvmInitialize => "uvm_initialize",
            Op::UvmRegisterGpu => "uvm_register_gpu",
            Op::OtherRm => "other_rm",
            Op::OtherUvm => "other_uvm",
        }
    }

    /// Whether user space needs every call of this op (state changes), not just counts.
    #[inline(always)]
    pub fn is_lifecycle(self) -> bool {
        matches!(
            self,
            Op::RmAlloc | Op::RmFree | Op::AttachGpus | Op::UvmRegisterGpu | Op::UvmInitialize
        )
    }
}

/// A cheap test on the command alone, before the file's device is looked at: could this be
/// an NVIDIA request at all (type `'F'`, or a UVM number)? Terminal, socket and block ioctls
/// fail it at the cost of a few instructions.
#[inline(always)]
pub fn maybe_nvidia(cmd: u32) -> bool {
    (cmd >> 8) & 0xFF == NV_IOCTL_MAGIC || cmd <= UVM_MAX_NR || cmd & !0xF == 0x3000_0000
}

/// The op of a command on a device of the given [`crate::device`] kind.
#[inline(always)]
pub fn classify(cmd: u32, device: u32) -> Op {
    let rm_type = (cmd >> 8) & 0xFF == NV_IOCTL_MAGIC;
    if device == crate::device::UVM || (device == crate::device::WATCHED && !rm_type) {
        return match cmd {
            UVM_INITIALIZE => Op::UvmInitialize,
            UVM_REGISTER_GPU => Op::UvmRegisterGpu,
            _ => Op::OtherUvm,
        };
    }
    match cmd {
        RM_ALLOC | RM_ALLOC_V21 => Op::RmAlloc,
        RM_FREE => Op::RmFree,
        RM_CONTROL => Op::RmControl,
        RM_MAP_MEMORY => Op::RmMapMemory,
        REGISTER_FD => Op::RegisterFd,
        _ if rm_type && cmd & 0xFF == ATTACH_GPUS_NR && (cmd >> 30) == 3 => Op::AttachGpus,
        _ => Op::OtherRm,
    }
}

/// The `_IOC_SIZE` of a command.
#[inline(always)]
pub fn ioc_size(cmd: u32) -> u32 {
    (cmd >> 16) & 0x3FFF
}

/// The largest parameter prefix the decoder reads.
pub const PARAMS_LEN: usize = 56;

/// How many bytes of the parameter block the decoder needs for an op (never more than the
/// block's size, so that a read cannot run off the caller's memory).
#[inline(always)]
pub fn params_len(op: Op, cmd: u32) -> usize {
    match op {
        Op::RmAlloc => {
            if cmd == RM_ALLOC_V21 {
                32
            } else {
                48
            }
        }
        Op::RmFree => 16,
        Op::RmControl => 32,
        Op::RmMapMemory => 56,
        Op::RegisterFd => 4,
        // Up to eight GPU ids; the exact count is the command's size / 4.
        Op::AttachGpus => {
            if ioc_size(cmd) >= 32 {
                32
            } else if ioc_size(cmd) >= 16 {
                16
            } else {
                4
            }
        }
        Op::UvmInitialize => 16,
        Op::UvmRegisterGpu => 40,
        Op::OtherRm | Op::OtherUvm => 0,
    }
}

/// A call as user space receives it ([`crate::record::CALL`] or [`crate::record::DEVICE`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Call {
    /// [`crate::record`] kind.
    pub kind: u32,
    /// [`Op`] as u32.
    pub op: u32,
    /// Process.
    pub tgid: u32,
    /// Thread.
    pub tid: u32,
    /// `bpf_ktime_get_ns` at exit.
    pub ts_ns: u64,
    /// Time in the call.
    pub latency_ns: u64,
    /// `bpf_get_current_cgroup_id`.
    pub cgroup_id: u64,
    /// The syscall's return value.
    pub ret: i64,
    /// Kernel `dev_t` of the file.
    pub rdev: u32,
    /// The command (the inner one of an `XFER`).
    pub cmd: u32,
    /// [`crate::flag`] bits.
    pub flags: u32,
    /// The driver's status (`NV_OK` = 0).
    pub status: u32,
    /// RM client handle (`hRoot` / `hClient`).
    pub client: u32,
    /// Parent object handle.
    pub parent: u32,
    /// The object: new (alloc), freed (free), target (control, map).
    pub handle: u32,
    /// Class of an allocated object.
    pub class: u32,
    /// Bytes (memory size, mapped length), the control command, or the first GPU id.
    pub value: u64,
    /// The device instance (`NV01_DEVICE_0`), engine type (channel group), control-device fd
    /// (`REGISTER_FD`, `UVM_REGISTER_GPU`) or number of GPU ids (`ATTACH_GPUS`).
    pub extra: u32,
    /// Padding.
    pub pad: u32,
    /// The GPU UUID of `UVM_REGISTER_GPU`.
    pub uuid: [u8; 16],
    /// `bpf_get_current_comm`.
    pub comm: [u8; 16],
}

#[inline(always)]
fn u32_at(p: &[u8; PARAMS_LEN], off: usize) -> u32 {
    u32::from_le_bytes([p[off], p[off + 1], p[off + 2], p[off + 3]])
}

#[inline(always)]
fn u64_at(p: &[u8; PARAMS_LEN], off: usize) -> u64 {
    u64::from(u32_at(p, off)) | (u64::from(u32_at(p, off + 4)) << 32)
}

/// A second read the decoder asks for: a field of the parameters an `RM_ALLOC` points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// `NV_MEMORY_ALLOCATION_PARAMS.size` (u64) into [`Call::value`].
    MemorySize(u64),
    /// `NV0080_ALLOC_PARAMETERS.deviceId` (u32) into [`Call::extra`].
    DeviceId(u64),
    /// `NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS.engineType` (u32) into [`Call::extra`].
    EngineType(u64),
}

/// Decodes a parameter block (the first [`params_len`] bytes are meaningful) into `call`;
/// returns the second read an `RM_ALLOC` needs, if any. The driver's status is read too: at
/// `sys_exit` it is the answer.
#[inline(always)]
pub fn decode(op: Op, cmd: u32, p: &[u8; PARAMS_LEN], call: &mut Call) -> Option<Follow> {
    match op {
        Op::RmAlloc => {
            // NVOS21 and NVOS64 share hRoot@0, hObjectParent@4, hObjectNew@8, hClass@12,
            // pAllocParms@16; the status is @28 (NVOS21) or @40 (NVOS64).
            call.client = u32_at(p, 0);
            call.parent = u32_at(p, 4);
            call.handle = u32_at(p, 8);
            call.class = u32_at(p, 12);
            call.status = if cmd == RM_ALLOC_V21 {
                u32_at(p, 28)
            } else {
                u32_at(p, 40)
            };
            let params = u64_at(p, 16);
            if params == 0 {
                return None;
            }
            let class = call.class;
            if class::is_memory(class) {
                Some(Follow::MemorySize(
                    params + u64::from(class::MEMORY_SIZE_OFFSET),
                ))
            } else if class == class::DEVICE {
                Some(Follow::DeviceId(params))
            } else if class == class::CHANNEL_GROUP {
                Some(Follow::EngineType(params + 12))
            } else {
                None
            }
        }
        Op::RmFree => {
            call.client = u32_at(p, 0);
            call.parent = u32_at(p, 4);
            call.handle = u32_at(p, 8);
            call.status = u32_at(p, 12);
            None
        }
        Op::RmControl => {
            call.client = u32_at(p, 0);
            call.handle = u32_at(p, 4);
            call.value = u64::from(u32_at(p, 8));
            call.status = u32_at(p, 28);
            None
        }
        Op::RmMapMemory => {
            call.client = u32_at(p, 0);
            call.parent = u32_at(p, 4);
            call.handle = u32_at(p, 8);
            call.value = u64_at(p, 24);
            call.status = u32_at(p, 40);
            None
        }
        Op::RegisterFd => {
            call.extra = u32_at(p, 0);
            None
        }
        Op::AttachGpus => {
            call.value = u64::from(u32_at(p, 0));
            call.extra = ioc_size(cmd) / 4;
            None
        }
        Op::UvmInitialize => {
            call.value = u64_at(p, 0);
            call.status = u32_at(p, 8);
            None
        }
        Op::UvmRegisterGpu => {
            let mut i = 0;
            while i < 16 {
                call.uuid[i] = p[i];
                i += 1;
            }
            call.extra = u32_at(p, 24);
            call.client = u32_at(p, 28);
            call.status = u32_at(p, 36);
            None
        }
        Op::OtherRm | Op::OtherUvm => None,
    }
}

/// Per-process aggregates kept in the kernel (`STATS`), updated with atomic adds so that
/// threads issuing calls at once lose nothing.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcStats {
    /// Calls per [`Op`].
    pub calls: [u64; N_OPS],
    /// Failed calls per op (syscall error or driver status ≠ 0, on real devices).
    pub failed: [u64; N_OPS],
    /// Nanoseconds spent in calls per op.
    pub latency_ns: [u64; N_OPS],
    /// Bytes mapped with `RM_MAP_MEMORY`.
    pub mapped_bytes: u64,
    /// `bpf_get_current_cgroup_id` of the first call.
    pub cgroup_id: u64,
    /// Devices used (bits: [`crate::device_bit`]).
    pub devices: u64,
}

/// Formats a raw 16-byte GPU UUID the way NVML prints it (`GPU-xxxxxxxx-xxxx-…`).
pub fn format_uuid(raw: &[u8; 16], out: &mut [u8; 40]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out[..4].copy_from_slice(b"GPU-");
    let mut o = 4;
    for (i, b) in raw.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out[o] = b'-';
            o += 1;
        }
        out[o] = HEX[usize::from(b >> 4)];
        out[o + 1] = HEX[usize::from(b & 0xF)];
        o += 2;
    }
}

#[cfg(test)]
mod tests;

/// Parameter blocks as a CUDA process would pass them: the inverse of [`decode`], for the
/// workloads the tests and the demo run against a watched device.
pub mod encode {
    /// `NVOS64_PARAMETERS` (48 bytes) for `RM_ALLOC`: hRoot, hObjectParent, hObjectNew,
    /// hClass, pAllocParms (a user pointer), then pRightsRequested, paramsSize, flags, status.
    pub fn rm_alloc(client: u32, parent: u32, handle: u32, class: u32, params: u64) -> [u8; 48] {
        let mut p = [0u8; 48];
        p[0..4].copy_from_slice(&client.to_le_bytes());
        p[4..8].copy_from_slice(&parent.to_le_bytes());
        p[8..12].copy_from_slice(&handle.to_le_bytes());
        p[12..16].copy_from_slice(&class.to_le_bytes());
        p[16..24].copy_from_slice(&params.to_le_bytes());
        p
    }

    /// `NV_MEMORY_ALLOCATION_PARAMS` (128 bytes) asking for `bytes`.
    pub fn memory_allocation(bytes: u64) -> [u8; 128] {
        let mut p = [0u8; 128];
        let at = super::class::MEMORY_SIZE_OFFSET as usize;
        p[at..at + 8].copy_from_slice(&bytes.to_le_bytes());
        p
    }

    /// `NVOS00_PARAMETERS` (16 bytes) for `RM_FREE`: hRoot, hObjectParent, hObjectOld, status.
    pub fn rm_free(client: u32, parent: u32, handle: u32) -> [u8; 16] {
        let mut p = [0u8; 16];
        p[0..4].copy_from_slice(&client.to_le_bytes());
        p[4..8].copy_from_slice(&parent.to_le_bytes());
        p[8..12].copy_from_slice(&handle.to_le_bytes());
        p
    }

    /// `NVOS54_PARAMETERS` (32 bytes) for `RM_CONTROL`: hClient, hObject, cmd.
    pub fn rm_control(client: u32, object: u32, cmd: u32) -> [u8; 32] {
        let mut p = [0u8; 32];
        p[0..4].copy_from_slice(&client.to_le_bytes());
        p[4..8].copy_from_slice(&object.to_le_bytes());
        p[8..12].copy_from_slice(&cmd.to_le_bytes());
        p
    }

    /// `UVM_REGISTER_GPU_PARAMS` (40 bytes): the GPU's 16-byte UUID, then hClient at 28.
    pub fn uvm_register_gpu(uuid: [u8; 16], client: u32) -> [u8; 40] {
        let mut p = [0u8; 40];
        p[..16].copy_from_slice(&uuid);
        p[28..32].copy_from_slice(&client.to_le_bytes());
        p
    }

    /// The 16 bytes of a `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` UUID, if it is one.
    pub fn uuid_bytes(uuid: &str) -> Option<[u8; 16]> {
        let hex = uuid.strip_prefix("GPU-").unwrap_or(uuid).as_bytes();
        let mut out = [0u8; 16];
        let mut n = 0;
        let mut hi: Option<u8> = None;
        for &c in hex {
            if c == b'-' {
                continue;
            }
            let v = (c as char).to_digit(16)? as u8;
            match hi.take() {
                None => hi = Some(v),
                Some(h) => {
                    *out.get_mut(n)? = (h << 4) | v;
                    n += 1;
                }
            }
        }
        (n == 16 && hi.is_none()).then_some(out)
    }
}

//! NVML calls made through the raw symbols, for what `nvml-wrapper` does not expose or reads
//! in a way that real drivers break. Every `unsafe` block of the NVML source lives here.

use std::os::raw::{c_uint, c_ulonglong};

use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper::gpm::GpmSample;
use nvml_wrapper::{Device, FieldIdScheme, Nvml};
use nvml_wrapper_sys::bindings::{
    NVML_GPM_METRICS_GET_VERSION, nvmlFieldValue_t, nvmlGpmMetricsGet_t, nvmlMemory_t,
    nvmlTemperature_v1_t,
};

/// A symbol of the loaded library, or the error a missing one gives.
fn sym<T: Copy>(s: &Result<T, impl std::fmt::Display>) -> Result<T, NvmlError> {
    s.as_ref()
        .copied()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))
}

/// `nvmlDeviceGetMemoryInfo`: the v1 struct of old drivers (reserved memory counted as used).
pub fn memory_v1(nvml: &Nvml, d: &Device<'_>) -> Result<nvmlMemory_t, NvmlError> {
    let f = sym(&nvml.lib().nvmlDeviceGetMemoryInfo)?;
    let mut m = nvmlMemory_t {
        total: 0,
        free: 0,
        used: 0,
    };
    // SAFETY: `d.handle()` is a live handle from this library; `m` is a valid out-pointer.
    nvml_try(unsafe { f(d.handle(), &mut m) })?;
    Ok(m)
}

/// `nvmlDeviceGetRemappedRows`: (correctable, uncorrectable, pending, failure).
pub fn remapped_rows(
    nvml: &Nvml,
    d: &Device<'_>,
) -> Result<(c_uint, c_uint, c_uint, c_uint), NvmlError> {
    let f = sym(&nvml.lib().nvmlDeviceGetRemappedRows)?;
    let (mut a, mut b, mut p, mut x) = (0, 0, 0, 0);
    // SAFETY: a live handle and four valid out-pointers.
    nvml_try(unsafe { f(d.handle(), &mut a, &mut b, &mut p, &mut x) })?;
    Ok((a, b, p, x))
}

/// What the GPU fabric info says (`nvmlGpuFabricInfo_v3_t`, or the v1 struct).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricInfo {
    /// The fabric's cluster UUID.
    pub cluster_uuid: [u8; 16],
    /// The fabric manager's answer (an `nvmlReturn_t`), meaningful once completed.
    pub status: u32,
    /// Clique id.
    pub clique_id: u32,
    /// 0 not supported, 1 not started, 2 in progress, 3 completed.
    pub state: u8,
    /// The health mask (v3; `None` from the v1 call).
    pub health_mask: Option<u32>,
    /// 0 not supported, 1 healthy, 2 unhealthy, 3 limited capacity (v3).
    pub health_summary: Option<u8>,
}

/// `nvmlDeviceGetGpuFabricInfoV` with the v3 struct, else (a driver before R550, whose
/// library lacks the symbol, or one that answers the version with a mismatch) the v1
/// `nvmlDeviceGetGpuFabricInfo`, which has no health fields.
pub fn fabric_info(nvml: &Nvml, d: &Device<'_>) -> Result<FabricInfo, NvmlError> {
    use nvml_wrapper_sys::bindings::{nvmlGpuFabricInfo_t, nvmlGpuFabricInfo_v3_t};
    let lib = nvml.lib();
    if let Ok(f) = sym(&lib.nvmlDeviceGetGpuFabricInfoV) {
        // nvml.h: `#define nvmlGpuFabricInfo_v3 NVML_STRUCT_VERSION(GpuFabricInfo, 3)`.
        let mut v = nvmlGpuFabricInfo_v3_t {
            version: std::mem::size_of::<nvmlGpuFabricInfo_v3_t>() as c_uint | 3 << 24,
            clusterUuid: [0; 16],
            status: 0,
            cliqueId: 0,
            state: 0,
            healthMask: 0,
            healthSummary: 0,
        };
        // SAFETY: a live handle and a versioned struct of the size its version word states.
        match nvml_try(unsafe { f(d.handle(), &mut v) }) {
            Ok(()) => {
                return Ok(FabricInfo {
                    cluster_uuid: v.clusterUuid,
                    status: v.status,
                    clique_id: v.cliqueId,
                    state: v.state,
                    health_mask: Some(v.healthMask),
                    health_summary: Some(v.healthSummary),
                });
            }
            // NVML_ERROR_ARGUMENT_VERSION_MISMATCH: a driver that knows an older version.
            Err(NvmlError::UnexpectedVariant(25)) => {}
            Err(e) => return Err(e),
        }
    }
    let f = sym(&lib.nvmlDeviceGetGpuFabricInfo)?;
    let mut v = nvmlGpuFabricInfo_t {
        clusterUuid: [0; 16],
        status: 0,
        cliqueId: 0,
        state: 0,
    };
    // SAFETY: a live handle and a valid out-pointer of the v1 struct.
    nvml_try(unsafe { f(d.handle(), &mut v) })?;
    Ok(FabricInfo {
        cluster_uuid: v.clusterUuid,
        status: v.status,
        clique_id: v.cliqueId,
        state: v.state,
        health_mask: None,
        health_summary: None,
    })
}

/// GPU instance id (`gpu = true`) or compute instance id of a MIG device.
pub fn mig_id(nvml: &Nvml, m: &Device<'_>, gpu: bool) -> Result<u32, NvmlError> {
    let lib = nvml.lib();
    let f = if gpu {
        sym(&lib.nvmlDeviceGetGpuInstanceId)?
    } else {
        sym(&lib.nvmlDeviceGetComputeInstanceId)?
    };
    let mut id = 0;
    // SAFETY: a live MIG handle and a valid out-pointer.
    nvml_try(unsafe { f(m.handle(), &mut id) })?;
    Ok(id)
}

/// `nvmlDeviceGetTemperatureV` with an `nvmlTemperature_v1_t` for the GPU die sensor: the
/// replacement of `nvmlDeviceGetTemperature`, which CUDA 13 deprecates.
pub fn temperature_v(nvml: &Nvml, d: &Device<'_>) -> Result<i32, NvmlError> {
    let f = sym(&nvml.lib().nvmlDeviceGetTemperatureV)?;
    // nvml.h: `#define nvmlTemperature_v1 NVML_STRUCT_VERSION(Temperature, 1)`, i.e. the
    // struct size with the version in the top byte.
    let mut t = nvmlTemperature_v1_t {
        version: std::mem::size_of::<nvmlTemperature_v1_t>() as c_uint | 1 << 24,
        sensorType: 0,
        temperature: 0,
    };
    // SAFETY: a live handle and a versioned struct of the size its version word states.
    nvml_try(unsafe { f(d.handle(), &mut t) })?;
    Ok(t.temperature)
}

/// `nvmlDeviceGetMarginTemperature` (`nvmlMarginTemperature_v1_t`): the die's thermal margin,
/// degrees below its maximum operating temperature on the T.Limit scale of the
/// `NVML_FI_DEV_TEMPERATURE_*_TLIMIT` fields (nvidia-smi's "GPU T.Limit Temp").
pub fn margin_temperature(nvml: &Nvml, d: &Device<'_>) -> Result<i32, NvmlError> {
    use nvml_wrapper_sys::bindings::nvmlMarginTemperature_v1_t;
    let f = sym(&nvml.lib().nvmlDeviceGetMarginTemperature)?;
    // nvml.h: `#define nvmlMarginTemperature_v1 NVML_STRUCT_VERSION(MarginTemperature, 1)`.
    let mut m = nvmlMarginTemperature_v1_t {
        version: std::mem::size_of::<nvmlMarginTemperature_v1_t>() as c_uint | 1 << 24,
        marginTemperature: 0,
    };
    // SAFETY: a live handle and a versioned struct of the size its version word states.
    nvml_try(unsafe { f(d.handle(), &mut m) })?;
    Ok(m.marginTemperature)
}

/// `nvmlDeviceGetCurrentClocksEventReasons`, the name that replaced
/// `nvmlDeviceGetCurrentClocksThrottleReasons` (same bits).
pub fn clocks_event_reasons(nvml: &Nvml, d: &Device<'_>) -> Result<u64, NvmlError> {
    let f = sym(&nvml.lib().nvmlDeviceGetCurrentClocksEventReasons)?;
    let mut bits: c_ulonglong = 0;
    // SAFETY: a live handle and a valid out-pointer.
    nvml_try(unsafe { f(d.handle(), &mut bits) })?;
    Ok(bits)
}

/// `nvmlDeviceGetNvLinkErrorCounter` by raw counter id (`nvml-wrapper` lacks
/// `NVML_NVLINK_ERROR_DL_ECC_DATA` = 4).
pub fn nvlink_error(
    nvml: &Nvml,
    d: &Device<'_>,
    link: u32,
    counter: u32,
) -> Result<u64, NvmlError> {
    let f = sym(&nvml.lib().nvmlDeviceGetNvLinkErrorCounter)?;
    let mut v: c_ulonglong = 0;
    // SAFETY: a live handle and a valid out-pointer.
    nvml_try(unsafe { f(d.handle(), link, counter, &mut v) })?;
    Ok(v)
}

/// How to decode a field value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decode {
    /// As its `valueType` says.
    Typed,
    /// As the unsigned int, whatever `valueType` says. For `NVML_FI_DEV_MEMORY_TEMP`, which
    /// some R545 drivers label as double while the payload is the integer; DCGM reads this
    /// field without looking at `valueType` (DcgmCacheManager.cpp).
    Uint,
}

/// One field request: id (CUDA 12 numbering), scope (an NVLink link, or 0) and decoding.
#[derive(Debug, Clone, Copy)]
pub struct FieldRequest {
    /// `NVML_FI_*` in the CUDA 12 numbering.
    pub id: u32,
    /// `scopeId`: the NVLink link for per-link fields.
    pub scope: u32,
    /// How to read the value.
    pub decode: Decode,
}

impl FieldRequest {
    /// A device-scoped field read as its type says.
    pub const fn typed(id: u32) -> Self {
        Self {
            id,
            scope: 0,
            decode: Decode::Typed,
        }
    }
}

/// Drivers from 580.82 (CUDA 13.0 Update 1) renumbered field ids 251–273: the clock-event
/// reason and power-sync fields (251–255) moved to 269–273 and the power-smoothing fields
/// (256–273) to 251–268 (NVML "Known Issues"; nvml-wrapper applies the same mapping in
/// `field_values_for`, but not to raw calls such as this one).
fn driver_field_id(scheme: FieldIdScheme, id: u32) -> u32 {
    if scheme == FieldIdScheme::V12 {
        return id;
    }
    match id {
        251..=255 => id + 18,
        256..=273 => id - 5,
        other => other,
    }
}

/// `nvmlDeviceGetFieldValues` for `requests`: the call's own error, or one result per field.
pub fn field_values(
    nvml: &Nvml,
    d: &Device<'_>,
    requests: &[FieldRequest],
) -> Result<Vec<Result<f64, NvmlError>>, NvmlError> {
    let f = sym(&nvml.lib().nvmlDeviceGetFieldValues)?;
    let scheme = nvml.field_id_scheme();
    let mut values: Vec<nvmlFieldValue_t> = requests
        .iter()
        .map(|r| {
            // SAFETY: nvmlFieldValue_t is plain data; all-zero is a valid value.
            let mut v: nvmlFieldValue_t = unsafe { std::mem::zeroed() };
            v.fieldId = driver_field_id(scheme, r.id);
            v.scopeId = r.scope;
            v
        })
        .collect();
    // SAFETY: a live handle and an array of `values.len()` field values, as the count says.
    nvml_try(unsafe { f(d.handle(), values.len() as i32, values.as_mut_ptr()) })?;
    Ok(values
        .iter()
        .zip(requests)
        .map(|(v, r)| {
            nvml_try(v.nvmlReturn)?;
            // SAFETY: the union is read as the member `valueType` names (nvmlValueType_t:
            // 0 double, 1 uint, 2 ulong, 3 ulonglong, 4 slonglong, 5 sint, 6 ushort), or as
            // the uint for fields whose type drivers mislabel.
            Ok(unsafe {
                match (r.decode, v.valueType) {
                    (Decode::Uint, _) | (_, 1) => f64::from(v.value.uiVal),
                    (_, 0) => v.value.dVal,
                    (_, 2) => v.value.ulVal as f64,
                    (_, 3) => v.value.ullVal as f64,
                    (_, 4) => v.value.sllVal as f64,
                    (_, 5) => f64::from(v.value.siVal),
                    (_, 6) => f64::from(v.value.usVal),
                    _ => return Err(NvmlError::UnexpectedVariant(v.valueType)),
                }
            })
        })
        .collect())
}

/// The request `nvmlGpmMetricsGet` fills, kept in a GPU's state from one call to the next:
/// 8 KiB (room for every metric the header knows), of which a call writes and reads only the
/// few it asks for. `nvml-wrapper`'s call zeroes it whole and copies each metric's three
/// names into strings of its own, forty allocations a call that are thrown away.
pub struct GpmRequest(Box<nvmlGpmMetricsGet_t>);

// SAFETY: the request is plain data that one thread at a time uses (a GPU's state moves
// between the collecting threads under its lock). Its pointers are the two sample handles
// and the driver's metric names: all are written before each call, read only within it,
// and tied to no thread.
unsafe impl Send for GpmRequest {}

impl Default for GpmRequest {
    fn default() -> Self {
        // Allocated zeroed rather than built on the stack and moved.
        let layout = std::alloc::Layout::new::<nvmlGpmMetricsGet_t>();
        // SAFETY: the layout is the struct's (not zero-sized); the struct is plain data
        // (integers, a float, pointers the driver writes), for which all-zero is a valid
        // value, and the pointer comes from the global allocator with that layout.
        unsafe {
            let p = std::alloc::alloc_zeroed(layout).cast::<nvmlGpmMetricsGet_t>();
            if p.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            Self(Box::from_raw(p))
        }
    }
}

/// One GPM metric's value per id asked for, or the driver's error for it.
pub type GpmValues = smallvec::SmallVec<[Result<f64, NvmlError>; 16]>;

/// `nvmlGpmMetricsGet` between two samples of one GPU (or GPU instance): one value per id
/// of `ids`, in order, `Err` where the driver failed that metric.
pub fn gpm_metrics(
    nvml: &Nvml,
    request: &mut GpmRequest,
    samples: (&GpmSample<'_>, &GpmSample<'_>),
    ids: &[c_uint],
) -> Result<GpmValues, NvmlError> {
    let f = sym(&nvml.lib().nvmlGpmMetricsGet)?;
    let r = &mut *request.0;
    if ids.len() > r.metrics.len() {
        return Err(NvmlError::InvalidArg);
    }
    r.version = NVML_GPM_METRICS_GET_VERSION;
    r.numMetrics = ids.len() as c_uint;
    // SAFETY: handles of live samples, which the caller holds for the call.
    (r.sample1, r.sample2) = unsafe { (samples.0.handle(), samples.1.handle()) };
    for (m, id) in r.metrics.iter_mut().zip(ids) {
        m.metricId = *id;
        m.nvmlReturn = 0;
        m.value = 0.0;
        m.metricInfo.shortName = std::ptr::null_mut();
        m.metricInfo.longName = std::ptr::null_mut();
        m.metricInfo.unit = std::ptr::null_mut();
    }
    // SAFETY: a versioned request of the size this header gives, with `numMetrics` entries
    // set; the driver writes those entries' results.
    nvml_try(unsafe { f(r) })?;
    Ok(r.metrics[..ids.len()]
        .iter()
        .map(|m| nvml_try(m.nvmlReturn).map(|()| m.value))
        .collect())
}

/// A process from a running-process list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawProcess {
    /// Process id (in the host's pid namespace).
    pub pid: u32,
    /// Device memory, or `None` for `NVML_VALUE_NOT_AVAILABLE`.
    pub used: Option<u64>,
    /// GPU instance id under MIG.
    pub gpu_instance: Option<u32>,
}

/// Compute or graphics processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessKind {
    /// CUDA contexts.
    Compute,
    /// Graphics contexts.
    Graphics,
}

/// The entry size the driver's `_v3` process lists use when the written bytes do not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V3Layout {
    /// `nvmlProcessInfo_v2_t`, 24 bytes, as the header says.
    Standard,
    /// 32 bytes: drivers 535.43–535.86 added `usedGpuCcProtectedMemory` without a version
    /// bump (XuehaiPan/nvitop PR #79, gpuopenanalytics/pynvml#50, NVIDIA/go-nvml#75).
    R535,
}

impl V3Layout {
    /// nvitop's test (PR #79): the R535 layout when the library has
    /// `nvmlDeviceGetConfComputeMemSizeInfo` (new in R535) but not
    /// `nvmlDeviceGetRunningProcessDetailList` (which replaced the extra field later); or when
    /// the driver version is in the affected range.
    pub fn detect(nvml: &Nvml, driver_version: &str) -> Self {
        let lib = nvml.lib();
        let mut v = driver_version.split('.').map(|p| p.parse::<u32>().ok());
        if let (Some(Some(535)), Some(Some(minor))) = (v.next(), v.next()) {
            return if (43..=86).contains(&minor) {
                V3Layout::R535
            } else {
                V3Layout::Standard
            };
        }
        if lib.nvmlDeviceGetConfComputeMemSizeInfo.is_ok()
            && lib.nvmlDeviceGetRunningProcessDetailList.is_err()
        {
            V3Layout::R535
        } else {
            V3Layout::Standard
        }
    }
}

const SENTINEL: u8 = 0xAA;
const STANDARD: usize = 24;
const WIDE: usize = 32;

/// The entry size the driver wrote for `n` entries into a buffer prefilled with
/// [`SENTINEL`]: 24 if nothing past `24 n` was touched, 32 if something was but nothing past
/// `32 n`; `None` when the bytes do not say (nvitop PR #226 probes the same way).
fn written_stride(buf: &[u8], n: usize) -> Option<usize> {
    let untouched =
        |r: std::ops::Range<usize>| buf.get(r).is_some_and(|b| b.iter().all(|&x| x == SENTINEL));
    if n == 0 {
        return None;
    }
    if untouched(STANDARD * n..WIDE * n) {
        Some(STANDARD)
    } else if untouched(WIDE * n..(WIDE * n + 8).min(buf.len())) || buf.len() == WIDE * n {
        Some(WIDE)
    } else {
        None
    }
}

/// The running compute or graphics processes of a GPU or MIG device.
///
/// Reads with `_v3` (falling back to `_v2` on old drivers) into a buffer with room for
/// 32-byte entries and headroom, prefilled with a sentinel, so that a driver writing wider
/// entries than the header says can never write past it; the entry size is then read off
/// the bytes the driver wrote, with `layout` as the answer when they do not say.
pub fn processes(
    nvml: &Nvml,
    d: &Device<'_>,
    kind: ProcessKind,
    layout: V3Layout,
) -> Result<Vec<RawProcess>, NvmlError> {
    let lib = nvml.lib();
    let (v3, v2) = match kind {
        ProcessKind::Compute => (
            &lib.nvmlDeviceGetComputeRunningProcesses_v3,
            &lib.nvmlDeviceGetComputeRunningProcesses_v2,
        ),
        ProcessKind::Graphics => (
            &lib.nvmlDeviceGetGraphicsRunningProcesses_v3,
            &lib.nvmlDeviceGetGraphicsRunningProcesses_v2,
        ),
    };
    // Both take (device, *count, *nvmlProcessInfo_v2_t); `_v2` always writes 24 bytes.
    let (f, v2_only) = match (sym(v3), sym(v2)) {
        (Ok(f), _) => (f, false),
        (Err(_), Ok(f)) => (f, true),
        (Err(e), Err(_)) => return Err(e),
    };
    let mut count: c_uint = 0;
    // SAFETY: count query: a null array with a count of 0.
    let rc = unsafe { f(d.handle(), &mut count, std::ptr::null_mut()) };
    match rc {
        0 => return Ok(Vec::new()),
        // NVML_ERROR_INSUFFICIENT_SIZE: `count` holds the number of processes.
        7 => {}
        rc => nvml_try(rc).map(|_| ())?,
    }
    // Headroom for processes started between the two calls (nvitop: 2n + 5).
    let room = count as usize * 2 + 5;
    // u64 words keep the buffer aligned for the entries' 8-byte fields.
    let mut words = vec![u64::from_ne_bytes([SENTINEL; 8]); room * WIDE / 8];
    let mut n = room as c_uint;
    // SAFETY: the buffer holds `room` entries of the widest layout any driver writes, so
    // `n` = `room` entries of either size fit; the driver writes at most `n` entries.
    nvml_try(unsafe { f(d.handle(), &mut n, words.as_mut_ptr().cast()) })?;
    let n = (n as usize).min(room);
    // SAFETY: a u64 buffer viewed as bytes (alignment 1, same length in bytes).
    let bytes = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 8) };
    let stride = if v2_only {
        STANDARD
    } else {
        let guess = match layout {
            V3Layout::R535 => WIDE,
            V3Layout::Standard => STANDARD,
        };
        written_stride(bytes, n).unwrap_or(guess)
    };
    Ok((0..n)
        .map(|i| decode_entry(&bytes[i * stride..i * stride + STANDARD]))
        .collect())
}

/// Decodes the 24 bytes every layout starts with: pid (u32), padding, usedGpuMemory (u64),
/// gpuInstanceId (u32), computeInstanceId (u32).
fn decode_entry(b: &[u8]) -> RawProcess {
    let u32_at = |o: usize| u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
    let mut used = [0u8; 8];
    used.copy_from_slice(&b[8..16]);
    let used = u64::from_ne_bytes(used);
    let gi = u32_at(16);
    RawProcess {
        pid: u32_at(0),
        // NVML_VALUE_NOT_AVAILABLE: the driver does not know (e.g. under WDDM or for a
        // process in another container without the right to ask).
        used: (used != u64::MAX).then_some(used),
        gpu_instance: (gi != u32::MAX).then_some(gi),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pid: u32, used: u64, stride: usize) -> Vec<u8> {
        let mut e = vec![0u8; stride];
        e[..4].copy_from_slice(&pid.to_ne_bytes());
        e[8..16].copy_from_slice(&used.to_ne_bytes());
        e[16..20].copy_from_slice(&u32::MAX.to_ne_bytes());
        e[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
        e
    }

    fn buffer(entries: &[(u32, u64)], stride: usize, room: usize) -> Vec<u8> {
        let mut b = vec![SENTINEL; room * WIDE];
        for (i, (pid, used)) in entries.iter().enumerate() {
            b[i * stride..(i + 1) * stride].copy_from_slice(&entry(*pid, *used, stride));
        }
        b
    }

    #[test]
    fn the_written_bytes_give_the_entry_size() {
        let list = [(100, 5 << 20), (200, 6 << 20), (300, u64::MAX)];
        assert_eq!(written_stride(&buffer(&list, 24, 11), 3), Some(24));
        assert_eq!(written_stride(&buffer(&list, 32, 11), 3), Some(32));
        let b = buffer(&list, 32, 11);
        let procs: Vec<_> = (0..3)
            .map(|i| decode_entry(&b[i * 32..i * 32 + 24]))
            .collect();
        assert_eq!(procs[1].pid, 200);
        assert_eq!(procs[1].used, Some(6 << 20));
        assert_eq!(procs[2].used, None, "NOT_AVAILABLE is no reading");
        assert_eq!(procs[0].gpu_instance, None);
    }

    #[test]
    fn new_field_numbering_is_applied() {
        assert_eq!(driver_field_id(FieldIdScheme::V12, 251), 251);
        assert_eq!(driver_field_id(FieldIdScheme::V13Update1, 251), 269);
        assert_eq!(driver_field_id(FieldIdScheme::V13Update1, 82), 82);
    }
}

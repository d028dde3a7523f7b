//! The simulator's global state: the scenario, the clock, handles and fault injection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};

use crate::scenario::{Gpu, MigInstance, Scenario};

pub const SUCCESS: nvmlReturn_t = 0;
pub const ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const ERROR_TIMEOUT: nvmlReturn_t = 10;
pub const ERROR_GPU_IS_LOST: nvmlReturn_t = 15;
pub const ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const ERROR_RESET_REQUIRED: nvmlReturn_t = 16;
pub const ERROR_UNKNOWN: nvmlReturn_t = 999;

/// The environment variable naming the scenario file.
pub const SCENARIO_ENV: &str = "JUNCTION_NVML_SIM_SCENARIO";

/// The build variant of this library.
pub const VARIANT: &str = if cfg!(feature = "legacy") {
    "legacy"
} else if cfg!(feature = "r535") {
    "r535"
} else if cfg!(feature = "future") {
    "future"
} else {
    "current"
};

/// `NVML_VALUE_NOT_AVAILABLE` for unsigned long long values.
pub const VALUE_NOT_AVAILABLE_ULL: u64 = u64::MAX;

/// Everything the simulator knows.
pub struct Sim {
    pub scenario: Scenario,
    pub gpus: Vec<Gpu>,
    pub start: Instant,
    /// Matching calls per fault, for `every`.
    fault_calls: Vec<AtomicU64>,
    pub delivered_events: Mutex<Vec<bool>>,
}

static SIM: OnceLock<Result<Sim, String>> = OnceLock::new();

fn load() -> Result<Sim, String> {
    let path = std::env::var(SCENARIO_ENV)
        .map_err(|_| format!("nvml-sim: {SCENARIO_ENV} is not set; point it at a scenario file"))?;
    let scenario =
        Scenario::load(std::path::Path::new(&path)).map_err(|e| format!("nvml-sim: {e}"))?;
    if scenario.driver.variant != VARIANT {
        return Err(format!(
            "nvml-sim: {path} wants the {:?} library build but this is the {VARIANT:?} build",
            scenario.driver.variant
        ));
    }
    let gpus = scenario.resolve();
    let events = vec![false; scenario.events.len()];
    let fault_calls = scenario.faults.iter().map(|_| AtomicU64::new(0)).collect();
    Ok(Sim {
        scenario,
        gpus,
        start: Instant::now(),
        fault_calls,
        delivered_events: Mutex::new(events),
    })
}

/// Loads the scenario on first use; later calls return the same state.
pub fn init() -> Result<&'static Sim, nvmlReturn_t> {
    match SIM.get_or_init(load) {
        Ok(sim) => Ok(sim),
        Err(msg) => {
            eprintln!("{msg}");
            Err(ERROR_UNKNOWN)
        }
    }
}

/// The state after a successful `nvmlInit`.
pub fn sim() -> Result<&'static Sim, nvmlReturn_t> {
    match SIM.get() {
        Some(Ok(sim)) => Ok(sim),
        _ => Err(ERROR_UNINITIALIZED),
    }
}

impl Sim {
    /// Seconds since the library was initialised.
    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// True if the scenario switches on the driver defect `name` (see `Driver::quirks`).
    pub fn quirk(&self, name: &str) -> bool {
        self.scenario.driver.quirks.iter().any(|q| q == name)
    }

    /// MIG mode of a GPU now (`None`: the GPU has no MIG), after the scenario's toggles.
    pub fn mig_on(&self, g: &Gpu) -> Option<bool> {
        let m = g.mig.as_ref()?;
        let now = self.now();
        let flips = m.toggle_at_secs.iter().filter(|t| **t <= now).count();
        Some(m.enabled ^ (flips % 2 == 1))
    }

    /// Applies the scenario's faults for `call` on GPU `gpu`: may sleep, hang forever or
    /// return an error code.
    pub fn faults(&self, call: &'static str, gpu: u32) -> Result<(), nvmlReturn_t> {
        if self.scenario.faults.is_empty() {
            return Ok(());
        }
        let t = self.now();
        for (f, calls) in self.scenario.faults.iter().zip(&self.fault_calls) {
            if (f.call != "*" && f.call != call)
                || f.gpu.is_some_and(|g| g != gpu)
                || t < f.from_secs
                || f.until_secs.is_some_and(|u| t >= u)
            {
                continue;
            }
            let n = calls.fetch_add(1, Ordering::Relaxed) + 1;
            match f.kind.as_str() {
                "not_supported" => return Err(ERROR_NOT_SUPPORTED),
                "gpu_lost" => return Err(ERROR_GPU_IS_LOST),
                "reset_required" => return Err(ERROR_RESET_REQUIRED),
                "unknown" if n % f.every.max(1) == 0 => return Err(ERROR_UNKNOWN),
                "delay" => std::thread::sleep(Duration::from_millis(f.delay_ms)),
                "hang" => loop {
                    std::thread::sleep(Duration::from_secs(3600));
                },
                _ => {}
            }
        }
        Ok(())
    }
}

/// What a device handle points at.
pub enum Target<'a> {
    Gpu(&'a Gpu),
    Mig(&'a Gpu, u32, &'a MigInstance),
}

impl<'a> Target<'a> {
    pub fn gpu(&self) -> &'a Gpu {
        match self {
            Target::Gpu(g) | Target::Mig(g, _, _) => g,
        }
    }
}

/// Handles are small integers: `(gpu + 1) << 16 | (mig + 1)`. NVML treats them as opaque.
pub fn gpu_handle(index: u32) -> nvmlDevice_t {
    (((index as usize) + 1) << 16) as nvmlDevice_t
}

pub fn mig_handle(gpu: u32, mig: u32) -> nvmlDevice_t {
    ((((gpu as usize) + 1) << 16) | (mig as usize + 1)) as nvmlDevice_t
}

/// Resolves a handle and applies faults for `call`.
pub fn device(
    handle: nvmlDevice_t,
    call: &'static str,
) -> Result<(&'static Sim, Target<'static>), nvmlReturn_t> {
    let sim = sim()?;
    let raw = handle as usize;
    let gpu_index = (raw >> 16).checked_sub(1).ok_or(ERROR_INVALID_ARGUMENT)?;
    let gpu = sim.gpus.get(gpu_index).ok_or(ERROR_INVALID_ARGUMENT)?;
    sim.faults(call, gpu.index)?;
    let mig = raw & 0xffff;
    if mig == 0 {
        return Ok((sim, Target::Gpu(gpu)));
    }
    // A MIG handle stops being valid when MIG mode is switched off.
    if sim.mig_on(gpu) != Some(true) {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    let inst = gpu
        .mig
        .as_ref()
        .and_then(|m| m.instances.get(mig - 1))
        .ok_or(ERROR_INVALID_ARGUMENT)?;
    Ok((sim, Target::Mig(gpu, (mig - 1) as u32, inst)))
}

/// Resolves a handle that must be a full GPU (not a MIG device).
pub fn gpu(
    handle: nvmlDevice_t,
    call: &'static str,
) -> Result<(&'static Sim, &'static Gpu), nvmlReturn_t> {
    match device(handle, call)? {
        (sim, Target::Gpu(g)) => Ok((sim, g)),
        _ => Err(ERROR_NOT_SUPPORTED),
    }
}

/// A named value of a GPU, `NOT_SUPPORTED` when the scenario leaves it out.
pub fn value(sim: &Sim, gpu: &Gpu, key: &str) -> Result<f64, nvmlReturn_t> {
    gpu.value(key, sim.now()).ok_or(ERROR_NOT_SUPPORTED)
}

/// Copies `s` into a C buffer of `len` bytes, NUL-terminated, cropping it to fit and
/// returning success, as `nvmlSystemGetProcessName` does (its documentation: "the returned
/// name is truncated to the length of the buffer"; it never answers INSUFFICIENT_SIZE).
///
/// # Safety
/// `buf` must be valid for `len` bytes.
pub unsafe fn write_str_cropped(s: &str, buf: *mut std::os::raw::c_char, len: u32) -> nvmlReturn_t {
    if buf.is_null() || len == 0 {
        return ERROR_INVALID_ARGUMENT;
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: the caller guarantees `len` bytes at `buf`; we write n + 1 <= len bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    SUCCESS
}

/// Copies `s` into a C buffer of `len` bytes, NUL-terminated.
///
/// # Safety
/// `buf` must be valid for `len` bytes.
pub unsafe fn write_str(s: &str, buf: *mut std::os::raw::c_char, len: u32) -> nvmlReturn_t {
    if buf.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller guarantees `len` bytes at `buf`, and we write bytes.len() + 1 <= len.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
        *buf.add(bytes.len()) = 0;
    }
    SUCCESS
}

/// Writes `v` through `out` when it is not null.
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
pub unsafe fn put<T>(out: *mut T, v: T) -> nvmlReturn_t {
    if out.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null and valid per the caller's contract.
    unsafe { out.write(v) };
    SUCCESS
}

/// Turns a `Result` whose error is an NVML code into the code.
pub fn code(r: Result<nvmlReturn_t, nvmlReturn_t>) -> nvmlReturn_t {
    r.unwrap_or_else(|e| e)
}

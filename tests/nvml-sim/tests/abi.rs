//! The simulator's C entry points called directly: events, faults and time functions.
//! One test, because the simulator's state is process-global.

use std::os::raw::{c_char, c_uint};

use nvidia_ml::scenario::Scenario;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlEventData_t, nvmlEventSet_t};

unsafe extern "C" {
    fn nvmlInit_v2() -> u32;
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut nvmlDevice_t) -> u32;
    fn nvmlDeviceGetTemperature(device: nvmlDevice_t, sensor: c_uint, temp: *mut c_uint) -> u32;
    fn nvmlDeviceGetPowerUsage(device: nvmlDevice_t, power: *mut c_uint) -> u32;
    fn nvmlDeviceGetName(device: nvmlDevice_t, name: *mut c_char, length: c_uint) -> u32;
    fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> u32;
    fn nvmlDeviceRegisterEvents(device: nvmlDevice_t, types: u64, set: nvmlEventSet_t) -> u32;
    fn nvmlEventSetWait_v2(
        set: nvmlEventSet_t,
        data: *mut nvmlEventData_t,
        timeout_ms: c_uint,
    ) -> u32;
    fn nvmlEventSetFree(set: nvmlEventSet_t) -> u32;
}

const SCENARIO: &str = r#"
gpu_count = 2
[defaults.values]
temp_gpu = 50
power_mw = 100000
[[gpus]]
name = "first"
[gpus.values]
temp_gpu = { before = 40, after = 90, at_secs = 0.3 }
[[events]]
gpu = 1
at_secs = 0.0
xid = 79
[[events]]
gpu = 1
at_secs = 0.9
xid = 48
[[faults]]
call = "nvmlDeviceGetPowerUsage"
gpu = 1
kind = "unknown"
every = 2
"#;

#[test]
fn events_faults_and_time_functions() {
    let dir = std::env::temp_dir().join(format!("nvml-sim-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("s.toml");
    std::fs::write(&path, SCENARIO).expect("write");
    assert!(Scenario::load(&path).is_ok());
    // SAFETY: set before any other thread of this test binary reads the environment.
    unsafe { std::env::set_var("JUNCTION_NVML_SIM_SCENARIO", &path) };

    // The simulator's clock starts inside nvmlInit, after this instant.
    let before_init = std::time::Instant::now();
    // SAFETY: the simulator's C ABI with valid out-pointers throughout.
    unsafe {
        assert_eq!(nvmlInit_v2(), 0);
        let (mut g0, mut g1): (nvmlDevice_t, nvmlDevice_t) =
            (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(0, &mut g0), 0);
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(1, &mut g1), 0);
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(2, &mut g1),
            2,
            "index out of range"
        );
        assert_eq!(nvmlDeviceGetHandleByIndex_v2(1, &mut g1), 0);

        let mut name = [0 as c_char; 16];
        assert_eq!(nvmlDeviceGetName(g0, name.as_mut_ptr(), 16), 0);
        assert_eq!(
            std::ffi::CStr::from_ptr(name.as_ptr()).to_str(),
            Ok("first")
        );
        assert_eq!(
            nvmlDeviceGetName(g0, name.as_mut_ptr(), 3),
            7,
            "INSUFFICIENT_SIZE"
        );

        // A step from 40 to 90 at 0.3 s on GPU 0; the default 50 on GPU 1.
        let mut t = 0;
        assert_eq!(nvmlDeviceGetTemperature(g0, 0, &mut t), 0);
        assert_eq!(t, 40);
        assert_eq!(nvmlDeviceGetTemperature(g1, 0, &mut t), 0);
        assert_eq!(t, 50);
        std::thread::sleep(std::time::Duration::from_millis(350));
        assert_eq!(nvmlDeviceGetTemperature(g0, 0, &mut t), 0);
        assert_eq!(t, 90);

        // Every second power call on GPU 1 fails with UNKNOWN (999); GPU 0 never does.
        let mut p = 0;
        let codes: Vec<u32> = (0..4)
            .map(|_| nvmlDeviceGetPowerUsage(g1, &mut p))
            .collect();
        assert_eq!(codes, vec![0, 999, 0, 999]);
        assert_eq!(nvmlDeviceGetPowerUsage(g0, &mut p), 0);
        assert_eq!(p, 100_000);

        // The XID 79 on GPU 1 is delivered once; then, before the XID 48 at 0.9 s, a wait
        // of 50 ms sleeps its whole timeout and says TIMEOUT (10), as nvml.h documents
        // ("sleeps till event arrives but not longer than specified timeout") — one that
        // returned at once would make the agent's event thread spin. A long wait wakes for
        // the scheduled event, well before its own deadline.
        let mut set: nvmlEventSet_t = std::ptr::null_mut();
        assert_eq!(nvmlEventSetCreate(&mut set), 0);
        assert_eq!(nvmlDeviceRegisterEvents(g1, 8, set), 0);
        let mut data: nvmlEventData_t = std::mem::zeroed();
        assert_eq!(nvmlEventSetWait_v2(set, &mut data, 100), 0);
        assert_eq!((data.eventType, data.eventData, data.device), (8, 79, g1));
        let t0 = std::time::Instant::now();
        assert_eq!(nvmlEventSetWait_v2(set, &mut data, 50), 10);
        let slept = t0.elapsed();
        assert!(
            slept >= std::time::Duration::from_millis(45),
            "a wait with nothing due returned after {slept:?}, before its 50 ms timeout"
        );
        let t0 = std::time::Instant::now();
        assert_eq!(nvmlEventSetWait_v2(set, &mut data, 60_000), 0);
        let woke = t0.elapsed();
        assert_eq!((data.eventType, data.eventData, data.device), (8, 48, g1));
        // Delivered no earlier than due (0.9 s on the simulator's clock, which started
        // after `before_init`), and not at the 60 s deadline.
        assert!(
            before_init.elapsed() >= std::time::Duration::from_millis(900),
            "the XID due at 0.9 s came {:?} after init",
            before_init.elapsed()
        );
        assert!(
            woke < std::time::Duration::from_secs(30),
            "the wait for the event due at 0.9 s returned after {woke:?}: it slept to its deadline"
        );
        assert_eq!(
            nvmlEventSetWait_v2(set, &mut data, 0),
            10,
            "nothing more is due"
        );
        assert_eq!(nvmlEventSetFree(set), 0);
    }
}

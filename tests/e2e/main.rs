//! End-to-end tests: the real `junction` binary against the NVML simulator library (loaded by
//! `nvml-wrapper` through its normal FFI path), `pynvml` and `promtool`.

mod support;

mod config_errors;
mod faults;
mod values;

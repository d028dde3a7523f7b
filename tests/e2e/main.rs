//! End-to-end tests: the real `junction` binary against the NVML simulator library (loaded by
//! `nvml-wrapper` through its normal FFI path), `pynvml`, `promtool` and a Prometheus server.

mod support;

mod bmc;
mod bmc_sessions;
mod bmc_tree;
mod config_errors;
mod container;
mod dcgm_compat;
mod deploy;
mod ebpf;
mod fabric;
mod faults;
mod gb200;
mod health;
mod history;
mod hostile;
mod ipmi;
mod kmsg;
mod kmsg_signatures;
mod kmsg_trust;
mod kubernetes;
mod otlp;
mod prometheus;
mod pynvml;
mod quirks;
mod real_bmcs;
mod rules;
mod self_telemetry;
mod semconv;
mod values;

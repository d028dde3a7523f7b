//! Junction, the GPU node telemetry agent, as a library: every source, sink and parser of
//! outside input, for the `junction` binary, the tests and the fuzz targets.

pub mod agent;
pub mod allocator;
pub mod cli;
pub mod config;
pub mod internal_events;
pub mod model;
pub mod privileges;
pub mod redact;
pub mod shutdown;
pub mod sinks;
pub mod sources;

use clap::ValueEnum;

/// Installs the one TLS provider every rustls user shares (the OTLP and BMC clients); a
/// second call does nothing.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// `junction once` formats.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Format {
    /// A per-GPU table, like nvidia-smi.
    Table,
    /// Prometheus text exposition.
    Prometheus,
    /// JSON.
    Json,
    /// The OTLP metrics request an export would send now: protobuf, uncompressed (write it
    /// to a file; `protoc --decode_raw` reads it).
    Otlp,
}

/// `junction inventory` formats.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum InventoryFormat {
    /// Text.
    Table,
    /// JSON.
    Json,
}

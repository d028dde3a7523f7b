//! Sinks: where data goes. Sinks read snapshots of the model; they never talk to sources.

pub mod prometheus;

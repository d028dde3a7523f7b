//! Sinks: where data goes. Sinks read snapshots of the model; they never talk to sources. Each
//! has a folder and one line in [`ALL`].

pub mod dcgm;
pub mod otlp;
pub mod prometheus;

use crate::agent::Component;

/// Every sink, in start order.
pub const ALL: &[Component] = &[prometheus::COMPONENT, dcgm::COMPONENT, otlp::COMPONENT];

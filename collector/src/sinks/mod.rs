//! Sinks: where data goes. Sinks read snapshots of the model; they never talk to sources. Each
//! has a folder and one line in [`ALL`].

pub mod dcgm;
pub mod gzip;
pub mod otlp;
pub mod page;
pub mod prometheus;

use crate::agent::Component;

/// gzip's level wherever Junction compresses what it sends (OTLP requests, `/metrics` pages):
/// level 2 (zlib-rs) makes the 8-GPU node's 305 KB request 18.8 KB and its 282 KB page about
/// 19 KB; level 1 is a quarter cheaper and 13 % larger, level 6 three times the CPU for 10 %
/// less (see `otlp::metrics::send`).
pub const GZIP_LEVEL: u32 = 2;

/// Every sink, in start order.
pub const ALL: &[Component] = &[prometheus::COMPONENT, dcgm::COMPONENT, otlp::COMPONENT];

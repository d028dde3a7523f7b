//! Sources: where data comes from. Each is built (validating config, opening handles, failing
//! loudly) and then run (a loop that never dies on one bad read). Each has a folder and one
//! line in [`ALL`].

pub mod ebpf;
pub mod health;
pub mod ipmi;
pub mod kmsg;
pub mod kubernetes;
pub mod nvml;
pub mod polled;
pub mod redfish;

use crate::agent::Component;

/// Every source, in start order.
pub const ALL: &[Component] = &[
    nvml::COMPONENT,
    kmsg::COMPONENT,
    ebpf::COMPONENT,
    redfish::COMPONENT,
    ipmi::COMPONENT,
    kubernetes::COMPONENT,
    health::COMPONENT,
];

//! Sources: where data comes from. Each is built (validating config, opening handles, failing
//! loudly) and then run (a loop that never dies on one bad read). Each has a folder and one
//! line in [`ALL`].

pub mod ebpf;
pub mod health;
pub mod host;
pub mod ipmi;
pub mod kmsg;
pub mod kubernetes;
pub mod nic;
pub mod nvml;
pub mod pcie;
pub mod polled;
pub mod readings;
pub mod redfish;
pub mod sysfs;

use crate::agent::Component;

/// Every source, in start order.
pub const ALL: &[Component] = &[
    nvml::COMPONENT,
    kmsg::COMPONENT,
    ebpf::COMPONENT,
    redfish::COMPONENT,
    ipmi::COMPONENT,
    kubernetes::COMPONENT,
    nic::COMPONENT,
    pcie::COMPONENT,
    host::COMPONENT,
    health::COMPONENT,
];

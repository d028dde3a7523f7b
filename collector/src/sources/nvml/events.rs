//! XIDs through NVML (`nvmlEventSetWait`): a second path beside the kernel log, for hosts
//! where the kernel log cannot be read. The model counts an XID reported by both paths once.
//! NVML cannot report every XID (DCGM #162: not 79, 119 or 120), which is why the kernel log
//! is the first path.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;

use crate::model::Model;
use crate::model::xid::{Report, Via};
use crate::shutdown::Shutdown;

/// How long one `nvmlEventSetWait` waits when no event comes.
const WAIT_MS: u32 = 5000;

/// Waits for XID events on every GPU that supports them until shutdown (its own thread).
pub fn run(nvml: &Nvml, model: &Arc<Model>, gpus: u32, shutdown: &Shutdown) {
    let mut set = match nvml.create_event_set() {
        Ok(s) => s,
        Err(e) => {
            tracing::info!(error = %e, "NVML events are not available; XIDs come from the kernel log only");
            return;
        }
    };
    let mut registered = 0;
    for i in 0..gpus {
        let Ok(d) = nvml.device_by_index(i) else {
            continue;
        };
        let supported = d
            .supported_event_types()
            .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
        if !supported {
            continue;
        }
        set = match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                registered += 1;
                s
            }
            Err(e) => {
                tracing::info!(gpu = i, error = %e.error, "cannot register for NVML XID events; XIDs come from the kernel log only");
                return;
            }
        };
    }
    if registered == 0 {
        return;
    }
    tracing::info!(gpus = registered, "waiting for XID events from NVML");
    while !shutdown.is_triggered() {
        // Events end the wait at once; the timeout only bounds how late this (detached)
        // thread sees the shutdown, so it is long: each wake-up of an idle thread costs CPU.
        match set.wait(WAIT_MS) {
            Ok(data) => {
                let Some(XidError::Value(xid)) = data.event_data else {
                    continue;
                };
                let uuid = data.device.uuid().ok();
                let pci = data.device.pci_info().ok().and_then(|p| {
                    super::normalise_bus_id(&p.bus_id)
                        .get(..10)
                        .map(str::to_string)
                });
                model.record_xid(Report {
                    via: Via::Nvml,
                    bus_line: false,
                    pci,
                    uuid,
                    code: xid as u32,
                    time: SystemTime::now(),
                    pid: None,
                    process: None,
                    gpu_instance: None,
                    compute_instance: None,
                    message: format!("Xid {xid} reported by NVML (nvmlEventSetWait)"),
                    attrs: Vec::new(),
                    fatal: None,
                    recovery_action: None,
                });
                model.flush_xids(true);
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => {
                tracing::warn!(error = %e, "waiting for NVML events failed; retrying in 5 s");
                if shutdown.sleep(Duration::from_secs(5)) {
                    break;
                }
            }
        }
    }
}

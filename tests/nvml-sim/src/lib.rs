//! A `libnvidia-ml.so.1` for tests: implements the NVML C ABI (layouts from
//! `nvml-wrapper-sys`, generated from `nvml.h`) for every call Junction makes, driven by a
//! scenario file named by `JUNCTION_NVML_SIM_SCENARIO`.
//!
//! Values are named keys in the scenario (`[defaults.values]`): a key that a scenario leaves
//! out makes its call return `NVML_ERROR_NOT_SUPPORTED`, as a GPU without that feature does.
//! The keys and their units:
//!
//! | key | call | unit |
//! |---|---|---|
//! | `gpu_util`, `mem_util`, `enc_util`, `dec_util` | utilization | % |
//! | `memory_total_mib`, `memory_reserved_mib`, `memory_used_mib` | memory info | MiB |
//! | `bar1_total_mib`, `bar1_used_mib` | BAR1 memory info | MiB |
//! | `power_mw`, `power_limit_mw`, `power_default_limit_mw`, `power_min_limit_mw`, `power_max_limit_mw` | power | mW |
//! | `energy_mj` | total energy consumption | mJ |
//! | `temp_gpu`, `temp_memory` (field 82), `temp_slowdown`, `temp_shutdown`, `temp_gpu_max`, `temp_mem_max` | temperatures and thresholds (absolute from `nvmlDeviceGetTemperatureThreshold`; on the T.Limit scale, `temp_gpu_max` minus each, from the `*_TLIMIT` fields 193–196 and `nvmlDeviceGetMarginTemperature`, as real drivers answer) | °C |
//! | `fan_pct` | fan speed (with `num_fans` > 0) | % |
//! | `clock_{graphics,sm,mem,video}_mhz`, `max_clock_{graphics,sm,mem,video}_mhz` | clocks | MHz |
//! | `pstate`, `throttle_reasons` (bitmask) | performance state, clock event reasons | |
//! | `violation_power_ns`, `violation_thermal_ns` | violation status, fields 74/75 | ns |
//! | `violation_sw_thermal_ns`, `violation_hw_thermal_ns`, `violation_hw_power_brake_ns` | clock-event-reason fields 251–253 (269–271 from 580.82) | ns |
//! | `ecc_mode`, `ecc_{corrected,uncorrected}_{volatile,aggregate}` | ECC | count |
//! | `retired_sbe_pages`, `retired_dbe_pages`, `retired_pending` | retired pages | count |
//! | `remap_correctable`, `remap_uncorrectable`, `remap_pending`, `remap_failure` | remapped rows | count |
//! | `pcie_tx_kbps`, `pcie_rx_kbps`, `pcie_replay`, `pcie_gen`, `pcie_width`, `pcie_max_gen`, `pcie_max_width` | PCIe (the byte counters, fields 197/198, run at the throughput since start) | KB/s, count |
//! | `nvlink_tx_kib`, `nvlink_rx_kib` (fields 138/139, per link), `nvlink_{replay,recovery,crc_flit,crc_data,ecc_data}`, `nvlink_active_links` | NVLink (with `nvlink_count` > 0) | KiB, count |
//! | `nvlink_recovery_{successful,failed,events}` (fields 213–215, per link) | NVLink link recovery (Blackwell) | count |
//! | `c2c_link_count` (field 170), per link `c2c_link_status`, `c2c_max_bw_mbps`, `c2c_errors_{intr,replay,replay_b2b}` (171, 172, 231–233) | C2C links of Grace superchips | count, MB/s |
//! | `nvlink_{effective,symbol}_errors`, `nvlink_{effective,symbol}_ber` (fields 219–222, per link; the BER as a number, encoded as the driver does) | NVLink5 error counters | count, ratio |
//! | `nvlink_fec_history_0` … `_15` (fields 235–250, per link; a bin without a value answers NOT_SUPPORTED) | NVLink5 FEC history bins | count |
//! | `nvlink_errors_unsupported_from` | error counters NOT_SUPPORTED on links from this index on | index |
//! | `recovery_action` (field 230) | GPU recovery action | enum |
//! | `persistence_mode`, `compute_mode` (both answer without them: on, DEFAULT), `ecc_pending` (else `ecc_mode`) | modes | 0/1, enum |
//! | `fabric_state`, `fabric_status`, `fabric_clique_id`, `fabric_health_mask`, `fabric_health_summary` (and the GPU's `fabric_cluster_uuid`) | GPU fabric info (`src/fabric.rs`) | enum, bits |
//! | `gpm_{graphics,sm,dram_bw,fp64,fp32,fp16,tensor,dfma_tensor}_util`, `gpm_sm_occupancy`, `gpm_{pcie,nvlink}_{tx,rx}_mibps` | GPM (with `gpm_supported`) | %, MiB/s |
//!
//! Symbols that a driver lacks are left out of a feature build: `dlsym` cannot be made to
//! fail at run time, so a driver branch is a build of this library: `legacy` (an old
//! driver), `r535` (535.43–535.86, whose `_v3` process lists fill 32-byte entries) and
//! `future` (none of the symbols CUDA 13 deprecates). Defects that need no symbol change are
//! run-time quirks in the scenario (`[driver] quirks`).
//!
//! Behaviour modelled on real drivers:
//! - `nvmlSystemGetProcessName` crops the name to the caller's buffer and succeeds;
//! - per-process utilization comes from a sample buffer (repeated and stale entries);
//! - with MIG on, the parent GPU answers NOT_SUPPORTED for utilization, per-process
//!   utilization and remapped rows; MIG mode can flip at run time (`mig.toggle_at_secs`);
//! - a process whose memory is unknown reports `NVML_VALUE_NOT_AVAILABLE`;
//! - fault kind `reset_required` answers `NVML_ERROR_RESET_REQUIRED`.

#![allow(
    clippy::allow_attributes,
    reason = "export! cannot know whether a body has unsafe operations"
)]

mod clocks;
mod device;
mod errors;
#[cfg(not(feature = "legacy"))]
mod fabric;
mod fields;
#[cfg(not(feature = "legacy"))]
mod gpm;
mod links;
mod modes;
mod procs;
pub mod scenario;
pub mod state;
mod system;
mod thermal;

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
//! | `temp_gpu`, `temp_memory` (field 82), `temp_slowdown`, `temp_shutdown`, `temp_gpu_max`, `temp_mem_max` | temperatures | °C |
//! | `fan_pct` | fan speed (with `num_fans` > 0) | % |
//! | `clock_{graphics,sm,mem,video}_mhz`, `max_clock_{graphics,sm,mem,video}_mhz` | clocks | MHz |
//! | `pstate`, `throttle_reasons` (bitmask) | performance state, clock event reasons | |
//! | `violation_power_ns`, `violation_thermal_ns` | violation status | ns |
//! | `ecc_mode`, `ecc_{corrected,uncorrected}_{volatile,aggregate}` | ECC | count |
//! | `retired_sbe_pages`, `retired_dbe_pages`, `retired_pending` | retired pages | count |
//! | `remap_correctable`, `remap_uncorrectable`, `remap_pending`, `remap_failure` | remapped rows | count |
//! | `pcie_tx_kbps`, `pcie_rx_kbps`, `pcie_replay`, `pcie_gen`, `pcie_width`, `pcie_max_gen`, `pcie_max_width` | PCIe | KB/s, count |
//! | `nvlink_tx_kib`, `nvlink_rx_kib` (fields 138/139, per link), `nvlink_{replay,recovery,crc_flit,crc_data}`, `nvlink_active_links` | NVLink (with `nvlink_count` > 0) | KiB, count |
//! | `recovery_action` (field 230) | GPU recovery action | enum |
//! | `gpm_{graphics,sm,dram_bw,fp64,fp32,fp16,tensor,dfma_tensor}_util`, `gpm_sm_occupancy`, `gpm_{pcie,nvlink}_{tx,rx}_mibps` | GPM (with `gpm_supported`) | %, MiB/s |
//!
//! Symbols that an old driver lacks are left out of the `legacy` feature build: `dlsym` cannot
//! be made to fail at run time, so an "old driver" is a second build of this library.

#![allow(
    clippy::allow_attributes,
    reason = "export! cannot know whether a body has unsafe operations"
)]

mod device;
#[cfg(not(feature = "legacy"))]
mod gpm;
mod procs;
pub mod scenario;
pub mod state;
mod system;

//! NVLink per link: state, data counters, errors, (Blackwell) link recovery and the NVLink5
//! error counters and bit-error rates. Each link and
//! counter is a feature of its own, so that one unsupported link or counter does not switch
//! off the others.

use super::raw::{self, Decode, FieldRequest};
use super::{
    FEC_BINS, FI_C2C_ERROR_INTR, FI_C2C_ERROR_REPLAY, FI_C2C_ERROR_REPLAY_B2B, FI_C2C_LINK_COUNT,
    FI_C2C_LINK_MAX_BW, FI_C2C_LINK_STATUS, FI_NVLINK_EFFECTIVE_BER, FI_NVLINK_EFFECTIVE_ERRORS,
    FI_NVLINK_FEC_HISTORY_0, FI_NVLINK_LINK_COUNT, FI_NVLINK_RECOVERY_EVENTS,
    FI_NVLINK_RECOVERY_FAILED, FI_NVLINK_RECOVERY_SUCCESSFUL, FI_NVLINK_RX, FI_NVLINK_SYMBOL_BER,
    FI_NVLINK_SYMBOL_ERRORS, FI_NVLINK_TX, MAX_NVLINKS, field, index_name,
};
use crate::model::{Feature, Metric, Sample};
use crate::sources::nvml::worker::{Ctx, Halt};

/// `nvmlNvLinkErrorCounter_t` values, their feature names and `gpu.nvlink.error.type`.
const ERROR_COUNTERS: [(u32, &str, &str); 5] = [
    (0, "nvlink_error_replay", "replay"),
    (1, "nvlink_error_recovery", "recovery"),
    (2, "nvlink_error_crc_flit", "crc_flit"),
    (3, "nvlink_error_crc_data", "crc_data"),
    // NVML_NVLINK_ERROR_DL_ECC_DATA
    (4, "nvlink_error_ecc_data", "ecc_data"),
];

/// Link-recovery count fields and their `gpu.nvlink.recovery.outcome`.
const RECOVERY: [(u32, &str); 3] = [
    (FI_NVLINK_RECOVERY_SUCCESSFUL, "successful"),
    (FI_NVLINK_RECOVERY_FAILED, "failed"),
    (FI_NVLINK_RECOVERY_EVENTS, "all"),
];

/// NVLink5's per-link counters: (field, `gpu.nvlink.error.type` or BER type, is a BER).
const NVLINK5: [(u32, &str, bool); 4] = [
    (FI_NVLINK_EFFECTIVE_ERRORS, "effective", false),
    (FI_NVLINK_EFFECTIVE_BER, "effective", true),
    (FI_NVLINK_SYMBOL_ERRORS, "symbol", false),
    (FI_NVLINK_SYMBOL_BER, "symbol", true),
];

/// A BER field's value: mantissa (bits 11:8) × 10^-exponent (bits 7:0), as nvml.h's
/// `NVML_NVLINK_BER_{MANTISSA,EXP}_{SHIFT,WIDTH}` define it; 0 reads 0.
pub fn decode_ber(raw: u64) -> f64 {
    let mantissa = (raw >> 8) & 0xF;
    let exp = raw & 0xFF;
    mantissa as f64 * 10f64.powi(-(exp as i32))
}

/// The per-link field groups, read together in one `nvmlDeviceGetFieldValues` call per link
/// (each group was a call of its own: on an 18-link GPU that was 72 calls a cycle where 18
/// do). Each group stays a feature of its own on each link (`feature[link]`), disabled on its
/// own: `nvlink_throughput` where any of its fields is unsupported, the others only where
/// none of their fields is (a driver that has some of a group has the group).
const LINK_GROUPS: [(&str, LinkGroup); 4] = [
    ("nvlink_throughput", LinkGroup::Throughput),
    ("nvlink5_counters", LinkGroup::Nvlink5),
    ("nvlink_fec_history", LinkGroup::Fec),
    ("nvlink_link_recovery", LinkGroup::Recovery),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkGroup {
    Throughput,
    Nvlink5,
    Fec,
    Recovery,
}

impl LinkGroup {
    /// The group's field ids, in the order of `NVLINK5` and `RECOVERY` (a test checks).
    fn ids(self) -> std::ops::Range<u32> {
        match self {
            // TX, RX (138, 139).
            LinkGroup::Throughput => FI_NVLINK_TX..FI_NVLINK_RX + 1,
            // 219..=222, in NVLINK5's order.
            LinkGroup::Nvlink5 => FI_NVLINK_EFFECTIVE_ERRORS..FI_NVLINK_SYMBOL_BER + 1,
            LinkGroup::Fec => FI_NVLINK_FEC_HISTORY_0..FI_NVLINK_FEC_HISTORY_0 + FEC_BINS,
            // 213..=215, in RECOVERY's order.
            LinkGroup::Recovery => FI_NVLINK_RECOVERY_SUCCESSFUL..FI_NVLINK_RECOVERY_EVENTS + 1,
        }
    }
}

/// Most fields one link's call asks for (every group enabled).
const LINK_FIELDS: usize = 2 + NVLINK5.len() + FEC_BINS as usize + RECOVERY.len();

/// One link's field groups (those not disabled on it) in one call; samples into `out`, FEC
/// history bins added into `fec` (a bin the driver does not give stays as it was).
fn link_fields(
    ctx: &mut Ctx<'_>,
    link: u32,
    out: &mut Vec<Sample>,
    fec: &mut [Option<f64>],
) -> Result<(), Halt> {
    let name = index_name(link);
    let mut requests = [FieldRequest {
        id: 0,
        scope: link,
        decode: Decode::Typed,
    }; LINK_FIELDS];
    let mut groups: [(&str, LinkGroup, usize, usize); 4] = [("", LinkGroup::Throughput, 0, 0); 4];
    let (mut n, mut g) = (0, 0);
    for (feature, group) in LINK_GROUPS {
        if ctx.is_disabled(Feature::at(feature, link)) {
            continue;
        }
        let start = n;
        for id in group.ids() {
            requests[n].id = id;
            n += 1;
        }
        groups[g] = (feature, group, start, n);
        g += 1;
    }
    if n == 0 {
        return Ok(());
    }
    let nvml = ctx.nvml;
    let requests = &requests[..n];
    let Some(mut values) = ctx.call(Feature::at("nvlink_fields", link), |d| {
        raw::field_values(nvml, d, requests)
    })?
    else {
        return Ok(());
    };
    for &(feature, group, start, end) in &groups[..g] {
        let feature = Feature::at(feature, link);
        let mut unsupported = None;
        let mut any = false;
        for (i, r) in values[start..end].iter_mut().enumerate() {
            let x = match std::mem::replace(r, Ok(0.0)) {
                Ok(x) => x,
                Err(e) => {
                    if group == LinkGroup::Throughput {
                        ctx.failed(feature, e)?;
                    } else {
                        unsupported = Some(e);
                    }
                    continue;
                }
            };
            any = true;
            match group {
                LinkGroup::Throughput => out.push(
                    Sample::new(Metric::NvlinkIo, x * 1024.0)
                        .with("gpu.nvlink.link", name)
                        .with(
                            "network.io.direction",
                            if i == 0 { "transmit" } else { "receive" },
                        ),
                ),
                LinkGroup::Nvlink5 => {
                    let (_, ty, ber) = NVLINK5[i];
                    out.push(if ber {
                        Sample::new(Metric::NvlinkBer, decode_ber(x.max(0.0) as u64))
                            .with("gpu.nvlink.link", name)
                            .with("gpu.nvlink.ber.type", ty)
                    } else {
                        Sample::new(Metric::NvlinkErrors, x)
                            .with("gpu.nvlink.link", name)
                            .with("gpu.nvlink.error.type", ty)
                    });
                }
                LinkGroup::Fec => {
                    fec[i] = Some(fec[i].unwrap_or(0.0) + x.max(0.0));
                }
                LinkGroup::Recovery => out.push(
                    Sample::new(Metric::NvlinkRecovery, x)
                        .with("gpu.nvlink.link", name)
                        .with("gpu.nvlink.recovery.outcome", RECOVERY[i].1),
                ),
            }
        }
        // Pre-Blackwell parts answer NOT_SUPPORTED for every field of the NVLink5, FEC and
        // recovery groups: the group is disabled on the link.
        if !any && let Some(e) = unsupported {
            ctx.failed(feature, e)?;
        }
    }
    Ok(())
}

/// The C2C links of a Grace superchip (GH200, GB200): state, the most bandwidth, errors.
/// Other GPUs answer NOT_SUPPORTED for the link count, and nothing is read.
fn c2c(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
    let Some(links) = field(ctx, "c2c", FI_C2C_LINK_COUNT, Decode::Typed)? else {
        return Ok(());
    };
    let nvml = ctx.nvml;
    for link in 0..(links as u32).min(MAX_NVLINKS) {
        let name = index_name(link);
        let ids = [
            FI_C2C_LINK_STATUS,
            FI_C2C_LINK_MAX_BW,
            FI_C2C_ERROR_INTR,
            FI_C2C_ERROR_REPLAY,
            FI_C2C_ERROR_REPLAY_B2B,
        ];
        let requests: Vec<FieldRequest> = ids
            .iter()
            .map(|id| FieldRequest {
                id: *id,
                scope: link,
                decode: Decode::Typed,
            })
            .collect();
        let feature = Feature::at("c2c_link", link);
        let Some(v) = ctx.call(feature, |d| raw::field_values(nvml, d, &requests))? else {
            continue;
        };
        for (r, id) in v.into_iter().zip(ids) {
            let Ok(x) = r else { continue };
            let s = match id {
                FI_C2C_LINK_STATUS => Sample::new(Metric::C2cState, f64::from(u8::from(x > 0.0))),
                // MB/s.
                FI_C2C_LINK_MAX_BW => Sample::new(Metric::C2cMaxBandwidth, x * 1e6),
                FI_C2C_ERROR_INTR => {
                    Sample::new(Metric::C2cErrors, x).with("gpu.c2c.error.type", "interrupt")
                }
                FI_C2C_ERROR_REPLAY => {
                    Sample::new(Metric::C2cErrors, x).with("gpu.c2c.error.type", "replay")
                }
                _ => Sample::new(Metric::C2cErrors, x).with("gpu.c2c.error.type", "replay_b2b"),
            };
            out.push(s.with("gpu.c2c.link", name));
        }
    }
    Ok(())
}

pub(super) fn nvlink(ctx: &mut Ctx<'_>, out: &mut Vec<Sample>) -> Result<(), Halt> {
    c2c(ctx, out)?;
    let Some(links) = field(ctx, "nvlink", FI_NVLINK_LINK_COUNT, Decode::Typed)? else {
        return Ok(());
    };
    let links = (links as u32).min(MAX_NVLINKS);
    let nvml = ctx.nvml;
    let mut fec = [None; FEC_BINS as usize];
    for link in 0..links {
        let name = index_name(link);
        if let Some(up) = ctx.call(Feature::at("nvlink_state", link), |d| {
            d.link_wrapper_for(link).is_active()
        })? {
            out.push(
                Sample::new(Metric::NvlinkState, f64::from(u8::from(up)))
                    .with("gpu.nvlink.link", name),
            );
        }
        for (counter, feature, ty) in ERROR_COUNTERS {
            if let Some(n) = ctx.call(Feature::at(feature, link), |d| {
                raw::nvlink_error(nvml, d, link, counter)
            })? {
                out.push(
                    Sample::new(Metric::NvlinkErrors, n as f64)
                        .with("gpu.nvlink.link", name)
                        .with("gpu.nvlink.error.type", ty),
                );
            }
        }
        link_fields(ctx, link, out, &mut fec)?;
    }
    for (bin, n) in fec.iter().enumerate() {
        if let Some(n) = n {
            out.push(
                Sample::new(Metric::NvlinkFecHistory, *n)
                    .with("gpu.nvlink.fec.bin", index_name(bin as u32)),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_groups_ask_for_the_fields_their_samples_name() {
        let ids = |g: LinkGroup| g.ids().collect::<Vec<u32>>();
        assert_eq!(ids(LinkGroup::Throughput), [FI_NVLINK_TX, FI_NVLINK_RX]);
        assert_eq!(
            ids(LinkGroup::Nvlink5),
            NVLINK5.iter().map(|(id, _, _)| *id).collect::<Vec<_>>()
        );
        assert_eq!(
            ids(LinkGroup::Recovery),
            RECOVERY.iter().map(|(id, _)| *id).collect::<Vec<_>>()
        );
        assert_eq!(ids(LinkGroup::Fec).len(), FEC_BINS as usize);
        let all: usize = LINK_GROUPS.iter().map(|(_, g)| g.ids().len()).sum();
        assert_eq!(all, LINK_FIELDS);
    }
}

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

/// The NVLink5 error counters and BERs of one link (pre-Blackwell parts answer
/// NOT_SUPPORTED for every field: the link's group is disabled).
fn nvlink5(ctx: &mut Ctx<'_>, link: u32, out: &mut Vec<Sample>) -> Result<(), Halt> {
    let name = index_name(link);
    let ids: Vec<u32> = NVLINK5.iter().map(|(id, _, _)| *id).collect();
    let Some(v) = link_fields(ctx, "nvlink5_counters", link, &ids)? else {
        return Ok(());
    };
    for (x, (_, ty, ber)) in v.into_iter().zip(NVLINK5) {
        match x {
            Some(x) if ber => out.push(
                Sample::new(Metric::NvlinkBer, decode_ber(x.max(0.0) as u64))
                    .with("gpu.nvlink.link", name)
                    .with("gpu.nvlink.ber.type", ty),
            ),
            Some(x) => out.push(
                Sample::new(Metric::NvlinkErrors, x)
                    .with("gpu.nvlink.link", name)
                    .with("gpu.nvlink.error.type", ty),
            ),
            None => {}
        }
    }
    Ok(())
}

/// One link's FEC history bins, added into `bins` (a bin the driver does not give stays as it
/// was). Per GPU, not per link: 16 bins on each of 18 links would be 288 series a GPU.
fn fec_history(ctx: &mut Ctx<'_>, link: u32, bins: &mut [Option<f64>]) -> Result<(), Halt> {
    let ids: Vec<u32> = (0..FEC_BINS).map(|b| FI_NVLINK_FEC_HISTORY_0 + b).collect();
    let Some(v) = link_fields(ctx, "nvlink_fec_history", link, &ids)? else {
        return Ok(());
    };
    for (x, bin) in v.into_iter().zip(bins.iter_mut()) {
        if let Some(x) = x {
            *bin = Some(bin.unwrap_or(0.0) + x.max(0.0));
        }
    }
    Ok(())
}

/// A group of one link's fields read in one call under `feature` (at the link): one entry
/// per id, `None` where that field is unavailable; the group is disabled on that link only
/// where none of its fields is (a driver that has some of a group has the group).
fn link_fields(
    ctx: &mut Ctx<'_>,
    feature: &'static str,
    link: u32,
    ids: &[u32],
) -> Result<Option<Vec<Option<f64>>>, Halt> {
    let nvml = ctx.nvml;
    let requests: Vec<FieldRequest> = ids
        .iter()
        .map(|id| FieldRequest {
            id: *id,
            scope: link,
            decode: Decode::Typed,
        })
        .collect();
    let feature = Feature::at(feature, link);
    let Some(v) = ctx.call(feature, |d| raw::field_values(nvml, d, &requests))? else {
        return Ok(None);
    };
    let mut unsupported = None;
    let values: Vec<Option<f64>> = v
        .into_iter()
        .map(|r| r.map_err(|e| unsupported = Some(e)).ok())
        .collect();
    if values.iter().all(Option::is_none)
        && let Some(e) = unsupported
    {
        ctx.failed(feature, e)?;
    }
    Ok(Some(values))
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
        let data = [
            FieldRequest {
                id: FI_NVLINK_TX,
                scope: link,
                decode: Decode::Typed,
            },
            FieldRequest {
                id: FI_NVLINK_RX,
                scope: link,
                decode: Decode::Typed,
            },
        ];
        if let Some(v) = ctx.call(Feature::at("nvlink_throughput", link), |d| {
            raw::field_values(nvml, d, &data)
        })? {
            for (r, dir) in v.into_iter().zip(["transmit", "receive"]) {
                match r {
                    Ok(kib) => out.push(
                        Sample::new(Metric::NvlinkIo, kib * 1024.0)
                            .with("gpu.nvlink.link", name)
                            .with("network.io.direction", dir),
                    ),
                    Err(e) => ctx.failed(Feature::at("nvlink_throughput", link), e)?,
                }
            }
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
        nvlink5(ctx, link, out)?;
        fec_history(ctx, link, &mut fec)?;
        let requests: Vec<FieldRequest> = RECOVERY
            .iter()
            .map(|(id, _)| FieldRequest {
                id: *id,
                scope: link,
                decode: Decode::Typed,
            })
            .collect();
        let feature = Feature::at("nvlink_link_recovery", link);
        if let Some(v) = ctx.call(feature, |d| raw::field_values(nvml, d, &requests))? {
            let mut unsupported = None;
            for (r, (_, outcome)) in v.into_iter().zip(RECOVERY) {
                match r {
                    Ok(n) => out.push(
                        Sample::new(Metric::NvlinkRecovery, n)
                            .with("gpu.nvlink.link", name)
                            .with("gpu.nvlink.recovery.outcome", outcome),
                    ),
                    Err(e) => unsupported = Some(e),
                }
            }
            // Pre-Blackwell parts answer NOT_SUPPORTED per field: disable the link's group.
            if let Some(e) = unsupported.filter(|_| {
                !out.iter().any(|s| {
                    s.metric == Metric::NvlinkRecovery && s.attr("gpu.nvlink.link") == Some(name)
                })
            }) {
                ctx.failed(feature, e)?;
            }
        }
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

//! Counters that only go up, from the ones the NIC gives. The IBTA PortCounters in
//! `counters/` saturate at all-ones (a 16-bit `symbol_error` stops at 65535) and are reset by
//! an administrator (`perfquery -x`) or a driver reload; mlx5's Q-counters in `hw_counters/`
//! are 32-bit and wrap (`mlx5_ifc.h`). A decrease is therefore a wrap only for a 32-bit
//! driver counter that was near its top, and a reset (count from zero) otherwise: Junction's
//! totals never go backwards and never count the same event twice.

/// How a raw counter behaves at its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Width {
    /// An IBTA error counter of this many bits: stops at 2^bits − 1.
    Saturating(u32),
    /// A 32-bit driver counter: wraps at 2^32.
    Wraps32,
    /// 64 bits (or unknown): a decrease is a reset.
    Wide,
}

/// The width of a standard counter (`drivers/infiniband/core/sysfs.c`, `PORT_PMA_ATTR`).
pub fn standard_width(name: &str) -> Width {
    match name {
        "symbol_error"
        | "port_rcv_errors"
        | "port_rcv_remote_physical_errors"
        | "port_rcv_switch_relay_errors"
        | "port_xmit_discards"
        | "VL15_dropped" => Width::Saturating(16),
        "link_error_recovery"
        | "link_downed"
        | "port_xmit_constraint_errors"
        | "port_rcv_constraint_errors" => Width::Saturating(8),
        "local_link_integrity_errors" | "excessive_buffer_overrun_errors" => Width::Saturating(4),
        _ => Width::Wide,
    }
}

/// The width of a driver counter: mlx5's congestion counters are 64-bit, its Q-counters and
/// EFA's are read as 32-bit (a value past 2^32 says it is wider).
pub fn driver_width(name: &str, raw: u64) -> Width {
    if raw > u64::from(u32::MAX) || name.starts_with("rp_cnp") || name.starts_with("np_") {
        Width::Wide
    } else {
        Width::Wraps32
    }
}

/// One counter's running total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter {
    last: u64,
    total: u64,
}

impl Counter {
    /// A counter first seen at `raw` (what it counted before Junction looked).
    pub fn new(raw: u64) -> Self {
        Self {
            last: raw,
            total: raw,
        }
    }

    /// Takes a new raw value; returns how much it counted since the last.
    pub fn update(&mut self, raw: u64, width: Width) -> u64 {
        let delta = if raw >= self.last {
            raw - self.last
        } else {
            let top = 1u64 << 32;
            match width {
                // Wrapped: it was within the top quarter and is now within the bottom one.
                Width::Wraps32 if self.last >= top - (top >> 2) && raw < (top >> 2) => {
                    top - self.last + raw
                }
                // Reset: it counts again from zero.
                _ => raw,
            }
        };
        self.last = raw;
        self.total = self.total.saturating_add(delta);
        delta
    }

    /// Everything counted.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// True while the raw value is stuck at its limit (its rate cannot be known).
    pub fn saturated(&self, width: Width) -> bool {
        matches!(width, Width::Saturating(bits) if self.last >= (1u64 << bits) - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_resets_and_saturation() {
        // A 32-bit driver counter wraps: the total goes on.
        let mut c = Counter::new(u64::from(u32::MAX) - 9);
        assert_eq!(c.update(5, Width::Wraps32), 15);
        assert_eq!(c.total(), u64::from(u32::MAX) + 6);
        // A driver reload: it starts from zero again, nothing is counted twice or lost.
        let mut c = Counter::new(1000);
        assert_eq!(c.update(1500, Width::Wraps32), 500);
        assert_eq!(c.update(20, Width::Wraps32), 20, "a reset, not a wrap");
        assert_eq!(c.total(), 1520);
        // A saturating counter: pinned at its top, then cleared by an administrator.
        let w = standard_width("excessive_buffer_overrun_errors");
        let mut c = Counter::new(14);
        assert_eq!(c.update(15, w), 1);
        assert!(c.saturated(w));
        assert_eq!(c.update(15, w), 0);
        assert_eq!(c.update(2, w), 2);
        assert!(!c.saturated(w));
        assert_eq!(c.total(), 17);
        assert_eq!(standard_width("symbol_error"), Width::Saturating(16));
        assert_eq!(driver_width("np_cnp_sent", 1), Width::Wide);
        assert_eq!(driver_width("out_of_sequence", 1), Width::Wraps32);
    }
}

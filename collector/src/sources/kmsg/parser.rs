//! The kernel-log line parser (pure, no I/O): NVIDIA `NVRM: Xid` lines in every variant seen
//! in the wild, the driver's `NVRM: GPU at PCI:…: GPU-<uuid>` preamble, the fallen-off-the-bus
//! lines that carry no Xid, and NVSwitch `SXid` lines (their `Severity …` and `Data {…}`
//! companion lines are recognised, not counted). Formats: `../shared/reference/xid-kmsg.md`
//! §2–3.
//!
//! Only the kernel speaks: [`Parser::line`] takes a kernel message (a `/dev/kmsg` record's
//! text, or what [`file_line`] leaves of a log-file line) and recognises the driver's text
//! only at its start (`NVRM: `, `nvidia-nvswitchN: SXid (`), so that a kernel message that
//! quotes user text (`tmpfs: Unknown parameter 'NVRM: Xid …'`) is no XID. [`file_line`] says
//! whose a file line is by its syslog tag.

use std::sync::LazyLock;

use memchr::memmem::Finder;
use regex::Regex;

/// A PCI address, `dddd:bb:dd` (the driver prints no function).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pci {
    /// Domain.
    pub domain: u16,
    /// Bus.
    pub bus: u8,
    /// Device.
    pub device: u8,
}

impl std::fmt::Display for Pci {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}",
            self.domain, self.bus, self.device
        )
    }
}

impl Pci {
    fn from_caps(c: &regex::Captures<'_>, at: usize) -> Option<Pci> {
        Some(Pci {
            domain: u16::from_str_radix(c.get(at)?.as_str(), 16).ok()?,
            bus: u8::from_str_radix(c.get(at + 1)?.as_str(), 16).ok()?,
            device: u8::from_str_radix(c.get(at + 2)?.as_str(), 16).ok()?,
        })
    }
}

/// What an `NVRM: Xid` line says beyond its code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detail {
    /// Nothing decoded.
    None,
    /// Xid 45: the root cause.
    CausedBy(u32),
    /// Xid 154: the recovery action, from and to (the hex values, not the words).
    RecoveryAction {
        /// Before.
        from: u32,
        /// Now.
        to: u32,
    },
    /// Xid 94/95: reset and drain-and-reset required.
    MemoryError {
        /// `RST: Yes`.
        reset: bool,
        /// `D-RST: Yes`.
        drain_reset: bool,
    },
    /// Xid 144–150 (NVLink5): the unit, the Fatal/Nonfatal token and the link.
    NvLink5 {
        /// The unit, e.g. `RLW_RXPIPE`.
        unit: String,
        /// `Fatal` (true) or `Nonfatal`.
        fatal: bool,
        /// The link (-1: none).
        link: i32,
    },
    /// Xid 48: where the double-bit error was.
    Dbe {
        /// `physAddr 0x…` when printed.
        phys_addr: Option<String>,
    },
    /// Xid 63/64: row remapping or page retirement (and whether it failed).
    Retirement {
        /// Row remapping (A100 and newer) rather than page retirement.
        row_remap: bool,
    },
}

/// An `NVRM: Xid` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidLine<'a> {
    /// The GPU.
    pub pci: Pci,
    /// MIG `GPU-I:`.
    pub gpu_instance: Option<u32>,
    /// MIG `GPU-CI:`.
    pub compute_instance: Option<u32>,
    /// The XID.
    pub code: u32,
    /// `pid=N` (absent, or `'<unknown>'`: none).
    pub pid: Option<u32>,
    /// `name=…` (absent, or `<unknown>`: none).
    pub process: Option<&'a str>,
    /// The message after the code (and pid/name).
    pub message: &'a str,
    /// Decoded details.
    pub detail: Detail,
}

/// An NVSwitch `SXid` line that is an event (not a companion line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SXidLine<'a> {
    /// The switch's PCI address, with function (`dddd:bb:dd.f`).
    pub switch: String,
    /// The SXid.
    pub code: u32,
    /// `Fatal` / `Non-fatal`, when the line says.
    pub fatal: Option<bool>,
    /// `Link N`, when the line says.
    pub link: Option<u32>,
    /// The message after the code.
    pub message: &'a str,
}

/// What a line is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// An Xid.
    Xid(XidLine<'a>),
    /// A fallen-off-the-bus line without an Xid: counts as Xid 79.
    BusLine(Pci),
    /// An SXid event.
    SXid(SXidLine<'a>),
    /// An SXid companion line (`Severity …`, `Data {…}`): part of an event already counted.
    SXidCompanion,
    /// The driver's `NVRM: GPU at PCI:…: GPU-<uuid>` line.
    GpuUuid(Pci, &'a str),
    /// A signature of the catalog beyond XID (`model::signatures`).
    Signature(super::signatures::SigMatch<'a>),
    /// Anything else.
    Other,
}

static SXID: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(": SXid ("));
static OFF_THE_BUS: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new("fallen off the bus and is not responding"));

const PCI: &str = r"([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})";

static XID_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"^NVRM: Xid \((?:PCI:)?{PCI}(?:\.[0-9a-fA-F])?(?: GPU-I:([0-9]+))?(?: GPU-CI:([0-9]+))?\): ([0-9]+),?[ ]?(.*)"
    ))
    .expect("a valid regex")
});
static UUID_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"^NVRM: GPU at (?:PCI:)?{PCI}(?:\.[0-9a-fA-F])?: (GPU-[0-9a-fA-F]{{8}}-[0-9a-fA-F]{{4}}-[0-9a-fA-F]{{4}}-[0-9a-fA-F]{{4}}-[0-9a-fA-F]{{12}})(?:$|[^0-9a-fA-F-])"
    ))
    .expect("a valid regex")
});
static BUS_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"^NVRM: GPU (?:at )?(?:PCI:)?{PCI}(?:\.[0-9a-fA-F])?:? (?:GPU )?has fallen off the bus"
    ))
    .expect("a valid regex")
});
static THE_GPU_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(r"^NVRM: The NVIDIA GPU (?:PCI:)?{PCI}")).expect("a valid regex")
});
static SXID_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"^nvidia-nvswitch[0-9]{{1,3}}: SXid \(PCI:{PCI}\.([0-9a-fA-F])\): ([0-9]+),? ?(.*)"
    ))
    .expect("a valid regex")
});
static CAUSED_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"caused by previous Xid ([0-9]+)").expect("a valid regex"));
static ACTION_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"from 0x([0-9a-fA-F]+).*? to 0x([0-9a-fA-F]+)").expect("a valid regex")
});
static RST_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"RST: (Yes|No), D-RST: (Yes|No)").expect("a valid regex"));
static NVLINK5_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^([^ ]+) (Fatal|Nonfatal) XC[0-9] i[0-9]+ Link (-?[0-9]+)").expect("a valid regex")
});
static PHYS_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"physAddr (0x[0-9a-fA-F]+)").expect("a valid regex"));
static LINK_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(Fatal|Non-fatal), Link ([0-9]+)").expect("a valid regex"));

/// A parser with the little state the multi-record fallen-off-the-bus message needs.
#[derive(Debug, Default)]
pub struct Parser {
    /// `NVRM: The NVIDIA GPU <pci>` seen this many lines ago.
    pending_bus: Option<(Pci, u8)>,
}

impl Parser {
    /// Parses one kernel message (or one multi-line record): the driver's text must start
    /// it.
    pub fn line<'a>(&mut self, line: &'a str) -> Parsed<'a> {
        if !line.starts_with("NVRM: ") {
            if line.starts_with("nvidia-nvswitch") && SXID.find(line.as_bytes()).is_some() {
                return sxid(line);
            }
            return super::signatures::find(line).map_or(Parsed::Other, Parsed::Signature);
        }
        let mut parsed = self.nvrm(line);
        if parsed == Parsed::Other
            && let Some(m) = super::signatures::find(line)
        {
            parsed = Parsed::Signature(m);
        }
        if let Some((_, n)) = &mut self.pending_bus {
            *n += 1;
            if *n > 3 {
                self.pending_bus = None;
            }
        }
        parsed
    }

    fn nvrm<'a>(&mut self, line: &'a str) -> Parsed<'a> {
        // Each pattern only where its fixed start is: most NVRM lines are none of these.
        if line.starts_with("NVRM: Xid (")
            && let Some(c) = XID_RE.captures(line)
        {
            return xid(&c).map_or(Parsed::Other, Parsed::Xid);
        }
        if line.starts_with("NVRM: GPU ") {
            if let Some(c) = UUID_RE.captures(line) {
                let uuid = c.get(4).map_or("", |m| m.as_str());
                return Pci::from_caps(&c, 1).map_or(Parsed::Other, |p| Parsed::GpuUuid(p, uuid));
            }
            if let Some(c) = BUS_RE.captures(line) {
                return Pci::from_caps(&c, 1).map_or(Parsed::Other, Parsed::BusLine);
            }
        }
        // "NVRM: The NVIDIA GPU <pci>" / "(PCI ID: …) installed in this system has" /
        // "fallen off the bus and is not responding to commands.": one record with embedded
        // newlines, or three records in a row.
        if line.starts_with("NVRM: The NVIDIA GPU ")
            && let Some(c) = THE_GPU_RE.captures(line)
        {
            let Some(pci) = Pci::from_caps(&c, 1) else {
                return Parsed::Other;
            };
            if line.contains("fallen off the bus") {
                return Parsed::BusLine(pci);
            }
            self.pending_bus = Some((pci, 0));
            return Parsed::Other;
        }
        if self.pending_bus.is_some()
            && OFF_THE_BUS.find(line.as_bytes()).is_some()
            && let Some((pci, _)) = self.pending_bus.take()
        {
            return Parsed::BusLine(pci);
        }
        Parsed::Other
    }
}

fn xid<'a>(c: &regex::Captures<'a>) -> Option<XidLine<'a>> {
    let pci = Pci::from_caps(c, 1)?;
    let num = |i: usize| c.get(i).and_then(|m| m.as_str().parse::<u32>().ok());
    let code = num(6)?;
    let mut rest = c.get(7).map_or("", |m| m.as_str());
    let mut pid = None;
    let mut process = None;
    if let Some(r) = rest.strip_prefix("pid=") {
        // Real lines have more than one space after the comma at times.
        let (p, tail) = r.split_once(',').unwrap_or((r, ""));
        pid = p.parse().ok();
        rest = tail.trim_start();
        if let Some(r) = rest.strip_prefix("name=") {
            let (n, tail) = r
                .split_once(", ")
                .unwrap_or((r.strip_suffix(',').unwrap_or(r), ""));
            process = (!n.is_empty() && n != "<unknown>").then_some(n);
            rest = tail;
        }
    }
    let detail = match code {
        45 => CAUSED_RE
            .captures(rest)
            .and_then(|c| c.get(1)?.as_str().parse().ok())
            .map_or(Detail::None, Detail::CausedBy),
        154 => ACTION_RE
            .captures(rest)
            .and_then(|c| {
                Some(Detail::RecoveryAction {
                    from: u32::from_str_radix(c.get(1)?.as_str(), 16).ok()?,
                    to: u32::from_str_radix(c.get(2)?.as_str(), 16).ok()?,
                })
            })
            .unwrap_or(Detail::None),
        94 | 95 => RST_RE
            .captures(rest)
            .map(|c| Detail::MemoryError {
                reset: c.get(1).is_some_and(|m| m.as_str() == "Yes"),
                drain_reset: c.get(2).is_some_and(|m| m.as_str() == "Yes"),
            })
            .unwrap_or(Detail::None),
        144..=150 => NVLINK5_RE
            .captures(rest)
            .and_then(|c| {
                Some(Detail::NvLink5 {
                    unit: c.get(1)?.as_str().to_string(),
                    fatal: c.get(2)?.as_str() == "Fatal",
                    link: c.get(3)?.as_str().parse().ok()?,
                })
            })
            .unwrap_or(Detail::None),
        48 => Detail::Dbe {
            phys_addr: PHYS_RE
                .captures(rest)
                .and_then(|c| Some(c.get(1)?.as_str().to_string())),
        },
        63 | 64 => Detail::Retirement {
            row_remap: rest.contains("Row Remap"),
        },
        _ => Detail::None,
    };
    Some(XidLine {
        pci,
        gpu_instance: num(4),
        compute_instance: num(5),
        code,
        pid,
        process,
        message: rest,
        detail,
    })
}

fn sxid(line: &str) -> Parsed<'_> {
    let Some(c) = SXID_RE.captures(line) else {
        return Parsed::Other;
    };
    let (Some(pci), Some(f), Some(code)) = (
        Pci::from_caps(&c, 1),
        c.get(4),
        c.get(5).and_then(|m| m.as_str().parse().ok()),
    ) else {
        return Parsed::Other;
    };
    let rest = c.get(6).map_or("", |m| m.as_str());
    if rest.starts_with("Severity ") || rest.starts_with("Data {") {
        return Parsed::SXidCompanion;
    }
    let (fatal, link) = match LINK_RE.captures(rest) {
        Some(l) => (
            Some(l.get(1).is_some_and(|m| m.as_str() == "Fatal")),
            l.get(2).and_then(|m| m.as_str().parse().ok()),
        ),
        None if rest.starts_with("Fatal") => (Some(true), None),
        None if rest.starts_with("Non-fatal") => (Some(false), None),
        None => (None, None),
    };
    Parsed::SXid(SXidLine {
        switch: format!("{pci}.{}", f.as_str().to_ascii_lowercase()),
        code,
        fatal,
        link,
        message: rest,
    })
}

/// Whose a line of a kernel-log file is, by its syslog tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The kernel's (`kernel:`; `kern` in `dmesg -x`).
    Kernel,
    /// Another program's (`root:`, `systemd[1]:`, …): anyone can write such a line with
    /// `logger`.
    Program,
    /// No tag (`dmesg` output, a bare message): whose it is cannot be told.
    Untagged,
}

/// A line of a kernel-log file, split into whose it is and the kernel message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLine<'a> {
    /// Whose.
    pub origin: Origin,
    /// The message, without the syslog header or the printk timestamp.
    pub message: &'a str,
}

/// A syslog header: an RFC 3164 timestamp (`Mmm dd hh:mm:ss`, any month word, optional
/// fraction: rsyslog's default, journald's `short` and `short-precise`) or an RFC 3339 one
/// (rsyslog's `RSYSLOG_FileFormat`, journald's `short-iso`), an optional host, then the tag.
/// Host and tag of any length (a counted `[^ :]{1,255}` compiled to 370 KB of heap; and a
/// program's tag too long for a bound would have made its line untagged, not a program's).
static SYSLOG_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"^(?:[^ 0-9\[\]:]{3,12}\.? +[0-9]{1,2} [0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?",
        r"|[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?(?:Z|[+-][0-9]{2}:?[0-9]{2})?)",
        r" +(?:[^ :]+ +)?([^ :\[]+)(?:\[[0-9]{1,10}\])?:(?: |$)"
    ))
    .expect("a valid regex")
});
/// `dmesg -x` (`--decode`): `kern  :warn  : `.
static DECODE_RE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^([a-z0-9]{2,8}) *:([a-z]{3,6}) *: ").expect("a valid regex"));
/// A printk timestamp (`[ 12.345678] `), a `dmesg -T` one (`[Tue Mar  1 12:00:00 2024] `),
/// an ISO one (`dmesg --time-format iso`) or a bare time of day.
static STAMP_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"^(?:\[[^\]]{1,40}\]",
        r"|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?(?:Z|[+-][0-9]{2}:?[0-9]{2})?",
        r"|[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?)",
        r"(?: +|$)"
    ))
    .expect("a valid regex")
});

/// Splits a kernel-log file line (kern.log, syslog, messages, `journalctl -k` and `dmesg`
/// output) into whose it is and its message. Recognised: RFC 3164 and RFC 3339 syslog headers
/// with or without a host, `kernel: ` alone (a trimmed syslog line), `dmesg -x` facility
/// prefixes, and printk, `dmesg -T` and ISO timestamps; anything else is an untagged message.
pub fn file_line(line: &str) -> FileLine<'_> {
    let line = line.trim_start();
    let strip_stamp = |s: &'_ str| -> usize { STAMP_RE.find(s).map_or(0, |m| m.end()) };
    let (origin, rest) = if let Some(c) = SYSLOG_RE.captures(line) {
        let tag = c.get(1);
        let end = c.get(0).map_or(0, |m| m.end());
        match tag.map(|t| (t.as_str(), t.start())) {
            Some(("kernel", _)) => (Origin::Kernel, &line[end..]),
            // A timestamp, then the driver's text itself (a capture with the host and tag
            // cut): nobody's tag.
            Some(("NVRM", start)) => (Origin::Untagged, &line[start..]),
            _ => (Origin::Program, &line[end..]),
        }
    } else if let Some(r) = line.strip_prefix("kernel: ") {
        (Origin::Kernel, r)
    } else if let Some(c) = DECODE_RE.captures(line) {
        let end = c.get(0).map_or(0, |m| m.end());
        let origin = if c.get(1).is_some_and(|m| m.as_str() == "kern") {
            Origin::Kernel
        } else {
            Origin::Program
        };
        (origin, &line[end..])
    } else {
        (Origin::Untagged, line)
    };
    let rest = &rest[strip_stamp(rest)..];
    FileLine {
        origin,
        message: rest.trim_end_matches(['\r', '\n']),
    }
}

#[cfg(test)]
mod tests;

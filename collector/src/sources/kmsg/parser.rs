//! The kernel-log line parser (pure, no I/O): NVIDIA `NVRM: Xid` lines in every variant seen
//! in the wild, the driver's `NVRM: GPU at PCI:…: GPU-<uuid>` preamble, the fallen-off-the-bus
//! lines that carry no Xid, and NVSwitch `SXid` lines (their `Severity …` and `Data {…}`
//! companion lines are recognised, not counted). Prefixes (syslog, `dmesg -T`, `[sec.usec]`)
//! are skipped by searching, not anchoring. A substring prefilter rejects unrelated lines
//! before any regex runs. Formats: `../shared/reference/xid-kmsg.md` §2–3.

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
    /// Anything else.
    Other,
}

static NVRM: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("NVRM: "));
static SXID: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("SXid ("));

const PCI: &str = r"([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})";

static XID_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"NVRM: Xid \((?:PCI:)?{PCI}(?:\.[0-9a-fA-F])?(?: GPU-I:([0-9]+))?(?: GPU-CI:([0-9]+))?\): ([0-9]+),?[ ]?(.*)"
    ))
    .expect("a valid regex")
});
static UUID_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"NVRM: GPU at (?:PCI:)?{PCI}(?:\.[0-9a-fA-F])?: (GPU-[0-9a-fA-F-]+)"
    ))
    .expect("a valid regex")
});
static BUS_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"NVRM: GPU (?:at )?(?:PCI:)?{PCI}(?:\.[0-9a-fA-F])?:? (?:GPU )?has fallen off the bus"
    ))
    .expect("a valid regex")
});
static THE_GPU_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(r"NVRM: The NVIDIA GPU (?:PCI:)?{PCI}")).expect("a valid regex")
});
static SXID_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"SXid \(PCI:{PCI}\.([0-9a-fA-F])\): ([0-9]+),? ?(.*)"
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
    /// Parses one line (or one multi-line record).
    pub fn line<'a>(&mut self, line: &'a str) -> Parsed<'a> {
        let b = line.as_bytes();
        let nvrm = NVRM.find(b);
        if nvrm.is_none() {
            if SXID.find(b).is_some() {
                return sxid(line);
            }
            return Parsed::Other;
        }
        let parsed = self.nvrm(line);
        if let Some((_, n)) = &mut self.pending_bus {
            *n += 1;
            if *n > 3 {
                self.pending_bus = None;
            }
        }
        parsed
    }

    fn nvrm<'a>(&mut self, line: &'a str) -> Parsed<'a> {
        if let Some(c) = XID_RE.captures(line) {
            return xid(&c).map_or(Parsed::Other, Parsed::Xid);
        }
        if let Some(c) = UUID_RE.captures(line) {
            let uuid = c.get(4).map_or("", |m| m.as_str());
            return Pci::from_caps(&c, 1).map_or(Parsed::Other, |p| Parsed::GpuUuid(p, uuid));
        }
        if let Some(c) = BUS_RE.captures(line) {
            return Pci::from_caps(&c, 1).map_or(Parsed::Other, Parsed::BusLine);
        }
        // "NVRM: The NVIDIA GPU <pci>" / "(PCI ID: …) installed in this system has" /
        // "fallen off the bus and is not responding to commands.": one record with embedded
        // newlines, or three records in a row.
        if let Some(c) = THE_GPU_RE.captures(line) {
            let Some(pci) = Pci::from_caps(&c, 1) else {
                return Parsed::Other;
            };
            if line.contains("fallen off the bus") {
                return Parsed::BusLine(pci);
            }
            self.pending_bus = Some((pci, 0));
            return Parsed::Other;
        }
        if line.contains("fallen off the bus and is not responding")
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
        let (p, tail) = r.split_once(", ").unwrap_or((r, ""));
        pid = p.parse().ok();
        rest = tail;
        if let Some(r) = rest.strip_prefix("name=") {
            let (n, tail) = r.split_once(", ").unwrap_or((r, ""));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The expected form of a parse, as the fixture writes it.
    fn describe(p: &Parsed<'_>) -> String {
        let o = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
        match p {
            Parsed::Xid(x) => {
                let detail = match &x.detail {
                    Detail::None => "none".to_string(),
                    Detail::CausedBy(c) => format!("caused_by={c}"),
                    Detail::RecoveryAction { from, to } => format!("action={from}->{to}"),
                    Detail::MemoryError { reset, drain_reset } => format!(
                        "memory=rst:{}/drst:{}",
                        if *reset { "yes" } else { "no" },
                        if *drain_reset { "yes" } else { "no" }
                    ),
                    Detail::NvLink5 { unit, fatal, link } => format!(
                        "nvlink5={unit}/{}/{link}",
                        if *fatal { "fatal" } else { "nonfatal" }
                    ),
                    Detail::Dbe { phys_addr } => {
                        format!("dbe={}", phys_addr.as_deref().unwrap_or("-"))
                    }
                    Detail::Retirement { row_remap } => {
                        format!("retirement={}", if *row_remap { "row" } else { "page" })
                    }
                };
                format!(
                    "xid {} {} pid={} name={} gi={} ci={} {detail}",
                    x.pci,
                    x.code,
                    o(x.pid),
                    x.process.unwrap_or("-"),
                    o(x.gpu_instance),
                    o(x.compute_instance)
                )
            }
            Parsed::BusLine(p) => format!("bus {p}"),
            Parsed::SXid(s) => format!(
                "sxid {} {} fatal={} link={}",
                s.switch,
                s.code,
                s.fatal.map_or("-".to_string(), |f| f.to_string()),
                o(s.link)
            ),
            Parsed::SXidCompanion => "companion".into(),
            Parsed::GpuUuid(p, u) => format!("uuid {p} {u}"),
            Parsed::Other => "other".into(),
        }
    }

    #[test]
    fn every_line_of_the_corpus() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/kmsg/lines.txt"
        );
        let text = std::fs::read_to_string(path).expect("fixture");
        let mut n = 0;
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        {
            let (want, input) = line.split_once(" | ").expect("`expected | line`");
            let input = super::super::record::unescape(input);
            let got = describe(&Parser::default().line(&input));
            assert_eq!(got, want, "line: {input}");
            n += 1;
        }
        assert!(n > 60, "{n} lines");
    }

    #[test]
    fn the_bus_message_in_three_records() {
        let mut p = Parser::default();
        assert_eq!(p.line("NVRM: The NVIDIA GPU 0000:b3:00.0"), Parsed::Other);
        assert_eq!(
            p.line("NVRM: (PCI ID: 10de:26b5) installed in this system has"),
            Parsed::Other
        );
        assert_eq!(
            describe(&p.line("NVRM: fallen off the bus and is not responding to commands.")),
            "bus 0000:b3:00"
        );
        // Without the first record, the last one is nothing.
        let mut p = Parser::default();
        assert_eq!(
            p.line("NVRM: fallen off the bus and is not responding to commands."),
            Parsed::Other
        );
    }

    /// No input makes the parser panic, and each takes bounded time (the regexes are
    /// linear-time; this runs every prefix of a long mixed line and random byte soup).
    #[test]
    fn arbitrary_input_never_panics() {
        let seeds = [
            "NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 154, pid=1, name=a, from 0x0 to 0x1 RST: Yes, D-RST: No",
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 48 x",
            "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: fallen off the bus and is not responding",
            "NVRM: GPU at PCI:0000:01:00: GPU-4e391288-897c",
        ];
        let mut p = Parser::default();
        for s in seeds {
            for end in 0..=s.len() {
                if s.is_char_boundary(end) {
                    let _ = p.line(&s[..end]);
                    let _ = p.line(&s[end..]);
                }
            }
        }
        // A simple xorshift: reproducible byte soup around the prefilter's needles.
        let mut x: u64 = 0x9e3779b97f4a7c15;
        let alphabet = b"NVRM: Xid(PCI:0123456789abcdef,) GPU-I:SXid.=-pidname\n\\x";
        for _ in 0..20_000 {
            let len = (x % 120) as usize;
            let mut b = String::with_capacity(len);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b.push(alphabet[(x % alphabet.len() as u64) as usize] as char);
            }
            let _ = p.line(&b);
            let _ = p.line(&format!("NVRM: Xid (PCI:{b}"));
            let _ = super::super::record::parse(b.as_bytes());
        }
    }
}

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
    /// Anything else.
    Other,
}

static SXID: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(": SXid ("));

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
static SYSLOG_RE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(concat!(
        r"^(?:[^ 0-9\[\]:]{3,12}\.? +[0-9]{1,2} [0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?",
        r"|[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?(?:Z|[+-][0-9]{2}:?[0-9]{2})?)",
        r" +(?:[^ :]{1,255} +)?([^ :\[]{1,64})(?:\[[0-9]{1,10}\])?:(?: |$)"
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
            let got = describe(&Parser::default().line(file_line(&input).message));
            assert_eq!(got, want, "line: {input}");
            n += 1;
        }
        assert!(n > 60, "{n} lines");
    }

    /// The real-world corpus (lines from public bug reports and vendor repositories, in
    /// `../shared/realworld/`): every line parses as its expectations say, through the same
    /// file-line split a followed file gets.
    #[test]
    fn every_line_of_the_real_world_corpus() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/realworld");
        let lines = std::fs::read_to_string(format!("{dir}/xid-lines.txt"))
            .expect("../shared/realworld/xid-lines.txt");
        let expected = std::fs::read_to_string(format!("{dir}/xid-lines.expected.tsv"))
            .expect("xid-lines.expected.tsv");
        let lines: Vec<&str> = lines.lines().collect();
        let mut checked = 0;
        for row in expected.lines().filter(|r| !r.starts_with('#')) {
            let f: Vec<&str> = row.split('\t').collect();
            let n: usize = f[0].parse().expect("line number");
            let (kind, pci, code, pid, name) = (f[2], f[3], f[4], f[5], f[6]);
            let line = lines[n - 1];
            let mut p = Parser::default();
            let got = p.line(file_line(line).message);
            let what = format!("line {n}: {line}\n  got {got:?}");
            match (kind, &got) {
                // No usable address (redacted by the reporter, or a pre-2010 driver's
                // `(BBBB:DD)`): no GPU to count it against, so dropped.
                ("xid", _) if pci.len() != "dddd:bb:dd".len() => {
                    assert_eq!(got, Parsed::Other, "{what}");
                }
                ("xid", Parsed::Xid(x)) => {
                    assert_eq!(x.pci.to_string(), pci, "{what}");
                    assert_eq!(x.code.to_string(), code, "{what}");
                    assert_eq!(x.pid.map_or("-".into(), |p| p.to_string()), pid, "{what}");
                    assert_eq!(x.process.unwrap_or("-"), name, "{what}");
                }
                ("uuid", Parsed::GpuUuid(p, u)) => {
                    assert_eq!(p.to_string(), pci, "{what}");
                    assert!(f[7].ends_with(u), "{what}");
                }
                ("bus", Parsed::BusLine(p)) => assert_eq!(p.to_string(), pci, "{what}"),
                ("sxid", Parsed::SXid(s)) => {
                    assert_eq!(s.switch, pci, "{what}");
                    assert_eq!(s.code.to_string(), code, "{what}");
                }
                ("sxid-companion", Parsed::SXidCompanion)
                | ("other" | "bus-multiline-start", Parsed::Other) => {}
                _ => panic!("expected {kind}: {what}"),
            }
            checked += 1;
        }
        assert_eq!(checked, lines.len(), "every line has its expectation");
    }

    /// The driver's text counts only at the start of a kernel message; in a file, only on a
    /// line with the kernel's syslog tag.
    #[test]
    fn only_the_kernel_speaks() {
        let xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.";
        let mut p = Parser::default();
        assert!(matches!(p.line(xid), Parsed::Xid(_)));
        // Kernel messages that quote user text.
        for quoted in [
            format!("tmpfs: Unknown parameter '{xid}'"),
            format!("audit: type=1400 msg='{xid}'"),
            format!(" {xid}"),
            "foo: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 48".to_string(),
        ] {
            assert_eq!(p.line(&quoted), Parsed::Other, "{quoted}");
        }
        let cases = [
            (
                format!("Dec  1 11:00:00 node kernel: {xid}"),
                Origin::Kernel,
            ),
            (
                format!("Dec  1 11:00:00 node kernel: [ 12.345678] {xid}"),
                Origin::Kernel,
            ),
            (
                format!("2026-12-01T11:00:00.123456+00:00 node kernel: {xid}"),
                Origin::Kernel,
            ),
            (
                format!("Dec 01 11:00:00.123456 node kernel: {xid}"),
                Origin::Kernel,
            ),
            (format!("Dec  1 11:00:00 kernel: {xid}"), Origin::Kernel),
            (
                format!("kern  :err   : 2026-12-01T11:00:00,123456+00:00 {xid}"),
                Origin::Kernel,
            ),
            // `logger` lines: another program's tag.
            (format!("Dec  1 11:00:00 node root: {xid}"), Origin::Program),
            (
                format!("Dec  1 11:00:00 node mallory[4242]: {xid}"),
                Origin::Program,
            ),
            (
                format!("2026-12-01T11:00:00+00:00 node kernelx: {xid}"),
                Origin::Program,
            ),
            (
                format!("user  :notice: 2026-12-01T11:00:00,1+00:00 {xid}"),
                Origin::Program,
            ),
            // dmesg output and bare messages: nobody's tag.
            (format!("[ 12.345678] {xid}"), Origin::Untagged),
            (
                format!("[Tue Dec  1 11:00:00 2026] {xid}"),
                Origin::Untagged,
            ),
            (xid.to_string(), Origin::Untagged),
        ];
        for (line, origin) in &cases {
            let l = file_line(line);
            assert_eq!(l.origin, *origin, "{line}");
            assert_eq!(l.message, xid, "{line}");
        }
        // A kernel line whose message quotes a forged one.
        let quoted = format!("Dec  1 11:00:00 node kernel: tmpfs: Unknown parameter '{xid}'");
        let l = file_line(&quoted);
        assert_eq!(l.origin, Origin::Kernel);
        assert_eq!(p.line(l.message), Parsed::Other);
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

    /// No input makes the parser panic (every prefix of a long mixed line, and random byte
    /// soup; the `kmsg_line` and `kmsg_record` fuzz targets go much further). Time is not
    /// measured here: the regexes are linear-time by construction.
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

//! The parser, line by line: every format the driver and the kernel write, and what must not count.

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
        Parsed::Signature(m) => {
            format!("signature {}", crate::model::signatures::CATALOG[m.sig].id)
        }
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
    // The lines that are signatures beyond XID (tests/kmsg/realworld-signatures.tsv).
    let sigs: std::collections::BTreeMap<usize, String> = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/kmsg/realworld-signatures.tsv"
    ))
    .expect("tests/kmsg/realworld-signatures.tsv")
    .lines()
    .filter(|r| !r.starts_with('#'))
    .filter_map(|r| {
        let (n, id) = r.split_once('\t')?;
        Some((n.parse().ok()?, id.to_string()))
    })
    .collect();
    let mut checked = 0;
    let mut signatures = 0;
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
            ("other", Parsed::Signature(m)) => {
                let id = crate::model::signatures::CATALOG[m.sig].id;
                assert_eq!(sigs.get(&n).map(String::as_str), Some(id), "{what}");
                signatures += 1;
            }
            ("other", Parsed::Other) => {
                assert_eq!(sigs.get(&n), None, "a signature expected: {what}");
            }
            ("sxid-companion", Parsed::SXidCompanion) | ("bus-multiline-start", Parsed::Other) => {}
            _ => panic!("expected {kind}: {what}"),
        }
        checked += 1;
    }
    assert_eq!(checked, lines.len(), "every line has its expectation");
    assert_eq!(
        signatures,
        sigs.len(),
        "every listed signature line matched"
    );
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
        // However long its tag or host: a program's still (`logger -t` takes any tag).
        (
            format!("Dec  1 11:00:00 node {}: {xid}", "m".repeat(300)),
            Origin::Program,
        ),
        (
            format!("Dec  1 11:00:00 {} root: {xid}", "h".repeat(300)),
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

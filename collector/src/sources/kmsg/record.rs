//! `/dev/kmsg` records (pure, no I/O): `prio,seq,usec,flags[,…];message` then continuation
//! lines starting with a space (`SUBSYSTEM=`, `DEVICE=`). Non-printable bytes and `\` arrive
//! escaped as `\xNN` (Documentation/ABI/testing/dev-kmsg; `msg_add_ext_text` in
//! kernel/printk/printk.c), so a multi-line printk is one record with `\x0a` in it.

use std::borrow::Cow;

/// One record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// Syslog facility (0 = kernel, 1 = user, …).
    pub facility: u8,
    /// Log level (0 emergency … 7 debug).
    pub level: u8,
    /// Sequence number (per boot, consecutive).
    pub seq: u64,
    /// Microseconds since boot (monotonic).
    pub usec: u64,
    /// A continuation fragment (`c` flag).
    pub cont: bool,
    /// The message, unescaped.
    pub message: Cow<'a, str>,
    /// The `DEVICE=` continuation value, if any (`+pci:0000:3b:00.0`).
    pub device: Option<&'a str>,
}

/// Parses one record as `read()` returns it. `None` for something that is not a record.
pub fn parse(buf: &[u8]) -> Option<Record<'_>> {
    let text = std::str::from_utf8(buf).ok()?;
    let (header, rest) = text.split_once(';')?;
    let mut fields = header.split(',');
    let prio: u32 = fields.next()?.trim().parse().ok()?;
    let seq: u64 = fields.next()?.parse().ok()?;
    let usec: u64 = fields.next()?.parse().ok()?;
    // Further comma-separated fields (e.g. `caller=T123`) are ignored, as the ABI asks.
    let cont = fields.next().is_some_and(|f| f.starts_with('c'));
    let (message, continuation) = match rest.split_once('\n') {
        Some((m, c)) => (m, c),
        None => (rest, ""),
    };
    let device = continuation
        .lines()
        .filter_map(|l| l.strip_prefix(' '))
        .find_map(|l| l.strip_prefix("DEVICE="));
    Some(Record {
        facility: (prio >> 3) as u8,
        level: (prio & 7) as u8,
        seq,
        usec,
        cont,
        message: unescape(message),
        device,
    })
}

/// Undoes the kernel's `\xNN` escaping.
pub fn unescape(s: &str) -> Cow<'_, str> {
    if !s.contains("\\x") {
        return Cow::Borrowed(s);
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && b.get(i + 1) == Some(&b'x')
            && let Some(hex) = s.get(i + 2..i + 4)
            && let Ok(v) = u8::from_str_radix(hex, 16)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_with_continuation_lines_and_escapes() {
        let r = parse(b"6,3964,206764307,-;nvidia-nvswitch2: open (major=510)\n").expect("record");
        assert_eq!(
            (r.facility, r.level, r.seq, r.usec),
            (0, 6, 3964, 206764307)
        );
        assert_eq!(r.message, "nvidia-nvswitch2: open (major=510)");
        let r = parse(
            b"7,160,424069,-,caller=T1;pci_root PNP0A03:00: host bridge window\n SUBSYSTEM=acpi\n DEVICE=+acpi:PNP0A03:00\n",
        )
        .expect("record");
        assert_eq!(r.device, Some("+acpi:PNP0A03:00"));
        assert_eq!(r.message, "pci_root PNP0A03:00: host bridge window");
        let r = parse(b"12,7,1,c;user wrote \\x5c and a\\x0anewline\n").expect("record");
        assert_eq!((r.facility, r.level, r.cont), (1, 4, true));
        assert_eq!(r.message, "user wrote \\ and a\nnewline");
        assert!(parse(b"no header here").is_none());
        assert!(parse(b"x,1,2,-;bad prio").is_none());
        assert_eq!(unescape("trailing \\x4"), "trailing \\x4");
    }
}

//! Writing records to the real kernel log.

use std::io::Write;

/// Whether this process may write `/dev/kmsg` (root, and the device writable).
pub fn writable() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .is_ok()
}

/// Writes records to `/dev/kmsg`, reopening every 8 records: the kernel rate-limits writers
/// to 10 records per open file (printk_devkmsg=ratelimit). Each ends with a newline: a record
/// without one stays open for continuation and is not readable until the next one arrives.
pub fn try_write(lines: &[String]) -> std::io::Result<()> {
    for chunk in lines.chunks(8) {
        let mut f = std::fs::OpenOptions::new().write(true).open("/dev/kmsg")?;
        for l in chunk {
            f.write_all(format!("{l}\n").as_bytes())?;
        }
    }
    Ok(())
}

/// [`try_write`], panicking on failure.
pub fn write(lines: &[String]) {
    try_write(lines).expect("write records to /dev/kmsg");
}

/// Makes the kernel itself write a record quoting `text`: tmpfs names the mount option it does
/// not know (`mount(2)` by root here; a user namespace lets anyone do the same), and the mount
/// fails. Returns the record's message.
pub fn kernel_quotes(text: &str) -> String {
    let dir = crate::temp_dir().join("mnt");
    std::fs::create_dir_all(&dir).expect("mount point");
    let out = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", text, "none"])
        .arg(&dir)
        .output()
        .expect("mount");
    assert!(!out.status.success(), "the option is unknown to tmpfs");
    format!("tmpfs: Unknown parameter '{text}'")
}

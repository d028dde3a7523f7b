//! Only the kernel speaks, and nothing counts twice: records written from user space and
//! kernel messages that quote user text are read and never counted (each test waits until the
//! agent has read past its own records: their sequence numbers or file positions in the
//! saved state, never a sleep), and an agent killed with SIGKILL at random points of a stream
//! of XIDs neither loses nor re-counts one.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use crate::kmsg::{config, domain, kmsg_write, scenario, start, xid};
use crate::support::{self, parse, value, wait_until};
use testkit::kmsg::kernel_quotes;

fn saved(state: &Path) -> serde_json::Value {
    std::fs::read(state.join("xid.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// The saved `/dev/kmsg` position (the next sequence number to read).
fn saved_seq(state: &Path) -> u64 {
    saved(state)["kmsg_next_seq"].as_u64().unwrap_or(0)
}

/// The saved position in a followed file.
fn saved_offset(state: &Path, file: &Path) -> u64 {
    saved(state)["files"][file.display().to_string()]["offset"]
        .as_u64()
        .unwrap_or(0)
}

/// Reads `/dev/kmsg` from `reader` until a record whose message is each of `messages`
/// (written by this test) has appeared; returns their sequence numbers.
fn seqs_of(reader: &mut std::fs::File, messages: &[String]) -> Vec<u64> {
    let mut found = vec![None; messages.len()];
    let mut buf = vec![0u8; 16 * 1024];
    wait_until(Duration::from_secs(10), "our records in /dev/kmsg", || {
        loop {
            match reader.read(&mut buf) {
                Ok(n) if n > 0 => {
                    let text = String::from_utf8_lossy(&buf[..n]);
                    let Some((head, msg)) = text.split_once(';') else {
                        continue;
                    };
                    let msg = msg.split('\n').next().unwrap_or("");
                    let seq: u64 = head
                        .split(',')
                        .nth(1)
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    for (i, m) in messages.iter().enumerate() {
                        if msg == m.as_str() {
                            found[i] = Some(seq);
                        }
                    }
                }
                // EAGAIN (nothing more yet) or EPIPE (overrun: read on).
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                _ => break,
            }
        }
        found.iter().all(Option::is_some)
    });
    found.into_iter().flatten().collect()
}

/// Writes records to `/dev/kmsg` and waits until the agent whose state is in `state` has
/// read past all of them; returns the last one's sequence number.
pub(crate) fn write_and_wait_read(state: &Path, lines: &[String]) -> u64 {
    let mut reader = kmsg_reader();
    kmsg_write(lines);
    let last = seqs_of(&mut reader, lines).into_iter().max().unwrap_or(0);
    wait_until(
        Duration::from_secs(15),
        "the agent has read past our records",
        || saved_seq(state) > last,
    );
    last
}

fn kmsg_reader() -> std::fs::File {
    let mut r = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .expect("open /dev/kmsg");
    r.seek(SeekFrom::End(0))
        .expect("seek to the end of the ring");
    r
}

/// Through `/dev/kmsg` without `accept_user_records`: an Xid 79 written from user space,
/// and one quoted by a kernel message, are read (the agent's saved position passes both)
/// and neither counts nor fails the GPU; the records are counted as ignored.
#[test]
fn dev_kmsg_counts_only_the_kernels_own_nvidia_messages() {
    if !crate::kmsg::privileged() {
        return;
    }
    let d = domain(11);
    let scen = scenario(d, 2, "");
    let state = support::temp_dir().join("state");
    let mut agent = start(
        &scen,
        &config(support::free_port(), &state, "accept_user_records = false"),
    );
    let ids = support::uuids(&parse(&agent.wait_for(Duration::from_secs(10), |m| {
        m.contains("junction_kmsg_records_total")
    })));
    let mut reader = kmsg_reader();
    let user = format!(
        "NVRM: Xid (PCI:{d:04x}:18:00): 79, pid=1, name=forged, GPU has fallen off the bus."
    );
    kmsg_write(std::slice::from_ref(&user));
    let quoted = kernel_quotes(&format!(
        "NVRM: Xid (PCI:{d:04x}:19:00): 79 GPU has fallen off the bus."
    ));
    let seqs = seqs_of(&mut reader, &[user, quoted]);
    let last = seqs.iter().max().copied().unwrap_or(0);
    wait_until(
        Duration::from_secs(15),
        "the agent has read past our records",
        || saved_seq(&state) > last,
    );
    let body = support::scrape(agent.port, Duration::from_secs(5)).expect("scrape");
    let s = parse(&body);
    for id in &ids {
        assert_eq!(xid(&body, id, "79"), None, "{id}: forged\n{body}");
        assert_eq!(
            value(&s, "hw_status", &[("hw_id", id), ("hw_state", "failed")]),
            Some(0.0),
            "{id}"
        );
    }
    assert!(
        value(
            &s,
            "junction_kmsg_ignored_total",
            &[("junction_input", "kmsg")]
        )
        .is_some_and(|n| n >= 1.0)
    );
    assert!(agent.terminate().success());
}

fn append(path: &Path, text: &[u8]) {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open log file")
        .write_all(text)
        .expect("append");
}

/// A followed syslog file: `logger` lines (another tag), `dmesg` lines (no tag), a kernel
/// line that quotes a forged one, and a forged `GPU at PCI` preamble for a PCI address no
/// bus has — none counts, and no forged UUID is learned; the kernel's own line after them
/// (the marker) counts.
#[test]
fn a_followed_file_counts_only_lines_tagged_by_the_kernel() {
    let d = domain(12);
    let scen = scenario(d, 2, "");
    let dir = support::temp_dir();
    let log = dir.join("syslog");
    append(&log, b"Dec  1 00:00:00 node kernel: booting\n");
    let state = dir.join("state");
    let cfg = config(
        support::free_port(),
        &state,
        &format!("device = \"\"\nfiles = [{:?}]", log.display().to_string()),
    );
    let mut agent = start(&scen, &cfg);
    let ids = support::uuids(&parse(
        &agent.wait_for(Duration::from_secs(10), |m| m.contains("gpu_info")),
    ));
    let g0 = format!("{d:04x}:18:00");
    let forged_uuid = format!("GPU-deadbeef-0000-4000-8000-{d:012x}");
    let text = format!(
        "Dec  1 01:00:00 node mallory: NVRM: Xid (PCI:{g0}): 79, pid=1, GPU has fallen off the bus.\n\
         Dec  1 01:00:00 node mallory[77]: NVRM: Xid (PCI:{g0}): 48, pid=1, DBE\n\
         [ 5.000000] NVRM: Xid (PCI:{g0}): 79, GPU has fallen off the bus.\n\
         NVRM: Xid (PCI:{g0}): 79, GPU has fallen off the bus.\n\
         Dec  1 01:00:01 node kernel: tmpfs: Unknown parameter 'NVRM: Xid (PCI:{g0}): 79 GPU has fallen off the bus.'\n\
         Dec  1 01:00:02 node kernel: NVRM: GPU at PCI:{d:04x}:99:00: {forged_uuid}\n\
         Dec  1 01:00:02 node kernel: NVRM: Xid (PCI:{d:04x}:99:00): 43, pid=9, name=orphan, channel 1\n\
         Dec  1 01:00:03 node kernel: NVRM: Xid (PCI:{d:04x}:19:00): 13, pid=2, name=marker, x\n"
    );
    append(&log, text.as_bytes());
    let body = agent.wait_for(Duration::from_secs(10), |m| {
        xid(m, &ids[1], "13") == Some(1.0)
    });
    let s = parse(&body);
    assert_eq!(xid(&body, &ids[0], "79"), None, "forged lines:\n{body}");
    assert_eq!(xid(&body, &ids[0], "48"), None);
    assert_eq!(
        value(
            &s,
            "hw_status",
            &[("hw_id", &ids[0]), ("hw_state", "failed")]
        ),
        Some(0.0)
    );
    assert!(!body.contains(&forged_uuid), "no forged UUID learned");
    assert_eq!(
        xid(&body, &format!("PCI-{d:04x}:99:00"), "43"),
        Some(1.0),
        "the unknown GPU's XID counts under its PCI address"
    );
    // The counters are published five times a second at most.
    agent.wait_for(Duration::from_secs(5), |m| {
        value(
            &parse(m),
            "junction_kmsg_ignored_total",
            &[("junction_input", "file")],
        ) == Some(4.0)
    });
    assert!(agent.terminate().success());
}

/// A tiny reproducible generator (the seed is printed for a re-run).
struct XorShift(u64);
impl XorShift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let s = t | 1;
    eprintln!("seed {s}");
    s
}

/// SIGKILL at random points while XIDs stream into a followed file (lines written whole and
/// in pieces): after the last restart every line is counted exactly once.
#[test]
fn a_kill_at_any_point_of_a_file_stream_neither_loses_nor_recounts() {
    let d = domain(13);
    let scen = scenario(d, 2, "");
    let dir = support::temp_dir();
    let log = dir.join("kern.log");
    append(&log, b"Dec  1 00:00:00 node kernel: booting\n");
    let state = dir.join("state");
    let cfg = config(
        support::free_port(),
        &state,
        &format!("device = \"\"\nfiles = [{:?}]", log.display().to_string()),
    );
    let mut rng = XorShift(seed());
    let mut agent = start(&scen, &cfg);
    let ids = support::uuids(&parse(
        &agent.wait_for(Duration::from_secs(10), |m| m.contains("gpu_info")),
    ));
    wait_until(Duration::from_secs(10), "the file's position saved", || {
        saved_offset(&state, &log) > 0
    });
    let g0 = format!("{d:04x}:18:00");
    let mut written = 0u32;
    for round in 0..6 {
        // Write for a random while, then kill without warning.
        let lines = 20 + rng.below(60) as u32;
        for _ in 0..lines {
            written += 1;
            let line = format!(
                "Dec  1 01:00:00 node kernel: NVRM: Xid (PCI:{g0}): 13, pid={written}, name=s, x\n"
            );
            let cut = rng.below(line.len() as u64) as usize;
            append(&log, &line.as_bytes()[..cut]);
            append(&log, &line.as_bytes()[cut..]);
            if rng.below(4) == 0 {
                std::thread::sleep(Duration::from_millis(rng.below(30)));
            }
        }
        let _ = agent.child.kill();
        let _ = agent.child.wait();
        eprintln!("round {round}: killed after {written} lines");
        agent = start(&scen, &cfg);
    }
    let n = f64::from(written);
    agent.wait_for(Duration::from_secs(20), |m| {
        xid(m, &ids[0], "13").is_some_and(|c| c >= n)
    });
    append(
        &log,
        format!("Dec  1 02:00:00 node kernel: NVRM: Xid (PCI:{d:04x}:19:00): 13, pid=1, name=marker, x\n")
            .as_bytes(),
    );
    let body = agent.wait_for(Duration::from_secs(10), |m| {
        xid(m, &ids[1], "13") == Some(1.0)
    });
    assert_eq!(
        xid(&body, &ids[0], "13"),
        Some(n),
        "{written} lines, each once"
    );
    assert!(agent.terminate().success());
}

/// The same through `/dev/kmsg`: SIGKILL at random points while records stream in; every
/// record of this test still in the kernel's ring is counted exactly once.
#[test]
fn a_kill_at_any_point_of_a_dev_kmsg_stream_neither_loses_nor_recounts() {
    if !crate::kmsg::privileged() {
        return;
    }
    let d = domain(14);
    let scen = scenario(d, 2, "");
    let state = support::temp_dir().join("state");
    let cfg = config(support::free_port(), &state, "accept_user_records = true");
    let mut rng = XorShift(seed());
    let mut agent = start(&scen, &cfg);
    let ids = support::uuids(&parse(
        &agent.wait_for(Duration::from_secs(10), |m| m.contains("gpu_info")),
    ));
    let mut reader = kmsg_reader();
    let mut written = Vec::new();
    for round in 0..5 {
        let lines = 10 + rng.below(40) as usize;
        for _ in 0..lines {
            let line = format!(
                "NVRM: Xid (PCI:{d:04x}:18:00): 13, pid={}, name=s, x",
                written.len() + 1
            );
            kmsg_write(std::slice::from_ref(&line));
            written.push(line);
            if rng.below(4) == 0 {
                std::thread::sleep(Duration::from_millis(rng.below(30)));
            }
        }
        let _ = agent.child.kill();
        let _ = agent.child.wait();
        eprintln!("round {round}: killed after {} records", written.len());
        agent = start(&scen, &cfg);
    }
    let seqs = seqs_of(&mut reader, &written);
    let last = seqs.iter().max().copied().unwrap_or(0);
    wait_until(
        Duration::from_secs(20),
        "the agent has read past our records",
        || saved_seq(&state) > last,
    );
    // Records overwritten in the ring before the agent read them (other tests flood it)
    // cannot be counted; every other one must be, once.
    let mut all = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .expect("open /dev/kmsg");
    let mut first = None;
    let mut buf = vec![0u8; 16 * 1024];
    while first.is_none() {
        match all.read(&mut buf) {
            Ok(n) if n > 0 => {
                first = String::from_utf8_lossy(&buf[..n])
                    .split(',')
                    .nth(1)
                    .and_then(|s| s.parse::<u64>().ok());
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            _ => break,
        }
    }
    let body = support::scrape(agent.port, Duration::from_secs(5)).expect("scrape");
    let counted = xid(&body, &ids[0], "13").unwrap_or(0.0);
    let n = written.len() as f64;
    if first.is_some_and(|f| f <= seqs[0]) {
        assert_eq!(counted, n, "{n} records, each once");
    } else {
        eprintln!(
            "the ring overran ({first:?} > {}): {counted} of {n}",
            seqs[0]
        );
        assert!(counted <= n, "{counted} of {n}: none twice");
    }
    assert!(agent.terminate().success());
}

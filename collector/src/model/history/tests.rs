use super::*;

#[test]
fn entries_share_their_strings_and_memory_counts_them_once() {
    let dir = testkit::temp_dir();
    let h = History::new(64 * 1024, Duration::from_secs(86400));
    h.open(Some(&dir));
    assert_eq!(h.memory(), 0);
    let detail = "fell off the bus";
    h.append(Entry::now("boot", "GPU-1", "xid", "79", detail));
    let one = h.memory();
    let least = std::mem::size_of::<Entry>() + detail.len() + "bootGPU-1xid79".len();
    assert!(one >= least as u64, "{one}");
    for _ in 0..99 {
        h.append(Entry::now("boot", "GPU-1", "xid", "79", detail));
    }
    // Each further entry: its place in the list (which doubles) and its detail, no
    // copy of the boot, the GPU, the kind or the code.
    let each = (std::mem::size_of::<Entry>() + detail.len()) as u64;
    let hundred = h.memory();
    assert!(
        (99 * each + one..2 * 100 * each + one).contains(&hundred),
        "{hundred} for 100 entries of {each} and one of {one}"
    );
    let same = |e: &[Entry]| {
        let (a, b) = (&e[0], &e[e.len() - 1]);
        [
            (&a.boot, &b.boot),
            (&a.id, &b.id),
            (&a.kind, &b.kind),
            (&a.code, &b.code),
        ]
        .iter()
        .all(|(x, y)| Arc::ptr_eq(&x.0, &y.0))
    };
    assert!(same(&h.entries()), "one copy of each string");
    // Read back from the file: shared the same way.
    let again = History::new(64 * 1024, Duration::from_secs(86400));
    again.open(Some(&dir));
    assert_eq!(again.entries().len(), 100);
    assert!(same(&again.entries()), "one copy of each string, read back");
    assert_eq!(again.memory(), hundred, "as much memory, read back");
}

#[test]
fn a_string_no_entry_holds_is_forgotten() {
    let h = History::new(4096, Duration::from_secs(86400));
    h.append(Entry::now("boot-a", "GPU-1", "xid", "79", "before"));
    let kept = |h: &History, s: &str| lock(&h.inner).strings.0.contains(s);
    assert!(kept(&h, "boot-a"));
    // Past the bound the oldest half goes, and with it the first boot's only entry.
    for n in 0..200u32 {
        h.append(Entry::now("boot-b", "GPU-1", "xid", n.to_string(), "after"));
    }
    assert!(h.entries().iter().all(|e| e.boot == "boot-b"));
    assert!(
        !kept(&h, "boot-a"),
        "the first boot's id is gone with its entry"
    );
    assert!(!kept(&h, "0"), "and the codes of dropped entries");
    assert!(kept(&h, "boot-b") && kept(&h, "199"));
}

#[test]
fn entries_are_shared_until_the_next_change() {
    let h = History::new(64 * 1024, Duration::from_secs(86400));
    h.append(Entry::now("b", "GPU-1", "xid", "79", "fell off the bus"));
    let a = h.entries();
    assert!(Arc::ptr_eq(&a, &h.entries()), "no copy per read");
    h.append(Entry::now("b", "GPU-1", "xid", "48", "DBE"));
    let b = h.entries();
    assert_eq!(
        b.iter().map(|e| e.code.as_str()).collect::<Vec<_>>(),
        ["79", "48"]
    );
    assert_eq!(a.len(), 1, "what was handed out stays as it was");
    drop((a, b));
    let held = Arc::as_ptr(&h.entries());
    h.append(Entry::now("b", "GPU-1", "xid", "31", "MMU"));
    let c = h.entries();
    assert_eq!(
        Arc::as_ptr(&c),
        held,
        "changed in place, not copied, while no reader holds it"
    );
    assert_eq!(c.len(), 3);
    assert_eq!(
        Arc::strong_count(&c),
        2,
        "one copy in memory: the history's, shared with the one reader"
    );
}

/// `n` lines as the history writes them, codes `first..first + n`, now.
fn lines(first: u32, n: u32) -> String {
    (first..first + n)
        .map(|c| {
            let e = Entry::now("boot-a", "GPU-1", "xid", c.to_string(), "an XID");
            format!("{}\n", serde_json::to_string(&e).expect("json"))
        })
        .collect()
}

#[test]
fn a_file_past_the_bound_is_read_from_its_tail_and_keeps_the_newest() {
    let dir = testkit::temp_dir();
    // Five times the bound, as a history written with a larger one leaves it.
    let max = 16 * 1024u64;
    let text = lines(0, 1000);
    assert!(text.len() as u64 > 5 * max, "{}", text.len());
    std::fs::write(dir.join(FILE), &text).expect("write");
    let h = History::new(max, Duration::from_secs(86400));
    h.open(Some(&dir));
    let codes: Vec<u32> = h
        .entries()
        .iter()
        .map(|e| e.code.parse().expect("a code"))
        .collect();
    assert_eq!(codes.last(), Some(&999), "the newest kept");
    let first = codes[0];
    assert_eq!(
        codes,
        (first..1000).collect::<Vec<_>>(),
        "a run of the newest, none torn or skipped"
    );
    // As many as fit: every line kept but the one the cut fell in.
    let line = text.lines().last().expect("a line").len() as u64 + 1;
    let size = std::fs::metadata(dir.join(FILE)).expect("file").len();
    assert!(size <= max && size + 2 * line > max, "{size} of {max}");
    assert_eq!(read(&dir.join(FILE)), h.entries()[..], "rewritten as held");
    // A cut that falls right at a line's start keeps that line; one byte later, it is
    // torn and dropped.
    let path = dir.join(FILE);
    std::fs::write(&path, lines(0, 10)).expect("write");
    let tail = lines(5, 5).len() as u64;
    let codes = |max: u64| {
        let mut codes = Vec::new();
        read_tail(&path, max, &mut |e| codes.push(e.code.to_string()));
        codes
    };
    assert_eq!(codes(tail), ["5", "6", "7", "8", "9"]);
    assert_eq!(codes(tail - 1), ["6", "7", "8", "9"]);
    assert_eq!(
        codes(u64::MAX).len(),
        10,
        "a bound past the file reads it all"
    );
}

#[test]
fn an_overlong_line_is_skipped_and_the_next_kept() {
    let dir = testkit::temp_dir();
    let mut text = lines(0, 1);
    text.push_str(&"x".repeat(1 << 20));
    text.push('\n');
    // Valid JSON, but longer than any line the history writes: not ours, not kept (read
    // in pieces, its last piece alone would parse).
    text.push_str(&" ".repeat(MAX_LINE + 1));
    text.push_str(&lines(7, 1));
    text.push_str(&lines(1, 1));
    std::fs::write(dir.join(FILE), &text).expect("write");
    let h = History::new(4 << 20, Duration::from_secs(86400));
    h.open(Some(&dir));
    let codes: Vec<_> = h.entries().iter().map(|e| e.code.to_string()).collect();
    assert_eq!(codes, ["0", "1"]);
    assert_eq!(read(&dir.join(FILE)).len(), 2, "the file was mended");
}

#[test]
fn a_flood_stays_in_its_bounds_and_a_torn_line_loses_only_itself() {
    let dir = testkit::temp_dir();
    let h = History::new(64 * 1024, Duration::from_secs(86400));
    h.open(Some(&dir));
    for n in 0..100_000u32 {
        h.append(Entry::now(
            "boot-a",
            "GPU-1",
            "xid",
            n.to_string(),
            "an XID",
        ));
    }
    let size = std::fs::metadata(dir.join(FILE)).expect("file").len();
    assert!(size <= 64 * 1024, "{size} bytes");
    let on_disk = read(&dir.join(FILE));
    let mem = h.entries();
    assert_eq!(on_disk.len(), mem.len(), "memory and file hold as many");
    let differ = on_disk.iter().zip(mem.iter()).position(|(a, b)| a != b);
    assert_eq!(
        differ,
        None,
        "memory and file agree: {:?}",
        differ.map(|i| (&on_disk[i], &mem[i]))
    );
    assert_eq!(
        on_disk.last().map(|e| e.code.as_str()),
        Some("99999"),
        "the newest kept"
    );
    // A kill in the middle of a write: half a line at the end.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join(FILE))
        .expect("open");
    f.write_all(br#"{"ms":1000,"boot":"boot-a","id":"GPU-1","ki"#)
        .expect("torn");
    drop(f);
    let h2 = History::new(64 * 1024, Duration::from_secs(86400));
    h2.open(Some(&dir));
    assert!(
        h2.entries()[..] == on_disk[..],
        "everything but the torn line"
    );
    h2.append(Entry::now("boot-b", "GPU-1", "xid", "48", "after"));
    assert_eq!(
        read(&dir.join(FILE)).len(),
        on_disk.len() + 1,
        "the file was mended"
    );
    // Old entries age out.
    let h3 = History::new(64 * 1024, Duration::from_secs(1));
    let mut old = Entry::now("boot-0", "GPU-1", "xid", "48", "long ago");
    old.ms -= 10_000;
    h3.open(Some(&dir));
    h3.append(old);
    h3.open(Some(&dir));
    assert!(h3.entries().iter().all(|e| e.boot != "boot-0"));
}

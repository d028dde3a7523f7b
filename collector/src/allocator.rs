//! The allocators, set for a daemon that runs for months.
//!
//! Junction's own heap is jemalloc (the binary's `#[global_allocator]`). Under glibc's
//! allocator the soak's live heap stayed flat after the warm-up (heaptrack, BENCHMARKS.md
//! "Soak heap profile") while RSS kept rising, 0.7 to 1.7 MiB an hour: `/proc/PID/smaps`
//! put the growth in the arenas themselves (the main `[heap]` grew from 7.0 to 7.8 MiB in
//! five minutes with 100 processes alive and churned, at the same live heap), so the live
//! blocks spread over more and more pages as processes came and went. jemalloc keeps each
//! slab to one size class, so a freed block is reused by the next of its size, and a page
//! with nothing live in it goes back to the kernel after [`JEMALLOC_CONF`]'s decay.
//!
//! - [`JEMALLOC_CONF`]: two arenas (jemalloc's default is four per CPU, each holding its
//!   own partly used slabs; a GPU node has a hundred CPUs and more), small thread caches, and
//!   unused dirty pages returned after a second instead of ten. Each of Junction's threads
//!   keeps a cache of freed blocks of its own (the NVML source had one thread per GPU when
//!   this was measured; one thread collects every GPU now): with jemalloc's default
//!   caches (up to 200 blocks per size class, every class to 32 KiB) RSS was 5 to 6 MiB
//!   higher in the soak and 16 MiB higher on the 64-GPU node (71 threads); without any, each
//!   allocation and free took an arena lock, 14 % of the agent's instructions on the 8-GPU
//!   node (callgrind, a cycle and a scrape a second). The caches here hold at most 16 blocks
//!   of a class, and only classes to 1 KiB (the samples, their strings, the NVML buffers).
//!   With a thread per GPU the NVML threads also handed their caches back before they slept,
//!   so that 64 idle caches held no blocks between cycles: 82.2 M instructions over 20 s
//!   where no cache took 102.7 M (99.7 M with the default caches), and the 64-GPU node's
//!   peak RSS within the noise of none (31.5-33.2 MiB against 31.6-32.0, OTLP every
//!   second). One thread collects every GPU now, and its one cache is kept between cycles:
//!   the hand-back and the refills after it cost 30 K instructions a cycle on the 8-GPU
//!   node, for at most a few hundred KiB held.
//! - [`release`], once start-up is done and then every [`RELEASE_EVERY`]: every arena's
//!   unused pages are returned now (`arena.<all>.purge`), whichever thread freed them, then
//!   `malloc_trim(0)` does the same for glibc's arenas.
//! - glibc still serves the C code in the process (the NVML library's own allocations).
//!   [`tune`], at start: at most two arenas (by default glibc makes up to eight per core),
//!   and blocks of 128 KiB or more always mapped on their own. `MALLOC_ARENA_MAX` /
//!   `MALLOC_MMAP_THRESHOLD_` in the environment win, as `_RJEM_MALLOC_CONF` adds to
//!   jemalloc's options.

use std::time::Duration;

/// How often [`release`] runs.
pub const RELEASE_EVERY: Duration = Duration::from_secs(30);

/// jemalloc's options (the binary exports them as `malloc_conf`), NUL-terminated.
pub const JEMALLOC_CONF: &std::ffi::CStr = c"narenas:2,tcache:true,tcache_max:1024,tcache_nslots_small_min:4,tcache_nslots_small_max:16,tcache_nslots_large:2,dirty_decay_ms:1000";

/// A C string pointer as jemalloc reads `malloc_conf`: `const char *`.
#[repr(transparent)]
pub struct ConfPtr(pub *const std::ffi::c_char);

// SAFETY: it points at a `'static` constant that nothing writes.
unsafe impl Sync for ConfPtr {}

/// `MALLCTL_ARENAS_ALL`: the mallctl index of every arena.
const ARENAS_ALL: &[u8] = b"arena.4096.purge\0";

/// Sets glibc's arena count and mmap threshold (before any other thread starts).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn tune() {
    let set = |var: &str| std::env::var_os(var).is_some();
    // SAFETY: mallopt only changes allocator parameters; this runs before any other thread.
    unsafe {
        if !set("MALLOC_ARENA_MAX") {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
        if !set("MALLOC_MMAP_THRESHOLD_") {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() {}

/// Hands the unused pages of both allocators back to the kernel.
pub fn release() {
    // SAFETY: a NUL-terminated name; the purge takes no value and returns none.
    unsafe {
        tikv_jemalloc_sys::mallctl(
            ARENAS_ALL.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes each arena's lock itself; it frees nothing in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Reads a `size_t` statistic (a NUL-terminated name).
fn stat(name: &[u8]) -> Option<u64> {
    let mut v: libc::size_t = 0;
    let mut n = std::mem::size_of::<libc::size_t>();
    // SAFETY: a NUL-terminated name of a `size_t` statistic, read into a `size_t` of the
    // length given.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr().cast(),
            (&raw mut v).cast(),
            &raw mut n,
            std::ptr::null_mut(),
            0,
        )
    };
    (rc == 0).then_some(v as u64)
}

/// Junction's own heap as jemalloc counts it. The C code's allocations through glibc (the
/// NVML library's) are in none of these.
#[derive(Clone, Copy, Debug)]
pub struct Heap {
    /// Bytes in live allocations (`stats.allocated`).
    pub allocated: u64,
    /// Bytes of the pages that hold live allocations, the free slots of their slabs included
    /// (`stats.active`): what it has over `allocated` is fragmentation.
    pub active: u64,
    /// Bytes of jemalloc's own bookkeeping (`stats.metadata`), which it never hands back.
    pub metadata: u64,
    /// Bytes of the pages resident under the heap and the metadata (`stats.resident`),
    /// unused ones not yet handed back included.
    pub resident: u64,
}

/// [`Heap`] now; `None` if jemalloc was built without statistics.
pub fn heap() -> Option<Heap> {
    // The statistics are a copy jemalloc refreshes when `epoch` is written.
    let mut epoch: u64 = 1;
    // SAFETY: `epoch` takes a `uint64_t`; nothing is read back.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            c"epoch".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            (&raw mut epoch).cast(),
            std::mem::size_of::<u64>(),
        )
    };
    if rc != 0 {
        return None;
    }
    Some(Heap {
        allocated: stat(b"stats.allocated\0")?,
        active: stat(b"stats.active\0")?,
        metadata: stat(b"stats.metadata\0")?,
        resident: stat(b"stats.resident\0")?,
    })
}

/// Publishes [`heap`] as `junction.memory.heap.*` (after a release: the resident figure is
/// the heap with its unused pages handed back, what the next growth starts from), and the
/// event history's share of it as `junction.history.memory`.
fn publish_heap(model: &crate::model::Model) {
    use crate::model::{Metric, Sample};
    let mut samples = heap().map_or_else(Vec::new, |h| {
        vec![
            Sample::new(Metric::HeapAllocated, h.allocated as f64),
            Sample::new(Metric::HeapActive, h.active as f64),
            Sample::new(Metric::HeapMetadata, h.metadata as f64),
            Sample::new(Metric::HeapResident, h.resident as f64),
        ]
    });
    // The largest part of the heap that grows by design (up to its bound), beside it.
    samples.push(Sample::new(
        Metric::HistoryMemory,
        model.history.memory() as f64,
    ));
    model.publish("agent", "heap", samples);
}

/// Runs [`release`] now and then every [`RELEASE_EVERY`] until `stop`, and publishes the
/// heap's figures after each.
pub async fn release_periodically(
    model: std::sync::Arc<crate::model::Model>,
    stop: crate::shutdown::Shutdown,
) {
    // What start-up freed goes back now, not at the first period: what the sources' start
    // allocated and let go of (the kernel BTF that eBPF's loading parsed, tens of MiB, before
    // it was read a record at a time and kept from aya's loader) otherwise stays resident for
    // half a minute.
    release();
    publish_heap(&model);
    while stop
        .unless(tokio::time::sleep(RELEASE_EVERY))
        .await
        .is_some()
    {
        release();
        publish_heap(&model);
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::alloc::{GlobalAlloc as _, Layout};

    /// Resident bytes, from /proc/self/statm (nextest runs each test in a process of its own).
    fn resident() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
        let pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .expect("rss")
            .parse()
            .expect("pages");
        pages * 4096
    }

    const BLOCK: usize = 1024;
    const BLOCKS: usize = 16 * 1024;

    #[test]
    fn pages_another_thread_freed_go_back_to_the_kernel() {
        // As a source's thread does: 16 MiB of small blocks from jemalloc (the agent's
        // allocator; this test binary's global one is the system's), all freed but the
        // last, then the thread idles. jemalloc keeps the pages until their decay; the
        // release hands them back at once.
        let (done, idle) = std::sync::mpsc::channel::<()>();
        let (freed, wait) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let a = tikv_jemallocator::Jemalloc;
            let layout = Layout::from_size_align(BLOCK, 8).expect("layout");
            let mut blocks = Vec::with_capacity(BLOCKS);
            for i in 0..BLOCKS {
                // SAFETY: a non-zero layout; every block is written, then freed once.
                let p = unsafe { a.alloc(layout) };
                assert!(!p.is_null());
                unsafe { p.write_bytes(i as u8, BLOCK) };
                blocks.push(p as usize);
            }
            let last = blocks.pop().expect("blocks");
            for p in blocks {
                unsafe { a.dealloc(p as *mut u8, layout) };
            }
            freed.send(()).expect("main waits");
            let _ = idle.recv();
            unsafe { a.dealloc(last as *mut u8, layout) };
        });
        wait.recv().expect("the thread freed its blocks");
        let before = resident();
        super::release();
        let after = resident();
        drop(done);
        thread.join().expect("thread");
        assert!(
            before.saturating_sub(after) >= 8 << 20,
            "RSS {before} -> {after} bytes: the freed 16 MiB stayed resident"
        );
    }

    #[test]
    fn heap_counts_what_jemalloc_holds() {
        // Another 8 MiB in live jemalloc blocks shows in `stats.allocated` (this test binary's
        // global allocator is the system's: only these blocks and the runtime's go through
        // jemalloc), and the pages under them in `stats.resident`.
        let before = super::heap().expect("jemalloc built with statistics");
        let a = tikv_jemallocator::Jemalloc;
        let layout = Layout::from_size_align(BLOCK, 8).expect("layout");
        let blocks: Vec<usize> = (0..8 * 1024)
            .map(|i| {
                // SAFETY: a non-zero layout; every block is written, then freed once.
                let p = unsafe { a.alloc(layout) };
                assert!(!p.is_null());
                unsafe { p.write_bytes(i as u8, BLOCK) };
                p as usize
            })
            .collect();
        let grown = super::heap().expect("statistics");
        for p in blocks {
            unsafe { a.dealloc(p as *mut u8, layout) };
        }
        let after = super::heap().expect("statistics");
        assert!(
            grown.allocated >= before.allocated + (8 << 20),
            "allocated {before:?} -> {grown:?} after 8 MiB of blocks"
        );
        assert!(
            grown.active >= before.active + (8 << 20) && grown.active >= grown.allocated,
            "active {before:?} -> {grown:?}"
        );
        assert!(
            grown.resident >= before.resident + (7 << 20) && grown.resident >= grown.active,
            "resident {before:?} -> {grown:?}"
        );
        assert!(grown.metadata > 0, "no metadata in {grown:?}");
        assert!(
            after.allocated + (7 << 20) <= grown.allocated,
            "allocated {grown:?} -> {after:?} after freeing them"
        );
    }

    #[cfg(target_env = "gnu")]
    #[test]
    fn glibc_free_pages_between_live_blocks_go_back_to_the_kernel() {
        // The same through glibc (this test binary's global allocator, and the C code's in
        // the agent): it keeps the pages below a live block (the arena's top above them);
        // only a trim hands them back.
        let mut blocks: Vec<Box<[u8; BLOCK]>> =
            (0..BLOCKS).map(|_| Box::new([1u8; BLOCK])).collect();
        let last = blocks.pop();
        drop(blocks);
        let before = resident();
        super::release();
        let after = resident();
        assert!(
            before.saturating_sub(after) >= 8 << 20,
            "RSS {before} -> {after} bytes: the freed 16 MiB stayed resident"
        );
        drop(last);
    }
}

//! glibc's allocator, set for a daemon that runs for months.
//!
//! - [`tune`], at start: at most two arenas (by default glibc makes up to eight per core, one
//!   per thread that allocates at once, and each keeps its own free pages), and blocks of
//!   128 KiB or more always mapped on their own (by default the threshold rises to the
//!   largest block freed, after which the scrape's and the exports' large buffers are carved
//!   from the arenas and fragment them). On the soak's 8-GPU node RSS after the warm-up was
//!   4 to 8 MiB lower with both (`cargo xtask bench --soak`). `MALLOC_ARENA_MAX` /
//!   `MALLOC_MMAP_THRESHOLD_` in the environment win.
//! - [`release`], every [`RELEASE_EVERY`]: `malloc_trim(0)` hands the whole free pages inside
//!   the arenas back to the kernel. glibc returns only the top of an arena by itself, so the
//!   pages freed when processes end (their names, cgroups, series) otherwise stay resident
//!   between the arenas' live blocks, and RSS creeps up as processes come and go although the
//!   live heap does not.

use std::time::Duration;

/// How often [`release`] runs.
pub const RELEASE_EVERY: Duration = Duration::from_secs(30);

/// Sets the arena count and the mmap threshold (before any other thread starts).
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

/// Hands free pages back to the kernel; true when glibc released any.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release() -> bool {
    // SAFETY: malloc_trim takes each arena's lock itself; it frees nothing in use.
    unsafe { libc::malloc_trim(0) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() {}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release() -> bool {
    false
}

/// Runs [`release`] every [`RELEASE_EVERY`] until `stop`.
pub async fn release_periodically(stop: crate::shutdown::Shutdown) {
    while stop
        .unless(tokio::time::sleep(RELEASE_EVERY))
        .await
        .is_some()
    {
        release();
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
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

    #[test]
    fn free_pages_between_live_blocks_go_back_to_the_kernel() {
        // 16 MiB of small blocks, all freed but the last: glibc keeps their pages (the live
        // block holds the arena's top above them); only a trim hands them back.
        let mut blocks: Vec<Box<[u8; 1024]>> =
            (0..16 * 1024).map(|_| Box::new([1u8; 1024])).collect();
        let last = blocks.pop();
        drop(blocks);
        let before = resident();
        assert!(super::release(), "malloc_trim released nothing");
        let after = resident();
        assert!(
            before.saturating_sub(after) >= 8 << 20,
            "RSS {before} -> {after} bytes: the freed 16 MiB stayed resident"
        );
        drop(last);
    }
}

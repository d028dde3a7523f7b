//! The de-duplication window: the same XID on the same GPU reported by two paths within
//! [`DEDUP_WINDOW`] is one occurrence; one path reporting it twice saw two. Pure: the caller
//! passes the time.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::Via;

/// Reports of one XID on one GPU from two paths within this window are one occurrence.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(10);

/// One occurrence and the paths that have reported it (a bit per path and line kind).
#[derive(Debug)]
struct Recent {
    id: String,
    code: u32,
    seen: u8,
    at: Instant,
}

/// The occurrences of the last [`DEDUP_WINDOW`].
#[derive(Debug, Default)]
pub struct Window {
    recent: VecDeque<Recent>,
}

/// The bit of a path (and, for the kernel log, of the Xid 79 line or the bus line).
pub fn channel(via: Via, bus_line: bool) -> u8 {
    let path = match via {
        Via::Kmsg => 0,
        Via::File => 1,
        Via::Nvml => 2,
        Via::Crash => 3,
    };
    1 << (path * 2 + u8::from(bus_line))
}

impl Window {
    /// Another path's report (`bit`, from [`channel`]) of an occurrence already counted within
    /// the window: true, and the path is noted. Otherwise a new occurrence: false.
    pub fn duplicate(&mut self, id: &str, code: u32, bit: u8, now: Instant) -> bool {
        while self
            .recent
            .front()
            .is_some_and(|e| now.saturating_duration_since(e.at) > DEDUP_WINDOW)
        {
            self.recent.pop_front();
        }
        if let Some(e) = self
            .recent
            .iter_mut()
            .find(|e| e.id == id && e.code == code && e.seen & bit == 0)
        {
            e.seen |= bit;
            return true;
        }
        self.recent.push_back(Recent {
            id: id.to_string(),
            code,
            seen: bit,
            at: now,
        });
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_occurrence_per_path_within_the_window() {
        let t0 = Instant::now();
        let mut w = Window::default();
        let (k, n) = (channel(Via::Kmsg, false), channel(Via::Nvml, false));
        assert!(!w.duplicate("GPU-a", 13, k, t0));
        assert!(w.duplicate("GPU-a", 13, n, t0 + Duration::from_secs(9)));
        assert!(!w.duplicate("GPU-a", 13, k, t0), "the same path: a second");
        assert!(!w.duplicate("GPU-b", 13, n, t0), "another GPU");
        assert!(!w.duplicate("GPU-a", 31, n, t0), "another code");
        // Past the window: a new occurrence.
        let later = t0 + DEDUP_WINDOW + Duration::from_secs(1);
        assert!(!w.duplicate("GPU-a", 13, n, later));
        assert_eq!(w.recent.len(), 1, "what is older than the window is gone");
        // The bus line after an Xid 79 line on the same path is another channel.
        assert_ne!(channel(Via::Kmsg, true), k);
    }
}

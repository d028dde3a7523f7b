//! A counter's readings over a long window, kept thinned: every reading of the last few
//! minutes, one a minute before that.
//!
//! The rules that look back an hour or two (NIC error counters per hour, corrected ECC errors
//! per hour against the hour before) need the total an hour ago, not every reading since.
//! Kept whole, such a window filled for its whole length after a start (an hour of reads a
//! counter, two hours of health evaluations a GPU) and held a reading per poll: memory that
//! rose for the first hours of every agent and grew with the poll rate. Thinned, it holds at
//! most `fine / interval + span / step + 2` readings however long the agent runs, and never
//! more than `MAX_FINE + span / step + 1` whatever the rate.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How a window is kept.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Readings older than this are dropped.
    pub span: Duration,
    /// Every reading of this last stretch is kept (rates per second and per minute).
    pub fine: Duration,
    /// Before that, one reading per this step: the first of each.
    pub step: Duration,
}

/// The most readings the fine stretch keeps, whatever the poll rate.
const MAX_FINE: usize = 1024;

/// Readings `(when, total)`, oldest first.
#[derive(Debug, Clone)]
pub struct Readings<T> {
    /// One per `step`, older than `fine`.
    coarse: VecDeque<(Instant, T)>,
    /// Every reading of the last `fine`.
    fine: VecDeque<(Instant, T)>,
}

impl<T> Default for Readings<T> {
    fn default() -> Self {
        Self {
            coarse: VecDeque::new(),
            fine: VecDeque::new(),
        }
    }
}

impl<T: Copy> Readings<T> {
    /// Adds the total read at `at` (readings come in time order).
    pub fn push(&mut self, at: Instant, total: T, shape: &Shape) {
        self.fine.push_back((at, total));
        while let Some(&(t, v)) = self.fine.front() {
            if at.saturating_duration_since(t) <= shape.fine && self.fine.len() <= MAX_FINE {
                break;
            }
            self.fine.pop_front();
            if self
                .coarse
                .back()
                .is_none_or(|(c, _)| t.saturating_duration_since(*c) >= shape.step)
            {
                self.coarse.push_back((t, v));
            }
        }
        while self
            .coarse
            .front()
            .is_some_and(|(t, _)| at.saturating_duration_since(*t) > shape.span)
        {
            self.coarse.pop_front();
        }
    }

    /// Every reading kept, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &(Instant, T)> {
        self.coarse.iter().chain(self.fine.iter())
    }

    /// The oldest reading kept.
    pub fn first(&self) -> Option<&(Instant, T)> {
        self.coarse.front().or(self.fine.front())
    }

    /// The newest reading.
    pub fn last(&self) -> Option<&(Instant, T)> {
        self.fine.back()
    }

    /// The oldest reading at most `age` before the newest.
    pub fn since(&self, age: Duration) -> Option<&(Instant, T)> {
        let &(now, _) = self.last()?;
        self.iter()
            .find(|(t, _)| now.saturating_duration_since(*t) <= age)
    }

    /// How many readings are kept.
    pub fn len(&self) -> usize {
        self.coarse.len() + self.fine.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.fine.is_empty() && self.coarse.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Shape = Shape {
        span: Duration::from_secs(3600),
        fine: Duration::from_secs(120),
        step: Duration::from_secs(60),
    };

    #[test]
    fn three_hours_of_reads_every_second_keep_at_most_the_bound() {
        // A counter rising by one a second, read every second for three hours.
        let t0 = Instant::now();
        let mut r = Readings::default();
        let mut most = 0;
        for s in 0..3 * 3600u64 {
            r.push(t0 + Duration::from_secs(s), s, &HOUR);
            most = most.max(r.len());
        }
        // 121 fine (0..=120 s old) and one a minute over the rest of the hour. Kept whole,
        // it was 3600.
        assert!(most <= 121 + 60 + 1, "{most} readings kept");
        assert!(most >= 121 + 57, "{most}: the hour is still covered");
        let now = 3 * 3600 - 1;
        // Every reading of the last two minutes, so rates per second and per minute are exact.
        assert_eq!(r.last().map(|x| x.1), Some(now));
        assert_eq!(r.iter().rev().nth(1).map(|x| x.1), Some(now - 1));
        assert_eq!(
            r.since(Duration::from_secs(60)).map(|x| x.1),
            Some(now - 60)
        );
        // The hour's first reading is within a step of an hour ago, never older.
        let hour_ago = r
            .since(Duration::from_secs(3600))
            .map(|x| x.1)
            .expect("a reading within the hour");
        assert!(
            (now - 3600..=now - 3600 + 60).contains(&hour_ago),
            "{hour_ago}"
        );
        assert!(r.first().is_some_and(|x| x.1 >= now - 3600));
        // Oldest first, no reading twice.
        let times: Vec<Instant> = r.iter().map(|x| x.0).collect();
        assert!(times.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn slow_reads_are_all_kept_and_a_burst_of_reads_is_bounded() {
        // Reads every 5 minutes: each is more than a step after the last, so each is kept.
        let t0 = Instant::now();
        let mut r = Readings::default();
        for i in 0..12u64 {
            r.push(t0 + Duration::from_secs(i * 300), i, &HOUR);
        }
        assert_eq!(r.len(), 12);
        assert_eq!(r.since(Duration::from_secs(3600)).map(|x| x.1), Some(0));
        // Reads with no time between them (a clock that does not move): the fine stretch
        // stops at its cap instead of growing.
        let mut r = Readings::default();
        for i in 0..10_000u64 {
            r.push(t0, i, &HOUR);
        }
        assert!(r.len() <= MAX_FINE + 1, "{}", r.len());
        assert_eq!(r.last().map(|x| x.1), Some(9_999));
    }
}

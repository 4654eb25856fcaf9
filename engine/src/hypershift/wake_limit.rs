//! How often messages from one sender (a hosted cluster's connector) may wake the work they are about:
//! the first at once, then at most one wake per interval; whatever arrives in between is folded into a
//! single wake at the end of the interval. A sender that floods the manager costs one wake per interval,
//! and nothing it said is lost (the folded wake comes).
//!
//! Pure: times are the caller's monotonic milliseconds. It decides when to wake, never what.

use std::collections::HashMap;
use std::hash::Hash;

/// What to do with a message that just arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Wake now.
    Now,
    /// Wake once, this many milliseconds from now (then call [`WakeLimit::fired`]).
    After(u64),
    /// A wake is already due: this message goes with it.
    Folded,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The earliest the next wake may come.
    next_ms: u64,
    /// A wake is scheduled for `next_ms`.
    pending: bool,
}

/// Past this many senders, those with nothing due are forgotten (a forgotten sender wakes at once again,
/// which its last wake an interval ago allows anyway).
const REMEMBERED: usize = 4096;

/// The wake schedule of every sender.
#[derive(Debug, Clone)]
pub struct WakeLimit<K> {
    interval_ms: u64,
    slots: HashMap<K, Slot>,
}

impl<K: Hash + Eq + Clone> WakeLimit<K> {
    pub fn new(interval_ms: u64) -> Self {
        Self {
            interval_ms,
            slots: HashMap::new(),
        }
    }

    /// A message from `sender` arrived at `now_ms`.
    pub fn arrive(&mut self, sender: &K, now_ms: u64) -> Wake {
        if self.slots.len() >= REMEMBERED && !self.slots.contains_key(sender) {
            self.slots
                .retain(|_, slot| slot.pending || slot.next_ms > now_ms);
        }
        let interval = self.interval_ms;
        let slot = self.slots.entry(sender.clone()).or_insert(Slot {
            next_ms: 0,
            pending: false,
        });
        if slot.pending {
            return Wake::Folded;
        }
        if now_ms >= slot.next_ms {
            slot.next_ms = now_ms.saturating_add(interval);
            return Wake::Now;
        }
        slot.pending = true;
        Wake::After(slot.next_ms - now_ms)
    }

    /// How many senders have a wake scheduled.
    pub fn scheduled(&self) -> usize {
        self.slots.values().filter(|slot| slot.pending).count()
    }

    /// The wake scheduled for `sender` ran at `now_ms`.
    pub fn fired(&mut self, sender: &K, now_ms: u64) {
        if let Some(slot) = self.slots.get_mut(sender) {
            slot.pending = false;
            slot.next_ms = now_ms.saturating_add(self.interval_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_first_message_wakes_at_once_and_the_rest_fold_into_one() {
        let mut limit = WakeLimit::new(1_000);
        assert_eq!(limit.arrive(&"a", 10), Wake::Now);
        assert_eq!(limit.arrive(&"a", 20), Wake::After(990));
        assert_eq!(limit.arrive(&"a", 500), Wake::Folded);
        // Another sender is not held back.
        assert_eq!(limit.arrive(&"b", 500), Wake::Now);
        assert_eq!(limit.scheduled(), 1);
        limit.fired(&"a", 1_010);
        assert_eq!(limit.scheduled(), 0);
        assert_eq!(limit.arrive(&"a", 1_500), Wake::After(510));
        limit.fired(&"a", 2_010);
        assert_eq!(limit.arrive(&"a", 3_100), Wake::Now);
    }

    proptest! {
        /// Whatever arrives when: wakes of one sender are at least an interval apart, and every message
        /// is followed by a wake no earlier than it arrived.
        #[test]
        fn wakes_are_spaced_and_no_message_goes_unanswered(
            gaps in prop::collection::vec((0u64..3, 0u64..1_500), 1..200),
        ) {
            let interval = 1_000;
            let mut limit = WakeLimit::new(interval);
            let mut now = 0;
            let mut wakes: Vec<(u64, u64)> = Vec::new(); // (sender, at)
            let mut due: Vec<(u64, u64)> = Vec::new(); // scheduled (sender, at)
            let mut arrivals = Vec::new();
            for (sender, gap) in gaps {
                now += gap;
                // Scheduled wakes run first when their time came.
                due.sort_by_key(|(_, at)| *at);
                while let Some(&(s, at)) = due.first().filter(|(_, at)| *at <= now) {
                    due.remove(0);
                    limit.fired(&s, at);
                    wakes.push((s, at));
                }
                arrivals.push((sender, now));
                match limit.arrive(&sender, now) {
                    Wake::Now => wakes.push((sender, now)),
                    Wake::After(ms) => due.push((sender, now + ms)),
                    Wake::Folded => {}
                }
            }
            for (s, at) in due.drain(..) {
                wakes.push((s, at));
            }
            for sender in 0..3 {
                let mut times: Vec<u64> =
                    wakes.iter().filter(|(s, _)| *s == sender).map(|(_, at)| *at).collect();
                times.sort_unstable();
                for pair in times.windows(2) {
                    prop_assert!(pair[1] - pair[0] >= interval, "{:?}", times);
                }
                for (_, at) in arrivals.iter().filter(|(s, _)| *s == sender) {
                    prop_assert!(times.iter().any(|w| w >= at), "a message at {} never woke", at);
                }
            }
        }
    }
}

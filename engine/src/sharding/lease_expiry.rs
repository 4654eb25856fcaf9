//! When another process's Lease has run out, judged by the observer's own clock alone.
//!
//! A Lease's renewTime is written with its holder's wall clock. Comparing it with the reader's wall clock
//! makes expiry depend on how far apart the two clocks are: a reader ahead by more than the holder's
//! margin takes a Lease whose holder still writes, and a holder behind looks dead to everyone. So a
//! Lease's time is counted from when this process saw its record change (holder or renewTime, compared
//! as written values, never read as times), on this process's monotonic clock: it has run out once its
//! duration passed since then with no change seen. The holder gives up at its renew deadline, counted
//! from the *start* of its last successful renewal, which came before any observer could see that
//! renewal; so the holder stops before any observer may take over, whatever the wall clocks say. A
//! Lease seen for the first time gets a full duration: the observer cannot know how old its record is.
//! (client-go's leader election times Leases the same way.)
//!
//! Pure: times are the observer's monotonic milliseconds, passed in. It must not read a clock, and must
//! never compare a time written by another process with one of this process.

use std::collections::BTreeMap;

use crate::sighting::Sighting;

/// What a Lease says about its holder; each renewal changes it. Compared as written, never read as a
/// time.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// The holder's identity (empty: released).
    pub holder: String,
    /// The renewTime as written by the holder.
    pub renewed: String,
}

impl LeaseRecord {
    /// Released, or never held.
    pub fn is_free(&self) -> bool {
        self.holder.is_empty()
    }
}

/// A Lease as this process saw it: its record and when the record last changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSighting(Sighting<LeaseRecord>);

impl LeaseSighting {
    /// The first sight of a Lease, at `now_ms`.
    pub fn new(record: LeaseRecord, now_ms: u64) -> Self {
        Self(Sighting::new(record, now_ms))
    }

    /// Notes what the Lease says at `now_ms`: a record that differs from the last one starts its time
    /// again; the same record seen again does not.
    pub fn observe(&mut self, record: LeaseRecord, now_ms: u64) {
        self.0.observe(record, now_ms);
    }

    pub fn record(&self) -> &LeaseRecord {
        self.0.value()
    }

    /// When this process first saw the current record.
    pub fn changed_at_ms(&self) -> u64 {
        self.0.changed_at_ms()
    }

    /// When the Lease runs out if nothing changes: `duration_ms` after its record was first seen.
    pub fn expires_at_ms(&self, duration_ms: u64) -> u64 {
        self.0.changed_at_ms().saturating_add(duration_ms)
    }

    /// Whether the Lease has run out at `now_ms`.
    pub fn expired(&self, duration_ms: u64, now_ms: u64) -> bool {
        self.0.age_ms(now_ms) >= duration_ms
    }

    /// Whether `me` may take the Lease at `now_ms`: free, already ours, or run out.
    pub fn may_take(&self, me: &str, duration_ms: u64, now_ms: u64) -> bool {
        let record = self.record();
        record.is_free() || record.holder == me || self.expired(duration_ms, now_ms)
    }
}

/// The sightings of a set of Leases (the shard members'), by key.
#[derive(Debug, Clone)]
pub struct LeaseSightings<K> {
    seen: BTreeMap<K, LeaseSighting>,
}

impl<K> Default for LeaseSightings<K> {
    fn default() -> Self {
        Self {
            seen: BTreeMap::new(),
        }
    }
}

impl<K: Ord> LeaseSightings<K> {
    /// Notes every Lease there is at `now_ms`; a Lease no longer there is forgotten (should it come
    /// back, it is new).
    pub fn observe_all(
        &mut self,
        current: impl IntoIterator<Item = (K, LeaseRecord)>,
        now_ms: u64,
    ) {
        let mut next = BTreeMap::new();
        for (key, record) in current {
            let sighting = match self.seen.remove(&key) {
                Some(mut known) => {
                    known.observe(record, now_ms);
                    known
                }
                None => LeaseSighting::new(record, now_ms),
            };
            next.insert(key, sighting);
        }
        self.seen = next;
    }

    pub fn get(&self, key: &K) -> Option<&LeaseSighting> {
        self.seen.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(holder: &str, renewed: &str) -> LeaseRecord {
        LeaseRecord {
            holder: holder.to_owned(),
            renewed: renewed.to_owned(),
        }
    }

    #[test]
    fn a_lease_runs_out_a_duration_after_its_record_last_changed() {
        let mut lease = LeaseSighting::new(record("a", "t1"), 1_000);
        assert!(!lease.may_take("b", 15_000, 15_999));
        // The same record seen again is no renewal.
        lease.observe(record("a", "t1"), 10_000);
        assert!(lease.may_take("b", 15_000, 16_000));
        // A renewal seen restarts the time.
        lease.observe(record("a", "t2"), 16_500);
        assert!(!lease.may_take("b", 15_000, 31_499));
        assert!(lease.may_take("b", 15_000, 31_500));
        // The holder itself, and anyone once it is released, may take it at any time.
        assert!(lease.may_take("a", 15_000, 16_500));
        lease.observe(LeaseRecord::default(), 17_000);
        assert!(lease.may_take("b", 15_000, 17_000));
    }

    #[test]
    fn leases_gone_are_forgotten_and_new_ones_get_a_full_duration() {
        let mut leases = LeaseSightings::default();
        leases.observe_all([("a", record("a", "t1")), ("b", record("b", "t1"))], 0);
        leases.observe_all([("a", record("a", "t2"))], 5_000);
        assert_eq!(
            leases.get(&"a").map(LeaseSighting::changed_at_ms),
            Some(5_000)
        );
        assert!(leases.get(&"b").is_none());
        leases.observe_all([("a", record("a", "t2")), ("b", record("b", "t1"))], 9_000);
        assert_eq!(
            leases.get(&"a").map(LeaseSighting::changed_at_ms),
            Some(5_000)
        );
        assert_eq!(
            leases.get(&"b").map(LeaseSighting::changed_at_ms),
            Some(9_000)
        );
    }

    /// A holder renewing on its own schedule, seen by an observer that looks at arbitrary moments; all in
    /// true milliseconds. The holder's wall clock is off by the skew under test; the observer's
    /// monotonic clock starts at an arbitrary point.
    #[derive(Debug, Clone)]
    struct World {
        duration_ms: u64,
        renew_deadline_ms: u64,
        retry_ms: u64,
        /// How long each renewal request takes to be stored (from its start), cycled.
        latencies: Vec<u64>,
        /// The holder stops renewing (dies or stalls) at this true time.
        stops_at: u64,
        /// Gaps between the observer's looks, and how late each look's read is.
        looks: Vec<(u64, u64)>,
        observer_epoch: u64,
    }

    /// The renewals the holder made: (start, stored), in true time; the first one took the Lease.
    fn renewals(w: &World) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while start <= w.stops_at {
            let stored = start + w.latencies[i % w.latencies.len()];
            // A renewal not stored within the renew deadline of the last good one is a lost Lease: the
            // holder gives up there.
            if out
                .last()
                .is_some_and(|(last, _)| stored >= last + w.renew_deadline_ms)
            {
                break;
            }
            out.push((start, stored));
            start += w.retry_ms;
            i += 1;
        }
        out
    }

    /// The observer's looks: (true time of the look, the moment its read reflects). Reads never go back
    /// in time (the apiserver answers a read with at least what an earlier one returned).
    fn looks(w: &World) -> Vec<(u64, u64)> {
        let mut now = 0;
        let mut reflected = 0;
        w.looks
            .iter()
            .map(|(gap, lag)| {
                now += gap;
                reflected = reflected.max(now.saturating_sub(*lag));
                (now, reflected)
            })
            .collect()
    }

    /// The observer's verdicts at each look that found the Lease (true time of the look, may take), the
    /// holder's wall clock `skew_ms` off.
    fn verdicts(w: &World, skew_ms: i64) -> Vec<(u64, bool)> {
        let made = renewals(w);
        let wall = |t: u64| (i64::try_from(t).unwrap_or(i64::MAX) + skew_ms).to_string();
        let mut sighting: Option<LeaseSighting> = None;
        let mut out = Vec::new();
        for (now, read_at) in looks(w) {
            // What the read returned: the last renewal stored by then.
            let Some((start, _)) = made.iter().rev().find(|(_, stored)| *stored <= read_at) else {
                continue;
            };
            let seen = record("holder", &wall(*start));
            let mono = w.observer_epoch + now;
            let s = sighting.get_or_insert_with(|| LeaseSighting::new(seen.clone(), mono));
            s.observe(seen, mono);
            out.push((now, s.may_take("observer", w.duration_ms, mono)));
        }
        out
    }

    fn world() -> impl Strategy<Value = World> {
        (
            5_000u64..20_000,
            prop::collection::vec(1u64..3_000, 1..8),
            0u64..120_000,
            prop::collection::vec((1u64..4_000, 0u64..2_000), 1..80),
            0u64..1_000_000_000,
        )
            .prop_map(
                |(duration_ms, latencies, stops_at, looks, observer_epoch)| World {
                    duration_ms,
                    // client-go's proportions, as the manager's LeaseConfig uses them.
                    renew_deadline_ms: duration_ms * 2 / 3,
                    retry_ms: duration_ms * 2 / 15,
                    latencies,
                    stops_at,
                    looks,
                    observer_epoch,
                },
            )
    }

    proptest! {
        /// The observer takes the Lease only after the holder stopped writing (its renew deadline
        /// passed), whatever the holder's wall clock says (±60 s).
        #[test]
        fn the_holder_has_stopped_before_anyone_takes_its_lease(
            w in world(),
            skew_ms in -60_000i64..60_000,
        ) {
            let made = renewals(&w);
            let (last_start, _) = *made.last().unwrap();
            let fence_closes = last_start + w.renew_deadline_ms;
            for (at, takes) in verdicts(&w, skew_ms) {
                if takes {
                    prop_assert!(
                        at >= fence_closes,
                        "taken at {} while the holder may write until {}", at, fence_closes
                    );
                }
            }
        }

        /// Skew changes nothing: the verdicts are those of true clocks.
        #[test]
        fn verdicts_do_not_depend_on_the_holders_clock(
            w in world(),
            skew_ms in -60_000i64..60_000,
        ) {
            prop_assert_eq!(verdicts(&w, skew_ms), verdicts(&w, 0));
        }

        /// A holder that stopped is taken over: every look a duration after the one that first read its
        /// last renewal finds the Lease run out.
        #[test]
        fn a_stopped_holders_lease_runs_out(w in world(), skew_ms in -60_000i64..60_000) {
            let made = renewals(&w);
            let (_, last_stored) = *made.last().unwrap();
            let first_seen = looks(&w)
                .into_iter()
                .find(|(_, read_at)| *read_at >= last_stored)
                .map(|(at, _)| at);
            if let Some(first_seen) = first_seen {
                for (at, takes) in verdicts(&w, skew_ms) {
                    if at >= first_seen + w.duration_ms {
                        prop_assert!(takes, "not taken at {}, last renewal seen at {}", at, first_seen);
                    }
                }
            }
        }
    }
}

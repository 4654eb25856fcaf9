//! A value another process writes, as this process saw it: the value and when it last changed, on this
//! process's monotonic clock. Every age, expiry and soak judged from another process's writes (Leases,
//! the fleet's records) is timed from a sighting, never from a timestamp the writer put in the value:
//! clocks of different machines disagree, and a writer can say anything. Values are compared for
//! equality only.
//!
//! Pure: times are passed in (milliseconds of the observer's monotonic clock).

/// A value and when this process first saw it as it is now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sighting<T> {
    value: T,
    changed_at_ms: u64,
}

impl<T: PartialEq> Sighting<T> {
    /// The first sight of `value`, at `now_ms`.
    pub fn new(value: T, now_ms: u64) -> Self {
        Self {
            value,
            changed_at_ms: now_ms,
        }
    }

    /// Notes the value seen at `now_ms`; a different value starts its time again (returns true), the
    /// same value seen again does not.
    pub fn observe(&mut self, value: T, now_ms: u64) -> bool {
        if value == self.value {
            return false;
        }
        self.value = value;
        self.changed_at_ms = now_ms;
        true
    }

    pub fn value(&self) -> &T {
        &self.value
    }

    /// When this process first saw the current value.
    pub fn changed_at_ms(&self) -> u64 {
        self.changed_at_ms
    }

    /// How long the value has been as it is, as far as this process knows.
    pub fn age_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.changed_at_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_ages_from_when_it_was_first_seen_as_it_is() {
        let mut seen = Sighting::new("a", 100);
        assert!(!seen.observe("a", 500));
        assert_eq!(seen.age_ms(700), 600);
        assert!(seen.observe("b", 800));
        assert_eq!(seen.age_ms(700), 0, "a clock read before the change");
        assert_eq!(seen.age_ms(1_000), 200);
        assert_eq!(*seen.value(), "b");
    }
}

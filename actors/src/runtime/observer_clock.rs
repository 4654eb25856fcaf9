//! This process's own monotonic clock, in the milliseconds the engine's sighting rules take
//! (`engine::sighting`, `engine::sharding::lease_expiry`, `engine::hypershift::wake_limit`): when this process saw something,
//! never a time another process wrote. It owns the reading of the clock, nothing else.

use std::time::Instant;

/// Milliseconds since this clock was made; cheap to copy.
#[derive(Debug, Clone, Copy)]
pub struct ObserverClock(Instant);

impl ObserverClock {
    pub fn start() -> Self {
        Self(Instant::now())
    }

    /// Milliseconds since [`ObserverClock::start`].
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_starts_at_zero_and_never_goes_back() {
        let clock = ObserverClock::start();
        let first = clock.now_ms();
        assert!(first < 1_000, "{first}");
        assert!(clock.now_ms() >= first);
    }
}

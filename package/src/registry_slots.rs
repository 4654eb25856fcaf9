//! A bound on registry operations in flight, and a count of those waiting for a place. The registry
//! client opens a connection for every request it cannot give an idle one and keeps each for a while:
//! 500 Packages unpacking at once held 500 connections (their buffers about 24 KiB each) and asked the
//! registry 500 times at once.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{AcquireError, Semaphore, SemaphorePermit};

/// Registry operations (a digest lookup, a pull) in flight at once.
pub const REGISTRY_OPERATIONS_IN_FLIGHT: usize = 16;

/// Places for registry operations.
pub struct RegistrySlots {
    places: Semaphore,
    waiting: AtomicU64,
}

impl Default for RegistrySlots {
    fn default() -> Self {
        Self {
            places: Semaphore::new(REGISTRY_OPERATIONS_IN_FLIGHT),
            waiting: AtomicU64::new(0),
        }
    }
}

impl RegistrySlots {
    /// A place, held until it is dropped. Fails only if the places were closed, which they never are.
    pub async fn take(&self) -> Result<SemaphorePermit<'_>, AcquireError> {
        let waiting = Waiting::count(&self.waiting);
        let place = self.places.acquire().await;
        drop(waiting);
        place
    }

    /// Operations waiting for a place now.
    pub fn waiting(&self) -> usize {
        usize::try_from(self.waiting.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
    }
}

/// One operation counted as waiting until it is dropped, also when its future is dropped while waiting.
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn count(waiting: &'a AtomicU64) -> Self {
        waiting.fetch_add(1, Ordering::Relaxed);
        Self(waiting)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_dropped_while_waiting_is_no_longer_counted() {
        let slots = RegistrySlots::default();
        let held: Vec<_> =
            futures::future::join_all((0..REGISTRY_OPERATIONS_IN_FLIGHT).map(|_| slots.take()))
                .await;
        assert!(held.iter().all(Result::is_ok));
        let mut blocked = Box::pin(slots.take());
        // Polled once: it waits, counted.
        assert!(futures::poll!(blocked.as_mut()).is_pending());
        assert_eq!(slots.waiting(), 1);
        drop(blocked);
        assert_eq!(slots.waiting(), 0);
    }
}

//! Whether every watch feed of the manager has listed its kind once: until then its actors have not seen
//! everything, and the manager does not call itself ready. The feeds count themselves in; readiness reads.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Feeds started and feeds that finished their first list; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct FeedSync {
    feeds: Arc<AtomicUsize>,
    synced: Arc<AtomicUsize>,
}

impl FeedSync {
    /// A feed started.
    pub fn feed_started(&self) {
        self.feeds.fetch_add(1, Ordering::SeqCst);
    }

    /// A feed finished its first list (once per feed).
    pub fn feed_listed(&self) {
        self.synced.fetch_add(1, Ordering::SeqCst);
    }

    /// Feeds created, and feeds that finished their first list.
    pub fn progress(&self) -> (usize, usize) {
        (
            self.feeds.load(Ordering::SeqCst),
            self.synced.load(Ordering::SeqCst),
        )
    }

    /// Whether at least one feed runs and every feed listed once.
    pub fn all_synced(&self) -> bool {
        let (feeds, synced) = self.progress();
        feeds > 0 && synced >= feeds
    }
}

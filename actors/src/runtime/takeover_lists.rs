//! Which take-overs this replica's label-selected feeds have listed (sharded). A successor lists a
//! departed member's objects of every kind, then starts their actors: the lists are a few requests, the
//! first reconciles of the adopted objects thousands, and on a busy apiserver those reconciles would slow
//! the lists of the kinds still loading. Each feed holds the events of a departed member's watch until
//! every feed listed that member's objects, or [`HOLD_LIMIT`] passed.
//!
//! It owns the count of feeds and of their finished lists per departed member; it must not decide who
//! works on what (the engine's `works_on` does).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::info;

use crate::engine::sharding::shard_assignment::Member;
use crate::runtime::shard_metrics::ShardMetrics;

/// How long a feed holds a departed member's objects at most, waiting for the other feeds' lists: a
/// list that fails or takes longer does not keep the others from their work.
pub const HOLD_LIMIT: Duration = Duration::from_secs(5);

/// Shared by the feeds of one replica; cheap to clone.
#[derive(Clone)]
pub struct TakeoverLists {
    /// Feeds that watch departed members' labels (the label-selected ones).
    feeds: Arc<AtomicUsize>,
    progress: Arc<Mutex<HashMap<Member, Progress>>>,
    /// Bumped whenever a take-over is listed by every feed.
    listed: Arc<tokio::sync::watch::Sender<u64>>,
    metrics: ShardMetrics,
}

/// One take-over's lists.
struct Progress {
    /// When the first feed started watching the departed member's label.
    since: Instant,
    /// Feeds that finished their list of its objects.
    feeds: usize,
}

impl TakeoverLists {
    pub fn new(metrics: ShardMetrics) -> Self {
        Self {
            feeds: Arc::default(),
            progress: Arc::default(),
            listed: Arc::new(tokio::sync::watch::channel(0).0),
            metrics,
        }
    }

    /// A feed that will watch departed members' labels (counted before any of them starts).
    pub fn register_feed(&self) {
        self.feeds.fetch_add(1, Ordering::SeqCst);
    }

    pub fn unregister_feed(&self) {
        self.feeds.fetch_sub(1, Ordering::SeqCst);
    }

    /// A feed starts watching `departed`'s label.
    pub fn watching(&self, departed: &Member) {
        if let Ok(mut progress) = self.progress.lock() {
            progress.entry(departed.clone()).or_insert(Progress {
                since: Instant::now(),
                feeds: 0,
            });
        }
    }

    /// A feed finished its first list of `departed`'s objects. The last one to finish records how long
    /// the take-over's lists took and wakes the feeds holding its objects.
    pub fn listed(&self, departed: &Member) {
        let feeds = self.feeds.load(Ordering::SeqCst);
        let took = {
            let Ok(mut progress) = self.progress.lock() else {
                return;
            };
            // Counted from the first `watching`; a take-over that ended counts nothing more.
            let Some(entry) = progress.get_mut(departed) else {
                return;
            };
            entry.feeds += 1;
            (entry.feeds == feeds).then(|| entry.since.elapsed())
        };
        if let Some(took) = took {
            info!(member = %departed, seconds = took.as_secs_f64(), "every feed listed the departed member's objects");
            self.metrics.takeover_listed(took.as_secs_f64());
            self.listed.send_modify(|generation| *generation += 1);
        }
    }

    /// Whether every feed listed `departed`'s objects.
    pub fn complete(&self, departed: &Member) -> bool {
        let feeds = self.feeds.load(Ordering::SeqCst);
        self.progress
            .lock()
            .ok()
            .and_then(|progress| progress.get(departed).map(|p| p.feeds >= feeds))
            .unwrap_or(false)
    }

    /// The take-over of `departed` ended (its record is gone): its count goes.
    pub fn ended(&self, departed: &Member) {
        if let Ok(mut progress) = self.progress.lock() {
            progress.remove(departed);
        }
    }

    /// Changes whenever a take-over is listed by every feed.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.listed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_takeover_is_complete_once_every_registered_feed_listed_it() {
        let lists = TakeoverLists::new(ShardMetrics::default());
        let wake = lists.subscribe();
        for _ in 0..3 {
            lists.register_feed();
        }
        lists.unregister_feed();
        let departed = "b-1".to_owned();
        lists.watching(&departed);
        lists.listed(&departed);
        assert!(!lists.complete(&departed));
        assert!(!wake.has_changed().unwrap());
        lists.listed(&departed);
        assert!(lists.complete(&departed));
        assert!(wake.has_changed().unwrap());
        assert!(!lists.complete(&"c-2".to_owned()));
        lists.ended(&departed);
        assert!(!lists.complete(&departed));
    }
}

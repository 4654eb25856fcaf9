//! The runtime's own metrics: reconciles by controller (recorded by the reconcile shell only) and what the
//! watch feeds see (deletions found only by re-listing, objects a sharded replica works on or hands
//! over). Labels are the controller, the result or the kind, never an object's name. It records; it
//! decides nothing.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// How a reconcile ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReconcileResult {
    Success,
    /// Failed; retried after the backoff.
    Error,
    /// Not finished (waiting on something outside pko); looked at again after the backoff.
    Requeue,
    /// Failed in a way only a change of the object can mend; not retried.
    GivenUp,
}

impl ReconcileResult {
    fn label(self) -> &'static str {
        match self {
            ReconcileResult::Success => "success",
            ReconcileResult::Error => "error",
            ReconcileResult::Requeue => "requeue",
            ReconcileResult::GivenUp => "given_up",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    controller: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ControllerLabels {
    controller: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

fn duration_histogram() -> Histogram {
    // 1 ms .. ~65 s: a status-only reconcile takes milliseconds, an image pull seconds.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// The runtime's metrics; cheap to clone.
#[derive(Clone)]
pub struct RuntimeMetrics {
    total: Family<ResultLabels, Counter>,
    duration: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    active: Family<ControllerLabels, Gauge>,
    watch_gap_deletions: Family<KindLabels, Counter>,
    shard_releases: Family<KindLabels, Counter>,
    shard_releases_refused: Family<KindLabels, Counter>,
    shard_objects: Family<KindLabels, Gauge>,
}

impl Default for RuntimeMetrics {
    fn default() -> Self {
        Self {
            total: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
            active: Family::default(),
            watch_gap_deletions: Family::default(),
            shard_releases: Family::default(),
            shard_releases_refused: Family::default(),
            shard_objects: Family::default(),
        }
    }
}

impl RuntimeMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "pko_reconcile",
            "Reconciles by controller and result.",
            self.total.clone(),
        );
        registry.register(
            "pko_reconcile_duration_seconds",
            "Time from the start of a reconcile to its result, by controller.",
            self.duration.clone(),
        );
        registry.register(
            "pko_reconcile_active",
            "Reconciles running now, by controller.",
            self.active.clone(),
        );
        registry.register(
            "pko_watch_gap_deletions",
            "Objects found deleted by a watch re-list (their delete event was missed), by kind.",
            self.watch_gap_deletions.clone(),
        );
        registry.register(
            "pko_shard_releases",
            "Objects this replica let go of to another replica when sharded (hand-offs), by kind.",
            self.shard_releases.clone(),
        );
        registry.register(
            "pko_shard_releases_refused",
            "Hand-offs not written because the object's shard labels changed after this replica decided to \
             let it go (labelled for another replica, or no longer drained), by kind.",
            self.shard_releases_refused.clone(),
        );
        registry.register(
            "pko_shard_objects",
            "Objects this replica works on when sharded (its own and those it takes over from a departed \
             replica), by kind.",
            self.shard_objects.clone(),
        );
    }

    /// A reconcile of `controller` started.
    pub fn started(&self, controller: &'static str) {
        self.active
            .get_or_create(&ControllerLabels { controller })
            .inc();
    }

    /// A reconcile of `controller` ended after `took`.
    pub fn finished(&self, controller: &'static str, result: ReconcileResult, took: Duration) {
        let labels = ControllerLabels { controller };
        self.active.get_or_create(&labels).dec();
        self.duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        self.total
            .get_or_create(&ResultLabels {
                controller,
                result: result.label(),
            })
            .inc();
    }

    /// This replica took an object of `kind` on (`1`) or let it go (`-1`), sharded.
    pub fn shard_objects(&self, kind: &'static str, delta: i64) {
        self.shard_objects
            .get_or_create(&KindLabels { kind })
            .inc_by(delta);
    }

    /// An object was handed to another replica (sharded mode).
    pub fn shard_released(&self, kind: &'static str) {
        self.shard_releases
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    /// A hand-off of an object of `kind` was not written: its labels changed since it was decided.
    pub fn shard_release_refused(&self, kind: &'static str) {
        self.shard_releases_refused
            .get_or_create(&KindLabels { kind })
            .inc();
    }

    /// A watch feed of `kind` found an object deleted only by re-listing.
    pub fn deleted_in_watch_gap(&self, kind: &'static str) {
        self.watch_gap_deletions
            .get_or_create(&KindLabels { kind })
            .inc();
    }
}

/// The text a registry filled by `register` encodes to: what the metric groups' unit tests read.
#[cfg(test)]
pub(crate) fn encoded(register: impl FnOnce(&mut Registry)) -> String {
    let mut registry = Registry::default();
    register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap_or_default();
    text
}

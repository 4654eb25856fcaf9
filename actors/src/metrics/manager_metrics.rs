//! The manager's metrics registry, exposed in the OpenMetrics text format on `/metrics`. It holds the
//! metric groups of each domain (apiserver requests, upstream's Package Operator metrics, rollouts,
//! connectors, package images) and its own: reconcile counts and durations per controller (recorded
//! by the reconcile shell only), the deletions the watch feeds found only by re-listing, the delivery
//! of rollout events, and hosted teardowns given up. Labels of these are bounded: the controller name,
//! the result, the kind or the reason, never an object's name. It records; it decides nothing.

use std::sync::{Arc, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::registry::Metric;

use super::connector_metrics::ConnectorMetrics;
use super::fleet_metrics::FleetMetrics;
use super::listener_metrics::ListenerMetrics;
use super::notification_metrics::NotificationMetrics;
use super::package_images::ImageFetchMetrics;
use super::rollout_metrics::RolloutMetrics;
use super::source_labels::SourceLabels;
use super::upstream_metrics::UpstreamMetrics;
use crate::runtime::api_request_metrics::ApiRequestMetrics;
use crate::runtime::heap_trim::HeapMetrics;
use crate::runtime::lease_metrics::LeaseMetrics;
use crate::runtime::runtime_metrics::RuntimeMetrics;
use crate::runtime::shard_metrics::ShardMetrics;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use prometheus_client::registry::Registry;

/// What became of a rollout event the publisher's outbox let go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Published {
    /// The stream stored it.
    Stored,
    /// The stream held its message id already.
    Duplicate,
    /// Not published: the story it belongs to was told whole before.
    ToldBefore,
}

/// The metrics of one manager; cheap to clone.
#[derive(Clone)]
pub struct ManagerMetrics {
    /// Written only while the process starts (registration), read by each scrape.
    registry: Arc<RwLock<Registry>>,
    /// Package Operator's own metric names.
    pub upstream: UpstreamMetrics,
    pub rollouts: RolloutMetrics,
    pub connectors: ConnectorMetrics,
    pub shards: ShardMetrics,
    pub fleet: FleetMetrics,
    pub images: ImageFetchMetrics,
    pub leases: LeaseMetrics,
    /// The CloudEvents notification sinks.
    pub notifications: NotificationMetrics,
    /// The allocator's heap and its trims (`runtime::heap_trim`).
    pub heap: HeapMetrics,
    /// The health and metrics listener.
    pub listener: ListenerMetrics,
    /// The reconcile shell's and the watch feeds' own.
    pub runtime: RuntimeMetrics,
    rollout_events: RolloutEventMetrics,
    hosted_teardowns_skipped: Family<ReasonLabels, Counter>,
    hosted_leftovers: Family<StoredLabels, Counter>,
    deployment_set_reads: Family<SourceLabels, Counter>,
    previous_revision_reads: Family<SourceLabels, Counter>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StoredLabels {
    /// What became of it: `stored` or `duplicate` for rollout events; `recorded`, `swept` or `dropped`
    /// for hosted leftovers.
    result: &'static str,
}

/// The delivery of rollout events to the stream.
#[derive(Clone, Default)]
struct RolloutEventMetrics {
    published: Family<StoredLabels, Counter>,
    failures: Counter,
    dropped: Counter,
    pending: Gauge,
}

impl Default for ManagerMetrics {
    fn default() -> Self {
        Self::new(ApiRequestMetrics::default())
    }
}

impl ManagerMetrics {
    /// The registry with every group, `api` being the request metrics the process's clients record.
    pub fn new(api: ApiRequestMetrics) -> Self {
        let runtime = RuntimeMetrics::default();
        let rollout_events = RolloutEventMetrics::default();
        let hosted_teardowns_skipped = Family::<ReasonLabels, Counter>::default();
        let hosted_leftovers = Family::<StoredLabels, Counter>::default();
        let deployment_set_reads = Family::<SourceLabels, Counter>::default();
        let previous_revision_reads = Family::<SourceLabels, Counter>::default();
        let mut registry = Registry::default();
        runtime.register(&mut registry);
        registry.register(
            "pko_rollout_events_published",
            "Rollout events the stream acknowledged, by whether it stored them or already held them.",
            rollout_events.published.clone(),
        );
        registry.register(
            "pko_rollout_events_publish_failures",
            "Attempts to publish a rollout event that were not acknowledged (retried).",
            rollout_events.failures.clone(),
        );
        registry.register(
            "pko_rollout_events_dropped",
            "Rollout events dropped because the outbox was full.",
            rollout_events.dropped.clone(),
        );
        registry.register(
            "pko_rollout_events_pending",
            "Rollout events in the outbox, not yet acknowledged by the stream.",
            rollout_events.pending.clone(),
        );
        registry.register(
            "pko_hosted_teardowns_skipped",
            "Deleted hosted-cluster phases whose teardown was given up, by reason.",
            hosted_teardowns_skipped.clone(),
        );
        registry.register(
            "pko_hosted_leftovers",
            "Teardowns of given-up hosted phases kept for their connector's return, by result: \
             recorded, swept (the connector tore them down), dropped (unreadable, or naming a live \
             phase).",
            hosted_leftovers.clone(),
        );
        registry.register(
            "pko_deployment_set_reads",
            "ObjectDeployment reconciles by where they read their ObjectSets: `index` (the watch-fed \
             index) or `list` (the index lacked a set: a revision just created or not yet watched).",
            deployment_set_reads.clone(),
        );
        registry.register(
            "pko_object_set_previous_reads",
            "Previous revisions an ObjectSet's plan read, by where: `index` (the watch-fed index) or \
             `get` (not in the index: read from the apiserver).",
            previous_revision_reads.clone(),
        );
        let upstream = UpstreamMetrics::default();
        let rollouts = RolloutMetrics::default();
        let connectors = ConnectorMetrics::default();
        let shards = ShardMetrics::default();
        let fleet = FleetMetrics::default();
        let images = ImageFetchMetrics::default();
        let leases = LeaseMetrics::default();
        let notifications = NotificationMetrics::default();
        let heap = HeapMetrics::default();
        let listener = ListenerMetrics::default();
        api.register(&mut registry);
        upstream.register(&mut registry);
        rollouts.register(&mut registry);
        connectors.register(&mut registry);
        shards.register(&mut registry);
        fleet.register(&mut registry);
        images.register(&mut registry);
        leases.register(&mut registry);
        notifications.register(&mut registry);
        heap.register(&mut registry);
        listener.register(&mut registry);
        Self {
            registry: Arc::new(RwLock::new(registry)),
            upstream,
            rollouts,
            connectors,
            shards,
            fleet,
            images,
            leases,
            notifications,
            heap,
            listener,
            runtime,
            rollout_events,
            hosted_teardowns_skipped,
            hosted_leftovers,
            deployment_set_reads,
            previous_revision_reads,
        }
    }
}

impl ManagerMetrics {
    /// Adds a metric owned elsewhere (registered once, while the process starts).
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .register(name, help, metric);
    }

    /// Adds a collector that reads its values at each scrape.
    pub fn add_collector(&self, collector: Box<dyn Collector>) {
        self.registry
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .register_collector(collector);
    }

    /// What became of a rollout event handed to the stream.
    pub fn rollout_event_published(&self, outcome: Published) {
        let result = match outcome {
            Published::Stored => "stored",
            Published::Duplicate => "duplicate",
            Published::ToldBefore => "told_before",
        };
        self.rollout_events
            .published
            .get_or_create(&StoredLabels { result })
            .inc();
    }

    /// An attempt to publish a rollout event failed.
    pub fn rollout_event_publish_failed(&self) {
        self.rollout_events.failures.inc();
    }

    /// `count` rollout events did not fit the outbox.
    pub fn rollout_events_dropped(&self, count: usize) {
        self.rollout_events
            .dropped
            .inc_by(u64::try_from(count).unwrap_or(u64::MAX));
    }

    /// `count` rollout events wait in the outbox.
    pub fn rollout_events_pending(&self, count: usize) {
        self.rollout_events
            .pending
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// An ObjectDeployment reconcile read its sets from the index (`true`) or listed them.
    pub fn deployment_sets_read(&self, from_index: bool) {
        let source = if from_index { "index" } else { "list" };
        self.deployment_set_reads
            .get_or_create(&SourceLabels { source })
            .inc();
    }

    /// An ObjectSet's plan read a previous revision from the index (`true`) or the apiserver.
    pub fn previous_revision_read(&self, from_index: bool) {
        let source = if from_index { "index" } else { "get" };
        self.previous_revision_reads
            .get_or_create(&SourceLabels { source })
            .inc();
    }

    /// The hosted teardown of a deleted phase was given up for `reason`.
    /// Leftover teardowns `recorded`, `swept` or `dropped`, `count` of them.
    pub fn hosted_leftovers(&self, result: &'static str, count: usize) {
        self.hosted_leftovers
            .get_or_create(&StoredLabels { result })
            .inc_by(u64::try_from(count).unwrap_or(u64::MAX));
    }

    pub fn hosted_teardown_skipped(&self, reason: &'static str) {
        self.hosted_teardowns_skipped
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// The metrics in the Prometheus text format (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self
            .registry
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
            tracing::warn!(error = %e, "cannot encode the manager metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::runtime_metrics::ReconcileResult;
    use std::time::Duration;

    #[test]
    fn a_finished_reconcile_is_counted_by_result_and_leaves_none_active() {
        let metrics = ManagerMetrics::default();
        // The runtime's metrics are served from the manager's registry.
        let reconciles = &metrics.runtime;
        reconciles.started("package");
        reconciles.finished("package", ReconcileResult::Error, Duration::from_millis(3));
        reconciles.started("package");
        reconciles.finished(
            "package",
            ReconcileResult::Success,
            Duration::from_millis(5),
        );
        let text = metrics.encode();
        assert!(
            text.contains(r#"pko_reconcile_total{controller="package",result="error"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"pko_reconcile_total{controller="package",result="success"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"pko_reconcile_duration_seconds_count{controller="package"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"pko_reconcile_active{controller="package"} 0"#),
            "{text}"
        );
    }
}

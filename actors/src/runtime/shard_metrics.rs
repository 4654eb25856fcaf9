//! Sharded mode, as the coordinator sees it: how many shard keys (HCP namespaces, cluster-scoped
//! objects) are labelled for each member, the label writes it makes, how long after a member departed its
//! successors were recorded (they work on its keys from then on) and how long until every one of its
//! keys was labelled for them; and, on every replica, how long its feeds took to list a departed member's
//! objects. Labelled by member name only (one series per replica). The replicas' own hand-offs are
//! counted by `pko_shard_releases` (manager_metrics).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct MemberLabels {
    member: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ActionLabels {
    action: &'static str,
}

fn takeover_histogram() -> Histogram {
    // 10 ms .. ~160 s: a take-over after a crash waits for the Lease to run out (15 s by default).
    Histogram::new(exponential_buckets(0.01, 2.0, 15))
}

/// The coordinator's metrics; cheap to clone.
#[derive(Clone)]
pub struct ShardMetrics {
    keys: Family<MemberLabels, Gauge>,
    label_writes: Family<ActionLabels, Counter>,
    takeover: Histogram,
    relabel: Histogram,
    takeover_listed: Histogram,
    pass: Histogram,
}

impl Default for ShardMetrics {
    fn default() -> Self {
        Self {
            keys: Family::default(),
            label_writes: Family::default(),
            takeover: takeover_histogram(),
            relabel: takeover_histogram(),
            takeover_listed: takeover_histogram(),
            pass: takeover_histogram(),
        }
    }
}

impl ShardMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "pko_shard_keys",
            "Shard keys (HCP namespaces and cluster-scoped objects) labelled for each member, as the \
             coordinator sees them.",
            self.keys.clone(),
        );
        registry.register(
            "pko_shard_label_writes",
            "Shard label writes of the coordinator: assign (label for the owner) or drain.",
            self.label_writes.clone(),
        );
        registry.register(
            "pko_shard_takeover_seconds",
            "From the coordinator seeing a member leave (Lease released or run out) to the take-over \
             record naming its successors, who work on its keys from then on.",
            self.takeover.clone(),
        );
        registry.register(
            "pko_shard_relabel_seconds",
            "From the coordinator seeing a member leave to every key it held being labelled for \
             another member.",
            self.relabel.clone(),
        );
        registry.register(
            "pko_shard_takeover_listed_seconds",
            "On a successor: from its first watch of a departed member's label to every feed having \
             listed that member's objects (their actors start then).",
            self.takeover_listed.clone(),
        );
        registry.register(
            "pko_shard_coordinator_pass_seconds",
            "One pass of the coordinator's loop (take-over records, label writes, retired Leases). A \
             coordinating replica passes at least every 30 s; a count that stops rising means its loop \
             is stuck while it holds the coordinator's Lease.",
            self.pass.clone(),
        );
    }

    /// The keys labelled for each member now; members not listed are dropped.
    pub fn keys_held(&self, held: &std::collections::BTreeMap<String, usize>) {
        self.keys.clear();
        for (member, keys) in held {
            let value = i64::try_from(*keys).unwrap_or(i64::MAX);
            self.keys
                .get_or_create(&MemberLabels {
                    member: member.clone(),
                })
                .set(value);
        }
    }

    pub fn label_written(&self, drain: bool) {
        let action = if drain { "drain" } else { "assign" };
        self.label_writes
            .get_or_create(&ActionLabels { action })
            .inc();
    }

    pub fn taken_over(&self, seconds: f64) {
        self.takeover.observe(seconds);
    }

    pub fn relabelled(&self, seconds: f64) {
        self.relabel.observe(seconds);
    }

    pub fn coordinator_pass(&self, seconds: f64) {
        self.pass.observe(seconds);
    }

    pub fn takeover_listed(&self, seconds: f64) {
        self.takeover_listed.observe(seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_per_member_follow_the_last_count_only() {
        let metrics = ShardMetrics::default();
        metrics.keys_held(&[("a".to_owned(), 3), ("b".to_owned(), 1)].into());
        metrics.keys_held(&[("b".to_owned(), 4)].into());
        metrics.label_written(true);
        metrics.taken_over(0.5);
        metrics.relabelled(4.0);
        metrics.takeover_listed(1.5);
        let text = crate::runtime::runtime_metrics::encoded(|r| metrics.register(r));
        assert!(text.contains("pko_shard_keys{member=\"b\"} 4"), "{text}");
        assert!(!text.contains("member=\"a\""), "{text}");
        assert!(
            text.contains("pko_shard_label_writes_total{action=\"drain\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("pko_shard_takeover_seconds_count 1"),
            "{text}"
        );
        assert!(text.contains("pko_shard_relabel_seconds_sum 4.0"), "{text}");
        assert!(
            text.contains("pko_shard_takeover_listed_seconds_sum 1.5"),
            "{text}"
        );
    }
}

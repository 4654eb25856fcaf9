//! Leases this process takes part in (the leader Lease, the shard coordinator's, its own member Lease):
//! each attempt to take or renew one, by outcome, and whether this process holds it. Labelled by the
//! Lease's name, of which a process has at most three. It records; the Lease rules are in
//! `engine::sharding::lease_expiry` and `runtime::leader_lease`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LeaseLabels {
    lease: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct AttemptLabels {
    lease: String,
    result: &'static str,
}

/// How one attempt on a Lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAttempt {
    /// Taken (created, free, or run out as this process saw it).
    Taken,
    Renewed,
    /// Another holder's Lease had not run out yet, by this process's clock.
    HeldElsewhere,
    /// No answer, or an error from the apiserver.
    Failed,
}

impl LeaseAttempt {
    fn label(self) -> &'static str {
        match self {
            LeaseAttempt::Taken => "taken",
            LeaseAttempt::Renewed => "renewed",
            LeaseAttempt::HeldElsewhere => "held_elsewhere",
            LeaseAttempt::Failed => "failed",
        }
    }
}

/// Lease metrics; cheap to clone, shared with the Lease threads.
#[derive(Clone, Default)]
pub struct LeaseMetrics {
    attempts: Family<AttemptLabels, Counter>,
    holding: Family<LeaseLabels, Gauge>,
}

impl std::fmt::Debug for LeaseMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseMetrics")
    }
}

impl LeaseMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "pko_lease_attempts",
            "Attempts to take or renew a Lease, by Lease and result (taken, renewed, held_elsewhere, \
             failed).",
            self.attempts.clone(),
        );
        registry.register(
            "pko_lease_held",
            "1 while this process holds the Lease, 0 otherwise.",
            self.holding.clone(),
        );
    }

    /// An attempt on `lease` ended as `result`.
    pub fn attempted(&self, lease: &str, result: LeaseAttempt) {
        self.attempts
            .get_or_create(&AttemptLabels {
                lease: lease.to_owned(),
                result: result.label(),
            })
            .inc();
    }

    /// This process holds `lease` (or no longer does).
    pub fn holding(&self, lease: &str, held: bool) {
        self.holding
            .get_or_create(&LeaseLabels {
                lease: lease.to_owned(),
            })
            .set(i64::from(held));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_are_counted_by_lease_and_result() {
        let metrics = LeaseMetrics::default();
        metrics.attempted("pko", LeaseAttempt::HeldElsewhere);
        metrics.attempted("pko", LeaseAttempt::HeldElsewhere);
        metrics.attempted("pko", LeaseAttempt::Taken);
        metrics.holding("pko", true);
        let text = crate::runtime::runtime_metrics::encoded(|r| metrics.register(r));
        assert!(
            text.contains(r#"pko_lease_attempts_total{lease="pko",result="held_elsewhere"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"pko_lease_attempts_total{lease="pko",result="taken"} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"pko_lease_held{lease="pko"} 1"#), "{text}");
    }
}

//! Per HostedClusterPackage: its Package counts fleet-wide and per partition group, the rollout's state,
//! and when the running rollout started, all read off the status the apiserver holds (so a standby, or
//! a restarted manager, exports the same). Labels: the HostedClusterPackage's name (cluster-scoped), the
//! partition group's name and a fixed state; never a Package or namespace.

use dashmap::DashMap;
use pko_proto::core::hosted_cluster_package::{HostedClusterPackage, HostedClusterPackageCounts};
use pko_proto::core::rollout_calendar::HostedClusterPackageSkippedStatus;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;

use crate::engine::conditions::find_condition;
use crate::engine::rollout::hosted_cluster_package::rollout_settings;
use crate::engine::rollout::rollout_plan::RolloutStrategy;
use crate::engine::rollout::rollout_status::{rollout_state, RolloutState, PROGRESSING};
use crate::metrics::preflight_metrics::PreflightMetrics;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CountLabels {
    hostedclusterpackage: String,
    state: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PartitionLabels {
    hostedclusterpackage: String,
    partition: String,
    state: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HealthCheckLabels {
    hostedclusterpackage: String,
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StatusChangeLabels {
    hostedclusterpackage: String,
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct NameLabels {
    hostedclusterpackage: String,
}

/// Reads one count.
type ReadCount = fn(&HostedClusterPackageCounts) -> i32;

/// The count states, as label values, with how to read each from the counts.
const COUNTS: [(&str, ReadCount); 7] = [
    ("total", |c| c.total_packages),
    ("updated", |c| c.updated_packages),
    ("available", |c| c.available_packages),
    ("unavailable", |c| c.unavailable_packages),
    ("progressed", |c| c.progressed_packages),
    ("in_flight", |c| c.in_flight_packages),
    ("failed", |c| c.failed_packages),
];

/// The rollout metrics; cheap to clone.
#[derive(Clone, Default)]
pub struct RolloutMetrics {
    packages: Family<CountLabels, Gauge>,
    partition_packages: Family<PartitionLabels, Gauge>,
    state: Family<CountLabels, Gauge>,
    /// Packages held back by the calendar: waiting for a maintenance window, or left out (skipped).
    held: Family<CountLabels, Gauge>,
    started: Family<NameLabels, Gauge>,
    max_unavailable: Family<NameLabels, Gauge>,
    health_checks: Family<HealthCheckLabels, Counter>,
    status_changes: Family<StatusChangeLabels, Counter>,
    updates_refused: Family<NameLabels, Counter>,
    /// The preflights of releases.
    pub preflight: PreflightMetrics,
    /// The partition groups each HostedClusterPackage exports, to drop those that went.
    partitions: Arc<DashMap<String, Vec<String>>>,
}

impl RolloutMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        self.preflight.register(registry);
        registry.register(
            "pko_hostedclusterpackage_packages",
            "Packages of a HostedClusterPackage by state: total, updated, available, unavailable, \
             progressed, in_flight, failed.",
            self.packages.clone(),
        );
        registry.register(
            "pko_hostedclusterpackage_partition_packages",
            "Packages of one partition group of a HostedClusterPackage by state: total, updated, \
             available, unavailable, progressed.",
            self.partition_packages.clone(),
        );
        registry.register(
            "pko_hostedclusterpackage_rollout_state",
            "1 for the state the HostedClusterPackage's rollout is in (progressing, finished, \
             blocked, paused, halted, waiting_for_window), 0 for the others.",
            self.state.clone(),
        );
        registry.register(
            "pko_hostedclusterpackage_held_packages",
            "HCP namespaces of a HostedClusterPackage held back by its calendar: state \
             waiting_for_window (to be created or updated once their maintenance window opens), \
             skipped (left out by spec.rolloutPolicy.skip until its expiry) or unknown_window (left \
             out: the HostedCluster's label names a window the policy does not define).",
            self.held.clone(),
        );
        registry.register(
            "pko_hostedclusterpackage_health_checks",
            "Evaluations of rollout health checks by result: passing, failing, unknown (no samples \
             or Prometheus not reached).",
            self.health_checks.clone(),
        );
        registry.register(
            "pko_hostedclusterpackage_status_changes",
            "Status changes a HostedClusterPackage's supervisor decided, by outcome: `written`, or \
             `held` (progress alone, merged into the next write within 1 s).",
            self.status_changes.clone(),
        );
        registry.register(
            "pko_hostedclusterpackage_updates_refused_changed",
            "Package updates that were free only because the Package was seen down, refused by the \
             apiserver because the Package changed before they landed (decided again on what changed).",
            self.updates_refused.clone(),
        );
        registry.register(
            "pko_hostedclusterpackage_max_unavailable",
            "Packages the strategy lets be unavailable at once (0 for the instant strategy).",
            self.max_unavailable.clone(),
        );
        registry.register(
            "pko_hostedclusterpackage_rollout_started_timestamp_seconds",
            "When the running rollout started (Progressing turned True), Unix seconds; absent once \
             it finished.",
            self.started.clone(),
        );
    }

    /// One health check evaluation of `name`'s rollout.
    pub fn health_check(&self, name: &str, result: &'static str) {
        self.health_checks
            .get_or_create(&HealthCheckLabels {
                hostedclusterpackage: name.to_owned(),
                result,
            })
            .inc();
    }

    /// A decided status change of `name` was written (`held`: false) or held back to be merged.
    pub fn status_change(&self, name: &str, held: bool) {
        self.status_changes
            .get_or_create(&StatusChangeLabels {
                hostedclusterpackage: name.to_owned(),
                outcome: if held { "held" } else { "written" },
            })
            .inc();
    }

    /// An update of one of `name`'s Packages was refused: the Package changed since it was seen down.
    pub fn update_refused_changed(&self, name: &str) {
        self.updates_refused
            .get_or_create(&NameLabels {
                hostedclusterpackage: name.to_owned(),
            })
            .inc();
    }

    /// A HostedClusterPackage as observed.
    pub fn hosted_cluster_package(&self, hcpkg: &HostedClusterPackage) {
        let name = hcpkg.metadata.name.clone().unwrap_or_default();
        let status = hcpkg.status.clone().unwrap_or_default();
        self.preflight.observed(&name, status.preflight.as_ref());
        for (state, read) in COUNTS {
            self.packages
                .get_or_create(&CountLabels {
                    hostedclusterpackage: name.clone(),
                    state,
                })
                .set(i64::from(read(&status.counts)));
        }
        let groups: Vec<String> = status.partitions.iter().map(|p| p.name.clone()).collect();
        if let Some(old) = self.partitions.insert(name.clone(), groups.clone()) {
            for gone in old.iter().filter(|g| !groups.contains(g)) {
                self.remove_partition(&name, gone);
            }
        }
        for partition in &status.partitions {
            for (state, read) in &COUNTS[..5] {
                self.partition_packages
                    .get_or_create(&PartitionLabels {
                        hostedclusterpackage: name.clone(),
                        partition: partition.name.clone(),
                        state,
                    })
                    .set(i64::from(read(&partition.counts)));
            }
        }
        let waiting: i32 = status.partitions.iter().map(|p| p.waiting_for_window).sum();
        let count = |f: fn(&HostedClusterPackageSkippedStatus) -> bool| {
            i32::try_from(status.skipped.iter().filter(|s| f(s)).count()).unwrap_or(i32::MAX)
        };
        let skipped = count(|s| s.until.is_some());
        let unknown_window = count(|s| s.until.is_none());
        for (state, value) in [
            ("waiting_for_window", waiting),
            ("skipped", skipped),
            ("unknown_window", unknown_window),
        ] {
            self.held
                .get_or_create(&CountLabels {
                    hostedclusterpackage: name.clone(),
                    state,
                })
                .set(i64::from(value));
        }
        let current = rollout_state(&status);
        for state in RolloutState::ALL {
            self.state
                .get_or_create(&CountLabels {
                    hostedclusterpackage: name.clone(),
                    state: state.label(),
                })
                .set(i64::from(state == current));
        }
        let started = find_condition(&status.conditions, PROGRESSING)
            .filter(|c| c.status == "True")
            .map(|c| c.last_transition_time.0.as_second());
        let key = NameLabels {
            hostedclusterpackage: name,
        };
        let total = usize::try_from(status.counts.total_packages).unwrap_or(0);
        let budget = match rollout_settings(hcpkg).map(|s| s.strategy.resolve(total)) {
            Ok(RolloutStrategy::RollingUpgrade { max_unavailable }) => max_unavailable,
            Ok(RolloutStrategy::Instant) | Err(_) => 0,
        };
        self.max_unavailable
            .get_or_create(&key)
            .set(i64::try_from(budget).unwrap_or(i64::MAX));
        match started {
            Some(at) => {
                self.started.get_or_create(&key).set(at);
            }
            None => {
                self.started.remove(&key);
            }
        }
    }

    /// A HostedClusterPackage is gone.
    pub fn forget(&self, name: &str) {
        self.preflight.forget(name);
        self.updates_refused.remove(&NameLabels {
            hostedclusterpackage: name.to_owned(),
        });
        for outcome in ["written", "held"] {
            self.status_changes.remove(&StatusChangeLabels {
                hostedclusterpackage: name.to_owned(),
                outcome,
            });
        }
        for (state, _) in COUNTS {
            self.packages.remove(&CountLabels {
                hostedclusterpackage: name.to_owned(),
                state,
            });
        }
        if let Some((_, groups)) = self.partitions.remove(name) {
            for group in groups {
                self.remove_partition(name, &group);
            }
        }
        for state in RolloutState::ALL {
            self.state.remove(&CountLabels {
                hostedclusterpackage: name.to_owned(),
                state: state.label(),
            });
        }
        for state in ["waiting_for_window", "skipped", "unknown_window"] {
            self.held.remove(&CountLabels {
                hostedclusterpackage: name.to_owned(),
                state,
            });
        }
        for result in ["passing", "failing", "unknown"] {
            self.health_checks.remove(&HealthCheckLabels {
                hostedclusterpackage: name.to_owned(),
                result,
            });
        }
        let key = NameLabels {
            hostedclusterpackage: name.to_owned(),
        };
        self.started.remove(&key);
        self.max_unavailable.remove(&key);
    }

    fn remove_partition(&self, name: &str, partition: &str) {
        for (state, _) in &COUNTS[..5] {
            self.partition_packages.remove(&PartitionLabels {
                hostedclusterpackage: name.to_owned(),
                partition: partition.to_owned(),
                state,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_partitions_and_state_follow_the_status_and_go_with_the_object() {
        let hcpkg: HostedClusterPackage = serde_json::from_value(serde_json::json!({
            "apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
            "metadata": {"name": "addon"},
            "spec": {"template": {"spec": {"image": "r/p:v1"}}},
            "status": {
                "totalPackages": 3, "updatedPackages": 1, "inFlightPackages": 1,
                "conditions": [{"type": "Progressing", "status": "True", "reason": "R", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "partitions": [{"name": "low", "order": 0, "totalPackages": 2, "updatedPackages": 1,
                    "waitingForWindow": 1}],
                "skipped": [{"namespace": "clusters-x", "until": "2026-01-02T00:00:00Z", "reason": "r"},
                    {"namespace": "clusters-y", "reason": "names window \"never\""}],
            },
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let metrics = RolloutMetrics::default();
        metrics.hosted_cluster_package(&hcpkg);
        let encode =
            || crate::runtime::runtime_metrics::encoded(|registry| metrics.register(registry));
        let text = encode();
        for line in [
            r#"pko_hostedclusterpackage_packages{hostedclusterpackage="addon",state="total"} 3"#,
            r#"pko_hostedclusterpackage_packages{hostedclusterpackage="addon",state="in_flight"} 1"#,
            r#"pko_hostedclusterpackage_partition_packages{hostedclusterpackage="addon",partition="low",state="updated"} 1"#,
            r#"pko_hostedclusterpackage_rollout_state{hostedclusterpackage="addon",state="progressing"} 1"#,
            r#"pko_hostedclusterpackage_rollout_state{hostedclusterpackage="addon",state="finished"} 0"#,
            r#"pko_hostedclusterpackage_held_packages{hostedclusterpackage="addon",state="waiting_for_window"} 1"#,
            r#"pko_hostedclusterpackage_held_packages{hostedclusterpackage="addon",state="skipped"} 1"#,
            r#"pko_hostedclusterpackage_held_packages{hostedclusterpackage="addon",state="unknown_window"} 1"#,
            r#"pko_hostedclusterpackage_held_packages{hostedclusterpackage="addon",state="skipped"} 1"#,
            r#"pko_hostedclusterpackage_rollout_started_timestamp_seconds{hostedclusterpackage="addon"} 1767225600"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        metrics.forget("addon");
        assert!(!encode().contains("addon"));
    }
}

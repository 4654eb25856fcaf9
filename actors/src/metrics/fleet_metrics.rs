//! The fleet of management clusters, as this manager sees its hub: whether the hub answers, the records it
//! writes there, and the promotion gates of the rollouts it runs. Labelled by HostedClusterPackage name
//! only for the gates (one series per gated rollout).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GateLabels {
    hosted_cluster_package: String,
}

/// Cheap to clone.
#[derive(Clone, Default)]
pub struct FleetMetrics {
    hub_reachable: Gauge,
    record_writes: Family<ResultLabels, Counter>,
    gate_open: Family<GateLabels, Gauge>,
}

impl FleetMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "pko_fleet_hub_reachable",
            "1 while the fleet's hub NATS answers this manager, 0 while it does not (gates stay closed).",
            self.hub_reachable.clone(),
        );
        registry.register(
            "pko_fleet_record_writes",
            "Cluster and rollout records written to the hub, by result (ok, failed).",
            self.record_writes.clone(),
        );
        registry.register(
            "pko_fleet_promotion_gate_open",
            "1 while a HostedClusterPackage's promotion gate is open for its template, 0 while closed.",
            self.gate_open.clone(),
        );
    }

    pub fn hub_reachable(&self, reachable: bool) {
        self.hub_reachable.set(i64::from(reachable));
    }

    pub fn record_written(&self, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.record_writes
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    pub fn gate(&self, hosted_cluster_package: &str, open: Option<bool>) {
        let labels = GateLabels {
            hosted_cluster_package: hosted_cluster_package.to_owned(),
        };
        match open {
            Some(open) => {
                self.gate_open.get_or_create(&labels).set(i64::from(open));
            }
            None => {
                self.gate_open.remove(&labels);
            }
        }
    }
}

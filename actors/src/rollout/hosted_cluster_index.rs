//! The HostedClusters that HostedClusterPackages choose from, kept from the HostedCluster feed. A change of
//! a cluster reaches only the HostedClusterPackages whose selector matches the cluster before or after the
//! change: the index is not re-evaluated for every package on every event. Packages read their
//! `.environment.hyperShift` from it too, instead of each listing every HostedCluster.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use dashmap::DashMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use pko_proto::hypershift::HostedCluster;

use actix::prelude::*;

use crate::engine::hypershift::hosted_teardown::HostedClusterPresence;
use crate::engine::label_selector::selector_matches;
use crate::fleet::hub_link::HubLink;
use crate::rollout::health_queries::PrometheusQueries;
use crate::rollout::rollout_publisher::RolloutPublisher;

/// A selected HostedCluster changed (or the index became complete).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SelectionChanged;

/// What the HostedClusterPackage supervisors share: the HostedCluster index and the event publisher.
#[derive(Clone, Default)]
pub struct RolloutShared {
    pub clusters: Arc<HostedClusterIndex>,
    pub publisher: Option<Arc<RolloutPublisher>>,
    /// Names this management cluster in events.
    pub source: String,
    /// The fleet's hub, when this management cluster is in a fleet: promotion gates read it and the
    /// rollouts report to it.
    pub hub: Option<Arc<HubLink>>,
    /// Where rollout health checks query, when configured.
    pub prometheus: Option<PrometheusQueries>,
}

/// What one supervisor selects, and where to tell it that its selection changed.
struct Selection {
    selector: LabelSelector,
    supervisor: Recipient<SelectionChanged>,
}

type ClusterKey = (String, String);

fn key(cluster: &HostedCluster) -> ClusterKey {
    (
        cluster.metadata.namespace.clone().unwrap_or_default(),
        cluster.metadata.name.clone().unwrap_or_default(),
    )
}

fn matches(selector: &LabelSelector, cluster: &HostedCluster) -> bool {
    let empty = BTreeMap::new();
    let labels = cluster.metadata.labels.as_ref().unwrap_or(&empty);
    selector_matches(selector, labels).unwrap_or(false)
}

/// Every HostedCluster, and which HostedClusterPackage selects by what.
pub struct HostedClusterIndex {
    /// Shared, not copied: every HostedClusterPackage reconcile takes the clusters it selects.
    clusters: DashMap<ClusterKey, Arc<HostedCluster>>,
    selections: DashMap<String, Selection>,
    /// True once the index is complete (listed, or known to be empty): planning on a partial index would
    /// delete the Packages of clusters not seen yet, and rendering a package before its cluster is seen
    /// would leave out `.environment.hyperShift.hostedCluster`.
    ready: watch::Sender<bool>,
    /// Whether the HostedCluster API is served (else packages get no `.environment.hyperShift`).
    api_served: AtomicBool,
}

impl Default for HostedClusterIndex {
    fn default() -> Self {
        Self {
            clusters: DashMap::new(),
            selections: DashMap::new(),
            ready: watch::Sender::new(false),
            api_served: AtomicBool::new(false),
        }
    }
}

impl HostedClusterIndex {
    /// A cluster changed (or was deleted): remember it and wake the HostedClusterPackages it concerns.
    pub fn observe(&self, cluster: &HostedCluster, deleted: bool) {
        let key = key(cluster);
        let previous = if deleted {
            self.clusters.remove(&key).map(|(_, c)| c)
        } else {
            self.clusters.insert(key, Arc::new(cluster.clone()))
        };
        for entry in self.selections.iter() {
            let selector = &entry.value().selector;
            let concerned = matches(selector, cluster)
                || previous.as_ref().is_some_and(|p| matches(selector, p));
            if concerned {
                entry.value().supervisor.do_send(SelectionChanged);
            }
        }
    }

    /// Fills the index from a LIST (before the feed starts), or with nothing when the HostedCluster API
    /// is not served (`None`), and marks it complete; every HostedClusterPackage and package render
    /// waiting for it is woken.
    pub fn seed(&self, clusters: Option<Vec<HostedCluster>>) {
        let served = clusters.is_some();
        for cluster in clusters.into_iter().flatten() {
            self.clusters
                .entry(key(&cluster))
                .or_insert_with(|| Arc::new(cluster));
        }
        if served {
            self.api_served.store(true, Ordering::SeqCst);
        }
        self.ready.send_replace(true);
        for entry in self.selections.iter() {
            entry.value().supervisor.do_send(SelectionChanged);
        }
    }

    /// Whether the index is complete.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Whether a HostedCluster has `hcp_namespace` as its HCP namespace; unknown while the index is not
    /// complete or the HostedCluster API is not served.
    pub fn presence(&self, hcp_namespace: &str) -> HostedClusterPresence {
        if !self.is_ready() || !self.api_served.load(Ordering::SeqCst) {
            return HostedClusterPresence::Unknown;
        }
        let hosts = self
            .clusters
            .iter()
            .any(|c| c.value().hosted_control_plane_namespace().as_deref() == Some(hcp_namespace));
        if hosts {
            HostedClusterPresence::Present
        } else {
            HostedClusterPresence::Gone
        }
    }

    /// The UID of the HostedCluster whose HCP namespace is `hcp_namespace`, if one is known.
    pub fn cluster_uid(&self, hcp_namespace: &str) -> Option<String> {
        self.clusters.iter().find_map(|c| {
            (c.value().hosted_control_plane_namespace().as_deref() == Some(hcp_namespace))
                .then(|| c.value().metadata.uid.clone())
                .flatten()
        })
    }

    /// What `.environment.hyperShift` of a package in `hcp_namespace` is made from, once the index is
    /// complete: `None` without the HostedCluster API; else the HostedCluster whose HCP namespace that
    /// is, if any (none for a ClusterPackage, `hcp_namespace: None`).
    pub async fn hosted_cluster_for(
        &self,
        hcp_namespace: Option<&str>,
    ) -> Option<Vec<HostedCluster>> {
        let mut ready = self.ready.subscribe();
        // The sender lives as long as the index, which outlives every package render.
        let _ = ready.wait_for(|complete| *complete).await;
        if !self.api_served.load(Ordering::SeqCst) {
            return None;
        }
        let Some(ns) = hcp_namespace else {
            return Some(Vec::new());
        };
        Some(
            self.clusters
                .iter()
                .find(|c| c.value().hosted_control_plane_namespace().as_deref() == Some(ns))
                .map(|c| HostedCluster::clone(c.value()))
                .into_iter()
                .collect(),
        )
    }

    /// Records what `hcpkg` selects, so changes of matching clusters reach its `supervisor`.
    pub fn set_selector(
        &self,
        hcpkg: &str,
        selector: &LabelSelector,
        supervisor: Recipient<SelectionChanged>,
    ) {
        self.selections.insert(
            hcpkg.to_owned(),
            Selection {
                selector: selector.clone(),
                supervisor,
            },
        );
    }

    pub fn remove_selector(&self, hcpkg: &str) {
        self.selections.remove(hcpkg);
    }

    /// The clusters `selector` matches.
    pub fn selected(&self, selector: &LabelSelector) -> Vec<Arc<HostedCluster>> {
        self.clusters
            .iter()
            .filter(|c| matches(selector, c.value()))
            .map(|c| c.value().clone())
            .collect()
    }
}

//! The HostedClusters that HostedClusterPackages choose from, kept from the HostedCluster feed. A change of
//! a cluster reaches only the HostedClusterPackages whose selector matches the cluster before or after the
//! change: the fleet is not re-evaluated for every package on every event.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use pko_proto::hypershift::HostedCluster;

use crate::engine::label_selector::selector_matches;
use crate::hosted_cluster_package_actor::{FleetChanged, HostedClusterPackageActor};
use crate::registry::{ObjectRef, Registry};

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
#[derive(Default)]
pub struct Fleet {
    clusters: DashMap<ClusterKey, HostedCluster>,
    selectors: DashMap<String, LabelSelector>,
    packages: Arc<Registry<HostedClusterPackageActor>>,
    /// Set once the fleet is complete (listed, or known to be empty): planning on a partial fleet would
    /// delete the Packages of clusters not seen yet.
    ready: AtomicBool,
}

impl Fleet {
    /// The HostedClusterPackage actors, by object: the feed of HostedClusterPackages starts them here.
    pub fn registry(&self) -> Arc<Registry<HostedClusterPackageActor>> {
        self.packages.clone()
    }

    /// A cluster changed (or was deleted): remember it and wake the HostedClusterPackages it concerns.
    pub fn observe(&self, cluster: &HostedCluster, deleted: bool) {
        let key = key(cluster);
        let previous = if deleted {
            self.clusters.remove(&key).map(|(_, c)| c)
        } else {
            self.clusters.insert(key, cluster.clone())
        };
        for entry in self.selectors.iter() {
            let concerned = matches(entry.value(), cluster)
                || previous.as_ref().is_some_and(|p| matches(entry.value(), p));
            if concerned {
                self.wake(entry.key());
            }
        }
    }

    fn wake(&self, hcpkg: &str) {
        let owner = ObjectRef {
            kind: "HostedClusterPackage",
            namespace: String::new(),
            name: hcpkg.to_owned(),
        };
        if let Some(addr) = self.packages.get(&owner) {
            addr.do_send(FleetChanged);
        }
    }

    /// Fills the fleet from a LIST (before the feed starts) and marks it complete; every
    /// HostedClusterPackage waiting for it is woken.
    pub fn seed(&self, clusters: Vec<HostedCluster>) {
        for cluster in clusters {
            self.clusters.entry(key(&cluster)).or_insert(cluster);
        }
        self.ready.store(true, Ordering::SeqCst);
        for entry in self.selectors.iter() {
            self.wake(entry.key());
        }
    }

    /// Whether the fleet is complete.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Records what `hcpkg` selects, so changes of matching clusters reach it.
    pub fn set_selector(&self, hcpkg: &str, selector: &LabelSelector) {
        self.selectors.insert(hcpkg.to_owned(), selector.clone());
    }

    pub fn remove_selector(&self, hcpkg: &str) {
        self.selectors.remove(hcpkg);
    }

    /// The clusters `selector` matches.
    pub fn selected(&self, selector: &LabelSelector) -> Vec<HostedCluster> {
        self.clusters
            .iter()
            .filter(|c| matches(selector, c.value()))
            .map(|c| c.value().clone())
            .collect()
    }
}

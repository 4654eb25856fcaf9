//! What the manager's planner reads of one HostedClusterPackage's fleet: the object with its status, the
//! HostedClusters it selects, and its Packages. Read from the cluster (`rollout plan`, `rollout
//! simulate`) or from a file `rollout simulate --save` wrote, so a fleet can be simulated elsewhere and
//! later.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use kube::api::ListParams;
use kube::{Api, Client};
use pko_engine::label_selector::selector_matches;
use pko_engine::rollout::hosted_cluster_package::OwnedPackage;
use pko_engine::rollout::rollout_decision::{GateInput, RolloutSnapshot};
use pko_engine::rollout::rollout_guard;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::package::Package;
use pko_proto::hypershift::HostedCluster;
use pko_proto::well_known::HOSTED_CLUSTER_PACKAGE_LABEL;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetSnapshot {
    pub hosted_cluster_package: HostedClusterPackage,
    /// The HostedClusters its selector selects, in the apiserver's order.
    pub hosted_clusters: Vec<HostedCluster>,
    pub packages: Vec<Package>,
}

impl FleetSnapshot {
    /// HostedClusterPackage `name`'s fleet as the apiserver holds it now.
    pub async fn read(client: &Client, name: &str) -> Result<Self, String> {
        let mut hcpkg = Api::<HostedClusterPackage>::all(client.clone())
            .get(name)
            .await
            .map_err(|e| format!("hostedclusterpackage/{name}: {e}"))?;
        hcpkg.metadata.managed_fields = None;
        let selector = &hcpkg.spec.hosted_cluster_selector;
        let empty = BTreeMap::new();
        let hosted_clusters = Api::<HostedCluster>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing HostedClusters: {e}"))?
            .items
            .into_iter()
            .filter(|c| {
                selector_matches(selector, c.metadata.labels.as_ref().unwrap_or(&empty))
                    .unwrap_or(false)
            })
            .map(|mut c| {
                c.metadata.managed_fields = None;
                c
            })
            .collect();
        let owned = ListParams::default().labels(&format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={name}"));
        let packages = Api::<Package>::all(client.clone())
            .list(&owned)
            .await
            .map_err(|e| format!("listing the Packages of {name}: {e}"))?
            .items
            .into_iter()
            .map(|mut p| {
                p.metadata.managed_fields = None;
                p
            })
            .collect();
        Ok(Self {
            hosted_cluster_package: hcpkg,
            hosted_clusters,
            packages,
        })
    }

    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a saved fleet: {e}", path.display()))
    }

    pub fn save(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// What the planner decides on: the gate taken as open, health checks at their last results.
    pub fn rollout_snapshot(self) -> RolloutSnapshot {
        let health = self
            .hosted_cluster_package
            .status
            .as_ref()
            .map(rollout_guard::stored_observations)
            .unwrap_or_default();
        let packages = self
            .packages
            .into_iter()
            .map(OwnedPackage::from)
            .map(|p| (p.meta.namespace.clone().unwrap_or_default(), Arc::new(p)))
            .collect();
        RolloutSnapshot {
            hcpkg: self.hosted_cluster_package,
            packages,
            writing: BTreeMap::new(),
            clusters: {
                // The manager's order (`HostedClusterIndex::selected`): namespace, then name.
                let mut clusters = self.hosted_clusters;
                clusters.sort_by(|a, b| {
                    let key =
                        |c: &HostedCluster| (c.metadata.namespace.clone(), c.metadata.name.clone());
                    key(a).cmp(&key(b))
                });
                clusters.into_iter().map(Arc::new).collect()
            },
            failures: BTreeMap::new(),
            // What happens once a promotion gate (if any) is open.
            gate: GateInput::Preview,
            // Health checks are the manager's to evaluate: the preview takes their last results.
            health,
            // The preflight the manager last finished, as the status keeps it.
            preflight: None,
        }
    }
}

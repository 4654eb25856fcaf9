//! What a HostedClusterPackage's rollout decision reads of each HostedCluster it selects, so that a change
//! of anything else (a label no rule names, a status field the rollout ignores) does not wake its
//! supervisor. With ten add-ons over hundreds of clusters, waking every matching supervisor on every
//! HostedCluster event cost ten fleet-wide decisions per event (issue 64).
//!
//! It must name everything `rollout_decision` reads of a cluster besides whether the selector matches
//! (which the HostedCluster index compares itself): the property test below holds it to that.
//!
//! Pure: no I/O, no clock.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::hypershift::HostedCluster;
use pko_proto::well_known::MAINTENANCE_WINDOW_LABEL;

use crate::rollout::hosted_cluster_package::{rollout_settings, OwnedPackage};
use crate::rollout::preflight_gate::hashes_targets;

/// The parts of a selected HostedCluster one HostedClusterPackage's decision depends on. Always: its UID
/// and whether it is Available (the rollout creates Packages only on Available clusters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterReads {
    /// The label keys the decision reads: the partition key, the maintenance window label, the keys of
    /// the skip selectors. `None`: every label.
    labels: Option<BTreeSet<String>>,
    /// Whether it reads what a package render shows of the cluster (name, labels, annotations, node
    /// selector): while the preflight hashes its targets.
    rendered: bool,
}

impl ClusterReads {
    /// Every part: when what is read cannot be worked out yet (the owned Packages are not listed, or the
    /// spec is invalid).
    pub fn everything() -> Self {
        Self {
            labels: None,
            rendered: true,
        }
    }

    /// What a decision on `hcpkg` reads, with `packages` the Packages it owns (`None`: not listed yet).
    pub fn of(
        hcpkg: &HostedClusterPackage,
        packages: Option<&BTreeMap<String, Arc<OwnedPackage>>>,
    ) -> Self {
        let (Some(packages), Ok(settings)) = (packages, rollout_settings(hcpkg)) else {
            return Self::everything();
        };
        let mut labels = BTreeSet::from([MAINTENANCE_WINDOW_LABEL.to_owned()]);
        labels.extend(settings.partition.map(|(key, _)| key));
        for skip in &settings.calendar.skips {
            labels.extend(skip.selector.iter().flat_map(selector_keys));
        }
        Self {
            labels: Some(labels),
            rendered: hashes_targets(hcpkg, packages),
        }
    }

    /// Whether a decision could come out different for `after` than for `before` (the same cluster,
    /// selected both times).
    pub fn differ(&self, before: &HostedCluster, after: &HostedCluster) -> bool {
        let (b, a) = (&before.metadata, &after.metadata);
        if b.uid != a.uid || before.is_available() != after.is_available() {
            return true;
        }
        let labels_differ = match &self.labels {
            None => b.labels != a.labels,
            Some(keys) => keys.iter().any(|k| label(before, k) != label(after, k)),
        };
        labels_differ
            || self.rendered
                && (b.name != a.name
                    || b.labels != a.labels
                    || b.annotations != a.annotations
                    || node_selector(before) != node_selector(after))
    }
}

fn label<'c>(cluster: &'c HostedCluster, key: &str) -> Option<&'c String> {
    cluster.metadata.labels.as_ref()?.get(key)
}

fn node_selector(cluster: &HostedCluster) -> Option<&serde_json::Value> {
    cluster.spec.as_ref()?.get("nodeSelector")
}

fn selector_keys(selector: &LabelSelector) -> impl Iterator<Item = String> + '_ {
    let matched = selector.match_labels.iter().flat_map(|m| m.keys().cloned());
    let expressed = selector
        .match_expressions
        .iter()
        .flatten()
        .map(|e| e.key.clone());
    matched.chain(expressed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::fleet::promotion_gate::package_template_hash;
    use crate::rollout::preflight_gate::passed_preflight;
    use crate::rollout::rollout_decision::{decide_rollout, GateInput, RolloutSnapshot};
    use k8s_openapi::jiff::Timestamp;
    use pko_proto::core::package::Package;
    use pko_proto::well_known::ROLLOUT_PREFLIGHT_REQUEST_ANNOTATION;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    const KEYS: [&str; 5] = ["risk", "region", "tier", MAINTENANCE_WINDOW_LABEL, "noise"];
    const VALUES: [&str; 3] = ["early", "late", "nightly"];

    /// Partitioned by `risk`, nightly window, clusters labelled `tier: frozen` skipped.
    fn hcpkg(image: &str, annotations: Value) -> HostedClusterPackage {
        serde_json::from_value(json!({
            "apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
            "metadata": {"name": "addon", "uid": "u-1", "generation": 2, "annotations": annotations},
            "spec": {
                "template": {"spec": {"image": image}},
                "strategy": {"rollingUpgrade": {"maxUnavailable": 1}},
                "partition": {"labelKey": "risk", "order": {"static": ["early", "late"]}},
                "rolloutPolicy": {
                    "maintenanceWindows": [{"name": "nightly", "schedule": "0 2 * * *", "duration": "1h"}],
                    "skip": [{"selector": {"matchExpressions": [
                        {"key": "tier", "operator": "In", "values": ["nightly"]}]},
                        "until": "2027-01-01T00:00:00Z", "reason": "frozen"}],
                },
            },
        }))
        .unwrap()
    }

    #[derive(Debug, Clone)]
    struct Cluster {
        labels: BTreeMap<String, String>,
        annotation: Option<String>,
        available: bool,
    }

    fn hosted_cluster(i: usize, c: &Cluster) -> Arc<HostedCluster> {
        let status = if c.available { "True" } else { "False" };
        let annotations: BTreeMap<&str, &String> =
            c.annotation.iter().map(|a| ("note", a)).collect();
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
                "metadata": {"name": format!("c{i}"), "namespace": "clusters", "uid": format!("u{i}"),
                    "labels": c.labels, "annotations": annotations},
                "status": {"conditions": [{"type": "Available", "status": status, "reason": "R",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
            }))
            .unwrap(),
        )
    }

    fn live(i: usize, image: &str) -> Arc<OwnedPackage> {
        let condition = |type_: &str, status: &str| {
            json!({"type": type_, "status": status, "reason": "R", "message": "",
                   "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"})
        };
        let p: Package = serde_json::from_value(json!({
            "apiVersion": "package-operator.run/v1alpha1", "kind": "Package",
            "metadata": {"name": "addon", "namespace": format!("clusters-c{i}"), "uid": format!("p{i}"),
                "generation": 1},
            "spec": {"image": image},
            "status": {"conditions": [condition("Available", "True"), condition("Progressing", "False")]},
        }))
        .unwrap();
        Arc::new(p.into())
    }

    fn cluster() -> impl Strategy<Value = Cluster> {
        let label = (0..KEYS.len(), 0..VALUES.len());
        (
            proptest::collection::vec(label, 0..4),
            proptest::option::of("[ab]"),
            proptest::bool::weighted(0.8),
        )
            .prop_map(|(labels, annotation, available)| Cluster {
                labels: labels
                    .into_iter()
                    .map(|(k, v)| (KEYS[k].to_owned(), VALUES[v].to_owned()))
                    .collect(),
                annotation,
                available,
            })
    }

    /// One change of one cluster: set or remove a label, change the annotation, flip availability.
    #[derive(Debug, Clone)]
    enum Change {
        Label(usize, Option<usize>),
        Annotation(Option<String>),
        Availability,
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            4 => (0..KEYS.len(), proptest::option::of(0..VALUES.len()))
                .prop_map(|(k, v)| Change::Label(k, v)),
            1 => proptest::option::of("[ab]").prop_map(Change::Annotation),
            1 => Just(Change::Availability),
        ]
    }

    fn changed(c: &Cluster, change: &Change) -> Cluster {
        let mut c = c.clone();
        match change {
            Change::Label(k, Some(v)) => {
                c.labels.insert(KEYS[*k].to_owned(), VALUES[*v].to_owned());
            }
            Change::Label(k, None) => {
                c.labels.remove(KEYS[*k]);
            }
            Change::Annotation(a) => c.annotation = a.clone(),
            Change::Availability => c.available = !c.available,
        }
        c
    }

    fn snapshot(
        hcpkg: &HostedClusterPackage,
        clusters: &[Cluster],
        packages: &BTreeMap<String, Arc<OwnedPackage>>,
    ) -> RolloutSnapshot {
        RolloutSnapshot {
            hcpkg: hcpkg.clone(),
            packages: packages.clone(),
            writing: BTreeMap::new(),
            clusters: clusters
                .iter()
                .enumerate()
                .map(|(i, c)| hosted_cluster(i, c))
                .collect(),
            failures: BTreeMap::new(),
            gate: GateInput::Preview,
            health: BTreeMap::new(),
            preflight: Some(passed_preflight(&package_template_hash(&hcpkg.spec))),
        }
    }

    proptest! {
        /// A change `differ` calls unread leaves the decision as it was, in every fleet: the supervisor
        /// it does not wake would have decided the same. Fleets mix Packages on the old and the new
        /// image, with and without a preflight request, and every label the policy reads.
        #[test]
        fn a_change_called_unread_decides_the_same(
            fleet in proptest::collection::vec((cluster(), proptest::option::of(proptest::bool::ANY)), 1..6),
            which in 0usize..6,
            change in change(),
            requested in proptest::bool::ANY,
            hour in 0u32..24,
        ) {
            let annotations = if requested {
                json!({ROLLOUT_PREFLIGHT_REQUEST_ANNOTATION: "r1"})
            } else {
                json!({})
            };
            let hcpkg = hcpkg("registry/addon:v2", annotations);
            let clusters: Vec<Cluster> = fleet.iter().map(|(c, _)| c.clone()).collect();
            let packages: BTreeMap<String, Arc<OwnedPackage>> = fleet
                .iter()
                .enumerate()
                .filter_map(|(i, (_, p))| {
                    let image = if (*p)? { "registry/addon:v2" } else { "registry/addon:v1" };
                    Some((format!("clusters-c{i}"), live(i, image)))
                })
                .collect();
            let which = which % clusters.len();
            let mut after = clusters.clone();
            after[which] = changed(&clusters[which], &change);
            let reads = ClusterReads::of(&hcpkg, Some(&packages));
            let now: Timestamp = format!("2026-03-01T{hour:02}:30:00Z").parse().unwrap();
            if !reads.differ(&hosted_cluster(which, &clusters[which]), &hosted_cluster(which, &after[which])) {
                prop_assert_eq!(
                    decide_rollout(&snapshot(&hcpkg, &clusters, &packages), now),
                    decide_rollout(&snapshot(&hcpkg, &after, &packages), now)
                );
            }
        }
    }

    /// What is read follows the spec and the Packages: a settled rollout ignores unread labels and
    /// annotations; one with a Package to update reads what a render shows too.
    #[test]
    fn only_what_the_policy_and_the_preflight_read_counts() {
        let base = Cluster {
            labels: BTreeMap::from([("risk".to_owned(), "early".to_owned())]),
            annotation: None,
            available: true,
        };
        let with = |change: Change| hosted_cluster(0, &changed(&base, &change));
        let before = hosted_cluster(0, &base);
        let hcpkg = hcpkg("registry/addon:v2", json!({}));
        let settled = BTreeMap::from([("clusters-c0".to_owned(), live(0, "registry/addon:v2"))]);
        let reads = ClusterReads::of(&hcpkg, Some(&settled));
        assert!(!reads.differ(&before, &with(Change::Label(4, Some(0)))));
        assert!(!reads.differ(&before, &with(Change::Label(1, Some(0)))));
        assert!(!reads.differ(&before, &with(Change::Annotation(Some("a".into())))));
        for read in [0, 2, 3] {
            assert!(
                reads.differ(&before, &with(Change::Label(read, Some(1)))),
                "{}",
                KEYS[read]
            );
        }
        assert!(reads.differ(&before, &with(Change::Availability)));

        let updating = BTreeMap::from([("clusters-c0".to_owned(), live(0, "registry/addon:v1"))]);
        let reads = ClusterReads::of(&hcpkg, Some(&updating));
        assert!(reads.differ(&before, &with(Change::Label(4, Some(0)))));
        assert!(reads.differ(&before, &with(Change::Annotation(Some("a".into())))));

        let unlisted = ClusterReads::of(&hcpkg, None);
        assert_eq!(unlisted, ClusterReads::everything());
        assert!(unlisted.differ(&before, &with(Change::Label(4, Some(0)))));
    }
}

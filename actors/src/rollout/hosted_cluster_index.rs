//! The HostedClusters that HostedClusterPackages choose from, kept from the HostedCluster feed. A change of
//! a cluster reaches only the HostedClusterPackages it concerns: those it joins or leaves, and those that
//! select it and read what changed (`engine::rollout::cluster_reads`); the index is not re-evaluated for
//! every package on every event. Packages read their
//! `.environment.hyperShift` from it too, instead of each listing every HostedCluster.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use dashmap::DashMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use pko_proto::hypershift::{hosted_control_plane_namespace, HostedCluster};

use actix::prelude::*;

use crate::engine::hypershift::hosted_teardown::HostedClusterPresence;
use crate::engine::label_selector::selector_matches;
use crate::engine::rollout::cluster_reads::ClusterReads;
use crate::fleet::hub_link::HubLink;
use crate::notifications::notification_sinks::NotificationSinks;
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
    /// How release preflights run.
    pub preflight: PreflightSettings,
    /// The CloudEvents sinks, when rollout events are published (NATS).
    pub sinks: Option<Arc<NotificationSinks>>,
}

/// How release preflights run (`--preflight-*` flags).
#[derive(Clone, Debug)]
pub struct PreflightSettings {
    /// The namespace reports are kept in (the manager's own).
    pub report_namespace: String,
    /// How long the pull of a release's image may take before its namespaces are left unchecked: a
    /// registry that never answers must not hold a rollout forever.
    pub pull_timeout: std::time::Duration,
}

impl Default for PreflightSettings {
    fn default() -> Self {
        Self {
            report_namespace: "package-operator-system".to_owned(),
            pull_timeout: std::time::Duration::from_secs(30),
        }
    }
}

/// What one supervisor selects and reads of what it selects, and where to tell it that its selection
/// changed.
struct Selection {
    selector: LabelSelector,
    reads: ClusterReads,
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

/// Told the HCP namespace of a HostedCluster the index has just learnt of (from the feed, or the LIST
/// when the HostedCluster API appears after the manager started).
pub type ArrivalHook = Arc<dyn Fn(&str) + Send + Sync>;

/// Every HostedCluster, and which HostedClusterPackage selects by what.
pub struct HostedClusterIndex {
    /// Shared, not copied: every HostedClusterPackage reconcile takes the clusters it selects.
    clusters: DashMap<ClusterKey, Arc<HostedCluster>>,
    /// The clusters by HCP namespace (a function of the key, so set once per cluster): every Package,
    /// phase and template of a HostedCluster looks its cluster up by the namespace it lives in, and a
    /// scan of the fleet each time made a fleet's arrival quadratic. A set, because two keys can name
    /// the same namespace (`a-b`/`c` and `a`/`b-c`); the first one is the one used.
    by_hcp_namespace: DashMap<String, BTreeSet<ClusterKey>>,
    selections: DashMap<String, Selection>,
    /// True once the index is complete (listed, or known to be empty): planning on a partial index would
    /// delete the Packages of clusters not seen yet, and rendering a package before its cluster is seen
    /// would leave out `.environment.hyperShift.hostedCluster`.
    ready: watch::Sender<bool>,
    /// Whether the HostedCluster API is served (else packages get no `.environment.hyperShift`).
    api_served: AtomicBool,
    /// What renders `.environment.hyperShift` again in a namespace whose cluster arrived: a Package
    /// rendered there before the index knew the cluster was rendered without it.
    arrival: std::sync::OnceLock<ArrivalHook>,
}

impl Default for HostedClusterIndex {
    fn default() -> Self {
        Self {
            clusters: DashMap::new(),
            by_hcp_namespace: DashMap::new(),
            selections: DashMap::new(),
            ready: watch::Sender::new(false),
            api_served: AtomicBool::new(false),
            arrival: std::sync::OnceLock::new(),
        }
    }
}

impl HostedClusterIndex {
    /// Sets what is told of each arrival (once; the actor tree sets it before any feed starts).
    pub fn on_arrival(&self, hook: ArrivalHook) {
        let _ = self.arrival.set(hook);
    }

    /// A cluster changed (or was deleted): remember it and wake the HostedClusterPackages it concerns.
    pub fn observe(&self, cluster: &HostedCluster, deleted: bool) {
        let key = key(cluster);
        let previous = if deleted {
            self.forget_hcp_namespace(&key);
            self.clusters.remove(&key).map(|(_, c)| c)
        } else {
            self.index_hcp_namespace(&key);
            self.clusters.insert(key.clone(), Arc::new(cluster.clone()))
        };
        if !deleted && previous.is_none() {
            self.arrived(&key);
        }
        for entry in self.selections.iter() {
            let selection = entry.value();
            let selected = matches(&selection.selector, cluster);
            let concerned = match &previous {
                None => selected,
                Some(p) => match (matches(&selection.selector, p), selected) {
                    (true, true) if !deleted => selection.reads.differ(p, cluster),
                    (was, is) => was || is,
                },
            };
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
        // Renders wait for the first seed, so only a later one (the API appeared after the manager
        // started) has renders to redo.
        let late = self.is_ready();
        let mut arrived = Vec::new();
        for cluster in clusters.into_iter().flatten() {
            let key = key(&cluster);
            self.index_hcp_namespace(&key);
            if let dashmap::Entry::Vacant(entry) = self.clusters.entry(key.clone()) {
                entry.insert(Arc::new(cluster));
                if late {
                    arrived.push(key);
                }
            }
        }
        if served {
            self.api_served.store(true, Ordering::SeqCst);
        }
        // After `api_served`: a render the hook starts must see the API.
        for key in &arrived {
            self.arrived(key);
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
        if self.hosting(hcp_namespace).is_some() {
            HostedClusterPresence::Present
        } else {
            HostedClusterPresence::Gone
        }
    }

    /// The UID of the HostedCluster whose HCP namespace is `hcp_namespace`, if one is known.
    pub fn cluster_uid(&self, hcp_namespace: &str) -> Option<String> {
        self.hosting(hcp_namespace)?.metadata.uid.clone()
    }

    /// The HostedCluster whose HCP namespace is `hcp_namespace`.
    fn hosting(&self, hcp_namespace: &str) -> Option<Arc<HostedCluster>> {
        let keys = self.by_hcp_namespace.get(hcp_namespace)?;
        let cluster = keys.iter().find_map(|key| self.clusters.get(key))?;
        Some(cluster.value().clone())
    }

    fn arrived(&self, key: &ClusterKey) {
        if let Some(hook) = self.arrival.get() {
            hook(&hosted_control_plane_namespace(&key.0, &key.1));
        }
    }

    fn index_hcp_namespace(&self, key: &ClusterKey) {
        self.by_hcp_namespace
            .entry(hosted_control_plane_namespace(&key.0, &key.1))
            .or_default()
            .insert(key.clone());
    }

    fn forget_hcp_namespace(&self, key: &ClusterKey) {
        let namespace = hosted_control_plane_namespace(&key.0, &key.1);
        self.by_hcp_namespace.remove_if_mut(&namespace, |_, keys| {
            keys.remove(key);
            keys.is_empty()
        });
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
            self.hosting(ns)
                .map(|c| HostedCluster::clone(&c))
                .into_iter()
                .collect(),
        )
    }

    /// Records what `hcpkg` selects and what its decisions read of the selected clusters, so the changes
    /// that concern it reach its `supervisor`.
    pub fn set_selector(
        &self,
        hcpkg: &str,
        selector: &LabelSelector,
        reads: ClusterReads,
        supervisor: Recipient<SelectionChanged>,
    ) {
        self.selections.insert(
            hcpkg.to_owned(),
            Selection {
                selector: selector.clone(),
                reads,
                supervisor,
            },
        );
    }

    pub fn remove_selector(&self, hcpkg: &str) {
        self.selections.remove(hcpkg);
    }

    /// The clusters `selector` matches.
    pub fn selected(&self, selector: &LabelSelector) -> Vec<Arc<HostedCluster>> {
        let mut selected: Vec<(ClusterKey, Arc<HostedCluster>)> = self
            .clusters
            .iter()
            .filter(|c| matches(selector, c.value()))
            .map(|c| (c.key().clone(), c.value().clone()))
            .collect();
        // In the apiserver's order (namespace, then name), not the map's: the planner takes a group's
        // Packages in this order, so which ones a wave updates is the same in every replica, after a
        // restart, and in `kubectl package rollout simulate`.
        selected.sort_by(|a, b| a.0.cmp(&b.0));
        selected.into_iter().map(|(_, c)| c).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn cluster(namespace: &str, name: &str, uid: &str) -> HostedCluster {
        HostedCluster {
            metadata: ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: None,
            status: None,
        }
    }

    /// Lookups by HCP namespace follow arrivals and deletions, including two clusters whose keys name the
    /// same namespace: deleting one leaves the other found.
    #[actix::test]
    async fn clusters_are_found_by_their_hcp_namespace() {
        let index = HostedClusterIndex::default();
        index.seed(Some(vec![cluster("clusters", "a.b", "uid-1")]));
        assert_eq!(index.cluster_uid("clusters-a-b").as_deref(), Some("uid-1"));
        assert_eq!(index.presence("clusters-a"), HostedClusterPresence::Gone);
        index.observe(&cluster("clusters-a", "b", "uid-2"), false);
        // Both: the first by key.
        assert_eq!(index.cluster_uid("clusters-a-b").as_deref(), Some("uid-1"));
        index.observe(&cluster("clusters", "a.b", "uid-1"), true);
        let found = index.hosted_cluster_for(Some("clusters-a-b")).await;
        let uids: Vec<_> = found
            .into_iter()
            .flatten()
            .filter_map(|c| c.metadata.uid)
            .collect();
        assert_eq!(uids, ["uid-2"]);
        index.observe(&cluster("clusters-a", "b", "uid-2"), true);
        assert_eq!(index.presence("clusters-a-b"), HostedClusterPresence::Gone);
        assert_eq!(
            index.hosted_cluster_for(Some("clusters-a-b")).await,
            Some(vec![])
        );
    }

    /// The selection comes in the apiserver's order whatever the map's, so every replica and the
    /// simulator take a group's Packages in the same order.
    #[actix::test]
    async fn a_selection_is_in_namespace_then_name_order() {
        let index = HostedClusterIndex::default();
        let names = ["m", "c", "x", "a", "q", "b", "z", "k"];
        index.seed(Some(
            names
                .iter()
                .enumerate()
                .map(|(i, n)| cluster(if i % 2 == 0 { "west" } else { "east" }, n, n))
                .collect(),
        ));
        let selected: Vec<(String, String)> = index
            .selected(&LabelSelector::default())
            .iter()
            .map(|c| {
                (
                    c.metadata.namespace.clone().unwrap(),
                    c.metadata.name.clone().unwrap(),
                )
            })
            .collect();
        let mut sorted = selected.clone();
        sorted.sort();
        assert_eq!(selected, sorted);
        assert_eq!(selected.len(), names.len());
    }

    /// The namespaces whose renders are stale are told: a cluster the feed brings, and every cluster of a
    /// LIST that comes after the index was complete (the API appeared later); the first seed, which
    /// renders wait for, and a known cluster's update tell nobody.
    #[actix::test]
    async fn arrivals_are_told_only_when_a_render_could_have_missed_the_cluster() {
        let index = HostedClusterIndex::default();
        let told = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let sink = told.clone();
        index.on_arrival(Arc::new(move |ns: &str| {
            sink.lock().unwrap().push(ns.to_owned())
        }));
        index.seed(Some(vec![cluster("clusters", "a", "uid-1")]));
        assert!(told.lock().unwrap().is_empty());
        index.observe(&cluster("clusters", "a", "uid-1"), false);
        assert!(told.lock().unwrap().is_empty());
        index.observe(&cluster("clusters", "b", "uid-2"), false);
        assert_eq!(*told.lock().unwrap(), ["clusters-b"]);

        let late = HostedClusterIndex::default();
        let sink = told.clone();
        late.on_arrival(Arc::new(move |ns: &str| {
            sink.lock().unwrap().push(ns.to_owned())
        }));
        late.seed(None);
        late.seed(Some(vec![cluster("clusters", "c", "uid-3")]));
        assert_eq!(*told.lock().unwrap(), ["clusters-b", "clusters-c"]);
        assert_eq!(
            late.hosted_cluster_for(Some("clusters-c"))
                .await
                .map(|c| c.len()),
            Some(1)
        );
    }

    /// Counts the wake-ups it is sent; `Count` answers after every wake-up sent before it (one mailbox).
    #[derive(Default)]
    struct Woken(usize);

    impl Actor for Woken {
        type Context = Context<Self>;
    }

    impl Handler<SelectionChanged> for Woken {
        type Result = ();
        fn handle(&mut self, _: SelectionChanged, _: &mut Context<Self>) {
            self.0 += 1;
        }
    }

    #[derive(Message)]
    #[rtype(result = "usize")]
    struct Count;

    impl Handler<Count> for Woken {
        type Result = usize;
        fn handle(&mut self, _: Count, _: &mut Context<Self>) -> usize {
            self.0
        }
    }

    /// A change reaches a supervisor only when the cluster joins or leaves its selection, or when the
    /// supervisor reads what changed: an unread label wakes the one that reads everything (its Packages
    /// are not listed yet) and not the settled one partitioned by `risk`.
    #[actix::test]
    async fn a_change_wakes_only_the_supervisors_that_read_it() {
        use crate::engine::rollout::hosted_cluster_package::OwnedPackage;
        use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
        let index = HostedClusterIndex::default();
        let labelled = |labels: &[(&str, &str)]| {
            let mut c = cluster("clusters", "a", "uid-1");
            c.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            c
        };
        index.seed(Some(vec![labelled(&[("fleet", "x"), ("risk", "early")])]));
        let hcpkg: HostedClusterPackage = serde_json::from_value(serde_json::json!({
            "apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
            "metadata": {"name": "addon"},
            "spec": {"template": {"spec": {"image": "registry/addon:v1"}},
                "strategy": {"instant": {}}, "partition": {"labelKey": "risk"}},
        }))
        .unwrap();
        let selector = LabelSelector {
            match_labels: Some([("fleet".to_owned(), "x".to_owned())].into()),
            ..Default::default()
        };
        let none = std::collections::BTreeMap::<String, Arc<OwnedPackage>>::new();
        let supervisors: Vec<Addr<Woken>> = [("settled", Some(&none)), ("unlisted", None)]
            .into_iter()
            .map(|(name, packages)| {
                let woken = Woken::default().start();
                let reads = ClusterReads::of(&hcpkg, packages);
                index.set_selector(name, &selector, reads, woken.clone().recipient());
                woken
            })
            .collect();
        let woken = || async {
            let mut counts = Vec::new();
            for s in &supervisors {
                counts.push(s.send(Count).await.unwrap());
            }
            counts
        };
        assert_eq!(woken().await, [0, 0]);
        index.observe(
            &labelled(&[("fleet", "x"), ("risk", "early"), ("noise", "1")]),
            false,
        );
        assert_eq!(woken().await, [0, 1]);
        index.observe(
            &labelled(&[("fleet", "x"), ("risk", "late"), ("noise", "1")]),
            false,
        );
        assert_eq!(woken().await, [1, 2]);
        index.observe(&labelled(&[("risk", "late")]), false);
        assert_eq!(woken().await, [2, 3]);
        index.observe(&labelled(&[("risk", "early")]), false);
        assert_eq!(
            woken().await,
            [2, 3],
            "a cluster outside both selections wakes neither"
        );
    }
}

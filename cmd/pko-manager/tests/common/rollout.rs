//! HostedClusterPackage test helpers: fleets of simulated HostedClusters, HostedClusterPackage specs,
//! waiting on their status (with where each Package stands when it times out), and the independent
//! observer that records every Package change of a rollout in the apiserver's order.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::object_set::ObjectSet;
use pko_proto::core::package::Package;
use pko_testenv::{wait_until, SimulatedHostedCluster};
use serde_json::{json, Value};

use super::{env, TIMEOUT};

pub const HOSTED_CLUSTER_PACKAGE_LABEL: &str = "package-operator.run/hosted-cluster-package";

/// The risk labels of the rollout tests' fleet: early 3, normal 4, late 3, and the unknown group (no
/// label, and a value the static order does not list) 2.
pub const RISKS: [Option<&str>; 12] = [
    Some("early"),
    Some("early"),
    Some("early"),
    Some("normal"),
    Some("normal"),
    Some("normal"),
    Some("normal"),
    Some("late"),
    Some("late"),
    Some("late"),
    None,
    Some("unlisted"),
];

/// The static partition order over [`RISKS`].
pub fn risk_partition() -> Value {
    json!({"labelKey": "risk", "order": {"static": ["early", "normal", "late"]}})
}

/// Each cluster's HCP namespace → its group's position under [`risk_partition`].
pub fn group_of(
    clusters: &[SimulatedHostedCluster],
    risks: &[Option<&str>],
) -> BTreeMap<String, usize> {
    clusters
        .iter()
        .zip(risks)
        .map(|(c, r)| {
            let g = match r {
                Some("early") => 0,
                Some("normal") => 1,
                Some("late") => 2,
                _ => 3,
            };
            (c.hcp_namespace.clone(), g)
        })
        .collect()
}

/// A fleet of HostedClusters in a namespace of its own, labelled `fleet=<namespace>` plus `risk` labels.
pub async fn fleet(prefix: &str, risks: &[Option<&str>]) -> (String, Vec<SimulatedHostedCluster>) {
    let env = env();
    env.simulate_hypershift().await.unwrap();
    let ns = env.management().create_namespace(prefix).await.unwrap();
    let mut clusters = Vec::new();
    for (i, risk) in risks.iter().enumerate() {
        let mut labels = BTreeMap::from([("fleet".to_owned(), ns.clone())]);
        if let Some(r) = risk {
            labels.insert("risk".to_owned(), (*r).to_owned());
        }
        clusters.push(
            env.add_hosted_cluster(&ns, &format!("hc-{i:02}"), labels, true)
                .await
                .unwrap(),
        );
    }
    (ns, clusters)
}

/// A HostedClusterPackage over the fleet `fleet`, templating the `handlebars` example package.
pub fn hcpkg(
    name: &str,
    fleet: &str,
    image: &str,
    strategy: Value,
    partition: Option<Value>,
) -> HostedClusterPackage {
    let mut spec = json!({
        "hostedClusterSelector": {"matchLabels": {"fleet": fleet}},
        "strategy": strategy,
        "template": {"spec": {"image": image, "config": {"greeting": "hi"}}},
    });
    if let Some(p) = partition {
        spec["partition"] = p;
    }
    serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

/// Waits until `ok` holds for the HostedClusterPackage; on timeout, panics with its counts, every owned
/// Package's conditions, the unavailable ObjectSets and the tail of `manager_log`.
/// Waits until the HostedClusterPackage `name`'s Package in `namespace` is gone.
pub async fn wait_package_gone(client: &Client, namespace: &str, name: &str) {
    let api = Api::<Package>::namespaced(client.clone(), namespace);
    wait_until(
        &format!("Package {namespace}/{name} gone"),
        TIMEOUT,
        || async {
            match api.get_opt(name).await {
                Ok(None) => Ok(()),
                other => Err(format!("{:?}", other.map(|p| p.is_some()))),
            }
        },
    )
    .await
    .unwrap();
}

pub async fn wait_status<F: Fn(&HostedClusterPackage) -> bool>(
    api: &Api<HostedClusterPackage>,
    name: &str,
    manager_log: impl Fn() -> String,
    what: &str,
    ok: F,
) -> HostedClusterPackage {
    let packages = Api::<Package>::all(api.clone().into_client());
    let owned =
        kube::api::ListParams::default().labels(&format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={name}"));
    wait_until(what, TIMEOUT * 3, || async {
        let h = api.get(name).await.map_err(|e| e.to_string())?;
        if ok(&h) {
            return Ok(h);
        }
        // Say where each Package stands, to tell a slow Package from a stale count.
        let list = packages.list(&owned).await.map_err(|e| e.to_string())?;
        let states: Vec<String> = list
            .items
            .iter()
            .map(|p| {
                let conditions: Vec<String> = p
                    .status
                    .iter()
                    .flat_map(|s| &s.conditions)
                    .map(|c| format!("{}={}@{:?}", c.type_, c.status, c.observed_generation))
                    .collect();
                format!(
                    "{:?} gen {:?}: {conditions:?}",
                    p.metadata.namespace, p.metadata.generation
                )
            })
            .collect();
        // And the ObjectSets that are not available, to tell where a Package is stuck.
        let sets = Api::<ObjectSet>::all(api.clone().into_client())
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let stuck: Vec<String> = sets
            .items
            .iter()
            .filter(|s| {
                !s.status
                    .iter()
                    .flat_map(|st| &st.conditions)
                    .any(|c| c.type_ == "Available" && c.status == "True")
            })
            .map(|s| {
                let conditions: Vec<String> = s
                    .status
                    .iter()
                    .flat_map(|st| &st.conditions)
                    .map(|c| format!("{}={} {}", c.type_, c.status, c.message))
                    .collect();
                format!("{:?}: {conditions:?}", s.metadata.namespace)
            })
            .collect();
        Err(format!(
            "{:?}\npackages: {states:#?}\nunavailable ObjectSets: {stuck:#?}",
            h.status.map(|s| s.counts)
        ))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nmanager log:\n{}", manager_log()))
}

pub fn condition<'a>(h: &'a HostedClusterPackage, type_: &str) -> Option<&'a Condition> {
    h.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// Every one of `total` Packages updated and available, for the HostedClusterPackage's generation.
pub fn all_available(h: &HostedClusterPackage, total: i32) -> bool {
    let generation = h.metadata.generation.unwrap_or_default();
    h.status.as_ref().is_some_and(|s| {
        s.observed_generation == generation
            && s.counts.total_packages == total
            && s.counts.available_packages == total
            && s.counts.updated_packages == total
    })
}

/// What the independent observer saw, in the apiserver's order.
#[derive(Default)]
pub struct Observed {
    /// Per namespace: (on the new template, done).
    pub packages: BTreeMap<String, (bool, bool)>,
    /// Per namespace: the generation of the Package when it first showed the new template.
    pub updated_at_generation: BTreeMap<String, i64>,
    /// Max disrupted (not done) Packages at any moment after the rollout began.
    pub worst: usize,
    /// Namespaces in the order they first showed the new template.
    pub update_order: Vec<String>,
    /// For each update: namespaces of earlier groups not yet done on the new template at that moment.
    pub barrier_violations: Vec<String>,
    /// Every change of a Package's (on the new template, done), in order, with the disruption after it:
    /// printed when an assertion on the budget fails.
    pub timeline: Vec<String>,
}

impl Observed {
    /// Fails when more than `max_unavailable` Packages were disrupted at once, with the timeline.
    pub fn assert_within_budget(&self, max_unavailable: usize) {
        assert!(
            self.worst <= max_unavailable,
            "at some moment {} Packages were unavailable (maxUnavailable {max_unavailable}):\n{}",
            self.worst,
            self.timeline.join("\n")
        );
    }
}

/// The strict definition of a Package that is done, independent of pko's: Available=True and
/// Progressing=False, both written for the Package's current generation.
pub fn is_done(p: &Package) -> bool {
    let generation = p.metadata.generation;
    let fresh = |type_: &str, status: &str| {
        p.status
            .iter()
            .flat_map(|s| &s.conditions)
            .any(|c| c.type_ == type_ && c.status == status && c.observed_generation == generation)
    };
    fresh("Available", "True") && fresh("Progressing", "False")
}

/// Watches every Package of the HostedClusterPackage `name` and records whether each one is on the new
/// template (its spec equals `new_spec`) and done (strictly, see [`is_done`]), the worst disruption, and
/// the order in which they took the new template. `group_of` maps an HCP namespace to its group's
/// position, to check the barrier at each update.
pub struct RolloutObserver {
    pub observed: Arc<Mutex<Observed>>,
    group_of: BTreeMap<String, usize>,
    task: tokio::task::JoinHandle<()>,
}

impl RolloutObserver {
    pub async fn start(
        client: &Client,
        name: &str,
        new_spec: &Value,
        group_of: BTreeMap<String, usize>,
    ) -> Self {
        let observed = Arc::new(Mutex::new(Observed::default()));
        let packages: Api<Package> = Api::all(client.clone());
        let config =
            watcher::Config::default().labels(&format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={name}"));
        let mut stream = watcher::watcher(packages, config).boxed();
        let record = observed.clone();
        let new_spec = new_spec.clone();
        let fleet_size = group_of.len();
        let groups = group_of.clone();
        let task = tokio::spawn(async move {
            while let Some(event) = stream.next().await {
                let Ok(Event::Apply(p) | Event::InitApply(p)) = event else {
                    continue;
                };
                record.lock().unwrap().record(&p, &new_spec, &groups);
            }
        });
        let observer = Self {
            observed,
            group_of,
            task,
        };
        wait_until("the observer saw every Package", TIMEOUT, || async {
            let n = observer.observed.lock().unwrap().packages.len();
            if n == fleet_size {
                Ok(())
            } else {
                Err(format!("{n} of {fleet_size}"))
            }
        })
        .await
        .unwrap();
        observer
    }

    /// Stops observing and asserts the whole rollout: never more than `max_unavailable` Packages
    /// disrupted, no update past an unfinished earlier group, every Package updated once, groups in
    /// order. Returns the namespaces in update order.
    pub fn finish(self, max_unavailable: usize) -> Vec<String> {
        self.task.abort();
        let o = self.observed.lock().unwrap();
        o.assert_within_budget(max_unavailable);
        assert!(
            o.barrier_violations.is_empty(),
            "{:?}",
            o.barrier_violations
        );
        assert_eq!(
            o.update_order.len(),
            self.group_of.len(),
            "{:?}",
            o.update_order
        );
        let groups: Vec<usize> = o.update_order.iter().map(|ns| self.group_of[ns]).collect();
        assert!(
            groups.windows(2).all(|w| w[0] <= w[1]),
            "groups updated out of order: {:?}",
            o.update_order
        );
        o.update_order.clone()
    }
}

impl Observed {
    fn record(&mut self, p: &Package, new_spec: &Value, group_of: &BTreeMap<String, usize>) {
        let ns = p.metadata.namespace.clone().unwrap_or_default();
        let generation = p.metadata.generation;
        let done = is_done(p);
        let on_new = serde_json::to_value(&p.spec).unwrap() == *new_spec;
        let first_update = on_new && self.packages.get(&ns).is_none_or(|(was_new, _)| !was_new);
        if first_update {
            let group = group_of[&ns];
            let laggards: Vec<String> = self
                .packages
                .iter()
                .filter(|(other, (on_new, done))| group_of[*other] < group && !(*on_new && *done))
                .map(|(other, _)| other.clone())
                .collect();
            if !laggards.is_empty() {
                self.barrier_violations.push(format!(
                    "{ns} (group {group}) updated while {laggards:?} were not done"
                ));
            }
            self.update_order.push(ns.clone());
            self.updated_at_generation
                .insert(ns.clone(), generation.unwrap_or_default());
        }
        let changed = self.packages.insert(ns.clone(), (on_new, done)) != Some((on_new, done));
        let disrupted = self.packages.values().filter(|(_, done)| !done).count();
        self.worst = self.worst.max(disrupted);
        if changed {
            let conditions: Vec<String> = p
                .status
                .iter()
                .flat_map(|s| &s.conditions)
                .map(|c| {
                    format!(
                        "{}={}/{}@{:?}",
                        c.type_, c.status, c.reason, c.observed_generation
                    )
                })
                .collect();
            self.timeline.push(format!(
                "{ns} gen {generation:?} rv {:?}: new={on_new} done={done} -> {disrupted} disrupted {conditions:?}",
                p.metadata.resource_version
            ));
        }
    }
}

/// Every event of the HostedClusterPackage `name` in the PKO_ROLLOUTS stream, in order.
pub async fn rollout_events(name: &str) -> Vec<Value> {
    stored_rollout_events(name)
        .await
        .into_iter()
        .map(|(_, event)| event)
        .collect()
}

/// Every message of the HostedClusterPackage `name` in the PKO_ROLLOUTS stream, in order, as headers
/// and JSON event; none while the stream does not exist yet.
pub async fn stored_rollout_messages(name: &str) -> Vec<(Option<async_nats::HeaderMap>, Value)> {
    use async_nats::jetstream::{self, consumer::pull};
    let js = jetstream::new(env().nats().client().await.unwrap());
    let Ok(stream) = js.get_stream("PKO_ROLLOUTS").await else {
        return Vec::new();
    };
    let consumer = stream
        .create_consumer(pull::Config {
            filter_subject: format!("pko.v1.rollout.{}.>", name.replace('.', "_")),
            ..Default::default()
        })
        .await
        .unwrap();
    let pending = consumer.clone().info().await.unwrap().num_pending;
    if pending == 0 {
        return Vec::new();
    }
    let mut messages = consumer
        .fetch()
        .max_messages(usize::try_from(pending).unwrap())
        .messages()
        .await
        .unwrap();
    let mut events = Vec::new();
    while let Some(message) = messages.next().await {
        let message = message.unwrap();
        let event = serde_json::from_slice::<Value>(&message.payload).unwrap();
        events.push((message.headers.clone(), event));
    }
    assert_eq!(events.len() as u64, pending);
    events
}

/// Every event of the HostedClusterPackage `name` in the PKO_ROLLOUTS stream, in order, with its
/// `Nats-Msg-Id`; none while the stream does not exist yet.
pub async fn stored_rollout_events(name: &str) -> Vec<(String, Value)> {
    stored_rollout_messages(name)
        .await
        .into_iter()
        .map(|(headers, event)| {
            let id = headers
                .as_ref()
                .and_then(|h| h.get("Nats-Msg-Id"))
                .map(|v| v.to_string())
                .unwrap_or_default();
            (id, event)
        })
        .collect()
}

/// A HostedClusterPackage over every HostedCluster rolling `image` one Package at a time.
pub fn hcpkg_over_all(name: &str, image: &str) -> HostedClusterPackage {
    serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
        "metadata": {"name": name},
        "spec": {
            "hostedClusterSelector": {},
            "strategy": {"rollingUpgrade": {"maxUnavailable": 1}},
            "template": {"spec": {"image": image}},
        },
    }))
    .unwrap()
}

/// Rolls HostedClusterPackage `name` to `image` (the `handlebars` example's greeting `hi`).
pub async fn roll_image(api: &Api<HostedClusterPackage>, name: &str, image: &str) {
    let release =
        json!({"spec": {"template": {"spec": {"image": image, "config": {"greeting": "hi"}}}}});
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&release),
    )
    .await
    .unwrap();
}

//! The fleet a chaos run works on: per management cluster its CRDs, simulated HostedClusters (the first
//! one the canary, alone in its partition group) all backed by one hosted-cluster apiserver of the
//! cluster's own, their connectors (run by a connector runner, as a kubelet would), the Widget workload, a
//! Lease namespace and three `--sharding` replicas (the last behind a stall proxy), and the
//! HostedClusterPackage over them.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::PostParams;
use kube::Api;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::hypershift::hosted_control_plane_namespace;
use pko_testenv::workload::WorkloadSimulator;
use pko_testenv::{
    add_hosted_cluster_to, connect_hosted_cluster, fleet_manager_args, sharded_manager_args,
    ApiServer, ConnectorRunner, FleetNats, ManagerLaunch, ManagerProcess, StallProxy, TestEnv,
};
use serde_json::json;

use crate::fleet_bench::install_fleet_crds;

/// The namespace of the run's HostedClusters.
pub const HOSTED_CLUSTERS: &str = "chaos";

/// One management cluster as the faults see it.
pub struct ClusterUnderTest<'a> {
    pub name: String,
    pub server: &'a ApiServer,
    /// The hosted-cluster apiserver behind every HostedCluster of this cluster (each Package's hosted
    /// phase puts a ConfigMap named after its HCP namespace there).
    pub hosted_server: &'a ApiServer,
    /// Runs the connector Deployments pko installs in the HCP namespaces.
    pub connectors: ConnectorRunner,
    /// The stalled replica's route to the apiserver, which the schedule may stall.
    pub stall: StallProxy,
    pub replicas: Vec<ManagerProcess>,
    pub args: Vec<String>,
    /// Each replica runs under a member name of its own (`--member-name`), as a StatefulSet's pods do;
    /// otherwise a member per process.
    pub member_names: bool,
    pub workload: &'a WorkloadSimulator,
    /// HostedClusters (name → HCP namespace) the fleet has now.
    pub hosted: BTreeMap<String, String>,
    /// HCP namespaces of HostedClusters the run deleted (with their namespace, as HyperShift does).
    pub deleted: Vec<String>,
}

impl<'a> ClusterUnderTest<'a> {
    /// The arguments of replica `replica`: the cluster's, and its member name when it has one (the same
    /// for each process of the replica, as a StatefulSet's pod keeps its name).
    pub fn replica_args(&self, replica: usize) -> Vec<String> {
        let mut args = self.args.clone();
        if self.member_names {
            args.extend([
                "--member-name".to_owned(),
                format!("{}-{replica}", self.name),
            ]);
        }
        args
    }

    /// How replica `replica` is started: the last through the stall proxy (the others, started first,
    /// install the CRDs, which a manager behind another route does not).
    pub fn launch(&self, replica: usize, nats: &'a pko_testenv::Nats) -> ManagerLaunch<'a> {
        ManagerLaunch {
            apiserver: Some(self.server),
            nats: Some(nats),
            kubeconfig: (replica == STALLED_REPLICA)
                .then(|| self.stall.kubeconfig_path().to_owned()),
            ..ManagerLaunch::default()
        }
    }
}

/// The management clusters, canary first: the second's rollouts are gated on it.
pub const CLUSTERS: [&str; 2] = ["canary", "prod"];
pub const REPLICAS: usize = 3;
/// The replica whose apiserver connection goes through the stall proxy.
pub const STALLED_REPLICA: usize = REPLICAS - 1;
pub const MAX_UNAVAILABLE: usize = 2;
/// The HostedClusterPackage of the run, in every cluster.
pub const NAME: &str = "chaos";
/// The management cluster whose HostedClusters and ObjectSets come and go: the canary's, whose
/// controller-manager collects what a deletion leaves to the garbage collector.
pub const CHURNED: usize = 0;
/// The canary HostedCluster of each cluster: its partition group holds only it.
pub const CANARY: &str = "hc-000";
const LEASE_SECONDS: u64 = 15;
const LEASE_NAMESPACE: &str = "pko-shard-leases";
const READINESS_LAG: std::time::Duration = std::time::Duration::from_secs(1);

/// The HostedClusters and workload of one management cluster, before its replicas start.
pub struct ClusterSetup {
    pub hosted: BTreeMap<String, String>,
    pub workload: WorkloadSimulator,
}

/// CRDs, `size` HostedClusters backed by `hosted_server`, and the Widget workload in `server`.
pub async fn prepare(
    server: &ApiServer,
    hosted_server: &ApiServer,
    size: usize,
) -> Result<ClusterSetup, String> {
    let client = install_fleet_crds(server).await?;
    let mut hosted = BTreeMap::new();
    for i in 0..size {
        let name = format!("hc-{i:03}");
        let group = if name == CANARY { "canary" } else { "rest" };
        let labels = BTreeMap::from([
            ("fleet".to_owned(), HOSTED_CLUSTERS.to_owned()),
            ("group".to_owned(), group.to_owned()),
        ]);
        add_hosted_cluster_to(server, HOSTED_CLUSTERS, &name, labels, true)
            .await
            .map_err(|e| e.to_string())?;
        let namespace = hosted_control_plane_namespace(HOSTED_CLUSTERS, &name);
        connect_hosted_cluster(server, &namespace, hosted_server)
            .await
            .map_err(|e| e.to_string())?;
        hosted.insert(name, namespace);
    }
    let workload =
        WorkloadSimulator::widgets(&client, hosted.values().cloned().collect(), READINESS_LAG);
    let lease_namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": LEASE_NAMESPACE}}))
            .map_err(|e| e.to_string())?;
    Api::<Namespace>::all(client)
        .create(&PostParams::default(), &lease_namespace)
        .await
        .map_err(|e| e.to_string())?;
    Ok(ClusterSetup { hosted, workload })
}

/// Where cluster `index` runs: its management apiserver and the hosted-cluster apiserver behind its
/// HostedClusters.
pub struct ClusterServers<'a> {
    pub management: &'a ApiServer,
    pub hosted: &'a ApiServer,
}

/// Starts the connector runner and the replicas of cluster `index` and waits until each replica is
/// ready; the connectors are the `pko-connector` next to `manager`.
pub async fn start<'a>(
    env: &TestEnv,
    nats: &'a FleetNats,
    manager: &Path,
    index: usize,
    servers: ClusterServers<'a>,
    setup: &'a ClusterSetup,
    member_names: bool,
) -> Result<ClusterUnderTest<'a>, String> {
    let ClusterServers {
        management: server,
        hosted: hosted_server,
    } = servers;
    let name = CLUSTERS[index];
    let labels = if index == 0 { "env=canary" } else { "env=prod" };
    let mut args = fleet_manager_args(name, labels);
    args.extend(sharded_manager_args(LEASE_NAMESPACE, LEASE_SECONDS));
    let stall = server
        .stall_proxy(&format!("chaos-{name}"))
        .await
        .map_err(|e| e.to_string())?;
    let connectors = env
        .start_connector_runner_on(server, &manager.with_file_name("pko-connector"), Vec::new())
        .await
        .map_err(|e| e.to_string())?;
    let mut cluster = ClusterUnderTest {
        name: name.to_owned(),
        server,
        hosted_server,
        connectors,
        stall,
        replicas: Vec::new(),
        args,
        member_names,
        workload: &setup.workload,
        hosted: setup.hosted.clone(),
        deleted: Vec::new(),
    };
    let leaf = nats.leaf(name).ok_or(format!("no NATS leaf for {name}"))?;
    for replica in 0..REPLICAS {
        let args = cluster.replica_args(replica);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = env
            .start_manager_with(manager, &cluster.launch(replica, leaf), &args)
            .await
            .map_err(|e| format!("replica {replica} of {name}: {e}"))?;
        cluster.replicas.push(started);
    }
    Ok(cluster)
}

/// The HostedClusterPackage of cluster `index`: partition groups canary → rest, maxFailures 0 with
/// automatic rollback, a soak and a deadline; the second cluster gated on the canary cluster.
pub fn hosted_cluster_package(
    index: usize,
    image: &str,
    release: &str,
) -> Result<HostedClusterPackage, String> {
    let mut spec = json!({
        "hostedClusterSelector": {"matchLabels": {"fleet": HOSTED_CLUSTERS}},
        "partition": {"labelKey": "group", "order": {"static": ["canary", "rest"]}},
        "strategy": {"rollingUpgrade": {"maxUnavailable": MAX_UNAVAILABLE}},
        "rolloutPolicy": {
            "defaults": {"minSuccessTime": "5s", "progressDeadline": "120s", "maxFailures": 0},
            "rollback": "Automatic",
        },
        "template": {"spec": {"image": image, "config": {"release": release}}},
    });
    if index > 0 {
        spec["promotion"] = json!({
            "managementClusterSelector": {"matchLabels": {"env": "canary"}},
            "soakSeconds": 5,
        });
    }
    serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
        "metadata": {"name": NAME}, "spec": spec,
    }))
    .map_err(|e| e.to_string())
}

//! Carrying out the schedule against the live topology: each fault begins at its offset and is undone
//! (a process started again, a server back) when it ends. A fault that cannot be carried out (its
//! target's apiserver away at that moment) is counted as skipped, not retried: the schedule stays the
//! seed's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ListParams};
use kube::Api;
use pko_proto::core::object_set::ObjectSet;
use pko_proto::hypershift::{hosted_control_plane_namespace, HostedCluster};
use pko_testenv::{add_hosted_cluster_to, connect_hosted_cluster, FleetNats, TestEnv};
use tokio::sync::mpsc::UnboundedSender;

use crate::chaos::observer::Observed;
use crate::chaos::schedule::{Fault, FaultKind};
use crate::chaos::standalone;
use crate::chaos::topology::{ClusterUnderTest, CANARY, CHURNED, HOSTED_CLUSTERS};

/// One memory sample of a manager replica or a connector.
#[derive(Debug, Clone)]
pub struct RssSample {
    pub at: Duration,
    /// `<cluster> replica <n>` or `<cluster> connector <HCP namespace>`.
    pub process: String,
    pub pid: u32,
    pub kib: u64,
}

/// Everything a fault may touch.
pub struct World<'a> {
    pub env: &'a TestEnv,
    pub nats: &'a FleetNats,
    pub manager: PathBuf,
    pub clusters: Vec<ClusterUnderTest<'a>>,
    pub to_judge: UnboundedSender<Observed>,
    /// HostedClusters created so far (they are named after the count).
    created: usize,
    /// ObjectSets deleted so far (each deletion takes the next Package in turn).
    sets_deleted: usize,
    pub skipped: BTreeMap<&'static str, usize>,
    pub rss: Vec<RssSample>,
    /// Replicas a SIGKILL fault holds down until it ends: (cluster, replica).
    held_down: BTreeSet<(usize, usize)>,
    /// Replicas started again after they exited on their own (a Lease lost while paused or cut off).
    pub restarted: usize,
    /// The connector Deployment each pause fault froze, by the fault's (cluster, which).
    paused_connectors: BTreeMap<(usize, usize), (String, String)>,
}

/// How often replica memory is sampled.
const RSS_SAMPLE: Duration = Duration::from_secs(5);

impl<'a> World<'a> {
    pub fn new(
        env: &'a TestEnv,
        nats: &'a FleetNats,
        manager: PathBuf,
        clusters: Vec<ClusterUnderTest<'a>>,
        to_judge: UnboundedSender<Observed>,
    ) -> Self {
        Self {
            env,
            nats,
            manager,
            clusters,
            to_judge,
            created: 0,
            sets_deleted: 0,
            skipped: BTreeMap::new(),
            rss: Vec::new(),
            held_down: BTreeSet::new(),
            restarted: 0,
            paused_connectors: BTreeMap::new(),
        }
    }

    /// Starts again, as their Deployment's kubelet would, the replicas that exited on their own (pko
    /// exits when it cannot renew its Lease in time: paused past it, or cut off from its apiserver);
    /// ones a kill fault holds down wait for its end.
    pub fn restart_exited(&mut self, started: Instant) {
        for c in 0..self.clusters.len() {
            for r in 0..self.clusters[c].replicas.len() {
                if self.held_down.contains(&(c, r))
                    || self.clusters[c].replicas[r].check_running().is_ok()
                {
                    continue;
                }
                match self.restart_replica(c, r) {
                    Ok(()) => {
                        self.restarted += 1;
                        println!(
                            "  {:>7.1}s {} replica {r} exited on its own; started again",
                            started.elapsed().as_secs_f64(),
                            self.clusters[c].name
                        );
                    }
                    Err(e) => println!(
                        "  {:>7.1}s {} replica {r} exited; starting it again failed: {e}",
                        started.elapsed().as_secs_f64(),
                        self.clusters[c].name
                    ),
                }
            }
        }
    }

    /// Keeps the replicas running (see [`World::restart_exited`]) until `until` finishes.
    pub async fn tend_until<T>(
        &mut self,
        started: Instant,
        until: impl std::future::Future<Output = T>,
    ) -> T {
        tokio::pin!(until);
        let mut tending = tokio::time::interval(RSS_SAMPLE);
        loop {
            tokio::select! {
                done = &mut until => return done,
                _ = tending.tick() => self.restart_exited(started),
            }
        }
    }

    fn restart_replica(&mut self, cluster: usize, replica: usize) -> Result<(), String> {
        let c = &self.clusters[cluster];
        let launch = c.launch(replica, self.leaf(cluster)?);
        let args = c.replica_args(replica);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = self
            .env
            .spawn_manager_with(&self.manager, &launch, &args)
            .map_err(|e| e.to_string())?;
        self.clusters[cluster].replicas[replica] = started;
        Ok(())
    }

    /// Carries out `faults` from `started`, each begun and undone at its time; returns when the last
    /// one is undone.
    pub async fn carry_out(&mut self, faults: &[Fault], started: Instant) {
        let mut steps: Vec<(Duration, bool, usize)> = faults
            .iter()
            .enumerate()
            .flat_map(|(i, f)| [(f.at, true, i), (f.ends(), false, i)])
            .collect();
        steps.sort();
        let mut sampling = tokio::time::interval(RSS_SAMPLE);
        for (at, begins, i) in steps {
            // The schedule's own pace: each step waits for its offset; RSS is sampled meanwhile.
            let due = tokio::time::sleep_until((started + at).into());
            tokio::pin!(due);
            loop {
                tokio::select! {
                    () = &mut due => break,
                    _ = sampling.tick() => {
                        self.sample_rss(started);
                        self.restart_exited(started);
                    }
                }
            }
            let fault = &faults[i];
            let done = if begins {
                self.begin(&fault.kind).await
            } else {
                self.end(&fault.kind).await
            };
            if let Err(e) = done {
                println!(
                    "  {:>7.1}s {} {}: skipped ({e})",
                    started.elapsed().as_secs_f64(),
                    fault.kind.name(),
                    if begins { "begin" } else { "end" }
                );
                *self.skipped.entry(fault.kind.name()).or_default() += 1;
            }
        }
    }

    /// RSS of every running replica (by its slot) and connector (by its HCP namespace).
    pub fn sample_rss(&mut self, started: Instant) {
        let at = started.elapsed();
        for cluster in &self.clusters {
            let replicas = cluster
                .replicas
                .iter()
                .enumerate()
                .filter_map(|(r, replica)| {
                    Some((format!("{} replica {r}", cluster.name), replica.pid()?))
                });
            let connectors = cluster
                .connectors
                .pids()
                .into_iter()
                .map(|((namespace, _), pid)| {
                    (format!("{} connector {namespace}", cluster.name), pid)
                });
            for (process, pid) in replicas.chain(connectors) {
                let kib = crate::rss_kib(pid);
                if kib > 0 {
                    self.rss.push(RssSample {
                        at,
                        process,
                        pid,
                        kib,
                    });
                }
            }
        }
    }

    async fn begin(&mut self, kind: &FaultKind) -> Result<(), String> {
        match *kind {
            FaultKind::KillManager { cluster, replica } => {
                self.held_down.insert((cluster, replica));
                self.clusters[cluster].replicas[replica].kill();
                Ok(())
            }
            FaultKind::PauseManager { cluster, replica } => self.clusters[cluster].replicas
                [replica]
                .pause()
                .map_err(|e| e.to_string()),
            FaultKind::RestartLeaf { cluster } => {
                self.leaf(cluster)?.kill();
                Ok(())
            }
            FaultKind::RestartHub => {
                self.nats.hub().kill();
                Ok(())
            }
            FaultKind::RestartApiServer { cluster } => self.clusters[cluster]
                .server
                .restart()
                .await
                .map_err(|e| e.to_string()),
            FaultKind::StallApiServer { cluster } => {
                self.clusters[cluster].stall.stall();
                Ok(())
            }
            FaultKind::CutHubLink { cluster } => self.cut_link(cluster, true),
            FaultKind::RegistryDown => {
                self.env.registry().kill();
                Ok(())
            }
            FaultKind::KillConnector { cluster, which } => {
                self.signal_connector(cluster, which, "-KILL")
            }
            FaultKind::PauseConnector { cluster, which } => {
                self.signal_connector(cluster, which, "-STOP")
            }
            FaultKind::HostedApiServerDown { cluster } => {
                self.clusters[cluster].hosted_server.kill();
                Ok(())
            }
            FaultKind::CreateHostedCluster => self.create_hosted_cluster().await,
            FaultKind::DeleteHostedCluster => self.delete_hosted_cluster().await,
            FaultKind::DeleteObjectSet { orphan: false } => self.delete_object_set().await,
            FaultKind::DeleteObjectSet { orphan: true } => {
                standalone::orphan(&self.churned_client().await?).await
            }
        }
    }

    /// Signals the connector of cluster `cluster`'s `which`-th HCP namespace, in name order among those
    /// whose connector runs now. The one a pause froze is thawed by HCP namespace, wherever the order
    /// has moved meanwhile.
    fn signal_connector(
        &mut self,
        cluster: usize,
        which: usize,
        signal: &str,
    ) -> Result<(), String> {
        let connectors = &self.clusters[cluster].connectors;
        let running: Vec<(String, String)> = connectors.pids().into_keys().collect();
        let deployment = running
            .get(which % running.len().max(1))
            .cloned()
            .ok_or("no connector running")?;
        connectors
            .signal(&deployment, signal)
            .map_err(|e| e.to_string())?;
        if signal == "-STOP" {
            self.paused_connectors.insert((cluster, which), deployment);
        }
        Ok(())
    }

    fn cut_link(&self, cluster: usize, cut: bool) -> Result<(), String> {
        let name = &self.clusters[cluster].name;
        if self.nats.cut_link(name, cut) {
            Ok(())
        } else {
            Err(format!("{name}'s hub link cannot be cut"))
        }
    }

    async fn end(&mut self, kind: &FaultKind) -> Result<(), String> {
        match *kind {
            FaultKind::KillManager { cluster, replica } => {
                self.held_down.remove(&(cluster, replica));
                self.restart_replica(cluster, replica)
            }
            FaultKind::PauseManager { cluster, replica } => self.clusters[cluster].replicas
                [replica]
                .resume()
                .map_err(|e| e.to_string()),
            FaultKind::RestartLeaf { cluster } => self
                .leaf(cluster)?
                .restart()
                .await
                .map_err(|e| e.to_string()),
            FaultKind::RestartHub => self.nats.hub().restart().await.map_err(|e| e.to_string()),
            FaultKind::StallApiServer { cluster } => {
                self.clusters[cluster].stall.resume();
                Ok(())
            }
            FaultKind::CutHubLink { cluster } => self.cut_link(cluster, false),
            FaultKind::RegistryDown => self
                .env
                .registry()
                .restart()
                .await
                .map_err(|e| e.to_string()),
            FaultKind::DeleteObjectSet { orphan: true } => {
                standalone::recreate(&self.churned_client().await?).await
            }
            FaultKind::PauseConnector { cluster, which } => {
                let deployment = self
                    .paused_connectors
                    .remove(&(cluster, which))
                    .ok_or("no connector paused")?;
                // A connector the runner replaced meanwhile (its Deployment changed) is not this one.
                let _ = self.clusters[cluster]
                    .connectors
                    .signal(&deployment, "-CONT");
                Ok(())
            }
            FaultKind::HostedApiServerDown { cluster } => self.clusters[cluster]
                .hosted_server
                .restart()
                .await
                .map_err(|e| e.to_string()),
            FaultKind::KillConnector { .. }
            | FaultKind::RestartApiServer { .. }
            | FaultKind::CreateHostedCluster
            | FaultKind::DeleteHostedCluster
            | FaultKind::DeleteObjectSet { orphan: false } => Ok(()),
        }
    }

    fn leaf(&self, cluster: usize) -> Result<&'a pko_testenv::Nats, String> {
        let name = &self.clusters[cluster].name;
        self.nats
            .leaf(name)
            .ok_or_else(|| format!("no NATS leaf for {name}"))
    }

    async fn create_hosted_cluster(&mut self) -> Result<(), String> {
        self.created += 1;
        let name = format!("joined-{:03}", self.created);
        let cluster = &mut self.clusters[CHURNED];
        let namespace = hosted_control_plane_namespace(HOSTED_CLUSTERS, &name);
        // Reported on before its Package can exist.
        cluster.workload.add_namespace(&namespace);
        let labels = BTreeMap::from([
            ("fleet".to_owned(), HOSTED_CLUSTERS.to_owned()),
            ("group".to_owned(), "rest".to_owned()),
        ]);
        add_hosted_cluster_to(cluster.server, HOSTED_CLUSTERS, &name, labels, true)
            .await
            .map_err(|e| e.to_string())?;
        connect_hosted_cluster(cluster.server, &namespace, cluster.hosted_server)
            .await
            .map_err(|e| e.to_string())?;
        cluster.hosted.insert(name, namespace);
        Ok(())
    }

    async fn churned_client(&self) -> Result<kube::Client, String> {
        self.clusters[CHURNED]
            .server
            .client()
            .await
            .map_err(|e| e.to_string())
    }

    /// Deletes the newest ObjectSet of a Package that is not the canary's, and its objects with it (its
    /// deployment makes it again).
    async fn delete_object_set(&mut self) -> Result<(), String> {
        let cluster = &self.clusters[CHURNED];
        let candidates: Vec<&String> = cluster
            .hosted
            .iter()
            .filter(|(name, _)| name.as_str() != CANARY)
            .map(|(_, ns)| ns)
            .collect();
        let namespace = candidates
            .get(self.sets_deleted % candidates.len().max(1))
            .map(|ns| (*ns).clone())
            .ok_or("no Package to delete an ObjectSet of")?;
        self.sets_deleted += 1;
        let client = cluster.server.client().await.map_err(|e| e.to_string())?;
        let sets: Api<ObjectSet> = Api::namespaced(client, &namespace);
        let newest = sets
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
            .max_by_key(|s| s.metadata.creation_timestamp.clone().map(|t| t.0))
            .ok_or_else(|| format!("no ObjectSet in {namespace}"))?;
        sets.delete(
            &newest.metadata.name.unwrap_or_default(),
            &DeleteParams::background(),
        )
        .await
        .map(drop)
        .map_err(|e| e.to_string())
    }

    /// Deletes the newest HostedCluster that is not the canary (the first one), and its HCP namespace.
    async fn delete_hosted_cluster(&mut self) -> Result<(), String> {
        let cluster = &mut self.clusters[CHURNED];
        let Some((name, namespace)) = cluster
            .hosted
            .iter()
            .filter(|(name, _)| name.as_str() != CANARY)
            .max_by_key(|(name, _)| name.starts_with("joined-"))
            .map(|(n, ns)| (n.clone(), ns.clone()))
        else {
            return Err("no HostedCluster left to delete".to_owned());
        };
        let client = cluster.server.client().await.map_err(|e| e.to_string())?;
        // Told first: the Package may be gone before the delete returns.
        let _ = self.to_judge.send(Observed::Left {
            cluster: CHURNED,
            namespace: namespace.clone(),
        });
        Api::<HostedCluster>::namespaced(client.clone(), HOSTED_CLUSTERS)
            .delete(&name, &DeleteParams::default())
            .await
            .map_err(|e| e.to_string())?;
        cluster.hosted.remove(&name);
        Api::<Namespace>::all(client)
            .delete(&namespace, &DeleteParams::default())
            .await
            .map_err(|e| e.to_string())?;
        cluster.deleted.push(namespace);
        Ok(())
    }
}

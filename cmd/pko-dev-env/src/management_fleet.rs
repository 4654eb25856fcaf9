//! `--management-clusters N`: a fleet of management clusters. The environment's management cluster is the
//! `canary`; `prod-1`..`prod-<N-1>` get a kube-apiserver each (on the same etcd) and a pko-manager each.
//! Every one has its own NATS, a leaf node of a hub NATS (from `deploy/nats/fleet`). Once the single-cluster
//! samples rolled out on the canary, each prod cluster gets simulated HostedClusters and the sample
//! HostedClusterPackage gated on the canary (`spec.promotion`); then a new release goes to every cluster at
//! once, and the launcher prints each cluster's progress: prod waits for the canary to finish and soak.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::Api;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_testenv::{
    add_hosted_cluster_to, fleet_manager_args, install_hosted_cluster_crd, wait_until, ApiServer,
    FleetNats, ManagerLaunch, ManagerProcess, TestEnv,
};
use serde_json::json;

use crate::fleet_rollout::{progress_line, SAMPLE, SAMPLE_FILE};
use crate::ProgressLine;

/// The environment's own management cluster's name in the fleet.
pub const CANARY: &str = "canary";
/// How long prod waits after the canary settled.
const SOAK_SECONDS: i64 = 10;
/// Simulated HostedClusters of each prod cluster.
const PROD_HOSTED_CLUSTERS: usize = 3;
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(300);

/// The management clusters' names: the canary, then `prod-1`...
pub fn names(count: usize) -> Vec<String> {
    std::iter::once(CANARY.to_owned())
        .chain((1..count).map(|i| format!("prod-{i}")))
        .collect()
}

/// The manager arguments that put management cluster `name` in the fleet.
pub fn member_args(name: &str) -> Vec<String> {
    let labels = if name == CANARY {
        "env=canary"
    } else {
        "env=prod"
    };
    fleet_manager_args(name, labels)
}

/// A prod management cluster: its apiserver and manager.
pub struct ProdCluster {
    pub name: String,
    pub server: ApiServer,
    pub manager: ManagerProcess,
}

/// Starts the hub and every cluster's NATS.
pub async fn start_nats(
    env: &TestEnv,
    manager_bin: &Path,
    names: &[String],
) -> Result<FleetNats, String> {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    env.start_fleet_nats("fleet-nats", &deploy, manager_bin, &names)
        .await
        .map_err(|e| e.to_string())
}

/// Starts the prod clusters' apiservers and managers.
pub async fn start_prod(
    env: &TestEnv,
    nats: &FleetNats,
    manager_bin: &Path,
    names: &[String],
) -> Result<Vec<ProdCluster>, String> {
    let mut clusters = Vec::new();
    for name in names.iter().filter(|n| *n != CANARY) {
        let server = env
            .start_apiserver(&format!("management-{name}"))
            .await
            .map_err(|e| e.to_string())?;
        install_hosted_cluster_crd(&server)
            .await
            .map_err(|e| e.to_string())?;
        let leaf = nats.leaf(name).ok_or(format!("no NATS for {name}"))?;
        let launch = ManagerLaunch {
            apiserver: Some(&server),
            nats: Some(leaf),
            ..ManagerLaunch::default()
        };
        let args = member_args(name);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let manager = env
            .start_manager_with(manager_bin, &launch, &args)
            .await
            .map_err(|e| format!("pko-manager of {name}: {e}"))?;
        clusters.push(ProdCluster {
            name: name.clone(),
            server,
            manager,
        });
    }
    Ok(clusters)
}

/// The sample in every prod cluster (gated on the canary, at the canary's release), then release `v3`
/// everywhere at once, followed cluster by cluster until every one rolled it out.
pub async fn roll_out(env: &TestEnv, prod: &[ProdCluster], nats: &FleetNats) -> Result<(), String> {
    let registry = env.registry().host();
    let sample: HostedClusterPackage =
        serde_saphyr::from_str(&SAMPLE.replace("${PKO_REGISTRY}", &registry))
            .map_err(|e| format!("{SAMPLE_FILE}: {e}"))?;
    let name = sample.metadata.name.clone().unwrap_or_default();
    let canary_api: Api<HostedClusterPackage> =
        Api::all(env.management().client().await.map_err(|e| e.to_string())?);
    let release = canary_api
        .get(&name)
        .await
        .map_err(|e| e.to_string())?
        .spec
        .template;
    let mut apis = vec![(CANARY.to_owned(), canary_api)];
    for cluster in prod {
        for i in 0..PROD_HOSTED_CLUSTERS {
            let labels = BTreeMap::from([("fleet".to_owned(), "demo".to_owned())]);
            add_hosted_cluster_to(
                &cluster.server,
                "fleet",
                &format!("hc-{i:02}"),
                labels,
                true,
            )
            .await
            .map_err(|e| e.to_string())?;
        }
        let mut gated = sample.clone();
        gated.spec.template = release.clone();
        gated.spec.promotion = Some(
            serde_json::from_value(json!({
                "managementClusterSelector": {"matchLabels": {"env": "canary"}},
                "soakSeconds": SOAK_SECONDS,
            }))
            .map_err(|e| e.to_string())?,
        );
        let api: Api<HostedClusterPackage> =
            Api::all(cluster.server.client().await.map_err(|e| e.to_string())?);
        api.patch(
            &name,
            &PatchParams::apply("pko-dev-env").force(),
            &Patch::Apply(&gated),
        )
        .await
        .map_err(|e| e.to_string())?;
        apis.push((cluster.name.clone(), api));
    }
    println!(
        "\nFleet of management clusters: {} under the hub {}; {name} in every prod cluster waits for the canary (spec.promotion: env=canary, soak {SOAK_SECONDS}s)",
        apis.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", "),
        nats.hub().url()
    );
    follow(&apis, &name).await?;
    println!("  release v3 to every management cluster at once:");
    let patch = json!({"spec": {"template": {"spec": {"config": {"release": "v3"}}}}});
    for (_, api) in &apis {
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| e.to_string())?;
    }
    follow(&apis, &name).await?;
    println!(
        "  see it: kubectl package fleet status hostedclusterpackage {name} --nats-url {} --nats-creds {} [--watch]",
        nats.hub().url(),
        nats.credentials_file().display()
    );
    Ok(())
}

/// Prints each cluster's progress (and its gate) whenever it changes, until every cluster rolled out its
/// current generation.
async fn follow(apis: &[(String, Api<HostedClusterPackage>)], name: &str) -> Result<(), String> {
    let started = Instant::now();
    let lines: Vec<ProgressLine> = apis.iter().map(|_| ProgressLine::default()).collect();
    let lines = &lines;
    wait_until("the fleet's rollouts", ROLLOUT_TIMEOUT, || async move {
        let mut waiting = Vec::new();
        for ((cluster, api), last) in apis.iter().zip(lines) {
            let h = api.get(name).await.map_err(|e| e.to_string())?;
            let generation = h.metadata.generation.unwrap_or_default();
            let status = h.status.unwrap_or_default();
            let gate = status
                .conditions
                .iter()
                .find(|c| c.type_ == "PromotionGateOpen" && c.status == "False")
                .map(|c| format!(" | gate: {}", c.message))
                .unwrap_or_default();
            let line = format!("{}{gate}", progress_line(&status));
            if last.changed(&line) {
                println!(
                    "  {:>5.1}s  {cluster:<8} {line}",
                    started.elapsed().as_secs_f64()
                );
            }
            let c = &status.counts;
            let done = status.observed_generation == generation
                && c.total_packages > 0
                && c.updated_packages == c.total_packages
                && c.available_packages == c.total_packages
                && c.failed_packages == 0;
            if !done {
                waiting.push(cluster.clone());
            }
        }
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(format!("waiting for {}", waiting.join(", ")))
        }
    })
    .await
    .map_err(|e| e.to_string())
}

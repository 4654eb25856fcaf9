//! The local fleet rollout: simulated HostedClusters (objects only, no apiservers) in risk groups, the
//! `deploy/examples/fleet-addon` package pushed to the local registry, the sample HostedClusterPackage
//! `deploy/examples/hosted-cluster-package.yaml` applied, then a new release rolled out group by group,
//! printing the HostedClusterPackage's progress whenever it changes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use oci_client::secrets::RegistryAuth;
use pko_package::files::PackageFiles;
use pko_package::image::ImageStore;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_testenv::{wait_until, TestEnv};
use serde_json::json;

pub const SAMPLE_FILE: &str = "deploy/examples/hosted-cluster-package.yaml";
pub const SAMPLE: &str = include_str!("../../../deploy/examples/hosted-cluster-package.yaml");
const PACKAGE: [(&str, &str); 2] = [
    (
        "manifest.yaml",
        include_str!("../../../deploy/examples/fleet-addon/manifest.yaml"),
    ),
    (
        "addon.yaml.gotmpl",
        include_str!("../../../deploy/examples/fleet-addon/addon.yaml.gotmpl"),
    ),
];
/// The namespace of the simulated HostedClusters; the sample selects them by `fleet=demo`.
const FLEET_NAMESPACE: &str = "fleet";
/// Risk labels by position; a cluster without one falls into the implicit last group.
const RISKS: [Option<&str>; 6] = [
    Some("early"),
    Some("normal"),
    Some("normal"),
    Some("late"),
    Some("late"),
    None,
];
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(180);

/// Creates `size` simulated HostedClusters, installs the sample HostedClusterPackage, waits for release
/// v1 everywhere, then rolls out release v2 and shows it progress.
pub async fn roll_out(env: &TestEnv, size: usize) -> Result<(), String> {
    for i in 0..size {
        let mut labels = BTreeMap::from([("fleet".to_owned(), "demo".to_owned())]);
        if let Some(risk) = RISKS[i % RISKS.len()] {
            labels.insert("risk".to_owned(), risk.to_owned());
        }
        env.add_hosted_cluster(FLEET_NAMESPACE, &format!("hc-{i:02}"), labels, true)
            .await
            .map_err(|e| e.to_string())?;
    }
    let registry = env.registry().host();
    let files: PackageFiles = PACKAGE
        .iter()
        .map(|(path, text)| ((*path).to_owned(), text.as_bytes().to_vec()))
        .collect();
    let image = format!("{registry}/examples/fleet-addon:v1");
    ImageStore::new(vec![registry.clone()])
        .push(&image, &files, &RegistryAuth::Anonymous)
        .await
        .map_err(|e| format!("push {image}: {e}"))?;

    let client = env.management().client().await.map_err(|e| e.to_string())?;
    let sample: HostedClusterPackage =
        serde_saphyr::from_str(&SAMPLE.replace("${PKO_REGISTRY}", &registry))
            .map_err(|e| format!("{SAMPLE_FILE}: {e}"))?;
    let name = sample.metadata.name.clone().unwrap_or_default();
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    api.patch(
        &name,
        &PatchParams::apply("pko-dev-env").force(),
        &Patch::Apply(&sample),
    )
    .await
    .map_err(|e| e.to_string())?;
    println!(
        "\nFleet rollout: HostedClusterPackage {name} ({SAMPLE_FILE}) over {size} simulated HostedClusters in namespace {FLEET_NAMESPACE}"
    );
    println!("  release v1 to every HCP namespace (a new cluster gets its Package at once):");
    follow(&client, &name).await?;

    println!("  release v2, partition by partition, maxUnavailable 1:");
    let patch = json!({"spec": {"template": {"spec": {"config": {"release": "v2"}}}}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| e.to_string())?;
    follow(&client, &name).await?;
    println!("  see it: kubectl get hostedclusterpackages; kubectl get packages -A -l package-operator.run/hosted-cluster-package={name}");
    println!("  roll out another release: kubectl patch hostedclusterpackage {name} --type merge -p '{{\"spec\":{{\"template\":{{\"spec\":{{\"config\":{{\"release\":\"v3\"}}}}}}}}}}'");
    Ok(())
}

/// Prints a line each time the progress changes, until every Package is updated and available for the
/// current generation.
async fn follow(client: &Client, name: &str) -> Result<(), String> {
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let started = Instant::now();
    let last = std::sync::Arc::new(crate::ProgressLine::default());
    wait_until("the fleet rollout", ROLLOUT_TIMEOUT, || {
        let (api, last) = (api.clone(), last.clone());
        async move {
            let h = api.get(name).await.map_err(|e| e.to_string())?;
            let generation = h.metadata.generation.unwrap_or_default();
            let status = h.status.unwrap_or_default();
            let line = if status.observed_generation == generation {
                progress_line(&status)
            } else {
                format!("waiting for the manager to plan generation {generation}")
            };
            if last.changed(&line) {
                println!("  {:>5.1}s  {line}", started.elapsed().as_secs_f64());
            }
            let c = &status.counts;
            let done = status.observed_generation == generation
                && c.total_packages > 0
                && c.updated_packages == c.total_packages
                && c.available_packages == c.total_packages
                && c.progressed_packages == c.total_packages
                && c.in_flight_packages == 0
                && c.failed_packages == 0;
            if done {
                Ok(())
            } else {
                Err(line)
            }
        }
    })
    .await
    .map(drop)
    .map_err(|e| e.to_string())
}

/// `updated 2/6  available 5/6 | early 1/1  normal 1/2  late 0/2  unknown 0/1 | in flight: fleet-hc-02`,
/// with `| failed 1` when updated Packages fail (the HostedClusterPackage's Progressing says why).
pub(crate) fn progress_line(
    status: &pko_proto::core::hosted_cluster_package::HostedClusterPackageStatus,
) -> String {
    let c = &status.counts;
    let groups: Vec<String> = status
        .partitions
        .iter()
        .map(|p| {
            format!(
                "{} {}/{}",
                p.name, p.counts.updated_packages, p.counts.total_packages
            )
        })
        .collect();
    let mut line = format!(
        "updated {}/{}  available {}/{} | {}",
        c.updated_packages,
        c.total_packages,
        c.available_packages,
        c.total_packages,
        groups.join("  ")
    );
    if !status.processing.is_empty() {
        let in_flight: Vec<&str> = status
            .processing
            .iter()
            .map(|r| r.namespace.as_str())
            .collect();
        line.push_str(&format!(" | in flight: {}", in_flight.join(", ")));
    }
    if c.failed_packages > 0 {
        line.push_str(&format!(" | failed {}", c.failed_packages));
    }
    line
}

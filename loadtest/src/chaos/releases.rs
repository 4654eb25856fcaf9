//! The releases of a chaos run: every `RELEASE_EVERY` an image of its own (so a release needs the
//! registry) and a template pointing at it, some broken on the canary HostedCluster. The judge hears of
//! each release before any apiserver does.

use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use oci_client::secrets::RegistryAuth;
use pko_package::image::ImageStore;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_testenv::workload::WorkloadSimulator;
use pko_testenv::{wait_until, TestEnv};
use serde_json::json;
use tokio::sync::mpsc::UnboundedSender;

use crate::chaos::observer::Observed;
use crate::chaos::topology::NAME;
use pko_package::files::PackageFiles;

const RELEASE_EVERY: Duration = Duration::from_secs(30);
/// One release in this many is broken on the canary HostedCluster.
const BROKEN_ONE_IN: u64 = 4;
/// How long a release waits for the registry and the apiservers the schedule took away.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(300);

/// The chaos run's package (`package/`): the fleet bench's Widget, then a hosted phase.
const PACKAGE: [(&str, &str); 3] = [
    ("manifest.yaml", include_str!("package/manifest.yaml")),
    (
        "widget.yaml.gotmpl",
        include_str!("../../../cmd/kubectl-package/tests/packages/fleet-widget/widget.yaml.gotmpl"),
    ),
    (
        "hosted.yaml.gotmpl",
        include_str!("package/hosted.yaml.gotmpl"),
    ),
];

/// The package's files, its manifest marked with `release` so each release has a digest of its own.
fn package_files(release: &str) -> PackageFiles {
    PACKAGE
        .iter()
        .map(|(path, text)| {
            let text = match *path {
                "manifest.yaml" => format!("# release {release}\n{text}"),
                _ => (*text).to_owned(),
            };
            ((*path).to_owned(), text.into_bytes())
        })
        .collect()
}

/// `r001`, `r002`, …
pub fn release_name(n: usize) -> String {
    format!("r{n:03}")
}

/// Pushes release `release`'s image ([`package_files`]) and returns its reference, waiting for the
/// registry when it is down.
pub async fn push_image(env: &TestEnv, release: &str) -> Result<String, String> {
    let registry = env.registry().host();
    let files = package_files(release);
    let image = format!("{registry}/chaos/chaos-widget:{release}");
    let store = ImageStore::new(vec![registry]);
    wait_until(&format!("push {image}"), PUBLISH_TIMEOUT, || async {
        store
            .push(&image, &files, &RegistryAuth::Anonymous)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())?;
    Ok(image)
}

/// Points every cluster's HostedClusterPackage at `image` and `release`, each once its apiserver takes it.
pub async fn set_release(clients: &[Client], image: &str, release: &str) -> Result<(), String> {
    let patch =
        json!({"spec": {"template": {"spec": {"image": image, "config": {"release": release}}}}});
    for client in clients {
        let api: Api<HostedClusterPackage> = Api::all(client.clone());
        wait_until(
            &format!("release {release} set"),
            PUBLISH_TIMEOUT,
            || async {
                api.patch(NAME, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Where the releases go.
pub struct ReleaseTargets<'a> {
    pub env: &'a TestEnv,
    pub clients: &'a [Client],
    pub to_judge: &'a UnboundedSender<Observed>,
    pub canary_workload: &'a WorkloadSimulator,
    pub canary_namespace: &'a str,
}

/// Whether each release in turn (r001, r002, ...) is broken on the canary: drawn from `seed` alone.
pub fn broken_releases(seed: u64) -> impl Iterator<Item = bool> {
    let mut rng = fastrand::Rng::with_seed(seed.rotate_left(17));
    std::iter::repeat_with(move || rng.u64(0..BROKEN_ONE_IN) == 0)
}

/// A release every `RELEASE_EVERY` through `window`, broken ones drawn from `seed`; returns how many.
pub async fn release_continuously(
    seed: u64,
    window: Duration,
    targets: &ReleaseTargets<'_>,
) -> Result<usize, String> {
    let mut broken_ones = broken_releases(seed);
    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() + RELEASE_EVERY <= window {
        // The releases' own pace.
        tokio::time::sleep(RELEASE_EVERY).await;
        n += 1;
        let release = release_name(n);
        let broken = broken_ones.next().unwrap_or(false);
        publish(targets, &release, broken).await?;
        println!(
            "  {:>7.1}s release {release}{}",
            started.elapsed().as_secs_f64(),
            if broken {
                " (broken on the canary)"
            } else {
                ""
            }
        );
    }
    Ok(n)
}

/// Pushes, tells the judge, breaks it on the canary if `broken`, and sets it everywhere.
pub async fn publish(
    targets: &ReleaseTargets<'_>,
    release: &str,
    broken: bool,
) -> Result<(), String> {
    let image = push_image(targets.env, release).await?;
    if broken {
        targets
            .canary_workload
            .break_release(targets.canary_namespace, release);
    }
    let _ = targets.to_judge.send(Observed::Release {
        name: release.to_owned(),
        broken,
    });
    set_release(targets.clients, &image, release).await
}

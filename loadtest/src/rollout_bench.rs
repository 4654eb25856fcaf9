//! `rollout`: the issue-6 figures. (1) Hand-off latency of a HostedClusterPackage rollout: with
//! maxUnavailable 1 every update waits for the previous Package, so the time from one Package turning
//! live (Available=True and Progressing=False at its new generation) to the next Package taking the new
//! template is the rollout's own
//! overhead; both moments are seen by one watch. (2) The manager's CPU time and memory for a fleet of N
//! HostedClusters: the fleet arriving (each gets its connector objects), a HostedClusterPackage creating
//! N Packages, rolling updates across all of them (one per release: memory must not grow with the
//! releases the fleet has been through), and the idle fleet afterwards; with several sizes, each in a
//! fresh environment, then the cost per HostedCluster of each size side by side.

use pko_proto::well_known::{CONNECTOR_LABEL, HOSTED_CLUSTER_PACKAGE_LABEL};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures::{stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use oci_client::secrets::RegistryAuth;

use pko_package::image::ImageStore;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::package::Package;
use pko_testenv::{ManagerProcess, TestEnv};
use serde_json::json;

use crate::object_set_bench::{manager_path, percentile, start_with_manager};
use crate::package_bench::{changing_package_files, package_files};
use crate::process_usage::{usage, Usage};
use pko_actors::engine::fleet::promotion_gate::package_template_hash;

const TIMEOUT: Duration = Duration::from_secs(1200);
/// How long the manager is watched after the rollout, in windows.
const IDLE_WINDOW: Duration = Duration::from_secs(20);
const IDLE_WINDOWS: u64 = 3;
/// HostedClusters created at once while building the fleet.
const CREATE_CONCURRENCY: usize = 16;

/// Which releases the measured fleet goes through.
#[derive(Debug, Clone, Copy)]
pub struct Releases {
    pub count: usize,
    /// Each release changes every rendered object (else only the image, which renders the same).
    pub changing: bool,
}

pub async fn run(
    handoff_clusters: usize,
    rollouts: usize,
    fleet_sizes: Vec<usize>,
    releases: Releases,
    manager: Option<PathBuf>,
) -> ExitCode {
    match measure(handoff_clusters, rollouts, fleet_sizes, releases, manager).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pko-loadtest rollout: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn measure(
    handoff_clusters: usize,
    rollouts: usize,
    fleet_sizes: Vec<usize>,
    releases: Releases,
    manager: Option<PathBuf>,
) -> Result<(), String> {
    let manager = manager_path(manager)?;
    let mut per_cluster = Vec::new();
    for (i, &size) in fleet_sizes.iter().enumerate() {
        // Each size in an environment and manager of its own: nothing left over from the one before.
        let (env, client, pko) = start_with_manager(&manager, 0).await?;
        env.simulate_hypershift().await.map_err(|e| e.to_string())?;
        let images = Images::new(&env);
        if i == 0 {
            handoff(&env, &client, &images, handoff_clusters, rollouts).await?;
        }
        let images = Images {
            changing: releases.changing,
            ..images
        };
        let cost = fleet_cost(&env, &client, &pko, &images, size, releases.count).await?;
        per_cluster.push((size, cost));
    }
    if per_cluster.len() > 1 {
        println!("per HostedCluster (the fleet arriving, its Packages created and live, the rolling updates):");
        for (size, cost) in per_cluster {
            println!(
                "  {size:>5}: {:.1} ms wall, {:.2} ms manager CPU, {:.0} KiB manager RSS ({:.0} KiB settled)",
                cost.wall.as_secs_f64() * 1e3 / size as f64,
                cost.cpu.as_secs_f64() * 1e3 / size as f64,
                cost.rss_kib as f64 / size as f64,
                cost.settled_rss_kib as f64 / size as f64
            );
        }
    }
    Ok(())
}

/// What a fleet cost the manager from before it arrived until its last rolling update was done.
struct FleetCost {
    wall: Duration,
    cpu: Duration,
    /// RSS growth, when the last rolling update was done.
    rss_kib: i64,
    /// RSS growth after the idle windows.
    settled_rss_kib: i64,
}

/// Package images of distinct digests, pushed on demand.
pub(crate) struct Images {
    store: ImageStore,
    host: String,
    /// Each image renders objects that name it ([`changing_package_files`]).
    changing: bool,
}

impl Images {
    pub(crate) fn new(env: &TestEnv) -> Self {
        let host = env.registry().host();
        Self {
            store: ImageStore::new(vec![host.clone()]),
            host,
            changing: false,
        }
    }

    pub(crate) async fn push(&self, tag: &str, nonce: usize) -> Result<String, String> {
        let image = format!("{}/bench/rollout:{tag}", self.host);
        let files = if self.changing {
            changing_package_files
        } else {
            package_files
        };
        self.store
            .push(&image, &files(nonce), &RegistryAuth::Anonymous)
            .await
            .map_err(|e| e.to_string())?;
        Ok(image)
    }
}

/// `count` Available HostedClusters labelled `fleet=<namespace>` in a new namespace.
pub(crate) async fn fleet(env: &TestEnv, prefix: &str, count: usize) -> Result<String, String> {
    fleet_with(env, prefix, count, |ns, _| {
        BTreeMap::from([("fleet".to_owned(), ns.to_owned())])
    })
    .await
}

/// `count` Available HostedClusters `hc-0000`… in a new namespace, the `i`th labelled
/// `labels(namespace, i)`.
pub(crate) async fn fleet_with(
    env: &TestEnv,
    prefix: &str,
    count: usize,
    labels: impl Fn(&str, usize) -> BTreeMap<String, String>,
) -> Result<String, String> {
    let ns = env
        .management()
        .create_namespace(prefix)
        .await
        .map_err(|e| e.to_string())?;
    let created: Vec<Result<(), String>> = stream::iter(0..count)
        .map(|i| {
            let labels = labels(&ns, i);
            let ns = ns.clone();
            async move {
                env.add_hosted_cluster(&ns, &format!("hc-{i:04}"), labels, true)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect()
        .await;
    created.into_iter().collect::<Result<Vec<()>, String>>()?;
    Ok(ns)
}

/// Creates a HostedClusterPackage over the HostedClusters labelled `fleet=<fleet>`: starts a rollout.
pub(crate) async fn create_hcpkg(
    api: &Api<HostedClusterPackage>,
    name: &str,
    fleet: &str,
    image: &str,
    max_unavailable: usize,
) -> Result<(), String> {
    let spec: HostedClusterPackage = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
        "metadata": {"name": name},
        "spec": {
            "hostedClusterSelector": {"matchLabels": {"fleet": fleet}},
            "strategy": {"rollingUpgrade": {"maxUnavailable": max_unavailable}},
            "template": {"spec": {"image": image, "config": {"items": ["a", "b", "c"]}}},
        },
    }))
    .map_err(|e| e.to_string())?;
    api.create(&PostParams::default(), &spec)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Points the template of HostedClusterPackage `name` at `image`: starts a rollout.
pub(crate) async fn set_image(
    api: &Api<HostedClusterPackage>,
    name: &str,
    image: &str,
) -> Result<(), String> {
    let patch = json!({"spec": {"template": {"spec": {"image": image}}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The strict definition the rollout gates on: Available=True and Progressing=False, both for the
/// Package's current generation (its latest revision is live).
fn live(p: &Package) -> bool {
    let fresh = |type_: &str, status: &str| {
        p.status.iter().flat_map(|s| &s.conditions).any(|c| {
            c.type_ == type_ && c.status == status && c.observed_generation == p.metadata.generation
        })
    };
    fresh("Available", "True") && fresh("Progressing", "False")
}

/// When each Package of a rollout to `image` first showed it, and first was live with it.
#[derive(Default)]
pub(crate) struct Timeline {
    updated: HashMap<String, Instant>,
    available: HashMap<String, Instant>,
}

/// Follows the Packages of `owner` until all `total` are live on `image`.
pub(crate) async fn follow_rollout(
    client: &Client,
    owner: &str,
    image: &str,
    total: usize,
    start: impl std::future::Future<Output = Result<(), String>>,
) -> Result<Timeline, String> {
    let packages: Api<Package> = Api::all(client.clone());
    let config =
        watcher::Config::default().labels(&format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={owner}"));
    let mut events = watcher::watcher(packages, config).boxed();
    // The watch is established (its initial list is through) before the rollout starts.
    loop {
        match events.next().await {
            Some(Ok(Event::InitDone)) => break,
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err("package watch ended".to_owned()),
        }
    }
    start.await?;
    let mut timeline = Timeline::default();
    let follow = async {
        while timeline.available.len() < total {
            let Some(event) = events.next().await else {
                return Err("package watch ended".to_owned());
            };
            let (Ok(Event::Apply(p)) | Ok(Event::InitApply(p))) = event else {
                continue;
            };
            if p.spec.image != image {
                continue;
            }
            let now = Instant::now();
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            timeline.updated.entry(ns.clone()).or_insert(now);
            if live(&p) {
                timeline.available.entry(ns).or_insert(now);
            }
        }
        Ok(())
    };
    tokio::time::timeout(TIMEOUT, follow)
        .await
        .map_err(|_| format!("rollout to {image} not finished after {TIMEOUT:?}"))??;
    Ok(timeline)
}

/// (1) Hand-off latency under maxUnavailable 1, over `rollouts` rollouts of a fleet of `clusters`.
async fn handoff(
    env: &TestEnv,
    client: &Client,
    images: &Images,
    clusters: usize,
    rollouts: usize,
) -> Result<(), String> {
    let ns = fleet(env, "bench-handoff", clusters).await?;
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let name = format!("{ns}-handoff");
    let first = images.push("handoff-0", 1_000).await?;
    let create = create_hcpkg(&api, &name, &ns, &first, 1);
    follow_rollout(client, &name, &first, clusters, create).await?;

    let mut samples = Vec::new();
    for rollout in 1..=rollouts {
        let image = images
            .push(&format!("handoff-{rollout}"), 1_000 + rollout)
            .await?;
        let started = Instant::now();
        let update = set_image(&api, &name, &image);
        let timeline = follow_rollout(client, &name, &image, clusters, update).await?;
        let took = started.elapsed();
        let mut updates: Vec<(Instant, &String)> =
            timeline.updated.iter().map(|(ns, t)| (*t, ns)).collect();
        updates.sort();
        for pair in updates.windows(2) {
            let (previous, next) = (pair[0].1, pair[1].0);
            let became_available = timeline.available[previous];
            samples.push(next.saturating_duration_since(became_available));
        }
        println!(
            "rollout {rollout}: {clusters} Packages one at a time in {:.1} s",
            took.as_secs_f64()
        );
    }
    samples.sort();
    println!(
        "hand-off, Package live (Available=True, Progressing=False) -> next Package updated (maxUnavailable 1): p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} hand-offs)",
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        percentile(&samples, 0.9).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        samples[samples.len() - 1].as_secs_f64() * 1e3,
        samples.len()
    );
    Ok(())
}

/// How often the manager polls the status and its own RSS while a preflight runs.
const PREFLIGHT_SAMPLE: Duration = Duration::from_millis(100);

/// Waits for the preflight of HostedClusterPackage `name`'s current template and prints what it cost:
/// from the template change to `status.preflight`, the manager's CPU time, its RSS before and at the
/// highest sample, and what it found.
async fn preflight_cost(
    api: &Api<HostedClusterPackage>,
    name: &str,
    pid: u32,
    size: usize,
) -> Result<(), String> {
    let (started, before) = (Instant::now(), usage(pid)?);
    let mut peak_kib = before.rss_kib;
    let found = loop {
        let h = api.get(name).await.map_err(|e| e.to_string())?;
        let hash = package_template_hash(&h.spec);
        let preflight = h.status.and_then(|s| s.preflight);
        if let Some(p) = preflight.filter(|p| p.template_hash == hash) {
            break p;
        }
        if started.elapsed() > TIMEOUT {
            return Err(format!("no preflight of {name} after {TIMEOUT:?}"));
        }
        peak_kib = peak_kib.max(usage(pid)?.rss_kib);
        tokio::time::sleep(PREFLIGHT_SAMPLE).await;
    };
    let after = usage(pid)?;
    println!(
        "  preflight of {size} namespaces: {:.2} s to status.preflight, manager CPU {:.2} s, RSS {:.0} → peak {:.0} MiB; {} changed in {} groups, {} refused, {} unchecked",
        started.elapsed().as_secs_f64(),
        after.cpu.saturating_sub(before.cpu).as_secs_f64(),
        before.rss_kib as f64 / 1024.0,
        peak_kib.max(after.rss_kib) as f64 / 1024.0,
        found.changed,
        found.groups.len(),
        found.refused,
        found.unchecked,
    );
    Ok(())
}

/// Preflights the manager ran so far, whatever their result (its /metrics).
async fn preflight_runs(pko: &ManagerProcess) -> Result<u64, String> {
    let (_, body) = pko.get("/metrics").await?;
    Ok(body
        .lines()
        .filter(|line| line.starts_with("pko_hostedclusterpackage_preflights_total{"))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum())
}

/// Prints what a step cost the manager: wall time, CPU time, memory after and at peak so far.
pub(crate) fn step(
    label: &str,
    pid: u32,
    before: &Usage,
    started: Instant,
) -> Result<Usage, String> {
    let after = usage(pid)?;
    let wall = started.elapsed();
    let cpu = after.cpu.saturating_sub(before.cpu);
    println!(
        "{label}: {:.1} s, manager CPU {:.1} s ({:.0}% of one core), RSS {:.0} MiB, peak RSS {:.0} MiB",
        wall.as_secs_f64(),
        cpu.as_secs_f64(),
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64().max(1e-3),
        after.rss_kib as f64 / 1024.0,
        after.peak_rss_kib as f64 / 1024.0,
    );
    Ok(after)
}

/// Waits until `count` connector Deployments exist in the fleet's HCP namespaces.
pub(crate) async fn wait_connectors(
    client: &Client,
    fleet: &str,
    count: usize,
) -> Result<(), String> {
    let deployments: Api<Deployment> = Api::all(client.clone());
    let selector = ListParams::default().labels(&format!("{CONNECTOR_LABEL}=True"));
    let prefix = format!("{fleet}-");
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let list = deployments
            .list(&selector)
            .await
            .map_err(|e| e.to_string())?;
        let installed = list
            .items
            .iter()
            .filter(|d| {
                d.metadata
                    .namespace
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&prefix))
            })
            .count();
        if installed >= count {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{installed}/{count} connectors after {TIMEOUT:?}"));
        }
        // Polling a list here is the measurement's own pace, not synchronisation of a test.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// (2) The manager's cost for a fleet of `size` HostedClusters.
async fn fleet_cost(
    env: &TestEnv,
    client: &Client,
    pko: &ManagerProcess,
    images: &Images,
    size: usize,
    releases: usize,
) -> Result<FleetCost, String> {
    let pid = pko.pid().ok_or("the manager has no pid")?;
    let mut before = usage(pid)?;
    let (start, started_at) = (usage(pid)?, Instant::now());
    println!(
        "fleet of {size}: manager before, CPU {:.1} s, RSS {:.0} MiB",
        before.cpu.as_secs_f64(),
        before.rss_kib as f64 / 1024.0
    );

    let started = Instant::now();
    let ns = fleet(env, "bench-fleet", size).await?;
    wait_connectors(client, &ns, size).await?;
    before = step(
        &format!("{size} HostedClusters arrive, each gets its connector objects"),
        pid,
        &before,
        started,
    )?;

    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let name = format!("{ns}-fleet");
    let v1 = images.push("fleet-1", 2_001).await?;
    let max_unavailable = (size / 10).max(1);
    let started = Instant::now();
    let create = create_hcpkg(&api, &name, &ns, &v1, max_unavailable);
    follow_rollout(client, &name, &v1, size, create).await?;
    before = step(
        &format!("HostedClusterPackage creates {size} Packages, all live"),
        pid,
        &before,
        started,
    )?;

    for release in 2..=releases + 1 {
        let image = images
            .push(&format!("fleet-{release}"), 2_000 + release)
            .await?;
        let started = Instant::now();
        let update = async {
            set_image(&api, &name, &image).await?;
            preflight_cost(&api, &name, pid, size).await
        };
        follow_rollout(client, &name, &image, size, update).await?;
        before = step(
            &format!("release {release}: rolling update of {size} Packages, maxUnavailable {max_unavailable}"),
            pid,
            &before,
            started,
        )?;
    }

    let mut cost = FleetCost {
        wall: started_at.elapsed(),
        cpu: before.cpu.saturating_sub(start.cpu),
        rss_kib: before.rss_kib as i64 - start.rss_kib as i64,
        settled_rss_kib: 0,
    };

    // Afterwards nothing changes: what the manager still does (old revisions archived and torn down)
    // should fade to next to nothing, and no preflight runs. Three windows show the trend.
    let preflights = preflight_runs(pko).await?;
    for window in 1..=IDLE_WINDOWS {
        let started = Instant::now();
        tokio::time::sleep(IDLE_WINDOW).await;
        before = step(
            &format!(
                "after the rollout, {size} HostedClusters and Packages, {}-{} s",
                (window - 1) * IDLE_WINDOW.as_secs(),
                window * IDLE_WINDOW.as_secs()
            ),
            pid,
            &before,
            started,
        )?;
    }
    println!(
        "preflights while the fleet idled: {} (every Package on the template: nothing to preflight)",
        preflight_runs(pko).await? - preflights
    );
    // What the fleet keeps once the manager had time to hand back what the rollouts freed.
    cost.settled_rss_kib = before.rss_kib as i64 - start.rss_kib as i64;
    println!(
        "settled: RSS {:.0} MiB, {:.0} KiB per HostedCluster above the manager before the fleet",
        before.rss_kib as f64 / 1024.0,
        cost.settled_rss_kib as f64 / size as f64
    );
    Ok(cost)
}

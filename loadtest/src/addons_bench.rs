//! `rollout --addons N`: a fleet as SREs run it, many add-ons on every hosted cluster (issue 64). N
//! HostedClusterPackages of different packages over the same S HostedClusters, each with its own
//! partition (by `risk` or by `region`) and maxUnavailable 10 %, so the manager holds S × N Packages,
//! ObjectDeployments and ObjectSets. Per size it prints: the add-ons created and live; the manager's
//! RSS and heap settled, per Package; one add-on's instant release (every Package live, the others
//! settled) and another's rolling release, each with the apiserver's own request count and the
//! manager's CPU per Package update; the manager's CPU for 100 HostedCluster label changes a second
//! over 60 s, of a label no selector reads and of one that moves clusters between groups; image pulls
//! per image; and a restart of the settled manager (ready, writes, peak RSS). Then one line per size.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use pko_actors::runtime::heap_trim::TRIM_EVERY;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::hypershift::HostedCluster;
use pko_testenv::{ManagerProcess, TestEnv};
use serde_json::json;

use crate::apiserver_requests::{delta, request_counts};
use crate::object_set_bench::{manager_path, start_with_manager};
use crate::process_usage::usage;
use crate::restart_bench::{object_counts, restart, settle};
use crate::rollout_bench::{fleet_with, follow_rollout, set_image, step, wait_connectors, Images};

/// The manager's heap in use, as it counts it every `TRIM_EVERY`.
const HEAP_IN_USE: &str = "pko_heap_bytes{state=\"in_use\"}";
/// Label changes a second during the churn windows, and how long each lasts.
const CHURN_RATE: u32 = 100;
const CHURN_WINDOW: Duration = Duration::from_secs(60);

/// One fleet size: S HostedClusters, N add-ons on each.
#[derive(Debug, Clone, Copy)]
pub struct FleetShape {
    pub clusters: usize,
    pub addons: usize,
}

/// What one size measured, for the table at the end.
struct ShapeFigures {
    shape: FleetShape,
    created: Duration,
    settled_rss_kib: u64,
    per_package_kib: f64,
    heap_per_package_kib: Option<f64>,
    instant: Release,
    rolling: Release,
    churn_unread: f64,
    churn_moving: f64,
    ready: Duration,
    restart_writes: u64,
    restart_peak_ratio: f64,
}

/// One add-on's release over the fleet.
struct Release {
    took: Duration,
    requests_per_update: f64,
    cpu_ms_per_update: f64,
}

/// The sizes `--fleet` and `--addons` name: pairwise, or one add-on count for every fleet size.
pub fn shapes(fleet: &[usize], addons: &[usize]) -> Result<Vec<FleetShape>, String> {
    let counts: Vec<usize> = match addons {
        [one] => vec![*one; fleet.len()],
        many if many.len() == fleet.len() => many.to_vec(),
        many => {
            return Err(format!(
                "--addons names {} counts for {} fleet sizes: give one, or one per size",
                many.len(),
                fleet.len()
            ))
        }
    };
    if let Some(zero) = fleet.iter().chain(&counts).find(|n| **n == 0) {
        return Err(format!(
            "--fleet and --addons take counts of at least 1, not {zero}"
        ));
    }
    Ok(fleet
        .iter()
        .zip(counts)
        .map(|(&clusters, addons)| FleetShape { clusters, addons })
        .collect())
}

pub async fn measure(
    shapes: Vec<FleetShape>,
    manager: Option<std::path::PathBuf>,
) -> Result<(), String> {
    let manager = manager_path(manager)?;
    let mut rows = Vec::new();
    for shape in shapes {
        // Each size in an environment and manager of its own.
        let (env, client, pko) = start_with_manager(&manager, 0).await?;
        env.simulate_hypershift().await.map_err(|e| e.to_string())?;
        rows.push(measure_shape(&env, &client, pko, &manager, shape).await?);
    }
    println!("fleet × add-ons (S clusters × N HostedClusterPackages):");
    println!(
        "  {:>5} × {:>2}  {:>6}  {:>8}  {:>9}  {:>8}  {:>8}  {:>9}  {:>9}  {:>8}  {:>9}  {:>9}  {:>7}  {:>6}  {:>6}",
        "S", "N", "pkgs", "create s", "RSS MiB", "KiB/pkg", "heap/pkg", "instant s",
        "rolling s", "req/upd", "CPU ms/u", "churn %", "move %", "ready s", "peak×"
    );
    for r in rows {
        println!(
            "  {:>5} × {:>2}  {:>6}  {:>8.1}  {:>9.0}  {:>8.1}  {:>8}  {:>9.1}  {:>9.1}  {:>8.1}  {:>9.1}  {:>9.1}  {:>7.1}  {:>6.2}  {:>6.2}  (restart writes {})",
            r.shape.clusters,
            r.shape.addons,
            r.shape.clusters * r.shape.addons,
            r.created.as_secs_f64(),
            r.settled_rss_kib as f64 / 1024.0,
            r.per_package_kib,
            r.heap_per_package_kib
                .map_or_else(|| "-".to_owned(), |k| format!("{k:.1}")),
            r.instant.took.as_secs_f64(),
            r.rolling.took.as_secs_f64(),
            r.instant.requests_per_update,
            r.instant.cpu_ms_per_update,
            r.churn_unread,
            r.churn_moving,
            r.ready.as_secs_f64(),
            r.restart_peak_ratio,
            r.restart_writes,
        );
    }
    Ok(())
}

/// The add-on `index`: its name, image tag and partition (even ones by `risk`, odd ones by `region`).
fn addon_spec(fleet: &str, index: usize, image: &str, max_unavailable: usize) -> serde_json::Value {
    let partition = if index % 2 == 0 {
        json!({"labelKey": "risk", "order": {"static": ["early", "normal", "late"]}})
    } else {
        json!({"labelKey": "region", "order": {"static": ["west", "east"]}})
    };
    json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
        "metadata": {"name": format!("{fleet}-addon-{index}")},
        "spec": {
            "hostedClusterSelector": {"matchLabels": {"fleet": fleet}},
            "partition": partition,
            "strategy": {"rollingUpgrade": {"maxUnavailable": max_unavailable}},
            "template": {"spec": {"image": image, "config": {"addon": index}}},
        },
    })
}

/// A cluster's labels: the fleet, and where the two partitions put it.
fn cluster_labels(fleet: &str, i: usize) -> BTreeMap<String, String> {
    let risk = ["early", "normal", "late"][i % 3];
    let region = ["west", "east"][i % 2];
    BTreeMap::from([
        ("fleet".to_owned(), fleet.to_owned()),
        ("risk".to_owned(), risk.to_owned()),
        ("region".to_owned(), region.to_owned()),
    ])
}

async fn measure_shape(
    env: &TestEnv,
    client: &Client,
    pko: ManagerProcess,
    manager: &std::path::Path,
    shape: FleetShape,
) -> Result<ShapeFigures, String> {
    let FleetShape { clusters, addons } = shape;
    let pid = pko.pid().ok_or("the manager has no pid")?;
    let start = usage(pid)?;
    let heap_before = pko.metric(HEAP_IN_USE).await.ok();
    let images = Images::new(env);
    let fleet = fleet_with(env, "bench-addons", clusters, cluster_labels).await?;
    wait_connectors(client, &fleet, clusters).await?;
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let max_unavailable = (clusters / 10).max(1);

    // Every add-on created at once, each of its own package, until all S × N Packages are live.
    let started = Instant::now();
    let mut first_images = Vec::new();
    for index in 0..addons {
        first_images.push(
            images
                .push(&format!("addon-{index}-1"), 4_000 + index)
                .await?,
        );
    }
    let created = try_join_all(first_images.iter().enumerate().map(|(index, image)| {
        let api = api.clone();
        let body = addon_spec(&fleet, index, image, max_unavailable);
        let name = format!("{fleet}-addon-{index}");
        async move {
            let create = async move {
                let hcpkg: HostedClusterPackage =
                    serde_json::from_value(body).map_err(|e| e.to_string())?;
                api.create(&Default::default(), &hcpkg)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            };
            follow_rollout(client, &name, image, clusters, create).await
        }
    }))
    .await?;
    drop(created);
    let created = started.elapsed();
    let after_create = step(
        &format!("{clusters} HostedClusters × {addons} add-ons: all Packages live"),
        pid,
        &start,
        started,
    )?;
    settle(env).await?;
    // The manager counts its heap every TRIM_EVERY: wait for a count of the settled heap.
    tokio::time::sleep(TRIM_EVERY + Duration::from_secs(1)).await;
    let settled = usage(pid)?;
    let packages = (clusters * addons) as f64;
    let per_package_kib = settled.rss_kib.saturating_sub(start.rss_kib) as f64 / packages;
    let heap_per_package_kib = match (heap_before, pko.metric(HEAP_IN_USE).await.ok()) {
        (Some(before), Some(after)) => {
            Some(after.saturating_sub(before) as f64 / 1024.0 / packages)
        }
        _ => None,
    };
    println!(
        "settled: RSS {:.0} MiB (peak {:.0} MiB), {per_package_kib:.1} KiB per Package above the manager before the fleet{}",
        settled.rss_kib as f64 / 1024.0,
        after_create.peak_rss_kib as f64 / 1024.0,
        heap_per_package_kib.map_or_else(String::new, |k| format!(", heap in use {k:.1} KiB per Package"))
    );

    let under = FleetUnderTest {
        env,
        client,
        pko: &pko,
        images: &images,
        fleet: &fleet,
        clusters,
    };
    // One add-on released instantly over the whole fleet, the others settled.
    let instant = release(&under, 0, true).await?;
    // Another rolled with maxUnavailable 10 % (the same add-on again when there is only one).
    let rolling = release(&under, usize::from(addons > 1), false).await?;
    let pulls = pko.metric("pko_package_image_pulls_total").await?;
    let registry = env.registry();
    let (manifests, blobs) = (
        registry
            .requests("manifest", "get")
            .await
            .map_err(|e| e.to_string())?,
        registry
            .requests("blob", "get")
            .await
            .map_err(|e| e.to_string())?,
    );
    println!(
        "image pulls by the manager: {pulls} for {} images ({} Packages each); the registry served \
         {manifests} manifest and {blobs} blob GETs (every client, pushes included)",
        addons + 2,
        clusters
    );

    let hosted: Api<HostedCluster> = Api::namespaced(client.clone(), &fleet);
    let churn_unread = churn(
        &hosted,
        pid,
        clusters,
        |n| json!({"metadata": {"labels": {"churn": n.to_string()}}}),
    )
    .await?;
    println!(
        "{CHURN_RATE} label changes/s for {} s of a label no selector reads: manager {churn_unread:.1} % of one core",
        CHURN_WINDOW.as_secs()
    );
    settle(env).await?;
    // Cluster i starts in region i % 2; each round over the fleet moves every cluster to the other.
    let churn_moving = churn(&hosted, pid, clusters, |n| {
        let region = ["west", "east"][(n % clusters + n / clusters + 1) % 2];
        json!({"metadata": {"labels": {"region": region}}})
    })
    .await?;
    println!(
        "{CHURN_RATE} label changes/s for {} s moving clusters between region groups: manager {churn_moving:.1} % of one core",
        CHURN_WINDOW.as_secs()
    );
    settle(env).await?;

    let settled_rss = usage(pid)?.rss_kib;
    let objects = object_counts(client).await?;
    println!("restart of the settled manager:");
    let restarted = restart(env, manager, pko, &objects, "streaming").await?;
    Ok(ShapeFigures {
        shape,
        created,
        settled_rss_kib: settled.rss_kib,
        per_package_kib,
        heap_per_package_kib,
        instant,
        rolling,
        churn_unread,
        churn_moving,
        ready: restarted.ready,
        restart_writes: restarted.writes,
        restart_peak_ratio: restarted.peak_kib as f64 / settled_rss.max(1) as f64,
    })
}

/// The fleet a size measures, and what it runs on.
struct FleetUnderTest<'a> {
    env: &'a TestEnv,
    client: &'a Client,
    pko: &'a ManagerProcess,
    images: &'a Images,
    /// The fleet's namespace (also its `fleet` label).
    fleet: &'a str,
    clusters: usize,
}

/// Releases add-on `index` to a new image, instantly or rolling; what it took and cost per update.
async fn release(
    under: &FleetUnderTest<'_>,
    index: usize,
    instant: bool,
) -> Result<Release, String> {
    let FleetUnderTest {
        env,
        client,
        pko,
        images,
        fleet,
        clusters,
    } = *under;
    let pid = pko.pid().ok_or("the manager has no pid")?;
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let name = format!("{fleet}-addon-{index}");
    let tag = format!(
        "addon-{index}-{}",
        if instant { "instant" } else { "rolling" }
    );
    let image = images
        .push(&tag, 5_000 + index * 2 + usize::from(instant))
        .await?;
    // A merge patch: the other strategy is removed, so exactly one is set.
    let strategy = if instant {
        json!({"instant": {}, "rollingUpgrade": null})
    } else {
        json!({"instant": null, "rollingUpgrade": {"maxUnavailable": (clusters / 10).max(1)}})
    };
    let patch = json!({"spec": {"strategy": strategy}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| e.to_string())?;
    let requests_before = request_counts(&[env.management()]).await?;
    let before = usage(pid)?;
    let started = Instant::now();
    follow_rollout(
        client,
        &name,
        &image,
        clusters,
        set_image(&api, &name, &image),
    )
    .await?;
    let took = started.elapsed();
    let after = step(
        &format!(
            "add-on {index}, {} release over {clusters} clusters: every Package live",
            if instant {
                "instant"
            } else {
                "rolling (maxUnavailable 10 %)"
            }
        ),
        pid,
        &before,
        started,
    )?;
    let requests: f64 = delta(
        &requests_before,
        &request_counts(&[env.management()]).await?,
    )
    .iter()
    .map(|(_, n)| n)
    .sum();
    let cpu = after.cpu.saturating_sub(before.cpu);
    let figures = Release {
        took,
        requests_per_update: requests / clusters as f64,
        cpu_ms_per_update: cpu.as_secs_f64() * 1e3 / clusters as f64,
    };
    println!(
        "  {:.1} apiserver requests per Package update (all clients, by the apiserver's count), manager CPU {:.1} ms per update",
        figures.requests_per_update, figures.cpu_ms_per_update
    );
    Ok(figures)
}

/// Changes one HostedCluster's labels at [`CHURN_RATE`] a second for [`CHURN_WINDOW`], round robin,
/// each change `patch(n)`; the manager's CPU meanwhile, in % of one core.
async fn churn(
    hosted: &Api<HostedCluster>,
    pid: u32,
    clusters: usize,
    patch: impl Fn(usize) -> serde_json::Value,
) -> Result<f64, String> {
    let before = usage(pid)?;
    let started = Instant::now();
    // The benchmark's own pace: one change per tick.
    let mut tick = tokio::time::interval(Duration::from_secs(1) / CHURN_RATE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Each change in flight on its own, so the apiserver's latency does not lower the rate.
    let mut changes = tokio::task::JoinSet::new();
    let mut n = 0usize;
    while started.elapsed() < CHURN_WINDOW {
        tick.tick().await;
        let name = format!("hc-{:04}", n % clusters);
        let (hosted, body) = (hosted.clone(), patch(n));
        changes.spawn(async move {
            hosted
                .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
                .await
                .map(drop)
                .map_err(|e| format!("relabelling {name}: {e}"))
        });
        n += 1;
    }
    while let Some(done) = changes.join_next().await {
        done.map_err(|e| e.to_string())??;
    }
    let wall = started.elapsed();
    let cpu = usage(pid)?.cpu.saturating_sub(before.cpu);
    let rate = n as f64 / wall.as_secs_f64();
    if rate < f64::from(CHURN_RATE) * 0.9 {
        println!("  (the benchmark reached {rate:.0} changes/s, not {CHURN_RATE})");
    }
    Ok(100.0 * cpu.as_secs_f64() / wall.as_secs_f64())
}

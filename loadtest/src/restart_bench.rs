//! `restart`: the issue-42 restart figures. A fleet of N HostedClusters with their Packages live under one
//! HostedClusterPackage settles; then the manager is stopped as a kubelet stops it and started again. The
//! report: time to ready, time until every controller has reconciled each object of its kind again, the
//! manager's CPU for it, and every write the apiserver served meanwhile (Lease renewals aside), which for
//! a settled fleet should be none, with the reconciles that failed. The manager restarts four times, its
//! watches starting with paged lists and with streaming lists (`--initial-lists`), alternated, twice
//! each, so the two are compared in one run over one fleet; peak RSS (VmHWM) is the start-up's. With `--replicas N`, see
//! `shard_restart_bench`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::Client;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_testenv::{ManagerLaunch, ManagerProcess, TestEnv};

use crate::apiserver_requests::{delta, request_counts};
use crate::object_set_bench::{manager_path, start_with_manager};
use crate::process_usage::{usage, Usage};
use crate::rollout_bench::{create_hcpkg, fleet, follow_rollout, wait_connectors, Images};

/// A fleet is settled when the apiserver served no write for this long.
const QUIET: Duration = Duration::from_secs(10);
pub const TIMEOUT: Duration = Duration::from_secs(1200);
/// After every object was reconciled again, writes are still counted this long (a status write may wait
/// up to a second to be merged with the next).
pub const AFTERMATH: Duration = Duration::from_secs(10);
/// How the manager is stopped: SIGTERM, then SIGKILL after this (a kubelet's default grace).
pub const GRACE: Duration = Duration::from_secs(30);

pub async fn run(hosted_clusters: usize, manager: Option<PathBuf>) -> ExitCode {
    match measure(hosted_clusters, manager).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pko-loadtest restart: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn measure(size: usize, manager: Option<PathBuf>) -> Result<(), String> {
    let manager = manager_path(manager)?;
    let (env, client, pko) = start_with_manager(&manager, 0).await?;
    env.simulate_hypershift().await.map_err(|e| e.to_string())?;
    live_fleet(&env, &client, size).await?;
    let settling = Instant::now();
    settle(&env).await?;
    println!(
        "restart over {size} HostedClusters: fleet live, settled {:.1} s later (no write for {} s)",
        settling.elapsed().as_secs_f64(),
        QUIET.as_secs()
    );
    let objects = object_counts(&client).await?;
    // Alternated, twice each: one restart of each is too few to tell the two apart from noise.
    let mut peaks: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut running = pko;
    for lists in ["paged", "streaming", "paged", "streaming"] {
        println!("  restart with --initial-lists {lists}:");
        let restarted = restart(&env, &manager, running, &objects, lists).await?;
        peaks.entry(lists).or_default().push(restarted.peak_kib);
        running = restarted.manager;
    }
    let mean = |lists: &str| {
        let runs = &peaks[lists];
        runs.iter().sum::<u64>() as f64 / runs.len().max(1) as f64
    };
    println!(
        "  peak RSS at start-up, mean of two: streaming {:.2}x paged ({:.0} MiB against {:.0} MiB)",
        mean("streaming") / mean("paged").max(1.0),
        mean("streaming") / 1024.0,
        mean("paged") / 1024.0
    );
    Ok(())
}

/// A fleet of `size` HostedClusters with their connectors, and a HostedClusterPackage whose Packages
/// are all live.
pub async fn live_fleet(env: &TestEnv, client: &Client, size: usize) -> Result<(), String> {
    let images = Images::new(env);
    let ns = fleet(env, "bench-restart", size).await?;
    wait_connectors(client, &ns, size).await?;
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let name = format!("{ns}-restart");
    let v1 = images.push("restart-1", 3_001).await?;
    let create = create_hcpkg(&api, &name, &ns, &v1, (size / 10).max(1));
    follow_rollout(client, &name, &v1, size, create)
        .await
        .map(|_| ())
}

/// Waits until the apiserver served no write for [`QUIET`]; the pace of the measurement, not a
/// synchronisation.
pub async fn settle(env: &TestEnv) -> Result<(), String> {
    let deadline = Instant::now() + TIMEOUT;
    let mut last = writes(&request_counts(&[env.management()]).await?);
    loop {
        tokio::time::sleep(QUIET).await;
        let now = writes(&request_counts(&[env.management()]).await?);
        if now == last {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("still writing after {TIMEOUT:?}: {now:?}"));
        }
        last = now;
    }
}

/// Write requests by `verb resource`, Lease renewals left out (a leader renews every few seconds).
pub fn writes(counts: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    counts
        .iter()
        .filter(|(key, _)| {
            let (verb, resource) = key.split_once(' ').unwrap_or((key.as_str(), ""));
            matches!(verb, "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE") && resource != "leases"
        })
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

/// The kinds the manager reconciles, by the `controller` label of its metrics, and how many objects of
/// each the apiserver holds.
pub(crate) async fn object_counts(
    client: &Client,
) -> Result<BTreeMap<&'static str, usize>, String> {
    let kinds = [
        (
            "hosted_cluster",
            "hypershift.openshift.io",
            "v1beta1",
            "HostedCluster",
            "hostedclusters",
        ),
        (
            "package",
            "package-operator.run",
            "v1alpha1",
            "Package",
            "packages",
        ),
        (
            "object_deployment",
            "package-operator.run",
            "v1alpha1",
            "ObjectDeployment",
            "objectdeployments",
        ),
        (
            "object_set",
            "package-operator.run",
            "v1alpha1",
            "ObjectSet",
            "objectsets",
        ),
    ];
    let mut counts = BTreeMap::new();
    for (controller, group, version, kind, plural) in kinds {
        let resource =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let listed = api
            .list_metadata(&ListParams::default())
            .await
            .map_err(|e| format!("listing {plural}: {e}"))?;
        counts.insert(controller, listed.items.len());
    }
    Ok(counts)
}

/// `pko_reconcile_total` of a manager by `(controller, result)`.
pub async fn reconciles(pko: &ManagerProcess) -> Result<BTreeMap<(String, String), u64>, String> {
    let (_, body) = pko.get("/metrics").await?;
    Ok(body
        .lines()
        .filter_map(|line| {
            let (labels, value) = line
                .strip_prefix("pko_reconcile_total{")?
                .split_once("} ")?;
            let label = |name: &str| {
                labels
                    .split(',')
                    .find_map(|pair| pair.strip_prefix(&format!("{name}=\"")))
                    .map(|v| v.trim_end_matches('"').to_owned())
            };
            Some((
                (label("controller")?, label("result")?),
                value.split_whitespace().next()?.parse().ok()?,
            ))
        })
        .collect())
}

/// Whether every kind's controller reconciled (successfully or not) at least as many times as there are
/// objects of the kind; the first kind short of it otherwise.
fn short_of(
    done: &BTreeMap<(String, String), u64>,
    objects: &BTreeMap<&'static str, usize>,
) -> Option<String> {
    objects.iter().find_map(|(controller, &count)| {
        let reconciled: u64 = done
            .iter()
            .filter(|((c, _), _)| c == controller)
            .map(|(_, n)| n)
            .sum();
        (reconciled < count as u64).then(|| format!("{controller}: {reconciled}/{count}"))
    })
}

/// A manager started again over a settled fleet.
pub(crate) struct Restarted {
    pub(crate) manager: ManagerProcess,
    /// Its peak RSS.
    pub(crate) peak_kib: u64,
    /// From its start until it was ready.
    pub(crate) ready: Duration,
    /// Writes the apiserver served from the stop until [`AFTERMATH`] after every object was reconciled.
    pub(crate) writes: u64,
}

/// Stops `pko` and starts the manager again with `--initial-lists lists`.
pub(crate) async fn restart(
    env: &TestEnv,
    manager: &std::path::Path,
    pko: ManagerProcess,
    objects: &BTreeMap<&'static str, usize>,
    lists: &str,
) -> Result<Restarted, String> {
    let before = writes(&request_counts(&[env.management()]).await?);
    pko.terminate(GRACE).await.map_err(|e| e.to_string())?;
    drop(pko);
    let started = Instant::now();
    let launch = ManagerLaunch::default();
    let pko = env
        .start_manager_with(manager, &launch, &["--initial-lists", lists])
        .await
        .map_err(|e| e.to_string())?;
    let ready = started.elapsed();
    let pid = pko.pid().ok_or("the restarted manager has no pid")?;
    let deadline = Instant::now() + TIMEOUT;
    let reobserved = loop {
        let done = reconciles(&pko).await?;
        match short_of(&done, objects) {
            None => break started.elapsed(),
            Some(short) if Instant::now() > deadline => {
                return Err(format!(
                    "not every object reconciled after {TIMEOUT:?}: {short}"
                ))
            }
            // Polling the manager's metrics is the measurement's pace.
            Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let cpu_reobserved = usage(pid)?.cpu;
    tokio::time::sleep(AFTERMATH).await;
    let after = writes(&request_counts(&[env.management()]).await?);
    let done = reconciles(&pko).await?;
    let Usage {
        rss_kib: rss,
        peak_rss_kib: peak,
        ..
    } = usage(pid)?;
    let written = delta(&before, &after);
    let total = written.iter().map(|(_, n)| *n as u64).sum::<u64>();
    let errors: u64 = done
        .iter()
        .filter(|((_, result), _)| result == "error")
        .map(|(_, n)| n)
        .sum();
    let objects_line: Vec<String> = objects.iter().map(|(c, n)| format!("{n} {c}")).collect();
    println!("  objects: {}", objects_line.join(", "));
    println!(
        "  restarted manager ready after {:.2} s; every object reconciled again after {:.2} s, manager CPU {:.2} s for it; RSS {} MiB {} s later, peak {} MiB",
        ready.as_secs_f64(),
        reobserved.as_secs_f64(),
        cpu_reobserved.as_secs_f64(),
        rss / 1024,
        AFTERMATH.as_secs(),
        peak / 1024
    );
    let by_result: Vec<String> = done
        .iter()
        .map(|((c, r), n)| format!("{c} {r} {n}"))
        .collect();
    println!("  reconciles since the restart: {}", by_result.join(", "));
    println!("  reconcile errors: {errors}");
    println!(
        "  writes the apiserver served from the stop to {} s after: {total}{}",
        AFTERMATH.as_secs(),
        write_mix(&written)
    );
    Ok(Restarted {
        manager: pko,
        peak_kib: peak,
        ready,
        writes: total,
    })
}

/// The writes by `verb resource`, as ` (PATCH packages 3, …)`; empty when there were none.
pub fn write_mix(written: &[(String, f64)]) -> String {
    if written.is_empty() {
        return String::new();
    }
    let mix: Vec<String> = written.iter().map(|(k, n)| format!("{k} {n:.0}")).collect();
    format!(" ({})", mix.join(", "))
}

//! `fleet`: a fleet of management clusters rolling one release canary → prod (issue 21). Each management
//! cluster is a kube-apiserver of its own (one etcd, a prefix each) with its own NATS leaf and pko-manager,
//! under one hub NATS; each has N simulated HostedClusters whose workload (a Widget) reports ready a fixed
//! lag after each change. The release goes to every cluster at once; prod clusters are gated on the canary
//! with a soak. Measured: the end-to-end wall time against the waits that are not pko's (the workload's
//! readiness per wave, the soak), the share left to pko, the hub's event lag (stored at the hub minus
//! stored in the cluster's own stream), and the hub's catch-up after an outage during a rollout.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures::{stream, StreamExt};
use kube::api::{Patch, PatchParams};
use kube::Api;
use oci_client::secrets::RegistryAuth;
use pko_package::files::PackageFiles;
use pko_package::image::ImageStore;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::fleet::AGGREGATE_STREAM;
use pko_proto::rollout_events::STREAM;
use pko_testenv::workload::{install_widget_crd, WorkloadSimulator, WIDGET_GROUP};
use pko_testenv::{
    add_hosted_cluster_to, fleet_manager_args, install_hosted_cluster_crd, wait_until, ApiServer,
    EnvConfig, FleetNats, ManagerLaunch, ManagerProcess, Nats, StoredEvent, TestEnv,
};
use serde_json::json;

use crate::apiserver_requests::{delta, request_counts};
use crate::object_set_bench::{manager_path, manager_request_samples, percentile};
use crate::process_usage::usage;

const PACKAGE: [(&str, &str); 2] = [
    (
        "manifest.yaml",
        include_str!("../../cmd/kubectl-package/tests/packages/fleet-widget/manifest.yaml"),
    ),
    (
        "widget.yaml.gotmpl",
        include_str!("../../cmd/kubectl-package/tests/packages/fleet-widget/widget.yaml.gotmpl"),
    ),
];
const NAME: &str = "bench-fleet";
const CREATE_CONCURRENCY: usize = 16;
const TIMEOUT: Duration = Duration::from_secs(1800);
const IDLE_SAMPLE: Duration = Duration::from_secs(10);
/// Request kinds printed, most frequent first.
const REQUEST_MIX_ROWS: usize = 20;

/// What to measure.
pub struct FleetBench {
    pub clusters: usize,
    pub hosted_clusters: usize,
    pub max_unavailable: usize,
    pub readiness_lag: Duration,
    pub soak: Duration,
    pub outage: Duration,
    pub manager: Option<PathBuf>,
}

pub async fn run(bench: FleetBench) -> ExitCode {
    match measure(&bench).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pko-loadtest fleet: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One management cluster of the fleet.
struct Cluster<'a> {
    name: String,
    server: &'a ApiServer,
    manager: ManagerProcess,
    api: Api<HostedClusterPackage>,
    _workload: WorkloadSimulator,
}

fn names(count: usize) -> Vec<String> {
    std::iter::once("canary".to_owned())
        .chain((1..count).map(|i| format!("prod-{i}")))
        .collect()
}

async fn measure(bench: &FleetBench) -> Result<(), String> {
    let manager = manager_path(bench.manager.clone())?;
    let started = Instant::now();
    let env = TestEnv::start(EnvConfig {
        hosted_clusters: 0,
        controller_manager: false,
    })
    .await
    .map_err(|e| e.to_string())?;
    let names = names(bench.clusters.max(2));
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let nats = env
        .start_fleet_nats("fleet-nats", &deploy, &manager, &name_refs)
        .await
        .map_err(|e| e.to_string())?;
    let server_names: Vec<String> = names[1..]
        .iter()
        .map(|n| format!("management-{n}"))
        .collect();
    let extra: Vec<ApiServer> =
        futures::future::join_all(server_names.iter().map(|n| env.start_apiserver(n)))
            .await
            .into_iter()
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
    let servers: Vec<&ApiServer> = std::iter::once(env.management()).chain(&extra).collect();
    let image = push_release(&env).await?;
    let mut clusters = Vec::new();
    for (name, server) in names.iter().zip(&servers) {
        clusters.push(start_cluster(&env, &nats, name, server, &manager, bench).await?);
    }
    println!(
        "fleet: {} management clusters × {} HostedClusters ready in {:.1} s (maxUnavailable {}, workload ready {:.0} s after a change, soak {:.0} s)",
        clusters.len(),
        bench.hosted_clusters,
        started.elapsed().as_secs_f64(),
        bench.max_unavailable,
        bench.readiness_lag.as_secs_f64(),
        bench.soak.as_secs_f64()
    );

    // Release v1 installs everywhere (gated too), then v2 is the measured rollout.
    for cluster in &clusters {
        let h = release(bench, &cluster.name, &image);
        cluster
            .api
            .patch(
                NAME,
                &PatchParams::apply("pko-loadtest").force(),
                &Patch::Apply(&h),
            )
            .await
            .map_err(|e| e.to_string())?;
    }
    wait_settled(&clusters, bench.hosted_clusters).await?;
    let before: Vec<_> = clusters
        .iter()
        .map(|c| usage(c.manager.pid().unwrap_or_default()))
        .collect::<Result<_, _>>()?;
    // The servers' share of the machine: every apiserver and etcd.
    let server_pids: Vec<u32> = servers
        .iter()
        .filter_map(|s| s.pid())
        .chain(
            env.processes()
                .into_iter()
                .filter(|(name, _)| name == "etcd")
                .map(|(_, pid)| pid),
        )
        .collect();
    let servers_cpu = || -> Duration {
        server_pids
            .iter()
            .filter_map(|pid| usage(*pid).ok())
            .map(|u| u.cpu)
            .sum()
    };
    // What the servers cost idle (watches, leases, the controllers' resyncs), to tell it from the release's.
    let idle_from = (Instant::now(), servers_cpu());
    tokio::time::sleep(IDLE_SAMPLE).await;
    let idle_per_second = servers_cpu().saturating_sub(idle_from.1).as_secs_f64()
        / idle_from.0.elapsed().as_secs_f64();
    let requests_before = request_counts(&servers).await?;
    let sent_before = manager_requests(&clusters).await?;
    let servers_before = servers_cpu();
    let rolled = Instant::now();
    let v2 = json!({"spec": {"template": {"spec": {"config": {"release": "v2"}}}}});
    for cluster in &clusters {
        cluster
            .api
            .patch(NAME, &PatchParams::default(), &Patch::Merge(&v2))
            .await
            .map_err(|e| e.to_string())?;
    }
    let generation = clusters[0]
        .api
        .get(NAME)
        .await
        .map_err(|e| e.to_string())?
        .metadata
        .generation
        .unwrap_or_default();
    wait_settled(&clusters, bench.hosted_clusters).await?;
    let wall = rolled.elapsed();
    let cpu: Duration = clusters
        .iter()
        .zip(&before)
        .map(|(c, b)| {
            usage(c.manager.pid().unwrap_or_default())
                .map(|u| u.cpu.saturating_sub(b.cpu))
                .unwrap_or_default()
        })
        .sum();
    let servers_used = servers_cpu().saturating_sub(servers_before);
    let requests = request_counts(&servers).await?;
    let sent = manager_requests(&clusters).await?;
    let waves = bench.hosted_clusters.div_ceil(bench.max_unavailable.max(1)) as u32;
    let stage = bench.readiness_lag * waves;
    let waits = stage * 2 + bench.soak;
    let overhead = wall.saturating_sub(waits);
    println!(
        "release v2 canary → {} prod clusters: {:.1} s end to end; waits not pko's {:.1} s (2 stages × {waves} waves × {:.0} s workload readiness + {:.0} s soak); pko's share {:.1} s = {:.1} %; managers' CPU {:.1} s",
        clusters.len() - 1,
        wall.as_secs_f64(),
        waits.as_secs_f64(),
        bench.readiness_lag.as_secs_f64(),
        bench.soak.as_secs_f64(),
        overhead.as_secs_f64(),
        overhead.as_secs_f64() / wall.as_secs_f64() * 100.0,
        cpu.as_secs_f64()
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "  the machine meanwhile: managers {:.1} s + apiservers and etcd {:.1} s of CPU, of {:.1} s {cores} cores offer in that time",
        cpu.as_secs_f64(),
        servers_used.as_secs_f64(),
        wall.as_secs_f64() * cores as f64
    );
    println!(
        "  apiservers and etcd idle: {:.2} CPU-s per s ({:.1} s of the release's {:.1} s)",
        idle_per_second,
        idle_per_second * wall.as_secs_f64(),
        servers_used.as_secs_f64()
    );
    print_request_mix(
        &requests_before,
        &requests,
        clusters.len() * bench.hosted_clusters,
    );
    print_manager_requests(&sent_before, &sent, clusters.len() * bench.hosted_clusters);
    let (canary_finished, prod_started) = stage_times(&nats, &names, generation).await?;
    println!(
        "  canary finished {:.1} s after the release; first prod update {:.1} s after that (soak {:.0} s)",
        (canary_finished - system_nanos(rolled)) as f64 / 1e9,
        (prod_started - canary_finished) as f64 / 1e9,
        bench.soak.as_secs_f64()
    );
    let lags = hub_lags(&nats, &names, Some(generation)).await?;
    print_lags(
        "hub event lag (stored at the hub − stored in the cluster's stream)",
        lags,
    );

    // The hub away for the outage while the canary rolls v3 (prod stays gated meanwhile).
    nats.hub().kill();
    let cut = Instant::now();
    let v3 = json!({"spec": {"template": {"spec": {"config": {"release": "v3"}}}}});
    clusters[0]
        .api
        .patch(NAME, &PatchParams::default(), &Patch::Merge(&v3))
        .await
        .map_err(|e| e.to_string())?;
    tokio::time::sleep(bench.outage.saturating_sub(cut.elapsed())).await;
    let canary_stream = stored(nats.leaf("canary").ok_or("no canary NATS")?, STREAM).await?;
    let cut_at = system_nanos(cut);
    let buffered = canary_stream.iter().filter(|m| m.time >= cut_at).count();
    let local: Vec<String> = canary_stream.into_iter().map(|m| m.id).collect();
    nats.hub().restart().await.map_err(|e| e.to_string())?;
    let back = Instant::now();
    wait_until(
        "the hub's aggregate caught up",
        Duration::from_secs(300),
        || async {
            let at_hub = stored_ids_from(nats.hub(), "canary").await?;
            if at_hub.len() >= local.len() && at_hub[..local.len()] == local[..] {
                Ok(())
            } else {
                Err(format!("{} of {} at the hub", at_hub.len(), local.len()))
            }
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    println!(
        "hub outage of {:.0} s during the canary's rollout: {} canary events stored locally meanwhile (of {} in its stream); the hub held them all {:.2} s after it was back, in order, none twice",
        bench.outage.as_secs_f64(),
        buffered,
        local.len(),
        back.elapsed().as_secs_f64()
    );
    for cluster in &clusters {
        let u = usage(cluster.manager.pid().unwrap_or_default())?;
        println!(
            "  {}: manager RSS {:.0} MiB (apiserver {})",
            cluster.name,
            u.rss_kib as f64 / 1024.0,
            cluster.server.name()
        );
    }
    Ok(())
}

/// The HostedCluster stand-in and Widget CRDs in `server`, a management cluster of the fleet; its client.
pub(crate) async fn install_fleet_crds(server: &ApiServer) -> Result<kube::Client, String> {
    let client = server.client().await.map_err(|e| e.to_string())?;
    install_hosted_cluster_crd(server)
        .await
        .map_err(|e| e.to_string())?;
    install_widget_crd(&client, WIDGET_GROUP)
        .await
        .map_err(|e| e.to_string())?;
    Ok(client)
}

/// Requests the managers sent so far, by verb (their own `pko_apiserver_requests_total`, every answer).
async fn manager_requests(clusters: &[Cluster<'_>]) -> Result<BTreeMap<String, f64>, String> {
    let mut counts = BTreeMap::new();
    for cluster in clusters {
        for (labels, value) in manager_request_samples(&cluster.manager).await? {
            let verb = labels
                .split(',')
                .find_map(|pair| pair.strip_prefix("verb=\""))
                .map_or("", |v| v.trim_end_matches('"'));
            *counts.entry(verb.to_owned()).or_insert(0.0) += value as f64;
        }
    }
    Ok(counts)
}

/// Of the apiservers' requests, those the managers sent (the rest are the apiservers' own, such as
/// quota admission's lookups, and the workload simulator's), by verb.
fn print_manager_requests(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    updates: usize,
) {
    let per_verb: Vec<(&String, f64)> = after
        .iter()
        .map(|(verb, n)| {
            let sent = n - before.get(verb).copied().unwrap_or(0.0);
            (verb, sent / updates.max(1) as f64)
        })
        .filter(|(_, n)| *n > 0.0)
        .collect();
    let total: f64 = per_verb.iter().map(|(_, n)| n).sum();
    let by_verb: Vec<String> = per_verb
        .iter()
        .map(|(verb, n)| format!("{verb} {n:.2}"))
        .collect();
    println!(
        "  sent by the managers: {total:.1} per Package update ({})",
        by_verb.join(", ")
    );
}

fn print_request_mix(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    updates: usize,
) {
    let mut mix = delta(before, after);
    mix.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = mix.iter().map(|(_, v)| v).sum();
    println!(
        "  apiserver requests during the release: {total:.0} = {:.1} per Package update ({updates} updates); most frequent:",
        total / updates.max(1) as f64
    );
    for (kind, count) in mix.into_iter().take(REQUEST_MIX_ROWS) {
        println!(
            "    {kind:<48} {count:>8.0}  {:>6.2} per update",
            count / updates.max(1) as f64
        );
    }
}

/// The fleet-widget package; with `release`, its manifest marked with it, so each release's image has a
/// digest of its own.
fn fleet_widget_files() -> PackageFiles {
    PACKAGE
        .iter()
        .map(|(path, text)| ((*path).to_owned(), text.as_bytes().to_vec()))
        .collect()
}

async fn push_release(env: &TestEnv) -> Result<String, String> {
    let registry = env.registry().host();
    let files = fleet_widget_files();
    let image = format!("{registry}/bench/fleet-widget:v1");
    ImageStore::new(vec![registry])
        .push(&image, &files, &RegistryAuth::Anonymous)
        .await
        .map_err(|e| format!("push {image}: {e}"))?;
    Ok(image)
}

async fn start_cluster<'a>(
    env: &TestEnv,
    nats: &FleetNats,
    name: &str,
    server: &'a ApiServer,
    manager: &std::path::Path,
    bench: &FleetBench,
) -> Result<Cluster<'a>, String> {
    let client = install_fleet_crds(server).await?;
    let created: Vec<Result<String, String>> = stream::iter(0..bench.hosted_clusters)
        .map(|i| async move {
            let labels = BTreeMap::from([("fleet".to_owned(), "bench".to_owned())]);
            add_hosted_cluster_to(server, "fleet", &format!("hc-{i:03}"), labels, true)
                .await
                .map(|c| c.hcp_namespace)
                .map_err(|e| e.to_string())
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect()
        .await;
    let namespaces: BTreeSet<String> = created.into_iter().collect::<Result<_, _>>()?;
    let workload = WorkloadSimulator::widgets(&client, namespaces, bench.readiness_lag);
    let leaf: &Nats = nats.leaf(name).ok_or(format!("no NATS for {name}"))?;
    let launch = ManagerLaunch {
        apiserver: Some(server),
        nats: Some(leaf),
        ..ManagerLaunch::default()
    };
    let labels = if name == "canary" {
        "env=canary"
    } else {
        "env=prod"
    };
    let args = fleet_manager_args(name, labels);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let manager = env
        .start_manager_with(manager, &launch, &args)
        .await
        .map_err(|e| format!("pko-manager of {name}: {e}"))?;
    Ok(Cluster {
        name: name.to_owned(),
        server,
        manager,
        api: Api::all(client),
        _workload: workload,
    })
}

fn release(bench: &FleetBench, cluster: &str, image: &str) -> serde_json::Value {
    let mut spec = json!({
        "hostedClusterSelector": {"matchLabels": {"fleet": "bench"}},
        "strategy": {"rollingUpgrade": {"maxUnavailable": bench.max_unavailable}},
        "template": {"spec": {"image": image, "config": {"release": "v1"}}},
    });
    if cluster != "canary" {
        spec["promotion"] = json!({
            "managementClusterSelector": {"matchLabels": {"env": "canary"}},
            "soakSeconds": bench.soak.as_secs(),
        });
    }
    json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
        "metadata": {"name": NAME}, "spec": spec,
    })
}

/// Until every cluster's rollout of its current generation is done.
/// Waits on a watch of each cluster's HostedClusterPackage (polling GETs would add their own load to the
/// apiservers being measured).
async fn wait_settled(clusters: &[Cluster<'_>], total: usize) -> Result<(), String> {
    let total = i32::try_from(total).unwrap_or(i32::MAX);
    let settled = move |h: Option<&HostedClusterPackage>| {
        h.is_some_and(|h| {
            let generation = h.metadata.generation.unwrap_or_default();
            h.status.as_ref().is_some_and(|s| {
                s.observed_generation == generation
                    && s.counts.total_packages == total
                    && s.counts.updated_packages == total
                    && s.counts.available_packages == total
                    && s.counts.progressed_packages == total
            })
        })
    };
    let waits = clusters.iter().map(|cluster| async move {
        match tokio::time::timeout(
            TIMEOUT,
            kube::runtime::wait::await_condition(cluster.api.clone(), NAME, settled),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("watching {} in {}: {e}", NAME, cluster.name)),
            Err(_) => Err(format!(
                "{} did not roll out within {} s",
                cluster.name,
                TIMEOUT.as_secs()
            )),
        }
    });
    futures::future::try_join_all(waits).await.map(|_| ())
}

fn system_nanos(at: Instant) -> i128 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or_default();
    now - at.elapsed().as_nanos() as i128
}

/// Every message of `stream` at `nats`, in order.
pub(crate) async fn stored(nats: &Nats, stream: &str) -> Result<Vec<StoredEvent>, String> {
    nats.stored_events(stream).await.map_err(|e| e.to_string())
}

/// The message ids the hub's aggregate stream took from management cluster `origin`.
async fn stored_ids_from(nats: &Nats, origin: &str) -> Result<Vec<String>, String> {
    Ok(stored(nats, AGGREGATE_STREAM)
        .await?
        .into_iter()
        .filter(|m| m.origin.as_deref() == Some(origin))
        .map(|m| m.id)
        .collect())
}

/// When the canary's own stream stored its `rolloutFinished` of `generation`, and the first prod
/// `packageUpdated` of it.
async fn stage_times(
    nats: &FleetNats,
    names: &[String],
    generation: i64,
) -> Result<(i128, i128), String> {
    let canary = stored(nats.leaf("canary").ok_or("no canary NATS")?, STREAM).await?;
    let finished = canary
        .iter()
        .find(|m| {
            m.event.generation == generation
                && m.event.kind == pko_proto::rollout_events::RolloutEventKind::RolloutFinished
        })
        .map(|m| m.time)
        .ok_or("no rolloutFinished of the canary")?;
    let mut first = i128::MAX;
    for name in &names[1..] {
        let events = stored(nats.leaf(name).ok_or("no NATS")?, STREAM).await?;
        if let Some(t) = events
            .iter()
            .filter(|m| {
                m.event.generation == generation
                    && m.event.kind == pko_proto::rollout_events::RolloutEventKind::PackageUpdated
            })
            .map(|m| m.time)
            .min()
        {
            first = first.min(t);
        }
    }
    Ok((finished, first))
}

/// For every event at the hub (of `generation` when given): stored at the hub − stored in its cluster.
async fn hub_lags(
    nats: &FleetNats,
    names: &[String],
    generation: Option<i64>,
) -> Result<Vec<Duration>, String> {
    let at_hub = stored(nats.hub(), AGGREGATE_STREAM).await?;
    let mut local: BTreeMap<(String, String), i128> = BTreeMap::new();
    for name in names {
        for m in stored(nats.leaf(name).ok_or("no NATS")?, STREAM).await? {
            local.insert((name.clone(), m.id), m.time);
        }
    }
    Ok(at_hub
        .iter()
        .filter(|m| generation.is_none_or(|g| m.event.generation == g))
        .filter_map(|m| {
            let sent = local.get(&(m.origin.clone()?, m.id.clone()))?;
            Some(Duration::from_nanos(
                u64::try_from(m.time - sent).unwrap_or(0),
            ))
        })
        .collect())
}

fn print_lags(label: &str, mut lags: Vec<Duration>) {
    if lags.is_empty() {
        println!("{label}: no events");
        return;
    }
    lags.sort();
    println!(
        "{label}: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} events)",
        percentile(&lags, 0.5).as_secs_f64() * 1e3,
        percentile(&lags, 0.99).as_secs_f64() * 1e3,
        lags[lags.len() - 1].as_secs_f64() * 1e3,
        lags.len()
    );
}

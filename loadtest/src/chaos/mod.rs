//! `chaos`: many faults at once under continuous releases, judged by an independent observer (issue 41).
//!
//! Two management clusters (canary and prod: an apiserver and a NATS leaf each under one hub NATS, the
//! canary's with a controller-manager), three `--sharding` replicas in each, simulated HostedClusters
//! whose Widgets report ready a second after each change, backed by a hosted-cluster apiserver per
//! management cluster that their connectors apply a hosted phase to (`topology.rs`). A release every 30 s, some
//! broken on the canary HostedCluster (`releases.rs`), while the seed's fault schedule runs
//! (`schedule.rs`, carried out by `faults.rs`). Then a final release, and the judge (`judge.rs`, fed by
//! the observer's own watches in `observer.rs`), the apiservers' audit logs, the NATS streams and the
//! clusters' objects (`report.rs`) say what broke. Nothing of pko's is in the judgement.

mod event_stream;
mod faults;
mod judge;
mod observer;
mod releases;
mod report;
mod schedule;
mod standalone;
mod topology;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::PostParams;
use kube::{Api, Client};
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_testenv::{wait_until, ApiServer, EnvConfig, TestEnv};
use tokio::sync::mpsc::UnboundedSender;

use crate::chaos::faults::World;
use crate::chaos::judge::{Judge, RollbackTally, Rules};
use crate::chaos::observer::{watch_packages, Observed};
use crate::chaos::releases::{
    publish, push_image, release_continuously, release_name, ReleaseTargets,
};
use crate::chaos::schedule::{count_by_kind, schedule, Fault, Topology};
use crate::chaos::topology::{
    ClusterServers, ClusterUnderTest, CANARY, CHURNED, CLUSTERS, HOSTED_CLUSTERS, MAX_UNAVAILABLE,
    NAME, REPLICAS,
};
use crate::object_set_bench::{manager_path, percentile};

/// How long every Package may take to be live on the final release once the faults are over.
const CONVERGENCE_BOUND: Duration = Duration::from_secs(300);

/// What to run.
pub struct ChaosRun {
    pub seed: u64,
    pub minutes: f64,
    /// HostedClusters per management cluster.
    pub clusters: usize,
    /// Replicas under member names of their own, as `deploy/manager-sharded` runs them.
    pub member_names: bool,
    pub manager: Option<PathBuf>,
}

pub async fn run(chaos: ChaosRun) -> ExitCode {
    println!(
        "chaos: seed {0} (replay: pko-loadtest chaos --seed {0} --minutes {1} --clusters {2}{3})",
        chaos.seed,
        chaos.minutes,
        chaos.clusters,
        if chaos.member_names {
            " --member-names"
        } else {
            ""
        }
    );
    match drive(&chaos).await {
        Ok(0) => ExitCode::SUCCESS,
        Ok(violations) => {
            eprintln!(
                "pko-loadtest chaos: seed {}: {violations} violations",
                chaos.seed
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("pko-loadtest chaos: seed {}: {e}", chaos.seed);
            ExitCode::FAILURE
        }
    }
}

/// Feeds the judge what the observer and the run tell it, in the order they arrive.
fn start_judging(
    judge: Arc<Mutex<Judge>>,
) -> (UnboundedSender<Observed>, tokio::task::JoinHandle<()>) {
    let (to_judge, mut judged) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Some(observed) = judged.recv().await {
            let mut judge = judge.lock().unwrap_or_else(|p| p.into_inner());
            match observed {
                Observed::Package(seen) => judge.observe(seen),
                Observed::Release { name, broken } => judge.release(&name, broken),
                Observed::Left { cluster, namespace } => judge.left(cluster, &namespace),
            }
        }
    });
    (to_judge, task)
}

fn expected(clusters: &[ClusterUnderTest<'_>]) -> BTreeMap<usize, BTreeSet<String>> {
    clusters
        .iter()
        .enumerate()
        .map(|(i, c)| (i, c.hosted.values().cloned().collect()))
        .collect()
}

async fn drive(chaos: &ChaosRun) -> Result<usize, String> {
    let manager = manager_path(chaos.manager.clone())?;
    let env = TestEnv::start(EnvConfig {
        hosted_clusters: CLUSTERS.len(),
        controller_manager: true,
    })
    .await
    .map_err(|e| e.to_string())?;
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let nats = env
        .start_fleet_nats_with("chaos-nats", &deploy, &manager, &CLUSTERS, true)
        .await
        .map_err(|e| e.to_string())?;
    let prod = env
        .start_apiserver("management-prod")
        .await
        .map_err(|e| e.to_string())?;
    let servers: [&ApiServer; 2] = [env.management(), &prod];
    let started = Instant::now();
    // The canary cluster's canary HostedCluster: the one place a broken release may go.
    let canary_namespace =
        pko_proto::hypershift::hosted_control_plane_namespace(HOSTED_CLUSTERS, CANARY);
    let judge = Arc::new(Mutex::new(Judge::new(Rules {
        max_unavailable: MAX_UNAVAILABLE,
        canary: (0, canary_namespace.clone()),
        gated: Some((1, 0)),
    })));
    let (to_judge, judging) = start_judging(judge.clone());
    let mut clients: Vec<Client> = Vec::new();
    let mut setups = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        let client = server.client().await.map_err(|e| e.to_string())?;
        // The observer's own watch, with its own client, from before the first Package.
        drop(watch_packages(
            client.clone(),
            i,
            NAME,
            started,
            to_judge.clone(),
        ));
        let hosted = &env.hosted_clusters()[i];
        setups.push(topology::prepare(server, hosted, chaos.clusters).await?);
        clients.push(client);
    }
    let mut clusters = Vec::new();
    for (i, (server, setup)) in servers.iter().zip(&setups).enumerate() {
        let servers = ClusterServers {
            management: server,
            hosted: &env.hosted_clusters()[i],
        };
        clusters.push(
            topology::start(&env, &nats, &manager, i, servers, setup, chaos.member_names).await?,
        );
    }
    let kept_uid = standalone::start(&clients[CHURNED]).await?;
    let first = release_name(0);
    let image = push_image(&env, &first).await?;
    let _ = to_judge.send(Observed::Release {
        name: first.clone(),
        broken: false,
    });
    for (i, client) in clients.iter().enumerate() {
        Api::<HostedClusterPackage>::all(client.clone())
            .create(
                &PostParams::default(),
                &topology::hosted_cluster_package(i, &image, &first)?,
            )
            .await
            .map_err(|e| e.to_string())?;
    }
    wait_converged(&judge, &expected(&clusters), &first).await?;
    let watches_before = report::open_watches(&servers).await?;
    println!(
        "  {:>7.1}s settled on {first}: {} management clusters × {} HostedClusters, {REPLICAS} replicas each",
        started.elapsed().as_secs_f64(),
        CLUSTERS.len(),
        chaos.clusters
    );

    let window = Duration::from_secs_f64(chaos.minutes * 60.0);
    let topology = Topology {
        clusters: CLUSTERS.len(),
        replicas: REPLICAS,
        hosted_clusters: chaos.clusters,
    };
    let faults = schedule(chaos.seed, window, &topology);
    let targets = ReleaseTargets {
        env: &env,
        clients: &clients,
        to_judge: &to_judge,
        canary_workload: &setups[0].workload,
        canary_namespace: &canary_namespace,
    };
    let mut world = World::new(&env, &nats, manager.clone(), clusters, to_judge.clone());
    let window_start = Instant::now();
    let (_, released) = tokio::join!(
        world.carry_out(&faults, window_start),
        release_continuously(chaos.seed, window, &targets)
    );
    let released = released?;
    let last = release_name(released + 1);
    publish(&targets, &last, false).await?;
    let quiet_from = started.elapsed();
    let expected_now = expected(&world.clusters);
    let converged = world
        .tend_until(window_start, wait_converged(&judge, &expected_now, &last))
        .await;
    world.restart_exited(window_start);
    let (violations, times, rollbacks) = {
        let mut judge = judge.lock().unwrap_or_else(|p| p.into_inner());
        let times = judge.finish(started.elapsed(), &last, quiet_from, &expected_now);
        (judge.violations.clone(), times, judge.rollbacks())
    };
    judging.abort();

    print_faults(&faults, &world.skipped, chaos.minutes);
    println!(
        "replicas that exited on their own (a Lease lost) and were started again: {}",
        world.restarted
    );
    print_releases(released, &last, rollbacks);
    if let Err(e) = &converged {
        println!(
            "convergence: not within {} s: {e}",
            CONVERGENCE_BOUND.as_secs()
        );
        report::rollout_standing(&clients).await?;
    }
    print_convergence(times);
    let mut findings: Vec<String> = violations.iter().map(ToString::to_string).collect();
    findings.extend(report::rss_findings(&world.rss));
    findings.extend(report::leftovers(&world.clusters).await?);
    findings.extend(standalone::findings(&clients[CHURNED], &kept_uid).await);
    findings.extend(report::double_writers(&servers)?);
    findings.extend(report::event_stream(&nats).await?);
    let watches_after = report::open_watches(&servers).await?;
    findings.extend(report::watch_leaks(
        &servers,
        &watches_before,
        &watches_after,
    ));
    println!("violations: {}", findings.len());
    for f in &findings {
        println!("  {f}");
    }
    if !findings.is_empty() {
        let kept = env.keep_files().map_err(|e| e.to_string())?;
        println!(
            "files of the run (every process's log, the audit logs): {}",
            kept.display()
        );
    }
    Ok(findings.len())
}

fn print_faults(faults: &[Fault], skipped: &BTreeMap<&'static str, usize>, minutes: f64) {
    println!("faults injected ({} in {minutes:.1} min):", faults.len());
    for (kind, n) in count_by_kind(faults) {
        match skipped.get(kind) {
            Some(skipped) => println!("  {kind}: {n} ({skipped} steps skipped)"),
            None => println!("  {kind}: {n}"),
        }
    }
}

fn print_releases(released: usize, last: &str, tally: RollbackTally) {
    let mut rolled = tally.rolled_back;
    rolled.sort();
    let after: Vec<String> = rolled
        .iter()
        .map(|d| format!("{:.0} s", d.as_secs_f64()))
        .collect();
    println!(
        "releases: {released} during the faults, then {last}; broken on the canary {}, taken by it {}, rolled back {} (after {}), left for a later release first {}",
        tally.broken,
        tally.reached,
        rolled.len(),
        after.join(", "),
        tally.superseded
    );
}

fn print_convergence(mut times: Vec<Duration>) {
    times.sort();
    if let Some(max) = times.last() {
        println!(
            "convergence after the last fault: p50 {:.1} s, p99 {:.1} s, max {:.1} s ({} Packages)",
            percentile(&times, 0.5).as_secs_f64(),
            percentile(&times, 0.99).as_secs_f64(),
            max.as_secs_f64(),
            times.len()
        );
    }
}

/// Until every expected Package is live on `release` in the judge's view.
async fn wait_converged(
    judge: &Arc<Mutex<Judge>>,
    expected: &BTreeMap<usize, BTreeSet<String>>,
    release: &str,
) -> Result<(), String> {
    wait_until(
        &format!("every Package live on {release}"),
        CONVERGENCE_BOUND,
        || async {
            let missing = judge
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .not_live_on(expected, release);
            if missing.is_empty() {
                Ok(())
            } else {
                Err(missing.join(", "))
            }
        },
    )
    .await
    .map_err(|e| e.to_string())
}

//! `restart --replicas N`: a sharded replica restarting over a settled fleet (issue 42, target 4). N
//! `--sharding` replicas work on a fleet of HostedClusters with their Packages live; once the apiserver
//! served no write for a while, one replica that does not coordinate is stopped as a kubelet stops it
//! and started again with the same arguments. The report: time to ready, time until the restarted
//! replica works on every object labelled for it (and none is labelled for a member that is gone), its
//! CPU for that, the label writes of the coordinator and every write the apiserver served meanwhile.
//! With member names (a StatefulSet's pods, the default) the replica takes its share back; with
//! `--member-per-process` its keys move to the others and on to the new member, as before member names.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::Client;
use pko_proto::well_known::{SHARD_MEMBER_LABEL, SHARD_OWNER_LABEL};
use pko_testenv::{sharded_manager_args, ManagerProcess};

use crate::apiserver_requests::{delta, request_counts};
use crate::object_set_bench::manager_path;
use crate::process_usage::usage;
use crate::restart_bench::{
    live_fleet, reconciles, settle, write_mix, writes, AFTERMATH, GRACE, TIMEOUT,
};
use crate::sharding_bench::{coordinator, sharded_env};

/// The member and coordinator Leases' duration (the manager's default).
const LEASE_SECONDS: u64 = 15;
/// The kinds whose objects are counted by owner, as `pko_shard_objects` names them.
const KINDS: [(&str, &str); 3] = [
    ("Package", "packages"),
    ("ObjectDeployment", "objectdeployments"),
    ("ObjectSet", "objectsets"),
];

/// How the replicas are named.
#[derive(Debug, Clone, Copy)]
pub struct Topology {
    pub replicas: usize,
    /// Replicas named per process (`--member-name` unset), as before member names.
    pub member_per_process: bool,
}

pub async fn run(hosted_clusters: usize, topology: Topology, manager: Option<PathBuf>) -> ExitCode {
    match measure(hosted_clusters, topology, manager).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pko-loadtest restart --replicas {}: {e}", topology.replicas);
            ExitCode::FAILURE
        }
    }
}

async fn measure(size: usize, topology: Topology, manager: Option<PathBuf>) -> Result<(), String> {
    let manager = manager_path(manager)?;
    let (env, client, lease_ns) = sharded_env().await?;
    let group = sharded_manager_args(&lease_ns, LEASE_SECONDS);
    let args_of = |i: usize| {
        let mut args = group.clone();
        if !topology.member_per_process {
            args.extend(["--member-name".to_owned(), format!("bench-{i}")]);
        }
        args
    };
    let mut replicas = Vec::new();
    for i in 0..topology.replicas {
        let args = args_of(i);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        replicas.push(
            env.start_manager(&manager, &args)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    live_fleet(&env, &client, size).await?;
    settle(&env).await?;

    let leases: Api<Lease> = Api::namespaced(client.clone(), &lease_ns);
    let coordinator = coordinator(&leases).await?;
    let holds = |r: &ManagerProcess| {
        r.pid()
            .is_some_and(|pid| coordinator.ends_with(&format!("-{pid}")))
    };
    let index = replicas
        .iter()
        .position(|r| !holds(r))
        .ok_or("no replica besides the coordinator")?;
    let victim = replicas.remove(index);
    let coordinating = replicas.iter().find(|r| holds(r)).ok_or("no coordinator")?;
    let departing = member_of(&leases, &victim).await?;
    let share = labelled(&client, &departing).await?;
    let label_writes = || async {
        let (_, body) = coordinating.get("/metrics").await?;
        Ok::<u64, String>(family_sum(&body, "pko_shard_label_writes_total{", ""))
    };
    let labelled_before = label_writes().await?;
    let before = writes(&request_counts(&[env.management()]).await?);

    victim.terminate(GRACE).await.map_err(|e| e.to_string())?;
    drop(victim);
    let started = Instant::now();
    let args = args_of(index);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let restarted = env
        .start_manager(&manager, &args)
        .await
        .map_err(|e| e.to_string())?;
    let ready = started.elapsed();
    let pid = restarted.pid().ok_or("the restarted replica has no pid")?;
    let member = member_of(&leases, &restarted).await?;
    let deadline = Instant::now() + TIMEOUT;
    let reobserved = loop {
        let gone = member == departing || labelled(&client, &departing).await?.is_empty();
        let own = labelled(&client, &member).await?;
        let (_, body) = restarted.get("/metrics").await?;
        let working = KINDS.iter().all(|(kind, _)| {
            family_sum(&body, "pko_shard_objects{", &format!("kind=\"{kind}\""))
                == own.get(*kind).copied().unwrap_or(0) as u64
        });
        let active = family_sum(&body, "pko_reconcile_active{", "");
        if gone && working && !own.is_empty() && active == 0 {
            break started.elapsed();
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the restarted replica did not settle after {TIMEOUT:?}: {own:?}"
            ));
        }
        // Polling is the measurement's pace.
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let cpu = usage(pid)?.cpu;
    tokio::time::sleep(AFTERMATH).await;
    let after = writes(&request_counts(&[env.management()]).await?);
    let written = delta(&before, &after);
    let total = written.iter().map(|(_, n)| *n as u64).sum::<u64>();
    let labels = label_writes().await? - labelled_before;
    let errors: u64 = reconciles(&restarted)
        .await?
        .iter()
        .filter(|((_, result), _)| result == "error")
        .map(|(_, n)| n)
        .sum();
    let own = labelled(&client, &member).await?;
    println!(
        "restart of 1 of {} sharded replicas over {size} HostedClusters ({}):",
        topology.replicas,
        if topology.member_per_process {
            "a member per process"
        } else {
            "member names kept"
        }
    );
    println!("  its share before: {share:?}; after: {own:?}");
    println!(
        "  ready after {:.2} s; working on its share again after {:.2} s, CPU {:.2} s for it; reconcile errors {errors}",
        ready.as_secs_f64(),
        reobserved.as_secs_f64(),
        cpu.as_secs_f64()
    );
    println!(
        "  writes the apiserver served from the stop to {} s after: {total} ({labels} label writes by the coordinator){}",
        AFTERMATH.as_secs(),
        write_mix(&written)
    );
    Ok(())
}

/// The member name `replica` works under: its member Lease's label, the Lease held by its process.
async fn member_of(leases: &Api<Lease>, replica: &ManagerProcess) -> Result<String, String> {
    let pid = replica.pid().ok_or("a replica has no pid")?;
    let listed = leases
        .list(&ListParams::default().labels(SHARD_MEMBER_LABEL))
        .await
        .map_err(|e| e.to_string())?;
    listed
        .items
        .into_iter()
        .find(|l| {
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                .is_some_and(|h| h.ends_with(&format!("-{pid}")))
        })
        .and_then(|l| l.metadata.labels?.get(SHARD_MEMBER_LABEL).cloned())
        .ok_or_else(|| format!("no member Lease held by process {pid}"))
}

/// Objects of [`KINDS`] labelled for `member`, by kind (metadata only: this is polled).
async fn labelled(client: &Client, member: &str) -> Result<BTreeMap<String, usize>, String> {
    let mut counts = BTreeMap::new();
    for (kind, plural) in KINDS {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("package-operator.run", "v1alpha1", kind),
            plural,
        );
        let listed = Api::<DynamicObject>::all_with(client.clone(), &resource)
            .list_metadata(&ListParams::default().labels(&format!("{SHARD_OWNER_LABEL}={member}")))
            .await
            .map_err(|e| format!("listing {plural}: {e}"))?;
        if !listed.items.is_empty() {
            counts.insert(kind.to_owned(), listed.items.len());
        }
    }
    Ok(counts)
}

/// The sum of a metric family's samples in a /metrics text whose labels contain `label`.
fn family_sum(body: &str, family: &str, label: &str) -> u64 {
    body.lines()
        .filter(|l| l.starts_with(family) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

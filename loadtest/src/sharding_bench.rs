//! `sharding`: the issue-20 figures. For each replica count, a fresh environment with that many
//! `--sharding` managers, a fleet of simulated HostedClusters (their HCP namespaces, connector objects and
//! Packages of a real package), a HostedClusterPackage creating every Package and a rolling update across
//! them: wall time, and CPU and memory of each replica. With two replicas or more, one (not the
//! coordinator) is killed, and two times are taken against its Lease running out: until the live
//! replicas work on every Package of the fleet again (their `pko_shard_objects`), and until no Package is
//! labelled for the killed one any more. Then the apiserver's audit log is checked for keys written by two
//! replicas in one tenure.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::ListParams;
use kube::{Api, Client};
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::package::Package;
use pko_proto::well_known::{HOSTED_CLUSTER_PACKAGE_LABEL, SHARD_OWNER_LABEL};
use pko_testenv::{
    sharded_manager_args, EnvConfig, ManagerProcess, TestEnv, SHARD_COORDINATOR_LEASE,
};

use crate::object_set_bench::manager_path;
use crate::process_usage::{usage, Usage};
use crate::rollout_bench::{
    create_hcpkg, fleet, follow_rollout, set_image, wait_connectors, Images,
};

/// The member and coordinator Leases' duration (the manager's default).
const LEASE_SECONDS: u64 = 15;
const TAKEOVER_TIMEOUT: Duration = Duration::from_secs(120);

pub async fn run(
    hosted_clusters: usize,
    replicas: Vec<usize>,
    manager: Option<PathBuf>,
) -> ExitCode {
    let manager = match manager_path(manager) {
        Ok(path) => path,
        Err(e) => {
            eprintln!("pko-loadtest sharding: {e}");
            return ExitCode::FAILURE;
        }
    };
    for count in replicas {
        if let Err(e) = measure(hosted_clusters, count, &manager).await {
            eprintln!("pko-loadtest sharding ({count} replicas): {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// A fresh environment simulating HyperShift, its client and a namespace for the replicas' Leases.
pub(crate) async fn sharded_env() -> Result<(TestEnv, Client, String), String> {
    let env = TestEnv::start(EnvConfig {
        hosted_clusters: 0,
        controller_manager: false,
    })
    .await
    .map_err(|e| e.to_string())?;
    let client = env.management().client().await.map_err(|e| e.to_string())?;
    env.simulate_hypershift().await.map_err(|e| e.to_string())?;
    let lease_ns = env
        .management()
        .create_namespace("shard-leases")
        .await
        .map_err(|e| e.to_string())?;
    Ok((env, client, lease_ns))
}

async fn measure(size: usize, count: usize, manager: &std::path::Path) -> Result<(), String> {
    let (env, client, lease_ns) = sharded_env().await?;
    let args = sharded_manager_args(&lease_ns, LEASE_SECONDS);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut replicas = Vec::new();
    for _ in 0..count {
        replicas.push(
            env.start_manager(manager, &args)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let before = usages(&replicas)?;
    let images = Images::new(&env);
    let started = Instant::now();
    let ns = fleet(&env, "bench-shard", size).await?;
    wait_connectors(&client, &ns, size).await?;
    let arrived = started.elapsed();
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let name = format!("{ns}-shard");
    let max_unavailable = (size / 10).max(1);
    let v1 = images.push("shard-1", 3_001).await?;
    let started = Instant::now();
    follow_rollout(
        &client,
        &name,
        &v1,
        size,
        create_hcpkg(&api, &name, &ns, &v1, max_unavailable),
    )
    .await?;
    let created = started.elapsed();
    let v2 = images.push("shard-2", 3_002).await?;
    let started = Instant::now();
    follow_rollout(&client, &name, &v2, size, set_image(&api, &name, &v2)).await?;
    let updated = started.elapsed();
    let after = usages(&replicas)?;
    let owned = owned_namespaces(&client, &name).await?;
    println!(
        "{count} replica(s), {size} HostedClusters: arrive with connectors {:.1} s, {size} Packages created and live {:.1} s, rolling update (maxUnavailable {max_unavailable}) {:.1} s",
        arrived.as_secs_f64(),
        created.as_secs_f64(),
        updated.as_secs_f64()
    );
    let mut total_cpu = Duration::ZERO;
    for (replica, (start, end)) in replicas.iter().zip(before.iter().zip(&after)) {
        let pid = replica.pid().unwrap_or_default();
        let cpu = end.cpu.saturating_sub(start.cpu);
        total_cpu += cpu;
        let namespaces = owned
            .iter()
            .filter(|(owner, _)| owner.ends_with(&format!("-{pid}")))
            .map(|(_, n)| *n)
            .sum::<usize>();
        println!(
            "  replica {pid}: {namespaces} namespaces, CPU {:.1} s, RSS {:.0} MiB, peak RSS {:.0} MiB",
            cpu.as_secs_f64(),
            end.rss_kib as f64 / 1024.0,
            end.peak_rss_kib as f64 / 1024.0
        );
    }
    println!("  all replicas: CPU {:.1} s", total_cpu.as_secs_f64());

    if count >= 2 {
        let took = takeover(&client, &lease_ns, &name, size, &replicas).await?;
        println!(
            "  take-over after SIGKILL of a replica: every Package worked on again {:.1} s after the kill (Lease {LEASE_SECONDS} s + {:.1} s), {:.1} s after its Lease ran out",
            took.working.as_secs_f64(),
            took.working.as_secs_f64() - LEASE_SECONDS as f64,
            took.working_after_expiry.as_secs_f64(),
        );
        println!(
            "  every object of every kind worked on again {:.1} s after the kill (Lease {LEASE_SECONDS} s + {:.1} s), {:.1} s after its Lease ran out",
            took.all_working.as_secs_f64(),
            took.all_working.as_secs_f64() - LEASE_SECONDS as f64,
            took.all_working_after_expiry.as_secs_f64(),
        );
        println!(
            "  relabelled in the background: {:.1} s after the kill, {:.1} s after the Lease ran out ({} label writes)",
            took.relabelled.as_secs_f64(),
            took.relabelled_after_expiry.as_secs_f64(),
            took.label_writes
        );
    }
    let audit = pko_testenv::shard_write_audit(&env.management().audit_log_path())
        .map_err(|e| e.to_string())?;
    println!(
        "  keys written by two replicas in one tenure: {} (of {} audited writes; {} too close to a \
         label write to place)",
        audit.overlaps.len(),
        audit.writes,
        audit.unplaced
    );
    Ok(())
}

fn usages(replicas: &[ManagerProcess]) -> Result<Vec<Usage>, String> {
    replicas
        .iter()
        .map(|r| usage(r.pid().ok_or("a replica has no pid")?))
        .collect()
}

/// Namespaces of HostedClusterPackage `name`'s Packages per owner label.
async fn owned_namespaces(client: &Client, name: &str) -> Result<BTreeMap<String, usize>, String> {
    // Metadata only: the take-over loop polls this, and must not load the apiserver it measures.
    let packages = Api::<Package>::all(client.clone())
        .list_metadata(
            &ListParams::default().labels(&format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={name}")),
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut owned = BTreeMap::new();
    for p in packages.items {
        let owner = p
            .metadata
            .labels
            .and_then(|l| l.get(SHARD_OWNER_LABEL).cloned())
            .unwrap_or_else(|| "(unlabelled)".to_owned());
        *owned.entry(owner).or_default() += 1;
    }
    Ok(owned)
}

/// The process holding the coordinator's Lease (its holder identity).
pub(crate) async fn coordinator(leases: &Api<Lease>) -> Result<String, String> {
    Ok(leases
        .get(SHARD_COORDINATOR_LEASE)
        .await
        .map_err(|e| e.to_string())?
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default())
}

/// A take-over's figures.
struct Takeover {
    /// From the SIGKILL until the live replicas work on every Package of the fleet.
    working: Duration,
    /// From the killed replica's Lease running out (its last renewTime + duration) to the same end.
    working_after_expiry: Duration,
    /// From the SIGKILL until the live replicas work on as many objects of all kinds as all replicas did.
    all_working: Duration,
    all_working_after_expiry: Duration,
    /// From the SIGKILL until no Package is labelled for the killed replica.
    relabelled: Duration,
    relabelled_after_expiry: Duration,
    /// Label writes the coordinator made meanwhile.
    label_writes: u64,
}

/// Kills a replica that does not coordinate and times until none of the fleet's Packages is labelled
/// for it any more (each labelled for a live replica).
async fn takeover(
    client: &Client,
    lease_ns: &str,
    name: &str,
    size: usize,
    replicas: &[ManagerProcess],
) -> Result<Takeover, String> {
    let leases = Api::<Lease>::namespaced(client.clone(), lease_ns);
    let coordinator = coordinator(&leases).await?;
    let coordinating = replicas
        .iter()
        .find(|r| {
            r.pid()
                .is_some_and(|pid| coordinator.ends_with(&format!("-{pid}")))
        })
        .ok_or("no replica coordinates")?;
    let writes = || coordinating.metric("pko_shard_label_writes_total{action=\"assign\"}");
    let writes_before = writes().await.unwrap_or(0);
    let victim = replicas
        .iter()
        .find(|r| {
            r.pid()
                .is_some_and(|pid| !coordinator.ends_with(&format!("-{pid}")))
        })
        .ok_or("no replica besides the coordinator")?;
    let survivors: Vec<&ManagerProcess> = replicas
        .iter()
        .filter(|r| r.pid() != victim.pid())
        .collect();
    let suffix = format!("-{}", victim.pid().unwrap_or_default());
    let mut objects_before = 0;
    for replica in replicas {
        objects_before += objects_worked_on(replica, None).await?;
    }
    let started = Instant::now();
    let killed_at = k8s_openapi::jiff::Timestamp::now();
    victim.kill();
    // Its last renewal, read once it cannot renew any more (and long before the coordinator deletes it).
    let expiry = lease_expiry(victim_lease(&leases, &suffix).await?);
    let mut working = None;
    let mut all_working = None;
    loop {
        if working.is_none() && worked_on(&survivors, Some("Package")).await? >= size {
            working = Some(started.elapsed());
        }
        if all_working.is_none() && worked_on(&survivors, None).await? >= objects_before {
            all_working = Some(started.elapsed());
        }
        // Labels are read only once the work is back (they follow it in the background).
        let owned = match (working, all_working) {
            (Some(_), Some(_)) => owned_namespaces(client, name).await?,
            _ => BTreeMap::new(),
        };
        let relabelled = !owned.is_empty()
            && !owned
                .keys()
                .any(|o| o.ends_with(&suffix) || o == "(unlabelled)");
        if let (Some(working), Some(all_working), true) = (working, all_working, relabelled) {
            let relabelled = started.elapsed();
            let after = |d: Duration| -> Duration {
                (killed_at + d)
                    .duration_since(expiry)
                    .try_into()
                    .unwrap_or_default()
            };
            return Ok(Takeover {
                working,
                working_after_expiry: after(working),
                all_working,
                all_working_after_expiry: after(all_working),
                relabelled,
                relabelled_after_expiry: after(relabelled),
                label_writes: writes().await?.saturating_sub(writes_before),
            });
        }
        if started.elapsed() > TAKEOVER_TIMEOUT {
            return Err(format!(
                "not taken over after {TAKEOVER_TIMEOUT:?}: {owned:?}"
            ));
        }
        // The measurement's own pace: a list every 100 ms is the resolution of the figure.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The objects the replicas work on (of `kind`, or of all kinds), by their `pko_shard_objects`.
async fn worked_on(replicas: &[&ManagerProcess], kind: Option<&str>) -> Result<usize, String> {
    let mut total = 0;
    for replica in replicas {
        total += objects_worked_on(replica, kind).await?;
    }
    Ok(total)
}

async fn objects_worked_on(replica: &ManagerProcess, kind: Option<&str>) -> Result<usize, String> {
    let (_, body) = replica.get("/metrics").await?;
    let series = match kind {
        Some(kind) => format!("pko_shard_objects{{kind=\"{kind}\"}} "),
        None => "pko_shard_objects{".to_owned(),
    };
    Ok(body
        .lines()
        .filter(|line| line.starts_with(&series))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<usize>().ok())
        .sum())
}

/// The member Lease of the replica whose identity ends in `suffix`.
async fn victim_lease(leases: &Api<Lease>, suffix: &str) -> Result<Lease, String> {
    let list = leases
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    list.items
        .into_iter()
        .find(|lease| {
            lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                .is_some_and(|h| h.ends_with(suffix))
        })
        .ok_or_else(|| format!("no member Lease held by a replica ending in {suffix}"))
}

/// When a Lease that is no longer renewed runs out: its last renewTime plus its duration.
fn lease_expiry(lease: Lease) -> k8s_openapi::jiff::Timestamp {
    let spec = lease.spec.unwrap_or_default();
    let renewed = spec
        .renew_time
        .map(|t| t.0)
        .unwrap_or_else(k8s_openapi::jiff::Timestamp::now);
    let seconds = i64::from(spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS as i32));
    renewed
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(seconds))
        .unwrap_or(renewed)
}

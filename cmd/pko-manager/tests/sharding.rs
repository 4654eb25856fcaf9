//! Horizontal sharding (issue 20): three replicas with `--sharding` share the namespaces, each works
//! only on the objects labelled for it, and when one is killed its namespaces move to the others once its
//! member Lease ran out (the take-over recorded and timed, the labels following, the Lease retired). Then HostedClusterPackage rollouts over 24 HostedClusters: one spread over every
//! replica with one of them killed mid-way, one while a replica joins and two leave; an independent
//! observer checks the budget and every Package ends done. This binary runs its own managers (one shard
//! group: another group's coordinator would relabel the same objects).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::object_set::ObjectSet;
use pko_proto::core::package::Package;
use pko_proto::well_known::SHARD_MEMBER_LABEL;
use pko_proto::well_known::{HOSTED_CLUSTER_PACKAGE_LABEL, SHARD_OWNER_LABEL};
use pko_testenv::{wait_until, SHARD_COORDINATOR_LEASE};
use serde_json::json;

use common::rollout::{all_available, condition, fleet, hcpkg, wait_status, RolloutObserver};
use common::shard_group::{
    a_new_set_becomes_available, namespaces_with_a_set, recorded_takeovers, shard_group,
    start_replicas,
};
use common::*;

/// Long enough that four debug-built replicas, their apiserver and etcd on two slow cores still renew in
/// time (with 3 s, a renewal had 400 ms to answer, and on a slower CI machine every replica gave up its
/// Lease during the first rollout and exited).
const LEASE_SECONDS: u64 = 6;

async fn owners(client: &kube::Client, namespaces: &[String]) -> BTreeMap<String, String> {
    let mut owners = BTreeMap::new();
    for ns in namespaces {
        let sets = Api::<ObjectSet>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        for set in sets.items {
            if let Some(owner) = set
                .metadata
                .labels
                .and_then(|l| l.get(SHARD_OWNER_LABEL).cloned())
            {
                owners.insert(ns.clone(), owner);
            }
        }
    }
    owners
}

#[tokio::test]
async fn replicas_share_namespaces_and_take_over_a_killed_one() {
    let env = env();
    let client = env.management().client().await.unwrap();
    let (leases, owned_args) = shard_group("shard-leases", LEASE_SECONDS).await;
    let args: Vec<&str> = owned_args.iter().map(String::as_str).collect();
    let binary = Path::new(env!("CARGO_BIN_EXE_pko-manager"));
    // Clocks apart (issue 39, item 1): the coordinator's runs 30 s ahead, another replica's 30 s behind.
    // Leases are timed from when each was seen renewed, so every replica stays a member.
    let mut replicas =
        start_replicas(&leases, &owned_args, &[Some("+30s"), None, Some("-30s")]).await;
    let namespaces = namespaces_with_a_set("shard", "shared", 12).await;
    for ns in &namespaces {
        wait_condition(&client, ns, "shared", "Available", "True", None).await;
    }
    // Every namespace is labelled for one replica, and the work is spread.
    let spread = wait_until("every namespace labelled", TIMEOUT, || async {
        let owners = owners(&client, &namespaces).await;
        if owners.len() == namespaces.len() {
            Ok(owners)
        } else {
            Err(format!("{} of {} labelled", owners.len(), namespaces.len()))
        }
    })
    .await
    .unwrap();
    let distinct: BTreeSet<&String> = spread.values().collect();
    assert!(distinct.len() >= 2, "all on one replica: {spread:?}");
    // No live replica was taken for departed: no take-over recorded, on no member's Lease.
    assert_eq!(
        replicas[0].metric("pko_shard_takeover_seconds_count").await,
        Ok(0),
        "a take-over while every replica lives"
    );
    let recorded = recorded_takeovers(&leases).await;
    assert!(recorded.is_empty(), "take-overs recorded: {recorded:?}");

    // A replica other than the coordinator (the Lease holder) is killed: its namespaces move after its
    // Lease runs out and are reconciled there (a new ObjectSet in such a namespace becomes Available).
    let coordinator_identity = leases
        .get(SHARD_COORDINATOR_LEASE)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap();
    let of_replica = |identity: &str| {
        replicas
            .iter()
            .position(|r| identity.ends_with(&format!("-{}", r.pid().unwrap())))
            .unwrap()
    };
    let coordinator = of_replica(&coordinator_identity);
    let (victim_ns, victim_owner) = spread
        .iter()
        .find(|(_, owner)| **owner != coordinator_identity)
        .map(|(ns, owner)| (ns.clone(), owner.clone()))
        .unwrap();
    let victim = replicas
        .iter()
        .position(|r| victim_owner.ends_with(&format!("-{}", r.pid().unwrap())))
        .unwrap();
    // One of its objects is deleted before the take-over: its successor finalizes it, though the
    // departed member's watch cannot tell a deletion from a relabelling.
    let doomed = object_set(
        "doomed",
        &[("config", vec![configmap("doomed-cm", json!({}))])],
        json!({}),
    );
    create_set(&client, &victim_ns, &doomed).await;
    wait_condition(&client, &victim_ns, "doomed", "Available", "True", None).await;
    replicas[victim].kill();
    let victim_sets: Api<ObjectSet> = Api::namespaced(client.clone(), &victim_ns);
    victim_sets
        .delete("doomed", &Default::default())
        .await
        .unwrap();
    let moved = wait_until("the killed replica's namespaces moved", TIMEOUT, || async {
        let owners = owners(&client, &namespaces).await;
        if owners.values().all(|o| *o != victim_owner) && owners.len() == namespaces.len() {
            Ok(owners)
        } else {
            Err(format!("{owners:?}"))
        }
    })
    .await
    .unwrap();
    assert!(moved.values().all(|o| *o != victim_owner));
    // The coordinator timed the take-over.
    let takeovers = replicas[coordinator]
        .metric("pko_shard_takeover_seconds_count")
        .await
        .unwrap();
    assert!(takeovers >= 1, "take-over not measured");
    // Every live replica listed the departed member's objects with all its feeds, and timed it.
    for (i, replica) in replicas.iter().enumerate() {
        if i != victim {
            let listed = replica
                .metric("pko_shard_takeover_listed_seconds_count")
                .await
                .unwrap();
            assert!(listed >= 1, "replica {i}: take-over lists not measured");
        }
    }
    // Once every object is relabelled, the departed member's Lease (with its take-over record) goes.
    wait_until("the killed replica's Lease retired", TIMEOUT, || async {
        let left: Vec<String> = leases
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter_map(|l| l.metadata.labels?.get(SHARD_MEMBER_LABEL).cloned())
            .filter(|member| *member == victim_owner)
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("still there: {left:?}"))
        }
    })
    .await
    .unwrap();
    let relabels = replicas[coordinator]
        .metric("pko_shard_relabel_seconds_count")
        .await
        .unwrap();
    assert!(relabels >= 1, "relabelling not measured");
    let ns = &victim_ns;
    a_new_set_becomes_available(&client, ns, "after-kill").await;
    wait_until("the deleted set finalized", TIMEOUT, || async {
        match victim_sets.get_opt("doomed").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    // Relabelled to the replicas working on them, no set lost its worker: the live replicas work on
    // every set there is (the first 12 and the new one), each once.
    wait_until("every set worked on once", TIMEOUT, || async {
        let mut working = 0;
        for (i, replica) in replicas.iter().enumerate() {
            if i != victim {
                working += replica
                    .metric("pko_shard_objects{kind=\"ObjectSet\"}")
                    .await
                    .unwrap_or(0);
            }
        }
        if working == namespaces.len() as u64 + 1 {
            Ok(())
        } else {
            Err(format!("{working} sets worked on"))
        }
    })
    .await
    .unwrap();
    replicas.remove(victim);
    replicas.push(env.start_manager(binary, &args).await.unwrap());
    // Every replica's log, the departed ones' too: a key stuck mid-hand-off is told by both sides.
    let mut logs: Vec<PathBuf> = replicas.iter().map(|r| r.log_path().to_owned()).collect();

    // A fleet of 24: its Packages spread over all three replicas.
    let risks = [None; 24];
    let (fleet_ns, clusters) = fleet("shard-fleet", &risks).await;
    let group_of: BTreeMap<String, usize> = clusters
        .iter()
        .map(|c| (c.hcp_namespace.clone(), 0))
        .collect();
    let v1 = build_and_push("handlebars", "shard-roll:v1");
    let v2 = build_and_push("handlebars", "shard-roll:v2");
    let v3 = build_and_push("handlebars", "shard-roll:v3");
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let name = format!("{fleet_ns}-roll");
    let strategy = json!({"rollingUpgrade": {"maxUnavailable": 3}});
    api.create(
        &PostParams::default(),
        &hcpkg(&name, &fleet_ns, &v1, strategy, None),
    )
    .await
    .unwrap();
    let log = || replica_log_tails(&logs);
    wait_status(&api, &name, log, "24/24 available on v1", |h| {
        all_available(h, 24)
    })
    .await;
    let live: BTreeSet<String> = replicas
        .iter()
        .map(|r| r.pid().unwrap().to_string())
        .collect();
    wait_until(
        "every replica works on some namespaces",
        TIMEOUT,
        || async {
            let packages = package_owners(&client, &name).await;
            let working: BTreeSet<String> = packages
                .values()
                .filter_map(|owner| owner.rsplit('-').next().map(str::to_owned))
                .collect();
            if working == live {
                Ok(())
            } else {
                Err(format!("{working:?} of {live:?}: {packages:?}"))
            }
        },
    )
    .await
    .unwrap();

    // v2, with one replica killed once a few Packages took it.
    let rolled = roll(&client, &api, &name, &v2, &group_of, &logs, || {
        let victim = replicas.remove(0);
        victim.kill();
    })
    .await;
    assert_eq!(rolled.len(), 24);

    // Back to three; v3 starts as a fourth replica joins, and two leave mid-way (one stopped cleanly, one
    // killed): 3 -> 4 -> 2.
    replicas.push(env.start_manager(binary, &args).await.unwrap());
    assert_eq!(replicas.len(), 3);
    replicas.push(env.start_manager(binary, &args).await.unwrap());
    logs.extend(replicas[2..].iter().map(|r| r.log_path().to_owned()));
    let rolled = roll(&client, &api, &name, &v3, &group_of, &logs, || {
        let stopped = replicas.remove(0);
        let killed = replicas.remove(0);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let _ = runtime.block_on(stopped.terminate(std::time::Duration::from_secs(20)));
        });
        killed.kill();
    })
    .await;
    assert_eq!(rolled.len(), 24);
    assert_eq!(replicas.len(), 2);

    // No object was written by two replicas in one tenure (between two label writes of the coordinator).
    let audit = pko_testenv::shard_write_audit(&env.management().audit_log_path()).unwrap();
    assert!(
        audit.writes > 100,
        "the audit log holds only {} manager writes",
        audit.writes
    );
    assert!(
        audit.overlaps.is_empty(),
        "written by two replicas at once: {:#?}",
        audit.overlaps
    );
}

/// Each Package of HostedClusterPackage `name` by namespace, with the replica labelled as its owner.
async fn package_owners(client: &kube::Client, name: &str) -> BTreeMap<String, String> {
    Api::<Package>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={name}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| {
            let owner = p.metadata.labels.as_ref()?.get(SHARD_OWNER_LABEL)?.clone();
            Some((p.metadata.namespace?, owner))
        })
        .collect()
}

/// Rolls HostedClusterPackage `name` to `image` under an independent observer (budget 3, every Package
/// updated once); `meanwhile` runs once a third of the fleet took the new image.
async fn roll(
    client: &kube::Client,
    api: &Api<HostedClusterPackage>,
    name: &str,
    image: &str,
    group_of: &BTreeMap<String, usize>,
    logs: &[PathBuf],
    meanwhile: impl FnOnce(),
) -> Vec<String> {
    let spec = json!({"image": image, "config": {"greeting": "hi"}});
    let observer = RolloutObserver::start(client, name, &spec, group_of.clone()).await;
    let patch = json!({"spec": {"template": {"spec": spec}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_until("a third of the fleet updated", TIMEOUT, || async {
        let n = observer.observed.lock().unwrap().update_order.len();
        if n >= group_of.len() / 3 {
            Ok(())
        } else {
            Err(format!("{n} updated"))
        }
    })
    .await
    .unwrap_or_else(|e| {
        let kept = env().keep_files().map(|p| p.display().to_string());
        panic!(
            "{e}\nfiles kept at {kept:?}\nreplica logs:{}",
            replica_log_tails(logs)
        )
    });
    meanwhile();
    let total = i32::try_from(group_of.len()).unwrap();
    wait_status(
        api,
        name,
        || replica_log_tails(logs),
        "every Package done on the new image",
        |h| {
            all_available(h, total)
                && condition(h, "Progressing").is_some_and(|c| c.status == "False")
        },
    )
    .await;
    observer.finish(3)
}

/// Of each replica log, the last lines on shard work and failures (warnings, hand-offs, take-overs).
fn replica_log_tails(logs: &[PathBuf]) -> String {
    let mut tails = String::new();
    for path in logs {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                ["WARN", "ERROR", "releas", "shard", "take-over", "leader"]
                    .iter()
                    .any(|word| l.contains(word))
            })
            .collect();
        tails.push_str(&format!(
            "\n--- {}:\n{}",
            path.display(),
            lines[lines.len().saturating_sub(25)..].join("\n")
        ));
    }
    tails
}

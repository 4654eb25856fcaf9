//! A sharded replica restarted under its member name (a StatefulSet's pod; issue 42, target 4) takes
//! its share back without moving a key: the others keep counting it a member while its Lease, released
//! for the restart, lasts; the coordinator writes no label, and the restarted process re-observes its
//! objects without a write. This binary runs its own shard group (another group's coordinator would
//! relabel the same objects).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use kube::Api;
use pko_proto::core::object_set::ObjectSet;
use pko_proto::well_known::{shard_member_lease, SHARD_OWNER_LABEL, SHARD_RESTARTING_ANNOTATION};
use pko_testenv::wait_until;

use common::shard_group::{
    a_new_set_becomes_available, namespaces_with_a_set, shard_group, wait_coordinating,
};
use common::*;

/// Long enough that a process start fits in it on a loaded machine: the others wait this long for the
/// restarted replica before its keys are taken over.
const LEASE_SECONDS: u64 = 10;
const NAMESPACES: usize = 12;
/// How long a stopped replica gets to wind down (a kubelet's default grace).
const GRACE: Duration = Duration::from_secs(30);

/// Each namespace's set: its owner label.
async fn owners(client: &kube::Client, namespaces: &[String]) -> BTreeMap<String, String> {
    let mut owners = BTreeMap::new();
    for ns in namespaces {
        let set = Api::<ObjectSet>::namespaced(client.clone(), ns)
            .get("kept")
            .await
            .unwrap();
        let owner = set
            .metadata
            .labels
            .unwrap_or_default()
            .get(SHARD_OWNER_LABEL)
            .cloned()
            .unwrap_or_default();
        owners.insert(ns.clone(), owner);
    }
    owners
}

/// The samples of a metric family in a /metrics text whose labels contain every one of `labels`.
fn metric_total(metrics: &str, family: &str, labels: &[&str]) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(family) && labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Waits until `manager` holds `share` sets, has reconciled each, and has no reconcile under way.
async fn working_on_its_share(manager: &pko_testenv::ManagerProcess, share: u64, what: &str) {
    wait_until(what, TIMEOUT, || async {
        let metrics = manager.get("/metrics").await?.1;
        let working = metric_total(&metrics, "pko_shard_objects{", &["kind=\"ObjectSet\""]);
        let reconciled = metric_total(
            &metrics,
            "pko_reconcile_total{",
            &["controller=\"object_set\""],
        );
        let active = metric_total(&metrics, "pko_reconcile_active{", &[]);
        if working == share && reconciled >= share && active == 0 {
            Ok(())
        } else {
            Err(format!(
                "{working} worked on, {reconciled} reconciled, {active} active of {share}"
            ))
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_replica_restarted_under_its_member_name_takes_its_share_back_without_a_write() {
    let env = env();
    let client = env.management().client().await.unwrap();
    let (leases, group) = shard_group("restart-leases", LEASE_SECONDS).await;
    let args_of = |member: &str| {
        let mut args = group.clone();
        args.extend(["--member-name".to_owned(), member.to_owned()]);
        args
    };
    let (coordinator_args, restarted_args) = (args_of("restart-a"), args_of("restart-b"));
    let coordinator_args: Vec<&str> = coordinator_args.iter().map(String::as_str).collect();
    let restarted_args: Vec<&str> = restarted_args.iter().map(String::as_str).collect();
    let binary = Path::new(env!("CARGO_BIN_EXE_pko-manager"));
    let coordinator = env.start_manager(binary, &coordinator_args).await.unwrap();
    wait_coordinating(&leases, &coordinator).await;
    let first = env.start_manager(binary, &restarted_args).await.unwrap();
    let namespaces = namespaces_with_a_set("restart", "kept", NAMESPACES).await;
    for ns in &namespaces {
        wait_condition(&client, ns, "kept", "Available", "True", None).await;
    }
    // Every set labelled for one of the two member names, some for the one that restarts.
    let settled = wait_until("every set labelled for a member", TIMEOUT, || async {
        let owners = owners(&client, &namespaces).await;
        let named = owners
            .values()
            .all(|o| o == "restart-a" || o == "restart-b");
        if named && owners.values().any(|o| o == "restart-b") {
            Ok(owners)
        } else {
            Err(format!("{owners:?}"))
        }
    })
    .await
    .unwrap();
    let share = settled.values().filter(|o| *o == "restart-b").count() as u64;
    let label_writes = |metrics: &str| metric_total(metrics, "pko_shard_label_writes_total{", &[]);
    let labelled_before = label_writes(&coordinator.get("/metrics").await.unwrap().1);

    // Settled means the replica has worked on its share too: one stopped mid-reconcile leaves a write
    // for its successor.
    working_on_its_share(&first, share, "the first replica works on its share").await;
    // A rolling update stops the pod: its Lease stays, released and marked for the restart.
    let stopped = first.terminate(GRACE).await.unwrap();
    assert!(stopped.success(), "{}", first.log_tail());
    let lease = leases.get(&shard_member_lease("restart-b")).await.unwrap();
    assert!(
        lease
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(SHARD_RESTARTING_ANNOTATION),
        "the stopped replica's Lease is marked for its restart"
    );
    assert_eq!(lease.spec.and_then(|s| s.holder_identity), None);

    let restarted = env.start_manager(binary, &restarted_args).await.unwrap();
    working_on_its_share(
        &restarted,
        share,
        "the restarted replica works on its share",
    )
    .await;
    let lease = leases.get(&shard_member_lease("restart-b")).await.unwrap();
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(
        holder.starts_with("restart-b/")
            && holder.ends_with(&format!("-{}", restarted.pid().unwrap())),
        "the restarted process holds the member's Lease: {holder}"
    );
    assert!(!lease
        .metadata
        .annotations
        .unwrap_or_default()
        .contains_key(SHARD_RESTARTING_ANNOTATION));

    // No key moved and nothing was written: the same labels, no label write by the coordinator, no
    // write by the restarted process.
    assert_eq!(owners(&client, &namespaces).await, settled);
    assert_eq!(
        label_writes(&coordinator.get("/metrics").await.unwrap().1),
        labelled_before,
        "the coordinator labelled something while the replica restarted"
    );
    let metrics = restarted.get("/metrics").await.unwrap().1;
    let writes = manager_writes(&metrics);
    assert!(writes.is_empty(), "the restarted replica wrote: {writes:?}");
    assert_eq!(
        metric_total(&metrics, "pko_reconcile_total{", &[])
            - metric_total(&metrics, "pko_reconcile_total{", &["result=\"success\""]),
        0,
        "reconciles that did not succeed:\n{metrics}"
    );

    // It works: a new set in one of its namespaces becomes Available.
    let (ns, _) = settled
        .iter()
        .find(|(_, owner)| *owner == "restart-b")
        .unwrap();
    a_new_set_becomes_available(&client, ns, "after-restart").await;
    let log = env.management().audit_log_path();
    let audit = pko_testenv::shard_write_audit(&log).unwrap();
    assert!(
        audit.overlaps.is_empty(),
        "written by two replicas at once: {:#?}",
        audit.overlaps
    );
    // The member's two processes followed each other: every request of the first was done before the
    // restarted one sent its first.
    let processes = pko_testenv::member_processes(&log, "restart-b").unwrap();
    assert_eq!(processes.len(), 2, "{processes:?}");
    assert!(processes[0].2 < processes[1].1, "{processes:?}");
    drop(coordinator);
}

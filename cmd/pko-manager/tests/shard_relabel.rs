//! A member joining while a take-over is being relabelled (issue 41, chaos seed 113): the coordinator
//! decides a departed member's objects' relabels at once and writes them seconds later; a key given to the
//! newcomer meanwhile must stay with it. A stale relabel handed such a key straight back to the successor,
//! which started working on it beside the newcomer. This binary runs its own shard group (another
//! group's coordinator would relabel the same objects).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use pko_proto::core::object_set::ObjectSet;
use pko_proto::well_known::{
    shard_member_lease, SHARD_DRAIN_LABEL, SHARD_OWNER_LABEL, SHARD_SUCCESSORS_ANNOTATION,
};
use pko_testenv::wait_until;
use serde_json::json;

use common::shard_group::{
    a_new_set_becomes_available, namespaces_with_a_set, shard_group, wait_coordinating,
};
use common::*;

const LEASE_SECONDS: u64 = 3;
const NAMESPACES: usize = 20;

/// An object's shard labels as one watch event showed them: (owner, draining).
type Labels = (Option<String>, bool);

/// Every ObjectSet's shard labels in the order the watch saw them, by namespace.
type History = Arc<Mutex<BTreeMap<String, Vec<Labels>>>>;

fn follow_labels(client: kube::Client, namespaces: BTreeSet<String>) -> History {
    let history: History = Arc::default();
    let recorded = history.clone();
    tokio::spawn(async move {
        let api: Api<ObjectSet> = Api::all(client);
        let mut events = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            let Ok(Event::Apply(set) | Event::InitApply(set)) = event else {
                continue;
            };
            let ns = set.metadata.namespace.clone().unwrap_or_default();
            if !namespaces.contains(&ns) {
                continue;
            }
            let labels = set.metadata.labels.unwrap_or_default();
            let seen = (
                labels.get(SHARD_OWNER_LABEL).cloned(),
                labels.contains_key(SHARD_DRAIN_LABEL),
            );
            let mut history = recorded.lock().unwrap();
            let series = history.entry(ns).or_default();
            if series.last() != Some(&seen) {
                series.push(seen);
            }
        }
    });
    history
}

async fn owners(client: &kube::Client, namespaces: &[String]) -> BTreeMap<String, String> {
    let mut owners = BTreeMap::new();
    for ns in namespaces {
        let set = Api::<ObjectSet>::namespaced(client.clone(), ns)
            .get("shared")
            .await
            .unwrap();
        let labels = set.metadata.labels.unwrap_or_default();
        if let (Some(owner), false) = (
            labels.get(SHARD_OWNER_LABEL),
            labels.contains_key(SHARD_DRAIN_LABEL),
        ) {
            owners.insert(ns.clone(), owner.clone());
        }
    }
    owners
}

#[tokio::test]
async fn a_member_joining_during_a_take_over_keeps_the_keys_it_was_given() {
    let env = env();
    let client = env.management().client().await.unwrap();
    let (leases, args) = shard_group("relabel-leases", LEASE_SECONDS).await;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let binary = Path::new(env!("CARGO_BIN_EXE_pko-manager"));
    let coordinator = env.start_manager(binary, &args).await.unwrap();
    let coordinator_pid = format!("-{}", coordinator.pid().unwrap());
    wait_coordinating(&leases, &coordinator).await;
    let departing = env.start_manager(binary, &args).await.unwrap();
    let departing_pid = format!("-{}", departing.pid().unwrap());
    let namespaces = namespaces_with_a_set("relabel", "shared", NAMESPACES).await;
    let history = follow_labels(client.clone(), namespaces.iter().cloned().collect());
    // Both replicas work: every namespace labelled, some for the replica about to go.
    let before = wait_until(
        "every namespace labelled for both replicas",
        TIMEOUT,
        || async {
            let owners = owners(&client, &namespaces).await;
            let departing_has = owners.values().any(|o| o.ends_with(&departing_pid));
            if owners.len() == namespaces.len() && departing_has {
                Ok(owners)
            } else {
                Err(format!("{owners:?}"))
            }
        },
    )
    .await
    .unwrap();
    let departed = before
        .values()
        .find(|o| o.ends_with(&departing_pid))
        .unwrap()
        .clone();
    for ns in &namespaces {
        wait_condition(&client, ns, "shared", "Available", "True", None).await;
    }

    // It is killed; once the take-over is recorded (the relabels decided and queued), a newcomer joins
    // well inside the relabel delay and is given some of the departed member's keys.
    departing.kill();
    let departed_lease = shard_member_lease(&departed);
    wait_until("the take-over recorded", TIMEOUT, || async {
        let recorded = leases
            .get_opt(&departed_lease)
            .await
            .map_err(|e| e.to_string())?
            .and_then(|l| l.metadata.annotations)
            .is_some_and(|a| a.contains_key(SHARD_SUCCESSORS_ANNOTATION));
        if recorded {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    })
    .await
    .unwrap();
    let newcomer = env.start_manager(binary, &args).await.unwrap();
    let newcomer_pid = format!("-{}", newcomer.pid().unwrap());

    // The departed member's Lease goes once no object carries its label: every relabel, stale or not,
    // was written by then.
    wait_until("the departed member's Lease retired", TIMEOUT, || async {
        match leases.get_opt(&departed_lease).await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|l| l.is_some()))),
        }
    })
    .await
    .unwrap();
    let settled = wait_until(
        "every namespace labelled for a live replica",
        TIMEOUT,
        || async {
            let owners = owners(&client, &namespaces).await;
            let live = owners
                .values()
                .all(|o| o.ends_with(&coordinator_pid) || o.ends_with(&newcomer_pid));
            if owners.len() == namespaces.len() && live {
                Ok(owners)
            } else {
                Err(format!("{owners:?}"))
            }
        },
    )
    .await
    .unwrap();

    let history = history.lock().unwrap().clone();
    let live = |owner: &Option<String>| {
        owner
            .as_deref()
            .is_some_and(|o| o.ends_with(&coordinator_pid) || o.ends_with(&newcomer_pid))
    };
    // The race was set up: the newcomer took a key straight from the departed member's share, before
    // any relabel for the successor was written.
    let taken_during_take_over = history.values().any(|series| {
        let from_departed = series
            .iter()
            .position(|(owner, _)| owner.as_deref() == Some(departed.as_str()));
        let to_newcomer = series
            .iter()
            .position(|(owner, _)| owner.as_deref().is_some_and(|o| o.ends_with(&newcomer_pid)));
        match (from_departed, to_newcomer) {
            (Some(d), Some(n)) => series[d..n].iter().all(|(owner, _)| {
                !owner
                    .as_deref()
                    .is_some_and(|o| o.ends_with(&coordinator_pid))
            }),
            _ => false,
        }
    });
    assert!(
        taken_during_take_over,
        "the newcomer took none of the departed member's keys during the take-over: {history:#?}"
    );
    // No label went from one live replica to another without the holder letting go first (drained,
    // then unlabelled): that would be two replicas working on one key.
    for (ns, series) in &history {
        for pair in series.windows(2) {
            let ((from, _), (to, _)) = (&pair[0], &pair[1]);
            assert!(
                !(live(from) && live(to) && from != to),
                "{ns} moved from {from:?} to {to:?} without a hand-off: {series:?}"
            );
        }
    }
    // Where it ended: the newcomer kept keys, and works on them.
    assert!(
        settled.values().any(|o| o.ends_with(&newcomer_pid)),
        "{settled:?}"
    );
    let audit = pko_testenv::shard_write_audit(&env.management().audit_log_path()).unwrap();
    assert!(
        audit.overlaps.is_empty(),
        "written by two replicas at once: {:#?}",
        audit.overlaps
    );

    // A take-over recorded on a live member's Lease (a coordinator whose watch of it lagged timed it
    // out, or one that started after its last renewal) ends that member for everyone: the others count
    // it departed from the record on, whatever their timing of its renewals says, and it stops writing
    // as its own watch shows the record and exits at its next renewal, instead of working beside its
    // successors.
    let (moved, newcomer_member) = settled
        .iter()
        .find(|(_, o)| o.ends_with(&newcomer_pid))
        .map(|(ns, o)| (ns.clone(), o.clone()))
        .unwrap();
    let coordinator_member = leases
        .get(pko_testenv::SHARD_COORDINATOR_LEASE)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap();
    let record = json!({"metadata": {"annotations": {
        SHARD_SUCCESSORS_ANNOTATION: coordinator_member,
    }}});
    leases
        .patch(
            &shard_member_lease(&newcomer_member),
            &PatchParams::default(),
            &Patch::Merge(&record),
        )
        .await
        .unwrap();
    let exited = newcomer.wait_exit(TIMEOUT).await.unwrap();
    assert_eq!(exited.code(), Some(3), "{}", newcomer.log_tail());
    wait_until("every namespace with the coordinator", TIMEOUT, || async {
        let owners = owners(&client, &namespaces).await;
        if owners.len() == namespaces.len() && owners.values().all(|o| *o == coordinator_member) {
            Ok(())
        } else {
            Err(format!("{owners:?}"))
        }
    })
    .await
    .unwrap();
    // It works on them: a new set in a namespace the ended member had becomes Available.
    a_new_set_becomes_available(&client, &moved, "after-end").await;
    drop(coordinator);
}

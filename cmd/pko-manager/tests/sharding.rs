//! Horizontal sharding (issue 20): three replicas with `--sharding` share the namespaces, each works
//! only on the objects labelled for it, and when one is killed its namespaces move to the others once its
//! member Lease ran out. This binary runs its own managers.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use kube::api::ListParams;
use kube::Api;
use pko_proto::core::object_set::ObjectSet;
use pko_proto::well_known::SHARD_OWNER_LABEL;
use pko_testenv::wait_until;
use serde_json::json;

use common::*;

const LEASE_SECONDS: &str = "3";

/// An ObjectSet with one ConfigMap in a new namespace, Available.
async fn set_in_new_namespace(client: &kube::Client, prefix: &str) -> String {
    let ns = env().management().create_namespace(prefix).await.unwrap();
    let set = object_set(
        "shared",
        &[("config", vec![configmap("shared-cm", json!({"ns": ns}))])],
        json!({}),
    );
    create_set(client, &ns, &set).await;
    ns
}

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
    let lease_ns = env
        .management()
        .create_namespace("shard-leases")
        .await
        .unwrap();
    let args = [
        "--sharding",
        "--leader-election-namespace",
        lease_ns.as_str(),
        "--lease-name",
        "pko-shard-coordinator",
        "--lease-duration-seconds",
        LEASE_SECONDS,
    ];
    let binary = Path::new(env!("CARGO_BIN_EXE_pko-manager"));
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(env.start_manager(binary, &args).await.unwrap());
    }
    let mut namespaces = Vec::new();
    for i in 0..12 {
        namespaces.push(set_in_new_namespace(&client, &format!("shard-{i:02}")).await);
    }
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

    // The replica owning the first namespace is killed: its namespaces move after its Lease runs out and
    // are reconciled there (a new ObjectSet in such a namespace becomes Available).
    let victim_owner = spread[&namespaces[0]].clone();
    let victim = replicas
        .iter()
        .position(|r| victim_owner.ends_with(&format!("-{}", r.pid().unwrap())))
        .unwrap();
    replicas[victim].kill();
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
    let ns = &namespaces[0];
    let after = object_set(
        "after-kill",
        &[("config", vec![configmap("after-kill-cm", json!({}))])],
        json!({}),
    );
    create_set(&client, ns, &after).await;
    wait_condition(&client, ns, "after-kill", "Available", "True", None).await;
}

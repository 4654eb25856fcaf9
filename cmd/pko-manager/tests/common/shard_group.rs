//! A shard group run by a test binary of its own (another group's coordinator would relabel the same
//! objects): its member Leases' namespace, the replicas' arguments, and waiting for a replica to
//! coordinate.

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use pko_testenv::{sharded_manager_args, wait_until, ManagerProcess, SHARD_COORDINATOR_LEASE};
use serde_json::json;

use super::{configmap, create_set, env, object_set, wait_condition, TIMEOUT};

/// A fresh Lease namespace (named after `prefix`) and the arguments of replicas whose Leases last
/// `lease_seconds`.
pub async fn shard_group(prefix: &str, lease_seconds: u64) -> (Api<Lease>, Vec<String>) {
    let client = env().management().client().await.unwrap();
    let lease_ns = env().management().create_namespace(prefix).await.unwrap();
    let args = sharded_manager_args(&lease_ns, lease_seconds);
    (Api::namespaced(client, &lease_ns), args)
}

/// Replicas with `args`, one per clock offset (libfaketime), the first the coordinator.
pub async fn start_replicas(
    leases: &Api<Lease>,
    args: &[String],
    offsets: &[Option<&'static str>],
) -> Vec<ManagerProcess> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_pko-manager"));
    let mut replicas = Vec::new();
    for offset in offsets {
        let launch = pko_testenv::ManagerLaunch {
            clock_offset: *offset,
            ..Default::default()
        };
        replicas.push(
            env()
                .start_manager_with(binary, &launch, &args)
                .await
                .unwrap(),
        );
        if replicas.len() == 1 {
            wait_coordinating(leases, &replicas[0]).await;
        }
    }
    replicas
}

/// The member Leases carrying a take-over record.
pub async fn recorded_takeovers(leases: &Api<Lease>) -> Vec<String> {
    leases
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|l| {
            l.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(pko_proto::well_known::SHARD_SUCCESSORS_ANNOTATION))
        })
        .filter_map(|l| l.metadata.name)
        .collect()
}

/// Waits until `replica` holds the coordinator's Lease.
pub async fn wait_coordinating(leases: &Api<Lease>, replica: &ManagerProcess) {
    let pid = format!("-{}", replica.pid().unwrap());
    wait_until("the replica coordinates", TIMEOUT, || async {
        let holder = leases
            .get_opt(SHARD_COORDINATOR_LEASE)
            .await
            .map_err(|e| e.to_string())?
            .and_then(|l| l.spec?.holder_identity)
            .unwrap_or_default();
        if holder.ends_with(&pid) {
            Ok(())
        } else {
            Err(holder)
        }
    })
    .await
    .unwrap();
}

/// `count` new namespaces `<prefix>-NN`, each with an ObjectSet `set` of one ConfigMap `<set>-cm`
/// (created, not yet waited on).
pub async fn namespaces_with_a_set(prefix: &str, set: &str, count: usize) -> Vec<String> {
    let client = env().management().client().await.unwrap();
    let mut namespaces = Vec::new();
    for i in 0..count {
        let ns = env()
            .management()
            .create_namespace(&format!("{prefix}-{i:02}"))
            .await
            .unwrap();
        let object_set = object_set(
            set,
            &[(
                "config",
                vec![configmap(&format!("{set}-cm"), json!({"ns": ns}))],
            )],
            json!({}),
        );
        create_set(&client, &ns, &object_set).await;
        namespaces.push(ns);
    }
    namespaces
}

/// Creates an ObjectSet `name` of one ConfigMap in `ns` and waits until it is Available: whoever owns
/// the namespace works on it.
pub async fn a_new_set_becomes_available(client: &Client, ns: &str, name: &str) {
    let set = object_set(
        name,
        &[("config", vec![configmap(&format!("{name}-cm"), json!({}))])],
        json!({}),
    );
    create_set(client, ns, &set).await;
    wait_condition(client, ns, name, "Available", "True", None).await;
}

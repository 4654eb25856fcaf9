//! Two replicas with --leader-election: only the Lease holder becomes ready and reconciles; killing it
//! hands over to the standby within the lease duration.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::json;

#[tokio::test]
async fn standby_takes_over_when_the_leader_dies() {
    // No shared manager in this binary: only the two replicas below may reconcile.
    let client = env().management().client().await.unwrap();
    let ns = env().management().create_namespace("leader").await.unwrap();
    let args = [
        "--leader-election",
        "--leader-election-namespace",
        ns.as_str(),
        "--lease-name",
        "pko-test",
    ];
    let binary = Path::new(env!("CARGO_BIN_EXE_pko-manager"));
    let leader = env().start_manager(binary, &args).await.unwrap();
    let standby = env().spawn_manager(binary, &args).unwrap();
    pko_testenv::wait_until("standby serves /healthz", TIMEOUT, || async {
        match standby.get("/healthz").await? {
            (200, _) => Ok(()),
            (code, _) => Err(format!("{code}")),
        }
    })
    .await
    .unwrap();
    assert_eq!(
        standby.get("/readyz").await.unwrap().0,
        503,
        "standby must not be ready while the leader lives"
    );

    leader.kill();
    // Lease duration 15 s: the standby takes over once the dead leader's lease expires.
    standby.wait_ready(Duration::from_secs(45)).await.unwrap();
    let lease =
        kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), &ns)
            .get("pko-test")
            .await
            .unwrap();
    let holder = lease.spec.unwrap().holder_identity.unwrap();
    assert!(
        holder.ends_with(&standby.pid().unwrap().to_string()),
        "holder {holder}"
    );

    // And it reconciles.
    let set = object_set(
        "after-failover",
        &[("p", vec![configmap("cm", json!({}))])],
        json!({}),
    );
    create_set(&client, &ns, &set).await;
    wait_condition(&client, &ns, "after-failover", "Available", "True", None).await;
}

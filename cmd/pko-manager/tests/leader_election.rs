//! Replicas with --leader-election: only the Lease holder becomes ready and reconciles; killing it hands
//! over to a standby within the lease duration. And no split brain (issue 17, item 2): a leader whose
//! apiserver traffic stalls stops and exits non-zero at its renew deadline, before a standby may take the
//! Lease. Nor with skewed clocks (issue 39, item 1): the leader runs 30 s behind and the standby 30 s
//! ahead (libfaketime), and the standby waits as long as the leader renews. One test, because every
//! manager of this binary reconciles every namespace: only the replicas it starts may write.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::watcher::{self, Event};
use kube::Api;
use pko_testenv::{wait_until, ManagerLaunch, ManagerProcess};

use common::*;
use serde_json::json;

/// Lease duration of the replicas: renew deadline 4 s, retry period 0.8 s.
const LEASE_SECONDS: &str = "6";

async fn lease_holder(api: &Api<Lease>) -> String {
    api.get("pko-test")
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
        .unwrap_or_default()
}

async fn wait_leader(api: &Api<Lease>, replica: &ManagerProcess) {
    let pid = replica.pid().unwrap().to_string();
    wait_until(
        &format!("replica {pid} holds the Lease"),
        TIMEOUT,
        || async {
            let holder = lease_holder(api).await;
            if holder.ends_with(&format!("-{pid}")) {
                Ok(())
            } else {
                Err(holder)
            }
        },
    )
    .await
    .unwrap();
}

/// When each holder of the Lease was first seen, from a watch of the test's own.
fn record_holders(api: &Api<Lease>) -> Arc<Mutex<Vec<(Instant, String)>>> {
    let seen: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let mut leases = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    let sink = seen.clone();
    tokio::spawn(async move {
        while let Some(event) = leases.next().await {
            let Ok(Event::Apply(lease) | Event::InitApply(lease)) = event else {
                continue;
            };
            let holder = lease
                .spec
                .and_then(|s| s.holder_identity)
                .unwrap_or_default();
            let mut seen = sink.lock().unwrap();
            if seen.last().is_none_or(|(_, last)| *last != holder) {
                seen.push((Instant::now(), holder));
            }
        }
    });
    seen
}

#[tokio::test]
async fn one_leader_at_a_time_even_when_the_leader_stalls() {
    // No shared manager in this binary: only the replicas below may reconcile.
    let client = env().management().client().await.unwrap();
    let ns = env().management().create_namespace("leader").await.unwrap();
    let args = [
        "--leader-election",
        "--leader-election-namespace",
        ns.as_str(),
        "--lease-name",
        "pko-test",
        "--lease-duration-seconds",
        LEASE_SECONDS,
    ];
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let binary = Path::new(env!("CARGO_BIN_EXE_pko-manager"));
    // The leader's wall clock runs 30 s behind, the standby's 30 s ahead.
    let behind = ManagerLaunch {
        clock_offset: Some("-30s"),
        ..ManagerLaunch::default()
    };
    let first = env()
        .start_manager_with(binary, &behind, &args)
        .await
        .unwrap();
    wait_leader(&leases, &first).await;
    // The second replica reaches the apiserver through a proxy the test can stall.
    let proxy = env()
        .management()
        .stall_proxy("leader-proxy")
        .await
        .unwrap();
    let proxied = ManagerLaunch {
        kubeconfig: Some(proxy.kubeconfig_path().to_owned()),
        clock_offset: Some("+30s"),
        ..ManagerLaunch::default()
    };
    let second = env().spawn_manager_with(binary, &proxied, &args).unwrap();
    wait_until("standby serves /healthz", TIMEOUT, || async {
        match second.get("/healthz").await? {
            (200, _) => Ok(()),
            (code, _) => Err(format!("{code}")),
        }
    })
    .await
    .unwrap();
    // A standby is ready (it can take over at once) and says it is a standby.
    assert_eq!(
        second.get("/readyz").await.unwrap(),
        (200, "ok: standby\n".to_owned()),
        "standby while the leader lives"
    );

    // The leader's renewTimes are a minute old by the standby's clock; it times the Lease from when it
    // saw it renewed, so it keeps finding it held for longer than a Lease lasts, and the leader leads on.
    let first_id = format!("-{}", first.pid().unwrap());
    let declined = r#"pko_lease_attempts_total{lease="pko-test",result="held_elsewhere"}"#;
    let waited = wait_until(
        "the standby found the Lease held for longer than it lasts",
        TIMEOUT,
        || async {
            let holder = lease_holder(&leases).await;
            assert!(
                holder.ends_with(&first_id),
                "the standby took the Lease from a live leader: {holder}\n{}",
                first.log_tail()
            );
            // 12 attempts 0.8 s apart: more than the Lease's 6 s.
            match second.metric(declined).await {
                Ok(n) if n >= 12 => Ok(n),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
    assert!(waited >= 12);
    assert_eq!(
        first.metric(r#"pko_lease_held{lease="pko-test"}"#).await,
        Ok(1)
    );

    // A dead leader: the standby takes over once its Lease expires, and reconciles.
    first.kill();
    second.wait_ready(Duration::from_secs(45)).await.unwrap();
    wait_leader(&leases, &second).await;
    let set = object_set(
        "after-failover",
        &[("p", vec![configmap("cm", json!({}))])],
        json!({}),
    );
    create_set(&client, &ns, &set).await;
    wait_condition(&client, &ns, "after-failover", "Available", "True", None).await;

    // A stalled leader: its apiserver traffic hangs (the process runs on). It must stop, and exit
    // non-zero, before the standby may take the Lease, not when it hears back.
    let third = env().spawn_manager(binary, &args).unwrap();
    let holders = record_holders(&leases);
    proxy.stall();
    let exited = second.wait_exit(TIMEOUT).await.unwrap();
    let exited_at = Instant::now();
    assert_eq!(exited.code(), Some(3), "{}", second.log_tail());
    assert!(
        second.log_tail().contains("lost the lease"),
        "{}",
        second.log_tail()
    );
    third.wait_ready(Duration::from_secs(45)).await.unwrap();
    wait_leader(&leases, &third).await;
    let third_id = format!("-{}", third.pid().unwrap());
    let taken_at = holders
        .lock()
        .unwrap()
        .iter()
        .find(|(_, holder)| holder.ends_with(&third_id))
        .map(|(at, _)| *at)
        .unwrap();
    assert!(
        exited_at < taken_at,
        "the stalled leader exited {:?} after the standby took the Lease",
        exited_at - taken_at
    );
    proxy.resume();
    let pending = object_set(
        "after-stall",
        &[("p", vec![configmap("stall-cm", json!({}))])],
        json!({}),
    );
    create_set(&client, &ns, &pending).await;
    wait_condition(&client, &ns, "after-stall", "Available", "True", None).await;
}

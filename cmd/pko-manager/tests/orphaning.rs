//! A set deleted with `propagationPolicy: Orphan` takes its own reference off its objects before its
//! finalizer goes (issue 41, chaos seed 839 in CI). There the garbage collector had taken the reference
//! off, an apply the set had sent before pko saw the deletion wrote it back two revisions later, and once
//! the set was gone the collector deleted the ConfigMap as a dependent of a deleted owner. Here the
//! collector is stopped (SIGSTOP) while the set is deleted, so the reference is still there when pko
//! handles the deletion, as after that late apply: the set must not let go while it is. This binary has
//! its own environment, so stopping its controller-manager disturbs no other test.
#![allow(clippy::unwrap_used)]

mod common;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::DeleteParams;
use kube::Api;
use pko_proto::core::object_set::ObjectSet;
use pko_testenv::wait_until;
use serde_json::json;

use common::*;

/// Sends `signal` to the environment's kube-controller-manager.
fn signal_controller_manager(signal: &str) {
    let (_, pid) = env()
        .processes()
        .into_iter()
        .find(|(name, _)| name == "kube-controller-manager")
        .expect("the environment runs a kube-controller-manager");
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// Lets the controller-manager run again however the test ends.
struct Stopped;

impl Drop for Stopped {
    fn drop(&mut self) {
        signal_controller_manager("-CONT");
    }
}

#[tokio::test]
async fn an_orphaned_set_takes_its_reference_off_before_it_goes() {
    let (client, ns) = setup("orphaning").await;
    let set = object_set(
        "orphaned",
        &[("p", vec![configmap("kept", json!({"kept": "yes"}))])],
        json!({}),
    );
    let set = create_set(&client, &ns, &set).await;
    let uid = set.metadata.uid.clone().unwrap();
    wait_condition(&client, &ns, "orphaned", "Available", "True", None).await;
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let kept_uid = configmaps.get("kept").await.unwrap().metadata.uid.unwrap();

    signal_controller_manager("-STOP");
    let stopped = Stopped;
    let sets = Api::<ObjectSet>::namespaced(client.clone(), &ns);
    sets.delete("orphaned", &DeleteParams::orphan())
        .await
        .unwrap();
    // pko drops its teardown finalizer; the collector's `orphan` one stays while it is stopped.
    wait_until("pko let the orphaned set go", TIMEOUT, || async {
        let finalizers = sets
            .get("orphaned")
            .await
            .map_err(|e| e.to_string())?
            .metadata
            .finalizers
            .unwrap_or_default();
        if finalizers == ["orphan"] {
            Ok(())
        } else {
            Err(format!("finalizers {finalizers:?}"))
        }
    })
    .await
    .unwrap();
    let refs = configmaps
        .get("kept")
        .await
        .unwrap()
        .metadata
        .owner_references
        .unwrap_or_default();
    assert!(
        refs.iter().all(|r| r.uid != uid),
        "the set let go while its object still named it: {refs:?}"
    );

    drop(stopped);
    wait_gone(&sets, "orphaned").await;
    let kept = configmaps.get("kept").await.unwrap();
    assert_eq!(
        kept.metadata.uid.unwrap(),
        kept_uid,
        "the very object stays"
    );
}

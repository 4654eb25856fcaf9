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
use kube::api::{DeleteParams, Patch, PatchParams};
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

/// One test at a time has the controller-manager stopped: another's `-CONT` would let the collector
/// act in the middle of its steps.
static CONTROLLER_MANAGER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The controller-manager stopped; it runs again however the test ends.
struct Stopped(#[allow(dead_code)] tokio::sync::MutexGuard<'static, ()>);

impl Stopped {
    async fn controller_manager() -> Self {
        let held = CONTROLLER_MANAGER.lock().await;
        signal_controller_manager("-STOP");
        Stopped(held)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal_controller_manager("-CONT");
    }
}

/// Waits until set `name` carries exactly the finalizers `expected` (sorted): pko dropped its teardown
/// finalizer, and what the test or the stopped collector holds stays.
async fn wait_finalizers(sets: &Api<ObjectSet>, name: &str, expected: &[&str]) {
    wait_until("pko let the orphaned set go", TIMEOUT, || async {
        let set = sets.get(name).await.map_err(|e| e.to_string())?;
        let mut finalizers = set.metadata.finalizers.unwrap_or_default();
        finalizers.sort();
        if finalizers == expected {
            Ok(())
        } else {
            Err(format!("finalizers {finalizers:?}"))
        }
    })
    .await
    .unwrap();
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

    let stopped = Stopped::controller_manager().await;
    let sets = Api::<ObjectSet>::namespaced(client.clone(), &ns);
    sets.delete("orphaned", &DeleteParams::orphan())
        .await
        .unwrap();
    // pko drops its teardown finalizer; the collector's `orphan` one stays while it is stopped.
    wait_finalizers(&sets, "orphaned", &["orphan"]).await;
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

/// The collector drops its `orphan` finalizer once it took the references off, which can be before pko
/// let go (chaos seed 839 again: an apply wrote the reference back, the collector finished, and the plan
/// that followed tore the ConfigMap down as the set's). Here the test plays the late apply and the
/// collector, with the controller-manager stopped; another finalizer keeps the set. The set must stay
/// orphaning: take the reference off again and delete nothing.
#[tokio::test]
async fn an_orphaning_set_stays_one_after_the_collector_is_done() {
    const HOLD: &str = "example.com/hold";
    let (client, ns) = setup("orphaning-done").await;
    let mut set = object_set(
        "orphaned",
        &[("p", vec![configmap("kept", json!({"kept": "yes"}))])],
        json!({}),
    );
    set.metadata.finalizers = Some(vec![HOLD.to_owned()]);
    let set = create_set(&client, &ns, &set).await;
    let uid = set.metadata.uid.clone().unwrap();
    wait_condition(&client, &ns, "orphaned", "Available", "True", None).await;
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let kept_uid = configmaps.get("kept").await.unwrap().metadata.uid.unwrap();

    let stopped = Stopped::controller_manager().await;
    let sets = Api::<ObjectSet>::namespaced(client.clone(), &ns);
    sets.delete("orphaned", &DeleteParams::orphan())
        .await
        .unwrap();
    wait_finalizers(&sets, "orphaned", &[HOLD, "orphan"]).await;

    // A late apply writes the set's reference back; then the collector, done, drops its finalizer.
    let reference = json!({"apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSet",
        "name": "orphaned", "uid": uid, "controller": true, "blockOwnerDeletion": true});
    configmaps
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"ownerReferences": [reference]}})),
        )
        .await
        .unwrap();
    sets.patch(
        "orphaned",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": [HOLD]}})),
    )
    .await
    .unwrap();

    wait_until(
        "the written-back reference taken off again",
        TIMEOUT,
        || async {
            let kept = configmaps
                .get_opt("kept")
                .await
                .map_err(|e| e.to_string())?
                .ok_or("the orphaned ConfigMap is gone")?;
            let refs = kept.metadata.owner_references.unwrap_or_default();
            if refs.iter().any(|r| r.uid == uid) {
                return Err(format!("still names the set: {refs:?}"));
            }
            Ok(kept.metadata.uid)
        },
    )
    .await
    .map(|kept| assert_eq!(kept.as_deref(), Some(kept_uid.as_str()), "the very object"))
    .unwrap();

    drop(stopped);
    sets.patch(
        "orphaned",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    wait_gone(&sets, "orphaned").await;
    let kept = configmaps.get("kept").await.unwrap();
    assert_eq!(
        kept.metadata.uid.unwrap(),
        kept_uid,
        "the very object stays"
    );
}

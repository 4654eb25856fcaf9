//! ObjectSet behaviour on a real apiserver with the real pko-manager binary: phase gating, success delay,
//! the collision-protection matrix, pause, archival order, handover and bad input.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::Api;
use pko_proto::core::object_set::ObjectSet;
use pko_proto::core::object_set_phase::ObjectSetPhase;
use pko_proto::core::object_slice::ObjectSlice;
use pko_testenv::wait_until;
use serde_json::json;

use common::*;

fn cel_probe(rule: &str, message: &str) -> serde_json::Value {
    json!({"availabilityProbes": [{
        "selector": {"kind": {"group": "", "kind": "ConfigMap"}},
        "probes": [{"cel": {"rule": rule, "message": message}}],
    }]})
}

#[tokio::test]
async fn failing_probe_gates_next_phase_until_fixed_then_succeeds_after_delay() {
    let (client, ns) = setup("os-gate").await;
    // The probe reads a key pko does not set, so the test can "fix" the object without a new template.
    let mut extra = cel_probe(
        "has(self.data.ready) && self.data.ready == 'yes'",
        "not ready yet",
    );
    extra["successDelaySeconds"] = json!(2);
    let set = object_set(
        "gated",
        &[
            ("one", vec![configmap("first", json!({"x": "1"}))]),
            ("two", vec![configmap("second", json!({"ready": "yes"}))]),
        ],
        extra,
    );
    create_set(&client, &ns, &set).await;

    let message = wait_condition(
        &client,
        &ns,
        "gated",
        "Available",
        "False",
        Some("ProbeFailure"),
    )
    .await;
    assert_eq!(
        message,
        format!("Phase \"one\" failed: core ConfigMap {ns}/first: not ready yet")
    );
    let (status, _, _) = set_condition(&client, &ns, "gated", "InTransition")
        .await
        .unwrap();
    assert_eq!(status, "True");
    assert!(
        get_cm(&client, &ns, "second").await.is_none(),
        "phase two applied before phase one passed"
    );

    patch_cm(&client, &ns, "first", json!({"data": {"ready": "yes"}})).await;
    wait_condition(
        &client,
        &ns,
        "gated",
        "Available",
        "True",
        Some("Available"),
    )
    .await;
    assert!(get_cm(&client, &ns, "second").await.is_some());

    // Succeeded arrives from the timer alone: nothing else changes after Available.
    wait_condition(
        &client,
        &ns,
        "gated",
        "Succeeded",
        "True",
        Some("RolloutSuccess"),
    )
    .await;
    let stored = Api::<ObjectSet>::namespaced(client.clone(), &ns)
        .get("gated")
        .await
        .unwrap();
    let status = stored.status.unwrap();
    let at = |t: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .unwrap()
            .last_transition_time
            .0
    };
    let held = at("Succeeded").duration_since(at("Available"));
    assert!(held.as_secs() >= 2, "Succeeded after {held:?}, want >= 2s");
    assert!(status.conditions.iter().all(|c| c.type_ != "InTransition"));
    assert_eq!(status.revision, 1);
    assert_eq!(status.controller_of.len(), 2);
}

/// (protection, pre-existing object controlled by a stranger?, expect adoption)
const MATRIX: &[(&str, bool, bool)] = &[
    ("Prevent", false, false),
    ("Prevent", true, false),
    ("IfNoController", false, true),
    ("IfNoController", true, false),
    ("None", false, true),
    ("None", true, true),
];

/// A colliding object is someone else's, and pko does not watch it: a phase refused for a collision looks
/// again with backoff, so the set takes its object soon after the collision goes. Seen while writing
/// issue 41's join test: still CollisionDetected three minutes after the object was deleted (the set
/// looked again only at its resync, 2.5 to 5 minutes later).
#[tokio::test]
async fn a_collision_that_goes_away_is_noticed() {
    let (client, ns) = setup("os-collision-gone").await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(configmap("taken", json!({"v": "theirs"}))).unwrap(),
    )
    .await
    .unwrap();
    let set = object_set(
        "taker",
        &[("only", vec![configmap("taken", json!({"v": "ours"}))])],
        json!({}),
    );
    create_set(&client, &ns, &set).await;
    wait_condition(
        &client,
        &ns,
        "taker",
        "Available",
        "False",
        Some("CollisionDetected"),
    )
    .await;
    cms.delete("taken", &Default::default()).await.unwrap();
    // Within TIMEOUT (60 s), far below the resync.
    wait_condition(&client, &ns, "taker", "Available", "True", None).await;
    let cm = get_cm(&client, &ns, "taken").await.unwrap();
    assert_eq!(cm.data.unwrap()["v"], "ours");
}

#[tokio::test]
async fn collision_protection_matrix() {
    let (client, ns) = setup("os-collide").await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let stranger = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(configmap("stranger", json!({}))).unwrap(),
        )
        .await
        .unwrap();
    let stranger_uid = stranger.metadata.uid.clone().unwrap();
    for (i, (protection, owned, _)) in MATRIX.iter().enumerate() {
        let mut existing = configmap(&format!("existing-{i}"), json!({"v": "theirs"}));
        if *owned {
            existing["metadata"]["ownerReferences"] = json!([{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "stranger", "uid": stranger_uid, "controller": true,
            }]);
        }
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(existing).unwrap(),
        )
        .await
        .unwrap();
        let mut set = object_set(
            &format!("set-{i}"),
            &[(
                "only",
                vec![configmap(&format!("existing-{i}"), json!({"v": "ours"}))],
            )],
            json!({}),
        );
        set.spec.template.phases[0].objects[0].collision_protection =
            serde_json::from_value(json!(protection)).unwrap();
        create_set(&client, &ns, &set).await;
    }
    for (i, (protection, owned, adopt)) in MATRIX.iter().enumerate() {
        let name = format!("set-{i}");
        let case = format!("{protection} owned={owned}");
        if *adopt {
            wait_condition(&client, &ns, &name, "Available", "True", None).await;
            let cm = get_cm(&client, &ns, &format!("existing-{i}"))
                .await
                .unwrap();
            let set = Api::<ObjectSet>::namespaced(client.clone(), &ns)
                .get(&name)
                .await
                .unwrap();
            assert_eq!(controller_uid(&cm), set.metadata.uid, "{case}");
            assert_eq!(cm.data.unwrap()["v"], "ours", "{case}");
        } else {
            let message = wait_condition(
                &client,
                &ns,
                &name,
                "Available",
                "False",
                Some("CollisionDetected"),
            )
            .await;
            assert!(message.contains("refusing to adopt"), "{case}: {message}");
            let cm = get_cm(&client, &ns, &format!("existing-{i}"))
                .await
                .unwrap();
            assert_eq!(
                cm.data.as_ref().unwrap()["v"],
                "theirs",
                "{case}: object was modified"
            );
            assert_eq!(
                controller_uid(&cm),
                owned.then(|| stranger_uid.clone()),
                "{case}"
            );
        }
    }
}

#[tokio::test]
async fn bad_input_gives_a_condition_naming_the_field() {
    let (client, ns) = setup("os-invalid").await;
    let mut with_owner = configmap("x", json!({}));
    with_owner["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "y", "uid": "u"}]);
    let mut foreign = configmap("x", json!({}));
    foreign["metadata"]["namespace"] = json!("kube-system");
    let cases = [
        (
            "owner-refs",
            vec![with_owner],
            json!({}),
            "spec.phases[0].objects[0].object.metadata.ownerReferences",
        ),
        (
            "foreign",
            vec![foreign],
            json!({}),
            "outside the owner's namespace",
        ),
        (
            "dupes",
            vec![configmap("d", json!({})), configmap("d", json!({}))],
            json!({}),
            "duplicates",
        ),
        (
            "bad-cel",
            vec![configmap("c", json!({}))],
            cel_probe("self.data.(", "x"),
            "spec.availabilityProbes[0].probes[0].cel.rule",
        ),
        (
            "unknown-kind",
            vec![
                configmap("valid-beside-unknown", json!({})),
                json!({"apiVersion": "example.com/v1", "kind": "Nothing", "metadata": {"name": "n"}}),
            ],
            json!({}),
            "unknown kind Nothing in example.com/v1",
        ),
    ];
    for (name, objects, extra, _) in &cases {
        create_set(
            &client,
            &ns,
            &object_set(name, &[("p", objects.clone())], extra.clone()),
        )
        .await;
    }
    for (name, _, _, expect) in &cases {
        let message = wait_condition(
            &client,
            &ns,
            name,
            "Available",
            "False",
            Some("PreflightError"),
        )
        .await;
        assert!(message.contains(expect), "{name}: {message}");
    }
    // Nothing of the refused sets was written.
    assert!(get_cm(&client, &ns, "x").await.is_none());
    assert!(get_cm(&client, &ns, "d").await.is_none());
    assert!(
        get_cm(&client, &ns, "valid-beside-unknown").await.is_none(),
        "a phase with an unknown kind must write nothing"
    );
    // A set that cannot be planned still goes when deleted: there is nothing its finalizer waits for.
    let sets = Api::<ObjectSet>::namespaced(client.clone(), &ns);
    for (name, ..) in &cases {
        sets.delete(name, &Default::default()).await.unwrap();
    }
    for (name, ..) in &cases {
        wait_gone(&sets, name).await;
    }

    // An unknown collisionProtection never reaches the manager: the CRD's enum rejects it.
    let mut set = object_set(
        "unknown-protection",
        &[("p", vec![configmap("u", json!({}))])],
        json!({}),
    );
    set.spec.template.phases[0].objects[0].collision_protection =
        serde_json::from_value(json!("Sometimes")).unwrap();
    let err = Api::<ObjectSet>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &set)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("collisionProtection"), "{err}");
}

/// Unpauses set `name`: its ConfigMap `cm` gets `v: orig` back and the set is Available again.
async fn unpause_and_see_drift_undone(client: &kube::Client, ns: &str, name: &str) {
    patch_set(
        client,
        ns,
        name,
        json!({"spec": {"lifecycleState": "Active"}}),
    )
    .await;
    wait_cm(client, ns, "cm", |cm| {
        cm.data.as_ref().is_some_and(|d| d["v"] == "orig")
    })
    .await;
    wait_condition(client, ns, name, "Available", "True", None).await;
}

/// A status someone else wrote (or an older write of pko's that landed last) is replaced by what the
/// phases last reported once the watch shows it still differs.
#[tokio::test]
async fn a_status_written_by_someone_else_is_written_back() {
    let (client, ns) = setup("os-forged").await;
    let set = object_set(
        "forged",
        &[("p", vec![configmap("cm-forged", json!({}))])],
        cel_probe("true", "never fails"),
    );
    create_set(&client, &ns, &set).await;
    wait_condition(&client, &ns, "forged", "Available", "True", None).await;
    let sets = pko_api(&client, "ObjectSet", "objectsets", Some(&ns));
    let forged = json!({"status": {"conditions": [{
        "type": "Available", "status": "False", "reason": "Forged", "message": "not written by pko",
        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1,
    }]}});
    sets.patch_status("forged", &PatchParams::default(), &Patch::Merge(&forged))
        .await
        .unwrap();
    wait_condition(&client, &ns, "forged", "Available", "True", None).await;
}

#[tokio::test]
async fn paused_set_leaves_edits_alone_until_unpaused() {
    let (client, ns) = setup("os-pause").await;
    let set = object_set(
        "pausable",
        &[("p", vec![configmap("cm", json!({"v": "orig"}))])],
        cel_probe("self.data.v == 'orig'", "v is not orig"),
    );
    create_set(&client, &ns, &set).await;
    wait_condition(&client, &ns, "pausable", "Available", "True", None).await;

    patch_set(
        &client,
        &ns,
        "pausable",
        json!({"spec": {"lifecycleState": "Paused"}}),
    )
    .await;
    wait_condition(&client, &ns, "pausable", "Paused", "True", Some("Paused")).await;
    patch_cm(&client, &ns, "cm", json!({"data": {"v": "manual"}})).await;
    // The paused set observes the edit (its probe fails) and does not revert it.
    let message = wait_condition(
        &client,
        &ns,
        "pausable",
        "Available",
        "False",
        Some("ProbeFailure"),
    )
    .await;
    assert!(message.contains("v is not orig"), "{message}");
    assert_eq!(
        get_cm(&client, &ns, "cm").await.unwrap().data.unwrap()["v"],
        "manual"
    );

    unpause_and_see_drift_undone(&client, &ns, "pausable").await;
    assert!(set_condition(&client, &ns, "pausable", "Paused")
        .await
        .is_none());
}

/// Pausing a set pauses its delegated phases too: drift of their objects is observed, not reverted, until
/// the set is unpaused (issue 15, item 1b).
#[tokio::test]
async fn a_paused_set_pauses_its_delegated_phases() {
    let (client, ns) = setup("os-pause-delegated").await;
    let mut set = object_set(
        "held",
        &[("p", vec![configmap("cm", json!({"v": "orig"}))])],
        cel_probe("self.data.v == 'orig'", "v is not orig"),
    );
    set.spec.template.phases[0].class = "default".into();
    create_set(&client, &ns, &set).await;
    wait_condition(&client, &ns, "held", "Available", "True", None).await;

    patch_set(
        &client,
        &ns,
        "held",
        json!({"spec": {"lifecycleState": "Paused"}}),
    )
    .await;
    let phases = Api::<ObjectSetPhase>::namespaced(client.clone(), &ns);
    let dynamic = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        &ns,
        &kube::api::ApiResource::erase::<ObjectSetPhase>(&()),
    );
    wait_object_condition(&dynamic, "held-p", "Paused", "True", None).await;
    assert!(phases.get("held-p").await.unwrap().spec.paused);

    patch_cm(&client, &ns, "cm", json!({"data": {"v": "manual"}})).await;
    let (_, message) = wait_object_condition(
        &dynamic,
        "held-p",
        "Available",
        "False",
        Some("ProbeFailure"),
    )
    .await;
    assert!(message.contains("v is not orig"), "{message}");
    assert_eq!(
        get_cm(&client, &ns, "cm").await.unwrap().data.unwrap()["v"],
        "manual",
        "a paused phase observes drift and leaves it"
    );

    unpause_and_see_drift_undone(&client, &ns, "held").await;
    assert!(!phases.get("held-p").await.unwrap().spec.paused);
}

/// A delegated phase adopts what the previous revision's phase controls (issue 15, item 1c).
#[tokio::test]
async fn delegated_phases_hand_objects_over_between_revisions() {
    let (client, ns) = setup("os-delegated-handover").await;
    let delegated = |name: &str, v: &str, extra: serde_json::Value| {
        let mut set = object_set(
            name,
            &[("p", vec![configmap("shared", json!({"rev": v}))])],
            extra,
        );
        set.spec.template.phases[0].class = "default".into();
        set
    };
    create_set(&client, &ns, &delegated("rev1", "1", json!({}))).await;
    wait_condition(&client, &ns, "rev1", "Available", "True", None).await;
    create_set(
        &client,
        &ns,
        &delegated("rev2", "2", json!({"previous": [{"name": "rev1"}]})),
    )
    .await;
    wait_condition(&client, &ns, "rev2", "Available", "True", None).await;
    let phase = Api::<ObjectSetPhase>::namespaced(client.clone(), &ns)
        .get("rev2-p")
        .await
        .unwrap();
    let shared = get_cm(&client, &ns, "shared").await.unwrap();
    assert_eq!(controller_uid(&shared), phase.metadata.uid);
    assert_eq!(shared.data.unwrap()["rev"], "2");
}

#[tokio::test]
async fn archiving_tears_down_in_reverse_phase_order() {
    let (client, ns) = setup("os-archive").await;
    let set = object_set(
        "archivable",
        &[
            ("a", vec![configmap("cm-a", json!({}))]),
            ("b", vec![configmap("cm-b", json!({}))]),
            ("c", vec![configmap("cm-c", json!({}))]),
        ],
        json!({}),
    );
    create_set(&client, &ns, &set).await;
    wait_condition(&client, &ns, "archivable", "Available", "True", None).await;

    let deleted: Arc<Mutex<Vec<String>>> = Arc::default();
    let (watch, listed) = record_deletions(
        Api::<ConfigMap>::namespaced(client.clone(), &ns),
        "ConfigMap",
        deleted.clone(),
    );
    listed.await.unwrap();
    archive_set(&client, &ns, "archivable").await;
    wait_condition(
        &client,
        &ns,
        "archivable",
        "Archived",
        "True",
        Some("Archived"),
    )
    .await;
    pko_testenv::wait_until("three deletions observed", TIMEOUT, || async {
        let d = deleted.lock().unwrap().clone();
        if d.len() >= 3 {
            Ok(d)
        } else {
            Err(format!("{d:?}"))
        }
    })
    .await
    .unwrap();
    watch.abort();
    let order: Vec<String> = deleted
        .lock()
        .unwrap()
        .iter()
        .filter(|n| n.starts_with("ConfigMap/cm-"))
        .cloned()
        .collect();
    assert_eq!(
        order,
        ["ConfigMap/cm-c", "ConfigMap/cm-b", "ConfigMap/cm-a"]
    );
}

/// Records `kind/name` of every object of `api` deleted from now on; the receiver fires once the watch
/// has listed what exists.
fn record_deletions<K>(
    api: Api<K>,
    kind: &'static str,
    gone: Arc<Mutex<Vec<String>>>,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Receiver<()>,
)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let (ready, listed) = tokio::sync::oneshot::channel();
    let watch = tokio::spawn(async move {
        let mut ready = Some(ready);
        let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(Ok(event)) = stream.next().await {
            match event {
                Event::InitDone => {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                }
                Event::Delete(o) => gone.lock().unwrap().push(format!(
                    "{kind}/{}",
                    o.meta().name.clone().unwrap_or_default()
                )),
                _ => {}
            }
        }
    });
    (watch, listed)
}

/// Deleting an ObjectSet tears its objects down as archival does, last phase first, and the set itself
/// goes only after its last phase's objects (issue 17, item 6; PKO's teardown).
#[tokio::test]
async fn deleting_a_set_tears_down_in_reverse_phase_order_before_it_goes() {
    let (client, ns) = setup("os-delete-order").await;
    let set = object_set(
        "deletable",
        &[
            ("a", vec![configmap("cm-del-a", json!({}))]),
            ("b", vec![configmap("cm-del-b", json!({}))]),
            ("c", vec![configmap("cm-del-c", json!({}))]),
        ],
        json!({}),
    );
    create_set(&client, &ns, &set).await;
    wait_condition(&client, &ns, "deletable", "Available", "True", None).await;

    // ConfigMap and ObjectSet deletions, in the order the apiserver reports them.
    let gone: Arc<Mutex<Vec<String>>> = Arc::default();
    let (cms, cms_ready) = record_deletions(
        Api::<ConfigMap>::namespaced(client.clone(), &ns),
        "ConfigMap",
        gone.clone(),
    );
    let (sets, sets_ready) = record_deletions(
        Api::<ObjectSet>::namespaced(client.clone(), &ns),
        "ObjectSet",
        gone.clone(),
    );
    cms_ready.await.unwrap();
    sets_ready.await.unwrap();

    Api::<ObjectSet>::namespaced(client.clone(), &ns)
        .delete("deletable", &Default::default())
        .await
        .unwrap();
    let order = wait_until("the set and its three objects gone", TIMEOUT, || async {
        let order = gone.lock().unwrap().clone();
        if order.iter().any(|g| g == "ObjectSet/deletable") {
            Ok(order)
        } else {
            Err(format!("{order:?}"))
        }
    })
    .await
    .unwrap();
    cms.abort();
    sets.abort();
    let ours: Vec<&str> = order
        .iter()
        .map(String::as_str)
        .filter(|g| g.contains("cm-del-") || *g == "ObjectSet/deletable")
        .collect();
    assert_eq!(
        ours,
        [
            "ConfigMap/cm-del-c",
            "ConfigMap/cm-del-b",
            "ConfigMap/cm-del-a",
            "ObjectSet/deletable"
        ]
    );
}

/// An object held by a finalizer keeps archival in progress: phases behind it wait, and the set reports
/// Archived=False until the object is gone (issue 15, item 3).
#[tokio::test]
async fn archival_waits_for_a_blocked_object() {
    let (client, ns) = setup("os-archive-blocked").await;
    let mut held = configmap("cm-4", json!({}));
    held["metadata"]["finalizers"] = json!(["pko.test/hold"]);
    let set = object_set(
        "blocked",
        &[
            ("first", vec![held]),
            ("second", vec![configmap("cm-5", json!({}))]),
        ],
        json!({}),
    );
    create_set(&client, &ns, &set).await;
    wait_condition(&client, &ns, "blocked", "Available", "True", None).await;

    archive_set(&client, &ns, "blocked").await;
    wait_condition(
        &client,
        &ns,
        "blocked",
        "Archived",
        "False",
        Some("ArchivalInProgress"),
    )
    .await;
    // The second phase is torn down; the first waits on its held object.
    wait_cm_gone(&client, &ns, "cm-5").await;
    wait_cm(&client, &ns, "cm-4", |cm| {
        cm.metadata.deletion_timestamp.is_some()
    })
    .await;
    assert_eq!(
        set_condition(&client, &ns, "blocked", "Archived")
            .await
            .map(|(s, _, _)| s),
        Some("False".to_owned())
    );

    // Released: the object goes and archival completes.
    patch_cm(
        &client,
        &ns,
        "cm-4",
        json!({"metadata": {"finalizers": null}}),
    )
    .await;
    wait_condition(
        &client,
        &ns,
        "blocked",
        "Archived",
        "True",
        Some("Archived"),
    )
    .await;
    assert!(get_cm(&client, &ns, "cm-4").await.is_none());
}

/// Delegated phases tear down as inline ones do: the set stays Archived=False while an object of an
/// ObjectSetPhase is held, phases go last to first, and deleting a set tears it down the same way (issue
/// 15, item 3).
#[tokio::test]
async fn delegated_archival_and_deletion_wait_for_blocked_objects() {
    let (client, ns) = setup("os-archive-delegated").await;
    let held = |name: &str| {
        let mut cm = configmap(name, json!({}));
        cm["metadata"]["finalizers"] = json!(["pko.test/hold"]);
        cm
    };
    // Once its deletion has begun (before that, the phase would apply the finalizer again).
    let release = |name: &'static str| {
        let client = client.clone();
        let ns = ns.clone();
        async move {
            wait_cm(&client, &ns, name, |cm| {
                cm.metadata.deletion_timestamp.is_some()
            })
            .await;
            patch_cm(
                &client,
                &ns,
                name,
                json!({"metadata": {"finalizers": null}}),
            )
            .await
        }
    };
    let mut set = object_set(
        "delegated",
        &[
            ("first", vec![held("cm-4")]),
            ("second", vec![configmap("cm-5", json!({}))]),
        ],
        json!({}),
    );
    for phase in &mut set.spec.template.phases {
        phase.class = "default".into();
    }
    create_set(&client, &ns, &set).await;
    wait_condition(&client, &ns, "delegated", "Available", "True", None).await;

    archive_set(&client, &ns, "delegated").await;
    wait_cm_gone(&client, &ns, "cm-5").await;
    wait_condition(
        &client,
        &ns,
        "delegated",
        "Archived",
        "False",
        Some("ArchivalInProgress"),
    )
    .await;
    assert!(get_cm(&client, &ns, "cm-4").await.is_some());
    release("cm-4").await;
    wait_condition(
        &client,
        &ns,
        "delegated",
        "Archived",
        "True",
        Some("Archived"),
    )
    .await;
    wait_cm_gone(&client, &ns, "cm-4").await;

    // Deleting a set: its teardown finalizer keeps it until its objects are gone.
    let doomed = object_set("doomed", &[("only", vec![held("cm-6")])], json!({}));
    create_set(&client, &ns, &doomed).await;
    wait_condition(&client, &ns, "doomed", "Available", "True", None).await;
    let sets = Api::<ObjectSet>::namespaced(client.clone(), &ns);
    sets.delete("doomed", &Default::default()).await.unwrap();
    wait_condition(
        &client,
        &ns,
        "doomed",
        "Archived",
        "False",
        Some("ArchivalInProgress"),
    )
    .await;
    assert!(sets.get_opt("doomed").await.unwrap().is_some());
    release("cm-6").await;
    wait_gone(&sets, "doomed").await;
    wait_cm_gone(&client, &ns, "cm-6").await;
}

/// An object this set owns but no longer controls survives the set's deletion: its owner reference goes
/// first, so the garbage collector does not take it along (issue 15, item 6).
#[tokio::test]
async fn deleting_a_set_spares_objects_it_no_longer_controls() {
    let (client, ns) = setup("os-orphan").await;
    let set = object_set(
        "owner",
        &[("p", vec![configmap("spared", json!({}))])],
        json!({}),
    );
    let set = create_set(&client, &ns, &set).await;
    wait_condition(&client, &ns, "owner", "Available", "True", None).await;
    // Paused, the set writes nothing; then its reference on the object stops being the controller.
    patch_set(
        &client,
        &ns,
        "owner",
        json!({"spec": {"lifecycleState": "Paused"}}),
    )
    .await;
    wait_condition(&client, &ns, "owner", "Paused", "True", None).await;
    let cm = get_cm(&client, &ns, "spared").await.unwrap();
    let mut refs = serde_json::to_value(cm.metadata.owner_references.unwrap()).unwrap();
    refs[0]["controller"] = json!(false);
    patch_cm(
        &client,
        &ns,
        "spared",
        json!({"metadata": {"ownerReferences": refs}}),
    )
    .await;

    let sets = Api::<ObjectSet>::namespaced(client.clone(), &ns);
    sets.delete("owner", &Default::default()).await.unwrap();
    wait_gone(&sets, "owner").await;
    let cm = get_cm(&client, &ns, "spared")
        .await
        .expect("the object survives");
    assert!(
        cm.metadata
            .owner_references
            .unwrap_or_default()
            .iter()
            .all(|r| Some(&r.uid) != set.metadata.uid.as_ref()),
        "no reference to the deleted set is left"
    );
}

#[tokio::test]
async fn handover_moves_shared_objects_and_archival_removes_the_rest() {
    let (client, ns) = setup("os-handover").await;
    let rev1 = object_set(
        "rev1",
        &[(
            "p",
            vec![
                configmap("cm1", json!({"rev": "1"})),
                configmap("cm2", json!({})),
            ],
        )],
        json!({}),
    );
    create_set(&client, &ns, &rev1).await;
    wait_condition(&client, &ns, "rev1", "Available", "True", None).await;

    let rev2 = object_set(
        "rev2",
        &[(
            "p",
            vec![
                configmap("cm1", json!({"rev": "2"})),
                configmap("cm3", json!({})),
            ],
        )],
        json!({"previous": [{"name": "rev1"}]}),
    );
    let rev2 = create_set(&client, &ns, &rev2).await;
    wait_condition(&client, &ns, "rev2", "Available", "True", None).await;
    let cm1 = get_cm(&client, &ns, "cm1").await.unwrap();
    assert_eq!(controller_uid(&cm1), rev2.metadata.uid);
    assert_eq!(
        cm1.metadata.owner_references.unwrap_or_default().len(),
        1,
        "the apply that took cm1 over dropped rev1's reference"
    );
    assert_eq!(cm1.data.unwrap()["rev"], "2");
    let revisions: BTreeMap<_, _> = cm1.metadata.annotations.unwrap().into_iter().collect();
    assert_eq!(revisions["package-operator.run/revision"], "2");

    // Revision 1 no longer vouches for what it handed over (issue 15, items 2 and 5): it is in transition,
    // not Available (HandedOver), and controls only cm2 now.
    wait_condition(&client, &ns, "rev1", "InTransition", "True", None).await;
    let message = wait_condition(
        &client,
        &ns,
        "rev1",
        "Available",
        "False",
        Some("HandedOver"),
    )
    .await;
    assert!(message.contains("cm1"), "{message}");
    let controlled = |name: &'static str| {
        let client = client.clone();
        let ns = ns.clone();
        async move {
            let set = Api::<ObjectSet>::namespaced(client, &ns)
                .get(name)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<Vec<String>, String>(
                set.status
                    .map(|s| s.controller_of.into_iter().map(|c| c.name).collect())
                    .unwrap_or_default(),
            )
        }
    };
    wait_until("rev1 controls only cm2", TIMEOUT, || async {
        match controlled("rev1").await? {
            names if names == ["cm2"] => Ok(()),
            names => Err(format!("{names:?}")),
        }
    })
    .await
    .unwrap();

    archive_set(&client, &ns, "rev1").await;
    wait_condition(&client, &ns, "rev1", "Archived", "True", None).await;
    assert_eq!(controlled("rev1").await.unwrap(), Vec::<String>::new());
    assert!(
        get_cm(&client, &ns, "cm2").await.is_none(),
        "cm2 should be deleted with rev1"
    );
    let cm1 = get_cm(&client, &ns, "cm1").await.unwrap();
    assert_eq!(
        controller_uid(&cm1),
        rev2.metadata.uid,
        "cm1 must stay with rev2"
    );
    assert!(get_cm(&client, &ns, "cm3").await.is_some());
}

#[tokio::test]
async fn default_class_phase_runs_through_an_object_set_phase() {
    let (client, ns) = setup("os-delegate").await;
    let mut set = object_set(
        "mixed",
        &[
            ("local", vec![configmap("cm-local", json!({}))]),
            (
                "delegated",
                vec![configmap("cm-delegated", json!({"v": "1"}))],
            ),
            ("after", vec![configmap("cm-after", json!({}))]),
        ],
        json!({}),
    );
    set.spec.template.phases[1].class = "default".into();
    create_set(&client, &ns, &set).await;
    wait_condition(&client, &ns, "mixed", "Available", "True", None).await;

    let phases = Api::<ObjectSetPhase>::namespaced(client.clone(), &ns);
    let phase = phases.get("mixed-delegated").await.unwrap();
    assert_eq!(
        phase.metadata.labels.as_ref().unwrap()["package-operator.run/phase-class"],
        "default"
    );
    assert_eq!(phase.spec.revision, 1);
    assert_eq!(phase.spec.objects.len(), 1);
    let status = phase.status.clone().unwrap();
    assert!(status
        .conditions
        .iter()
        .any(|c| c.type_ == "Available" && c.status == "True"));
    assert_eq!(status.controller_of.len(), 1);

    let cm = get_cm(&client, &ns, "cm-delegated").await.unwrap();
    assert_eq!(
        controller_uid(&cm),
        phase.metadata.uid,
        "the ObjectSetPhase controls its objects"
    );
    assert!(get_cm(&client, &ns, "cm-after").await.is_some());
    let stored = Api::<ObjectSet>::namespaced(client.clone(), &ns)
        .get("mixed")
        .await
        .unwrap();
    let status = stored.status.unwrap();
    let remote = &status.remote_phases;
    assert_eq!(remote.len(), 1);
    assert_eq!(remote[0].name, "mixed-delegated");
    assert_eq!(Some(&remote[0].uid), phase.metadata.uid.as_ref());
    // The set lists the objects its phases control, delegated ones included, in phase order (issue 15,
    // item 1a).
    let controlled: Vec<&str> = status
        .controller_of
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(controlled, ["cm-local", "cm-delegated", "cm-after"]);
}

#[tokio::test]
async fn slices_feed_their_phase_and_are_owned_by_the_set() {
    let (client, ns) = setup("os-slices").await;
    // The reconcile shell counts every ObjectSet reconcile by result; a plan whose slice is missing fails
    // and is retried.
    const ERRORS: &str = r#"pko_reconcile_total{controller="object_set",result="error"}"#;
    let errors_before = manager().metric(ERRORS).await.unwrap_or(0);
    let mut set = object_set(
        "sliced",
        &[("p", vec![configmap("inline", json!({}))])],
        json!({}),
    );
    set.spec.template.phases[0].slices = vec!["extra".into()];
    create_set(&client, &ns, &set).await;
    // The slice does not exist yet: a condition names it, and the set retries by itself.
    let message = wait_condition(
        &client,
        &ns,
        "sliced",
        "Available",
        "False",
        Some("PreflightError"),
    )
    .await;
    assert!(message.contains("slice \"extra\" not found"), "{message}");
    wait_until(
        "a failed ObjectSet reconcile on /metrics",
        TIMEOUT,
        || async {
            match manager().metric(ERRORS).await {
                Ok(errors) if errors > errors_before => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
    let duration = r#"pko_reconcile_duration_seconds_count{controller="object_set"}"#;
    assert!(manager().metric(duration).await.unwrap() > 0);

    let slices = Api::<ObjectSlice>::namespaced(client.clone(), &ns);
    let slice: ObjectSlice = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSlice",
        "metadata": {"name": "extra"},
        "objects": [{"object": configmap("from-slice", json!({"k": "v"}))}],
    }))
    .unwrap();
    slices.create(&PostParams::default(), &slice).await.unwrap();
    wait_condition(&client, &ns, "sliced", "Available", "True", None).await;
    let cm = get_cm(&client, &ns, "from-slice").await.unwrap();
    let stored = Api::<ObjectSet>::namespaced(client.clone(), &ns)
        .get("sliced")
        .await
        .unwrap();
    assert_eq!(controller_uid(&cm), stored.metadata.uid);
    let owners = slices
        .get("extra")
        .await
        .unwrap()
        .metadata
        .owner_references
        .unwrap();
    assert!(owners
        .iter()
        .any(|o| Some(&o.uid) == stored.metadata.uid.as_ref() && o.controller != Some(true)));
}

#[tokio::test]
async fn external_objects_are_probed_but_never_written() {
    let (client, ns) = setup("os-external").await;
    let mut set = object_set(
        "watcher",
        &[("p", vec![configmap("mine", json!({}))])],
        json!({}),
    );
    set.spec.template.phases[0].external_objects =
        serde_json::from_value(json!([{"object": configmap("theirs", json!({}))}])).unwrap();
    set.spec.template.availability_probes = serde_json::from_value(json!([{
        "selector": {"kind": {"group": "", "kind": "ConfigMap"}, "selector": {"matchLabels": {"role": "external"}}},
        "probes": [{"cel": {"rule": "self.data.ready == 'yes'", "message": "external not ready"}}],
    }]))
    .unwrap();
    create_set(&client, &ns, &set).await;
    let message = wait_condition(
        &client,
        &ns,
        "watcher",
        "Available",
        "False",
        Some("ProbeFailure"),
    )
    .await;
    assert!(
        message.contains("ConfigMap")
            && message.contains("theirs")
            && message.contains("not found"),
        "{message}"
    );

    let cms = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let mut theirs = configmap("theirs", json!({"ready": "no"}));
    theirs["metadata"]["labels"] = json!({"role": "external"});
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(theirs).unwrap(),
    )
    .await
    .unwrap();
    // The object's own watch wakes the set: the failure moves from "not found" to the probe's message.
    pko_testenv::wait_until("probe message of the external object", TIMEOUT, || async {
        match set_condition(&client, &ns, "watcher", "Available").await {
            Some((_, _, m)) if m.contains("external not ready") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    patch_cm(&client, &ns, "theirs", json!({"data": {"ready": "yes"}})).await;
    wait_condition(&client, &ns, "watcher", "Available", "True", None).await;

    let theirs = get_cm(&client, &ns, "theirs").await.unwrap();
    assert!(
        theirs.metadata.owner_references.is_none(),
        "external object got an owner"
    );
    assert!(!theirs
        .metadata
        .annotations
        .unwrap_or_default()
        .contains_key("package-operator.run/revision"));
    assert_eq!(theirs.data.unwrap()["ready"], "yes");
}

/// A package-operator.run kind as dynamic objects, namespaced in `ns` or cluster-scoped with `None`.
fn pko_api(
    client: &kube::Client,
    kind: &str,
    plural: &str,
    ns: Option<&str>,
) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("package-operator.run", "v1alpha1", kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// Merge-patches `spec` and expects the apiserver's refusal naming `field`, by the CRD's rule.
async fn expect_immutable(
    api: &Api<DynamicObject>,
    name: &str,
    field: &str,
    value: serde_json::Value,
) {
    let patch = json!({"spec": {field: value}});
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{name}: {status:?}");
            // A rule over the spec reports at `spec` (1.28's `fieldPath` is not on the floor version).
            assert!(
                status.message.contains("spec: Invalid value")
                    && status.message.contains(&format!("{field} is immutable")),
                "{name}: {}",
                status.message
            );
        }
        other => panic!("{name}: changing {field} was not refused: {other:?}"),
    }
}

/// The apiserver itself, by the CRDs' validation rules (no admission webhook is installed), refuses
/// changes to the immutable spec fields of every set, phase and slice kind, naming the field; mutable
/// fields and metadata still change (issue 15, item 7; issue 62, item 4).
#[tokio::test]
async fn immutable_spec_fields_are_refused_by_the_apiserver() {
    let (client, ns) = setup("os-immutable").await;
    let extra = cel_probe("true", "never fails");
    let mut set = object_set(
        "frozen",
        &[("deploy", vec![configmap("cm-frozen", json!({}))])],
        extra.clone(),
    );
    set.spec.template.success_delay_seconds = 1;
    set.spec.revision = Some(1);
    create_set(&client, &ns, &set).await;
    let sets = pko_api(&client, "ObjectSet", "objectsets", Some(&ns));
    for (field, value) in [
        ("phases", json!([{"name": "other", "objects": []}])),
        ("availabilityProbes", json!([])),
        ("successDelaySeconds", json!(5)),
        ("previous", json!([{"name": "rev-0"}])),
        ("revision", json!(7)),
    ] {
        expect_immutable(&sets, "frozen", field, value).await;
    }
    // What may change still does: the lifecycle, labels, and an unchanged spec written back whole.
    let paused =
        json!({"metadata": {"labels": {"team": "a"}}, "spec": {"lifecycleState": "Paused"}});
    sets.patch("frozen", &PatchParams::default(), &Patch::Merge(&paused))
        .await
        .unwrap();
    wait_until("the unchanged set is written back", TIMEOUT, || async {
        // The manager writes status and finalizers meanwhile: read again on a conflict.
        let stored = sets.get("frozen").await.map_err(|e| e.to_string())?;
        sets.replace("frozen", &PostParams::default(), &stored)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap();

    let phases = pko_api(&client, "ObjectSetPhase", "objectsetphases", Some(&ns));
    let phase: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1",
        "kind": "ObjectSetPhase",
        "metadata": {"name": "frozen-phase"},
        "spec": {"revision": 1, "paused": true, "objects": [{"object": configmap("cm-phase", json!({}))}]},
    }))
    .unwrap();
    phases.create(&PostParams::default(), &phase).await.unwrap();
    for (field, value) in [
        ("objects", json!([])),
        ("revision", json!(2)),
        ("previous", json!([{"name": "rev-0"}])),
        ("availabilityProbes", extra["availabilityProbes"].clone()),
    ] {
        expect_immutable(&phases, "frozen-phase", field, value).await;
    }
    let unpause = json!({"spec": {"paused": false}});
    phases
        .patch(
            "frozen-phase",
            &PatchParams::default(),
            &Patch::Merge(&unpause),
        )
        .await
        .unwrap();

    // The Cluster variants go through the same rule.
    let cluster_sets = pko_api(&client, "ClusterObjectSet", "clusterobjectsets", None);
    let cluster_set_name = format!("{ns}-frozen");
    let cluster_set: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1",
        "kind": "ClusterObjectSet",
        "metadata": {"name": cluster_set_name},
        "spec": {"lifecycleState": "Paused", "phases": [{"name": "empty", "objects": []}]},
    }))
    .unwrap();
    cluster_sets
        .create(&PostParams::default(), &cluster_set)
        .await
        .unwrap();
    expect_immutable(&cluster_sets, &cluster_set_name, "phases", json!([])).await;
    let cluster_phases = pko_api(
        &client,
        "ClusterObjectSetPhase",
        "clusterobjectsetphases",
        None,
    );
    let cluster_phase_name = format!("{ns}-frozen-phase");
    let cluster_phase: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1",
        "kind": "ClusterObjectSetPhase",
        "metadata": {"name": cluster_phase_name},
        "spec": {"revision": 1, "paused": true, "objects": []},
    }))
    .unwrap();
    cluster_phases
        .create(&PostParams::default(), &cluster_phase)
        .await
        .unwrap();
    expect_immutable(&cluster_phases, &cluster_phase_name, "revision", json!(3)).await;

    // Upstream's phase-in of spec.revision: a set without one may be given one, once.
    let revision = json!({"spec": {"revision": 4}});
    cluster_sets
        .patch(
            &cluster_set_name,
            &PatchParams::default(),
            &Patch::Merge(&revision),
        )
        .await
        .unwrap();
    expect_immutable(&cluster_sets, &cluster_set_name, "revision", json!(5)).await;
    // ObjectSlices' objects are fixed too.
    let slices = pko_api(&client, "ObjectSlice", "objectslices", Some(&ns));
    let slice: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1",
        "kind": "ObjectSlice",
        "metadata": {"name": "frozen-slice"},
        "objects": [{"object": configmap("cm-slice", json!({}))}],
    }))
    .unwrap();
    slices.create(&PostParams::default(), &slice).await.unwrap();
    let emptied = json!({"objects": []});
    match slices
        .patch(
            "frozen-slice",
            &PatchParams::default(),
            &Patch::Merge(&emptied),
        )
        .await
    {
        Err(kube::Error::Api(status)) => assert!(
            status.code == 422
                && status.message.contains("objects: Invalid value")
                && status.message.contains("objects is immutable"),
            "{status:?}"
        ),
        other => panic!("changing a slice's objects was not refused: {other:?}"),
    }
    // Deleting goes through (finalizer removal is an update that leaves the spec alone).
    cluster_sets
        .delete(&cluster_set_name, &Default::default())
        .await
        .unwrap();
    cluster_phases
        .delete(&cluster_phase_name, &Default::default())
        .await
        .unwrap();
    wait_gone(&cluster_sets, &cluster_set_name).await;
    wait_gone(&cluster_phases, &cluster_phase_name).await;
}

/// Upstream's handover scenario with a delegated phase (class `default`): revision 2 takes cm1 over and
/// its probe fails on it. Every `Available=False` revision 2 ever reports is `ProbeFailure`, as upstream's
/// test reads it the first time it sees one: the phase's ObjectSetPhase not having reported yet is no
/// reason of its own.
#[tokio::test]
async fn a_delegated_revision_taking_objects_over_reports_its_failing_probe_from_the_first_word() {
    let (client, ns) = setup("os-handover-probe").await;
    let probed = |name: &str| {
        let mut cm = configmap(name, json!({}));
        cm["metadata"]["labels"] = json!({"test.package-operator.run/test": "True"});
        cm
    };
    let mut rev1 = object_set("rev1", &[("p", vec![probed("cm1")])], json!({}));
    rev1.spec.template.phases[0].class = "default".into();
    create_set(&client, &ns, &rev1).await;
    wait_condition(&client, &ns, "rev1", "Available", "True", None).await;

    let sets = Api::<ObjectSet>::namespaced(client.clone(), &ns);
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let record = seen.clone();
    let watch = tokio::spawn(async move {
        let config = watcher::Config::default().fields("metadata.name=rev2");
        let mut events = watcher::watcher(sets, config).boxed();
        while let Some(Ok(event)) = events.next().await {
            let (Event::Apply(set) | Event::InitApply(set)) = event else {
                continue;
            };
            let generation = set.metadata.generation;
            for c in set.status.iter().flat_map(|s| &s.conditions) {
                if c.type_ == "Available" && c.observed_generation == generation {
                    record
                        .lock()
                        .unwrap()
                        .push((c.status.clone(), c.reason.clone()));
                }
            }
        }
    });
    let mut rev2 = object_set(
        "rev2",
        &[("p", vec![probed("cm1"), configmap("cm3", json!({}))])],
        json!({
            "previous": [{"name": "rev1"}],
            "availabilityProbes": [{
                "selector": {"kind": {"group": "", "kind": "ConfigMap"},
                             "selector": {"matchLabels": {"test.package-operator.run/test": "True"}}},
                "probes": [{"fieldsEqual": {"fieldA": ".metadata.name", "fieldB": ".metadata.annotations.name"}}],
            }],
        }),
    );
    rev2.spec.template.phases[0].class = "default".into();
    create_set(&client, &ns, &rev2).await;
    wait_condition(
        &client,
        &ns,
        "rev2",
        "Available",
        "False",
        Some("ProbeFailure"),
    )
    .await;
    wait_condition(&client, &ns, "rev1", "InTransition", "True", None).await;
    // Controlled by revision 2's ObjectSetPhase, named after it (as upstream's test checks).
    let cm1 = get_cm(&client, &ns, "cm1").await.unwrap();
    let controller = controller_ref(&cm1.metadata).map(|r| r.name.clone());
    assert!(
        controller.as_deref().is_some_and(|c| c.starts_with("rev2")),
        "cm1 taken over by rev2: {controller:?}"
    );
    watch.abort();
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter()
            .all(|(status, reason)| status != "False" || reason == "ProbeFailure"),
        "rev2 reported another reason while its probe failed: {seen:?}"
    );
}

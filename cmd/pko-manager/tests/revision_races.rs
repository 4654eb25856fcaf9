//! Revisions under load: many sets changing at once against one manager, where a race between the
//! manager's own work and the apiserver's (garbage collector, deletion, handover) would show. Each test
//! keeps other sets being created, archived and deleted in the background while it checks one rule on
//! many sets at once, so an ordering that only load produces has many chances to happen.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::join_all;
use kube::api::{DeleteParams, PropagationPolicy};
use kube::{Api, Client};
use pko_proto::core::object_set::ObjectSet;
use pko_proto::core::object_set_phase::ObjectSetPhase;
use pko_testenv::wait_until;
use serde_json::json;

use common::*;

/// Sets pairs of each test works on at once.
const SETS: usize = 16;

/// An ObjectSet of one phase `p` holding ConfigMap `cm` (`data.rev` = `rev`); delegated to
/// ObjectSetPhases (class default) when `delegated`.
fn set_of(name: &str, cm: &str, rev: &str, delegated: bool, extra: serde_json::Value) -> ObjectSet {
    let mut set = object_set(
        name,
        &[("p", vec![configmap(cm, json!({"rev": rev}))])],
        extra,
    );
    if delegated {
        set.spec.template.phases[0].class = "default".into();
    }
    set
}

/// Background churn until the returned flag is set: rounds of sets created, then half archived and half
/// deleted as soon as they are available, each with objects of its own, so the manager applies and tears
/// down while the test's sets change. A round ends when its deletions are done, which paces the churn at
/// the speed the manager and the garbage collector keep up with.
fn churn(client: &Client, ns: &str) -> (Arc<AtomicBool>, tokio::task::JoinHandle<usize>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (client, ns, flag) = (client.clone(), ns.to_owned(), stop.clone());
    let task = tokio::spawn(async move {
        let sets = Api::<ObjectSet>::namespaced(client.clone(), &ns);
        let mut round = 0;
        while !flag.load(Ordering::Relaxed) {
            let names: Vec<String> = (0..6).map(|i| format!("churn-{round}-{i}")).collect();
            join_all(names.iter().enumerate().map(|(i, name)| {
                let set = set_of(name, &format!("{name}-cm"), "1", i % 2 == 0, json!({}));
                let (client, ns, sets) = (client.clone(), ns.clone(), sets.clone());
                async move {
                    sets.create(&Default::default(), &set).await.unwrap();
                    wait_condition(&client, &ns, name, "Available", "True", None).await;
                    if i % 2 == 0 {
                        archive_set(&client, &ns, name).await;
                    } else {
                        sets.delete(name, &DeleteParams::default()).await.unwrap();
                        wait_gone(&sets, name).await;
                    }
                }
            }))
            .await;
            round += 1;
        }
        round
    });
    (stop, task)
}

async fn stop_churn((stop, task): (Arc<AtomicBool>, tokio::task::JoinHandle<usize>)) {
    stop.store(true, Ordering::Relaxed);
    let rounds = task.await.unwrap();
    assert!(rounds > 0, "the churn ran");
}

/// An ObjectSet deleted with `propagationPolicy: Orphan` leaves its objects in place: the garbage
/// collector takes its references off them, the manager deletes none of them (issue 38, item 4).
#[tokio::test]
async fn sets_deleted_with_orphan_propagation_leave_their_objects() {
    let (client, ns) = setup("race-orphan").await;
    let sets = Api::<ObjectSet>::namespaced(client.clone(), &ns);
    let names: Vec<String> = (0..SETS).map(|i| format!("orphaning-{i}")).collect();
    let created: Vec<ObjectSet> = join_all(names.iter().enumerate().map(|(i, name)| {
        let set = set_of(name, &format!("{name}-cm"), "1", i % 2 == 0, json!({}));
        let client = client.clone();
        let ns = ns.clone();
        async move { create_set(&client, &ns, &set).await }
    }))
    .await;
    for name in &names {
        wait_condition(&client, &ns, name, "Available", "True", None).await;
    }
    let load = churn(&client, &ns);
    let orphan = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..DeleteParams::default()
    };
    join_all(names.iter().map(|name| sets.delete(name, &orphan))).await;
    for name in &names {
        wait_gone(&sets, name).await;
    }
    stop_churn(load).await;

    let phases = Api::<ObjectSetPhase>::namespaced(client.clone(), &ns);
    for (i, set) in created.iter().enumerate() {
        let name = &names[i];
        let cm = get_cm(&client, &ns, &format!("{name}-cm"))
            .await
            .unwrap_or_else(|| panic!("{name}'s ConfigMap was deleted"));
        let refs = cm.metadata.owner_references.clone().unwrap_or_default();
        assert!(
            refs.iter()
                .all(|r| Some(&r.uid) != set.metadata.uid.as_ref()),
            "{name}: the deleted set is still an owner: {refs:?}"
        );
        if i % 2 == 0 {
            // Delegated: the phase is orphaned with its objects and keeps controlling them.
            let phase = phases.get(&format!("{name}-p")).await.unwrap();
            assert_eq!(controller_uid(&cm), phase.metadata.uid, "{name}");
        }
    }
    // The orphaned phases, deleted with orphan propagation in turn, leave the objects too.
    let delegated: Vec<&String> = names.iter().step_by(2).collect();
    join_all(delegated.iter().map(|name| {
        let phases = phases.clone();
        let orphan = orphan.clone();
        async move {
            phases
                .delete(&format!("{name}-p"), &orphan)
                .await
                .map(|_| ())
        }
    }))
    .await;
    for name in &delegated {
        wait_gone(&phases, &format!("{name}-p")).await;
        let cm = get_cm(&client, &ns, &format!("{name}-cm")).await;
        assert!(
            cm.is_some(),
            "{name}'s ConfigMap was deleted with its phase"
        );
    }
}

/// Upstream's handover scenario, once without a class and once delegated (class default), with the same
/// names both times and cleaned up as upstream's suite does (foreground deletion, waited for), in many
/// namespaces at once while other sets are torn down around them (issue 38, item 5).
#[tokio::test]
async fn revisions_hand_over_in_both_classes_while_others_are_torn_down() {
    let namespaces: Vec<(Client, String)> =
        join_all((0..PARALLEL).map(|i| async move { setup(&format!("race-handover-{i}")).await }))
            .await;
    let load = churn(&namespaces[0].0, &namespaces[0].1);
    join_all(namespaces.iter().map(|(client, ns)| async move {
        for class in ["", "default"] {
            handover_scenario(client, ns, class).await;
        }
    }))
    .await;
    stop_churn(load).await;
}

/// Namespaces each test spreads its scenarios over.
const PARALLEL: usize = 6;

/// A ConfigMap object as a phase holds it, labelled for the probe when `probed`.
fn cm_object(name: &str, probed: bool) -> serde_json::Value {
    let mut cm = configmap(name, json!({}));
    if probed {
        cm["metadata"]["labels"] = json!({PROBED: "True"});
    }
    cm
}

const PROBED: &str = "test.package-operator.run/test";

fn two_phase_set(
    name: &str,
    class: &str,
    phases: [Vec<serde_json::Value>; 2],
    extra: serde_json::Value,
) -> ObjectSet {
    let [one, two] = phases;
    let mut set = object_set(name, &[("phase-1", one), ("phase-2", two)], extra);
    for phase in &mut set.spec.template.phases {
        phase.class = class.to_owned();
    }
    set
}

/// Deletes `name` with foreground propagation and waits until it is gone, as upstream's cleanup does.
async fn delete_foreground(client: &Client, ns: &str, name: &str) {
    let sets = Api::<ObjectSet>::namespaced(client.clone(), ns);
    let foreground = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        ..DeleteParams::default()
    };
    sets.delete(name, &foreground).await.unwrap();
    let gone = wait_until(&format!("{ns}/{name} deleted"), TIMEOUT, || async {
        match sets.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(set) => Err(format!(
                "finalizers {:?}, status {:?}",
                set.metadata.finalizers,
                set.status.map(|s| s.conditions)
            )),
        }
    })
    .await;
    if let Err(stuck) = gone {
        panic!("{stuck:?}\n{}", namespace_dump(client, ns).await);
    }
}

/// The sets, phases and ConfigMaps of `ns`: conditions, owners, finalizers, what a stuck wait needs.
async fn namespace_dump(client: &Client, ns: &str) -> String {
    let mut lines = Vec::new();
    for set in Api::<ObjectSet>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        lines.push(format!(
            "set {:?} gen {:?} finalizers {:?} deleting {} {:?}",
            set.metadata.name,
            set.metadata.generation,
            set.metadata.finalizers,
            set.metadata.deletion_timestamp.is_some(),
            set.status.map(|s| s.conditions)
        ));
    }
    for phase in Api::<ObjectSetPhase>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        lines.push(format!(
            "phase {:?} owners {:?} finalizers {:?} deleting {} {:?}",
            phase.metadata.name,
            phase
                .metadata
                .owner_references
                .map(|o| o.into_iter().map(|r| r.name).collect::<Vec<_>>()),
            phase.metadata.finalizers,
            phase.metadata.deletion_timestamp.is_some(),
            phase.status.map(|s| s.conditions)
        ));
    }
    for cm in Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        lines.push(format!(
            "cm {:?} owners {:?} deleting {}",
            cm.metadata.name,
            cm.metadata.owner_references.map(|o| o
                .into_iter()
                .map(|r| (r.name, r.controller))
                .collect::<Vec<_>>()),
            cm.metadata.deletion_timestamp.is_some()
        ));
    }
    lines.join("\n")
}

/// Waits until set `name` has condition `type_`=`status` (and `reason`, if given) for its generation; on
/// a timeout, panics with what the namespace holds.
async fn wait_set(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
    reason: Option<&str>,
) {
    let reached = reach_condition(client, ns, name, type_, status, reason).await;
    if let Err(stuck) = reached {
        panic!("{stuck:?}\n{}", namespace_dump(client, ns).await);
    }
}

async fn handover_scenario(client: &Client, ns: &str, class: &str) {
    let rev1 = two_phase_set(
        "test-rev1",
        class,
        [
            vec![cm_object("cm-1", true)],
            vec![cm_object("cm-2", false)],
        ],
        json!({"revision": 1}),
    );
    // cm-1 moves to phase-2; cm-3 replaces cm-2; the probe fails on cm-1 until it is annotated.
    let rev2 = two_phase_set(
        "test-rev2",
        class,
        [
            vec![cm_object("cm-3", false)],
            vec![cm_object("cm-1", true)],
        ],
        json!({
            "revision": 2,
            "previous": [{"name": "test-rev1"}],
            "availabilityProbes": [{
                "selector": {"kind": {"group": "", "kind": "ConfigMap"},
                             "selector": {"matchLabels": {PROBED: "True"}}},
                "probes": [{"fieldsEqual": {"fieldA": ".metadata.name", "fieldB": ".metadata.annotations.name"}}],
            }],
        }),
    );
    let at = |what: &str| format!("{ns} class {class:?}: {what}");
    create_set(client, ns, &rev1).await;
    wait_set(client, ns, "test-rev1", "Available", "True", None).await;
    create_set(client, ns, &rev2).await;
    wait_set(
        client,
        ns,
        "test-rev2",
        "Available",
        "False",
        Some("ProbeFailure"),
    )
    .await;
    wait_set(client, ns, "test-rev1", "InTransition", "True", None).await;
    let cm1 = get_cm(client, ns, "cm-1")
        .await
        .unwrap_or_else(|| panic!("{}", at("cm-1 exists")));
    let controller = controller_ref(&cm1.metadata).map(|r| r.name.clone());
    assert!(
        controller
            .as_deref()
            .is_some_and(|c| c.starts_with("test-rev2")),
        "{}: {controller:?}",
        at("cm-1 controlled by revision 2")
    );
    patch_cm(
        client,
        ns,
        "cm-1",
        json!({"metadata": {"annotations": {"name": "cm-1"}}}),
    )
    .await;
    wait_set(client, ns, "test-rev2", "Available", "True", None).await;
    archive_set(client, ns, "test-rev1").await;
    wait_set(client, ns, "test-rev1", "Archived", "True", None).await;
    assert!(
        get_cm(client, ns, "cm-2").await.is_none(),
        "{}",
        at("cm-2 gone")
    );
    assert!(
        get_cm(client, ns, "cm-1").await.is_some(),
        "{}",
        at("cm-1 kept")
    );
    assert!(
        get_cm(client, ns, "cm-3").await.is_some(),
        "{}",
        at("cm-3 kept")
    );
    delete_foreground(client, ns, "test-rev1").await;
    delete_foreground(client, ns, "test-rev2").await;
}

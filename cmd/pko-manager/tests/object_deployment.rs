//! ObjectDeployment behaviour on a real apiserver with the real pko-manager binary: revisions, archival
//! with revisionHistoryLimit, hash collisions, and conditionMappings flowing up to the deployment.
#![allow(clippy::unwrap_used)]

mod common;

use kube::api::{
    ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::Api;
use pko_actors::engine::objects::template_hash::template_hash;
use pko_proto::core::object_deployment::ObjectDeployment;
use pko_proto::core::object_set::ObjectSet;
use pko_testenv::wait_until;
use serde_json::{json, Value};

use common::*;

fn deployment(name: &str, objects: Vec<Value>, extra: Value) -> ObjectDeployment {
    let objects: Vec<Value> = objects.into_iter().map(|o| json!({"object": o})).collect();
    let spec = json!({
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"phases": [{"name": "main", "objects": objects}]},
        },
    });
    typed("ObjectDeployment", name, spec, extra)
}

async fn wait_deployment(
    client: &kube::Client,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&ObjectDeployment) -> bool,
) -> ObjectDeployment {
    let api = Api::<ObjectDeployment>::namespaced(client.clone(), ns);
    wait_until(
        &format!("ObjectDeployment {ns}/{name}: {what}"),
        TIMEOUT,
        || async {
            let od = api.get(name).await.map_err(|e| e.to_string())?;
            if check(&od) {
                Ok(od)
            } else {
                Err(format!("{:?}", od.status))
            }
        },
    )
    .await
    .unwrap()
}

fn condition(od: &ObjectDeployment, type_: &str) -> Option<(String, String)> {
    let generation = od.metadata.generation?;
    od.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_ && c.observed_generation == Some(generation))
        .map(|c| (c.status.clone(), c.reason.clone()))
}

async fn sets_of(client: &kube::Client, ns: &str, name: &str) -> Vec<ObjectSet> {
    let params =
        ListParams::default().labels(&format!("package-operator.run/object-deployment={name}"));
    let mut sets = Api::<ObjectSet>::namespaced(client.clone(), ns)
        .list(&params)
        .await
        .unwrap()
        .items;
    sets.sort_by_key(|s| s.status.as_ref().map(|st| st.revision).unwrap_or_default());
    sets
}

#[tokio::test]
async fn revisions_archive_and_respect_history_limit() {
    let (client, ns) = setup("od-history").await;
    let api = Api::<ObjectDeployment>::namespaced(client.clone(), &ns);
    let od = deployment(
        "web",
        vec![configmap("conf", json!({"v": "1"}))],
        json!({"revisionHistoryLimit": 1}),
    );
    api.create(&PostParams::default(), &od).await.unwrap();
    wait_deployment(&client, &ns, "web", "revision 1 available", |od| {
        condition(od, "Available").is_some_and(|(s, _)| s == "True")
            && od.status.as_ref().and_then(|s| s.revision) == Some(1)
    })
    .await;

    for v in ["2", "3"] {
        let mut od = api.get("web").await.unwrap();
        od.spec.template.spec.phases[0].objects[0].object = configmap("conf", json!({"v": v}));
        api.replace("web", &PostParams::default(), &od)
            .await
            .unwrap();
        let want: i64 = v.parse().unwrap();
        wait_deployment(
            &client,
            &ns,
            "web",
            &format!("revision {v} settled"),
            |od| {
                od.status.as_ref().and_then(|s| s.revision) == Some(want)
                    && condition(od, "Progressing")
                        .is_some_and(|(s, r)| s == "False" && r == "Idle")
            },
        )
        .await;
        wait_cm(&client, &ns, "conf", |cm| {
            cm.data.as_ref().is_some_and(|d| d["v"] == v)
        })
        .await;
    }
    // History limit 1: revision 1 deleted, revision 2 archived, revision 3 current.
    let sets = wait_until("two revisions left", TIMEOUT, || async {
        let sets = sets_of(&client, &ns, "web").await;
        if sets.len() == 2 {
            Ok(sets)
        } else {
            Err(format!("{} sets", sets.len()))
        }
    })
    .await
    .unwrap();
    let revisions: Vec<i64> = sets
        .iter()
        .map(|s| s.status.as_ref().unwrap().revision)
        .collect();
    assert_eq!(revisions, [2, 3]);
    assert_eq!(sets[0].spec.lifecycle_state.as_str(), "Archived");
    assert_eq!(
        sets[1]
            .spec
            .previous
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>(),
        [sets[0].metadata.name.as_deref().unwrap()]
    );
    // The ConfigMap was handed over through every revision, never deleted.
    let cm = get_cm(&client, &ns, "conf").await.unwrap();
    assert_eq!(controller_uid(&cm), sets[1].metadata.uid);

    // As later upstream versions: each set carries its revision in the spec too, and the deployment
    // lists the sets it controls, oldest first.
    for set in &sets {
        assert_eq!(
            set.spec.revision,
            Some(set.status.as_ref().unwrap().revision)
        );
    }
    let names: Vec<String> = sets
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    let od = wait_deployment(&client, &ns, "web", "controllerOf lists both sets", |od| {
        od.status.as_ref().is_some_and(|s| {
            s.controller_of.iter().map(|c| &c.name).collect::<Vec<_>>()
                == names.iter().collect::<Vec<_>>()
        })
    })
    .await;
    let first = &od.status.unwrap().controller_of[0];
    assert_eq!(
        (
            first.kind.as_str(),
            first.group.as_str(),
            first.namespace.as_str()
        ),
        ("ObjectSet", "package-operator.run", ns.as_str())
    );
    // Three revisions settled through many reconciles; only a reconcile the index shows no set of this
    // deployment to (its first revision) lists them from the apiserver, the others read the watch-fed
    // index, a new revision's too (its create would find a set already made).
    let reads = |source: &'static str| async move {
        manager()
            .metric(&format!(
                "pko_deployment_set_reads_total{{source=\"{source}\"}}"
            ))
            .await
    };
    let from_index = reads("index").await.unwrap();
    assert!(from_index > 0, "no reconcile read its sets from the index");
    assert!(
        reads("list").await.unwrap() > 0,
        "a deployment's first revision is listed for"
    );
    // Revisions 2 and 3 planned with their previous revisions from the index, not a read each.
    let previous_from_index = manager()
        .metric("pko_object_set_previous_reads_total{source=\"index\"}")
        .await
        .unwrap();
    assert!(
        previous_from_index >= 2,
        "previous revisions read from the index: {previous_from_index}"
    );
}

/// An ObjectSet created with `spec.revision` (later upstream API) keeps it, and it is the set's revision.
#[tokio::test]
async fn an_object_set_takes_its_revision_from_the_spec() {
    let (client, ns) = setup("os-spec-revision").await;
    let set: ObjectSet = typed(
        "ObjectSet",
        "given",
        json!({"revision": 7, "phases": [{"name": "main", "objects": [{"object": configmap("given", json!({"a": "b"}))}]}]}),
        json!({}),
    );
    let api = Api::<ObjectSet>::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &set).await.unwrap();
    let set = wait_until("revision 7 reported", TIMEOUT, || async {
        let set = api.get("given").await.map_err(|e| e.to_string())?;
        match set.status.as_ref().map(|s| s.revision) {
            Some(7) => Ok(set),
            other => Err(format!("status.revision {other:?}")),
        }
    })
    .await
    .unwrap();
    assert_eq!(set.spec.revision, Some(7));
    let cm = get_cm(&client, &ns, "given").await.unwrap();
    assert_eq!(controller_uid(&cm), set.metadata.uid);
}

#[tokio::test]
async fn hash_collision_increments_collision_count() {
    let (client, ns) = setup("od-collide").await;
    let od = deployment("clash", vec![configmap("c", json!({}))], json!({}));
    // A set that is not the deployment's already holds the name of collisionCount 0.
    let taken = format!("clash-{}", template_hash(&od.spec.template, 0));
    let squatter = object_set(
        &taken,
        &[("p", vec![configmap("other", json!({}))])],
        json!({}),
    );
    create_set(&client, &ns, &squatter).await;

    Api::<ObjectDeployment>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &od)
        .await
        .unwrap();
    let od = wait_deployment(&client, &ns, "clash", "available after a collision", |od| {
        condition(od, "Available").is_some_and(|(s, _)| s == "True")
    })
    .await;
    let status = od.status.unwrap();
    assert_eq!(status.collision_count, Some(1));
    let expected = template_hash(&od.spec.template, 1);
    assert_eq!(status.template_hash.as_deref(), Some(expected.as_str()));
    assert!(Api::<ObjectSet>::namespaced(client.clone(), &ns)
        .get_opt(&format!("clash-{expected}"))
        .await
        .unwrap()
        .is_some());
}

/// A new revision is created without listing when the index holds the deployment's sets; a create that
/// finds its name taken then lists before calling it a collision, and counts it once.
#[tokio::test]
async fn a_collision_found_by_a_create_from_the_index_is_counted_once() {
    let (client, ns) = setup("od-collide-later").await;
    let api = Api::<ObjectDeployment>::namespaced(client.clone(), &ns);
    let od = deployment("later", vec![configmap("c", json!({"v": "1"}))], json!({}));
    api.create(&PostParams::default(), &od).await.unwrap();
    wait_deployment(&client, &ns, "later", "revision 1 available", |od| {
        condition(od, "Available").is_some_and(|(s, _)| s == "True")
    })
    .await;
    let mut od = api.get("later").await.unwrap();
    od.spec.template.spec.phases[0].objects[0].object = configmap("c", json!({"v": "2"}));
    let taken = format!("later-{}", template_hash(&od.spec.template, 0));
    let squatter = object_set(
        &taken,
        &[("p", vec![configmap("other", json!({}))])],
        json!({}),
    );
    create_set(&client, &ns, &squatter).await;
    api.replace("later", &PostParams::default(), &od)
        .await
        .unwrap();
    let od = wait_deployment(&client, &ns, "later", "revision 2 available", |od| {
        od.status.as_ref().and_then(|s| s.revision) == Some(2)
            && condition(od, "Available").is_some_and(|(s, _)| s == "True")
    })
    .await;
    let status = od.status.unwrap();
    assert_eq!(status.collision_count, Some(1));
    let expected = template_hash(&od.spec.template, 1);
    assert_eq!(status.template_hash.as_deref(), Some(expected.as_str()));
}

#[tokio::test]
async fn condition_mappings_reach_the_deployment() {
    let (client, ns) = setup("od-mapping").await;
    common::workload::install_widget_crd(&client, "test.pko.example").await;

    let widget = json!({"apiVersion": "test.pko.example/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 1}});
    let mut od = deployment("mapped", vec![widget], json!({}));
    od.spec.template.spec.phases[0].objects[0].condition_mappings = serde_json::from_value(
        json!([{"sourceType": "Ready", "destinationType": "test.pko.example/WidgetReady"}]),
    )
    .unwrap();
    Api::<ObjectDeployment>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &od)
        .await
        .unwrap();

    let resource =
        ApiResource::from_gvk(&GroupVersionKind::gvk("test.pko.example", "v1", "Widget"));
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
    let w = wait_until("widget applied", TIMEOUT, || async {
        widgets
            .get_opt("w")
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "missing".to_owned())
    })
    .await
    .unwrap();
    let generation = w.metadata.generation.unwrap_or(1);
    let status = json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "AllGood", "message": "widget is ready",
        "observedGeneration": generation, "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]}});
    widgets
        .patch_status("w", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();

    let od = wait_deployment(&client, &ns, "mapped", "mapped condition", |od| {
        condition(od, "test.pko.example/WidgetReady")
            .is_some_and(|(s, r)| s == "True" && r == "AllGood")
    })
    .await;
    assert!(condition(&od, "Available").is_some_and(|(s, _)| s == "True"));
}

#[tokio::test]
async fn paused_deployment_holds_revisions_until_unpaused() {
    let (client, ns) = setup("od-pause").await;
    let api = Api::<ObjectDeployment>::namespaced(client.clone(), &ns);
    let od = deployment(
        "held",
        vec![configmap("conf", json!({"v": "1"}))],
        json!({}),
    );
    api.create(&PostParams::default(), &od).await.unwrap();
    wait_deployment(&client, &ns, "held", "available", |od| {
        condition(od, "Available").is_some_and(|(s, _)| s == "True")
    })
    .await;

    // Pause and change the template in one update: the new generation is reconciled as paused.
    let mut od = api.get("held").await.unwrap();
    od.spec.paused = true;
    od.spec.template.spec.phases[0].objects[0].object = configmap("conf", json!({"v": "2"}));
    api.replace("held", &PostParams::default(), &od)
        .await
        .unwrap();
    wait_deployment(&client, &ns, "held", "paused", |od| {
        condition(od, "Paused").is_some_and(|(s, r)| s == "True" && r == "Paused")
    })
    .await;
    let sets = sets_of(&client, &ns, "held").await;
    assert_eq!(sets.len(), 1, "no new revision while paused");
    assert_eq!(sets[0].spec.lifecycle_state.as_str(), "Paused");
    assert_eq!(
        get_cm(&client, &ns, "conf").await.unwrap().data.unwrap()["v"],
        "1"
    );

    let mut od = api.get("held").await.unwrap();
    od.spec.paused = false;
    api.replace("held", &PostParams::default(), &od)
        .await
        .unwrap();
    wait_deployment(&client, &ns, "held", "revision 2 settled", |od| {
        od.status.as_ref().and_then(|s| s.revision) == Some(2)
            && condition(od, "Progressing").is_some_and(|(s, r)| s == "False" && r == "Idle")
    })
    .await;
    wait_cm(&client, &ns, "conf", |cm| {
        cm.data.as_ref().is_some_and(|d| d["v"] == "2")
    })
    .await;
    assert!(condition(&api.get("held").await.unwrap(), "Paused").is_none());
}

/// A revision that never became available and shares nothing with the latest is archived even while the
/// latest is unavailable; the last available one keeps serving (issue 15, item 4).
#[tokio::test]
async fn unavailable_intermediate_revisions_are_archived() {
    let (client, ns) = setup("od-intermediate").await;
    let api = Api::<ObjectDeployment>::namespaced(client.clone(), &ns);
    let template = |cm: &str, ok: &str| {
        json!({
            "metadata": {"labels": {"app": "inter"}},
            "spec": {
                "phases": [{"name": "main", "objects": [{"object": configmap(cm, json!({"ok": ok}))}]}],
                "availabilityProbes": [{
                    "selector": {"kind": {"group": "", "kind": "ConfigMap"}},
                    "probes": [{"cel": {"rule": "self.data.ok == 'true'", "message": "not ok"}}],
                }],
            },
        })
    };
    let od: ObjectDeployment = typed(
        "ObjectDeployment",
        "inter",
        json!({"selector": {"matchLabels": {"app": "inter"}}, "template": template("a", "true")}),
        json!({}),
    );
    api.create(&PostParams::default(), &od).await.unwrap();
    let roll = |cm: &'static str, ok: &'static str, revision: i64| {
        let api = api.clone();
        let client = client.clone();
        let ns = ns.clone();
        async move {
            api.patch(
                "inter",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"template": template(cm, ok)}})),
            )
            .await
            .unwrap();
            wait_deployment(
                &client,
                &ns,
                "inter",
                &format!("revision {revision}"),
                |od| od.status.as_ref().and_then(|s| s.revision) == Some(revision),
            )
            .await;
        }
    };
    wait_deployment(&client, &ns, "inter", "revision 1 available", |od| {
        condition(od, "Available").is_some_and(|(s, _)| s == "True")
    })
    .await;
    roll("b", "true", 2).await;
    wait_deployment(&client, &ns, "inter", "revision 2 settled", |od| {
        condition(od, "Progressing").is_some_and(|(s, r)| s == "False" && r == "Idle")
    })
    .await;
    roll("c", "false", 3).await;
    roll("d", "false", 4).await;
    let lifecycles = wait_until("revision 3 archived", TIMEOUT, || async {
        let sets = sets_of(&client, &ns, "inter").await;
        let lifecycles: Vec<(i64, String)> = sets
            .iter()
            .map(|s| {
                (
                    // The spec carries it from creation; status only once the set has reported.
                    s.spec.revision.unwrap_or_default(),
                    s.spec.lifecycle_state.as_str().to_owned(),
                )
            })
            .collect();
        let state = |r: i64| {
            lifecycles
                .iter()
                .find(|(rev, _)| *rev == r)
                .map(|(_, l)| l.as_str())
        };
        if state(3) == Some("Archived") && state(4).is_some() {
            Ok(lifecycles)
        } else {
            Err(format!("{lifecycles:?}"))
        }
    })
    .await
    .unwrap();
    let state = |r: i64| {
        lifecycles
            .iter()
            .find(|(rev, _)| *rev == r)
            .map(|(_, l)| l.clone())
    };
    assert_eq!(state(1).as_deref(), Some("Archived"), "{lifecycles:?}");
    assert_eq!(
        state(2).as_deref(),
        Some("Active"),
        "the last available revision keeps serving"
    );
    assert_eq!(state(4).as_deref(), Some("Active"), "{lifecycles:?}");
    // Revision 2 still serves its object; revision 3's went with it.
    assert!(get_cm(&client, &ns, "b").await.is_some());
    wait_cm_gone(&client, &ns, "c").await;
}

/// Back to the first template while the second, which took the first one's ConfigMap but never became
/// available, is still active: the deployment settles (Available=True, Progressing=False for its
/// generation) on a third revision of the first template, which took the ConfigMap from the second
/// (issue 38, item 6).
#[tokio::test]
async fn returning_to_an_earlier_template_while_a_newer_revision_holds_its_objects() {
    let (client, ns) = setup("od-back").await;
    let api = Api::<ObjectDeployment>::namespaced(client.clone(), &ns);
    // Both templates hold ConfigMap `shared`; the second's probe never passes.
    let template = |ok: &str, rule: &str| {
        json!({
            "metadata": {"labels": {"app": "back"}},
            "spec": {
                "phases": [{"name": "main", "objects": [{"object": configmap("shared", json!({"ok": ok}))}]}],
                "availabilityProbes": [{
                    "selector": {"kind": {"group": "", "kind": "ConfigMap"}},
                    "probes": [{"cel": {"rule": rule, "message": "not ok"}}],
                }],
            },
        })
    };
    let good = template("true", "self.data.ok == 'true'");
    let broken = template("false", "self.data.ok == 'true'");
    let od: ObjectDeployment = typed(
        "ObjectDeployment",
        "back",
        json!({"selector": {"matchLabels": {"app": "back"}}, "template": good}),
        json!({}),
    );
    api.create(&PostParams::default(), &od).await.unwrap();
    let live = |od: &ObjectDeployment| {
        condition(od, "Available").is_some_and(|(s, _)| s == "True")
            && condition(od, "Progressing").is_some_and(|(s, _)| s == "False")
    };
    wait_deployment(&client, &ns, "back", "revision 1 live", live).await;
    let set_template = |template: Value| {
        let api = api.clone();
        async move {
            api.patch(
                "back",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"template": template}})),
            )
            .await
            .unwrap();
        }
    };
    set_template(broken).await;
    // Revision 2 takes the ConfigMap and fails its probe.
    wait_cm(&client, &ns, "shared", |cm| {
        cm.data
            .as_ref()
            .and_then(|d| d.get("ok"))
            .map(String::as_str)
            == Some("false")
    })
    .await;
    wait_deployment(&client, &ns, "back", "revision 2 unavailable", |od| {
        od.status.as_ref().and_then(|s| s.revision) == Some(2)
            && condition(od, "Progressing").is_some_and(|(s, _)| s == "True")
    })
    .await;
    set_template(good).await;
    let settled = wait_deployment(&client, &ns, "back", "live again after going back", live).await;
    let status = settled.status.unwrap();
    assert_eq!(
        status.revision,
        Some(3),
        "a new revision of the first template"
    );
    let sets = sets_of(&client, &ns, "back").await;
    let current = sets
        .iter()
        .find(|s| s.spec.revision == Some(3))
        .expect("revision 3");
    let shared = wait_cm(&client, &ns, "shared", |cm| {
        cm.data
            .as_ref()
            .and_then(|d| d.get("ok"))
            .map(String::as_str)
            == Some("true")
    })
    .await;
    assert_eq!(controller_uid(&shared), current.metadata.uid);
    for older in sets.iter().filter(|s| s.spec.revision != Some(3)) {
        wait_condition(
            &client,
            &ns,
            older.metadata.name.as_deref().unwrap(),
            "Archived",
            "True",
            None,
        )
        .await;
    }
}

const CREATED: &str = "package_operator_object_set_created_timestamp_seconds";

/// Upstream's revision metrics against revisionHistoryLimit 0 and 1: a revision the history limit
/// deletes has no series left by the time its deployment reports the next revision settled
/// (Available=True, Progressing=False for its generation), one the limit keeps still has them; a deleted
/// deployment's sets take their series with them (issue 38, item 8).
#[tokio::test]
async fn revision_series_go_with_the_revisions_the_history_limit_deletes() {
    let (client, ns) = setup("od-metrics").await;
    let api = Api::<ObjectDeployment>::namespaced(client.clone(), &ns);
    for limit in [0, 1] {
        let name = format!("hist-{limit}");
        let phases =
            |cm: &str| json!([{"name": "main", "objects": [{"object": configmap(cm, json!({}))}]}]);
        let template = |cm: &str| json!({"metadata": {"labels": {"app": name}}, "spec": {"phases": phases(cm)}});
        let od: ObjectDeployment = typed(
            "ObjectDeployment",
            &name,
            json!({"selector": {"matchLabels": {"app": name}}, "template": template(&format!("{name}-a"))}),
            json!({"revisionHistoryLimit": limit}),
        );
        api.create(&PostParams::default(), &od).await.unwrap();
        let settled = |od: &ObjectDeployment| {
            condition(od, "Available").is_some_and(|(s, _)| s == "True")
                && condition(od, "Progressing").is_some_and(|(s, _)| s == "False")
        };
        wait_deployment(&client, &ns, &name, "revision 1 settled", settled).await;
        let first = sets_of(&client, &ns, &name).await[0]
            .metadata
            .name
            .clone()
            .unwrap();
        let first_label = format!("pko_name=\"{first}\"");
        wait_until(&format!("{first}'s series"), TIMEOUT, || async {
            match series(CREATED, &[&first_label]).await.len() {
                1 => Ok(()),
                n => Err(format!("{n} series")),
            }
        })
        .await
        .unwrap();
        for (revision, cm) in [(2, "b"), (3, "c")] {
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"template": template(&format!("{name}-{cm}"))}})),
            )
            .await
            .unwrap();
            wait_deployment(
                &client,
                &ns,
                &name,
                &format!("revision {revision} settled"),
                |od| settled(od) && od.status.as_ref().and_then(|s| s.revision) == Some(revision),
            )
            .await;
            // Read once, right after the deployment said so: no waiting for the series to go.
            let left = series(CREATED, &[&first_label]).await;
            let kept = limit == 1 && revision == 2;
            assert_eq!(
                left.len(),
                usize::from(kept),
                "limit {limit}, revision {revision} settled: {left:?}"
            );
        }
        if limit == 1 {
            // Deleting the deployment: once its sets are gone, so are their series.
            let sets: Vec<String> = sets_of(&client, &ns, &name)
                .await
                .into_iter()
                .filter_map(|s| s.metadata.name)
                .collect();
            api.delete(&name, &Default::default()).await.unwrap();
            let set_api = Api::<ObjectSet>::namespaced(client.clone(), &ns);
            for set in &sets {
                wait_gone(&set_api, set).await;
                let label = format!("pko_name=\"{set}\"");
                let left = series(CREATED, &[&label]).await;
                assert!(left.is_empty(), "{set} is gone: {left:?}");
            }
        }
    }
}

/// A deployment being deleted makes no revision again. A foreground deletion deletes its sets first; a
/// set made again once the last one went holds the deletion up (and a Package's above it) for as long as
/// pko keeps making them: CI saw a foreground-deleted Package stay for over a minute.
#[tokio::test]
async fn a_deployment_being_deleted_makes_no_revision_again() {
    let (client, ns) = setup("od-deleting").await;
    let api = Api::<ObjectDeployment>::namespaced(client.clone(), &ns);
    // Someone else's finalizer keeps the deployment once the collector is done with it.
    const HOLD: &str = "example.com/hold";
    let mut od = deployment("web", vec![configmap("conf", json!({"v": "1"}))], json!({}));
    od.metadata.finalizers = Some(vec![HOLD.to_owned()]);
    api.create(&PostParams::default(), &od).await.unwrap();
    wait_deployment(&client, &ns, "web", "available", |od| {
        condition(od, "Available").is_some_and(|(s, _)| s == "True")
    })
    .await;

    api.delete("web", &kube::api::DeleteParams::foreground())
        .await
        .unwrap();
    wait_until(
        "the collector done with the deployment",
        TIMEOUT,
        || async {
            let od = api.get("web").await.map_err(|e| e.to_string())?;
            let sets: Vec<_> = sets_of(&client, &ns, "web")
                .await
                .into_iter()
                .filter_map(|s| s.metadata.name)
                .collect();
            let finalizers = od.metadata.finalizers.unwrap_or_default();
            if sets.is_empty() && finalizers == [HOLD] {
                Ok(())
            } else {
                Err(format!("sets {sets:?}, finalizers {finalizers:?}"))
            }
        },
    )
    .await
    .unwrap();
    let audit = env().management().audit_log_path();
    let created = pko_testenv::manager_creates(&audit, "objectsets", &ns).unwrap();
    assert_eq!(created.len(), 1, "sets made: {created:?}");

    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    wait_gone(&api, "web").await;
}

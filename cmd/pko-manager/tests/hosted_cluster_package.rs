//! HostedClusterPackage rollouts on the real environment with a real package (the `handlebars` example,
//! built and pushed with kubectl-package; its ConfigMaps are available as soon as they are applied):
//! seed 000's status, a rollout across 12 HostedClusters in three risk groups plus unlabeled ones under
//! maxUnavailable, watched by an independent observer of every Package change; a package that never
//! becomes available blocking its group; new, deleted and deselected HostedClusters; and the JetStream
//! event stream. The manager killed mid-rollout is in hosted_cluster_package_restart.rs.
#![allow(clippy::unwrap_used)]

mod common;

use pko_proto::well_known::HOSTED_CLUSTER_PACKAGE_LABEL;
use std::collections::{BTreeMap, BTreeSet};

use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::package::Package;
use pko_proto::hypershift::HostedCluster;
use serde_json::json;

use common::rollout::*;
use common::*;

#[tokio::test]
async fn seed_000s_status_for_three_clusters_and_the_fleet_follows_hosted_clusters() {
    let log = || manager().log_tail();
    manager();
    let (ns, clusters) = fleet("hcpkg-seed", &[None, None, None]).await;
    let client = env().management().client().await.unwrap();
    let image = build_and_push("handlebars", "hcpkg-simple:v1");
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let name = format!("{ns}-seed");
    api.create(
        &PostParams::default(),
        &hcpkg(&name, &ns, &image, json!({"instant": {}}), None),
    )
    .await
    .unwrap();

    let h = wait_status(&api, &name, log, "3/3 available", |h| {
        all_available(h, 3) && condition(h, "Progressing").is_some_and(|c| c.status == "False")
    })
    .await;
    let status = h.status.clone().unwrap();
    assert_eq!(status.counts.progressed_packages, 3);
    let expect = [
        (
            "Available",
            "True",
            "EnoughPackagesAvailable",
            "3/3 packages available.",
        ),
        (
            "Progressing",
            "False",
            "AllPackagesProgressed",
            "3/3 packages progressed.",
        ),
        (
            "HasPausedPackage",
            "False",
            "NoPackagePaused",
            "0/3 packages paused.",
        ),
    ];
    for (type_, s, reason, message) in expect {
        let c = condition(&h, type_).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (s, reason, message),
            "{type_}"
        );
        assert_eq!(c.observed_generation, h.metadata.generation);
    }
    for cluster in &clusters {
        let p = Api::<Package>::namespaced(client.clone(), &cluster.hcp_namespace)
            .get(&name)
            .await
            .unwrap();
        assert_eq!(
            p.metadata.labels.unwrap()[HOSTED_CLUSTER_PACKAGE_LABEL],
            name
        );
        assert_eq!(
            p.metadata.owner_references.unwrap()[0].kind,
            "HostedClusterPackage"
        );
    }

    // A new HostedCluster gets its Package; a deleted one loses it.
    let mut labels = BTreeMap::from([("fleet".to_owned(), ns.clone())]);
    labels.insert("extra".to_owned(), "yes".to_owned());
    let added = env()
        .add_hosted_cluster(&ns, "hc-new", labels, true)
        .await
        .unwrap();
    wait_status(&api, &name, log, "4/4 available", |h| all_available(h, 4)).await;
    Api::<HostedCluster>::namespaced(client.clone(), &ns)
        .delete(&clusters[0].name, &DeleteParams::default())
        .await
        .unwrap();
    wait_status(&api, &name, log, "3 packages after a deletion", |h| {
        all_available(h, 3)
    })
    .await;
    wait_package_gone(&client, &clusters[0].hcp_namespace, &name).await;
    Api::<Package>::namespaced(client.clone(), &added.hcp_namespace)
        .get(&name)
        .await
        .unwrap();

    // One relabelled out of the selector loses its Package too.
    let relabel = json!({"metadata": {"labels": {"fleet": "elsewhere"}}});
    Api::<HostedCluster>::namespaced(client.clone(), &ns)
        .patch(
            &clusters[1].name,
            &PatchParams::default(),
            &Patch::Merge(&relabel),
        )
        .await
        .unwrap();
    wait_status(&api, &name, log, "2 packages after a deselection", |h| {
        all_available(h, 2)
    })
    .await;
    wait_package_gone(&client, &clusters[1].hcp_namespace, &name).await;
}

#[tokio::test]
async fn rolling_upgrade_across_risk_groups_keeps_budget_and_order() {
    let log = || manager().log_tail();
    manager();
    let (ns, clusters) = fleet("hcpkg-roll", &RISKS).await;
    let group_of = group_of(&clusters, &RISKS);
    let client = env().management().client().await.unwrap();
    let v1 = build_and_push("handlebars", "hcpkg-roll:v1");
    let v2 = build_and_push("handlebars", "hcpkg-roll:v2");
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let name = format!("{ns}-roll");
    let partition = risk_partition();
    let strategy = json!({"rollingUpgrade": {"maxUnavailable": 2}});
    api.create(
        &PostParams::default(),
        &hcpkg(&name, &ns, &v1, strategy, Some(partition)),
    )
    .await
    .unwrap();
    wait_status(&api, &name, log, "12/12 available on v1", |h| {
        all_available(h, 12)
    })
    .await;

    // The observer: one watch over every Package of this HostedClusterPackage, in apiserver order.
    let v2_spec = json!({"image": v2, "config": {"greeting": "hi"}});
    let observer = RolloutObserver::start(&client, &name, &v2_spec, group_of.clone()).await;

    // Roll out v2.
    let patch =
        json!({"spec": {"template": {"spec": {"image": v2, "config": {"greeting": "hi"}}}}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let done = wait_status(&api, &name, log, "12/12 available on v2", |h| {
        all_available(h, 12) && condition(h, "Progressing").is_some_and(|c| c.status == "False")
    })
    .await;
    observer.finish(2);
    let partitions: Vec<(String, i32)> = done
        .status
        .unwrap()
        .partitions
        .iter()
        .map(|p| (p.name.clone(), p.counts.available_packages))
        .collect();
    assert_eq!(
        partitions,
        [
            ("early".into(), 3),
            ("normal".into(), 4),
            ("late".into(), 3),
            ("unknown".into(), 2)
        ]
    );

    // The event stream tells the v2 rollout in order: started, each group started and finished in turn,
    // every Package updated and available, finished.
    let events = rollout_events(&name).await;
    let v2_generation = done.metadata.generation.unwrap();
    let story: Vec<(String, Option<String>)> = events
        .iter()
        .filter(|e| e["generation"] == v2_generation)
        .filter(|e| {
            matches!(
                e["kind"].as_str(),
                Some("rolloutStarted" | "groupStarted" | "groupFinished" | "rolloutFinished")
            )
        })
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_owned(),
                e["group"].as_str().map(str::to_owned),
            )
        })
        .collect();
    let g = |kind: &str, group: Option<&str>| (kind.to_owned(), group.map(str::to_owned));
    assert_eq!(
        story,
        [
            g("rolloutStarted", None),
            g("groupStarted", Some("early")),
            g("groupStarted", Some("normal")),
            g("groupFinished", Some("early")),
            g("groupStarted", Some("late")),
            g("groupFinished", Some("normal")),
            g("groupStarted", None),
            g("groupFinished", Some("late")),
            g("groupFinished", None),
            g("rolloutFinished", None),
        ]
    );
    let count = |kind: &str| {
        events
            .iter()
            .filter(|e| e["generation"] == v2_generation && e["kind"] == kind)
            .count()
    };
    assert_eq!(
        (count("packageUpdated"), count("packageAvailable")),
        (12, 12)
    );
    assert!(events
        .iter()
        .all(|e| e["source"] == "management" && e["hostedClusterPackage"] == name.as_str()));

    // A template whose image does not exist: the first Package updated never becomes available, and the
    // rollout stops there, saying who holds the budget.
    let broken = format!("{}/missing/handlebars:nope", env().registry().host());
    let patch = json!({"spec": {"strategy": {"rollingUpgrade": {"maxUnavailable": 1}},
                                "template": {"spec": {"image": broken, "config": {"greeting": "hi"}}}}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let h = wait_status(&api, &name, log, "blocked on the failing Package", |h| {
        condition(h, "Available").is_some_and(|c| {
            c.message
                .contains("Rollout waits: maxUnavailable 1 is used by")
        })
    })
    .await;
    let message = condition(&h, "Available").unwrap().message.clone();
    let holder = message
        .rsplit("used by ")
        .next()
        .unwrap()
        .trim_end_matches('.')
        .to_owned();
    assert_eq!(
        group_of[&holder], 0,
        "the failing Package is in the first group: {message}"
    );
    let on_broken: BTreeSet<String> = clusters
        .iter()
        .filter(|_| true)
        .map(|c| c.hcp_namespace.clone())
        .collect();
    let mut updated = Vec::new();
    for ns in &on_broken {
        let p = Api::<Package>::namespaced(client.clone(), ns)
            .get(&name)
            .await
            .unwrap();
        if p.spec.image == broken {
            updated.push(ns.clone());
        }
    }
    assert_eq!(updated, [holder], "nothing moves past the failing Package");
}

/// The CRD's validation rules, not the manager, refuse a malformed HostedClusterPackage: the apiserver
/// answers 422 naming the field and the rule's message; a well-formed one with every checked field set
/// is taken (issue 62, item 4).
#[tokio::test]
async fn malformed_specs_are_refused_by_the_apiserver_naming_the_field() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    manager();
    let client = env().management().client().await.unwrap();
    let gvk = GroupVersionKind::gvk("package-operator.run", "v1alpha1", "HostedClusterPackage");
    let api: Api<DynamicObject> = Api::all_with(
        client,
        &ApiResource::from_gvk_with_plural(&gvk, "hostedclusterpackages"),
    );
    let object = |name: &str, spec: serde_json::Value| -> DynamicObject {
        let mut full = json!({
            "hostedClusterSelector": {"matchLabels": {"fleet": "none"}},
            "template": {"spec": {"image": "registry.invalid/pkg:v1"}},
        });
        for (key, value) in spec.as_object().unwrap() {
            full[key] = value.clone();
        }
        serde_json::from_value(json!({
            "apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
            "metadata": {"name": name}, "spec": full,
        }))
        .unwrap()
    };
    let window = |name: &str, duration: &str| json!({"name": name, "schedule": "0 2 * * Sat", "duration": duration});
    let refused = [
        (
            json!({"strategy": {"instant": {}, "rollingUpgrade": {"maxUnavailable": 1}}}),
            "spec.strategy",
            "set at most one of instant and rollingUpgrade",
        ),
        (
            json!({"strategy": {"rollingUpgrade": {"maxUnavailable": 0}}}),
            "spec.strategy.rollingUpgrade.maxUnavailable",
            "must be a number of at least 1",
        ),
        (
            json!({"strategy": {"rollingUpgrade": {"maxUnavailable": "0%"}}}),
            "spec.strategy.rollingUpgrade.maxUnavailable",
            "a percentage from 1% to 100%",
        ),
        (
            json!({"partition": {"labelKey": "tier", "order": {"static": ["a"], "alphanumericAsc": {}}}}),
            "spec.partition.order",
            "set exactly one of static and alphanumericAsc",
        ),
        (
            json!({"partition": {"labelKey": "tier", "order": {"static": ["a", "a"]}}}),
            "spec.partition.order.static[1]",
            "Duplicate value",
        ),
        (
            json!({"rolloutPolicy": {"maintenanceWindows": [window("night", "4h"), window("night", "2h")]}}),
            "spec.rolloutPolicy.maintenanceWindows[1]",
            "Duplicate value",
        ),
        (
            json!({"rolloutPolicy": {"maintenanceWindows": [window("night", "four hours")]}}),
            "spec.rolloutPolicy.maintenanceWindows[0].duration",
            "should match",
        ),
        (
            json!({"rolloutPolicy": {"groups": [{"name": "prod", "progressDeadline": "10 minutes"}]}}),
            "spec.rolloutPolicy.groups[0].progressDeadline",
            "should match",
        ),
        (
            json!({"rolloutPolicy": {"skip": [{"until": "2030-01-01T00:00:00Z", "reason": "freeze"}]}}),
            "spec.rolloutPolicy.skip[0]",
            "set namespaces, selector or both",
        ),
        (
            json!({"rolloutPolicy": {"skip": [{"namespaces": ["clusters-a"], "until": "next week", "reason": "freeze"}]}}),
            "spec.rolloutPolicy.skip[0].until",
            "date-time",
        ),
    ];
    for (i, (spec, field, words)) in refused.into_iter().enumerate() {
        let name = format!("malformed-{i}");
        match api
            .create(&PostParams::default(), &object(&name, spec.clone()))
            .await
        {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{spec}: {status:?}");
                assert!(
                    status.message.contains(&format!("{field}: "))
                        && status.message.contains(words),
                    "{spec}: expected {field} and {words:?} in {}",
                    status.message
                );
            }
            other => panic!("{spec} was not refused: {other:?}"),
        }
    }
    let accepted = object(
        "well-formed-rules",
        json!({
            "strategy": {"rollingUpgrade": {"maxUnavailable": "10%"}},
            "partition": {"labelKey": "tier", "order": {"static": ["canary", "prod"]}},
            "rolloutPolicy": {
                "groups": [{"name": "prod", "minSuccessTime": "1h30m", "progressDeadline": "0"}],
                "maintenanceWindows": [window("night", "4h"), window("weekend", "48h")],
                "skip": [{"selector": {"matchLabels": {"freeze": "true"}}, "until": "2030-01-01T00:00:00Z", "reason": "freeze"}],
            },
        }),
    );
    api.create(&PostParams::default(), &accepted).await.unwrap();
    api.delete("well-formed-rules", &DeleteParams::default())
        .await
        .unwrap();
}

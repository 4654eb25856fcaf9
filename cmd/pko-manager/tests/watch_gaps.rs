//! Deletions the manager's watches never hear of (issue 17, item 1): the manager is frozen while the
//! management apiserver restarts, and a HostedCluster is deleted meanwhile. The restarted apiserver's watch
//! cache starts afresh, so the manager's watches resume with 410 Gone and re-list; the deleted cluster is
//! simply missing from the list. It must leave the fleet, its connector must go, and the next rollout must
//! run within its budget over the clusters that remain. This binary restarts the apiserver, so it has its
//! own environment and manager.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::hypershift::HostedCluster;
use serde_json::json;

use common::rollout::*;
use common::*;

#[tokio::test]
async fn a_hosted_cluster_deleted_while_the_watch_was_down_leaves_the_fleet() {
    let env = env();
    let binary = Path::new(env!("CARGO_BIN_EXE_pko-manager"));
    let manager = env.start_manager(binary, &[]).await.unwrap();
    let (ns, clusters) = fleet("watch-gap", &[None, None, None]).await;
    let client = env.management().client().await.unwrap();
    let v1 = build_and_push("handlebars", "watch-gap:v1");
    let v2 = build_and_push("handlebars", "watch-gap:v2");
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let name = format!("{ns}-addon");
    let strategy = json!({"rollingUpgrade": {"maxUnavailable": 1}});
    api.create(
        &PostParams::default(),
        &hcpkg(&name, &ns, &v1, strategy, None),
    )
    .await
    .unwrap();
    wait_status(
        &api,
        &name,
        || manager.log_tail(),
        "3/3 available on v1",
        |h| all_available(h, 3),
    )
    .await;
    let gone = &clusters[1];
    let connector = Api::<Deployment>::namespaced(client.clone(), &gone.hcp_namespace);
    let credentials = Api::<Secret>::namespaced(client.clone(), &gone.hcp_namespace);
    pko_testenv::wait_until(
        "the connector of the cluster to delete",
        TIMEOUT,
        || async {
            connector
                .get("pko-connector")
                .await
                .map_err(|e| e.to_string())?;
            credentials
                .get("pko-connector-nats")
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await
    .unwrap();
    let relist_deletions = || async {
        manager
            .metric("pko_watch_gap_deletions_total{kind=\"HostedCluster\"}")
            .await
            .unwrap_or(0)
    };
    assert_eq!(relist_deletions().await, 0);

    // The watch gap: no delete event can reach the manager, frozen while the apiserver it watches is
    // replaced (its sockets to the old one are dead; it has none to the new one yet).
    manager.pause().unwrap();
    env.management().restart().await.unwrap();
    let admin = env.management().client().await.unwrap();
    let hosted_clusters = Api::<HostedCluster>::namespaced(admin.clone(), &gone.namespace);
    hosted_clusters
        .delete(&gone.name, &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&hosted_clusters, &gone.name).await;
    manager.resume().unwrap();

    // Found by the re-list alone: the connector goes, the cluster's Package goes, the fleet has two.
    let connector = Api::<Deployment>::namespaced(admin.clone(), &gone.hcp_namespace);
    let credentials = Api::<Secret>::namespaced(admin.clone(), &gone.hcp_namespace);
    wait_gone(&connector, "pko-connector").await;
    wait_gone(&credentials, "pko-connector-nats").await;
    wait_package_gone(&admin, &gone.hcp_namespace, &name).await;
    let api: Api<HostedClusterPackage> = Api::all(admin.clone());
    wait_status(
        &api,
        &name,
        || manager.log_tail(),
        "2/2 available on v1",
        |h| all_available(h, 2),
    )
    .await;
    assert!(
        relist_deletions().await >= 1,
        "the deletion must have been found by the re-list, not by a delete event"
    );

    // The next release rolls over the remaining two within maxUnavailable 1.
    let remaining: BTreeMap<String, usize> = [&clusters[0], &clusters[2]]
        .iter()
        .map(|c| (c.hcp_namespace.clone(), 0))
        .collect();
    let v2_spec = json!({"image": v2, "config": {"greeting": "hi"}});
    let observer = RolloutObserver::start(&admin, &name, &v2_spec, remaining).await;
    let patch = json!({"spec": {"template": {"spec": v2_spec}}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_status(
        &api,
        &name,
        || manager.log_tail(),
        "2/2 available on v2",
        |h| all_available(h, 2),
    )
    .await;
    observer.finish(1);
}

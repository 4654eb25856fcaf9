//! A HostedClusterPackage rollout with the manager killed (SIGKILL) mid-rollout: the in-flight Packages
//! are in `status.processing` at the moment of the crash, and a new manager finishes the rollout without
//! exceeding maxUnavailable, crossing the partition barrier, or writing any Package twice. This binary
//! has its own manager, so killing it disturbs no other test. Once settled, a manager started again over
//! the fleet re-observes it without a single write.
#![allow(clippy::unwrap_used)]

mod common;

use pko_proto::well_known::HOSTED_CLUSTER_PACKAGE_LABEL;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::object_set::ObjectSet;
use pko_proto::core::package::Package;

use common::rollout::*;
use common::*;
use serde_json::json;

fn available(p: &Package) -> bool {
    p.status.iter().flat_map(|s| &s.conditions).any(|c| {
        c.type_ == "Available"
            && c.status == "True"
            && c.observed_generation == p.metadata.generation
    })
}

#[tokio::test]
async fn manager_killed_mid_rollout_resumes_within_the_budget() {
    let env = env();
    let binary = Path::new(env!("CARGO_BIN_EXE_pko-manager"));
    let first = env.start_manager(binary, &[]).await.unwrap();
    let risks = [
        Some("early"),
        Some("early"),
        Some("early"),
        Some("early"),
        None,
        None,
        None,
        None,
    ];
    let (ns, clusters) = fleet("hcpkg-restart", &risks).await;
    let group_of: BTreeMap<String, usize> = clusters
        .iter()
        .zip(risks)
        .map(|(c, r)| (c.hcp_namespace.clone(), usize::from(r.is_none())))
        .collect();
    let client = env.management().client().await.unwrap();
    let v1 = build_and_push("handlebars", "hcpkg-restart:v1");
    let v2 = build_and_push("handlebars", "hcpkg-restart:v2");
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let name = format!("{ns}-restart");
    let partition = json!({"labelKey": "risk", "order": {"static": ["early"]}});
    let strategy = json!({"rollingUpgrade": {"maxUnavailable": 2}});
    api.create(
        &PostParams::default(),
        &hcpkg(&name, &ns, &v1, strategy, Some(partition)),
    )
    .await
    .unwrap();
    wait_status(
        &api,
        &name,
        || first.log_tail(),
        "8/8 available on v1",
        |h| all_available(h, 8),
    )
    .await;
    let packages: Api<Package> = Api::all(client.clone());
    let owned = ListParams::default().labels(&format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={name}"));
    let generations_on_v1: BTreeMap<String, i64> = packages
        .list(&owned)
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| {
            (
                p.metadata.namespace.clone().unwrap(),
                p.metadata.generation.unwrap(),
            )
        })
        .collect();

    // Roll out v2 and kill the manager as soon as the first Package takes it.
    let v2_spec = json!({"image": v2, "config": {"greeting": "hi"}});
    let observer = RolloutObserver::start(&client, &name, &v2_spec, group_of.clone()).await;
    let patch =
        json!({"spec": {"template": {"spec": {"image": v2, "config": {"greeting": "hi"}}}}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    pko_testenv::wait_until("the first Package on v2", TIMEOUT, || async {
        let updated = observer.observed.lock().unwrap().update_order.len();
        if updated > 0 {
            Ok(())
        } else {
            Err("none yet".to_owned())
        }
    })
    .await
    .unwrap();
    first.kill();

    // At the crash, every Package updated but not yet available is recorded as in flight.
    let on_v2: Vec<Package> = packages
        .list(&owned)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.spec.image == v2)
        .collect();
    assert!(
        on_v2.len() < clusters.len(),
        "the rollout was over before the kill; it must be killed mid-rollout"
    );
    let in_flight: BTreeSet<String> = on_v2
        .iter()
        .filter(|p| !available(p))
        .map(|p| p.metadata.namespace.clone().unwrap())
        .collect();
    let processing: BTreeSet<String> = api
        .get(&name)
        .await
        .unwrap()
        .status
        .unwrap()
        .processing
        .into_iter()
        .map(|r| r.namespace)
        .collect();
    assert!(
        in_flight.is_subset(&processing),
        "updated but unavailable {in_flight:?}, status.processing {processing:?}"
    );

    // A new manager finishes the rollout.
    let second = env.start_manager(binary, &[]).await.unwrap();
    wait_status(
        &api,
        &name,
        || second.log_tail(),
        "8/8 available on v2",
        |h| all_available(h, 8) && condition(h, "Progressing").is_some_and(|c| c.status == "False"),
    )
    .await;
    observer.finish(2);
    // Each Package was written exactly once for v2: one generation more than on v1, nothing repeated.
    for p in packages.list(&owned).await.unwrap().items {
        let ns = p.metadata.namespace.clone().unwrap();
        assert_eq!(
            p.metadata.generation.unwrap(),
            generations_on_v1[&ns] + 1,
            "{ns}"
        );
        assert_eq!(p.spec.image, v2);
    }

    // Once every revision settled, a manager started again over the fleet re-observes it all without a
    // write: no connector object, Package deployment, phase object, status or Event. Before, a restart
    // re-applied everything (9 writes per HostedCluster in the benchmark).
    let hcp_namespaces: Vec<String> = clusters.iter().map(|c| c.hcp_namespace.clone()).collect();
    wait_revisions_settled(&client, &hcp_namespaces).await;
    second.terminate(GRACE).await.unwrap();
    let third = env.start_manager(binary, &[]).await.unwrap();
    let sets = object_sets_in(&client, &hcp_namespaces).await;
    let wanted = [
        ("hosted_cluster", clusters.len()),
        ("package", clusters.len()),
        ("object_deployment", clusters.len()),
        ("object_set", sets),
    ];
    pko_testenv::wait_until("every object reconciled again", TIMEOUT, || async {
        let metrics = third.get("/metrics").await?.1;
        let short: Vec<String> = wanted
            .iter()
            .filter(|(controller, count)| reconciles(&metrics, controller) < *count as u64)
            .map(|(controller, count)| format!("{controller} short of {count}"))
            .collect();
        let active = metric_sum(&metrics, "pko_reconcile_active{");
        if short.is_empty() && active == 0 {
            Ok(())
        } else {
            Err(format!("{short:?}, {active} active"))
        }
    })
    .await
    .unwrap();
    let metrics = third.get("/metrics").await.unwrap().1;
    let writes = manager_writes(&metrics);
    assert!(writes.is_empty(), "the restarted manager wrote: {writes:?}");
    assert_eq!(
        metric_sum(&metrics, "pko_reconcile_total{")
            - reconciles_with(&metrics, "result=\"success\""),
        0,
        "reconciles that did not succeed:\n{metrics}"
    );
}

/// How long a stopped manager gets to wind down (a kubelet's default grace).
const GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits until each ObjectSet in `namespaces` is Available or Archived for its generation: nothing is
/// left for a manager to finish.
async fn wait_revisions_settled(client: &kube::Client, namespaces: &[String]) {
    pko_testenv::wait_until("every revision settled", TIMEOUT, || async {
        for ns in namespaces {
            let sets: Api<ObjectSet> = Api::namespaced(client.clone(), ns);
            for set in sets
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
            {
                let settled = set.status.iter().flat_map(|s| &s.conditions).any(|c| {
                    (c.type_ == "Available" || c.type_ == "Archived")
                        && c.status == "True"
                        && c.observed_generation == set.metadata.generation
                });
                if !settled {
                    return Err(format!("{ns}/{:?} not settled", set.metadata.name));
                }
            }
        }
        Ok(())
    })
    .await
    .unwrap();
}

/// How many ObjectSets the fleet's HCP namespaces hold.
async fn object_sets_in(client: &kube::Client, namespaces: &[String]) -> usize {
    let mut count = 0;
    for ns in namespaces {
        let sets: Api<ObjectSet> = Api::namespaced(client.clone(), ns);
        count += sets.list(&ListParams::default()).await.unwrap().items.len();
    }
    count
}

/// The value of a sample line (exemplars after it left out).
fn sample_value(line: &str) -> Option<u64> {
    line.split_once("} ")?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The sum of the samples of a metric family in a /metrics text, `family` being its name and `{`.
fn metric_sum(metrics: &str, family: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(family))
        .filter_map(sample_value)
        .sum()
}

/// Reconciles a controller finished, whatever their result.
fn reconciles(metrics: &str, controller: &str) -> u64 {
    reconciles_with(metrics, &format!("controller=\"{controller}\""))
}

/// Reconciles whose labels hold `label`.
fn reconciles_with(metrics: &str, label: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("pko_reconcile_total{") && l.contains(label))
        .filter_map(sample_value)
        .sum()
}

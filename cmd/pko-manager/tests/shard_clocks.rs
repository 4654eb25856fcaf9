//! Sharded replicas whose clocks are apart, the mirror of `sharding.rs`'s skew (issue 63, item 8): the
//! coordinator's clock runs 30 s behind, one member's is true and one member's runs 30 s ahead, while a
//! HostedClusterPackage rolls out over 15 HostedClusters. For several Lease durations every member stays
//! live: nobody is declared departed, no take-over starts, the work stays spread, and no object is
//! written by two replicas. Leases are timed from when each replica saw them renewed, never by a clock
//! another process wrote. This binary runs its own managers (one shard group).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kube::api::{ListParams, PostParams};
use kube::Api;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::object_set::ObjectSet;
use pko_proto::well_known::SHARD_OWNER_LABEL;
use pko_testenv::wait_until;

use common::rollout::{all_available, fleet, hcpkg, wait_status};
use common::shard_group::{namespaces_with_a_set, recorded_takeovers, shard_group, start_replicas};
use common::*;

const LEASE_SECONDS: u64 = 6;

#[tokio::test]
async fn a_coordinator_behind_and_a_member_ahead_keep_every_member() {
    let env = env();
    let client = env.management().client().await.unwrap();
    let (leases, args) = shard_group("shard-clocks", LEASE_SECONDS).await;
    let replicas = start_replicas(&leases, &args, &[Some("-30s"), None, Some("+30s")]).await;
    let namespaces = namespaces_with_a_set("clocks", "shared", 9).await;
    for ns in &namespaces {
        wait_condition(&client, ns, "shared", "Available", "True", None).await;
    }
    let owners = || async {
        let mut owners = BTreeSet::new();
        for ns in &namespaces {
            let sets = Api::<ObjectSet>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            for set in sets.items {
                if let Some(owner) = set
                    .metadata
                    .labels
                    .and_then(|l| l.get(SHARD_OWNER_LABEL).cloned())
                {
                    owners.insert(owner);
                }
            }
        }
        Ok::<_, String>(owners)
    };
    wait_until("the work spread over the replicas", TIMEOUT, || async {
        let owners = owners().await?;
        if owners.len() >= 2 {
            Ok(())
        } else {
            Err(format!("{owners:?}"))
        }
    })
    .await
    .unwrap();
    // A rollout over 15 HostedClusters, one at a time, while the clocks stay apart.
    let (fleet_ns, _clusters) = fleet("clocks-fleet", &[None; 15]).await;
    let image = build_and_push("handlebars", "clocks:1");
    let name = format!("{fleet_ns}-addon");
    let rollout = hcpkg(
        &name,
        &fleet_ns,
        &image,
        serde_json::json!({"rollingUpgrade": {"maxUnavailable": 1}}),
        None,
    );
    let hcpkgs: Api<HostedClusterPackage> = Api::all(client.clone());
    hcpkgs
        .create(&PostParams::default(), &rollout)
        .await
        .unwrap();
    // Several Lease durations: at every look, no take-over timed or recorded and the work still spread.
    let watched = Duration::from_secs(5 * LEASE_SECONDS);
    let started = Instant::now();
    while started.elapsed() < watched {
        let takeovers = replicas[0]
            .metric("pko_shard_takeover_seconds_count")
            .await
            .unwrap();
        let recorded = recorded_takeovers(&leases).await;
        assert!(
            takeovers == 0 && recorded.is_empty(),
            "after {:?}: {takeovers} take-overs timed, recorded on {recorded:?}\ncoordinator log:\n{}",
            started.elapsed(),
            replicas[0].log_tail()
        );
        let spread = owners().await.unwrap();
        assert!(
            spread.len() >= 2,
            "the work moved onto one replica: {spread:?}"
        );
        for replica in &replicas {
            assert!(replica.pid().is_some() && replica.get("/healthz").await.is_ok());
        }
    }
    wait_status(
        &hcpkgs,
        &name,
        || replicas[0].log_tail(),
        "rolled out",
        |h| all_available(h, 15),
    )
    .await;
    let audit = pko_testenv::shard_write_audit(&env.management().audit_log_path()).unwrap();
    assert!(
        audit.writes > 30,
        "the audit log holds only {} manager writes",
        audit.writes
    );
    assert!(
        audit.overlaps.is_empty(),
        "written by two replicas at once: {:#?}",
        audit.overlaps
    );
}

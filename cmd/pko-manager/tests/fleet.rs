//! A fleet of management clusters (issue 21): `canary`, `prod-a` and `prod-b`, each its own apiserver (one
//! etcd, a prefix each), its own NATS (a leaf node of the hub, JetStream domain = its name, from
//! deploy/nats/fleet) and its own pko-manager, under one hub NATS.
//!
//! A release that fails in the canary keeps both prod clusters' promotion gates closed, and once the
//! canary halts on it the release is poisoned: both prod clusters halt on it too (issue 39, item 3). The
//! fixed release reaches prod only after the canary finished it and soaked (timestamps of the events in
//! each cluster's own stream), although the canary's clock runs two minutes behind: ages and soaks are
//! the reader's (issue 39, item 1). The hub is killed as soon as prod-a's gate opens: prod-a's rollout goes on, its events
//! wait in its own stream, and once the hub is back the hub's aggregate stream holds every event of every
//! cluster exactly once, in each cluster's order. `kubectl package fleet status` shows the three clusters.
//! Each cluster speaks at the hub only for itself (issue 39, item 2; issue 63, item 1): a compromised
//! prod-a cannot write the canary's record, purge or roll up the records, fill the hub's store for the
//! others or reach the canary's NATS with users of its own account; an event it writes in the canary's
//! name is filed at the hub under prod-a (issue 63, item 10).
//! This binary kills the hub, so it has its own environment.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use async_nats::jetstream::{self, kv};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::package::Package;
use pko_proto::fleet::{
    cluster_key, member_bucket, rollout_key, FleetRolloutRecord, AGGREGATE_STREAM,
    MEMBER_RECORDS_MAX_BYTES, STATE_BUCKET,
};
use pko_proto::nats_permissions::member_inbox_prefix;
use pko_proto::rollout_events::{RolloutEvent, RolloutEventKind, STREAM};
use pko_testenv::{
    add_hosted_cluster_to, fleet_manager_args, install_hosted_cluster_crd, wait_until, ApiServer,
    ManagerLaunch, ManagerProcess, Nats, StoredEvent,
};
use serde_json::json;

use common::rollout::*;
use common::*;

const SOAK_SECONDS: i64 = 5;
const CLUSTERS: [&str; 3] = ["canary", "prod-a", "prod-b"];
const HOSTED_CLUSTERS: usize = 3;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// One management cluster of the fleet.
struct ManagementCluster {
    name: &'static str,
    server: &'static ApiServer,
    manager: ManagerProcess,
    api: Api<HostedClusterPackage>,
    hosted_clusters_namespace: String,
}

impl ManagementCluster {
    fn log(&self) -> impl Fn() -> String + '_ {
        || self.manager.log_tail()
    }
}

async fn start_cluster(
    name: &'static str,
    server: &'static ApiServer,
    leaf: &Nats,
    labels: &str,
    clock_offset: Option<&'static str>,
) -> ManagementCluster {
    install_hosted_cluster_crd(server).await.unwrap();
    let ns = server.create_namespace("fleet").await.unwrap();
    for i in 0..HOSTED_CLUSTERS {
        let labels = BTreeMap::from([("fleet".to_owned(), ns.clone())]);
        add_hosted_cluster_to(server, &ns, &format!("hc-{i}"), labels, true)
            .await
            .unwrap();
    }
    let launch = ManagerLaunch {
        apiserver: Some(server),
        nats: Some(leaf),
        clock_offset,
        ..Default::default()
    };
    let args = fleet_manager_args(name, labels);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let manager = env()
        .start_manager_with(Path::new(env!("CARGO_BIN_EXE_pko-manager")), &launch, &args)
        .await
        .unwrap();
    ManagementCluster {
        name,
        server,
        manager,
        api: Api::all(server.client().await.unwrap()),
        hosted_clusters_namespace: ns,
    }
}

/// The HostedClusterPackage `name` of `cluster`, gated on the canary unless it is the canary, which halts
/// at its first failed Package.
fn release(cluster: &ManagementCluster, name: &str, image: &str) -> HostedClusterPackage {
    let mut h = hcpkg(
        name,
        &cluster.hosted_clusters_namespace,
        image,
        json!({"rollingUpgrade": {"maxUnavailable": 1}}),
        None,
    );
    if cluster.name == "canary" {
        h.spec.rollout_policy =
            Some(serde_json::from_value(json!({"defaults": {"maxFailures": 0}})).unwrap());
    } else {
        h.spec.promotion = Some(
            serde_json::from_value(json!({
                "managementClusters": ["canary"],
                "soakSeconds": SOAK_SECONDS,
            }))
            .unwrap(),
        );
    }
    h
}

async fn hub_record(hub: &Nats, name: &str, cluster: &str) -> Option<FleetRolloutRecord> {
    let js = jetstream::new(hub.client().await.ok()?);
    let store = js.get_key_value(STATE_BUCKET).await.ok()?;
    let value = store.get(rollout_key(name, cluster)).await.ok()??;
    serde_json::from_slice(&value).ok()
}

/// A client of `cluster`'s own NATS as its manager is, and the hub's shared records bucket and the
/// cluster's own one as it sees them through the hub's domain.
async fn member_view(
    fleet: &pko_testenv::FleetNats,
    cluster: &str,
) -> (async_nats::Client, jetstream::Context, kv::Store, kv::Store) {
    let own = fleet.leaf(cluster).unwrap();
    // Replies cross the cluster's link only under its own inbox prefix, as its manager's do.
    let nats = own
        .connect(
            &own.credentials(&format!("{cluster}-user"), None).unwrap(),
            async_nats::ConnectOptions::new().custom_inbox_prefix(member_inbox_prefix(cluster)),
        )
        .await
        .unwrap();
    let hub = jetstream::with_domain(nats.clone(), "hub");
    let shared = hub.get_key_value(STATE_BUCKET).await.unwrap();
    let own_bucket = hub.get_key_value(member_bucket(cluster)).await.unwrap();
    (nats, hub, shared, own_bucket)
}

/// What a compromised management cluster `attacker` tries at the hub, each refused by nats-server: a
/// settled record in the canary's name (`canary_record` is the canary's real one), a purge of the
/// records, a roll-up that would purge them, filling the hub's store, and users minted by its own
/// account on the canary's NATS. It also stores, in its own stream, the canary's `rolloutFinished`
/// (`source: canary`), which the hub sources as the attacker's: returns that event's message id.
async fn forge_from(
    fleet: &pko_testenv::FleetNats,
    attacker: &str,
    bystander: &str,
    name: &str,
    canary_record: &FleetRolloutRecord,
) -> String {
    let (nats, hub, shared, own) = member_view(fleet, attacker).await;
    let forged_event = RolloutEvent {
        version: pko_proto::rollout_events::EVENT_VERSION,
        kind: RolloutEventKind::RolloutFinished,
        hosted_cluster_package: name.to_owned(),
        uid: format!("forged-by-{attacker}"),
        generation: canary_record.generation,
        group: None,
        namespace: None,
        message: String::new(),
        source: "canary".to_owned(),
        trace_id: None,
        traceparent: None,
    };
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", forged_event.message_id().as_str());
    jetstream::new(nats.clone())
        .publish_with_headers(
            forged_event.subject(),
            headers,
            serde_json::to_vec(&forged_event).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .expect("its own stream takes what the attacker publishes");
    // The path works: the cluster's own announcement is taken (the same bytes as the hub holds).
    let announced = shared.get(cluster_key(attacker)).await.unwrap().unwrap();
    own.put(cluster_key(attacker), announced.clone())
        .await
        .unwrap();
    let mut forged = canary_record.clone();
    forged.settled = true;
    forged.failed = 0;
    forged.poisoned.clear();
    forged.settled_since = Some(forged.updated_at);
    let forged = serde_json::to_vec(&forged).unwrap();
    for bucket in [&own, &shared] {
        let refused = bucket
            .put(rollout_key(name, "canary"), forged.clone().into())
            .await;
        assert!(
            refused.is_err(),
            "the hub took a forged canary record: {refused:?}"
        );
    }
    // The shared bucket takes no write of the attacker at all, not even of its own key.
    let refused = shared.put(cluster_key(attacker), announced.clone()).await;
    assert!(
        refused.is_err(),
        "the shared bucket took a put: {refused:?}"
    );
    let purge = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        nats.request("$JS.hub.API.STREAM.PURGE.KV_PKO_FLEET", Vec::new().into()),
    )
    .await;
    assert!(
        !matches!(purge, Ok(Ok(_))),
        "the hub answered a purge of the records: {purge:?}"
    );
    // A roll-up on a key it may write would purge every other key of the bucket.
    for bucket in [member_bucket(attacker), STATE_BUCKET.to_owned()] {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Rollup", "all");
        let subject = format!("$JS.hub.API.$KV.{bucket}.{}", cluster_key(attacker));
        let stored = match hub
            .publish_with_headers(subject, headers, announced.clone())
            .await
        {
            Ok(ack) => ack.await.map(drop).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        assert!(stored.is_err(), "{bucket} took a roll-up of {attacker}");
    }
    let kept = hub_record(fleet.hub(), name, "canary").await.unwrap();
    assert!(!kept.settled, "{kept:?}");
    assert_eq!(kept.poisoned, canary_record.poisoned);
    // Filling the store: the attacker's own bucket refuses it within its bound, while the other
    // clusters still write theirs.
    let flood = vec![b'x'; 60 * 1024];
    let most = (MEMBER_RECORDS_MAX_BYTES as usize).div_ceil(flood.len());
    let mut flooded = Vec::new();
    loop {
        let key = rollout_key(&format!("flood-{}", flooded.len()), attacker);
        if own.put(&key, flood.clone().into()).await.is_err() {
            break;
        }
        flooded.push(key);
        assert!(
            flooded.len() <= most,
            "{attacker} stored {} × 60 KiB at the hub",
            flooded.len()
        );
    }
    let (_, _, bystander_shared, bystander_own) = member_view(fleet, bystander).await;
    let announced = bystander_shared
        .get(cluster_key(bystander))
        .await
        .unwrap()
        .unwrap();
    bystander_own
        .put(cluster_key(bystander), announced)
        .await
        .expect("a bystander's put while the attacker's bucket is full");
    // What the attacker stored it may remove again (a delete marker replaces each value): its manager
    // writes its records again.
    for key in flooded {
        own.delete(&key).await.unwrap();
    }
    // A user the attacker's own account signs is a stranger to the canary's NATS.
    let stolen = fleet
        .leaf(attacker)
        .unwrap()
        .credentials("pko-connector-stolen", None)
        .unwrap();
    let canary_nats = fleet.leaf("canary").unwrap();
    let connected = async_nats::ConnectOptions::with_credentials(&stolen.creds_file())
        .unwrap()
        .connect(canary_nats.url())
        .await;
    assert!(
        connected.is_err(),
        "the canary's NATS took a user of {attacker}"
    );
    forged_event.message_id()
}

/// When `cluster`'s own stream stored the first event of `kind` of generation `generation`.
fn first(messages: &[StoredEvent], kind: RolloutEventKind, generation: i64) -> Option<i128> {
    messages
        .iter()
        .find(|m| m.event.kind == kind && m.event.generation == generation)
        .map(|m| m.time)
}

#[tokio::test]
async fn a_release_reaches_prod_only_after_the_canary_finished_and_soaked() {
    let env = env();
    let fleet = env
        .start_fleet_nats(
            "fleet-nats",
            &deploy_dir(),
            Path::new(env!("CARGO_BIN_EXE_pko-manager")),
            &CLUSTERS,
        )
        .await
        .unwrap();
    let servers = [
        env.management(),
        &env.hosted_clusters()[0],
        &env.hosted_clusters()[1],
    ];
    let mut clusters = Vec::new();
    for (name, server) in CLUSTERS.into_iter().zip(servers) {
        // The canary's wall clock runs two minutes behind (libfaketime): every time it writes into its
        // records is older than a record may be, were it read as a time.
        let (labels, clock) = if name == "canary" {
            ("env=canary", Some("-120s"))
        } else {
            ("env=prod", None)
        };
        let leaf = fleet.leaf(name).unwrap();
        clusters.push(start_cluster(name, server, leaf, labels, clock).await);
    }
    let (canary, prod_a) = (&clusters[0], &clusters[1]);
    let name = format!("{}-addon", canary.hosted_clusters_namespace);

    // A release whose image does not exist: the canary's Packages fail, prod stays closed.
    let broken = format!("{}/examples/fleet-missing:v0", env.registry().host());
    for cluster in &clusters {
        cluster
            .api
            .create(&PostParams::default(), &release(cluster, &name, &broken))
            .await
            .unwrap();
    }
    let poisoned = wait_until(
        "the canary halts and reports the release poisoned at the hub",
        TIMEOUT,
        || async {
            match hub_record(fleet.hub(), &name, "canary").await {
                Some(r) if r.failed > 0 && !r.settled && !r.poisoned.is_empty() => Ok(r),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        poisoned.poisoned,
        std::slice::from_ref(&poisoned.template_hash)
    );
    for cluster in &clusters[1..] {
        // Halted on the canary's poisoned release, although its gate never opened.
        let h = wait_status(
            &cluster.api,
            &name,
            cluster.log(),
            "halted on the poisoned release",
            |h| {
                h.status
                    .as_ref()
                    .and_then(|s| s.halted.as_ref())
                    .is_some_and(|halted| halted.reason == "PoisonedRelease")
            },
        )
        .await;
        let halted = h.status.unwrap().halted.unwrap();
        assert_eq!(halted.template_hash, poisoned.template_hash);
        assert!(halted.message.contains("canary"), "{}", halted.message);
    }
    for cluster in &clusters[1..] {
        let h = wait_status(
            &cluster.api,
            &name,
            cluster.log(),
            "gate closed on the canary",
            |h| {
                condition(h, "PromotionGateOpen").is_some_and(|c| {
                    c.status == "False"
                        && c.reason == "WaitingForClusters"
                        && c.message.contains("canary: not settled")
                })
            },
        )
        .await;
        assert!(h.status.unwrap().promotion.is_none());
        let packages = Api::<Package>::all(cluster.server.client().await.unwrap())
            .list(&ListParams::default().labels(&format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={name}")))
            .await
            .unwrap();
        assert!(
            packages.items.is_empty(),
            "{}: Packages behind a closed gate",
            cluster.name
        );
    }

    // prod-a is compromised: whoever holds it has every key of its own NATS. It forges the canary's record
    // as settled, through the hub's domain as its manager writes its own: the hub refuses it, while the
    // same path takes prod-a's own record. The canary's gate stays closed everywhere.
    let forged_event = forge_from(&fleet, "prod-a", "prod-b", &name, &poisoned).await;
    for cluster in &clusters[1..] {
        wait_status(
            &cluster.api,
            &name,
            cluster.log(),
            "the gate still closed on the canary after the forgery",
            |h| {
                condition(h, "PromotionGateOpen").is_some_and(|c| {
                    c.status == "False" && c.message.contains("canary: not settled")
                })
            },
        )
        .await;
    }

    // The fixed release, in every cluster at once: prod waits for the canary to finish and soak.
    let image = build_and_push("handlebars", "fleet-addon:v1");
    let fixed = json!({"spec": {"template": {"spec": {"image": image}}}});
    for cluster in &clusters {
        cluster
            .api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&fixed))
            .await
            .unwrap();
    }
    let generation = canary
        .api
        .get(&name)
        .await
        .unwrap()
        .metadata
        .generation
        .unwrap();
    wait_status(
        &canary.api,
        &name,
        canary.log(),
        "the canary rolled out",
        |h| all_available(h, HOSTED_CLUSTERS as i32),
    )
    .await;
    // The hub goes away the moment prod-a's gate opens, with its rollout just starting.
    wait_until("prod-a's gate open", TIMEOUT * 2, || async {
        let h = prod_a.api.get(&name).await.map_err(|e| e.to_string())?;
        match h.status.and_then(|s| s.promotion) {
            Some(opened) => Ok(opened),
            None => Err(format!("{:?}", condition_message(&prod_a.api, &name).await)),
        }
    })
    .await
    .unwrap();
    fleet.hub().kill();
    let at_cut = prod_a.api.get(&name).await.unwrap().status.unwrap().counts;
    assert!(
        at_cut.available_packages < HOSTED_CLUSTERS as i32
            || at_cut.updated_packages < HOSTED_CLUSTERS as i32,
        "prod-a had finished before the hub went away: {at_cut:?}"
    );
    wait_status(
        &prod_a.api,
        &name,
        prod_a.log(),
        "prod-a rolled out without the hub",
        |h| all_available(h, HOSTED_CLUSTERS as i32),
    )
    .await;
    fleet.hub().restart().await.unwrap();
    for cluster in &clusters[1..] {
        wait_status(&cluster.api, &name, cluster.log(), "rolled out", |h| {
            all_available(h, HOSTED_CLUSTERS as i32)
                && condition(h, "PromotionGateOpen").is_some_and(|c| c.status == "True")
        })
        .await;
    }

    // Timestamps from each cluster's own stream: prod opened and updated its first Package only after
    // the canary finished and soaked. (The canary's record is written right after its finishing event is
    // handed to the outbox, so the event may be stored a little after the soak started: 1 s of slack.)
    let mut own: BTreeMap<&str, Vec<StoredEvent>> = BTreeMap::new();
    for cluster in CLUSTERS {
        own.insert(
            cluster,
            fleet
                .leaf(cluster)
                .unwrap()
                .stored_events(STREAM)
                .await
                .unwrap(),
        );
    }
    let finished = first(
        &own["canary"],
        RolloutEventKind::RolloutFinished,
        generation,
    )
    .expect("the canary's rolloutFinished");
    let soak = i128::from(SOAK_SECONDS) * 1_000_000_000;
    for cluster in ["prod-a", "prod-b"] {
        let events = &own[cluster];
        assert!(
            events
                .iter()
                .any(|m| m.event.kind == RolloutEventKind::PromotionWaiting
                    && m.event.message.contains("canary")),
            "{cluster}: no promotionWaiting naming the canary"
        );
        let opened = first(events, RolloutEventKind::PromotionOpened, generation)
            .unwrap_or_else(|| panic!("{cluster}: no promotionOpened"));
        let updated = first(events, RolloutEventKind::PackageUpdated, generation)
            .unwrap_or_else(|| panic!("{cluster}: no packageUpdated"));
        assert!(
            opened >= finished + soak - 1_000_000_000,
            "{cluster} opened {:.1} s after the canary finished (soak {SOAK_SECONDS} s)",
            (opened - finished) as f64 / 1e9
        );
        assert!(
            updated >= opened,
            "{cluster} updated a Package before its gate opened"
        );
        assert!(
            events.iter().all(|m| m.event.generation == generation
                || m.event.kind != RolloutEventKind::PackageUpdated),
            "{cluster} updated a Package to the broken release"
        );
    }

    // The hub's aggregate catches up: each cluster's events once, in its order, sourced sequence by
    // sequence.
    let aggregate = wait_until(
        "the aggregate holds every cluster's events",
        TIMEOUT,
        || async {
            let aggregate = fleet.hub().stored_events(AGGREGATE_STREAM).await.unwrap();
            for cluster in CLUSTERS {
                let local: Vec<&str> = own[cluster].iter().map(|m| m.id.as_str()).collect();
                let now = fleet
                    .leaf(cluster)
                    .unwrap()
                    .stored_events(STREAM)
                    .await
                    .unwrap();
                let local_now: Vec<&str> = now.iter().map(|m| m.id.as_str()).collect();
                let sourced: Vec<&str> = aggregate
                    .iter()
                    .filter(|m| m.origin.as_deref() == Some(cluster))
                    .map(|m| m.id.as_str())
                    .collect();
                if sourced != local_now || !local_now.starts_with(&local) {
                    return Err(format!(
                        "{cluster}: {} at the hub, {} in its own stream",
                        sourced.len(),
                        local_now.len()
                    ));
                }
            }
            Ok(aggregate)
        },
    )
    .await
    .unwrap();
    for cluster in CLUSTERS {
        let sequences: Vec<u64> = aggregate
            .iter()
            .filter(|m| m.origin.as_deref() == Some(cluster))
            .map(|m| {
                m.source_sequence
                    .expect("a sourced message names its sequence")
            })
            .collect();
        let expected: Vec<u64> = (1..=sequences.len() as u64).collect();
        assert_eq!(
            sequences, expected,
            "{cluster}: gap or duplicate at the hub"
        );
    }
    // Attributed by the hub: every event under the cluster it came from, and the one prod-a wrote in the
    // canary's name is prod-a's.
    let misattributed: Vec<(&str, Option<&str>, &str)> = aggregate
        .iter()
        .filter(|m| m.origin.as_deref() != Some(m.event.source.as_str()))
        .map(|m| (m.id.as_str(), m.origin.as_deref(), m.event.source.as_str()))
        .collect();
    assert_eq!(
        misattributed,
        [(forged_event.as_str(), Some("prod-a"), "canary")],
        "only the forged event names another cluster than the one it came from"
    );

    // The fleet's status, as an SRE reads it at the hub.
    let out = Command::new(kubectl_package())
        .args([
            "fleet",
            "status",
            "hostedclusterpackage",
            &name,
            "--nats-url",
        ])
        .arg(fleet.hub().url())
        .arg("--nats-creds")
        .arg(fleet.credentials_file())
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hash = hub_record(fleet.hub(), &name, "canary")
        .await
        .unwrap()
        .template_hash;
    for cluster in CLUSTERS {
        let row = table
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(cluster))
            .unwrap_or_else(|| panic!("no row for {cluster}:\n{table}"));
        assert!(
            row.contains(&hash) && row.contains(&format!("{HOSTED_CLUSTERS}/{HOSTED_CLUSTERS}")),
            "{table}"
        );
        assert!(row.contains(" ago"), "{cluster} not settled:\n{table}");
    }
    // The gate's own view on the dashboards.
    let open = prod_a
        .manager
        .metric(&format!(
            "pko_fleet_promotion_gate_open{{hosted_cluster_package=\"{name}\"}}"
        ))
        .await
        .unwrap();
    assert_eq!(open, 1);
}

async fn condition_message(api: &Api<HostedClusterPackage>, name: &str) -> Option<String> {
    let h = api.get(name).await.ok()?;
    condition(&h, "PromotionGateOpen").map(|c| format!("{}: {}", c.reason, c.message))
}

//! Lossless, deduplicated rollout events (issue 17, item 3). NATS is down for a whole release: the
//! Packages roll on schedule anyway, and the manager dies with the release's events in its outbox, its
//! status already saying finished; its successor tells the finished rollout's story once NATS is back.
//! Then the manager is killed in the middle of the next release, and its successor tells that rollout's
//! story again: the stream stores each step once, by its message id. A manager restarted on the settled
//! rollout finds its end stored and publishes nothing again. At the end the stream holds every step of
//! the three releases exactly once, in order. This binary kills NATS and the manager, so it has its own
//! environment.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use kube::api::PostParams;
use kube::Api;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::rollout_events::{RolloutEvent, RolloutEventKind};
use pko_testenv::{wait_until, ManagerProcess};
use serde_json::json;

use common::rollout::*;
use common::*;

/// Every event of the HostedClusterPackage `name` in the stream, in stream order, with its message id.
async fn stored_events(name: &str) -> Vec<(String, RolloutEvent)> {
    stored_rollout_events(name)
        .await
        .into_iter()
        .map(|(id, event)| (id, serde_json::from_value(event).unwrap()))
        .collect()
}

async fn wait_finished_in_stream(name: &str, generation: i64) {
    wait_until(
        &format!("rolloutFinished of generation {generation} in the stream"),
        TIMEOUT,
        || async {
            let events = stored_events(name).await;
            if events.iter().any(|(_, e)| {
                e.generation == generation && e.kind == RolloutEventKind::RolloutFinished
            }) {
                Ok(())
            } else {
                let told: Vec<String> = events
                    .iter()
                    .filter(|(_, e)| e.generation == generation)
                    .map(|(_, e)| {
                        format!(
                            "{:?} {}",
                            e.kind,
                            e.namespace.as_deref().or(e.group.as_deref()).unwrap_or("")
                        )
                    })
                    .collect();
                Err(format!(
                    "{} events, of generation {generation}: {told:?}",
                    events.len()
                ))
            }
        },
    )
    .await
    .unwrap();
}

/// The story of one generation is whole and in order: started first, finished last, each group started
/// and then finished once, each Package updated and then available once. For an update (not the first
/// generation, whose Packages are all created at once and come up in any order) also: groups start and
/// finish in their order, and a Package is updated only after its group started.
fn assert_story(events: &[&RolloutEvent], namespaces: &BTreeSet<String>, groups: &[&str]) {
    use RolloutEventKind::*;
    let position = |kind: RolloutEventKind, group: Option<&str>, namespace: Option<&str>| {
        let found: Vec<usize> = events
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.kind == kind
                    && (group.is_none() || e.group.as_deref() == group)
                    && (namespace.is_none() || e.namespace.as_deref() == namespace)
            })
            .map(|(i, _)| i)
            .collect();
        let compact: Vec<_> = events
            .iter()
            .map(|e| (e.kind, &e.group, &e.namespace))
            .collect();
        assert_eq!(
            found.len(),
            1,
            "{kind:?} {group:?} {namespace:?} in {compact:#?}"
        );
        found[0]
    };
    let generation = events[0].generation;
    assert_eq!(events[0].kind, RolloutStarted, "generation {generation}");
    assert_eq!(
        events.last().unwrap().kind,
        RolloutFinished,
        "generation {generation}"
    );
    let mut previous: Option<(usize, usize)> = None;
    for group in groups {
        let started = position(GroupStarted, Some(group), None);
        let finished = position(GroupFinished, Some(group), None);
        assert!(started < finished, "{group}");
        if let Some((started_before, finished_before)) = previous.filter(|_| generation > 1) {
            assert!(
                started_before < started && finished_before < finished,
                "{group} out of order in generation {generation}"
            );
        }
        previous = Some((started, finished));
    }
    for ns in namespaces {
        let group = events
            .iter()
            .find(|e| e.namespace.as_deref() == Some(ns))
            .and_then(|e| e.group.clone())
            .unwrap();
        let updated = position(PackageUpdated, None, Some(ns));
        let available = position(PackageAvailable, None, Some(ns));
        assert!(
            generation == 1 || position(GroupStarted, Some(&group), None) < updated,
            "{ns} updated before its group started: {:#?}",
            events
                .iter()
                .map(|e| (e.kind, &e.group, &e.namespace))
                .collect::<Vec<_>>()
        );
        assert!(updated < available);
    }
}

/// How many rollout events `manager` let go with `result` (none yet: 0).
async fn published(manager: &ManagerProcess, result: &str) -> u64 {
    let series = format!("pko_rollout_events_published_total{{result=\"{result}\"}}");
    manager.metric(&series).await.unwrap_or(0)
}

#[tokio::test]
async fn events_survive_a_nats_outage_and_a_manager_restart_exactly_once() {
    let env = env();
    let binary = Path::new(env!("CARGO_BIN_EXE_pko-manager"));
    let first = env.start_manager(binary, &[]).await.unwrap();
    let risks = [Some("early"), Some("early"), Some("late"), Some("late")];
    let (ns, clusters) = fleet("events", &risks).await;
    let namespaces: BTreeSet<String> = clusters.iter().map(|c| c.hcp_namespace.clone()).collect();
    let client = env.management().client().await.unwrap();
    let images: Vec<String> = (1..=3)
        .map(|v| build_and_push("handlebars", &format!("events:v{v}")))
        .collect();
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let name = format!("{ns}-addon");
    let strategy = json!({"rollingUpgrade": {"maxUnavailable": 1}});
    api.create(
        &PostParams::default(),
        &hcpkg(&name, &ns, &images[0], strategy, Some(risk_partition())),
    )
    .await
    .unwrap();
    wait_status(
        &api,
        &name,
        || first.log_tail(),
        "4/4 on v1",
        |h| all_available(h, 4),
    )
    .await;
    wait_finished_in_stream(&name, 1).await;

    // NATS down for the whole of release 2: the Packages roll anyway, the events wait in the outbox.
    env.nats().kill();
    let started = std::time::Instant::now();
    roll_image(&api, &name, &images[1]).await;
    wait_status(
        &api,
        &name,
        || first.log_tail(),
        "4/4 on v2 without NATS",
        |h| all_available(h, 4),
    )
    .await;
    println!(
        "release 2 rolled out without NATS in {:?}",
        started.elapsed()
    );
    let held = first.metric("pko_rollout_events_pending").await.unwrap();
    assert!(held > 0, "the outbox holds release 2's events");
    // The manager dies with release 2's end in its outbox: its status says finished, the stream does not.
    // Its successor tells the story of the finished generation, because the stream lacks its end.
    first.kill();
    env.nats().restart().await.unwrap();
    let second = env.start_manager(binary, &[]).await.unwrap();
    wait_finished_in_stream(&name, 2).await;

    // Release 3: the manager is killed once the first Package took it; its successor finishes it (or,
    // when the rollout was quicker than the kill, finds its end stored and tells nothing again).
    roll_image(&api, &name, &images[2]).await;
    wait_status(
        &api,
        &name,
        || second.log_tail(),
        "a Package on v3",
        |h| {
            h.metadata.generation == Some(3)
                && h.status
                    .as_ref()
                    .is_some_and(|s| s.observed_generation == 3 && s.counts.updated_packages >= 1)
        },
    )
    .await;
    second.kill();
    let third = env.start_manager(binary, &[]).await.unwrap();
    wait_status(
        &api,
        &name,
        || third.log_tail(),
        "4/4 on v3",
        |h| all_available(h, 4),
    )
    .await;
    wait_finished_in_stream(&name, 3).await;
    let retold = published(&third, "duplicate").await + published(&third, "told_before").await;
    assert!(
        retold > 0,
        "the successor retold the story or found it told; the stream kept it once"
    );
    third.kill();

    // A manager started on the finished rollout finds its end stored: it publishes nothing of it again.
    let fourth = env.start_manager(binary, &[]).await.unwrap();
    wait_until(
        "the restarted manager found release 3's story told",
        TIMEOUT,
        || async {
            match published(&fourth, "told_before").await {
                0 => Err("nothing found told yet".to_owned()),
                n => Ok(n),
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        (
            published(&fourth, "stored").await,
            published(&fourth, "duplicate").await
        ),
        (0, 0),
        "a settled rollout's story was published again after a restart"
    );

    // Every step exactly once, each release's story whole and in order.
    let stored = stored_events(&name).await;
    let mut ids = BTreeMap::new();
    for (id, event) in &stored {
        assert!(!id.is_empty(), "{event:?} has no message id");
        assert_eq!(*id, event.message_id());
        assert!(ids.insert(id.clone(), event).is_none(), "{id} stored twice");
    }
    for generation in 1..=3 {
        let story: Vec<&RolloutEvent> = stored
            .iter()
            .map(|(_, e)| e)
            .filter(|e| e.generation == generation)
            .collect();
        assert_story(&story, &namespaces, &["early", "late"]);
    }
}

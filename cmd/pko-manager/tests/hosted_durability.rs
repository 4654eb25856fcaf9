//! Durability of hosted-cluster phases: NATS, the connector and the manager all killed mid-rollout. While
//! the connector is unreachable the phase says so; once everything is back the rollout converges without
//! any manual step, and objects already applied are not written again. A set deleted once its connector
//! is gone for good still goes, after the teardown timeout. This binary has its own environment and
//! manager, so killing them disturbs no other test.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use pko_proto::connector_wire::{decode, ApplyPhase};
use pko_proto::core::object_set::ObjectSet;
use pko_proto::core::object_set_phase::ObjectSetPhase;
use pko_testenv::wait_until;
use serde_json::{json, Value};

use common::*;

/// A short wait for an unreachable connector before a deleted hosted phase's teardown is given up.
const TEARDOWN_TIMEOUT: [&str; 2] = ["--hosted-teardown-timeout-seconds", "3"];

fn hosted_cm(name: &str, namespace: &str) -> Value {
    json!({"object": {"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace}, "data": {"ready": "yes"}}})
}

async fn resource_version(api: &Api<ConfigMap>, name: &str) -> String {
    api.get(name)
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
}

#[tokio::test]
async fn nats_connector_and_manager_killed_mid_rollout_converge_without_repeated_writes() {
    let env = env();
    let binary = Path::new(env!("CARGO_BIN_EXE_pko-manager"));
    let manager = env.start_manager(binary, &TEARDOWN_TIMEOUT).await.unwrap();
    let client = env.management().client().await.unwrap();
    let ns = env
        .management()
        .create_namespace("hcp-durable")
        .await
        .unwrap();
    let connector = start_connector(&ns, 0);
    let hosted: Api<ConfigMap> =
        Api::namespaced(env.hosted_clusters()[0].client().await.unwrap(), "default");
    let (first, last) = (format!("{ns}-first"), format!("{ns}-last"));

    let set = typed::<ObjectSet>(
        "ObjectSet",
        "durable",
        json!({"phases": [
            {"name": "first", "class": "hosted-cluster", "objects": [hosted_cm(&first, "default")]},
            {"name": "local", "objects": [{"object": configmap("gate", json!({}))}]},
            {"name": "last", "class": "hosted-cluster", "objects": [hosted_cm(&last, "default")]},
        ]}),
        json!({"availabilityProbes": [{
            "selector": {"kind": {"group": "", "kind": "ConfigMap"}},
            "probes": [{"cel": {"rule": "has(self.data.ready) && self.data.ready == 'yes'",
                                 "message": "not ready"}}],
        }]}),
    );
    create_set(&client, &ns, &set).await;
    wait_until(
        "the first hosted phase applied, the local one waiting",
        TIMEOUT,
        || async {
            let applied = hosted
                .get_opt(&first)
                .await
                .map_err(|e| e.to_string())?
                .is_some();
            let waiting = set_condition(&client, &ns, "durable", "Available").await;
            match waiting {
                Some((s, _, m)) if applied && s == "False" && m.contains("Phase \"local\"") => {
                    Ok(())
                }
                other => Err(format!("applied={applied} {other:?}")),
            }
        },
    )
    .await
    .unwrap();
    let first_version = resource_version(&hosted, &first).await;

    // NATS goes down; the local phase passes, so the last phase must travel, and cannot.
    env.nats().kill();
    patch_cm(&client, &ns, "gate", json!({"data": {"ready": "yes"}})).await;
    let phases: Api<ObjectSetPhase> = Api::namespaced(client.clone(), &ns);
    let stuck = wait_until("the undeliverable phase says so", TIMEOUT, || async {
        let phase = phases
            .get_opt("durable-last")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no phase yet")?;
        let conditions = phase.status.map(|s| s.conditions).unwrap_or_default();
        match conditions.iter().find(|c| c.type_ == "Available") {
            Some(c)
                if c.status == "False"
                    && c.message.contains(&format!("pko.v1.hc.{ns}.phase.apply")) =>
            {
                Ok(c.message.clone())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    assert!(
        stuck.contains("did not answer") || stuck.contains("no connector"),
        "{stuck}"
    );
    let (status, _, _) = set_condition(&client, &ns, "durable", "Available")
        .await
        .unwrap();
    assert_eq!(status, "False");
    assert!(hosted.get_opt(&last).await.unwrap().is_none());

    // Everything else dies too, then comes back: NATS, a new connector process, a new manager.
    connector.kill();
    manager.kill();
    env.nats().restart().await.unwrap();
    let _connector = start_connector(&ns, 0);
    let _manager = env.start_manager(binary, &TEARDOWN_TIMEOUT).await.unwrap();
    wait_condition(&client, &ns, "durable", "Available", "True", None).await;
    let cm = hosted.get(&last).await.unwrap();
    assert_eq!(cm.data.unwrap()["ready"], "yes");
    // The first phase was re-sent by the new manager and the new connector: nothing was written again.
    assert_eq!(resource_version(&hosted, &first).await, first_version);
    let last_version = resource_version(&hosted, &last).await;

    // One more connector restart: its hello makes the manager re-send both phases (seen on the wire),
    // and still nothing is written.
    let observer = env.nats().client().await.unwrap();
    let mut requests = observer
        .subscribe(format!("pko.v1.hc.{ns}.phase.apply"))
        .await
        .unwrap();
    let mut replies = observer.subscribe("_INBOX.>").await.unwrap();
    env.nats().round_trip(&observer).await.unwrap();
    drop(_connector);
    let _connector = start_connector(&ns, 0);
    // Both phases re-sent, and every request seen answered before the next part starts (a report the
    // connector pushes makes the manager send again; those are followed too).
    let mut resent = std::collections::BTreeSet::new();
    let mut unanswered = std::collections::BTreeSet::new();
    while resent.len() < 2 || !unanswered.is_empty() {
        tokio::select! {
            request = requests.next() => {
                let request = request.unwrap();
                let apply: ApplyPhase = decode(&request.payload).unwrap();
                resent.insert(apply.phase.name);
                unanswered.insert(request.reply.unwrap().to_string());
            }
            reply = replies.next() => {
                unanswered.remove(reply.unwrap().subject.as_str());
            }
            () = tokio::time::sleep(TIMEOUT) => panic!("requests {resent:?}, unanswered {unanswered:?}"),
        }
    }
    assert_eq!(
        resent.into_iter().collect::<Vec<_>>(),
        ["durable-first", "durable-last"]
    );
    wait_condition(&client, &ns, "durable", "Available", "True", None).await;
    assert_eq!(resource_version(&hosted, &first).await, first_version);
    assert_eq!(resource_version(&hosted, &last).await, last_version);

    // A lost hello (issue 17, item 5): the manager is frozen while NATS restarts, and a new connector,
    // which knows no phases, says hello to nobody. Meanwhile a hosted object was deleted, which only a
    // re-sent phase can repair. Once the manager runs again, its own reconnect re-sends every phase.
    _manager.pause().unwrap();
    drop(_connector);
    env.nats().kill();
    hosted.delete(&first, &Default::default()).await.unwrap();
    env.nats().restart().await.unwrap();
    let observer = env.nats().client().await.unwrap();
    let mut hellos = observer
        .subscribe(format!("pko.v1.hc.{ns}.hello"))
        .await
        .unwrap();
    env.nats().round_trip(&observer).await.unwrap();
    let _connector = start_connector(&ns, 0);
    tokio::time::timeout(TIMEOUT, hellos.next())
        .await
        .expect("the new connector says hello")
        .unwrap();
    _manager.resume().unwrap();
    wait_until("the deleted hosted object re-applied", TIMEOUT, || async {
        match hosted.get_opt(&first).await {
            Ok(Some(_)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    wait_condition(&client, &ns, "durable", "Available", "True", None).await;

    // A connector gone for good (issue 17, item 4): the ObjectSet is deleted; each hosted phase's
    // teardown is given up after the 3 s teardown timeout with a Warning Event, and the set goes.
    drop(_connector);
    Api::<ObjectSet>::namespaced(client.clone(), &ns)
        .delete("durable", &Default::default())
        .await
        .unwrap();
    wait_gone(
        &Api::<ObjectSet>::namespaced(client.clone(), &ns),
        "durable",
    )
    .await;
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns)
        .list(&Default::default())
        .await
        .unwrap();
    let skipped: Vec<(String, String)> = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("ConnectorUnreachable"))
        .map(|e| {
            (
                e.regarding
                    .as_ref()
                    .and_then(|r| r.name.clone())
                    .unwrap_or_default(),
                e.note.clone().unwrap_or_default(),
            )
        })
        .collect();
    let mut phases: Vec<&str> = skipped.iter().map(|(phase, _)| phase.as_str()).collect();
    phases.sort_unstable();
    assert_eq!(phases, ["durable-first", "durable-last"], "{skipped:?}");
    assert!(
        skipped
            .iter()
            .all(|(_, note)| note.contains("did not answer")),
        "{skipped:?}"
    );

    // The connector comes back after the timeout (issue 39, item 5): what the given-up teardowns left
    // in the hosted cluster was recorded, is swept at its hello, and a set re-adding one of those names
    // is not refused as a collision.
    let records = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let recorded = records.get("pko-hosted-leftovers").await.unwrap();
    assert_eq!(recorded.data.unwrap_or_default().len(), 2);
    assert!(hosted.get_opt(&first).await.unwrap().is_some());
    assert!(hosted.get_opt(&last).await.unwrap().is_some());
    let _connector = start_connector(&ns, 0);
    wait_until("the leftovers swept", TIMEOUT, || async {
        let left = [
            hosted.get_opt(&first).await.map_err(|e| e.to_string())?,
            hosted.get_opt(&last).await.map_err(|e| e.to_string())?,
        ];
        let records = records
            .get("pko-hosted-leftovers")
            .await
            .map_err(|e| e.to_string())?
            .data
            .unwrap_or_default();
        // The sweep counts what it swept after it removed the records: the count follows them.
        let swept = _manager
            .metric(r#"pko_hosted_leftovers_total{result="swept"}"#)
            .await
            .unwrap_or_default();
        if left.iter().all(Option::is_none) && records.is_empty() && swept >= 2 {
            Ok(())
        } else {
            Err(format!(
                "{} objects, {} records left, {swept} counted swept",
                left.iter().flatten().count(),
                records.len()
            ))
        }
    })
    .await
    .unwrap();
    let again = typed::<ObjectSet>(
        "ObjectSet",
        "durable-again",
        json!({"phases": [
            {"name": "first", "class": "hosted-cluster", "objects": [hosted_cm(&first, "default")]},
        ]}),
        json!({}),
    );
    create_set(&client, &ns, &again).await;
    wait_condition(&client, &ns, "durable-again", "Available", "True", None).await;
}

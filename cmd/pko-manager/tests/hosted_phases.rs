//! Phases of class `hosted-cluster` on the real environment: the manager sends them over NATS to the
//! real pko-connector of the HCP namespace, which applies them to its hosted-cluster apiserver; local and
//! hosted phases gate each other in order (seed 001's three-phase example).
#![allow(clippy::unwrap_used)]

mod common;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::ListParams;
use kube::Api;
use pko_proto::core::object_set::ObjectSet;
use pko_proto::core::object_set_phase::ObjectSetPhase;
use pko_testenv::wait_until;
use serde_json::{json, Value};

use common::*;

fn phase(name: &str, class: &str, objects: Vec<Value>) -> Value {
    let objects: Vec<Value> = objects.into_iter().map(|o| json!({"object": o})).collect();
    json!({"name": name, "class": class, "objects": objects})
}

/// ConfigMaps pass once `data.ready` is "yes": the local one waits for the test, hosted ones carry it.
fn ready_probe() -> Value {
    json!([{
        "selector": {"kind": {"group": "", "kind": "ConfigMap"}},
        "probes": [{"cel": {"rule": "has(self.data.ready) && self.data.ready == 'yes'",
                             "message": "not ready"}}],
    }])
}

fn three_phase_set(ns: &str, hosted_ns: &str) -> ObjectSet {
    let hosted_cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "operator-config", "namespace": hosted_ns},
        "data": {"ready": "yes", "mode": "hosted"}});
    typed(
        "ObjectSet",
        "addon",
        json!({"phases": [
            phase("rbac-and-stuff", "hosted-cluster", vec![
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": hosted_ns}}),
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                       "metadata": {"name": format!("{ns}-addon")},
                       "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}),
            ]),
            phase("deploy", "", vec![configmap("operator", json!({"mode": "local"}))]),
            phase("configure", "hosted-cluster", vec![hosted_cm]),
        ]}),
        json!({"availabilityProbes": ready_probe()}),
    )
}

#[tokio::test]
async fn local_and_hosted_cluster_phases_roll_out_in_order_each_in_its_cluster() {
    let (client, ns) = setup("hcp-order").await;
    let _connector = start_connector(&ns, 0);
    let hosted = env().hosted_clusters()[0].client().await.unwrap();
    let hosted_ns = format!("{ns}-app");
    create_set(&client, &ns, &three_phase_set(&ns, &hosted_ns)).await;

    // Phase 1 reached the hosted cluster; phase 2 waits for its probe, so phase 3 must not exist yet.
    let waiting = format!("Phase \"deploy\" failed: core ConfigMap {ns}/operator: not ready");
    wait_until("the local phase waits for its probe", TIMEOUT, || async {
        match set_condition(&client, &ns, "addon", "Available").await {
            Some((status, _, message)) if status == "False" && message == waiting => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap();
    Api::<Namespace>::all(hosted.clone())
        .get(&hosted_ns)
        .await
        .unwrap();
    Api::<ClusterRole>::all(hosted.clone())
        .get(&format!("{ns}-addon"))
        .await
        .unwrap();
    let hosted_cms: Api<ConfigMap> = Api::namespaced(hosted.clone(), &hosted_ns);
    assert!(hosted_cms
        .get_opt("operator-config")
        .await
        .unwrap()
        .is_none());

    patch_cm(&client, &ns, "operator", json!({"data": {"ready": "yes"}})).await;
    wait_condition(&client, &ns, "addon", "Available", "True", None).await;

    // Each object in its own cluster, owned across clusters by its ObjectSetPhase.
    let hosted_cm = hosted_cms.get("operator-config").await.unwrap();
    let owners: Value = serde_json::from_str(
        &hosted_cm.metadata.annotations.as_ref().unwrap()["package-operator.run/owners"],
    )
    .unwrap();
    let phases: Api<ObjectSetPhase> = Api::namespaced(client.clone(), &ns);
    let configure = phases.get("addon-configure").await.unwrap();
    assert_eq!(owners[0]["uid"], configure.metadata.uid.clone().unwrap());
    assert!(get_cm(&client, &ns, "operator-config").await.is_none());
    assert!(Api::<ConfigMap>::namespaced(hosted.clone(), &ns)
        .get_opt("operator")
        .await
        .unwrap()
        .is_none());

    // `kubectl get objectsetphases` shows both hosted phases, available, with what they control.
    let listed = phases.list(&ListParams::default()).await.unwrap();
    let mut names: Vec<String> = listed
        .items
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, ["addon-configure", "addon-rbac-and-stuff"]);
    let status = configure.status.unwrap();
    let available = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Available")
        .unwrap();
    assert_eq!(available.status, "True");
    assert_eq!(status.controller_of[0].name, "operator-config");
    let set: ObjectSet = Api::namespaced(client.clone(), &ns)
        .get("addon")
        .await
        .unwrap();
    assert_eq!(set.status.unwrap().remote_phases.len(), 2);
}

#[tokio::test]
async fn an_unreachable_connector_is_reported_and_the_phase_converges_once_it_says_hello() {
    let (client, ns) = setup("hcp-late").await;
    let hosted_ns = format!("{ns}-late");
    let set = typed::<ObjectSet>(
        "ObjectSet",
        "late",
        json!({"phases": [phase("config", "hosted-cluster", vec![
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": hosted_ns}}),
        ])]}),
        json!({}),
    );
    create_set(&client, &ns, &set).await;

    let phases: Api<ObjectSetPhase> = Api::namespaced(client.clone(), &ns);
    let message = wait_until(
        "the phase reports its missing connector",
        TIMEOUT,
        || async {
            let phase = phases.get("late-config").await.map_err(|e| e.to_string())?;
            let conditions = phase.status.map(|s| s.conditions).unwrap_or_default();
            match conditions.iter().find(|c| c.type_ == "Available") {
                Some(c) if c.status == "False" && c.message.contains("no connector") => {
                    Ok(c.message.clone())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        message,
        format!("Phase \"late-config\" failed: no connector is serving pko.v1.hc.{ns}.phase.apply (no responders)")
    );
    let message = wait_condition(&client, &ns, "late", "Available", "False", None).await;
    assert!(message.contains("late-config"), "{message}");

    // The connector starts: its hello makes the manager re-send at once (not after the backoff).
    let _connector = start_connector(&ns, 1);
    wait_condition(&client, &ns, "late", "Available", "True", None).await;
    let hosted = env().hosted_clusters()[1].client().await.unwrap();
    Api::<Namespace>::all(hosted).get(&hosted_ns).await.unwrap();
}

/// Handover and archival through hosted-cluster phases (issue 15, items 1c and 3 for this class):
/// revision 2's phase adopts the hosted object revision 1's phase controls, revision 1 lets go of it, and
/// archiving revision 1 removes only what it still has, holding `ArchivalInProgress` while a finalizer
/// blocks one of its hosted objects.
#[tokio::test]
async fn hosted_phases_hand_over_between_revisions_and_archive_what_is_left() {
    let (client, ns) = setup("hcp-handover").await;
    let _connector = start_connector(&ns, 0);
    let hosted = env().hosted_clusters()[0].client().await.unwrap();
    let hosted_ns = format!("{ns}-app");
    let hosted_cm = |name: &str, rev: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": hosted_ns}, "data": {"rev": rev}})
    };
    let mut held = hosted_cm("held", "1");
    held["metadata"]["finalizers"] = json!(["pko.test/hold"]);
    let namespace =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": hosted_ns}});
    let revision = |name: &str, config: Vec<Value>, extra: Value| {
        typed::<ObjectSet>(
            "ObjectSet",
            name,
            json!({"phases": [
                phase("namespace", "hosted-cluster", vec![namespace.clone()]),
                phase("config", "hosted-cluster", config),
            ]}),
            extra,
        )
    };
    create_set(
        &client,
        &ns,
        &revision("rev1", vec![hosted_cm("shared", "1"), held], json!({})),
    )
    .await;
    wait_condition(&client, &ns, "rev1", "Available", "True", None).await;
    create_set(
        &client,
        &ns,
        &revision(
            "rev2",
            vec![hosted_cm("shared", "2")],
            json!({"previous": [{"name": "rev1"}]}),
        ),
    )
    .await;
    wait_condition(&client, &ns, "rev2", "Available", "True", None).await;

    let phases: Api<ObjectSetPhase> = Api::namespaced(client.clone(), &ns);
    let rev2_config = phases.get("rev2-config").await.unwrap();
    let shared = wait_cm(&hosted, &hosted_ns, "shared", |cm| {
        cm.data.as_ref().is_some_and(|d| d["rev"] == "2")
    })
    .await;
    let owners: Value = serde_json::from_str(
        &shared.metadata.annotations.as_ref().unwrap()["package-operator.run/owners"],
    )
    .unwrap();
    let controller = owners
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["controller"] == true)
        .unwrap();
    assert_eq!(controller["uid"], rev2_config.metadata.uid.clone().unwrap());
    // Revision 1 no longer lists what revision 2 took over.
    wait_until("rev1 lets go of the shared objects", TIMEOUT, || async {
        let set: ObjectSet = Api::namespaced(client.clone(), &ns)
            .get("rev1")
            .await
            .map_err(|e| e.to_string())?;
        let controlled: Vec<String> = set
            .status
            .map(|s| s.controller_of.into_iter().map(|c| c.name).collect())
            .unwrap_or_default();
        if controlled == ["held"] {
            return Ok(());
        }
        // Say what each of its phases reports, so a failure shows which side is behind.
        let mut phases_said = Vec::new();
        for name in ["rev1-namespace", "rev1-config"] {
            let phase = phases.get(name).await.map_err(|e| e.to_string())?;
            let status = phase.status.unwrap_or_default();
            let available = status.conditions.iter().find(|c| c.type_ == "Available");
            phases_said.push(format!(
                "{name}: {:?} controls {:?}",
                available.map(|c| (&c.reason, &c.message)),
                status
                    .controller_of
                    .iter()
                    .map(|c| &c.name)
                    .collect::<Vec<_>>()
            ));
        }
        Err(format!(
            "rev1 controls {controlled:?}; {}",
            phases_said.join("; ")
        ))
    })
    .await
    .unwrap();

    archive_set(&client, &ns, "rev1").await;
    wait_cm(&hosted, &hosted_ns, "held", |cm| {
        cm.metadata.deletion_timestamp.is_some()
    })
    .await;
    wait_condition(
        &client,
        &ns,
        "rev1",
        "Archived",
        "False",
        Some("ArchivalInProgress"),
    )
    .await;
    patch_cm(
        &hosted,
        &hosted_ns,
        "held",
        json!({"metadata": {"finalizers": null}}),
    )
    .await;
    wait_condition(&client, &ns, "rev1", "Archived", "True", Some("Archived")).await;
    wait_cm_gone(&hosted, &hosted_ns, "held").await;
    let shared = get_cm(&hosted, &hosted_ns, "shared").await.unwrap();
    assert_eq!(shared.data.unwrap()["rev"], "2");
    Api::<Namespace>::all(hosted.clone())
        .get(&hosted_ns)
        .await
        .unwrap();
    wait_condition(&client, &ns, "rev2", "Available", "True", None).await;
}

/// A hosted-cluster phase larger than a manager-connector message may be is reported as `TooLarge`,
/// naming its size and the limit, instead of being retried forever (issue 17, item 10).
/// Waits until ObjectSetPhase `name` is Available=False reason TooLarge; returns its message.
async fn wait_too_large(client: &kube::Client, ns: &str, name: &str) -> String {
    let phases: Api<ObjectSetPhase> = Api::namespaced(client.clone(), ns);
    wait_until(&format!("{name} reports TooLarge"), TIMEOUT * 2, || async {
        let phase = phases.get(name).await.map_err(|e| e.to_string())?;
        let conditions = phase.status.map(|s| s.conditions).unwrap_or_default();
        match conditions.iter().find(|c| c.type_ == "Available") {
            Some(c) if c.status == "False" && c.reason == "TooLarge" => Ok(c.message.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_hosted_phase_over_the_message_limit_is_too_large() {
    let (client, ns) = setup("hcp-large").await;
    let hosted_ns = format!("{ns}-large");
    // Two ConfigMaps of 600 kB: the set fits the apiserver, the phase not one NATS message of 1 MiB.
    let big = |name: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": hosted_ns},
               "data": {"blob": "x".repeat(600 * 1024)}})
    };
    let set = typed::<ObjectSet>(
        "ObjectSet",
        "large",
        json!({"phases": [phase("config", "hosted-cluster", vec![big("blob-1"), big("blob-2")])]}),
        json!({}),
    );
    create_set(&client, &ns, &set).await;

    let message = wait_too_large(&client, &ns, "large-config").await;
    assert!(
        message.contains("exceeds the limit of 1048576"),
        "{message}"
    );
    let message = wait_condition(&client, &ns, "large", "Available", "False", None).await;
    assert!(message.contains("large-config"), "{message}");
}

#[tokio::test]
async fn a_connector_report_over_the_message_limit_is_too_large() {
    let (client, ns) = setup("hcp-big-report").await;
    let _connector = start_connector(&ns, 0);
    let hosted_ns = format!("{ns}-report");
    // A small request whose answer is not: 400 ConfigMaps failing a probe with a 3 kB message make a
    // report of about 1.2 MB, over the 1 MiB a message may carry.
    let mut objects =
        vec![json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": hosted_ns}})];
    objects.extend((0..400).map(|i| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": format!("cm-{i}"), "namespace": hosted_ns}})
    }));
    let set = typed::<ObjectSet>(
        "ObjectSet",
        "report",
        json!({"phases": [phase("config", "hosted-cluster", objects)]}),
        json!({"availabilityProbes": [{
            "selector": {"kind": {"group": "", "kind": "ConfigMap"}},
            "probes": [{"cel": {"rule": "has(self.data.never)", "message": "x".repeat(3000)}}],
        }]}),
    );
    create_set(&client, &ns, &set).await;
    let message = wait_too_large(&client, &ns, "report-config").await;
    assert!(
        message.contains("the connector's report does not fit a message: message of"),
        "{message}"
    );
}

/// A hostile connector (issue 63): it answers every phase with a report whose message carries terminal
/// escapes, line breaks and 100 KiB, trying to forge lines in `kubectl` output and logs and to bloat the
/// status. The phase's and the set's conditions carry that text without control characters and cut to
/// the 1 KiB a foreign text may take.
#[tokio::test]
async fn a_hostile_connectors_text_reaches_conditions_clean_and_bounded() {
    use futures::StreamExt;
    use pko_proto::connector_wire::{
        decode, encode, ApplyPhase, HostedClusterSubjects, MappedCondition, PhaseOutcome,
        PhaseReport, WIRE_VERSION,
    };
    let (client, ns) = setup("hcp-hostile").await;
    let nats = env().nats();
    let hostile = nats
        .connect(
            &nats.connector_credentials(&ns).unwrap(),
            async_nats::ConnectOptions::new(),
        )
        .await
        .unwrap();
    let subjects = HostedClusterSubjects::new(&ns).unwrap();
    let mut requests = hostile.subscribe(subjects.apply()).await.unwrap();
    // A ping answered: the server has the subscription (the connector may not use inboxes of its own).
    hostile.flush().await.unwrap();
    let forged = format!(
        "probe failed\n\u{1b}[2K\rAvailable=True reason=AllGood\u{7}\t{}",
        "x".repeat(100 * 1024)
    );
    let answering = {
        let forged = forged.clone();
        let hostile = hostile.clone();
        tokio::spawn(async move {
            while let Some(request) = requests.next().await {
                let Ok(apply) = decode::<ApplyPhase>(&request.payload) else {
                    continue;
                };
                let report = PhaseReport {
                    version: WIRE_VERSION,
                    phase: apply.phase,
                    outcome: PhaseOutcome::ProbeFailure,
                    message: forged.clone(),
                    mapped_conditions: vec![MappedCondition {
                        type_: "hostile.example/Ready".to_owned(),
                        status: true,
                        reason: "Ready".to_owned(),
                        message: forged.clone(),
                    }],
                    ..Default::default()
                };
                if let Some(reply) = request.reply {
                    let _ = hostile
                        .publish(reply, encode(&report).unwrap().into())
                        .await;
                }
            }
        })
    };
    let set = typed::<ObjectSet>(
        "ObjectSet",
        "hostile",
        json!({"phases": [phase("config", "hosted-cluster", vec![
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "hostile", "namespace": "default"}}),
        ])]}),
        json!({}),
    );
    create_set(&client, &ns, &set).await;
    let phases: Api<ObjectSetPhase> = Api::namespaced(client.clone(), &ns);
    let phase_conditions = wait_until(
        "the phase shows the connector's report",
        TIMEOUT,
        || async {
            let phase = phases
                .get("hostile-config")
                .await
                .map_err(|e| e.to_string())?;
            let conditions = phase.status.map(|s| s.conditions).unwrap_or_default();
            let reported = conditions.iter().any(|c| {
                c.type_ == "Available" && c.status == "False" && c.message.contains("probe failed")
            });
            let mapped = conditions
                .iter()
                .any(|c| c.type_ == "hostile.example/Ready");
            if reported && mapped {
                Ok(conditions)
            } else {
                Err(format!("{conditions:?}"))
            }
        },
    )
    .await
    .unwrap();
    let set_message = wait_condition(&client, &ns, "hostile", "Available", "False", None).await;
    let mut messages: Vec<(String, String)> = phase_conditions
        .into_iter()
        .map(|c| (format!("phase's {}", c.type_), c.message))
        .collect();
    messages.push(("set's Available".to_owned(), set_message));
    for (what, message) in &messages {
        assert!(
            !message.chars().any(char::is_control),
            "the {what} condition carries control characters: {message:?}"
        );
        assert!(
            message.len() <= 2 * 1024,
            "the {what} condition carries {} bytes of the connector's text",
            message.len()
        );
    }
    answering.abort();
}

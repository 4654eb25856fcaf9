//! The real pko-connector binary against a hosted-cluster apiserver and NATS, driven the way the manager
//! drives it: requests on its subjects, replies and pushed reports back.

#![allow(clippy::unwrap_used)] // tests fail loudly on the first unexpected error

use std::path::Path;
use std::time::Duration;

use async_nats::Subscriber;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, Patch, PatchParams};
use pko_proto::connector_wire::{
    decode, encode, ApplyPhase, ErrorCode, ErrorReply, Hello, HostedClusterSubjects, PhaseOutcome,
    PhaseReport, TeardownPhase,
};
use pko_testenv::{ConnectorProcess, TestEnv};
use serde_json::{json, Value};

const DEADLINE: Duration = Duration::from_secs(60);

fn connector_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pko-connector"))
}

/// A connector for a fresh HCP namespace, serving hosted cluster 0; returns once it said hello.
async fn start_connector(
    env: &TestEnv,
    prefix: &str,
) -> (
    HostedClusterSubjects,
    ConnectorProcess,
    async_nats::Client,
    String,
) {
    let hosted = &env.hosted_clusters()[0];
    // Also the hosted namespace the phase's objects go to: unique per test.
    let namespace = hosted.create_namespace(prefix).await.unwrap();
    let subjects = HostedClusterSubjects::new(&namespace).unwrap();
    let manager = env.nats().client().await.unwrap();
    let mut hellos = manager.subscribe(subjects.hello()).await.unwrap();
    env.nats().round_trip(&manager).await.unwrap();
    let credentials = env.nats().connector_credentials(&namespace).unwrap();
    let launch = env
        .connector_launch(&namespace, hosted, &credentials)
        .unwrap();
    let connector = env.spawn_connector(connector_binary(), &launch).unwrap();
    let hello: Hello = next_message(&mut hellos, &connector).await;
    assert_eq!(hello.namespace, namespace);
    assert_eq!(hello.connector, launch.connector_id);
    (subjects, connector, manager, namespace)
}

async fn next_message<T: serde::de::DeserializeOwned>(
    subscriber: &mut Subscriber,
    connector: &ConnectorProcess,
) -> T {
    let message = tokio::time::timeout(DEADLINE, subscriber.next())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no message within {DEADLINE:?}; connector log:\n{}",
                connector.log_tail()
            )
        })
        .unwrap();
    decode(&message.payload).unwrap()
}

async fn request<T: serde::Serialize, R: serde::de::DeserializeOwned>(
    manager: &async_nats::Client,
    subject: String,
    message: &T,
) -> R {
    let reply = tokio::time::timeout(
        DEADLINE,
        manager.request(subject, encode(message).unwrap().into()),
    )
    .await
    .unwrap()
    .unwrap();
    decode(&reply.payload).unwrap()
}

fn apply_request(namespace: &str, generation: i64) -> ApplyPhase {
    serde_json::from_value(json!({
        "version": 1,
        "phase": {"namespace": namespace, "name": "pkg-1-config", "uid": format!("uid-{namespace}"),
                  "generation": generation},
        "revision": 1,
        "objects": [
            {"object": {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                        "metadata": {"name": format!("{namespace}-reader")},
                        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]}},
            {"object": {"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": "settings", "namespace": namespace},
                        "data": {"expected": "yes"}}},
        ],
        "availabilityProbes": [{
            "selector": {"kind": {"group": "", "kind": "ConfigMap"}},
            "probes": [{"fieldsEqual": {"fieldA": ".data.expected", "fieldB": ".data.ready"}}],
        }],
    }))
    .unwrap()
}

fn owners_annotation(object: &Value) -> Value {
    let text = object["metadata"]["annotations"]["package-operator.run/owners"]
        .as_str()
        .unwrap_or_else(|| panic!("no owners annotation on {object}"));
    serde_json::from_str(text).unwrap()
}

#[tokio::test]
async fn applies_probes_pushes_and_tears_down_a_hosted_phase() {
    let env = pko_testenv::shared().unwrap();
    let (subjects, connector, manager, namespace) = start_connector(env, "conn-apply").await;
    let hosted = env.hosted_clusters()[0].client().await.unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(hosted.clone(), &namespace);
    let roles: Api<ClusterRole> = Api::all(hosted.clone());
    let mut statuses = manager.subscribe(subjects.status()).await.unwrap();
    env.nats().round_trip(&manager).await.unwrap();

    // Applied, but the probe waits for a field only someone else writes.
    let apply = apply_request(&namespace, 1);
    let report: PhaseReport = request(&manager, subjects.apply(), &apply).await;
    assert_eq!(report.outcome, PhaseOutcome::ProbeFailure, "{report:?}");
    assert!(report.message.contains("settings"), "{}", report.message);
    assert_eq!(report.controller_of.len(), 2, "{report:?}");
    let stored = serde_json::to_value(config_maps.get("settings").await.unwrap()).unwrap();
    assert!(stored["metadata"].get("ownerReferences").is_none());
    let owners = owners_annotation(&stored);
    assert_eq!(owners[0]["uid"], apply.phase.uid);
    assert_eq!(owners[0]["kind"], "ObjectSetPhase");
    assert_eq!(owners[0]["controller"], true);
    roles.get(&format!("{namespace}-reader")).await.unwrap();

    // The hosted object changes: the connector notices by watch and pushes the new report.
    let ready = ConfigMap {
        data: Some([("ready".to_owned(), "yes".to_owned())].into()),
        ..Default::default()
    };
    config_maps
        .patch(
            "settings",
            &PatchParams::apply("hosted-workload"),
            &Patch::Apply(&ready),
        )
        .await
        .unwrap();
    let pushed: PhaseReport = next_message(&mut statuses, &connector).await;
    assert_eq!(pushed.outcome, PhaseOutcome::Available, "{pushed:?}");
    assert_eq!(pushed.phase, apply.phase);

    // The same request again (a redelivery) writes nothing.
    let before = config_maps
        .get("settings")
        .await
        .unwrap()
        .metadata
        .resource_version;
    let again: PhaseReport = request(&manager, subjects.apply(), &apply).await;
    assert_eq!(again.outcome, PhaseOutcome::Available);
    let after = config_maps
        .get("settings")
        .await
        .unwrap()
        .metadata
        .resource_version;
    assert_eq!(before, after, "a repeated request must not write");

    // Teardown deletes what the phase controls.
    let teardown = TeardownPhase {
        version: 1,
        phase: apply.phase.clone(),
        objects: apply.objects.clone(),
    };
    // Deletion may take more than one pass; the manager repeats the request until TornDown.
    pko_testenv::wait_until("teardown complete", DEADLINE, || {
        let (manager, subject, teardown) = (manager.clone(), subjects.teardown(), teardown.clone());
        async move {
            let report: PhaseReport = request(&manager, subject, &teardown).await;
            match report.outcome {
                PhaseOutcome::TornDown => Ok(()),
                _ => Err(format!("{report:?}")),
            }
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}; connector log:\n{}", connector.log_tail()));
    assert!(config_maps.get_opt("settings").await.unwrap().is_none());
    assert!(roles
        .get_opt(&format!("{namespace}-reader"))
        .await
        .unwrap()
        .is_none());
    connector.check_running().unwrap();
}

#[tokio::test]
async fn bad_requests_get_error_replies_and_the_connector_keeps_serving() {
    let env = pko_testenv::shared().unwrap();
    let (subjects, connector, manager, namespace) = start_connector(env, "conn-bad").await;

    let garbage = manager.request(subjects.apply(), "{not json".into());
    let reply = tokio::time::timeout(DEADLINE, garbage)
        .await
        .unwrap()
        .unwrap();
    let error: ErrorReply = decode(&reply.payload).unwrap();
    assert_eq!(error.code, ErrorCode::Malformed, "{error:?}");

    let newer = json!({"version": 99, "phase": {"namespace": namespace, "name": "p", "uid": "u",
                                                 "generation": 1}, "revision": 1});
    let error: ErrorReply = request(&manager, subjects.apply(), &newer).await;
    assert_eq!(error.code, ErrorCode::UnsupportedVersion, "{error:?}");

    let mut elsewhere = apply_request(&namespace, 1);
    elsewhere.phase.namespace = "clusters-someone-else".to_owned();
    let error: ErrorReply = request(&manager, subjects.apply(), &elsewhere).await;
    assert_eq!(error.code, ErrorCode::WrongNamespace, "{error:?}");

    // A phase whose objects are invalid is refused by field, before any write.
    let mut invalid = apply_request(&namespace, 1);
    invalid.objects[1].object["metadata"]["ownerReferences"] = json!([{"uid": "x"}]);
    let report: PhaseReport = request(&manager, subjects.apply(), &invalid).await;
    assert_eq!(report.outcome, PhaseOutcome::PreflightError);
    assert_eq!(
        report.message,
        "spec.objects[1].object.metadata.ownerReferences: must be empty: pko sets the owner itself"
    );

    // Still serving.
    let report: PhaseReport =
        request(&manager, subjects.apply(), &apply_request(&namespace, 1)).await;
    assert_eq!(report.outcome, PhaseOutcome::ProbeFailure, "{report:?}");
    connector.check_running().unwrap();
}

#[tokio::test]
async fn replicas_serve_one_at_a_time_and_a_standby_takes_over() {
    let env = pko_testenv::shared().unwrap();
    // The Lease lives in the HCP namespace of the management cluster.
    let namespace = env
        .management()
        .create_namespace("conn-leader")
        .await
        .unwrap();
    let subjects = HostedClusterSubjects::new(&namespace).unwrap();
    let manager = env.nats().client().await.unwrap();
    let mut hellos = manager.subscribe(subjects.hello()).await.unwrap();
    env.nats().round_trip(&manager).await.unwrap();
    let credentials = env.nats().connector_credentials(&namespace).unwrap();
    let replica = |id: &str| {
        let mut launch = env
            .connector_launch(&namespace, &env.hosted_clusters()[0], &credentials)
            .unwrap();
        launch.connector_id = id.to_owned();
        launch.args.extend([
            "--leader-election".to_owned(),
            "--lease-duration-seconds=3".to_owned(),
        ]);
        launch.env.push((
            "KUBECONFIG".to_owned(),
            env.management().kubeconfig_path().display().to_string(),
        ));
        env.spawn_connector(connector_binary(), &launch).unwrap()
    };
    let first = replica("replica-a");
    let hello: Hello = next_message(&mut hellos, &first).await;
    assert_eq!(hello.connector, "replica-a");
    let second = replica("replica-b");
    let leases: Api<Lease> = Api::namespaced(env.management().client().await.unwrap(), &namespace);
    pko_testenv::wait_until("replica-b is waiting for the lease", DEADLINE, || async {
        let log = second.log_tail();
        if log.contains("waiting for the connector lease") {
            Ok(())
        } else {
            Err(log)
        }
    })
    .await
    .unwrap();
    let holder = || async {
        let lease = leases.get("pko-connector").await.unwrap();
        lease.spec.unwrap().holder_identity.unwrap_or_default()
    };
    assert_eq!(holder().await, "replica-a");
    let served: PhaseReport =
        request(&manager, subjects.apply(), &apply_request(&namespace, 1)).await;
    assert_eq!(served.phase.name, "pkg-1-config");

    // The leader dies without releasing its lease: the standby takes over once it expires.
    first.kill();
    let hello: Hello = next_message(&mut hellos, &second).await;
    assert_eq!(hello.connector, "replica-b");
    assert_eq!(holder().await, "replica-b");
    let served: PhaseReport =
        request(&manager, subjects.apply(), &apply_request(&namespace, 2)).await;
    assert_eq!(served.phase.generation, 2);
}

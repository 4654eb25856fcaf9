//! One rollout step is one trace (issue 19). The manager exports over OTLP/gRPC and the connectors over
//! OTLP/HTTP (protobuf) to a receiver speaking the collector's real protocol; a HostedClusterPackage rolls
//! the `hosted-addon` package (a hosted-cluster phase first) over the two hosted clusters. The trace whose
//! id the `packageUpdated` event carries holds, linked parent to child: the rollout decision, the Package
//! write and reconcile (with the image pull), the ObjectDeployment and ObjectSet reconciles, the NATS
//! request (producer), the connector's handling of it (consumer, another service), and the phase run with
//! its applies against the hosted apiserver (the connectors' spans arrive only through the flush when they
//! are stopped). The event's message header carries the same trace, and the
//! manager's JSON log lines name it. `kubectl package rollout status` follows the rollout live from the
//! apiserver and from the event stream, gives up at its timeout, and `rollout plan` shows the planner's
//! view. This binary runs its own manager with export on.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::PostParams;
use kube::Api;
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::rollout_events::{RolloutEvent, RolloutEventKind};
use pko_testenv::{span_tree, wait_until, ManagerLaunch, OtlpReceiver, ReceivedSpan};
use serde_json::json;

use common::rollout::*;
use common::*;

/// The events of `name` in the stream with their `traceparent` headers.
async fn events_with_traceparents(name: &str) -> Vec<(RolloutEvent, Option<String>)> {
    stored_rollout_messages(name)
        .await
        .into_iter()
        .map(|(headers, event)| {
            let traceparent = headers
                .as_ref()
                .and_then(|h| h.get("traceparent"))
                .map(|v| v.to_string());
            (serde_json::from_value(event).unwrap(), traceparent)
        })
        .collect()
}

fn kubectl_package_command(args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(kubectl_package());
    command
        .args(args)
        .env("KUBECONFIG", env().management().kubeconfig_path());
    command
}

fn kubectl_package_run(args: &[&str]) -> std::process::Output {
    kubectl_package_command(args).output().unwrap()
}

fn spawn_kubectl_package(args: &[&str]) -> std::process::Child {
    kubectl_package_command(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// `rollout status --watch` of HostedClusterPackage `name` as a child process: from the apiserver, or
/// from the event stream with `creds`.
fn follow_rollout(name: &str, creds: Option<&Path>) -> std::process::Child {
    let target = format!("hostedclusterpackage/{name}");
    let mut args = vec!["rollout", "status", &target, "--watch", "--timeout=180s"];
    let url = env().nats().url();
    if let Some(creds) = creds {
        args.extend(["--nats-url", &url, "--nats-creds", creds.to_str().unwrap()]);
    }
    spawn_kubectl_package(&args)
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The span's ancestors, nearest first, as far as the trace holds them.
fn ancestors<'a>(spans: &'a [ReceivedSpan], span: &ReceivedSpan) -> Vec<&'a ReceivedSpan> {
    let by_id: HashMap<&str, &ReceivedSpan> =
        spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let mut chain = Vec::new();
    let mut parent = span.parent_span_id.as_str();
    while let Some(next) = by_id.get(parent) {
        chain.push(*next);
        parent = next.parent_span_id.as_str();
    }
    chain
}

fn find<'a>(
    spans: &'a [ReceivedSpan],
    service: &str,
    name: &str,
) -> Result<&'a ReceivedSpan, String> {
    spans
        .iter()
        .find(|s| s.service == service && s.name == name)
        .ok_or_else(|| format!("no {service} span {name:?} yet"))
}

#[tokio::test]
async fn a_rollout_step_is_one_trace_from_the_decision_to_the_hosted_apply() {
    let env = env();
    let receiver = OtlpReceiver::start().await.unwrap();
    let launch = ManagerLaunch {
        env: vec![
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
                receiver.grpc_endpoint(),
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "grpc".into()),
            // Batches leave every 200 ms instead of 5 s.
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "200".into()),
            // Debug lines inside the reconciles, so some log lines are in traced spans.
            ("RUST_LOG".into(), "info,pko_actors=debug".into()),
        ],
        ..ManagerLaunch::default()
    };
    let manager = env
        .start_manager_with(
            Path::new(env!("CARGO_BIN_EXE_pko-manager")),
            &launch,
            &["--log-format", "json"],
        )
        .await
        .unwrap();
    let clusters = env.simulate_hypershift().await.unwrap();
    let client = env.management().client().await.unwrap();

    let image = build_and_push("hosted-addon", "traced-hosted-addon:v1");
    let name = "traced-addon";
    let hcpkg = hcpkg_over_all(name, &image);
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    api.create(&PostParams::default(), &hcpkg).await.unwrap();

    // The follower below lists the Packages when the rollout's status changes: they are all written
    // before it starts (the status may count a write still under way), so its first report has them.
    let total = i32::try_from(clusters.len()).unwrap();
    wait_status(&api, name, String::new, "every Package updated", |h| {
        h.status
            .as_ref()
            .is_some_and(|s| s.counts.updated_packages == total)
    })
    .await;
    let packages: Api<pko_proto::core::package::Package> = Api::all(client.clone());
    let owned =
        kube::api::ListParams::default().labels(&format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={name}"));
    wait_until("every Package written", TIMEOUT, || async {
        let listed = packages.list(&owned).await.map_err(|e| e.to_string())?;
        if listed.items.len() == clusters.len() {
            Ok(())
        } else {
            Err(format!(
                "{} of {} Packages",
                listed.items.len(),
                clusters.len()
            ))
        }
    })
    .await
    .unwrap();
    // Without connectors the hosted phases cannot become available: `rollout status` gives up at its
    // timeout, and `rollout plan` shows the planner's view.
    let timed_out = kubectl_package_run(&[
        "rollout",
        "status",
        &format!("hostedclusterpackage/{name}"),
        "--watch",
        "--timeout=3s",
    ]);
    assert_eq!(timed_out.status.code(), Some(1), "{}", text(&timed_out));
    let shown = text(&timed_out);
    assert!(shown.contains("timed out after 3s"), "{shown}");
    assert!(
        shown.contains("in flight: "),
        "the Packages in flight are listed: {shown}"
    );

    let plan = kubectl_package_run(&["rollout", "plan", &format!("hostedclusterpackage/{name}")]);
    assert_eq!(plan.status.code(), Some(0), "{}", text(&plan));
    assert!(
        text(&plan).contains("rollingUpgrade, maxUnavailable 1"),
        "{}",
        text(&plan)
    );

    // Followed live from both sources while the connectors start and the rollout runs.
    let creds = env.root_dir().join("traces-cli.creds");
    std::fs::write(
        &creds,
        env.nats().credentials("cli", None).unwrap().creds_file(),
    )
    .unwrap();
    let follow_apiserver = follow_rollout(name, None);
    let follow_stream = follow_rollout(name, Some(&creds));
    // The connectors export over OTLP/HTTP: the same receiver, the other protocol. Their batches leave
    // only every hour: what the trace holds of them below they sent when stopped (flushed at shutdown).
    let runner = env
        .start_connector_runner_with(
            &connector_binary(),
            vec![
                (
                    "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
                    receiver.http_endpoint(),
                ),
                ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "http/protobuf".into()),
                ("OTEL_BSP_SCHEDULE_DELAY".into(), "3600000".into()),
            ],
        )
        .await
        .unwrap();
    wait_status(
        &api,
        name,
        || manager.log_tail(),
        "every Package available",
        |h| all_available(h, total),
    )
    .await;

    for (source, follower) in [("apiserver", follow_apiserver), ("stream", follow_stream)] {
        let out = tokio::task::spawn_blocking(move || follower.wait_with_output().unwrap())
            .await
            .unwrap();
        let shown = text(&out);
        assert_eq!(out.status.code(), Some(0), "{source}: {shown}");
        assert!(
            shown.trim_end().ends_with(&format!(
                "hostedclusterpackage/{name} successfully rolled out (generation 1)"
            )),
            "{source}: {shown}"
        );
        match source {
            "apiserver" => assert!(
                shown.contains("updated") && shown.contains("available"),
                "{shown}"
            ),
            _ => assert!(
                shown.contains("generation 1 package_updated namespace="),
                "{shown}"
            ),
        }
    }
    let plan = kubectl_package_run(&["rollout", "plan", &format!("hostedclusterpackage/{name}")]);
    assert!(
        text(&plan).contains("next wave: nothing to write now"),
        "{}",
        text(&plan)
    );

    // The connectors stop as a kubelet stops them (SIGTERM) and flush their spans.
    assert!(
        !receiver
            .spans()
            .iter()
            .any(|s| s.service == "pko-connector"),
        "connector spans left before the connectors stopped (hourly batches)"
    );
    runner.stop(std::time::Duration::from_secs(20));

    // The connector Deployments carry the manager's export settings (the runner overrode them here).
    let deployment = Api::<Deployment>::namespaced(client.clone(), &clusters[0].hcp_namespace)
        .get("pko-connector")
        .await
        .unwrap();
    let container_env = deployment.spec.unwrap().template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    assert!(container_env
        .iter()
        .any(|v| v.name == "OTEL_EXPORTER_OTLP_ENDPOINT"
            && v.value.as_deref() == Some(receiver.grpc_endpoint().as_str())));

    // The packageUpdated event of the first HCP namespace names the step's trace, in body and header.
    let hcp = &clusters[0].hcp_namespace;
    let (event, traceparent) = wait_until("packageUpdated in the stream", TIMEOUT, || async {
        events_with_traceparents(name)
            .await
            .into_iter()
            .find(|(e, _)| {
                e.kind == RolloutEventKind::PackageUpdated && e.namespace.as_ref() == Some(hcp)
            })
            .ok_or_else(|| "not yet".to_owned())
    })
    .await
    .unwrap();
    let trace_id = event.trace_id.clone().expect("the event names its trace");
    let traceparent = traceparent.expect("the event's traceparent header");
    assert_eq!(traceparent.split('-').nth(1), Some(trace_id.as_str()));

    // Every span of the chain arrives in that one trace.
    let spans = wait_until(
        "the step's trace, down to the hosted apply",
        TIMEOUT,
        || async {
            let spans = receiver.trace(&trace_id);
            for (service, span) in [
                ("pko-manager", "rollout step"),
                ("pko-manager", "write Package"),
                ("pko-manager", "reconcile Package"),
                ("pko-manager", "pull image"),
                ("pko-manager", "render package"),
                ("pko-manager", "reconcile ObjectDeployment"),
                ("pko-manager", "reconcile ObjectSet"),
                ("pko-manager", "reconcile ObjectSetPhase"),
                ("pko-manager", "send apply"),
                ("pko-connector", "process apply"),
                ("pko-connector", "reconcile_phase"),
                ("pko-connector", "report phase"),
            ] {
                find(&spans, service, span)?;
            }
            Ok(spans)
        },
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}\nreceived in the trace:\n{}\nmanager log:\n{}",
            span_tree(&receiver.trace(&trace_id)),
            manager.log_tail()
        )
    });
    let tree = span_tree(&spans);
    println!("{tree}");
    let span = |service, name| find(&spans, service, name).unwrap();
    let root = span("pko-manager", "rollout step");
    assert!(root.parent_span_id.is_empty(), "{tree}");
    assert_eq!(
        root.attribute("pko.hostedclusterpackage"),
        Some(name),
        "{tree}"
    );
    assert_eq!(
        root.attribute("k8s.namespace.name"),
        Some(hcp.as_str()),
        "{tree}"
    );
    assert_eq!(
        root.links.len(),
        1,
        "linked to the reconcile that decided it\n{tree}"
    );

    // The producer and consumer spans follow the messaging conventions and meet across processes.
    let consumer = span("pko-connector", "process apply");
    let producer = spans
        .iter()
        .find(|s| s.span_id == consumer.parent_span_id)
        .unwrap_or_else(|| panic!("the consumer's parent is not in the trace\n{tree}"));
    assert_eq!(
        (producer.service.as_str(), producer.name.as_str()),
        ("pko-manager", "send apply"),
        "{tree}"
    );
    assert_eq!(producer.kind, "producer");
    assert_eq!(consumer.kind, "consumer");
    assert_eq!(producer.attribute("messaging.system"), Some("nats"));
    assert!(producer
        .attribute("messaging.destination.name")
        .is_some_and(|s| s.ends_with(".apply")));
    assert_eq!(consumer.attribute("k8s.namespace.name"), Some(hcp.as_str()));

    // The hosted apply descends from the connector's handling, which descends from the decision through
    // each hop, across both watches and the NATS request.
    let apply = spans
        .iter()
        .find(|s| {
            s.service == "pko-connector"
                && s.name == "reconcile_phase"
                && ancestors(&spans, s)
                    .iter()
                    .any(|a| a.span_id == consumer.span_id)
        })
        .unwrap_or_else(|| panic!("no hosted apply under the consumer span\n{tree}"));
    let chain: Vec<&str> = ancestors(&spans, apply)
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    for hop in [
        "process apply",
        "send apply",
        "reconcile ObjectSetPhase",
        "reconcile ObjectDeployment",
        "reconcile Package",
        "write Package",
        "rollout step",
    ] {
        assert!(
            chain.contains(&hop),
            "{hop} is not an ancestor: {chain:?}\n{tree}"
        );
    }
    // The hosted apiserver's writes are spans of their own, naming the object.
    let hosted_writes: Vec<&str> = spans
        .iter()
        .filter(|s| {
            s.service == "pko-connector"
                && s.name == "apply"
                && ancestors(&spans, s)
                    .iter()
                    .any(|a| a.span_id == consumer.span_id)
        })
        .filter_map(|s| s.attribute("pko.object.kind"))
        .collect();
    assert!(
        !hosted_writes.is_empty(),
        "no hosted apply naming its object\n{tree}"
    );
    let pull = span("pko-manager", "pull image");
    assert!(
        ancestors(&spans, pull)
            .iter()
            .any(|a| a.name == "reconcile Package"),
        "{tree}"
    );

    // JSON log lines inside traced spans carry ids of traces the receiver holds.
    let log = std::fs::read_to_string(manager.log_path()).unwrap();
    let received: HashSet<String> = receiver.spans().into_iter().map(|s| s.trace_id).collect();
    let logged: Vec<String> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|l| {
            Some((
                l["trace_id"].as_str()?.to_owned(),
                l["span_id"].as_str()?.len(),
            ))
        })
        .filter(|(_, span_id_len)| *span_id_len == 16)
        .map(|(trace, _)| trace)
        .collect();
    assert!(
        logged.iter().any(|t| received.contains(t)),
        "no JSON log line names a received trace ({} lines with a trace_id)",
        logged.len()
    );
    // A Package and its ObjectDeployment: finished for their current generation.
    for kind in ["package", "objectdeployment"] {
        let out = kubectl_package_run(&[
            "rollout",
            "status",
            &format!("{kind}/{name}"),
            "-n",
            hcp,
            "--watch",
            "--timeout=60s",
        ]);
        assert_eq!(out.status.code(), Some(0), "{kind}: {}", text(&out));
        assert!(
            text(&out).contains(&format!("{kind}/{name} successfully rolled out")),
            "{}",
            text(&out)
        );
    }

    // A release whose image does not exist: the first Package fails, and both followers say so and
    // exit non-zero.
    let missing = format!("{}/examples/does-not-exist:v9", env.registry().host());
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&json!({"spec": {"template": {"spec": {"image": missing}}}})),
    )
    .await
    .unwrap();
    let followers = [
        ("apiserver", follow_rollout(name, None)),
        ("stream", follow_rollout(name, Some(&creds))),
    ];
    for (source, follower) in followers {
        let out = tokio::task::spawn_blocking(move || follower.wait_with_output().unwrap())
            .await
            .unwrap();
        let shown = text(&out);
        assert_eq!(out.status.code(), Some(1), "{source}: {shown}");
        assert!(shown.contains("generation 2"), "{source}: {shown}");
        assert!(
            shown.contains("blocked by failing Package"),
            "{source}: {shown}"
        );
    }
    manager.kill();
}

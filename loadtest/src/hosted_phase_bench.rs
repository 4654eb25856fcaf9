//! `hosted-phase`: the issue-5 figures. (1) ObjectSet created -> Available for one phase of one ConfigMap,
//! local vs. class `hosted-cluster` (through NATS and a real pko-connector): the difference is what a
//! hosted phase adds; (2) throughput of objects through one connector: one hosted phase of N ConfigMaps
//! via the manager, and the same request sent to the connector directly.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::PostParams;
use kube::runtime::watcher::{self, Event};
use kube::Api;
use pko_proto::connector_wire::{
    decode, encode, ApplyPhase, HostedClusterSubjects, PhaseOutcome, PhaseReport,
};
use pko_proto::core::object_set::ObjectSet;
use pko_testenv::TestEnv;
use serde_json::{json, Value};

use crate::object_set_bench::{manager_path, percentile, start_with_manager};

const TIMEOUT: Duration = Duration::from_secs(600);

fn set(name: &str, class: &str, objects: Vec<Value>) -> Result<ObjectSet, String> {
    let objects: Vec<Value> = objects.into_iter().map(|o| json!({"object": o})).collect();
    serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSet",
        "metadata": {"name": name},
        "spec": {"phases": [{"name": "only", "class": class, "objects": objects}]},
    }))
    .map_err(|e| e.to_string())
}

fn configmap(name: &str, namespace: Option<&str>) -> Value {
    let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                        "data": {"payload": "x".repeat(256)}});
    if let Some(ns) = namespace {
        cm["metadata"]["namespace"] = json!(ns);
    }
    cm
}

/// Creates `set` and returns the time until it reports Available=True for its generation.
async fn time_to_available(api: &Api<ObjectSet>, set: &ObjectSet) -> Result<Duration, String> {
    let name = set.metadata.name.clone().unwrap_or_default();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api.clone(), config).boxed();
    let started = Instant::now();
    api.create(&PostParams::default(), set)
        .await
        .map_err(|e| e.to_string())?;
    loop {
        let event = tokio::time::timeout(TIMEOUT, events.next())
            .await
            .map_err(|_| format!("{name} not Available within {TIMEOUT:?}"))?;
        if let Some(Ok(Event::Apply(s)) | Ok(Event::InitApply(s))) = event {
            let generation = s.metadata.generation;
            let available = s.status.iter().flat_map(|st| &st.conditions).any(|c| {
                c.type_ == "Available" && c.status == "True" && c.observed_generation == generation
            });
            if available {
                return Ok(started.elapsed());
            }
        }
    }
}

fn report(label: &str, samples: &mut [Duration]) -> Duration {
    samples.sort();
    let median = percentile(samples, 0.5);
    println!(
        "{label}: min {:.1} ms, p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms ({} runs)",
        samples[0].as_secs_f64() * 1e3,
        median.as_secs_f64() * 1e3,
        percentile(samples, 0.9).as_secs_f64() * 1e3,
        samples[samples.len() - 1].as_secs_f64() * 1e3,
        samples.len()
    );
    median
}

pub async fn run(runs: usize, objects: usize, manager: Option<std::path::PathBuf>) -> ExitCode {
    match measure(runs, objects, manager).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pko-loadtest hosted-phase: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn measure(
    runs: usize,
    objects: usize,
    manager: Option<std::path::PathBuf>,
) -> Result<(), String> {
    let manager = manager_path(manager)?;
    let (env, client, _pko) = start_with_manager(&manager, 1).await?;
    let ns = env
        .management()
        .create_namespace("bench-hcp")
        .await
        .map_err(|e| e.to_string())?;
    let _connector = start_connector(&env, &manager, &ns)?;
    let api: Api<ObjectSet> = Api::namespaced(client.clone(), &ns);

    // Warm-up: discovery, watches and the NATS inbox of both paths.
    time_to_available(
        &api,
        &set("warm-local", "", vec![configmap("warm-local", None)])?,
    )
    .await?;
    let warm_hosted = configmap(&format!("{ns}-warm"), Some("default"));
    time_to_available(
        &api,
        &set("warm-hosted", "hosted-cluster", vec![warm_hosted])?,
    )
    .await?;

    let (mut local, mut hosted) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let name = format!("local-{run}");
        local.push(time_to_available(&api, &set(&name, "", vec![configmap(&name, None)])?).await?);
        let name = format!("hosted-{run}");
        let cm = configmap(&format!("{ns}-{name}"), Some("default"));
        hosted.push(time_to_available(&api, &set(&name, "hosted-cluster", vec![cm])?).await?);
    }
    let local_p50 = report("ObjectSet -> Available, 1 local phase", &mut local);
    let hosted_p50 = report(
        "ObjectSet -> Available, 1 hosted-cluster phase",
        &mut hosted,
    );
    println!(
        "added by the hosted-cluster phase (p50 difference): {:.1} ms",
        (hosted_p50.as_secs_f64() - local_p50.as_secs_f64()) * 1e3
    );

    let many: Vec<Value> = (0..objects)
        .map(|i| configmap(&format!("{ns}-tp-{i:04}"), Some("default")))
        .collect();
    let took = time_to_available(&api, &set("throughput", "hosted-cluster", many)?).await?;
    println!(
        "{objects} objects in one hosted-cluster phase, created -> Available: {:.0} ms ({:.0} objects/s)",
        took.as_secs_f64() * 1e3,
        objects as f64 / took.as_secs_f64()
    );
    direct_throughput(&env, &ns, objects).await
}

fn start_connector(
    env: &TestEnv,
    manager: &Path,
    ns: &str,
) -> Result<pko_testenv::ConnectorProcess, String> {
    let credentials = env
        .nats()
        .connector_credentials(ns)
        .map_err(|e| e.to_string())?;
    let launch = env
        .connector_launch(ns, &env.hosted_clusters()[0], &credentials)
        .map_err(|e| e.to_string())?;
    env.spawn_connector(&manager.with_file_name("pko-connector"), &launch)
        .map_err(|e| e.to_string())
}

/// The connector alone: one ApplyPhase request of `objects` ConfigMaps, timed to its reply.
async fn direct_throughput(env: &TestEnv, ns: &str, objects: usize) -> Result<(), String> {
    let nats = env.nats().client().await.map_err(|e| e.to_string())?;
    let subjects = HostedClusterSubjects::new(ns).map_err(|e| e.to_string())?;
    let request: ApplyPhase = serde_json::from_value(json!({
        "version": 1,
        "phase": {"namespace": ns, "name": "direct", "uid": format!("{ns}-direct"), "generation": 1},
        "revision": 1,
        "objects": (0..objects)
            .map(|i| json!({"object": configmap(&format!("{ns}-direct-{i:04}"), Some("default"))}))
            .collect::<Vec<_>>(),
    }))
    .map_err(|e| e.to_string())?;
    let payload = encode(&request).map_err(|e| e.to_string())?;
    for (label, expect_writes) in [("first apply", true), ("repeat, nothing to write", false)] {
        let started = Instant::now();
        let reply = tokio::time::timeout(
            TIMEOUT,
            nats.request(subjects.apply(), payload.clone().into()),
        )
        .await
        .map_err(|_| "direct request timed out".to_owned())?
        .map_err(|e| e.to_string())?;
        let took = started.elapsed();
        let report: PhaseReport = decode(&reply.payload).map_err(|e| e.to_string())?;
        if report.outcome != PhaseOutcome::Available {
            return Err(format!("direct apply: {report:?}"));
        }
        println!(
            "connector alone, {objects} objects, {label}: {:.0} ms ({:.0} objects/s){}",
            took.as_secs_f64() * 1e3,
            objects as f64 / took.as_secs_f64(),
            if expect_writes {
                ""
            } else {
                " (reads from its cache)"
            }
        );
    }
    Ok(())
}

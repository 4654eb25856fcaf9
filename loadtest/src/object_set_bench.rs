//! `object-set`: the issue-3 figures. (1) time for an ObjectSet of N ConfigMaps in 3 phases to become
//! Available, against a plain kube-rs loop server-side-applying the same N objects one after another and
//! with as many in flight as the manager keeps; (2) object writes the
//! manager makes when an unchanged, available set is reconciled again (from its /metrics); (3) latency from
//! a change of a probed object to the set's Available condition flipping; (4) the time the CRD's
//! validation rules (immutable fields, compared on every update) add to an ObjectSet update, against the
//! same patch of an empty ObjectSlice, whose rule compares nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use pko_proto::core::object_set::ObjectSet;
use pko_proto::well_known::{CACHE_LABEL, REVISION_ANNOTATION, SERVICE_ACCOUNT_ANNOTATION};
use pko_testenv::{wait_until, EnvConfig, ManagerLaunch, ManagerProcess, OtlpReceiver, TestEnv};
use serde_json::{json, Value};

use crate::apiserver_requests::{delta, request_counts};

const TIMEOUT: Duration = Duration::from_secs(600);
/// Applies the concurrent baseline keeps in flight: what one phase of the manager keeps
/// (`APPLY_CONCURRENCY` in actors/src/objects/phase_runner.rs).
const APPLIES_IN_FLIGHT: usize = 16;

fn configmap(i: usize) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm-{i:04}")},
           "data": {"index": i.to_string(), "payload": "x".repeat(256)}})
}

/// A manager's apiserver requests so far, from its /metrics: each `pko_apiserver_requests_total` sample's
/// labels (verb, code) and count.
pub async fn manager_request_samples(pko: &ManagerProcess) -> Result<Vec<(String, u64)>, String> {
    let (_, body) = pko.get("/metrics").await?;
    Ok(body
        .lines()
        .filter_map(|line| {
            let (labels, value) = line
                .strip_prefix("pko_apiserver_requests_total{")?
                .split_once("} ")?;
            Some((labels.to_owned(), value.trim().parse().ok()?))
        })
        .collect())
}

/// The manager's apiserver requests that got no success answer so far, by their labels (verb, code).
async fn failed_requests(
    pko: &ManagerProcess,
) -> Result<std::collections::BTreeMap<String, u64>, String> {
    Ok(manager_request_samples(pko)
        .await?
        .into_iter()
        .filter(|(labels, _)| !labels.contains("code=\"2"))
        .collect())
}

pub fn manager_path(explicit: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(p) = explicit {
        return Ok(p);
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let sibling = exe.with_file_name("pko-manager");
    if sibling.exists() {
        Ok(sibling)
    } else {
        Err(format!(
            "{} not found; build it (cargo build --release -p pko-manager) or pass --manager",
            sibling.display()
        ))
    }
}

fn available(set: &ObjectSet) -> Option<bool> {
    let generation = set.metadata.generation?;
    set.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Available" && c.observed_generation == Some(generation))
        .map(|c| c.status == "True")
}

async fn wait_available(api: &Api<ObjectSet>, name: &str, want: bool) -> Result<(), String> {
    wait_until(
        &format!("ObjectSet {name} Available={want}"),
        TIMEOUT,
        || async {
            let set = api.get(name).await.map_err(|e| e.to_string())?;
            if available(&set) == Some(want) {
                Ok(())
            } else {
                Err(format!("{:?}", set.status.map(|s| s.conditions)))
            }
        },
    )
    .await
    .map_err(|e| e.to_string())
}

/// CPU time the manager and the apiserver used from a moment on.
struct CpuMeter {
    pids: [Option<u32>; 2],
    before: [Duration; 2],
}

impl CpuMeter {
    fn new(pko: &ManagerProcess, apiserver: Option<u32>) -> Self {
        let pids = [pko.pid(), apiserver];
        Self {
            pids,
            before: pids.map(cpu_time),
        }
    }

    /// "manager S s, apiserver S s" since [`CpuMeter::new`].
    fn since(&self) -> Result<String, String> {
        let [manager, apiserver] = [0, 1].map(|i| {
            cpu_time(self.pids[i])
                .saturating_sub(self.before[i])
                .as_secs_f64()
        });
        Ok(format!("{manager:.2} s, {apiserver:.2} s"))
    }
}

fn cpu_time(pid: Option<u32>) -> Duration {
    pid.and_then(|pid| crate::process_usage::usage(pid).ok())
        .map(|u| u.cpu)
        .unwrap_or_default()
}

/// Creates `set` and returns the time until a watch of it shows it Available for its generation. A watch,
/// not polling: a GET of a 500-object set every few milliseconds would load the apiserver being measured.
async fn create_until_available(api: &Api<ObjectSet>, set: &ObjectSet) -> Result<Duration, String> {
    let name = set.metadata.name.clone().unwrap_or_default();
    let started = Instant::now();
    api.create(&PostParams::default(), set)
        .await
        .map_err(|e| e.to_string())?;
    let availability =
        kube::runtime::wait::await_condition(api.clone(), &name, |s: Option<&ObjectSet>| {
            s.and_then(available) == Some(true)
        });
    tokio::time::timeout(TIMEOUT, availability)
        .await
        .map_err(|_| format!("ObjectSet {name} not Available after {TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    Ok(started.elapsed())
}

/// Waits until the set reports a condition for its current generation (the manager has seen it).
async fn wait_current(api: &Api<ObjectSet>, name: &str) -> Result<(), String> {
    wait_until(&format!("ObjectSet {name} reconciled"), TIMEOUT, || async {
        let set = api.get(name).await.map_err(|e| e.to_string())?;
        let generation = set.metadata.generation;
        let current = set.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.observed_generation == generation)
        });
        if current {
            Ok(())
        } else {
            Err("not yet reconciled".to_owned())
        }
    })
    .await
    .map_err(|e| e.to_string())
}

/// A fresh environment (`hosted_clusters` hosted apiservers, no controller manager) with pko-manager
/// running on it.
pub async fn start_with_manager(
    manager: &Path,
    hosted_clusters: usize,
) -> Result<(TestEnv, Client, ManagerProcess), String> {
    let env = TestEnv::start(EnvConfig {
        hosted_clusters,
        controller_manager: false,
    })
    .await
    .map_err(|e| e.to_string())?;
    let client = env.management().client().await.map_err(|e| e.to_string())?;
    let launch = ManagerLaunch {
        env: trace_export().await?,
        ..ManagerLaunch::default()
    };
    let pko = env
        .start_manager_with(manager, &launch, &[])
        .await
        .map_err(|e| e.to_string())?;
    Ok((env, client, pko))
}

/// `--traces`: every manager exports all its spans (always-on sampling) over OTLP/gRPC to a receiver
/// in this process, which counts them; otherwise export stays off.
pub static TRACES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static RECEIVER: tokio::sync::OnceCell<OtlpReceiver> = tokio::sync::OnceCell::const_new();

async fn trace_export() -> Result<Vec<(String, String)>, String> {
    if !TRACES.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(Vec::new());
    }
    let receiver = RECEIVER
        .get_or_try_init(OtlpReceiver::start)
        .await
        .map_err(|e| e.to_string())?;
    Ok(vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT".into(),
            receiver.grpc_endpoint(),
        ),
        ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "grpc".into()),
        ("OTEL_TRACES_SAMPLER".into(), "always_on".into()),
    ])
}

/// Spans received from the managers so far (`--traces`), for the report.
pub fn spans_received() -> Option<usize> {
    RECEIVER.get().map(|r| r.spans().len())
}

pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

pub async fn run(objects: usize, latency_samples: usize, manager: Option<PathBuf>) -> ExitCode {
    match measure(objects, latency_samples, manager).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pko-loadtest object-set: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn measure(
    objects: usize,
    latency_samples: usize,
    manager: Option<PathBuf>,
) -> Result<(), String> {
    let manager = manager_path(manager)?;
    let (env, client, pko) = start_with_manager(&manager, 0).await?;
    let mgmt = env.management();

    // (1a) Baseline: one server-side apply after another.
    let ns = mgmt
        .create_namespace("bench-loop")
        .await
        .map_err(|e| e.to_string())?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let params = PatchParams::apply("bench").force();
    let cpu = CpuMeter::new(&pko, mgmt.pid());
    let started = Instant::now();
    for i in 0..objects {
        let cm = configmap(i);
        cms.patch(&format!("cm-{i:04}"), &params, &Patch::Apply(&cm))
            .await
            .map_err(|e| e.to_string())?;
    }
    let baseline = started.elapsed();
    let cpu_loop = cpu.since()?;

    // (1b) Baseline: the same objects with as many applies in flight as a phase of the manager keeps.
    let ns = mgmt
        .create_namespace("bench-concurrent")
        .await
        .map_err(|e| e.to_string())?;
    let cpu = CpuMeter::new(&pko, mgmt.pid());
    let concurrent = apply_concurrently(
        &Api::namespaced(client.clone(), &ns),
        &params,
        objects,
        configmap,
    )
    .await?;
    let cpu_concurrent = cpu.since()?;

    // (1c) The same objects as an ObjectSet in three phases.
    let ns = mgmt
        .create_namespace("bench-set")
        .await
        .map_err(|e| e.to_string())?;
    let per_phase = objects.div_ceil(3);
    let phases: Vec<Value> = (0..3)
        .map(|p| {
            let objs: Vec<Value> = (p * per_phase..((p + 1) * per_phase).min(objects))
                .map(|i| json!({"object": configmap(i)}))
                .collect();
            json!({"name": format!("phase-{p}"), "objects": objs})
        })
        .collect();
    let set: ObjectSet = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSet",
        "metadata": {"name": "bench"}, "spec": {"phases": phases},
    }))
    .map_err(|e| e.to_string())?;
    let sets: Api<ObjectSet> = Api::namespaced(client.clone(), &ns);
    let writes_before = pko.metric("pko_object_writes_total").await?;
    let failed_before = failed_requests(&pko).await?;
    let cpu = CpuMeter::new(&pko, mgmt.pid());
    let served_before = request_counts(&[mgmt]).await?;
    let engine = create_until_available(&sets, &set).await?;
    let cpu_set = cpu.since()?;
    let served_set = served_since(&served_before, &request_counts(&[mgmt]).await?);
    let writes_first = pko.metric("pko_object_writes_total").await? - writes_before;
    // Writes are counted per attempt: a retried apply shows here with the answer that made it retry.
    let failed_first: Vec<String> = failed_requests(&pko)
        .await?
        .into_iter()
        .filter_map(|(labels, n)| {
            let new = n - failed_before.get(&labels).copied().unwrap_or(0);
            (new > 0).then(|| format!("{labels}: {new}"))
        })
        .collect();

    // (1d) The same set again in another namespace: the manager knows the kind and watches it now, as a
    // manager that has run for a while does.
    let ns = mgmt
        .create_namespace("bench-set-warm")
        .await
        .map_err(|e| e.to_string())?;
    let writes_before = pko.metric("pko_object_writes_total").await?;
    let cpu = CpuMeter::new(&pko, mgmt.pid());
    let engine_warm = create_until_available(&Api::namespaced(client.clone(), &ns), &set).await?;
    let cpu_warm = cpu.since()?;
    let writes_warm = pko.metric("pko_object_writes_total").await? - writes_before;

    // (1e) The concurrent baseline with the metadata pko gives each object (its cache label, which the
    // manager watches, the revision annotation and a controller reference): what the apiserver spends
    // on pko's objects beyond the bare ones.
    let ns = mgmt
        .create_namespace("bench-marked")
        .await
        .map_err(|e| e.to_string())?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let owner = cms
        .patch(
            "owner",
            &params,
            &Patch::Apply(
                &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}),
            ),
        )
        .await
        .map_err(|e| e.to_string())?;
    let owner_uid = owner.metadata.uid.unwrap_or_default();
    let marked = |i: usize| {
        let mut cm = configmap(i);
        cm["metadata"]["labels"] = json!({CACHE_LABEL: "True"});
        cm["metadata"]["annotations"] = json!({REVISION_ANNOTATION: "1"});
        cm["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
            "uid": owner_uid, "controller": true, "blockOwnerDeletion": true}]);
        cm
    };
    let cpu = CpuMeter::new(&pko, mgmt.pid());
    let concurrent_marked = apply_concurrently(&cms, &params, objects, marked).await?;
    let cpu_marked = cpu.since()?;

    // (2) Re-reconcile every phase of the unchanged set: pausing and resuming it (the phases and probes
    // are immutable) makes two new generations that touch no object, so every phase runs again.
    let writes_before = pko.metric("pko_object_writes_total").await?;
    let reads_before = pko.metric("pko_object_reads_total").await?;
    for state in ["Paused", "Active"] {
        sets.patch(
            "bench",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"lifecycleState": state}})),
        )
        .await
        .map_err(|e| e.to_string())?;
        wait_current(&sets, "bench").await?;
    }
    wait_available(&sets, "bench", true).await?;
    let writes_again = pko.metric("pko_object_writes_total").await? - writes_before;
    let reads_again = pko.metric("pko_object_reads_total").await? - reads_before;

    // (3) Latency: flip a field the probe reads (pko does not own it) and time until the set's watch shows
    // the Available condition follow.
    let ns = mgmt
        .create_namespace("bench-latency")
        .await
        .map_err(|e| e.to_string())?;
    let probe: ObjectSet = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSet", "metadata": {"name": "probe"},
        "spec": {"phases": [{"name": "p", "objects": [{"object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "flip"}, "data": {"x": "1"}}}]}],
                 "availabilityProbes": [{"selector": {"kind": {"group": "", "kind": "ConfigMap"}},
                                         "probes": [{"cel": {"rule": "has(self.data.ok) && self.data.ok == 'yes'", "message": "not ok"}}]}]},
    }))
    .map_err(|e| e.to_string())?;
    let probe_sets: Api<ObjectSet> = Api::namespaced(client.clone(), &ns);
    probe_sets
        .create(&PostParams::default(), &probe)
        .await
        .map_err(|e| e.to_string())?;
    wait_available(&probe_sets, "probe", false).await?;
    let flip: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut watch = watcher::watcher(
        probe_sets.clone(),
        watcher::Config::default().fields("metadata.name=probe"),
    )
    .boxed();
    let mut samples = Vec::with_capacity(latency_samples);
    let mut state = false;
    for _ in 0..latency_samples {
        let want = !state;
        let value = if want { "yes" } else { "no" };
        let t0 = Instant::now();
        flip.patch(
            "flip",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"ok": value}})),
        )
        .await
        .map_err(|e| e.to_string())?;
        loop {
            let event = tokio::time::timeout(TIMEOUT, watch.next())
                .await
                .map_err(|_| "latency watch timed out".to_owned())?;
            match event {
                Some(Ok(Event::Apply(set))) | Some(Ok(Event::InitApply(set)))
                    if available(&set) == Some(want) =>
                {
                    break
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.to_string()),
                None => return Err("latency watch ended".into()),
            }
        }
        samples.push(t0.elapsed());
        state = want;
    }
    samples.sort();

    // (4) What the CRD's validation rules add to an ObjectSet update: label patches of the set (its phases
    // compared with the stored ones) against the same patches of an empty ObjectSlice (a custom resource
    // too), one after another.
    let patches = latency_samples.max(50);
    let label_patch = |i: usize| json!({"metadata": {"labels": {"bench-round": i.to_string()}}});
    let slice_kind = GroupVersionKind::gvk("package-operator.run", "v1alpha1", "ObjectSlice");
    let slices: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::from_gvk_with_plural(&slice_kind, "objectslices"),
    );
    let slice: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSlice",
        "metadata": {"name": "bench"}, "objects": [],
    }))
    .map_err(|e| e.to_string())?;
    slices
        .create(&PostParams::default(), &slice)
        .await
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    for i in 0..patches {
        slices
            .patch(
                "bench",
                &PatchParams::default(),
                &Patch::Merge(&label_patch(i)),
            )
            .await
            .map_err(|e| e.to_string())?;
    }
    let unreviewed = started.elapsed();
    let started = Instant::now();
    for i in 0..patches {
        probe_sets
            .patch(
                "probe",
                &PatchParams::default(),
                &Patch::Merge(&label_patch(i)),
            )
            .await
            .map_err(|e| e.to_string())?;
    }
    let reviewed = started.elapsed();

    // (5) Impersonation: the set of (1b) again, applied as a ServiceAccount of its namespace (the
    // owner's package-operator.run/service-account annotation; --default-service-account does the same
    // for every owner), then what each further identity costs in memory: small sets in 50 namespaces,
    // first as the manager, then each as its own namespace's account.
    let ns = mgmt
        .create_namespace("bench-impersonated")
        .await
        .map_err(|e| e.to_string())?;
    deployer_account(&client, &ns).await?;
    let mut impersonated = set.clone();
    impersonated.metadata.annotations =
        Some([(SERVICE_ACCOUNT_ANNOTATION.to_owned(), DEPLOYER.to_owned())].into());
    let sets: Api<ObjectSet> = Api::namespaced(client.clone(), &ns);
    let writes_before = pko.metric("pko_object_writes_total").await?;
    let engine_impersonated = create_until_available(&sets, &impersonated).await?;
    let writes_impersonated = pko.metric("pko_object_writes_total").await? - writes_before;
    let identities = |account: Option<&str>, prefix: &'static str| {
        let (client, pko) = (client.clone(), &pko);
        let account = account.map(str::to_owned);
        async move {
            let rss_before = pko.pid().map(crate::rss_kib).unwrap_or_default();
            for i in 0..IDENTITIES {
                let ns = mgmt
                    .create_namespace(prefix)
                    .await
                    .map_err(|e| e.to_string())?;
                deployer_account(&client, &ns).await?;
                let mut small: ObjectSet = serde_json::from_value(json!({
                    "apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSet",
                    "metadata": {"name": "small"},
                    "spec": {"phases": [{"name": "p", "objects": [{"object": configmap(i)}]}]},
                }))
                .map_err(|e| e.to_string())?;
                if let Some(account) = &account {
                    small.metadata.annotations =
                        Some([(SERVICE_ACCOUNT_ANNOTATION.to_owned(), account.clone())].into());
                }
                let sets: Api<ObjectSet> = Api::namespaced(client.clone(), &ns);
                sets.create(&PostParams::default(), &small)
                    .await
                    .map_err(|e| e.to_string())?;
                wait_available(&sets, "small", true).await?;
            }
            let rss_after = pko.pid().map(crate::rss_kib).unwrap_or_default();
            Ok::<i64, String>(rss_after as i64 - rss_before as i64)
        }
    };
    let grown_as_manager = identities(None, "bench-own").await?;
    let grown_as_accounts = identities(Some(DEPLOYER), "bench-accounts").await?;
    let clients = pko.metric("pko_impersonated_identities").await?;
    let manager_rss_mib = pko.pid().map(crate::rss_kib).unwrap_or_default() / 1024;

    println!(
        "object-set: {objects} ConfigMaps, 3 phases (manager: {})",
        manager.display()
    );
    println!(
        "  plain SSA loop (sequential):        {:>8.2} s",
        baseline.as_secs_f64()
    );
    println!(
        "  plain SSA, {APPLIES_IN_FLIGHT} in flight:           {:>8.2} s  ({:.2}x the loop)",
        concurrent.as_secs_f64(),
        concurrent.as_secs_f64() / baseline.as_secs_f64()
    );
    println!(
        "  the same, marked as pko marks them: {:>8.2} s  ({:.2}x the bare ones; CPU {cpu_marked})",
        concurrent_marked.as_secs_f64(),
        concurrent_marked.as_secs_f64() / concurrent.as_secs_f64()
    );
    println!("  ObjectSet create -> Available:      {:>8.2} s  ({:.2}x the loop, {:.2}x {APPLIES_IN_FLIGHT} in flight; {writes_first} object writes)", engine.as_secs_f64(), engine.as_secs_f64() / baseline.as_secs_f64(), engine.as_secs_f64() / concurrent.as_secs_f64());
    println!(
        "  served by the apiserver meanwhile:  {}",
        served_set
            .iter()
            .map(|(request, n)| format!("{request} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("  the same set again, kind now known:  {:>8.2} s  ({:.2}x the loop, {:.2}x {APPLIES_IN_FLIGHT} in flight; {writes_warm} object writes)", engine_warm.as_secs_f64(), engine_warm.as_secs_f64() / baseline.as_secs_f64(), engine_warm.as_secs_f64() / concurrent.as_secs_f64());
    println!(
        "  CPU (manager, apiserver):           loop {cpu_loop}; {APPLIES_IN_FLIGHT} in flight {cpu_concurrent}; set {cpu_set}; again {cpu_warm}"
    );
    println!(
        "  apiserver answers that failed then:  {}",
        if failed_first.is_empty() {
            "none".to_owned()
        } else {
            failed_first.join(", ")
        }
    );
    println!("  unchanged set, all phases again:    {writes_again} object writes, {reads_again} object reads");
    println!(
        "  object change -> set condition:     p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} samples)",
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        percentile(&samples, 0.9).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        samples.last().map(|d| d.as_secs_f64() * 1e3).unwrap_or_default(),
        samples.len()
    );
    println!(
        "  update through the CRD rules:       {:.2} ms per ObjectSet patch vs {:.2} ms per empty ObjectSlice patch ({:.2}x; {patches} patches each)",
        reviewed.as_secs_f64() * 1e3 / patches as f64,
        unreviewed.as_secs_f64() * 1e3 / patches as f64,
        reviewed.as_secs_f64() / unreviewed.as_secs_f64()
    );
    println!(
        "  impersonated ObjectSet -> Available: {:>8.2} s  ({:.2}x the same set as the manager; {writes_impersonated} object writes)",
        engine_impersonated.as_secs_f64(),
        engine_impersonated.as_secs_f64() / engine.as_secs_f64()
    );
    println!(
        "  {IDENTITIES} one-object sets:              RSS {:+} KiB as the manager, {:+} KiB as {IDENTITIES} accounts ({:+.1} KiB per identity; {clients} impersonating clients)",
        grown_as_manager,
        grown_as_accounts,
        (grown_as_accounts - grown_as_manager) as f64 / IDENTITIES as f64
    );
    println!("  manager RSS at the end:             {manager_rss_mib} MiB");
    Ok(())
}

/// Server-side applies `objects` ConfigMaps shaped by `shape` with `params`, [`APPLIES_IN_FLIGHT`] at
/// a time; how long they took.
async fn apply_concurrently(
    cms: &Api<ConfigMap>,
    params: &PatchParams,
    objects: usize,
    shape: impl Fn(usize) -> Value,
) -> Result<Duration, String> {
    let started = Instant::now();
    let applied: Vec<Result<ConfigMap, kube::Error>> = futures::stream::iter(0..objects)
        .map(|i| {
            let body = shape(i);
            async move {
                cms.patch(&format!("cm-{i:04}"), params, &Patch::Apply(&body))
                    .await
            }
        })
        .buffer_unordered(APPLIES_IN_FLIGHT)
        .collect()
        .await;
    applied
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    Ok(started.elapsed())
}

/// The requests served between two counts of [`request_counts`], most first (Lease renewals aside).
fn served_since(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> Vec<(String, f64)> {
    let mut served = delta(before, after);
    served.retain(|(request, _)| !request.ends_with(" leases"));
    served.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    served
}

/// Namespaces measured for the memory of impersonating clients.
const IDENTITIES: usize = 50;
/// The account the impersonated sets name, allowed ConfigMaps in its namespace.
const DEPLOYER: &str = "bench-deployer";

/// Creates [`DEPLOYER`] in `ns` with a Role over ConfigMaps there.
async fn deployer_account(client: &Client, ns: &str) -> Result<(), String> {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let error = |e: kube::Error| format!("creating {DEPLOYER} in {ns}: {e}");
    // Opted in: owners of the namespace may name it (package-operator.run/service-account).
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": DEPLOYER,
        "labels": {pko_proto::well_known::SERVICE_ACCOUNT_OPT_IN_LABEL: "true"}}}))
    .map_err(|e| e.to_string())?;
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &account)
        .await
        .map_err(error)?;
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": DEPLOYER},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                   "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}],
    }))
    .map_err(|e| e.to_string())?;
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .map_err(error)?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": DEPLOYER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": DEPLOYER},
        "subjects": [{"kind": "ServiceAccount", "name": DEPLOYER, "namespace": ns}],
    }))
    .map_err(|e| e.to_string())?;
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .map_err(error)?;
    Ok(())
}

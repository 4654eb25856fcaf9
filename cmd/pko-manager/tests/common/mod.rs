//! Shared by the manager's integration tests: one environment and one manager process per test binary,
//! and helpers to create objects and wait on their conditions. Tests isolate themselves by namespace.
#![allow(dead_code)]

pub mod packages;
pub mod rollout;
pub mod shard_group;
pub mod shipped;
pub mod workload;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use pko_proto::core::object_set::ObjectSet;
use pko_testenv::{wait_until, ManagerProcess, TestEnv};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

pub const TIMEOUT: Duration = Duration::from_secs(60);

pub fn env() -> &'static TestEnv {
    pko_testenv::shared().expect("shared test environment")
}

/// The manager every test of this binary shares, started on first use.
pub fn manager() -> &'static ManagerProcess {
    static MANAGER: OnceLock<Result<ManagerProcess, String>> = OnceLock::new();
    start_once(&MANAGER, || async {
        env()
            .start_manager(Path::new(env!("CARGO_BIN_EXE_pko-manager")), &[])
            .await
            .map_err(|e| e.to_string())
    })
}

/// What `start` starts, once per test binary: on a thread and runtime of its own, since tests run on
/// runtimes of their own that end with them.
pub fn start_once<F, Fut>(
    cell: &'static OnceLock<Result<ManagerProcess, String>>,
    start: F,
) -> &'static ManagerProcess
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<ManagerProcess, String>>,
{
    cell.get_or_init(|| {
        std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(start())
        })
        .join()
        .unwrap_or_else(|_| Err("manager start-up thread panicked".to_owned()))
    })
    .as_ref()
    .expect("pko-manager started")
}

/// A namespace of its own, with the manager running.
pub async fn setup(prefix: &str) -> (Client, String) {
    manager();
    let client = env().management().client().await.unwrap();
    let ns = env().management().create_namespace(prefix).await.unwrap();
    (client, ns)
}

pub fn configmap(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

/// An ObjectSet with the given phases (`[(name, [object])]`) and extra spec fields.
pub fn object_set(name: &str, phases: &[(&str, Vec<Value>)], extra: Value) -> ObjectSet {
    let phases: Vec<Value> = phases
        .iter()
        .map(|(p, objects)| {
            json!({"name": p, "objects": objects.iter().map(|o| json!({"object": o})).collect::<Vec<_>>()})
        })
        .collect();
    typed("ObjectSet", name, json!({"phases": phases}), extra)
}

/// A package-operator object of `kind` with `spec`, plus the top-level spec fields in `extra`.
pub fn typed<T: DeserializeOwned>(kind: &str, name: &str, mut spec: Value, extra: Value) -> T {
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

pub async fn create_set(client: &Client, ns: &str, set: &ObjectSet) -> ObjectSet {
    Api::<ObjectSet>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), set)
        .await
        .unwrap()
}

pub async fn patch_set(client: &Client, ns: &str, name: &str, patch: Value) {
    Api::<ObjectSet>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Sets the named ObjectSet's lifecycleState to Archived.
pub async fn archive_set(client: &Client, ns: &str, name: &str) {
    patch_set(
        client,
        ns,
        name,
        json!({"spec": {"lifecycleState": "Archived"}}),
    )
    .await
}

/// Condition `type_` of the named ObjectSet, if reported for its current generation.
pub async fn set_condition(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let set = Api::<ObjectSet>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .ok()?;
    let generation = set.metadata.generation?;
    set.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_ && c.observed_generation == Some(generation))
        .map(|c| (c.status, c.reason, c.message))
}

/// Waits until the set's condition has `status` (and, if given, `reason`); returns its message.
pub async fn wait_condition(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
    reason: Option<&str>,
) -> String {
    reach_condition(client, ns, name, type_, status, reason)
        .await
        .unwrap()
}

/// [`wait_condition`], with the timeout returned for the caller to explain.
pub async fn reach_condition(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
    reason: Option<&str>,
) -> Result<String, pko_testenv::TestEnvError> {
    wait_until(
        &format!("ObjectSet {ns}/{name} {type_}={status}"),
        TIMEOUT,
        || async {
            match set_condition(client, ns, name, type_).await {
                Some((s, r, m)) if s == status && reason.is_none_or(|want| want == r) => Ok(m),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

pub async fn get_cm(client: &Client, ns: &str, name: &str) -> Option<ConfigMap> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
}

pub async fn wait_cm(
    client: &Client,
    ns: &str,
    name: &str,
    check: impl Fn(&ConfigMap) -> bool,
) -> ConfigMap {
    wait_until(&format!("ConfigMap {ns}/{name}"), TIMEOUT, || async {
        match get_cm(client, ns, name).await {
            Some(cm) if check(&cm) => Ok(cm),
            other => Err(format!("{:?}", other.map(|c| c.data))),
        }
    })
    .await
    .unwrap()
}

/// Waits until `api` has no object `name`.
pub async fn wait_gone<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    until_gone(api, name).await.unwrap()
}

/// Until `api` has no object `name`, or [`TIMEOUT`].
async fn until_gone<K>(api: &Api<K>, name: &str) -> Result<(), pko_testenv::TestEnvError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    wait_until(&format!("{name} deleted"), TIMEOUT, || async {
        match api.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            // What holds it, should it stay: its finalizers (a foreground deletion waits on its
            // dependents) and since when it is being deleted.
            Some(object) => Err(format!(
                "still there: finalizers {:?}, deletion requested {:?}",
                object.meta().finalizers,
                object.meta().deletion_timestamp.as_ref().map(|t| t.0)
            )),
        }
    })
    .await
}

/// Waits until `api` has no object `name`; should it stay, panics with what holds it up in `ns`: every
/// object of `kinds` there (finalizers, deletion, conditions) and the shared manager's log lines on `ns`.
pub async fn wait_gone_explained<K>(api: &Api<K>, name: &str, ns: &str, kinds: &[ApiResource])
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    if let Err(error) = until_gone(api, name).await {
        let client = env().management().client().await.unwrap();
        let mut story = Vec::new();
        for kind in kinds {
            let objects = Api::<DynamicObject>::namespaced_with(client.clone(), ns, kind)
                .list(&Default::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            for o in objects {
                story.push(format!(
                    "{} {:?}: finalizers {:?}, deleting since {:?}, conditions {}",
                    kind.kind,
                    o.metadata.name,
                    o.metadata.finalizers,
                    o.metadata.deletion_timestamp.as_ref().map(|t| t.0),
                    o.data.pointer("/status/conditions").unwrap_or(&Value::Null)
                ));
            }
        }
        let log = std::fs::read_to_string(manager().log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(ns)).collect();
        panic!(
            "{error}\n{}\nmanager log on {ns}:\n{}",
            story.join("\n"),
            lines[lines.len().saturating_sub(60)..].join("\n")
        );
    }
}

/// Waits until ConfigMap `ns/name` is gone.
pub async fn wait_cm_gone(client: &Client, ns: &str, name: &str) {
    wait_gone(&Api::<ConfigMap>::namespaced(client.clone(), ns), name).await
}

pub async fn patch_cm(client: &Client, ns: &str, name: &str, patch: Value) {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// The controller reference among an object's owner references, if any.
pub fn controller_ref(
    meta: &kube::api::ObjectMeta,
) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true))
}

/// UID of the controller of a ConfigMap, if any.
pub fn controller_uid(cm: &ConfigMap) -> Option<String> {
    controller_ref(&cm.metadata).map(|r| r.uid.clone())
}

/// Packages as dynamic objects: a Package in `ns`, or a ClusterPackage with `None`.
pub fn package_api(client: &Client, ns: Option<&str>) -> Api<DynamicObject> {
    use pko_proto::core::package::{ClusterPackage, Package};
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<Package>(&())),
        None => Api::all_with(client.clone(), &ApiResource::erase::<ClusterPackage>(&())),
    }
}

/// (reason, message) of the object's `type_` condition when it has `status` and was written for the
/// object's current generation.
pub fn current_condition(
    object: &DynamicObject,
    type_: &str,
    status: &str,
) -> Option<(String, String)> {
    let generation = object
        .metadata
        .generation
        .map(Value::from)
        .unwrap_or_default();
    object
        .data
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| {
            c["type"] == type_ && c["status"] == status && c["observedGeneration"] == generation
        })
        .map(|c| {
            (
                c["reason"].as_str().unwrap_or_default().to_owned(),
                c["message"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

/// Waits until the named object has condition `type_`=`status` (with `reason`, if given) for its current
/// generation; returns (reason, message).
pub async fn wait_object_condition(
    api: &Api<DynamicObject>,
    name: &str,
    type_: &str,
    status: &str,
    reason: Option<&str>,
) -> (String, String) {
    wait_until(
        &format!("{name} {type_}={status} ({reason:?})"),
        TIMEOUT,
        || async {
            let object = api.get(name).await.map_err(|e| e.to_string())?;
            match current_condition(&object, type_, status) {
                Some((r, m)) if reason.is_none_or(|want| want == r) => Ok((r, m)),
                _ => Err(format!("{:?}", object.data.pointer("/status/conditions"))),
            }
        },
    )
    .await
    .unwrap()
}

/// The `pko-connector` binary next to the manager's; `cargo test --workspace` builds both.
pub fn connector_binary() -> std::path::PathBuf {
    let bin =
        std::path::PathBuf::from(env!("CARGO_BIN_EXE_pko-manager")).with_file_name("pko-connector");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p pko-connector` (cargo test --workspace does)",
        bin.display()
    );
    bin
}

/// A connector serving HCP namespace `namespace` with hosted cluster `hosted`, as its Deployment would run.
pub fn start_connector(namespace: &str, hosted: usize) -> pko_testenv::ConnectorProcess {
    let env = env();
    let credentials = env.nats().connector_credentials(namespace).unwrap();
    let launch = env
        .connector_launch(namespace, &env.hosted_clusters()[hosted], &credentials)
        .unwrap();
    env.spawn_connector(&connector_binary(), &launch).unwrap()
}

/// The example packages of kubectl-package, built and pushed with the real binary.
pub fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../kubectl-package/tests/packages")
}

pub fn kubectl_package() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_pko-manager")).with_file_name("kubectl-package");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p kubectl-package` (cargo test --workspace does)",
        bin.display()
    );
    bin
}

/// Runs `kubectl package` against the management apiserver: whether it succeeded, and its output.
pub fn run_cli(args: &[&str]) -> (bool, String) {
    let out = Command::new(kubectl_package())
        .args(args)
        .arg("--kubeconfig")
        .arg(env().management().kubeconfig_path())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Runs `kubectl package` and asserts it succeeded.
pub fn cli(args: &[&str]) -> String {
    let (ok, text) = run_cli(args);
    assert!(ok, "kubectl package {args:?}: {text}");
    text
}

/// `kubectl-package build -t <registry>/examples/<tag> --push <example>`, as upstream's CLI takes it;
/// returns the image.
pub fn build_and_push(example: &str, tag: &str) -> String {
    let host = env().registry().host();
    let image = format!("{host}/examples/{tag}");
    let out = Command::new(kubectl_package())
        .current_dir(examples())
        .args([
            "build",
            "-t",
            &image,
            "--push",
            "--plain-http",
            &host,
            example,
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout, "Package built successfully!");
    image
}

/// Pushes an example's files as they are, without `build`'s checks (for packages `build` refuses, such as
/// broken ones or one locked to a registry the tests cannot reach); returns the image.
pub async fn push_unchecked(example: &str, tag: &str) -> String {
    let host = env().registry().host();
    let image = format!("{host}/examples/{tag}");
    let files = pko_package::files::from_dir(&examples().join(example)).unwrap();
    pko_package::image::ImageStore::new(vec![host])
        .push(
            &image,
            &files,
            &oci_client::secrets::RegistryAuth::Anonymous,
        )
        .await
        .unwrap();
    image
}

pub async fn install(
    client: &kube::Client,
    ns: Option<&str>,
    name: &str,
    image: &str,
    config: Value,
) {
    install_spec(client, ns, name, json!({"image": image, "config": config})).await;
}

pub async fn install_spec(client: &kube::Client, ns: Option<&str>, name: &str, spec: Value) {
    let kind = if ns.is_some() {
        "Package"
    } else {
        "ClusterPackage"
    };
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": kind,
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    package_api(client, ns)
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
}

/// Resident memory of a process, in KiB (`VmRSS` of /proc/<pid>/status).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The lines of the shared manager's /metrics for `metric` whose labels contain every one of `labels`
/// (`key="value"` each), read once, now.
pub async fn series(metric: &str, labels: &[&str]) -> Vec<String> {
    let (_, body) = manager().get("/metrics").await.unwrap();
    let prefix = format!("{metric}{{");
    body.lines()
        .filter(|line| line.starts_with(&prefix) && labels.iter().all(|l| line.contains(l)))
        .map(str::to_owned)
        .collect()
}

/// The lines of `pko_apiserver_requests_total` in a manager's /metrics text that count writes (create,
/// update, patch, delete) it sent, when not zero.
pub fn manager_writes(metrics: &str) -> Vec<&str> {
    metrics
        .lines()
        .filter(|l| l.starts_with("pko_apiserver_requests_total{"))
        .filter(|l| {
            ["create", "update", "patch", "delete"]
                .iter()
                .any(|v| l.contains(&format!("verb=\"{v}\"")))
        })
        .filter(|l| !l.ends_with(" 0"))
        .collect()
}

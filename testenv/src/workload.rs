//! A stand-in for the controllers a package's workload has on a real cluster: it reports a workload
//! ready a fixed lag after each change, as a real one would, or fails it for the releases told to
//! break. Widgets (a custom resource installed here) get `Available` with `observedGeneration`;
//! Deployments get the status the deployment controller writes once their Pods are ready, or, broken,
//! the one it writes while the new Pod never gets ready (the old one kept: 2 replicas, 1 updated). For
//! Deployments, the environment must run without kube-controller-manager.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use serde_json::{json, Value};

use crate::error::TestEnvError;

/// The API group of the `fleet-widget` package's Widget.
pub const WIDGET_GROUP: &str = "sim.pko.test";

/// The Widget kind of the `fleet-widget` package.
pub fn widget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(WIDGET_GROUP, "v1", "Widget"),
        "widgets",
    )
}

/// Installs a namespaced Widget CRD in `group` (with a status subresource, so status writes leave the
/// generation alone) and waits until it is served.
pub async fn install_widget_crd(client: &Client, group: &str) -> Result<(), TestEnvError> {
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            }],
        },
    }))
    .map_err(|e| TestEnvError::Command {
        command: "Widget CRD".to_owned(),
        detail: e.to_string(),
    })?;
    crate::install_crds(client, &[crd]).await
}

/// Which workloads the simulator reports on, and how.
#[derive(Clone, Copy)]
enum Workload {
    Widgets,
    Deployments,
}

/// Reports the workloads in `namespaces` ready `lag` after each change, except those of a broken
/// (namespace, release): a Widget then says `Available=False` for its generation, a Deployment keeps
/// its old Pod and never gets all replicas updated.
pub struct WorkloadSimulator {
    broken: Arc<Mutex<BTreeSet<(String, String)>>>,
    namespaces: Arc<Mutex<BTreeSet<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl WorkloadSimulator {
    pub fn widgets(client: &Client, namespaces: BTreeSet<String>, lag: Duration) -> Self {
        Self::start(client, namespaces, Workload::Widgets, lag)
    }

    pub fn deployments(client: &Client, namespaces: BTreeSet<String>, lag: Duration) -> Self {
        Self::start(client, namespaces, Workload::Deployments, lag)
    }

    /// From now on, the workloads of `namespace` are reported on too (a HostedCluster that joined).
    pub fn add_namespace(&self, namespace: &str) {
        self.namespaces
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(namespace.to_owned());
    }

    /// From now on, `release` fails in `namespace`.
    pub fn break_release(&self, namespace: &str, release: &str) {
        self.broken
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert((namespace.to_owned(), release.to_owned()));
    }

    fn start(
        client: &Client,
        namespaces: BTreeSet<String>,
        workload: Workload,
        lag: Duration,
    ) -> Self {
        let broken: Arc<Mutex<BTreeSet<(String, String)>>> = Arc::default();
        let namespaces = Arc::new(Mutex::new(namespaces));
        let watched = namespaces.clone();
        let resource = match workload {
            Workload::Widgets => widget_resource(),
            Workload::Deployments => ApiResource::erase::<Deployment>(&()),
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let client = client.clone();
        let failing = broken.clone();
        let task = tokio::spawn(async move {
            // (namespace, name, UID, generation) already handled: an object deleted and made again
            // under its name starts over at generation 1.
            let mut handled: BTreeSet<(String, String, String, String)> = BTreeSet::new();
            let mut stream = watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = stream.next().await {
                let Ok(Event::Apply(o) | Event::InitApply(o)) = event else {
                    continue;
                };
                let Ok(object) = serde_json::to_value(&o) else {
                    continue;
                };
                let ns = o.metadata.namespace.clone().unwrap_or_default();
                let known = watched
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .contains(&ns);
                if !known {
                    continue;
                }
                let name = o.metadata.name.clone().unwrap_or_default();
                let (pending, release, version) = match workload {
                    Workload::Widgets => status_pending(&object, "/spec/release"),
                    Workload::Deployments => {
                        status_pending(&object, "/spec/template/metadata/annotations/release")
                    }
                };
                let uid = o.metadata.uid.clone().unwrap_or_default();
                if !pending || !handled.insert((ns.clone(), name.clone(), uid, version.clone())) {
                    continue;
                }
                let fails = failing
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .contains(&(ns.clone(), release.clone()));
                let client = client.clone();
                let resource = resource.clone();
                tokio::spawn(async move {
                    // The workload's own time to get ready: what the rollout has to wait for.
                    tokio::time::sleep(lag).await;
                    let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &resource);
                    let status = match workload {
                        Workload::Widgets => widget_status(&version, &release, fails),
                        Workload::Deployments => deployment_status(&version, fails),
                    };
                    report(&api, &name, &status).await;
                });
            }
        });
        Self {
            broken,
            namespaces,
            task,
        }
    }
}

/// How long a workload controller keeps trying to report a status the apiserver refused.
const REPORT_PATIENCE: Duration = Duration::from_secs(120);

/// Writes `status`, again after a failure (the apiserver restarting, say), as a workload's controller
/// would: each version is reported once, so a lost write would leave it unreported for good. An object
/// gone meanwhile is not reported on.
async fn report(api: &Api<DynamicObject>, name: &str, status: &Value) {
    let started = std::time::Instant::now();
    let mut pause = Duration::from_millis(250);
    loop {
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
            .await
        {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 404 => return,
            Err(_) if started.elapsed() >= REPORT_PATIENCE => return,
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(8));
            }
        }
    }
}

impl Drop for WorkloadSimulator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An object whose status is not for its generation: (pending, release at `release_path`, generation).
/// A Widget reports `observedGeneration` on its condition, a Deployment on its status.
fn status_pending(object: &Value, release_path: &str) -> (bool, String, String) {
    let generation = object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or_default();
    let on_condition = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Available" && c["observedGeneration"] == generation);
    let on_status = object.pointer("/status/observedGeneration") == Some(&json!(generation));
    let release = object
        .pointer(release_path)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    (!on_condition && !on_status, release, generation.to_string())
}

fn widget_status(generation: &str, release: &str, fails: bool) -> Value {
    let (status, reason, message) = if fails {
        (
            "False",
            "SimulatedFailure",
            format!("release {release} does not start"),
        )
    } else {
        ("True", "Ready", format!("release {release} is running"))
    };
    json!({"status": {"conditions": [{
        "type": "Available", "status": status, "reason": reason, "message": message,
        "observedGeneration": generation.parse::<i64>().unwrap_or_default(),
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }]}})
}

/// What the deployment controller reports for one replica: all on the new template, or, when the new
/// Pod never gets ready, the old Pod still serving beside it.
fn deployment_status(generation: &str, fails: bool) -> Value {
    let (replicas, updated) = if fails { (2, 1) } else { (1, 1) };
    json!({"status": {
        "observedGeneration": generation.parse::<i64>().unwrap_or_default(),
        "replicas": replicas, "updatedReplicas": updated, "readyReplicas": 1, "availableReplicas": 1,
        "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                        "message": "Deployment has minimum availability.",
                        "lastUpdateTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    }})
}

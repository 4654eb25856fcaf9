//! ObjectTemplate and ClusterObjectTemplate on the real apiserver: values copied from watched sources,
//! re-rendered when a source changes or appears, Invalid conditions naming the source or template
//! problem, and the templated object's conditions reported on the template.
#![allow(clippy::unwrap_used)]

mod common;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::Api;
use pko_proto::core::object_template::{ClusterObjectTemplate, ObjectTemplate};
use pko_testenv::wait_until;
use serde_json::{json, Value};

use common::*;

async fn create<K>(api: &Api<K>, value: Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    api.create(
        &PostParams::default(),
        &serde_json::from_value(value).unwrap(),
    )
    .await
    .unwrap();
}

fn template_api(client: &kube::Client, ns: Option<&str>) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(
            client.clone(),
            ns,
            &ApiResource::erase::<ObjectTemplate>(&()),
        ),
        None => Api::all_with(
            client.clone(),
            &ApiResource::erase::<ClusterObjectTemplate>(&()),
        ),
    }
}

async fn create_template(client: &kube::Client, ns: Option<&str>, name: &str, spec: Value) {
    let kind = if ns.is_some() {
        "ObjectTemplate"
    } else {
        "ClusterObjectTemplate"
    };
    create(
        &template_api(client, ns),
        json!({"apiVersion": "package-operator.run/v1alpha1", "kind": kind,
               "metadata": {"name": name}, "spec": spec}),
    )
    .await;
}

async fn wait_template(
    client: &kube::Client,
    ns: Option<&str>,
    name: &str,
    type_: &str,
    status: &str,
) -> (String, String) {
    wait_object_condition(&template_api(client, ns), name, type_, status, None).await
}

const APP_CONFIG: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: app-config
data:
  host: {{ .config.db.host | quote }}
  password: {{ .config.db.password | quote }}
  region: {{ index .config \"region\" | default \"none\" | quote }}
";

/// Reads a Secret's value as upstream hands it over (base64) and the environment.
const SECRET_AND_ENVIRONMENT: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: decoded
data:
  password: {{ .config.password | b64dec | quote }}
  encoded: {{ .config.password | quote }}
  kubernetes: {{ .environment.kubernetes.version | quote }}
";

#[tokio::test]
async fn templates_follow_their_sources() {
    let (client, ns) = setup("otpl").await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    create(
        &cms,
        json!({"metadata": {"name": "db"}, "data": {"host": "db-1.local"}}),
    )
    .await;
    create(
        &Api::<Secret>::namespaced(client.clone(), &ns),
        json!({"metadata": {"name": "db-creds"}, "stringData": {"password": "s3cret"}}),
    )
    .await;
    let spec = json!({
        "template": APP_CONFIG,
        "sources": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "db", "items": [{"key": ".data.host", "destination": ".db.host"}]},
            {"apiVersion": "v1", "kind": "Secret", "name": "db-creds", "items": [{"key": ".data.password", "destination": ".db.password"}]},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "region", "optional": true, "items": [{"key": ".data.name", "destination": ".region"}]},
        ],
    });
    create_template(&client, Some(&ns), "app", spec).await;
    let cm = wait_cm(&client, &ns, "app-config", |_| true).await;
    let data = cm.data.clone().unwrap();
    // Secret data arrives as the apiserver holds it, base64, as in Package Operator.
    assert_eq!(
        (
            data["host"].as_str(),
            data["password"].as_str(),
            data["region"].as_str()
        ),
        ("db-1.local", "czNjcmV0", "none")
    );
    let template = template_api(&client, Some(&ns)).get("app").await.unwrap();
    assert_eq!(controller_uid(&cm), template.metadata.uid);

    // Templates decode Secret values themselves and see the same `.environment` as a Package.
    let spec = json!({
        "template": SECRET_AND_ENVIRONMENT,
        "sources": [{"apiVersion": "v1", "kind": "Secret", "name": "db-creds", "items": [{"key": ".data.password", "destination": ".password"}]}],
    });
    create_template(&client, Some(&ns), "decoding", spec).await;
    let decoded = wait_cm(&client, &ns, "decoded", |_| true)
        .await
        .data
        .unwrap();
    assert_eq!(decoded["password"], "s3cret");
    assert_eq!(decoded["encoded"], "czNjcmV0");
    let version = client.apiserver_version().await.unwrap().git_version;
    assert_eq!(decoded["kubernetes"], version);

    // A source change and a late optional source both reach the object through their watches.
    patch_cm(&client, &ns, "db", json!({"data": {"host": "db-2.local"}})).await;
    wait_cm(&client, &ns, "app-config", |cm| {
        cm.data.as_ref().is_some_and(|d| d["host"] == "db-2.local")
    })
    .await;
    create(
        &cms,
        json!({"metadata": {"name": "region"}, "data": {"name": "eu-west"}}),
    )
    .await;
    wait_cm(&client, &ns, "app-config", |cm| {
        cm.data.as_ref().is_some_and(|d| d["region"] == "eu-west")
    })
    .await;
}

#[tokio::test]
async fn broken_templates_and_sources_are_invalid_until_fixed() {
    let (client, ns) = setup("otpl-invalid").await;
    let source = |name: &str, namespace: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "name": name, "namespace": namespace,
               "items": [{"key": ".data.host", "destination": ".db.host"}]})
    };
    create_template(
        &client,
        Some(&ns),
        "waits",
        json!({"template": APP_CONFIG, "sources": [source("later", "")]}),
    )
    .await;
    let (reason, message) = wait_template(&client, Some(&ns), "waits", "Invalid", "True").await;
    assert_eq!(reason, "SourceError");
    assert_eq!(
        message,
        format!("spec.sources[0]: core ConfigMap {ns}/later not found")
    );

    create_template(
        &client,
        Some(&ns),
        "foreign",
        json!({"template": APP_CONFIG, "sources": [source("x", "kube-system")]}),
    )
    .await;
    let (_, message) = wait_template(&client, Some(&ns), "foreign", "Invalid", "True").await;
    assert_eq!(message, format!("spec.sources[0]: namespace \"kube-system\" is not the ObjectTemplate's namespace \"{ns}\""));

    create_template(&client, Some(&ns), "typo", json!({"template": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: t\ndata:\n  a: {{ .config.nope }}\n", "sources": []})).await;
    let (reason, message) = wait_template(&client, Some(&ns), "typo", "Invalid", "True").await;
    assert_eq!(reason, "TemplateError");
    assert!(message.starts_with("spec.template: "), "{message}");
    assert!(message.contains("nope"), "{message}");

    // The missing source appears: the template renders and Invalid goes away.
    create(
        &Api::<ConfigMap>::namespaced(client.clone(), &ns),
        json!({"metadata": {"name": "later"}, "data": {"host": "h"}}),
    )
    .await;
    let patched =
        json!({"spec": {"template": APP_CONFIG.replace(".config.db.password", "\"none\"")}});
    template_api(&client, Some(&ns))
        .patch("waits", &PatchParams::default(), &Patch::Merge(&patched))
        .await
        .unwrap();
    wait_cm(&client, &ns, "app-config", |cm| {
        cm.data.as_ref().is_some_and(|d| d["host"] == "h")
    })
    .await;
    wait_until("Invalid removed", TIMEOUT, || async {
        let t = template_api(&client, Some(&ns))
            .get("waits")
            .await
            .map_err(|e| e.to_string())?;
        let conditions = t
            .data
            .pointer("/status/conditions")
            .cloned()
            .unwrap_or_default();
        let invalid = conditions
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Invalid"));
        if invalid {
            Err(conditions.to_string())
        } else {
            Ok(())
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn cluster_templates_read_any_namespace_and_report_object_conditions() {
    let (client, ns) = setup("cotpl").await;
    create(
        &Api::<ConfigMap>::namespaced(client.clone(), &ns),
        json!({"metadata": {"name": "settings"}, "data": {"greeting": "hello"}}),
    )
    .await;
    // The templated object is an ObjectSet the manager reconciles: its Available shows on the template.
    let template = format!(
        "apiVersion: package-operator.run/v1alpha1
kind: ObjectSet
metadata:
  name: templated
  namespace: {ns}
spec:
  phases:
  - name: main
    objects:
    - object:
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: greeting
        data:
          greeting: {{{{ .config.greeting | quote }}}}
"
    );
    let name = format!("{ns}-greeting");
    create_template(
        &client,
        None,
        &name,
        json!({"template": template, "sources": [
            {"apiVersion": "v1", "kind": "ConfigMap", "namespace": ns, "name": "settings",
             "items": [{"key": ".data.greeting", "destination": ".greeting"}]}]}),
    )
    .await;
    let cm = wait_cm(&client, &ns, "greeting", |_| true).await;
    assert_eq!(cm.data.unwrap()["greeting"], "hello");
    let (reason, _) = wait_template(&client, None, &name, "Available", "True").await;
    assert_eq!(reason, "Available");
}

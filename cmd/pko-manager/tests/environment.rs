//! `.environment` from what the cluster says about itself. In a binary of its own: the manager probes
//! those facts once for every render within 30 s (`actors::packages::cluster_facts`), so OpenShift's
//! objects must exist before this manager renders anything, and no other test of this binary may render
//! before them.
#![allow(clippy::unwrap_used)]

mod common;

use kube::api::PostParams;
use kube::Api;
use serde_json::json;

use common::packages::{create_package, push};
use common::*;

const MANIFEST: &str = "apiVersion: manifests.package-operator.run/v1alpha1
kind: PackageManifest
metadata:
  name: os-facts
spec:
  scopes: [Namespaced]
  phases:
  - name: config
";

fn openshift_crd(
    kind: &str,
    plural: &str,
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.config.openshift.io")},
        "spec": {
            "group": "config.openshift.io", "scope": "Cluster",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    }))
    .unwrap()
}

#[tokio::test]
async fn packages_on_openshift_see_its_version_managed_data_and_proxy() {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let (client, ns) = setup("pkg-openshift").await;
    pko_testenv::install_crds(
        &client,
        &[
            openshift_crd("ClusterVersion", "clusterversions"),
            openshift_crd("Proxy", "proxies"),
        ],
    )
    .await
    .unwrap();
    let create = |kind: &'static str, plural: &'static str, object: serde_json::Value| {
        let client = client.clone();
        async move {
            let resource = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("config.openshift.io", "v1", kind),
                plural,
            );
            let object: DynamicObject = serde_json::from_value(object).unwrap();
            Api::<DynamicObject>::all_with(client, &resource)
                .create(&PostParams::default(), &object)
                .await
                .unwrap();
        }
    };
    create("ClusterVersion", "clusterversions", json!({
        "apiVersion": "config.openshift.io/v1", "kind": "ClusterVersion", "metadata": {"name": "version"},
        "status": {"history": [{"state": "Partial", "version": "4.16.1"}, {"state": "Completed", "version": "4.15.9"}]},
    }))
    .await;
    create("Proxy", "proxies", json!({
        "apiVersion": "config.openshift.io/v1", "kind": "Proxy", "metadata": {"name": "cluster"},
        "status": {"httpsProxy": "http://proxy.internal:3128", "noProxy": ".cluster.local"},
    }))
    .await;
    let template = "apiVersion: v1
kind: ConfigMap
metadata:
  name: os-facts
  annotations:
    package-operator.run/phase: config
data:
  version: {{ .environment.openShift.version | quote }}
  https: {{ .environment.proxy.httpsProxy | quote }}
  noProxy: {{ .environment.proxy.noProxy | quote }}
";
    let image = push(
        "os-facts:v1",
        &[("manifest.yaml", MANIFEST), ("cm.yaml.gotmpl", template)],
    )
    .await;
    create_package(&client, &ns, "facts", &image, json!({})).await;
    let cm = wait_cm(&client, &ns, "os-facts", |_| true).await;
    let data = cm.data.unwrap();
    assert_eq!(data["version"], "4.15.9");
    assert_eq!(data["https"], "http://proxy.internal:3128");
    assert_eq!(data["noProxy"], ".cluster.local");
}

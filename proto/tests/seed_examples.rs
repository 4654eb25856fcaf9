//! On a real kube-apiserver: `kubectl apply -k deploy/crds/` installs every CRD, every seed example is
//! accepted as written (raw JSON, so the CRDs' own defaults apply) and reads back through the Rust types
//! equal to the example as the types see it; invalid specs are rejected with the field named.

#![allow(clippy::unwrap_used)] // tests fail loudly on the first unexpected error

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::Client;
use pko_proto::core::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

fn kubectl(args: &[&str]) -> Result<String, String> {
    let env = pko_testenv::shared().map_err(|error| error.to_string())?;
    let output = Command::new(pko_testenv::kubectl())
        .arg(format!(
            "--kubeconfig={}",
            env.management().kubeconfig_path().display()
        ))
        .args(args)
        .output()
        .map_err(|error| format!("kubectl: {error}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "kubectl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// Installs deploy/crds/ exactly as the README tells users to, once per test binary.
fn install_crds() {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
            let dir = dir.display().to_string();
            kubectl(&["apply", "-k", &dir])?;
            // `kubectl wait` takes no kustomization: every CRD of the (test) cluster.
            kubectl(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd",
                "--all",
            ])
            .map(|_| ())
        })
        .clone()
        .unwrap();
}

async fn client() -> Client {
    pko_testenv::shared()
        .unwrap()
        .management()
        .client()
        .await
        .unwrap()
}

fn without(mut value: Value, fields: &[&str]) -> Value {
    if let Some(object) = value.as_object_mut() {
        for field in fields {
            object.remove(*field);
        }
    }
    value
}

/// Creates `fixture` raw, writes its status if it has one, reads it back as `K`, and compares.
async fn round_trip<K>(client: &Client, namespace: &str, file: &str, mut fixture: Value)
where
    K: ApiKind + Serialize + DeserializeOwned,
{
    let resource = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = if K::INFO.namespaced {
        fixture["metadata"]["namespace"] = json!(namespace);
        Api::namespaced_with(client.clone(), namespace, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    };
    let name = fixture["metadata"]["name"].as_str().unwrap().to_owned();
    let status = fixture.as_object_mut().unwrap().remove("status");
    let object: DynamicObject = serde_json::from_value(fixture.clone()).unwrap();
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|error| panic!("{file}: apiserver rejected the example: {error}"));
    if let Some(status) = &status {
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap_or_else(|error| panic!("{file}: status rejected: {error}"));
    }

    let stored = serde_json::to_value(api.get(&name).await.unwrap()).unwrap();
    let read_back: K =
        serde_json::from_value(stored).unwrap_or_else(|error| panic!("{file}: {error}"));
    let read_back = serde_json::to_value(&read_back).unwrap();
    let expected: K = serde_json::from_value(fixture.clone()).unwrap();
    let expected = serde_json::to_value(&expected).unwrap();

    assert_eq!(
        without(read_back.clone(), &["metadata", "status"]),
        without(expected.clone(), &["metadata", "status"]),
        "{file}: stored object differs from the example"
    );
    for field in ["name", "namespace", "labels", "annotations"] {
        assert_eq!(
            read_back["metadata"].get(field),
            expected["metadata"].get(field),
            "{file}: metadata.{field}"
        );
    }
    match (&status, K::INFO.status_default_phase) {
        (Some(status), _) => common::contains(&read_back["status"], status, "status")
            .unwrap_or_else(|error| panic!("{file}: {error}")),
        (None, Some(phase)) => assert_eq!(
            read_back["status"],
            json!({"phase": phase}),
            "{file}: status default"
        ),
        (None, None) => assert!(
            read_back.get("status").is_none(),
            "{file}: unexpected status"
        ),
    }
}

#[tokio::test]
async fn every_seed_example_is_accepted_and_reads_back_equal() {
    install_crds();
    let client = client().await;
    let namespace = pko_testenv::shared()
        .unwrap()
        .management()
        .create_namespace("seeds")
        .await
        .unwrap();
    let mut created = 0;
    for (file, fixture) in common::seed_fixtures() {
        let kind = fixture["kind"].as_str().unwrap().to_owned();
        match kind.as_str() {
            "Package" => round_trip::<Package>(&client, &namespace, &file, fixture).await,
            "ClusterPackage" => {
                round_trip::<ClusterPackage>(&client, &namespace, &file, fixture).await
            }
            "ObjectDeployment" => {
                round_trip::<ObjectDeployment>(&client, &namespace, &file, fixture).await
            }
            "ClusterObjectDeployment" => {
                round_trip::<ClusterObjectDeployment>(&client, &namespace, &file, fixture).await
            }
            "ObjectSet" => round_trip::<ObjectSet>(&client, &namespace, &file, fixture).await,
            "ClusterObjectSet" => {
                round_trip::<ClusterObjectSet>(&client, &namespace, &file, fixture).await
            }
            "ObjectSetPhase" => {
                round_trip::<ObjectSetPhase>(&client, &namespace, &file, fixture).await
            }
            "ClusterObjectSetPhase" => {
                round_trip::<ClusterObjectSetPhase>(&client, &namespace, &file, fixture).await
            }
            "ObjectSlice" => round_trip::<ObjectSlice>(&client, &namespace, &file, fixture).await,
            "ClusterObjectSlice" => {
                round_trip::<ClusterObjectSlice>(&client, &namespace, &file, fixture).await
            }
            "ObjectTemplate" => {
                round_trip::<ObjectTemplate>(&client, &namespace, &file, fixture).await
            }
            "ClusterObjectTemplate" => {
                round_trip::<ClusterObjectTemplate>(&client, &namespace, &file, fixture).await
            }
            "HostedClusterPackage" => {
                round_trip::<HostedClusterPackage>(&client, &namespace, &file, fixture).await
            }
            // Package files, not cluster objects: covered by roundtrip.rs.
            "PackageManifest" | "PackageManifestLock" => continue,
            other => panic!("{file}: no type for kind {other}"),
        }
        created += 1;
    }
    assert_eq!(created, 18);
}

#[tokio::test]
async fn kubectl_shows_rollout_columns_for_hostedclusterpackages() {
    install_crds();
    let client = client().await;
    let api: Api<HostedClusterPackage> = Api::all(client);
    let package: HostedClusterPackage = serde_json::from_value(json!({
        "metadata": {"name": "columns"},
        "spec": {"template": {"spec": {"image": "registry/pkg:v2"}}},
    }))
    .unwrap();
    api.create(&PostParams::default(), &package).await.unwrap();
    api.patch_status(
        "columns",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "totalPackages": 7,
            "updatedPackages": 3,
            "unavailablePackages": 1,
            "failedPackages": 1,
            "conditions": [
                condition("Available", "True", "EnoughPackagesAvailable", "6/7 packages available."),
                condition("Progressing", "True", "NotAllPackagesProgressed", "3/7 packages progressed."),
                condition("HasPausedPackage", "False", "NoPackagePaused", "0/7 packages paused."),
            ],
        }})),
    )
    .await
    .unwrap();
    let table = kubectl(&["get", "hcpkg", "columns", "-o", "wide"]).unwrap();
    let mut lines = table.lines();
    let header: Vec<_> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "AVAILABLE",
            "PROGRESSING",
            "PAUSED",
            "UPDATED",
            "TOTAL",
            "UNAVAILABLE",
            "FAILED",
            "AGE",
            "IMAGE",
            "MESSAGE"
        ]
    );
    let row: Vec<_> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(row[..4], ["columns", "True", "True", "False"]);
    assert_eq!(row[4..8], ["3", "7", "1", "1"]);
    assert_eq!(
        row[9..],
        ["registry/pkg:v2", "3/7", "packages", "progressed."]
    );
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-11-22T10:00:00Z",
    })
}

/// Creates a raw HostedClusterPackage and returns the apiserver's error message.
async fn rejection(client: &Client, name: &str, spec: Value) -> String {
    let resource = ApiResource::erase::<HostedClusterPackage>(&());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1",
        "kind": "HostedClusterPackage",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap();
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => panic!("{name}: accepted an invalid spec"),
        Err(error) => error.to_string(),
    }
}

#[tokio::test]
async fn invalid_rollout_specs_are_rejected_naming_the_field() {
    install_crds();
    let client = client().await;
    let template = json!({"spec": {"image": "registry/pkg:v1"}});
    let cases = [
        (
            "zero-budget",
            json!({"template": template, "strategy": {"rollingUpgrade": {"maxUnavailable": 0}}}),
            "spec.strategy.rollingUpgrade.maxUnavailable",
        ),
        (
            "zero-percent",
            json!({"template": template, "strategy": {"rollingUpgrade": {"maxUnavailable": "0%"}}}),
            "spec.strategy.rollingUpgrade.maxUnavailable",
        ),
        (
            "two-strategies",
            json!({"template": template, "strategy": {"instant": {}, "rollingUpgrade": {}}}),
            "spec.strategy",
        ),
        (
            "empty-static",
            json!({"template": template, "partition": {"labelKey": "risk", "order": {"static": []}}}),
            "spec.partition.order",
        ),
        (
            "no-order-choice",
            json!({"template": template, "partition": {"labelKey": "risk", "order": {}}}),
            "spec.partition.order",
        ),
        (
            "bad-group-name",
            json!({"template": template, "partition": {"labelKey": "risk", "order": {"static": ["-early"]}}}),
            "spec.partition.order.static",
        ),
        (
            "duplicate-group",
            json!({"template": template, "partition": {"labelKey": "risk", "order": {"static": ["a", "a"]}}}),
            "spec.partition.order.static",
        ),
        (
            "empty-label-key",
            json!({"template": template, "partition": {"labelKey": ""}}),
            "spec.partition.labelKey",
        ),
        ("no-template", json!({}), "spec.template"),
    ];
    for (name, spec, field) in cases {
        let message = rejection(&client, name, spec).await;
        assert!(
            message.contains(field),
            "{name}: error does not name {field}: {message}"
        );
    }

    let resource = ApiResource::erase::<ObjectSet>(&());
    let namespace = pko_testenv::shared()
        .unwrap()
        .management()
        .create_namespace("invalid")
        .await
        .unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(client, &namespace, &resource);
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1",
        "kind": "ObjectSet",
        "metadata": {"name": "bad-protection"},
        "spec": {"phases": [{"name": "p", "objects": [{
            "collisionProtection": "Sometimes",
            "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
        }]}]},
    }))
    .unwrap();
    let message = api
        .create(&PostParams::default(), &object)
        .await
        .unwrap_err()
        .to_string();
    assert!(message.contains("collisionProtection"), "{message}");
}

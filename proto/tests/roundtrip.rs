//! Serde fidelity of every type, without a server: seed examples survive a trip through the Rust types,
//! raw objects and configuration are kept byte for byte, unknown enum values and unknown fields survive.

#![allow(clippy::unwrap_used)] // tests fail loudly on the first unexpected error

mod common;

use pko_proto::core::{CollisionProtection, LifecycleState, ObjectSetObject, Package, PackageSpec};
use pko_proto::hypershift::HostedCluster;
use pko_proto::manifests::{PackageManifest, PackageManifestScope};
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

fn through<T: DeserializeOwned + Serialize>(value: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|error| error.to_string())?;
    serde_json::to_value(&typed).map_err(|error| error.to_string())
}

/// The object parsed into its Rust type and serialized again.
pub fn through_type(value: &Value) -> Result<Value, String> {
    use pko_proto::core::*;
    use pko_proto::manifests::{PackageManifest, PackageManifestLock};
    match value["kind"].as_str().unwrap_or_default() {
        "Package" => through::<Package>(value),
        "ClusterPackage" => through::<ClusterPackage>(value),
        "ObjectDeployment" => through::<ObjectDeployment>(value),
        "ClusterObjectDeployment" => through::<ClusterObjectDeployment>(value),
        "ObjectSet" => through::<ObjectSet>(value),
        "ClusterObjectSet" => through::<ClusterObjectSet>(value),
        "ObjectSetPhase" => through::<ObjectSetPhase>(value),
        "ClusterObjectSetPhase" => through::<ClusterObjectSetPhase>(value),
        "ObjectSlice" => through::<ObjectSlice>(value),
        "ClusterObjectSlice" => through::<ClusterObjectSlice>(value),
        "ObjectTemplate" => through::<ObjectTemplate>(value),
        "ClusterObjectTemplate" => through::<ClusterObjectTemplate>(value),
        "HostedClusterPackage" => through::<HostedClusterPackage>(value),
        "PackageManifest" => through::<PackageManifest>(value),
        "PackageManifestLock" => through::<PackageManifestLock>(value),
        other => Err(format!("no type for kind {other:?}")),
    }
}

#[test]
fn every_seed_example_survives_its_type() {
    let fixtures = common::seed_fixtures();
    assert_eq!(
        fixtures.len(),
        20,
        "every example object of seeds 000, 001 and 004"
    );
    for (file, fixture) in fixtures {
        let once = through_type(&fixture).unwrap_or_else(|error| panic!("{file}: {error}"));
        common::contains(&once, &fixture, "")
            .unwrap_or_else(|error| panic!("{file} lost data: {error}"));
        let twice = through_type(&once).unwrap();
        assert_eq!(once, twice, "{file}: a second trip changed the object");
    }
}

#[test]
fn defaults_are_filled_as_the_crds_declare() {
    let package: pko_proto::core::HostedClusterPackage = serde_json::from_value(json!({
        "metadata": {"name": "x"},
        "spec": {"template": {}},
    }))
    .unwrap();
    assert_eq!(
        serde_json::to_value(&package.spec.strategy).unwrap(),
        json!({"instant": {}})
    );
    let object: ObjectSetObject =
        serde_json::from_value(json!({"object": {"kind": "ConfigMap"}})).unwrap();
    assert_eq!(object.collision_protection, CollisionProtection::Prevent);
    let set: pko_proto::core::ObjectSet = serde_json::from_value(json!({"spec": {}})).unwrap();
    assert_eq!(set.spec.lifecycle_state, LifecycleState::Active);
    let rolling: pko_proto::core::HostedClusterPackageStrategy =
        serde_json::from_value(json!({"rollingUpgrade": {}})).unwrap();
    assert_eq!(
        rolling.rolling_upgrade.unwrap().max_unavailable,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1)
    );
}

#[test]
fn kinds_serialize_their_api_version_and_kind() {
    let package = Package {
        spec: PackageSpec {
            image: "registry/pkg:v1".to_owned(),
            ..Default::default()
        },
        ..Default::default()
    };
    let value = serde_json::to_value(&package).unwrap();
    assert_eq!(value["apiVersion"], "package-operator.run/v1alpha1");
    assert_eq!(value["kind"], "Package");
    assert_eq!(value["spec"]["image"], "registry/pkg:v1");
    assert!(
        value.get("status").is_none(),
        "an absent status is not written"
    );
}

#[test]
fn later_manifest_spelling_loads_like_the_seed_spelling() {
    let seed: PackageManifest = serde_json::from_value(json!({
        "apiVersion": "manifests.package-operator.run/v1alpha1",
        "kind": "PackageManifest",
        "spec": {"conditionalFiltering": {
            "namedConditions": [{"name": "isProd", "expression": "true"}],
            "conditionalPaths": [{"glob": "prod/**", "expression": "cond.isProd"}],
        }},
    }))
    .unwrap();
    let later: PackageManifest = serde_json::from_value(json!({
        "apiVersion": "manifests.package-operator.run/v1alpha1",
        "kind": "PackageManifest",
        "spec": {"filter": {
            "conditions": [{"name": "isProd", "expression": "true"}],
            "paths": [{"glob": "prod/**", "expression": "cond.isProd"}],
        }},
    }))
    .unwrap();
    assert_eq!(seed, later);
    assert_eq!(
        later.spec.conditional_filtering.unwrap().named_conditions[0].name,
        "isProd"
    );
}

#[test]
fn manifest_fields_of_later_versions_are_kept() {
    let input = json!({
        "apiVersion": "manifests.package-operator.run/v1alpha1",
        "kind": "PackageManifest",
        "metadata": {"name": "x"},
        "spec": {
            "scopes": ["Namespaced", "Galactic"],
            "phases": [{"name": "deploy"}],
            "constraints": [{"platformVersion": {"name": "Kubernetes", "range": ">=1.20"}}],
        },
    });
    let manifest: PackageManifest = serde_json::from_value(input.clone()).unwrap();
    assert_eq!(manifest.spec.scopes[0], PackageManifestScope::Namespaced);
    assert_eq!(
        manifest.spec.scopes[1],
        PackageManifestScope::Unknown("Galactic".to_owned())
    );
    assert!(manifest.spec.other.contains_key("constraints"));
    assert_eq!(serde_json::to_value(&manifest).unwrap(), input);
}

#[test]
fn hosted_cluster_keeps_what_pko_does_not_read() {
    let input = json!({
        "apiVersion": "hypershift.openshift.io/v1beta1",
        "kind": "HostedCluster",
        "metadata": {"name": "my.cluster", "namespace": "clusters", "labels": {"risk": "early"}},
        "spec": {"platform": {"type": "AWS", "aws": {"region": "eu-west-1"}}, "release": {"image": "x"}},
        "status": {
            "conditions": [
                {"type": "Available", "status": "True"},
                {"type": "Degraded", "status": "False", "reason": "AsExpected", "message": "",
                 "observedGeneration": 3, "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ],
            "version": {"desired": {"image": "x"}},
            "kubeconfig": {"name": "admin-kubeconfig"},
        },
    });
    let cluster: HostedCluster = serde_json::from_value(input.clone()).unwrap();
    assert!(cluster.is_available());
    assert_eq!(
        cluster.hosted_control_plane_namespace().as_deref(),
        Some("clusters-my-cluster")
    );
    assert_eq!(serde_json::to_value(&cluster).unwrap(), input);

    let unavailable: HostedCluster = serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "n"},
        "status": {"conditions": [{"type": "Available", "status": "False"}]},
    }))
    .unwrap();
    assert!(!unavailable.is_available());
    assert!(!HostedCluster::default().is_available());
}

/// Arbitrary JSON, nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".*".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".*", inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn json_object() -> impl Strategy<Value = Value> {
    prop::collection::btree_map("[a-zA-Z][a-zA-Z0-9]{0,8}", json_value(), 0..8)
        .prop_map(|map| Value::Object(map.into_iter().collect()))
}

proptest! {
    #[test]
    fn embedded_objects_are_kept_verbatim(mut object in json_object()) {
        object["apiVersion"] = json!("v1");
        object["kind"] = json!("ConfigMap");
        let input = json!({"object": object, "collisionProtection": "IfNoController"});
        let typed: ObjectSetObject = serde_json::from_value(input.clone()).unwrap();
        prop_assert_eq!(serde_json::to_value(&typed).unwrap(), input);
    }

    #[test]
    fn package_config_is_kept_verbatim(config in json_object()) {
        let input = json!({"image": "registry/pkg:v1", "config": config});
        let typed: PackageSpec = serde_json::from_value(input.clone()).unwrap();
        prop_assert_eq!(serde_json::to_value(&typed).unwrap(), input);
    }

    #[test]
    fn enum_values_survive_whatever_they_are(value in ".*") {
        let typed: CollisionProtection = serde_json::from_value(json!(value)).unwrap();
        prop_assert_eq!(typed.is_known(), CollisionProtection::KNOWN.contains(&value.as_str()));
        prop_assert_eq!(serde_json::to_value(&typed).unwrap(), json!(value));
        let typed: LifecycleState = serde_json::from_value(json!(value)).unwrap();
        prop_assert_eq!(serde_json::to_value(&typed).unwrap(), json!(value));
    }

    #[test]
    fn hosted_cluster_status_fields_survive(extra in json_object()) {
        let mut status = extra;
        status["conditions"] = json!([{"type": "Available", "status": "True"}]);
        let input = json!({
            "apiVersion": "hypershift.openshift.io/v1beta1",
            "kind": "HostedCluster",
            "metadata": {"name": "c", "namespace": "n"},
            "status": status,
        });
        let cluster: HostedCluster = serde_json::from_value(input.clone()).unwrap();
        prop_assert_eq!(serde_json::to_value(&cluster).unwrap(), input);
    }
}

//! The part of HyperShift's `hostedclusters.hypershift.io/v1beta1` that pko reads: metadata and
//! `status.conditions`. Everything else is kept verbatim so a read-modify-write never drops fields.
//!
//! Conditions are read leniently (every field but `type` and `status` optional): HostedClusters are not
//! pko's objects, and one odd object must not break the watch over all of them.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// API group of HostedCluster.
pub const GROUP: &str = "hypershift.openshift.io";
/// API version of HostedCluster pko reads.
pub const VERSION: &str = "v1beta1";
/// Condition HyperShift sets when the hosted control plane is up.
pub const AVAILABLE: &str = "Available";

/// A HyperShift HostedCluster, reduced to what pko reads.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct HostedCluster {
    /// Standard object metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Kept verbatim; pko does not interpret it.
    #[serde(default)]
    pub spec: Option<Value>,
    /// Conditions plus every other status field, kept verbatim.
    #[serde(default)]
    pub status: Option<HostedClusterStatus>,
}

impl Serialize for HostedCluster {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("apiVersion", &format!("{GROUP}/{VERSION}"))?;
        map.serialize_entry("kind", "HostedCluster")?;
        map.serialize_entry("metadata", &self.metadata)?;
        if let Some(spec) = &self.spec {
            map.serialize_entry("spec", spec)?;
        }
        if let Some(status) = &self.status {
            map.serialize_entry("status", status)?;
        }
        map.end()
    }
}

/// HostedCluster status: the conditions pko reads, the rest kept.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostedClusterStatus {
    /// Conditions reported by HyperShift.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<HostedClusterCondition>,
    /// Every other status field.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A condition as HyperShift reports it, with only `type` and `status` required.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterCondition {
    /// Condition type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Machine-readable reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Generation the condition was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the status last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

impl HostedCluster {
    /// Whether HyperShift reports the hosted control plane Available=True.
    pub fn is_available(&self) -> bool {
        self.status.as_ref().is_some_and(|status| {
            status
                .conditions
                .iter()
                .any(|condition| condition.type_ == AVAILABLE && condition.status == "True")
        })
    }

    /// The namespace HyperShift runs this cluster's control plane in (see
    /// [`hosted_control_plane_namespace`]). `None` while the object has no name or namespace.
    pub fn hosted_control_plane_namespace(&self) -> Option<String> {
        let namespace = self.metadata.namespace.as_deref()?;
        let name = self.metadata.name.as_deref()?;
        Some(hosted_control_plane_namespace(namespace, name))
    }
}

/// Label HyperShift puts on every hosted control plane namespace it makes (value `"true"`; older releases
/// `""`). A namespace is an HCP namespace only with it: the name pattern alone is anyone's who may create
/// a HostedCluster of a matching name.
pub const CONTROL_PLANE_NAMESPACE_LABEL: &str = "hypershift.openshift.io/hosted-control-plane";

/// HyperShift's HCP namespace of the HostedCluster `namespace/name`: `<namespace>-<name>`, with dots in the
/// name replaced by dashes.
pub fn hosted_control_plane_namespace(namespace: &str, name: &str) -> String {
    format!("{namespace}-{}", name.replace('.', "-"))
}

impl kube::Resource for HostedCluster {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "HostedCluster".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "hostedclusters".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A stand-in for HyperShift's HostedCluster CRD, for environments without HyperShift (the local
/// environment and the tests): same group, version, kind and status subresource, every field kept.
pub fn stand_in_crd() -> Result<CustomResourceDefinition, serde_json::Error> {
    let preserved = json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true });
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("hostedclusters.{GROUP}") },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": "HostedCluster",
                "listKind": "HostedClusterList",
                "plural": "hostedclusters",
                "singular": "hostedcluster",
                "shortNames": ["hc", "hcs"],
            },
            "scope": "Namespaced",
            "versions": [{
                "name": VERSION,
                "served": true,
                "storage": true,
                "subresources": { "status": {} },
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "apiVersion": { "type": "string" },
                        "kind": { "type": "string" },
                        "metadata": { "type": "object" },
                        "spec": preserved,
                        "status": preserved,
                    },
                }},
                "additionalPrinterColumns": [
                    { "name": "Available", "type": "string",
                      "jsonPath": ".status.conditions[?(@.type==\"Available\")].status" },
                    { "name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp" },
                ],
            }],
        },
    }))
}

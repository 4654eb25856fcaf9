//! ObjectTemplate and ClusterObjectTemplate: one manifest templated from values of other objects.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::resource::{api_kind, condition_column, Column, KindInfo, AGE_COLUMN, PHASE_COLUMN};

/// Desired state of an ObjectTemplate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectTemplateSpec {
    /// Go template of one Kubernetes manifest.
    pub template: String,
    /// Objects the template's values come from.
    pub sources: Vec<ObjectTemplateSource>,
}

/// An object whose fields feed the template.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectTemplateSource {
    /// apiVersion of the source object.
    pub api_version: String,
    /// Kind of the source object.
    pub kind: String,
    /// Namespace of the source object (ObjectTemplate: must be its own namespace).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Name of the source object.
    pub name: String,
    /// Values copied from the source.
    pub items: Vec<ObjectTemplateSourceItem>,
    /// When true, the template is applied even while this source is missing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// One value copied from a source into the template context.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectTemplateSourceItem {
    /// JSONPath of the value in the source object.
    pub key: String,
    /// JSONPath where the value is stored in the template context.
    pub destination: String,
}

/// Observed state of an ObjectTemplate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectTemplateStatus {
    /// Conditions of the templated object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Summary for `kubectl get`; not an API contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

const OBJECT_TEMPLATE_COLUMNS: &[Column] = &[
    PHASE_COLUMN,
    condition_column(
        "Available",
        r#".status.conditions[?(@.type=="Available")].status"#,
    ),
    AGE_COLUMN,
];

api_kind! {
    /// Templates one object from values of objects in its own namespace.
    pub struct ObjectTemplate {
        pub spec: ObjectTemplateSpec,
    }
    status: ObjectTemplateStatus,
    scope: NamespaceResourceScope,
    info: KindInfo {
        group: crate::GROUP,
        kind: "ObjectTemplate",
        plural: "objecttemplates",
        namespaced: true,
        short_names: &["objtmpl"],
        columns: OBJECT_TEMPLATE_COLUMNS,
        status_default_phase: None,
    },
}

api_kind! {
    /// Templates one object from values of objects in any namespace.
    pub struct ClusterObjectTemplate {
        pub spec: ObjectTemplateSpec,
    }
    status: ObjectTemplateStatus,
    scope: ClusterResourceScope,
    info: KindInfo {
        group: crate::GROUP,
        kind: "ClusterObjectTemplate",
        plural: "clusterobjecttemplates",
        namespaced: false,
        short_names: &["clobjtmpl"],
        columns: OBJECT_TEMPLATE_COLUMNS,
        status_default_phase: None,
    },
}

//! ObjectDeployment and ClusterObjectDeployment: revisions of ObjectSets from one template.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{ControlledObjectReference, ObjectSetTemplate};
use super::resource::{
    api_kind, condition_column, integer_column, wide_column, Column, KindInfo, AGE_COLUMN,
    PHASE_COLUMN,
};

/// Desired state of an ObjectDeployment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectDeploymentSpec {
    /// Archived ObjectSets kept (default 10).
    #[serde(default = "default_revision_history_limit")]
    #[schemars(extend("default" = 10))]
    pub revision_history_limit: i32,
    /// Selects the ObjectSets this deployment manages.
    pub selector: LabelSelector,
    /// Template of new ObjectSets.
    pub template: ObjectSetTemplate,
    /// Stops rolling out: no new revisions, revisions paused (status still reported). Not in the seed API;
    /// Package Operator added it later, and Packages pause through it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

impl Default for ObjectDeploymentSpec {
    fn default() -> Self {
        Self {
            revision_history_limit: default_revision_history_limit(),
            selector: LabelSelector::default(),
            template: ObjectSetTemplate::default(),
            paused: false,
        }
    }
}

fn default_revision_history_limit() -> i32 {
    10
}

/// Observed state of an ObjectDeployment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectDeploymentStatus {
    /// Available, Progressing, Paused and mapped conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Summary for `kubectl get`; not an API contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Hash collisions seen; part of the template hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collision_count: Option<i32>,
    /// Hash of the current template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_hash: Option<String>,
    /// Revision of the newest ObjectSet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// The (Cluster)ObjectSets this deployment controls, oldest revision first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub controller_of: Vec<ControlledObjectReference>,
}

const OBJECT_DEPLOYMENT_COLUMNS: &[Column] = &[
    PHASE_COLUMN,
    condition_column(
        "Available",
        r#".status.conditions[?(@.type=="Available")].status"#,
    ),
    condition_column(
        "Progressing",
        r#".status.conditions[?(@.type=="Progressing")].status"#,
    ),
    integer_column("Revision", ".status.revision"),
    wide_column("Hash", ".status.templateHash"),
    AGE_COLUMN,
];

api_kind! {
    /// Rolls a template out as successive ObjectSet revisions in one namespace.
    pub struct ObjectDeployment {
        pub spec: ObjectDeploymentSpec,
    }
    status: ObjectDeploymentStatus,
    scope: NamespaceResourceScope,
    info: KindInfo {
        group: crate::GROUP,
        kind: "ObjectDeployment",
        plural: "objectdeployments",
        namespaced: true,
        short_names: &["objdeploy", "od"],
        columns: OBJECT_DEPLOYMENT_COLUMNS,
        status_default_phase: Some("Pending"),
    },
}

api_kind! {
    /// Rolls a template out as successive ClusterObjectSet revisions.
    pub struct ClusterObjectDeployment {
        pub spec: ObjectDeploymentSpec,
    }
    status: ObjectDeploymentStatus,
    scope: ClusterResourceScope,
    info: KindInfo {
        group: crate::GROUP,
        kind: "ClusterObjectDeployment",
        plural: "clusterobjectdeployments",
        namespaced: false,
        short_names: &["clobjdeploy", "clod"],
        columns: OBJECT_DEPLOYMENT_COLUMNS,
        status_default_phase: Some("Pending"),
    },
}

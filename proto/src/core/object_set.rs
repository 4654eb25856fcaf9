//! ObjectSet and ClusterObjectSet: one revision of objects, reconciled phase by phase.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    ControlledObjectReference, LifecycleState, ObjectSetTemplateSpec, PreviousRevisionReference,
    RemotePhaseReference,
};
use super::resource::{
    api_kind, condition_column, integer_column, wide_column, Column, KindInfo, AGE_COLUMN,
    PHASE_COLUMN,
};

/// Desired state of an ObjectSet. Everything but `lifecycleState` is fixed at creation: the apiserver
/// refuses a change by the CRD's rules (upstream's), `revision` may only be added to a set without one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "(has(self.previous) == has(oldSelf.previous)) && (!has(self.previous) || (self.previous == oldSelf.previous))", "message": "previous is immutable"},
    {"rule": "(has(self.phases) == has(oldSelf.phases)) && (!has(self.phases) || (self.phases == oldSelf.phases))", "message": "phases is immutable"},
    {"rule": "(has(self.availabilityProbes) == has(oldSelf.availabilityProbes)) && (!has(self.availabilityProbes) || (self.availabilityProbes == oldSelf.availabilityProbes))", "message": "availabilityProbes is immutable"},
    {"rule": "(has(self.successDelaySeconds) == has(oldSelf.successDelaySeconds)) && (!has(self.successDelaySeconds) || (self.successDelaySeconds == oldSelf.successDelaySeconds))", "message": "successDelaySeconds is immutable"},
    {"rule": "!has(oldSelf.revision) || (self.revision == oldSelf.revision)", "message": "revision is immutable"},
]))]
pub struct ObjectSetSpec {
    /// Active, Paused or Archived (default Active).
    #[serde(default)]
    #[schemars(extend("default" = "Active"))]
    pub lifecycle_state: LifecycleState,
    /// Revisions whose objects this one may adopt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous: Vec<PreviousRevisionReference>,
    /// Revision number, as later Package Operator versions put it in the spec (the seeds keep only
    /// `status.revision`). When set it is the set's revision, and `status.revision` equals it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// Phases, probes and success delay.
    #[serde(flatten)]
    pub template: ObjectSetTemplateSpec,
}

/// Observed state of an ObjectSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectSetStatus {
    /// Available, Succeeded, InTransition, Paused, Archived and mapped conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Summary for `kubectl get`; not an API contract.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Revision number, monotonically increasing.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    pub revision: i64,
    /// ObjectSetPhases this set delegated phases to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_phases: Vec<RemotePhaseReference>,
    /// Objects this set controls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub controller_of: Vec<ControlledObjectReference>,
}

const OBJECT_SET_COLUMNS: &[Column] = &[
    PHASE_COLUMN,
    condition_column(
        "Available",
        r#".status.conditions[?(@.type=="Available")].status"#,
    ),
    condition_column(
        "Succeeded",
        r#".status.conditions[?(@.type=="Succeeded")].status"#,
    ),
    integer_column("Revision", ".status.revision"),
    wide_column("Lifecycle", ".spec.lifecycleState"),
    AGE_COLUMN,
];

api_kind! {
    /// One revision of objects in a namespace, reconciled phase by phase.
    pub struct ObjectSet {
        pub spec: ObjectSetSpec,
    }
    status: ObjectSetStatus,
    scope: NamespaceResourceScope,
    info: KindInfo {
        group: crate::GROUP,
        kind: "ObjectSet",
        plural: "objectsets",
        namespaced: true,
        short_names: &["objset", "os"],
        columns: OBJECT_SET_COLUMNS,
        status_default_phase: Some("Pending"),
    },
}

api_kind! {
    /// One revision of cluster-scoped (and any-namespace) objects, reconciled phase by phase.
    pub struct ClusterObjectSet {
        pub spec: ObjectSetSpec,
    }
    status: ObjectSetStatus,
    scope: ClusterResourceScope,
    info: KindInfo {
        group: crate::GROUP,
        kind: "ClusterObjectSet",
        plural: "clusterobjectsets",
        namespaced: false,
        short_names: &["clobjset", "clos"],
        columns: OBJECT_SET_COLUMNS,
        status_default_phase: Some("Pending"),
    },
}

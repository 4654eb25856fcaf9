//! ObjectSetPhase and ClusterObjectSetPhase: one phase delegated to the controller of its class.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    ControlledObjectReference, ObjectSetObject, ObjectSetProbe, PreviousRevisionReference,
};
use super::resource::{api_kind, condition_column, integer_column, Column, KindInfo, AGE_COLUMN};

/// Desired state of an ObjectSetPhase. Everything but `paused` is fixed at creation; the CRD's rules
/// (upstream's) make the apiserver refuse a change.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.revision == oldSelf.revision", "message": "revision is immutable"},
    {"rule": "(has(self.previous) == has(oldSelf.previous)) && (!has(self.previous) || (self.previous == oldSelf.previous))", "message": "previous is immutable"},
    {"rule": "(has(self.availabilityProbes) == has(oldSelf.availabilityProbes)) && (!has(self.availabilityProbes) || (self.availabilityProbes == oldSelf.availabilityProbes))", "message": "availabilityProbes is immutable"},
    {"rule": "(has(self.objects) == has(oldSelf.objects)) && (!has(self.objects) || (self.objects == oldSelf.objects))", "message": "objects is immutable"},
]))]
pub struct ObjectSetPhaseSpec {
    /// When true, only status is reported; objects are not written.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Revision of the parent ObjectSet, used for adoption.
    pub revision: i64,
    /// Previous revisions whose objects may be adopted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous: Vec<PreviousRevisionReference>,
    /// Probes of the parent ObjectSet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub availability_probes: Vec<ObjectSetProbe>,
    /// Objects of the phase.
    pub objects: Vec<ObjectSetObject>,
    /// Objects observed but not written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external_objects: Vec<ObjectSetObject>,
}

/// Observed state of an ObjectSetPhase.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectSetPhaseStatus {
    /// Available and Paused conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Objects this phase controls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub controller_of: Vec<ControlledObjectReference>,
}

const OBJECT_SET_PHASE_COLUMNS: &[Column] = &[
    Column {
        name: "Class",
        type_: "string",
        json_path: r#".metadata.labels.package-operator\.run/phase-class"#,
        priority: 0,
    },
    condition_column(
        "Available",
        r#".status.conditions[?(@.type=="Available")].status"#,
    ),
    condition_column(
        "Paused",
        r#".status.conditions[?(@.type=="Paused")].status"#,
    ),
    integer_column("Revision", ".spec.revision"),
    AGE_COLUMN,
];

api_kind! {
    /// A phase of an ObjectSet delegated to the controller of its class.
    pub struct ObjectSetPhase {
        pub spec: ObjectSetPhaseSpec,
    }
    status: ObjectSetPhaseStatus,
    scope: NamespaceResourceScope,
    info: KindInfo {
        group: crate::GROUP,
        kind: "ObjectSetPhase",
        plural: "objectsetphases",
        namespaced: true,
        short_names: &["objsetphase", "osp"],
        columns: OBJECT_SET_PHASE_COLUMNS,
        status_default_phase: None,
    },
}

api_kind! {
    /// A phase of a ClusterObjectSet delegated to the controller of its class.
    pub struct ClusterObjectSetPhase {
        pub spec: ObjectSetPhaseSpec,
    }
    status: ObjectSetPhaseStatus,
    scope: ClusterResourceScope,
    info: KindInfo {
        group: crate::GROUP,
        kind: "ClusterObjectSetPhase",
        plural: "clusterobjectsetphases",
        namespaced: false,
        short_names: &["clobjsetphase", "closp"],
        columns: OBJECT_SET_PHASE_COLUMNS,
        status_default_phase: None,
    },
}

//! Building blocks shared by ObjectSet, ObjectSetPhase, ObjectDeployment, ObjectSlice and their Cluster
//! variants: phases, objects, probes, condition mappings and references.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::string_enum::string_enum;

string_enum! {
    /// Which existing objects a revision may adopt (`collisionProtection`, default `Prevent`).
    CollisionProtection, default = Prevent {
        /// Adopt only objects controlled by a revision listed in `previous`.
        Prevent = "Prevent",
        /// Also adopt objects that have no controller.
        IfNoController = "IfNoController",
        /// Adopt any object.
        None = "None",
    }
}

string_enum! {
    /// Lifecycle of an ObjectSet (`spec.lifecycleState`, default `Active`).
    LifecycleState, default = Active {
        /// Reconcile objects.
        Active = "Active",
        /// Report status only; write nothing.
        Paused = "Paused",
        /// Tear objects down in reverse phase order and stop reporting.
        Archived = "Archived",
    }
}

/// An object that is part of a phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectSetObject {
    /// The complete object, kept verbatim (any kind, any fields).
    #[schemars(schema_with = "crate::schema::embedded_object")]
    pub object: serde_json::Value,
    /// Which existing objects this revision may adopt.
    #[serde(default)]
    pub collision_protection: CollisionProtection,
    /// Copies conditions of this object into the owning Package Operator objects.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub condition_mappings: Vec<ConditionMapping>,
}

/// Maps one condition type of an object to a condition type on its owner.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConditionMapping {
    /// Condition type on the object.
    pub source_type: String,
    /// Condition type reported on the owner (`domain/Type`).
    pub destination_type: String,
}

/// One reconcile phase of an ObjectSet or ObjectDeployment template.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectSetTemplatePhase {
    /// Unique within the ObjectSet.
    pub name: String,
    /// When set, the phase is delegated through an ObjectSetPhase of this class (`default`,
    /// `hosted-cluster`, or an out-of-tree controller's class).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub class: String,
    /// Objects applied by this phase.
    #[serde(default)]
    pub objects: Vec<ObjectSetObject>,
    /// Objects observed (probed) but never written by this phase.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external_objects: Vec<ObjectSetObject>,
    /// Names of ObjectSlices holding further objects of this phase.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<String>,
}

/// The revision-independent content of an ObjectSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectSetTemplateSpec {
    /// Phases, reconciled strictly in order; each phase's probes gate the next.
    #[serde(default)]
    pub phases: Vec<ObjectSetTemplatePhase>,
    /// Probes every object must pass for the set to be Available.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub availability_probes: Vec<ObjectSetProbe>,
    /// How long Available must hold before the set is Succeeded.
    #[serde(default, skip_serializing_if = "crate::schema::is_default")]
    pub success_delay_seconds: i32,
}

/// Template ObjectDeployments create ObjectSets from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectSetTemplate {
    /// Labels and annotations given to each ObjectSet.
    #[serde(default)]
    #[schemars(schema_with = "crate::schema::template_object_meta")]
    pub metadata: ObjectMeta,
    /// The ObjectSet content.
    pub spec: ObjectSetTemplateSpec,
}

/// Probes applied to the objects a selector matches.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectSetProbe {
    /// Probes every selected object must pass.
    pub probes: Vec<Probe>,
    /// Which objects the probes apply to.
    pub selector: ProbeSelector,
}

/// Selects objects by kind and, optionally, labels.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeSelector {
    /// API group and kind of the probed objects.
    pub kind: PackageProbeKindSpec,
    /// Further narrows the selection by labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// API group and kind a probe applies to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PackageProbeKindSpec {
    /// API group (empty for the core group).
    pub group: String,
    /// Kind.
    pub kind: String,
}

/// One probe; exactly one of its fields is meant to be set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    /// The object reports a condition with this type and status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<ProbeConditionSpec>,
    /// Two fields of the object are equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields_equal: Option<ProbeFieldsEqualSpec>,
    /// A CEL rule over the object (`self`) is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cel: Option<ProbeCelSpec>,
}

/// Condition probe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeConditionSpec {
    /// Condition type.
    #[serde(rename = "type")]
    pub type_: String,
    /// Expected status (default `"True"`).
    #[serde(default = "condition_status_true")]
    #[schemars(extend("default" = "True"))]
    pub status: String,
}

impl Default for ProbeConditionSpec {
    fn default() -> Self {
        Self {
            type_: String::new(),
            status: condition_status_true(),
        }
    }
}

fn condition_status_true() -> String {
    "True".to_owned()
}

/// Field-equality probe; paths are dotted (`.spec.fieldA`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeFieldsEqualSpec {
    /// First field.
    pub field_a: String,
    /// Second field.
    pub field_b: String,
}

/// CEL probe.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeCelSpec {
    /// Boolean CEL expression over `self`.
    pub rule: String,
    /// Reported when the rule is false.
    pub message: String,
}

/// A previous revision whose objects this one may adopt.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreviousRevisionReference {
    /// ObjectSet (or ClusterObjectSet) name.
    pub name: String,
}

/// An ObjectSetPhase a phase was delegated to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemotePhaseReference {
    /// ObjectSetPhase name.
    pub name: String,
    /// ObjectSetPhase UID.
    pub uid: String,
}

/// An object controlled by an ObjectSet or ObjectSetPhase.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlledObjectReference {
    /// Kind.
    pub kind: String,
    /// API group (empty for the core group).
    pub group: String,
    /// Name.
    pub name: String,
    /// Namespace (empty for cluster-scoped objects).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
}

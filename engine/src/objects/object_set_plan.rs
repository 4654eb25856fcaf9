//! Planning an ObjectSet: from its spec (with slice contents resolved) to one [`PhasePlan`] per phase, or
//! the first problem in the spec, named by field. Pure; the actor fetches slices and previous revisions
//! and hands the set over as a [`SetToPlan`].

use pko_proto::well_known::{
    HOSTED_CLUSTER_PHASE_CLASS, PHASE_CLASS_LABEL, SERVICE_ACCOUNT_ANNOTATION, SHARD_OWNER_LABEL,
    TRACE_PARENT_ANNOTATION,
};
use std::collections::BTreeMap;
use std::sync::Arc;

use pko_proto::core::common::{
    CollisionProtection, LifecycleState, ObjectSetObject, ObjectSetProbe, ObjectSetTemplatePhase,
    PackageProbeKindSpec, Probe, ProbeConditionSpec, ProbeSelector,
};
use serde_json::json;

use pko_proto::core::object_set::ObjectSetSpec;

use crate::objects::desired_object::{
    find_duplicate, prepare_phase, DesiredObject, InvalidObject, OwnerRef,
};
use crate::objects::phase_plan::PhasePlan;
use crate::objects::probe::{ProbeSet, ProbeSpecError};

/// What planning reads of a set (an ObjectSet, ClusterObjectSet or ObjectSetPhase).
#[derive(Debug, Clone)]
pub struct SetToPlan<'a> {
    /// The set as the owner of its objects (its name, UID, kind and namespace).
    pub owner: OwnerRef,
    /// The kind its delegated phases get: `ObjectSetPhase` or `ClusterObjectSetPhase`.
    pub phase_kind: &'static str,
    pub spec: &'a ObjectSetSpec,
    /// The trace parent of the write that made this version, which its ObjectSetPhases carry on.
    pub traceparent: Option<&'a str>,
    /// The ServiceAccount the set's objects are applied as, when it names one.
    pub service_account: Option<&'a str>,
}

/// Why a set cannot be planned; shown as `PreflightError` on the set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Object(#[from] InvalidObject),
    #[error(transparent)]
    Probe(#[from] ProbeSpecError),
    #[error("spec.phases[{index}].name: phase name {name:?} is used twice")]
    DuplicatePhase { index: usize, name: String },
}

/// Inputs the actor gathered for planning.
#[derive(Debug, Clone, Default)]
pub struct PlanInputs {
    pub revision: i64,
    pub previous_uids: Vec<String>,
    /// Objects of each referenced ObjectSlice, by slice name.
    pub slices: BTreeMap<String, Vec<ObjectSetObject>>,
    /// Sharded: the replica working on the set, which its ObjectSetPhases are labelled for from the start.
    pub shard_owner: Option<String>,
}

/// The objects of a phase: its own plus those of its slices, in order.
fn phase_objects(
    phase: &ObjectSetTemplatePhase,
    slices: &BTreeMap<String, Vec<ObjectSetObject>>,
) -> Vec<ObjectSetObject> {
    let mut objects = phase.objects.clone();
    for name in &phase.slices {
        if let Some(more) = slices.get(name) {
            objects.extend(more.iter().cloned());
        }
    }
    objects
}

/// Name of the ObjectSetPhase a phase is delegated to.
pub fn phase_object_name(set: &str, phase: &str) -> String {
    format!("{set}-{phase}")
}

/// The ObjectSetPhase carrying a delegated phase: its objects (slices inlined), every availability probe of
/// the set, revision, previous and the pause flag.
fn phase_object(
    set: &SetToPlan<'_>,
    phase: &ObjectSetTemplatePhase,
    objects: &[ObjectSetObject],
    inputs: &PlanInputs,
) -> serde_json::Value {
    let revision = inputs.revision;
    let mut object = json!({
        "apiVersion": format!("{}/{}", pko_proto::GROUP, pko_proto::VERSION),
        "kind": set.phase_kind,
        "metadata": {
            "name": phase_object_name(&set.owner.name, &phase.name),
            "labels": { PHASE_CLASS_LABEL: phase.class },
        },
        "spec": {
            "paused": set.spec.lifecycle_state == LifecycleState::Paused,
            "revision": revision,
            "previous": set.spec.previous,
            "availabilityProbes": set.spec.template.availability_probes,
            "objects": objects,
            "externalObjects": phase.external_objects,
        },
    });
    // The phase's own reconciler (a connector's, through the remote phase actor) continues the trace of
    // the write that made this set: the set's annotation is stable, so the ObjectSetPhase is not
    // rewritten for it.
    if let Some(traceparent) = set.traceparent {
        object["metadata"]["annotations"] = json!({ TRACE_PARENT_ANNOTATION: traceparent });
    }
    if let Some(owner) = &inputs.shard_owner {
        object["metadata"]["labels"][SHARD_OWNER_LABEL] = owner.as_str().into();
    }
    // A default-class ObjectSetPhase applies with the set's identity.
    if let Some(account) = set.service_account {
        object["metadata"]["annotations"][SERVICE_ACCOUNT_ANNOTATION] = account.into();
    }
    object
}

/// A delegated phase is available when its ObjectSetPhase reports Available for its current generation.
fn delegated_probe(set: &SetToPlan<'_>) -> Arc<ProbeSet> {
    let probe = ObjectSetProbe {
        probes: vec![Probe {
            condition: Some(ProbeConditionSpec {
                type_: "Available".into(),
                status: "True".into(),
            }),
            ..Probe::default()
        }],
        selector: ProbeSelector {
            kind: PackageProbeKindSpec {
                group: pko_proto::GROUP.into(),
                kind: set.phase_kind.into(),
            },
            selector: None,
        },
    };
    // A fixed, valid probe: compilation cannot fail.
    Arc::new(ProbeSet::compile(&[probe], "delegated phase").unwrap_or_else(|_| ProbeSet::empty()))
}

/// Plans every phase of `set`.
pub fn plan_object_set(
    set: &SetToPlan<'_>,
    inputs: &PlanInputs,
) -> Result<Vec<PhasePlan>, PlanError> {
    let probes = Arc::new(ProbeSet::compile(
        &set.spec.template.availability_probes,
        "spec.availabilityProbes",
    )?);
    let owner = set.owner.clone();
    let mut names = BTreeMap::new();
    let mut plans = Vec::with_capacity(set.spec.template.phases.len());
    for (index, phase) in set.spec.template.phases.iter().enumerate() {
        if names.insert(phase.name.clone(), index).is_some() {
            return Err(PlanError::DuplicatePhase {
                index,
                name: phase.name.clone(),
            });
        }
        let field = format!("spec.phases[{index}]");
        let objects = phase_objects(phase, &inputs.slices);
        // Validated here even when delegated: a broken object fails the set, not some other controller.
        // Hosted-cluster objects are checked as the connector will prepare them (any namespace).
        let validation_owner = OwnerRef {
            remote: phase.class == HOSTED_CLUSTER_PHASE_CLASS,
            ..owner.clone()
        };
        let prepared = prepare_phase(
            &validation_owner,
            inputs.revision,
            &field,
            &objects,
            &phase.external_objects,
        )?;
        let plan = if phase.class.is_empty() {
            PhasePlan {
                name: phase.name.clone(),
                objects: prepared,
                probes: probes.clone(),
                owner_uid: owner.uid.clone(),
                revision: inputs.revision,
                previous_uids: inputs.previous_uids.clone(),
                delegated: false,
            }
        } else {
            let delegate = ObjectSetObject {
                object: phase_object(set, phase, &objects, inputs),
                collision_protection: CollisionProtection::Prevent,
                condition_mappings: Vec::new(),
            };
            PhasePlan {
                name: phase.name.clone(),
                objects: prepare_phase(&owner, inputs.revision, &field, &[delegate], &[])?,
                probes: delegated_probe(set),
                owner_uid: owner.uid.clone(),
                revision: inputs.revision,
                previous_uids: inputs.previous_uids.clone(),
                delegated: true,
            }
        };
        plans.push(plan);
    }
    let fields: Vec<(String, &DesiredObject)> = plans
        .iter()
        .enumerate()
        .flat_map(|(pi, p)| {
            p.objects
                .iter()
                .enumerate()
                .map(move |(oi, o)| (format!("spec.phases[{pi}].objects[{oi}]"), o))
        })
        .collect();
    find_duplicate(fields.iter().map(|(f, o)| (f.as_str(), *o)))?;
    Ok(plans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_proto::core::object_set::ObjectSet;

    /// An ObjectSet `s` in `ns` with these phases.
    fn set(phases: serde_json::Value) -> ObjectSet {
        serde_json::from_value(json!({
            "apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSet",
            "metadata": {"name": "s", "namespace": "ns", "uid": "u1"},
            "spec": {"phases": phases},
        }))
        .unwrap()
    }

    fn plan(set: &ObjectSet, inputs: &PlanInputs) -> Result<Vec<PhasePlan>, PlanError> {
        let to_plan = SetToPlan {
            owner: OwnerRef {
                api_version: "package-operator.run/v1alpha1".into(),
                kind: "ObjectSet".into(),
                name: "s".into(),
                uid: "u1".into(),
                namespace: Some("ns".into()),
                remote: false,
            },
            phase_kind: "ObjectSetPhase",
            spec: &set.spec,
            traceparent: None,
            service_account: None,
        };
        plan_object_set(&to_plan, inputs)
    }

    fn cm(name: &str) -> serde_json::Value {
        json!({"object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}})
    }

    #[test]
    fn delegated_phase_becomes_an_object_set_phase() {
        let s = set(json!([
            {"name": "a", "objects": [cm("x")]},
            {"name": "b", "class": "default", "objects": [cm("y")], "slices": ["more"]},
        ]));
        let mut inputs = PlanInputs {
            revision: 4,
            ..Default::default()
        };
        inputs.slices.insert(
            "more".into(),
            vec![serde_json::from_value(cm("z")).unwrap()],
        );
        let plans = plan(&s, &inputs).unwrap();
        assert!(!plans[0].delegated);
        assert!(plans[1].delegated);
        let phase = &plans[1].objects[0];
        assert_eq!(phase.key.kind, "ObjectSetPhase");
        assert_eq!(phase.key.name, "s-b");
        assert_eq!(
            phase.object["metadata"]["labels"][PHASE_CLASS_LABEL],
            "default"
        );
        assert_eq!(phase.object["metadata"]["ownerReferences"][0]["uid"], "u1");
        assert_eq!(phase.object["spec"]["revision"], 4);
        let names: Vec<&str> = phase.object["spec"]["objects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["object"]["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["y", "z"], "slice objects are inlined");
    }

    #[test]
    fn hosted_cluster_objects_may_name_any_namespace() {
        let hosted = json!({"object": {"apiVersion": "v1", "kind": "ConfigMap",
                                       "metadata": {"name": "c", "namespace": "openshift-config"}}});
        let s = set(json!([{"name": "a", "class": "hosted-cluster", "objects": [hosted.clone()]}]));
        let plans = plan(&s, &PlanInputs::default()).unwrap();
        assert!(plans[0].delegated);
        let local = set(json!([{"name": "a", "objects": [hosted]}]));
        let err = plan(&local, &PlanInputs::default()).unwrap_err();
        assert!(
            err.to_string().contains("outside the owner's namespace"),
            "{err}"
        );
    }

    #[test]
    fn spec_problems_are_named() {
        let dup = set(json!([{"name": "a", "objects": [cm("x")]}, {"name": "a", "objects": []}]));
        assert_eq!(
            plan(&dup, &PlanInputs::default()).unwrap_err(),
            PlanError::DuplicatePhase {
                index: 1,
                name: "a".into()
            }
        );
        let twice =
            set(json!([{"name": "a", "objects": [cm("x")]}, {"name": "b", "objects": [cm("x")]}]));
        let err = plan(&twice, &PlanInputs::default()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("spec.phases[1].objects[0]: duplicates spec.phases[0].objects[0]"),
            "{err}"
        );
    }
}

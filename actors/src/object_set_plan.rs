//! Planning an ObjectSet: from its spec (with slice contents resolved) to one [`PhasePlan`] per phase, or
//! the first problem in the spec, named by field. Pure; the actor fetches slices and previous revisions.

use std::collections::BTreeMap;
use std::sync::Arc;

use pko_proto::core::common::{ObjectSetObject, ObjectSetTemplatePhase};

use crate::engine::desired_object::{find_duplicate, prepare_phase, DesiredObject, InvalidObject};
use crate::engine::probe::{ProbeSet, ProbeSpecError};
use crate::phase_runner::PhasePlan;
use crate::set_object::SetObject;

/// Why a set cannot be planned; shown as `PreflightError` on the set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Object(#[from] InvalidObject),
    #[error(transparent)]
    Probe(#[from] ProbeSpecError),
    #[error("spec.phases[{index}].name: phase name {name:?} is used twice")]
    DuplicatePhase { index: usize, name: String },
    #[error("spec.phases[{index}].class: {class:?}: delegated phases are not handled by this manager yet")]
    UnsupportedClass { index: usize, class: String },
}

/// Inputs the actor gathered for planning.
#[derive(Debug, Clone, Default)]
pub struct PlanInputs {
    pub revision: i64,
    pub previous_uids: Vec<String>,
    /// Objects of each referenced ObjectSlice, by slice name.
    pub slices: BTreeMap<String, Vec<ObjectSetObject>>,
}

/// The objects of a phase: its own plus those of its slices, in order.
fn phase_objects(phase: &ObjectSetTemplatePhase, slices: &BTreeMap<String, Vec<ObjectSetObject>>) -> Vec<ObjectSetObject> {
    let mut objects = phase.objects.clone();
    for name in &phase.slices {
        if let Some(more) = slices.get(name) {
            objects.extend(more.iter().cloned());
        }
    }
    objects
}

/// Plans every phase of `set`.
pub fn plan_object_set(set: &SetObject, inputs: &PlanInputs) -> Result<Vec<PhasePlan>, PlanError> {
    let probes = Arc::new(ProbeSet::compile(
        &set.spec.template.availability_probes,
        "spec.availabilityProbes",
    )?);
    let owner = set.owner();
    let mut names = BTreeMap::new();
    let mut plans = Vec::with_capacity(set.spec.template.phases.len());
    for (index, phase) in set.spec.template.phases.iter().enumerate() {
        if names.insert(phase.name.clone(), index).is_some() {
            return Err(PlanError::DuplicatePhase { index, name: phase.name.clone() });
        }
        if !phase.class.is_empty() {
            return Err(PlanError::UnsupportedClass { index, class: phase.class.clone() });
        }
        let objects = phase_objects(phase, &inputs.slices);
        let prepared = prepare_phase(
            &owner,
            inputs.revision,
            &format!("spec.phases[{index}]"),
            &objects,
            &phase.external_objects,
        )?;
        plans.push(PhasePlan {
            name: phase.name.clone(),
            objects: prepared,
            probes: probes.clone(),
            owner_uid: owner.uid.clone(),
            revision: inputs.revision,
            previous_uids: inputs.previous_uids.clone(),
        });
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

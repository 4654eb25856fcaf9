//! What planning an ObjectSet reads before the pure planner (`object_set_plan`) runs: whose rights it
//! applies with, its previous revisions (from the watch-fed index where it has them, else read), the
//! phases of previous revisions a delegated phase adopts from, and its slices. A failure names the
//! input and says whether a retry can mend it.

use pko_proto::well_known::PHASE_CLASS_LABEL;
use std::collections::{BTreeMap, HashSet};

use kube::api::ListParams;
use serde_json::Value;

use crate::engine::objects::adoption::revision_of;
use crate::engine::objects::apply_identity::ApplyIdentity;
use crate::engine::objects::object_set_plan::{plan_object_set, PlanInputs};
use crate::engine::objects::phase_plan::PhasePlan;
use crate::manager::context::ManagerContext;
use crate::objects::applier::Applier;
use crate::objects::owner_identity::owner_applier;
use crate::objects::revision_index::PreviousRevision;
use crate::objects::set_object::SetObject;
use crate::runtime::meta_view::MetaView;
use crate::runtime::object_actor::ReconcileError;

/// Looks up previous revisions (UIDs and revision numbers; `indexed` holds those the watch-fed index
/// had, the rest are read) and slices, then plans the set: the planned generation, its revision number
/// and the phases' plans.
pub async fn gather_plan(
    context: ManagerContext,
    set: SetObject,
    indexed: BTreeMap<String, PreviousRevision>,
    shard_owner: Option<String>,
) -> Result<GatheredPlan, ReconcileError> {
    let client = context.runtime.client.clone();
    let namespace = set.kind.is_namespaced().then(|| set.namespace().to_owned());
    let (identity, applier) = owner_applier(&context, namespace.as_deref(), &set.meta).await?;
    let api = set
        .kind
        .revision_kind()
        .api(client.clone(), set.namespace());
    let mut inputs = PlanInputs {
        shard_owner,
        ..PlanInputs::default()
    };
    let mut highest_previous = 0;
    for previous in &set.spec.previous {
        if let Some(p) = indexed.get(&previous.name) {
            inputs.previous_uids.extend(p.uid.clone());
            highest_previous = highest_previous.max(p.status_revision);
            continue;
        }
        match api.get_opt(&previous.name).await {
            Ok(Some(p)) => {
                if let Some(uid) = p.metadata.uid.clone() {
                    inputs.previous_uids.push(uid);
                }
                let value = serde_json::to_value(&p).unwrap_or(Value::Null);
                let rev = value
                    .pointer("/status/revision")
                    .and_then(Value::as_i64)
                    .unwrap_or_default();
                highest_previous = highest_previous.max(rev);
            }
            Ok(None) => {}
            Err(e) => {
                return Err(ReconcileError::Failed(format!(
                    "reading previous revision {:?}: {e}",
                    previous.name
                )))
            }
        }
    }
    if set.delegated_phase_name().is_some() && !inputs.previous_uids.is_empty() {
        // A delegated phase adopts from every phase of a previous revision, not only the one of its own
        // name: an object may move between phases from one revision to the next.
        let phases = set
            .kind
            .phase_kind()
            .api(client.clone(), set.namespace())
            .list(&ListParams::default().labels(PHASE_CLASS_LABEL))
            .await
            .map_err(|e| ReconcileError::Failed(format!("listing previous phases: {e}")))?;
        let previous_sets: HashSet<String> = inputs.previous_uids.iter().cloned().collect();
        inputs
            .previous_uids
            .extend(phases.items.into_iter().filter_map(|phase| {
                let controlled_by_previous = phase
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|r| r.controller == Some(true) && previous_sets.contains(&r.uid));
                phase.metadata.uid.filter(|_| controlled_by_previous)
            }));
    }
    for (index, phase) in set.spec.template.phases.iter().enumerate() {
        for name in &phase.slices {
            match set.use_slice(client.clone(), name).await {
                Ok(Some(objects)) => {
                    inputs.slices.insert(name.clone(), objects);
                }
                Ok(None) => {
                    return Err(ReconcileError::Failed(format!(
                        "spec.phases[{index}].slices: slice {name:?} not found"
                    )));
                }
                Err(e) => {
                    return Err(ReconcileError::Failed(format!(
                        "reading slice {name:?}: {e}"
                    )))
                }
            }
        }
    }
    let annotated = set
        .meta
        .annotations
        .as_ref()
        .and_then(|a| revision_of(&serde_json::json!({"metadata": {"annotations": a}})));
    inputs.revision = match (set.status.revision, annotated) {
        _ if set.given_revision.is_some() => set.given_revision.unwrap_or_default(),
        (r, _) if r > 0 => r,
        (_, Some(r)) if r > 0 => r,
        _ => highest_previous + 1,
    };
    // A spec error stays until the spec changes (the error policy retries it only then).
    let plans = plan_object_set(&set.to_plan(), &inputs)
        .map_err(|e| ReconcileError::Spec(e.to_string()))?;
    Ok(GatheredPlan {
        generation: set.generation(),
        revision: inputs.revision,
        plans,
        identity,
        applier,
    })
}

/// What planning a set gathered: its phases' plans, and whose rights they are applied with.
pub struct GatheredPlan {
    pub generation: i64,
    pub revision: i64,
    pub plans: Vec<PhasePlan>,
    pub identity: ApplyIdentity,
    pub applier: Applier,
}

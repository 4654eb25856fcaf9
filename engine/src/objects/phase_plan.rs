//! What a phase is asked to do and what it answers, as plain data: the plan derived from its owner's
//! spec (objects, probes, owner and revision), the report of one run (progress, the objects it controls,
//! mapped conditions) and of one teardown pass. The manager's phase actors and the hosted-cluster
//! connector exchange these; the runner that produces them is `actors/src/objects/phase_runner.rs`.

use std::sync::Arc;

use pko_proto::core::common::ControlledObjectReference;

use crate::objects::desired_object::DesiredObject;
use crate::objects::object_ref::ObjectKey;
use crate::objects::object_set_status::{MappedCondition, PhaseProgress};
use crate::objects::probe::ProbeSet;

/// Everything needed to reconcile one phase, derived from the owner's spec.
#[derive(Debug, Clone)]
pub struct PhasePlan {
    pub name: String,
    pub objects: Vec<DesiredObject>,
    pub probes: Arc<ProbeSet>,
    pub owner_uid: String,
    pub revision: i64,
    pub previous_uids: Vec<String>,
    /// The phase's only object is the ObjectSetPhase it was delegated to.
    pub delegated: bool,
}

/// What one reconcile of a phase found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhaseReport {
    pub progress: PhaseProgress,
    /// Managed objects this owner controls after the run, with their UIDs.
    pub controlled: Vec<(ObjectKey, String)>,
    /// A delegated phase: the objects its ObjectSetPhase reports controlling (its `status.controllerOf`),
    /// which the set lists as its own, as upstream does.
    pub phase_controls: Vec<ControlledObjectReference>,
    pub mapped: Vec<MappedCondition>,
    /// Set when a failure may go away by itself (apiserver unavailable, conflict): retry with backoff.
    pub transient_error: bool,
}

/// Result of one teardown pass over a phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeardownReport {
    /// Objects this owner still controls (deletion requested, not yet observed gone).
    pub remaining: Vec<ObjectKey>,
    pub errors: Vec<String>,
}

impl TeardownReport {
    pub fn complete(&self) -> bool {
        self.remaining.is_empty() && self.errors.is_empty()
    }
}

/// What one phase command ended with: a run's report, or a teardown pass's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PhaseOutcome {
    Reconciled(PhaseReport),
    TornDown(TeardownReport),
}

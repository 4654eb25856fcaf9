//! Hosted-cluster phases between the wire and the phase engine: an [`ApplyPhase`] or [`TeardownPhase`]
//! becomes the [`PhasePlan`] a connector runs against its hosted cluster (objects owned through the owners
//! annotation, since their ObjectSetPhase lives in the management cluster); a run becomes the
//! [`PhaseReport`] sent back; a report becomes the [`PhaseProgress`] the manager records on the
//! ObjectSetPhase.
//!
//! Pure: no NATS, no apiserver.

use std::sync::Arc;

use pko_proto::connector_wire::{
    ApplyPhase, MappedCondition as WireCondition, PhaseOutcome as WireOutcome, PhaseRef,
    PhaseReport, TeardownPhase, WIRE_VERSION,
};
use pko_proto::core::common::ControlledObjectReference;
use pko_proto::core::object_set_phase::ObjectSetPhase;
use pko_proto::{GROUP, VERSION};

use crate::objects::desired_object::{prepare_phase, OwnerRef};
use crate::objects::object_set_plan::PlanError;
use crate::objects::object_set_status::{BlockReason, MappedCondition, PhaseProgress};
use crate::objects::phase_plan::PhaseOutcome;
use crate::objects::phase_plan::PhasePlan;
use crate::objects::probe::ProbeSet;

/// The ObjectSetPhase a hosted object belongs to, as its owners annotation records it.
fn owner_of(phase: &PhaseRef) -> OwnerRef {
    OwnerRef {
        api_version: format!("{GROUP}/{VERSION}"),
        kind: <ObjectSetPhase as kube::Resource>::kind(&()).into_owned(),
        name: phase.name.clone(),
        uid: phase.uid.clone(),
        namespace: Some(phase.namespace.clone()),
        remote: true,
    }
}

/// The plan a connector runs for an apply request; errors name the ObjectSetPhase's field.
pub fn plan_apply(request: &ApplyPhase) -> Result<PhasePlan, PlanError> {
    let probes = ProbeSet::compile(&request.availability_probes, "spec.availabilityProbes")?;
    Ok(PhasePlan {
        name: request.phase.name.clone(),
        objects: prepare_phase(
            &owner_of(&request.phase),
            request.revision,
            "spec",
            &request.objects,
            &request.external_objects,
        )?,
        probes: Arc::new(probes),
        owner_uid: request.phase.uid.clone(),
        revision: request.revision,
        previous_uids: request.previous_uids.clone(),
        delegated: false,
    })
}

/// The plan a connector tears down: only which objects, and who must control them to be deleted.
pub fn plan_teardown(request: &TeardownPhase) -> Result<PhasePlan, PlanError> {
    Ok(PhasePlan {
        name: request.phase.name.clone(),
        objects: prepare_phase(&owner_of(&request.phase), 0, "spec", &request.objects, &[])?,
        probes: Arc::new(ProbeSet::empty()),
        owner_uid: request.phase.uid.clone(),
        revision: 0,
        previous_uids: Vec::new(),
        delegated: false,
    })
}

/// A report refusing a request before anything ran (its plan was invalid).
pub fn refused(phase: &PhaseRef, error: &PlanError) -> PhaseReport {
    PhaseReport {
        version: WIRE_VERSION,
        phase: phase.clone(),
        outcome: WireOutcome::PreflightError,
        message: error.to_string(),
        controller_of: Vec::new(),
        mapped_conditions: Vec::new(),
    }
}

/// What a connector reports after running a phase.
pub fn report_of_run(phase: &PhaseRef, outcome: &PhaseOutcome) -> PhaseReport {
    let mut mapped_conditions = Vec::new();
    let (outcome, message, controlled) = match outcome {
        PhaseOutcome::Reconciled(report) => {
            let (outcome, message) = match &report.progress {
                PhaseProgress::Available => (WireOutcome::Available, String::new()),
                PhaseProgress::Blocked { reason, message } => {
                    let outcome = match reason {
                        BlockReason::CollisionDetected => WireOutcome::CollisionDetected,
                        BlockReason::HandedOver => WireOutcome::HandedOver,
                        BlockReason::PreflightError => WireOutcome::PreflightError,
                        BlockReason::AwaitingStatus => WireOutcome::AwaitingStatus,
                        // A connector's own phases are never undeliverable to it.
                        BlockReason::ProbeFailure
                        | BlockReason::PhaseNotReported
                        | BlockReason::AwaitingReport
                        | BlockReason::TooLarge => WireOutcome::ProbeFailure,
                    };
                    (outcome, message.clone())
                }
            };
            mapped_conditions = report
                .mapped
                .iter()
                .map(|m| WireCondition {
                    type_: m.type_.clone(),
                    status: m.status,
                    reason: m.reason.clone(),
                    message: m.message.clone(),
                })
                .collect();
            let controlled = report
                .controlled
                .iter()
                .map(|(key, _)| ControlledObjectReference {
                    kind: key.kind.clone(),
                    group: key.group.clone(),
                    name: key.name.clone(),
                    namespace: key.namespace.clone(),
                })
                .collect();
            (outcome, message, controlled)
        }
        PhaseOutcome::TornDown(teardown) if teardown.complete() => {
            (WireOutcome::TornDown, String::new(), Vec::new())
        }
        PhaseOutcome::TornDown(teardown) => {
            let mut waiting: Vec<String> =
                teardown.remaining.iter().map(ToString::to_string).collect();
            waiting.extend(teardown.errors.iter().cloned());
            (
                WireOutcome::TeardownInProgress,
                format!("waiting for: {}", waiting.join("; ")),
                Vec::new(),
            )
        }
    };
    PhaseReport {
        version: WIRE_VERSION,
        phase: phase.clone(),
        outcome,
        message,
        controller_of: controlled,
        mapped_conditions,
    }
}

/// The conditions a report carries from hosted objects, as the manager records them.
pub fn mapped_of_report(report: &PhaseReport) -> Vec<MappedCondition> {
    report
        .mapped_conditions
        .iter()
        // Bounded again here: the report comes from another process.
        .map(|m| MappedCondition::bounded(&m.type_, m.status, &m.reason, &m.message))
        .collect()
}

/// Where the manager records a phase stands, from the connector's report.
pub fn progress_of_report(report: &PhaseReport) -> PhaseProgress {
    let reason = match report.outcome {
        WireOutcome::Available => return PhaseProgress::Available,
        WireOutcome::ProbeFailure => BlockReason::ProbeFailure,
        WireOutcome::AwaitingStatus => BlockReason::AwaitingStatus,
        WireOutcome::CollisionDetected => BlockReason::CollisionDetected,
        WireOutcome::HandedOver => BlockReason::HandedOver,
        WireOutcome::PreflightError => BlockReason::PreflightError,
        // A teardown report says nothing about availability: the phase is not there.
        WireOutcome::TeardownInProgress | WireOutcome::TornDown => BlockReason::PhaseNotReported,
    };
    PhaseProgress::Blocked {
        reason,
        // The connector's text, passed on into the set's conditions and up to the fleet.
        message: crate::conditions::foreign_text(&report.message),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pko_proto::well_known::OWNERS_ANNOTATION;

    use crate::objects::object_ref::ObjectKey;
    use crate::objects::phase_plan::PhaseOutcome as RunOutcome;
    use crate::objects::phase_plan::{PhaseReport as RunReport, TeardownReport};
    use pko_proto::core::common::ObjectSetObject;
    use serde_json::json;

    fn phase() -> PhaseRef {
        PhaseRef {
            namespace: "clusters-a".into(),
            name: "pkg-1-rbac".into(),
            uid: "phase-uid".into(),
            generation: 1,
        }
    }

    fn apply(objects: Vec<serde_json::Value>) -> ApplyPhase {
        ApplyPhase {
            version: WIRE_VERSION,
            phase: phase(),
            revision: 4,
            objects: objects
                .into_iter()
                .map(|object| ObjectSetObject {
                    object,
                    ..Default::default()
                })
                .collect(),
            previous_uids: vec!["old-phase".into()],
            ..Default::default()
        }
    }

    #[test]
    fn apply_requests_plan_annotation_owned_objects() {
        let request = apply(vec![json!({"apiVersion": "v1", "kind": "Namespace",
                                        "metadata": {"name": "app"}})]);
        let plan = plan_apply(&request).unwrap();
        assert_eq!(plan.owner_uid, "phase-uid");
        assert_eq!(plan.previous_uids, vec!["old-phase".to_owned()]);
        let owners = plan.objects[0].object["metadata"]["annotations"][OWNERS_ANNOTATION]
            .as_str()
            .unwrap();
        assert!(owners.contains("\"kind\":\"ObjectSetPhase\""), "{owners}");
        assert!(owners.contains("\"namespace\":\"clusters-a\""), "{owners}");
        assert!(plan.objects[0].object["metadata"]
            .get("ownerReferences")
            .is_none());

        let bad = apply(vec![
            json!({"kind": "Namespace", "metadata": {"name": "x"}}),
        ]);
        let report = refused(&bad.phase, &plan_apply(&bad).unwrap_err());
        assert_eq!(report.outcome, WireOutcome::PreflightError);
        assert_eq!(
            report.message,
            "spec.objects[0].object.apiVersion: is required"
        );
    }

    #[test]
    fn runs_become_reports_and_reports_become_progress() {
        let key = ObjectKey::of(&json!({"apiVersion": "v1", "kind": "ConfigMap",
                                         "metadata": {"name": "c", "namespace": "app"}}))
        .unwrap();
        let blocked = RunOutcome::Reconciled(RunReport {
            progress: PhaseProgress::Blocked {
                reason: BlockReason::ProbeFailure,
                message: "ConfigMap app/c: not ready".into(),
            },
            controlled: vec![(key.clone(), "obj-uid".into())],
            phase_controls: Vec::new(),
            mapped: vec![MappedCondition {
                type_: "hosted/Ready".into(),
                status: false,
                reason: "Starting".into(),
                message: "2 of 3 up".into(),
            }],
            transient_error: false,
        });
        let report = report_of_run(&phase(), &blocked);
        assert_eq!(report.outcome, WireOutcome::ProbeFailure);
        assert_eq!(report.controller_of[0].name, "c");
        let RunOutcome::Reconciled(run) = &blocked else {
            unreachable!()
        };
        assert_eq!(mapped_of_report(&report), run.mapped);
        assert_eq!(
            progress_of_report(&report),
            PhaseProgress::Blocked {
                reason: BlockReason::ProbeFailure,
                message: "ConfigMap app/c: not ready".into()
            }
        );

        let pending = PhaseOutcome::TornDown(TeardownReport {
            remaining: vec![key],
            errors: Vec::new(),
        });
        let report = report_of_run(&phase(), &pending);
        assert_eq!(report.outcome, WireOutcome::TeardownInProgress);
        assert!(report.message.contains("app/c"), "{}", report.message);
        let done = PhaseOutcome::TornDown(TeardownReport {
            remaining: Vec::new(),
            errors: Vec::new(),
        });
        assert_eq!(
            report_of_run(&phase(), &done).outcome,
            WireOutcome::TornDown
        );
    }
}

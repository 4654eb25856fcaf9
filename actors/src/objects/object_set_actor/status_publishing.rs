//! The set's status, as its actor publishes it: what the phases reported (in phase order, up to the
//! first one not available), the conditions the engine derives from that, the objects the phases control,
//! and the write itself, done only when the status changes and checked for being overtaken by an older
//! write landing late.

use actix::prelude::*;
use k8s_openapi::jiff::Timestamp;
use pko_proto::core::common::{ControlledObjectReference, LifecycleState, RemotePhaseReference};
use pko_proto::core::object_set::ObjectSetStatus;
use tracing::{info_span, warn, Instrument};

use super::ObjectSetActor;
use crate::engine::objects::object_set_status::{
    object_set_conditions, PhaseProgress, SetObservation,
};
use crate::objects::set_object::SetObject;
use crate::runtime::meta_view::MetaView;

impl ObjectSetActor {
    fn observation(&self, set: &SetObject) -> SetObservation {
        let mut phases = Vec::new();
        let mut mapped = Vec::new();
        for phase in &self.state.phases {
            let Some(report) = &phase.report else { break };
            phases.push((phase.name.clone(), report.progress.clone()));
            mapped.extend(report.mapped.iter().cloned());
            if report.progress != PhaseProgress::Available {
                break;
            }
        }
        SetObservation {
            lifecycle: self.lifecycle(),
            generation: set.generation(),
            phases,
            total_phases: self.state.phases.len(),
            success_delay_seconds: set.spec.template.success_delay_seconds,
            teardown_complete: self.state.phases.iter().all(|p| p.torn_down),
            plan_error: self.state.plan_error.clone(),
            mapped,
        }
    }

    pub(super) fn publish_status(&mut self, ctx: &mut Context<Self>) {
        let Some(set) = self.object.clone() else {
            return;
        };
        let decision = object_set_conditions(
            &set.status.conditions,
            &self.observation(&set),
            Timestamp::now(),
        );
        if let Some(handle) = self.state.success_timer.take() {
            ctx.cancel_future(handle);
        }
        if let Some(handle) = self.state.archival_report.take() {
            ctx.cancel_future(handle);
        }
        if let Some(after) = decision.recheck_after {
            self.state.success_timer =
                Some(ctx.run_later(after, |act, ctx| act.publish_status(ctx)));
        }
        let reports = || {
            self.state
                .phases
                .iter()
                .filter_map(|p| p.report.as_ref().map(|r| (p.delegated, r)))
        };
        // Inline phases' objects, and what delegated phases' ObjectSetPhases control, in phase order.
        let mut controller_of: Vec<ControlledObjectReference> = reports()
            .flat_map(|(delegated, r)| {
                let inline = r
                    .controlled
                    .iter()
                    .filter(move |_| !delegated)
                    .map(|(k, _)| ControlledObjectReference {
                        kind: k.kind.clone(),
                        group: k.group.clone(),
                        name: k.name.clone(),
                        namespace: k.namespace.clone(),
                    });
                inline.chain(r.phase_controls.iter().cloned())
            })
            .collect();
        if self.lifecycle() == LifecycleState::Archived {
            controller_of.clear();
        }
        let remote_phases = reports()
            .filter(|(delegated, _)| *delegated)
            .flat_map(|(_, r)| r.controlled.iter())
            .map(|(k, uid)| RemotePhaseReference {
                name: k.name.clone(),
                uid: uid.clone(),
            })
            .collect();
        let status = set.kind.status_view(ObjectSetStatus {
            conditions: decision.conditions,
            phase: Some(decision.phase.to_owned()),
            revision: self.state.revision,
            remote_phases,
            controller_of,
        });
        self.state.published = Some(status.clone());
        if status == set.status {
            return;
        }
        self.write_status(status, ctx);
    }

    pub(super) fn write_status(&mut self, status: ObjectSetStatus, ctx: &mut Context<Self>) {
        let Some(set) = self.object.as_mut() else {
            return;
        };
        set.status = status.clone();
        let set = set.clone();
        let client = self.context.runtime.client.clone();
        let span = info_span!(
            "write_status",
            kind = set.kind.kind(),
            namespace = set.namespace(),
            name = set.name()
        );
        let write = async move {
            if let Err(e) = set.write_status(client, &status).await {
                warn!(error = %e, "status write failed");
            }
        };
        self.spawn_write(ctx, write.instrument(span).into_actor(self));
    }
}

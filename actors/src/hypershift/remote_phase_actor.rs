//! The remote phase actor: one per ObjectSetPhase of class `hosted-cluster`. It sends the phase to the
//! connector of its HCP namespace over NATS and records the connector's answer as the ObjectSetPhase's
//! status, where the owning ObjectSet's phase gate reads it. When the connector cannot be reached the
//! status says so (never Available). A finalizer, set before the first apply, keeps the ObjectSetPhase
//! until the connector has torn its hosted objects down, or until the teardown is given up: at once when
//! the HostedCluster is gone, or after the link's teardown timeout without a connector.
//!
//! Requests are idempotent (the connector skips unchanged objects), so every trigger simply re-sends the
//! desired phase: a change of the ObjectSetPhase, a report the connector pushed, the connector's hello
//! after a (re)connect, and a retry after a failure. Replies are the only reports recorded, which keeps
//! them in order.

use pko_proto::well_known::HOSTED_TEARDOWN_FINALIZER;
use std::time::{Duration, Instant};

use actix::prelude::*;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType};
use pko_proto::connector_wire::{
    ApplyPhase, ErrorCode, HostedClusterSubjects, PhaseOutcome, PhaseRef, PhaseReport, Reply,
    TeardownPhase, WireError, WIRE_VERSION,
};
use pko_proto::core::common::LifecycleState;
use pko_proto::core::object_set::ObjectSetStatus;
use tracing::{info_span, warn, Instrument};

use crate::engine::hypershift::hosted_phase::{mapped_of_report, progress_of_report};
use crate::engine::hypershift::hosted_teardown::{after_unanswered_teardown, SkipReason};
use crate::engine::objects::object_set_plan::phase_object_name;
use crate::engine::objects::object_set_status::{
    object_set_conditions, BlockReason, PhaseProgress, SetObservation,
};
use crate::hypershift::connector_link::LinkError;
use crate::hypershift::hosted_leftovers::{self, leftover_request};
use crate::manager::context::ManagerContext;
use crate::objects::object_meta::event_reference;
use crate::objects::set_object::SetObject;
use crate::runtime::meta_view::MetaView;
use crate::runtime::object_actor::{
    work, Action, Change, ObjectActor, Reconcile, ReconcileError, Work,
};
use crate::runtime::reconcile_gate::Backoff;
use pko_proto::well_known::HOSTED_CLUSTER_PHASE_CLASS;

/// Re-send the phase: the connector pushed a report or said hello (limited by the connector hub).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Resend;

/// Wait before writing a status again whose write failed.
const STATUS_RETRY: Duration = Duration::from_secs(1);

/// What one exchange with the connector gave.
enum Exchange {
    Reported(PhaseReport),
    /// The phase could not be delivered or was refused; the message says why.
    Undelivered(String),
    /// The phase is larger than a NATS message may be: it cannot be delivered until its spec changes.
    TooLarge(String),
    /// The hosted objects are gone and the finalizer released.
    Released,
    /// The ObjectSetPhase changed while it was being written (a newer version is on its way); nothing to
    /// report.
    Stale,
}

/// The remote phase controller's own state.
#[derive(Default)]
pub struct RemotePhaseController {
    last: Option<Exchange>,
    /// Since when teardown requests of the deleted phase went unanswered.
    unanswered_since: Option<Instant>,
    /// UIDs of the previous revisions' phases, read once per generation rather than on every re-send.
    previous_uids: Option<(i64, Vec<String>)>,
}

pub type RemotePhaseActor = ObjectActor<RemotePhaseController>;

impl Reconcile for RemotePhaseController {
    type Shared = ManagerContext;
    type Object = SetObject;
    type Reported = ();
    const CONTROLLER: &'static str = "remote_phase";
    const RECONCILED_WHILE_DELETING: bool = true;
    const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    /// The connector repairs drift it sees; re-sending now and then covers what it cannot see (a
    /// restarted connector starts empty and a hello can be lost).
    fn resync(_: &ManagerContext) -> Option<Duration> {
        Some(Duration::from_secs(300))
    }

    fn wants(set: &SetObject) -> bool {
        set.kind.is_phase()
            && set.kind.is_namespaced()
            && set.phase_class() == Some(HOSTED_CLUSTER_PHASE_CLASS)
    }

    fn change(previous: Option<&SetObject>, phase: &SetObject) -> Change {
        let changed = previous.is_none_or(|p| {
            p.generation() != phase.generation()
                || p.meta.deletion_timestamp != phase.meta.deletion_timestamp
                || p.meta.finalizers != phase.meta.finalizers
        });
        if changed {
            Change::Respecified
        } else {
            Change::Echo
        }
    }

    fn reconcile(
        actor: &mut RemotePhaseActor,
        phase: SetObject,
        _: &mut Context<RemotePhaseActor>,
    ) -> Work<Self> {
        let context = actor.context.clone();
        let generation = phase.generation();
        let known = actor
            .state
            .previous_uids
            .as_ref()
            .filter(|(g, _)| *g == generation)
            .map(|(_, uids)| uids.clone());
        let unanswered_since = actor.state.unanswered_since;
        let run = async move {
            // The previous phases matter only to an apply; they are read once per generation.
            if phase.meta.deletion_timestamp.is_some() {
                return (teardown(&context, &phase, unanswered_since).await, None);
            }
            let previous = match known {
                Some(uids) => Ok(uids),
                None => previous_phase_uids(&context, &phase).await,
            };
            match previous {
                Ok(uids) => (exchange(&context, &phase, &uids).await, Some(uids)),
                Err(e) => (Exchange::Undelivered(e), None),
            }
        };
        work(
            run,
            move |(exchange, uids), actor: &mut RemotePhaseActor, ctx| {
                if let Some(uids) = uids {
                    actor.state.previous_uids = Some((generation, uids));
                }
                let deleting = actor
                    .object
                    .as_ref()
                    .is_some_and(|p| p.meta.deletion_timestamp.is_some());
                actor.state.unanswered_since = match &exchange {
                    Exchange::Undelivered(_) if deleting => {
                        Some(unanswered_since.unwrap_or_else(Instant::now))
                    }
                    _ => None,
                };
                let outcome = match &exchange {
                    Exchange::Reported(report) => match report.outcome {
                        PhaseOutcome::TeardownInProgress => Ok(Action::Waiting(
                            "hosted objects are being torn down".to_owned(),
                        )),
                        PhaseOutcome::PreflightError => Err(ReconcileError::Failed(format!(
                            "preflight error: {}",
                            report.message
                        ))),
                        _ => Ok(Action::AwaitChange),
                    },
                    Exchange::Undelivered(message) => Err(ReconcileError::Failed(message.clone())),
                    // Retrying sends the same bytes again: a new generation is the next chance.
                    Exchange::TooLarge(message) => Err(ReconcileError::Spec(message.clone())),
                    Exchange::Stale => Ok(Action::Waiting(
                        "the ObjectSetPhase changed while it was being written".to_owned(),
                    )),
                    Exchange::Released => Ok(Action::AwaitChange),
                };
                actor.state.last = Some(exchange);
                actor.publish_status(ctx);
                outcome
            },
        )
    }
}

impl RemotePhaseActor {
    fn publish_status(&mut self, ctx: &mut Context<Self>) {
        let Some(phase) = self.object.clone() else {
            return;
        };
        if phase.meta.deletion_timestamp.is_some() {
            return;
        }
        let (progress, mapped, controller_of) = match &self.state.last {
            Some(Exchange::Reported(report)) => (
                progress_of_report(report),
                mapped_of_report(report),
                report.controller_of.clone(),
            ),
            Some(undelivered @ (Exchange::Undelivered(message) | Exchange::TooLarge(message))) => (
                PhaseProgress::Blocked {
                    reason: if matches!(undelivered, Exchange::TooLarge(_)) {
                        BlockReason::TooLarge
                    } else {
                        BlockReason::PhaseNotReported
                    },
                    message: message.clone(),
                },
                Vec::new(),
                phase.status.controller_of.clone(),
            ),
            Some(Exchange::Released) | Some(Exchange::Stale) | None => return,
        };
        let observation = SetObservation {
            lifecycle: phase.spec.lifecycle_state.clone(),
            generation: phase.generation(),
            phases: vec![(phase.name().to_owned(), progress)],
            total_phases: 1,
            success_delay_seconds: 0,
            teardown_complete: false,
            plan_error: None,
            mapped,
        };
        let decision =
            object_set_conditions(&phase.status.conditions, &observation, Timestamp::now());
        let status = phase.kind.status_view(ObjectSetStatus {
            conditions: decision.conditions,
            controller_of,
            ..ObjectSetStatus::default()
        });
        if status == phase.status {
            return;
        }
        let before = phase.status.clone();
        if let Some(p) = self.object.as_mut() {
            p.status = status.clone();
        }
        let client = self.context.runtime.client.clone();
        let span = info_span!(
            "write_status",
            kind = phase.kind.kind(),
            namespace = phase.namespace(),
            name = phase.name()
        );
        let written = status.clone();
        let write = async move { phase.write_status(client, &written).await };
        self.spawn_write(
            ctx,
            write
                .instrument(span)
                .into_actor(self)
                .map(move |result, act, ctx| {
                    let Err(error) = result else { return };
                    warn!(%error, "status write failed; writing it again");
                    // The report must not be lost: forget that it was written, and write it again
                    // (unless a newer status took its place meanwhile).
                    if let Some(p) = act.object.as_mut().filter(|p| p.status == status) {
                        p.status = before;
                    }
                    ctx.run_later(STATUS_RETRY, |act, ctx| act.publish_status(ctx));
                }),
        );
    }
}

/// The teardown of a deleted phase. When no connector answers, it is given up, and the finalizer released
/// with a Warning Event saying so, once the HostedCluster is gone or after the link's teardown timeout
/// (`unanswered_since`: when the first unanswered request was sent).
async fn teardown(
    context: &ManagerContext,
    phase: &SetObject,
    unanswered_since: Option<Instant>,
) -> Exchange {
    let exchange = exchange(context, phase, &[]).await;
    let (Exchange::Undelivered(why), Some(link)) = (&exchange, &context.connectors) else {
        return exchange;
    };
    let presence = context.rollouts.clusters.presence(phase.namespace());
    let unanswered_for = unanswered_since.map(|t| t.elapsed()).unwrap_or_default();
    let Some(skip) = after_unanswered_teardown(presence, unanswered_for, link.teardown_timeout)
    else {
        return exchange;
    };
    let message = skip.message(why);
    warn!(
        namespace = phase.namespace(),
        name = phase.name(),
        reason = skip.reason(),
        %message,
        "giving up the hosted teardown"
    );
    // The HostedCluster is still there: what the phase left in it is swept when its connector is back.
    if matches!(skip, SkipReason::ConnectorUnreachable(_)) {
        let objects = phase
            .spec
            .template
            .phases
            .first()
            .map(|p| p.objects.as_slice())
            .unwrap_or_default();
        let request = leftover_request(phase_ref(phase), objects);
        match hosted_leftovers::record(&context.runtime.client, &request).await {
            Ok(()) => context.metrics.hosted_leftovers("recorded", 1),
            // The apiserver may come back: try again rather than forget the objects.
            Err(kube::Error::Api(s)) if s.code < 500 && s.code != 409 && s.code != 429 => {
                warn!(namespace = phase.namespace(), name = phase.name(), error = %s.message,
                    "cannot record the hosted objects left behind; letting the phase go");
            }
            Err(e) => return Exchange::Undelivered(format!("recording the leftovers: {e}")),
        }
    }
    context.metrics.hosted_teardown_skipped(skip.reason());
    record_skipped_teardown(context, phase, skip.reason(), &message);
    match phase
        .set_finalizer(
            context.runtime.client.clone(),
            HOSTED_TEARDOWN_FINALIZER,
            false,
        )
        .await
    {
        Ok(()) => Exchange::Released,
        Err(kube::Error::Api(s)) if s.code == 409 => Exchange::Stale,
        Err(e) => Exchange::Undelivered(format!("removing the finalizer: {e}")),
    }
}

/// A Warning Event on the ObjectSetPhase. In a namespace being deleted no Event can be created; the log
/// line and `pko_hosted_teardowns_skipped_total` say it then.
fn record_skipped_teardown(
    context: &ManagerContext,
    phase: &SetObject,
    reason: &str,
    message: &str,
) {
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(message.to_owned()),
        action: "HostedTeardownSkipped".into(),
        secondary: None,
    };
    context
        .runtime
        .events
        .raise(event, event_reference(phase.kind.kind(), &phase.meta));
}

fn phase_ref(phase: &SetObject) -> PhaseRef {
    PhaseRef {
        namespace: phase.namespace().to_owned(),
        name: phase.name().to_owned(),
        uid: phase.uid().to_owned(),
        generation: phase.generation(),
    }
}

/// One request to the connector: teardown while the ObjectSetPhase is being deleted, apply otherwise
/// (`previous_uids`: the previous revisions' phases, whose hosted objects may be adopted).
async fn exchange(
    context: &ManagerContext,
    phase: &SetObject,
    previous_uids: &[String],
) -> Exchange {
    let Some(link) = &context.connectors else {
        return Exchange::Undelivered(
            "hosted-cluster phases travel over NATS, and this manager runs without --nats-url"
                .to_owned(),
        );
    };
    // Bound to the namespace's HostedCluster, whose connector alone holds credentials for them.
    let cluster_uid = context
        .rollouts
        .clusters
        .hosted_cluster_for(Some(phase.namespace()))
        .await
        .and_then(|clusters| clusters.into_iter().next())
        .and_then(|cluster| cluster.metadata.uid);
    let subjects = match HostedClusterSubjects::of(phase.namespace(), cluster_uid.as_deref()) {
        Ok(s) => s,
        Err(e) => return Exchange::Undelivered(e.to_string()),
    };
    let objects = phase
        .spec
        .template
        .phases
        .first()
        .map(|p| (p.objects.clone(), p.external_objects.clone()))
        .unwrap_or_default();
    let deleting = phase.meta.deletion_timestamp.is_some();
    let started = Instant::now();
    let reply: Result<Reply<PhaseReport>, _> = if deleting {
        if !phase.has_finalizer(HOSTED_TEARDOWN_FINALIZER) {
            return Exchange::Released;
        }
        let teardown = TeardownPhase {
            version: WIRE_VERSION,
            phase: phase_ref(phase),
            objects: objects.0,
        };
        link.request(subjects.teardown(), &teardown).await
    } else {
        let apply = ApplyPhase {
            version: WIRE_VERSION,
            phase: phase_ref(phase),
            revision: phase.given_revision.unwrap_or_default(),
            objects: objects.0,
            external_objects: objects.1,
            availability_probes: phase.spec.template.availability_probes.clone(),
            previous_uids: previous_uids.to_vec(),
            paused: phase.spec.lifecycle_state == LifecycleState::Paused,
        };
        // The finalizer goes first: an object applied before it could be left behind in the hosted
        // cluster if the ObjectSetPhase were deleted in between. One round trip, at the first apply only.
        match phase
            .set_finalizer(
                context.runtime.client.clone(),
                HOSTED_TEARDOWN_FINALIZER,
                true,
            )
            .await
        {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => return Exchange::Stale,
            Err(e) => return Exchange::Undelivered(format!("adding the teardown finalizer: {e}")),
        }
        link.request(subjects.apply(), &apply).await
    };
    let result = LinkError::result_of(&reply);
    context.metrics.connectors.request(
        phase.namespace(),
        if deleting { "teardown" } else { "apply" },
        result,
        started.elapsed().as_secs_f64(),
    );
    match reply {
        Ok(Reply::Answer(report)) => {
            if deleting && report.outcome == PhaseOutcome::TornDown {
                return match phase
                    .set_finalizer(
                        context.runtime.client.clone(),
                        HOSTED_TEARDOWN_FINALIZER,
                        false,
                    )
                    .await
                {
                    Ok(()) => Exchange::Released,
                    Err(kube::Error::Api(s)) if s.code == 409 => Exchange::Stale,
                    Err(e) => Exchange::Undelivered(format!("removing the finalizer: {e}")),
                };
            }
            Exchange::Reported(report)
        }
        Err(
            e @ (LinkError::TooLarge { .. }
            | LinkError::Wire {
                source: WireError::TooLarge { .. },
                ..
            }),
        ) => Exchange::TooLarge(e.to_string()),
        Ok(Reply::Refused(refusal)) if refusal.code == ErrorCode::TooLarge => {
            Exchange::TooLarge(format!(
                "the connector's report does not fit a message: {}",
                refusal.message
            ))
        }
        Ok(Reply::Refused(refusal)) => Exchange::Undelivered(format!(
            "the connector refused the phase ({:?}): {}",
            refusal.code, refusal.message
        )),
        Err(e) => Exchange::Undelivered(e.to_string()),
    }
}

/// UIDs of `<previous>-<phase>` for each previous revision: the hosted objects they control may be adopted.
async fn previous_phase_uids(
    context: &ManagerContext,
    phase: &SetObject,
) -> Result<Vec<String>, String> {
    let Some(suffix) = phase.delegated_phase_name() else {
        return Ok(Vec::new());
    };
    let api = phase
        .kind
        .api(context.runtime.client.clone(), phase.namespace());
    let mut uids = Vec::new();
    for previous in &phase.spec.previous {
        let name = phase_object_name(&previous.name, &suffix);
        match api.get_opt(&name).await {
            Ok(Some(p)) => uids.extend(p.metadata.uid),
            Ok(None) => {}
            Err(e) => return Err(format!("reading previous phase {name:?}: {e}")),
        }
    }
    Ok(uids)
}

impl Handler<Resend> for RemotePhaseActor {
    type Result = ();
    /// Re-sends now; the backoff stays as it is (a connector's messages say nothing about whether the
    /// next request will succeed, and must not let a flood shorten it).
    fn handle(&mut self, _: Resend, ctx: &mut Context<Self>) {
        self.request_reconcile(ctx);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pko_proto::core::object_set_phase::ObjectSetPhase;

    fn phase(generation: i64, finalizers: &[&str], available: &str) -> SetObject {
        let p: ObjectSetPhase = serde_json::from_value(serde_json::json!({
            "apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSetPhase",
            "metadata": {"name": "rev-1-deploy", "namespace": "clusters-a",
                "generation": generation, "finalizers": finalizers,
                "labels": {"package-operator.run/class": "hosted-cluster"}},
            "spec": {"revision": 1, "objects": []},
            "status": {"conditions": [{"type": "Available", "status": available, "reason": "R",
                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }))
        .unwrap();
        p.into()
    }

    #[test]
    fn only_what_the_connector_is_sent_is_a_change() {
        let known = phase(1, &[], "False");
        let change = |current: &SetObject| RemotePhaseController::change(Some(&known), current);
        assert_eq!(
            RemotePhaseController::change(None, &known),
            Change::Respecified
        );
        // The status is ours: the connector's report coming back.
        assert_eq!(change(&phase(1, &[], "True")), Change::Echo);
        assert_eq!(change(&phase(2, &[], "False")), Change::Respecified);
        // The teardown finalizer landing (or going) decides whether a delete may finish.
        assert_eq!(
            change(&phase(1, &[HOSTED_TEARDOWN_FINALIZER], "False")),
            Change::Respecified
        );
    }
}

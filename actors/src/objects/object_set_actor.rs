//! The ObjectSet actor: one per ObjectSet or ClusterObjectSet. Plans the set when its generation changes,
//! drives its phase actors strictly in order (a phase runs only after every earlier phase is available),
//! tears down in reverse order when archived, routes changes of its objects to the phase that owns them,
//! and writes status only when it changes. Succeeded fires from a timer, not from the next event.

use pko_proto::well_known::{
    INSTANCE_LABEL, ORPHAN_FINALIZER, SOURCE_IMAGE_ANNOTATION, TEARDOWN_FINALIZER,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::future::LocalBoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use pko_proto::core::common::LifecycleState;
use pko_proto::core::object_set::ObjectSetStatus;
use tracing::warn;

use crate::engine::conditions::find_condition;
use crate::engine::objects::apply_identity::ApplyIdentity;
use crate::engine::objects::object_ref::ObjectKey;
use crate::engine::objects::object_set_status::{
    phase_reach, PhaseProgress, PhaseReach, ARCHIVED, SUCCEEDED,
};
use crate::engine::objects::phase_plan::PhaseOutcome;
use crate::engine::objects::phase_plan::PhaseReport;
use crate::engine::transition_events::object_set_transitions;
use crate::manager::context::ManagerContext;
use crate::metrics::upstream_metrics::ObjectSetFacts;
use crate::objects::applier::Applier;
use crate::objects::object_meta::{creation_seconds, event_reference, tombstone_meta};
use crate::objects::phase_actor::{PhaseActor, PhaseCommand, PhaseFinished, UpdatePlan};
use crate::objects::set_object::SetObject;
use crate::objects::set_plan_inputs::{gather_plan, GatheredPlan};
use crate::runtime::meta_view::MetaView;
use crate::runtime::object_actor::{
    work, Action, Change, Notice, ObjectActor, Reconcile, Report, Work,
};
use crate::runtime::reconcile_gate::{retire, Retiring};
use crate::runtime::telemetry::CapturedTrace;
use pko_proto::well_known::DEFAULT_PHASE_CLASS;

/// The set's status: an `impl` of the same actor.
mod status_publishing;

/// Letting go of the objects of a set deleted with orphaning.
mod orphaning;

/// A managed object controlled by this set changed.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ObjectChanged(pub ObjectKey);

struct Phase {
    name: String,
    delegated: bool,
    actor: Addr<PhaseActor>,
    report: Option<PhaseReport>,
    torn_down: bool,
}

/// The ObjectSet controller's own state: the installed plan and its phase actors.
#[derive(Default)]
pub struct ObjectSetController {
    planned_generation: Option<i64>,
    plan_version: u64,
    plan_error: Option<String>,
    revision: i64,
    phases: Vec<Phase>,
    object_phase: HashMap<ObjectKey, usize>,
    success_timer: Option<SpawnHandle>,
    /// The status last computed for the planned generation. Status writes run concurrently and can land
    /// out of order; a watched status that still differs from it after [`OVERTAKEN_RECHECK`] is written
    /// again.
    published: Option<ObjectSetStatus>,
    /// The pending look at a watched status that differed from `published`.
    overtaken_check: Option<SpawnHandle>,
    /// A finalizer write is on its way; another would only conflict with it.
    finalizer_write_pending: bool,
    /// The status that says a teardown just asked for is under way, if that teardown is still running
    /// after [`ARCHIVAL_SETTLE`].
    archival_report: Option<SpawnHandle>,
    /// Whose rights the running phase actors apply with.
    identity: ApplyIdentity,
    /// Phase actors asked to retire (a plan of another shape, a deletion, a release) that had not
    /// stopped when last looked at.
    retiring: Vec<Retiring>,
    /// The applier the phases were started with: an orphaning lets go of their objects with it.
    applier: Option<Applier>,
    /// Being orphaned: the objects the plan had, whose reference to this set is taken off.
    orphaned: Option<Vec<ObjectKey>>,
    /// A pass taking this set's reference off the `orphaned` objects is running (or waits to retry).
    releasing: bool,
    /// The set changed while a pass ran: another follows it.
    release_again: bool,
}

impl ObjectSetController {
    /// The status last published, when the watched `set` says something else.
    fn overtaken_status(&self, set: &SetObject) -> Option<&ObjectSetStatus> {
        self.published.as_ref().filter(|p| **p != set.status)
    }
}

pub type ObjectSetActor = ObjectActor<ObjectSetController>;

const FINALIZER_RETRY: Duration = Duration::from_millis(500);

/// How long a watched status may differ from the one published before it is written again. The watch
/// delivers the echoes of pko's own earlier writes (a finalizer, a previous status) before that of the
/// last one: rewriting at once wrote the same status twice for one set in seven in the fleet benchmark.
/// A write that really landed out of order is still there when this has passed.
const OVERTAKEN_RECHECK: Duration = Duration::from_secs(1);

/// How long a teardown may run before the status says `ArchivalInProgress`. Most finish at once (their
/// objects went to a newer revision, nothing to delete): their status goes straight to `Archived`, one
/// write instead of two in a row.
const ARCHIVAL_SETTLE: Duration = Duration::from_millis(500);

impl ObjectSetActor {
    /// The set's lifecycle; a set being deleted is torn down like an archived one.
    fn lifecycle(&self) -> LifecycleState {
        match &self.object {
            Some(s) if s.meta.deletion_timestamp.is_some() => LifecycleState::Archived,
            Some(s) => s.spec.lifecycle_state.clone(),
            None => LifecycleState::default(),
        }
    }

    fn deleting(&self) -> bool {
        self.object
            .as_ref()
            .is_some_and(|s| s.meta.deletion_timestamp.is_some())
    }

    /// Being deleted with `propagationPolicy: Orphan`: the apiserver adds the `orphan` finalizer with the
    /// deletion timestamp, and the garbage collector takes this set's references off its objects (its
    /// phases, for a delegated set), which stay. Nothing is torn down. The collector drops the `orphan`
    /// finalizer once done, while this set still lets go of its objects: once seen, the orphaning
    /// holds for the rest of the deletion, or the set's next plan would tear down what it orphans.
    fn orphaning(&self) -> bool {
        self.object.as_ref().is_some_and(|s| {
            s.meta.deletion_timestamp.is_some()
                && (s.has_finalizer(ORPHAN_FINALIZER) || self.state.orphaned.is_some())
        })
    }

    /// Adds (`present`) or removes the teardown finalizer, in the background; a failed write is retried.
    fn write_finalizer(&mut self, present: bool, ctx: &mut Context<Self>) {
        let Some(set) = self.object.clone() else {
            return;
        };
        if set.has_finalizer(TEARDOWN_FINALIZER) == present || self.state.finalizer_write_pending {
            return;
        }
        self.state.finalizer_write_pending = true;
        if !present {
            // Torn down (or orphaned): nothing of this set is kept from here on, before the set can be
            // gone. Its owners above it go only after it, so once they are gone its cache entries and
            // their metrics are too.
            self.context.cache.remove_route(set.uid());
        }
        let client = self.context.runtime.client.clone();
        let write = async move { set.set_finalizer(client, TEARDOWN_FINALIZER, present).await };
        self.spawn_write(
            ctx,
            write.into_actor(self).map(move |result, act, ctx| {
                act.state.finalizer_write_pending = false;
                if let Err(e) = result {
                    // Mostly a conflict with our own status write; by the retry the watch has brought
                    // the current resourceVersion.
                    warn!(error = %e, "writing the teardown finalizer failed; retrying");
                    ctx.run_later(FINALIZER_RETRY, move |act, ctx| {
                        act.write_finalizer(present, ctx)
                    });
                }
            }),
        );
    }

    fn install_plans(&mut self, gathered: GatheredPlan, ctx: &mut Context<Self>) {
        let GatheredPlan {
            generation,
            revision,
            plans,
            identity,
            applier,
        } = gathered;
        if self.orphaning() {
            // No phase starts again: what the plan names is let go of (`orphaning`).
            if self.state.orphaned.is_none() {
                self.state.applier = Some(applier);
            }
            let planned = plans.iter().flat_map(|p| &p.objects);
            return self.orphan_objects(Some(planned.map(|o| o.key.clone()).collect()), ctx);
        }
        self.state.plan_error = None;
        self.state.planned_generation = Some(generation);
        self.state.revision = revision;
        self.state.plan_version += 1;
        let paused = self.lifecycle() == LifecycleState::Paused;
        self.state.applier = Some(applier.clone());
        // Phase actors keep the applier they were started with: another identity starts new ones.
        let same_shape = identity == self.state.identity
            && plans.len() == self.state.phases.len()
            && plans
                .iter()
                .zip(&self.state.phases)
                .all(|(p, q)| p.name == q.name && p.delegated == q.delegated);
        if !same_shape {
            self.stop_phases();
            self.state.identity = identity;
        }
        self.state.object_phase.clear();
        for (index, plan) in plans.into_iter().enumerate() {
            for o in &plan.objects {
                self.state.object_phase.insert(o.key.clone(), index);
            }
            let update = UpdatePlan {
                plan: Arc::new(plan),
                paused,
                version: self.state.plan_version,
                cause: CapturedTrace::current(),
            };
            if same_shape {
                self.state.phases[index].actor.do_send(update);
                self.state.phases[index].report = None;
                self.state.phases[index].torn_down = false;
            } else {
                let name = update.plan.name.clone();
                let delegated = update.plan.delegated;
                let owner = ctx.address().recipient();
                let actor = PhaseActor::new(
                    index,
                    applier.clone(),
                    self.context.cache.clone(),
                    update,
                    owner,
                )
                .start();
                self.state.phases.push(Phase {
                    name,
                    delegated,
                    actor,
                    report: None,
                    torn_down: false,
                });
            }
        }
        if let Some(set) = &self.object {
            let addr = ctx.address();
            self.context.cache.add_route(
                set.uid(),
                Arc::new(move |key| addr.do_send(ObjectChanged(key))),
            );
        }
        self.drive(ctx);
    }

    /// Retires the phase actors: none applies or retries again once its running run ends (a phase left
    /// to run on could write an object after the set moved to another replica, or after an orphaning).
    fn stop_phases(&mut self) {
        self.state.retiring.retain_mut(|r| !r.stopped());
        let retiring = self.state.phases.drain(..).map(|p| retire(&p.actor));
        self.state.retiring.extend(retiring);
        self.state.object_phase.clear();
    }

    /// Resolves once every phase actor this set stopped has stopped.
    fn phases_stopped(&mut self) -> LocalBoxFuture<'static, ()> {
        self.stop_phases();
        Box::pin(Retiring::all(std::mem::take(&mut self.state.retiring)))
    }

    /// Starts the next step: the first phase without a current report (Active/Paused), or the last phase
    /// not yet torn down (Archived).
    fn drive(&mut self, ctx: &mut Context<Self>) {
        if self.orphaning() {
            // No phase applies again, and a reference written back after the collector took it off
            // goes before the finalizer does (`orphaning`).
            self.orphan_objects(None, ctx);
            return;
        }
        if self.lifecycle() == LifecycleState::Archived {
            let remaining = self.state.phases.iter().rposition(|p| !p.torn_down);
            // Archived=False (ArchivalInProgress) while an object holds the teardown up, True once all
            // phases are gone, and controllerOf empty from the start.
            if let Some(i) = remaining {
                self.state.phases[i].actor.do_send(PhaseCommand::Teardown);
                if self.state.archival_report.is_none() {
                    self.state.archival_report =
                        Some(ctx.run_later(ARCHIVAL_SETTLE, |act, ctx| {
                            act.state.archival_report = None;
                            act.publish_status(ctx);
                        }));
                }
            } else {
                self.publish_status(ctx);
            }
            // Being deleted: the finalizer goes once everything it guards is gone (or nothing can be
            // planned, so nothing more can be torn down).
            let planned = self.state.planned_generation.is_some();
            if self.deleting()
                && planned
                && (remaining.is_none() || self.state.plan_error.is_some())
            {
                self.write_finalizer(false, ctx);
            }
            return;
        }
        if let Some(next) = self.reach().next {
            self.state.phases[next]
                .actor
                .do_send(PhaseCommand::Reconcile);
            return;
        }
        self.publish_status(ctx);
    }

    /// How far the phases may run (`engine::objects::object_set_status::phase_reach`).
    fn reach(&self) -> PhaseReach {
        let progress: Vec<Option<&PhaseProgress>> = self
            .state
            .phases
            .iter()
            .map(|p| p.report.as_ref().map(|r| &r.progress))
            .collect();
        phase_reach(&progress)
    }
}

impl Reconcile for ObjectSetController {
    type Shared = ManagerContext;
    type Object = SetObject;
    type Reported = Vec<Condition>;
    const CONTROLLER: &'static str = "object_set";
    const RECONCILED_WHILE_DELETING: bool = true;
    /// Phase reports and object events must not reach a half-installed plan.
    const EXCLUSIVE: bool = true;

    /// ObjectSetPhases of other classes belong to other controllers (the hosted-cluster connector, or
    /// out-of-tree ones).
    fn wants(set: &SetObject) -> bool {
        !set.kind.is_phase() || set.phase_class() == Some(DEFAULT_PHASE_CLASS)
    }

    /// Metadata only: the taps following this kind read nothing else of a deleted object.
    fn tombstone(object: &SetObject) -> SetObject {
        SetObject {
            kind: object.kind,
            meta: tombstone_meta(&object.meta),
            spec: Default::default(),
            status: Default::default(),
            given_revision: object.given_revision,
        }
    }

    fn report(
        previous: Option<&Vec<Condition>>,
        set: &SetObject,
        context: &ManagerContext,
    ) -> Report<Vec<Condition>> {
        let metrics = &context.metrics;
        if set.kind.is_phase() {
            // Upstream's ObjectSet metrics are about revisions, not phases.
        } else if set.meta.deletion_timestamp.is_some() {
            Self::forget(set, context);
        } else {
            let holds = |type_: &str| {
                find_condition(&set.status.conditions, type_).filter(|c| c.status == "True")
            };
            let label = |key: &str| {
                set.meta
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(key))
                    .map_or("", String::as_str)
            };
            let annotation = set
                .meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(SOURCE_IMAGE_ANNOTATION))
                .map_or("", String::as_str);
            metrics.upstream.object_set(&ObjectSetFacts {
                name: set.name(),
                uid: set.meta.uid.as_deref().unwrap_or_default(),
                namespace: set.namespace(),
                package_instance: label(INSTANCE_LABEL),
                image: annotation,
                created: creation_seconds(&set.meta),
                succeeded: holds(SUCCEEDED).map(|c| c.last_transition_time.0.as_second()),
                archived: holds(ARCHIVED).is_some(),
            });
        }
        Report {
            remember: set.status.conditions.clone(),
            notice: previous.map(|previous| Notice {
                reference: event_reference(set.kind.kind(), &set.meta),
                events: object_set_transitions(previous, &set.status.conditions),
            }),
        }
    }

    fn forget(set: &SetObject, context: &ManagerContext) {
        let metrics = &context.metrics;
        if !set.kind.is_phase() {
            metrics
                .upstream
                .forget_object_set(set.name(), set.namespace());
        }
    }

    /// Decided from the installed plan, in [`Reconcile::observed`].
    fn change(_: Option<&SetObject>, _: &SetObject) -> Change {
        Change::Changed
    }

    /// A new generation is planned; anything else is answered from the installed plan.
    fn observed(
        actor: &mut ObjectSetActor,
        _: Change,
        ctx: &mut Context<ObjectSetActor>,
    ) -> Change {
        let Some(set) = actor.object.as_ref() else {
            return Change::Echo;
        };
        let generation = set.generation();
        let overtaken = actor.state.overtaken_status(set).is_some();
        let deleting = actor.deleting();
        if !deleting {
            // Deleting the set then tears its objects down first, last phase first, as archival does.
            actor.write_finalizer(true, ctx);
        }
        if actor.state.planned_generation != Some(generation) {
            actor.state.published = None;
            return Change::Changed;
        }
        if deleting {
            actor.drive(ctx);
        } else if overtaken && actor.state.overtaken_check.is_none() {
            actor.state.overtaken_check = Some(ctx.run_later(OVERTAKEN_RECHECK, |act, ctx| {
                act.state.overtaken_check = None;
                let Some(set) = act.object.as_ref() else {
                    return;
                };
                // An older write of ours landed after a newer one (or someone else wrote status): what
                // the phases last reported stands.
                if let Some(status) = act.state.overtaken_status(set).cloned() {
                    act.write_status(status, ctx);
                }
            }));
        }
        Change::Echo
    }

    fn reconcile(
        actor: &mut ObjectSetActor,
        set: SetObject,
        _: &mut Context<ObjectSetActor>,
    ) -> Work<Self> {
        let shard_owner = actor
            .context
            .runtime
            .shard
            .as_ref()
            .map(|s| s.member.to_string());
        // Previous revisions the ObjectSet watch delivered need no read.
        let kind = set.kind.revision_kind();
        let mut indexed = BTreeMap::new();
        for previous in &set.spec.previous {
            let found = actor
                .context
                .revisions
                .previous(kind, set.namespace(), &previous.name);
            actor
                .context
                .metrics
                .previous_revision_read(found.is_some());
            indexed.extend(found.map(|p| (previous.name.clone(), p)));
        }
        let gather = gather_plan(actor.context.clone(), set, indexed, shard_owner);
        work(
            gather,
            |result, act: &mut ObjectSetActor, ctx| match result {
                Ok(gathered) => {
                    act.install_plans(gathered, ctx);
                    Ok(Action::AwaitChange)
                }
                Err(error) => {
                    // A spec error stays until the spec changes; slices or previous revisions may
                    // appear later, or the apiserver recover (`Reconcile::error_policy`).
                    let message = error.to_string();
                    act.state.plan_error = Some(message.clone());
                    act.state.planned_generation = act.object.as_ref().map(SetObject::generation);
                    act.stop_phases();
                    act.publish_status(ctx);
                    if act.deleting() {
                        // Nothing can be torn down without a plan: let the deletion go on.
                        act.drive(ctx);
                    }
                    Err(error)
                }
            },
        )
    }

    fn gone(
        actor: &mut ObjectSetActor,
        _: &mut Context<ObjectSetActor>,
    ) -> Option<LocalBoxFuture<'static, ()>> {
        Some(actor.phases_stopped())
    }

    fn let_go(
        actor: &mut ObjectSetActor,
        _: &mut Context<ObjectSetActor>,
    ) -> Option<LocalBoxFuture<'static, ()>> {
        Some(actor.phases_stopped())
    }

    fn stopped(actor: &mut ObjectSetActor) {
        if let Some(set) = &actor.object {
            actor.context.cache.remove_route(set.uid());
        }
    }
}

impl Handler<ObjectChanged> for ObjectSetActor {
    type Result = ();
    fn handle(&mut self, ObjectChanged(key): ObjectChanged, _: &mut Context<Self>) {
        let Some(&index) = self.state.object_phase.get(&key) else {
            return;
        };
        if self.lifecycle() == LifecycleState::Archived {
            if self.state.phases.iter().rposition(|p| !p.torn_down) == Some(index) {
                self.state.phases[index]
                    .actor
                    .do_send(PhaseCommand::Teardown);
            }
            return;
        }
        // Phases beyond the first unavailable one are not applied yet; their events change nothing.
        if index <= self.reach().frontier {
            self.state.phases[index]
                .actor
                .do_send(PhaseCommand::Reconcile);
        }
    }
}

impl Handler<PhaseFinished> for ObjectSetActor {
    type Result = ();
    fn handle(&mut self, finished: PhaseFinished, ctx: &mut Context<Self>) {
        if finished.version != self.state.plan_version || finished.index >= self.state.phases.len()
        {
            return;
        }
        let before = self.reach().frontier;
        let phase = &mut self.state.phases[finished.index];
        match finished.outcome {
            PhaseOutcome::Reconciled(report) => {
                let was_available = phase
                    .report
                    .as_ref()
                    .is_some_and(|r| r.progress == PhaseProgress::Available);
                let now_available = report.progress == PhaseProgress::Available;
                phase.report = Some(report);
                if now_available && !was_available {
                    // Later phases must be re-checked now that this one passed.
                    for later in &mut self.state.phases[finished.index + 1..] {
                        later.report = None;
                    }
                }
            }
            PhaseOutcome::TornDown(report) => phase.torn_down = report.complete(),
        }
        // Phases that came back into reach (behind a phase just handed over) may have missed events
        // while they were out of it: they look again.
        let after = self.reach().frontier;
        for later in self.state.phases.iter().take(after + 1).skip(before + 1) {
            if later.report.is_some() {
                later.actor.do_send(PhaseCommand::Reconcile);
            }
        }
        self.drive(ctx);
    }
}

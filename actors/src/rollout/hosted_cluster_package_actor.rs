//! The HostedClusterPackage supervisor: one per HostedClusterPackage. It keeps the selected HostedClusters
//! and their Packages in view, runs the rollout planner on every change, persists the in-flight set in
//! `status.processing` before any update is written, hands each write to the namespace's
//! [`HcpNamespaceActor`], writes the status when it changes, and publishes the rollout's steps.
//!
//! The rules live in `engine::rollout::rollout_plan`; this actor only gathers inputs and carries out plans. Its
//! parts are submodules that add to the same actor: the watch of its Packages (`owned_packages`), what a
//! step tells (`rollout_story`), the health checks (`health_checks`), the fleet's hub (`fleet_hub`) and
//! the CloudEvents sinks (`notification_sinks`).

use pko_proto::well_known::HOSTED_CLUSTER_PACKAGE_LABEL;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::future::LocalBoxFuture;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::Api;
use pko_proto::core::hosted_cluster_package::{HostedClusterPackage, HostedClusterPackageStatus};
use pko_proto::core::package::{Package, PackageSpec, PackageTemplateSpec};
use pko_proto::core::rollout_preflight::HostedClusterPackagePreflightStatus;
use pko_proto::rollout_events::RolloutEvent;
use tracing::{info_span, Span};

use crate::engine::fleet::promotion_gate::GateVerdict;
use crate::engine::resource_version::NewestSeen;
use crate::engine::rollout::cluster_reads::ClusterReads;
use crate::engine::rollout::hosted_cluster_package::{desired_package, OwnedPackage};
use crate::engine::rollout::preflight_gate::PreflightRun;
use crate::engine::rollout::rollout_decision::{
    decide_rollout, GateInput, RolloutDecision, RolloutSnapshot,
};
use crate::engine::rollout::rollout_guard::{stored_observations, HealthObservations};
use crate::engine::rollout::rollout_plan::{Counts, RolloutInput, RolloutPlan};
use crate::engine::rollout::rollout_policy::HealthCheck;
use crate::engine::rollout::rollout_status::{progress_only, PROGRESSING};
use crate::engine::status_hold::StatusHold;
use crate::engine::transition_events::TransitionEvent;
use crate::manager::context::ManagerContext;
use crate::objects::object_meta::{event_reference, replace_status_over};
use crate::rollout::hcp_namespace_actor::{HcpNamespaceActor, PackageCommand};
use crate::rollout::hosted_cluster_index::SelectionChanged;
use crate::rollout::preflight_tracker::PreflightTracker;
use crate::runtime::object_actor::{
    done, work, Action, Change, ObjectActor, Reconcile, ReconcileError, Report, Work,
};
use crate::runtime::reconcile_gate::Backoff;
use crate::runtime::reconcile_gate::{retire, Retiring};
use crate::runtime::telemetry::current_traceparent;
use pko_proto::well_known::TRACE_PARENT_ANNOTATION;

// The supervisor's parts, each an `impl` of the same actor.
mod fleet_hub;
mod health_checks;
mod notification_sinks;
mod owned_packages;
mod preflight;
mod rollout_story;

/// The previous plan, for the events between it and the next.
struct LastPlan {
    generation: i64,
    input: RolloutInput,
    plan: RolloutPlan,
}

/// What one decision asks to be done.
struct StepToCarry {
    status: HostedClusterPackageStatus,
    /// The Packages to create or update, each with the span of its rollout step.
    writes: BTreeMap<String, Span>,
    deletes: Vec<String>,
    events: Vec<RolloutEvent>,
    /// The story so far, told again on taking a rollout over: queued after the first `before_story` of
    /// `events`, and not at all when it ends in a `rolloutFinished` the stream holds already.
    story: Vec<RolloutEvent>,
    before_story: usize,
    /// The Events to raise for the events' transitions.
    transitions: Vec<TransitionEvent>,
    /// The plan the next decision's events are told against.
    next: Option<LastPlan>,
    /// What the fleet's hub is told.
    hub: Option<HubReport>,
    guard: Option<Guard>,
}

impl StepToCarry {
    /// An invalid spec: its status, nothing else.
    fn invalid(status: HostedClusterPackageStatus) -> Self {
        Self {
            status,
            writes: BTreeMap::new(),
            deletes: Vec::new(),
            events: Vec::new(),
            story: Vec::new(),
            before_story: 0,
            transitions: Vec::new(),
            next: None,
            hub: None,
            guard: None,
        }
    }
}

/// Where a rollout stands, for the fleet's hub.
struct HubReport {
    gate: GateVerdict,
    template_hash: String,
    counts: Counts,
    partition: Option<String>,
}

/// What the rollout policy asks for after a step: the template Packages are written with, and when to
/// look again.
struct Guard {
    template: PackageTemplateSpec,
    /// The last template that finished everywhere, for Packages created in groups not reached yet.
    proven: Option<(BTreeSet<String>, PackageTemplateSpec)>,
    recheck_after: Option<Duration>,
    health_due: Vec<(String, HealthCheck)>,
    /// Updates free only because their Package was seen down (`RolloutPlan::update_if_unchanged`),
    /// with the resourceVersion it was seen at: written only over that version.
    if_unchanged: BTreeMap<String, String>,
    /// The preflight due now, if one is.
    preflight_run: Option<PreflightRun>,
}

/// The sooner of two optional delays.
fn sooner(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    a.into_iter().chain(b).min()
}

/// The HostedClusterPackage controller's own state.
#[derive(Default)]
pub struct HostedClusterPackageController {
    /// Owned Packages by namespace, from this supervisor's own watch of them and its writes' answers,
    /// each at the newest version seen; none until its first list is complete (planning on a partial
    /// view could recreate existing Packages past the budget). Shared, not copied: every reconcile
    /// snapshots the whole fleet's Packages. An update that is free only because the Package was seen
    /// down is written over the version it was seen at (`Guard::if_unchanged`).
    packages: NewestSeen<OwnedPackage>,
    /// Whether the watch of the owned Packages runs.
    watching: bool,
    children: BTreeMap<String, Addr<HcpNamespaceActor>>,
    /// Writes handed to children and not settled yet (a failed one is retried until it lands or a
    /// newer one replaces it), with the spec each carries: planned as unavailable, and as updated only
    /// when that is the template's spec (`RolloutSnapshot::writing`).
    writing: BTreeMap<String, PackageSpec>,
    /// Namespaces whose last write failed, with why.
    failures: BTreeMap<String, String>,
    last: Option<LastPlan>,
    /// Whether this supervisor follows the fleet's hub (its spec has a promotion gate).
    following_hub: bool,
    /// What the last `promotionWaiting` event said, for the generation it was about: told again only
    /// when whom the gate waits for changes.
    gate_told: Option<(i64, String)>,
    /// When this supervisor last published a rollout event (for the fleet's records).
    last_event_at: Option<Timestamp>,
    /// The latest evaluation of each health check, by (group, check).
    health: HealthObservations,
    /// Health checks being evaluated now.
    evaluating: BTreeSet<(String, String)>,
    /// Progress alone (counts, Packages leaving `processing`) held back from the status, to be merged
    /// into the next write within the hold's limit (the decision that writes it when no other write
    /// comes is the reconcile's requeue).
    progress_hold: StatusHold,
    /// What the last rollout decision took to make ([`Reconcile::pace`]).
    decision_cost: Duration,
    /// The newest finished preflight (written to the status by the next decision).
    preflight: Option<HostedClusterPackagePreflightStatus>,
    /// The preflight running, and the one waiting out a retry delay.
    preflights: PreflightTracker,
}

/// How long a supervisor waits between decisions, in multiples of what the last one took.
const PACE_PER_DECISION_COST: u32 = 2;

/// What the progress hold waits for: a write that stores it along. Each Package moving through its
/// update changes the counts two or three times, and with several Packages in flight those changes are
/// merged into the writes that store the next updates, instead of one status write each.
const AWAITING_WRITE: &str = "a write that stores the progress";

pub type HostedClusterPackageActor = ObjectActor<HostedClusterPackageController>;

impl Reconcile for HostedClusterPackageController {
    type Shared = ManagerContext;
    type Object = HostedClusterPackage;
    type Reported = ();
    const CONTROLLER: &'static str = "hosted_cluster_package";
    const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

    /// Being deleted, it is not reconciled again (`Reconcile::RECONCILED_WHILE_DELETING`), and no Package
    /// writer it started may make a Package the collector already deleted.
    fn observed(
        actor: &mut HostedClusterPackageActor,
        change: Change,
        _: &mut Context<HostedClusterPackageActor>,
    ) -> Change {
        let deleting = actor
            .object
            .as_ref()
            .is_some_and(|h| h.metadata.deletion_timestamp.is_some());
        if deleting && !actor.state.children.is_empty() {
            // The writers stop on their own; nothing waits for them here.
            drop(actor.retire_children());
        }
        change
    }

    fn reconcile(
        actor: &mut HostedClusterPackageActor,
        hcpkg: HostedClusterPackage,
        ctx: &mut Context<HostedClusterPackageActor>,
    ) -> Work<Self> {
        let name = actor.name();
        actor.serve_sinks(&hcpkg);
        // What this decision reads: the Packages it owns, as observed now, say whether the preflight
        // hashes every cluster's render inputs. A Package event wakes this actor to set it again.
        actor.context.rollouts.clusters.set_selector(
            &name,
            &hcpkg.spec.hosted_cluster_selector,
            ClusterReads::of(&hcpkg, actor.state.packages.objects()),
            ctx.address().recipient(),
        );
        if !actor.state.watching {
            // Its own watch of the Packages it owns, wherever they live (sharded: on any replica);
            // it ends with the actor. Its first complete list wakes this actor.
            actor.state.watching = true;
            let api: Api<Package> = Api::all(actor.context.runtime.watch_client.clone());
            let owned = format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={name}");
            ctx.add_stream(
                watcher::watcher(
                    api,
                    actor.context.runtime.initial_lists.config().labels(&owned),
                )
                .default_backoff()
                .boxed(),
            );
        }
        if !actor.context.rollouts.clusters.is_ready() {
            // Woken by the fleet once it is complete.
            return done();
        }
        let Some(packages) = actor.state.packages.objects().cloned() else {
            return done();
        };
        let hub = actor.context.rollouts.hub.clone();
        if let Some(hub) = &hub {
            actor.follow_hub(hub, ctx);
        }
        let gate = GateInput::Fleet {
            cluster: actor.context.rollouts.source.clone(),
            hub: hub.as_ref().map(|hub| hub.view(&name)),
        };
        if actor.state.health.is_empty() {
            // Started (or taken over) mid-soak: the last evaluations the status keeps count until
            // this supervisor evaluates again.
            if let Some(status) = &hcpkg.status {
                actor.state.health = stored_observations(status);
            }
        }
        let selector = &hcpkg.spec.hosted_cluster_selector;
        let snapshot = RolloutSnapshot {
            clusters: actor.context.rollouts.clusters.selected(selector),
            hcpkg,
            packages,
            writing: actor.state.writing.clone(),
            failures: actor.state.failures.clone(),
            gate,
            health: actor.state.health.clone(),
            preflight: actor.state.preflight.clone(),
        };
        // The decision looks at the whole fleet: it runs off the actor thread, which every other
        // object's actor shares, and what it cost paces the next one (`Reconcile::pace`).
        let decided = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let decision = decide_rollout(&snapshot, Timestamp::now());
            (snapshot.hcpkg, decision, started.elapsed())
        });
        Box::pin(
            fut::wrap_future::<_, HostedClusterPackageActor>(decided).then(|decided, act, _| {
                match decided {
                    Ok((hcpkg, decision, cost)) => {
                        act.state.decision_cost = cost;
                        act.carry_out(hcpkg, decision)
                    }
                    Err(e) => Box::pin(fut::ready(Err(ReconcileError::Failed(format!(
                        "deciding the rollout: {e}"
                    ))))),
                }
            }),
        )
    }

    /// Twice what the last decision took: a supervisor spends at most a third of a core deciding,
    /// however many Package changes a large fleet sends it, and each decision takes them all.
    fn pace(&self) -> Duration {
        self.decision_cost * PACE_PER_DECISION_COST
    }

    /// The rollout's gauges; its Events come from its rollout steps (see `carry_out`).
    fn report(
        _: Option<&()>,
        hcpkg: &HostedClusterPackage,
        context: &ManagerContext,
    ) -> Report<()> {
        context.metrics.rollouts.hosted_cluster_package(hcpkg);
        Report::default()
    }

    /// Deleted, or moved to another replica: this one no longer writes its record at the hub (the new
    /// supervisor does, or it ages out).
    fn stopped(actor: &mut HostedClusterPackageActor) {
        actor.release_sinks();
        if let Some(hub) = &actor.context.rollouts.hub {
            hub.forget(&actor.name());
            hub.metrics().gate(&actor.name(), None);
        }
    }

    fn forget(hcpkg: &HostedClusterPackage, context: &ManagerContext) {
        context
            .metrics
            .rollouts
            .forget(hcpkg.metadata.name.as_deref().unwrap_or_default());
    }

    fn gone(
        actor: &mut HostedClusterPackageActor,
        _: &mut Context<HostedClusterPackageActor>,
    ) -> Option<LocalBoxFuture<'static, ()>> {
        actor.remove_sinks();
        // Its Packages go with it through their owner references; no writer may make one again.
        actor
            .context
            .rollouts
            .clusters
            .remove_selector(&actor.name());
        Some(actor.retire_children())
    }

    /// Moved to another replica: the Package writers end their running write and retry none, so no
    /// Package spec of this supervisor's lands once the new one decides.
    fn let_go(
        actor: &mut HostedClusterPackageActor,
        _: &mut Context<HostedClusterPackageActor>,
    ) -> Option<LocalBoxFuture<'static, ()>> {
        Some(actor.retire_children())
    }
}

impl HostedClusterPackageActor {
    /// Retires every HCP namespace writer; resolves once all stopped.
    fn retire_children(&mut self) -> LocalBoxFuture<'static, ()> {
        let children = std::mem::take(&mut self.state.children);
        let retiring = children.values().map(retire).collect();
        Box::pin(Retiring::all(retiring))
    }

    fn name(&self) -> String {
        self.object
            .as_ref()
            .and_then(|h| h.metadata.name.clone())
            .unwrap_or_default()
    }

    /// Persists the in-flight set, then writes Packages, then the status; publishes the steps. `hcpkg` is
    /// the version the decision was made on (the actor may have observed a newer one since).
    fn carry_out(
        &mut self,
        hcpkg: HostedClusterPackage,
        decision: RolloutDecision,
    ) -> Work<HostedClusterPackageController> {
        let previous_status = hcpkg.status.clone().unwrap_or_default();
        let mut step = match decision {
            RolloutDecision::Invalid(status) => StepToCarry::invalid(*status),
            RolloutDecision::Planned(step) => self.step_to_carry(&hcpkg, &previous_status, *step),
        };
        if !step.events.is_empty() || !step.story.is_empty() {
            self.state.last_event_at = Some(Timestamp::now());
        }
        let status_changed = step.status != previous_status;
        let progress = status_changed
            && step.writes.is_empty()
            && step.deletes.is_empty()
            && progress_only(&previous_status, &step.status);
        let progress_wait = self
            .state
            .progress_hold
            .hold(progress.then_some(AWAITING_WRITE), Instant::now());
        let write_now = status_changed && progress_wait.is_none();
        let client = self.context.runtime.client.clone();
        let name = self.name();
        let publisher = self.context.rollouts.publisher.clone();
        let reference = event_reference("HostedClusterPackage", &hcpkg.metadata);
        let read_at = hcpkg.metadata.resource_version.clone();
        let stored = previous_status.clone();
        let events_sink = self.context.runtime.events.clone();
        // What the write and the publisher take goes with them; the status comes back to `carried`.
        let status = std::mem::take(&mut step.status);
        let mut events = std::mem::take(&mut step.events);
        let after_story = events.split_off(step.before_story.min(events.len()));
        let story = std::mem::take(&mut step.story);
        let transitions = std::mem::take(&mut step.transitions);
        let run = async move {
            // The in-flight set (and the rest of the status) goes first: a crash after this point
            // finds every update it was about to make already counted. It is written only over the
            // version it was planned from, so a replica that lost its leadership cannot overwrite it.
            let written_at = if write_now {
                write_status(&client, &name, read_at.as_deref(), &stored, &status).await?
            } else {
                None
            };
            events_sink.raise_transitions(&reference, transitions);
            if let Some(publisher) = publisher {
                publisher.enqueue(events);
                publisher.enqueue_unless_stored(story);
                publisher.enqueue(after_story);
            }
            Ok::<_, StatusWriteError>((status, written_at))
        };
        work(run, move |written, act: &mut Self, ctx| match written {
            Ok((status, written_at)) => {
                Ok(act.carried(&hcpkg, step, status, written_at, progress_wait, ctx))
            }
            Err(StatusWriteError::Conflict) => Ok(Action::Waiting(
                "the HostedClusterPackage changed since it was read; planning again".to_owned(),
            )),
            Err(StatusWriteError::Failed(error)) => Err(ReconcileError::Failed(format!(
                "{error}; no Package is written before the status"
            ))),
        })
    }

    /// Takes a carried step's result back (`status` is the step's, back from the write): the hub's record, the status as written, the health checks
    /// due, and the Package writes handed to the namespaces' actors. Returns when to decide again
    /// (a soak or a progress deadline ends, a health check falls due, a held status must be written).
    fn carried(
        &mut self,
        hcpkg: &HostedClusterPackage,
        step: StepToCarry,
        status: HostedClusterPackageStatus,
        written_at: Option<String>,
        progress_wait: Option<Duration>,
        ctx: &mut Context<Self>,
    ) -> Action {
        let StepToCarry {
            writes,
            deletes,
            next,
            hub,
            guard,
            ..
        } = step;
        let mut again = progress_wait;
        if let Some(next) = next {
            self.state.last = Some(next);
        }
        if let Some(hub) = hub {
            self.report_to_hub(&status, &hub);
            if let GateVerdict::Closed(closed) = &hub.gate {
                // A soak ends by itself: decide again then.
                again = sooner(again, closed.recheck_after);
            }
        }
        if written_at.is_some() || progress_wait.is_some() {
            self.context
                .metrics
                .rollouts
                .status_change(&self.name(), progress_wait.is_some());
        }
        if progress_wait.is_none() {
            // Written (or nothing to write): the next progress starts a hold of its own.
            self.state.progress_hold = StatusHold::default();
            // Onto the version decided on only: a newer one observed meanwhile keeps its own status
            // (its change runs the next decision).
            let decided_on = &hcpkg.metadata.resource_version;
            if let Some(h) = self
                .object
                .as_mut()
                .filter(|h| h.metadata.resource_version == *decided_on)
            {
                h.status = Some(status);
                if written_at.is_some() {
                    h.metadata.resource_version = written_at;
                }
            }
        }
        let Some(guard) = guard else {
            return again.map_or(Action::AwaitChange, Action::RequeueAfter);
        };
        again = sooner(again, guard.recheck_after);
        again = sooner(again, self.evaluate_health(guard.health_due, ctx));
        self.start_preflight(guard.preflight_run, hcpkg, ctx);
        for (namespace, step) in writes {
            let write = info_span!(parent: &step, "write Package", k8s.namespace.name = %namespace);
            let template = match &guard.proven {
                Some((namespaces, proven)) if namespaces.contains(&namespace) => proven,
                _ => &guard.template,
            };
            let mut body = desired_package(hcpkg, template, &namespace);
            // The Package's reconcile continues this trace from the annotation it is written with.
            if let Some(traceparent) = write.in_scope(current_traceparent) {
                body["metadata"]["annotations"][TRACE_PARENT_ANNOTATION] = traceparent.into();
            }
            self.state
                .writing
                .insert(namespace.clone(), template.spec.clone());
            let over = guard.if_unchanged.get(&namespace).cloned();
            self.child(&namespace, ctx).do_send(PackageCommand::Apply {
                body,
                over,
                span: write,
            });
        }
        for namespace in &deletes {
            self.child(namespace, ctx).do_send(PackageCommand::Delete);
        }
        again.map_or(Action::AwaitChange, Action::RequeueAfter)
    }

    fn child(&mut self, namespace: &str, ctx: &mut Context<Self>) -> Addr<HcpNamespaceActor> {
        let name = self.name();
        let context = self.context.clone();
        let supervisor = ctx.address().recipient();
        self.state
            .children
            .entry(namespace.to_owned())
            .or_insert_with(|| {
                HcpNamespaceActor::new(context, namespace.to_owned(), name, supervisor).start()
            })
            .clone()
    }
}

/// Whether the stored status says the current generation's rollout was under way: written for this
/// generation with Progressing=True (by this manager before a restart, or by another replica).
fn under_way(hcpkg: &HostedClusterPackage) -> bool {
    status_of_this_generation(hcpkg).is_some_and(|status| {
        status
            .conditions
            .iter()
            .any(|c| c.type_ == PROGRESSING && c.status == "True")
    })
}

/// The stored status, when it is of the current generation: a manager before this one planned it.
fn status_of_this_generation(hcpkg: &HostedClusterPackage) -> Option<&HostedClusterPackageStatus> {
    let generation = hcpkg.metadata.generation.unwrap_or_default();
    hcpkg
        .status
        .as_ref()
        .filter(|status| status.observed_generation == generation)
}

/// Why the status was not written.
#[derive(Debug)]
enum StatusWriteError {
    /// The object changed since the version the status was planned from.
    Conflict,
    Failed(String),
}

/// Writes `status` if the object is still at `read_at` (a resourceVersion precondition), whose status
/// is `stored`; returns the resourceVersion written. What went away since `stored` is removed: a halt
/// that ended, an earlier halt's `rolledBackAt`, emptied lists.
async fn write_status(
    client: &kube::Client,
    name: &str,
    read_at: Option<&str>,
    stored: &HostedClusterPackageStatus,
    status: &HostedClusterPackageStatus,
) -> Result<Option<String>, StatusWriteError> {
    let api = Api::<HostedClusterPackage>::all(client.clone());
    match replace_status_over(&api, name, stored, status, read_at).await {
        Ok(written) => Ok(written),
        Err(kube::Error::Api(e)) if e.code == 409 => Err(StatusWriteError::Conflict),
        Err(e) => Err(StatusWriteError::Failed(format!("writing the status: {e}"))),
    }
}

impl Handler<SelectionChanged> for HostedClusterPackageActor {
    type Result = ();
    fn handle(&mut self, _: SelectionChanged, ctx: &mut Context<Self>) {
        self.request_reconcile(ctx);
    }
}

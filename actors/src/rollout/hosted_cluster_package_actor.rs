//! The HostedClusterPackage supervisor: one per HostedClusterPackage. It keeps the selected HostedClusters
//! and their Packages in view, runs the rollout planner on every change, persists the in-flight set in
//! `status.processing` before any update is written, hands each write to the namespace's
//! [`HcpNamespaceActor`], writes the status when it changes, and publishes the rollout's steps.
//!
//! The rules live in `engine::rollout_plan`; this actor only gathers inputs and carries out plans.

use pko_proto::well_known::HOSTED_CLUSTER_PACKAGE_LABEL;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::future::LocalBoxFuture;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::Api;
use opentelemetry::trace::TraceContextExt;
use pko_proto::core::hosted_cluster_package::{HostedClusterPackage, HostedClusterPackageStatus};
use pko_proto::core::package::{Package, PackageTemplateSpec};
use pko_proto::rollout_events::RolloutEventKind;
use pko_proto::rollout_events::{RolloutEvent, EVENT_VERSION};
use tracing::{info_span, warn, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::engine::api_time::elapsed;
use crate::engine::health_check::HealthState;
use crate::engine::hosted_cluster_package::{
    decide_rollout, desired_package, GateInput, OwnedPackage, RolloutDecision, RolloutSnapshot,
    RolloutStep,
};
use crate::engine::promotion_gate::{record_changed, rollout_record, GateVerdict, OwnRollout};
use crate::engine::resource_version::response_is_newer;
use crate::engine::rollout_events::{policy_steps, rollout_steps, story_so_far, RolloutView};
use crate::engine::rollout_guard::{stored_observations, HealthObservation, HealthObservations};
use crate::engine::rollout_plan::{group_key, Counts, RolloutInput, RolloutPlan, UNKNOWN_GROUP};
use crate::engine::rollout_policy::HealthCheck;
use crate::engine::rollout_status::AVAILABLE;
use crate::engine::rollout_status::{progress_only, PROGRESSING};
use crate::engine::status_hold::StatusHold;
use crate::engine::transition_events::{rollout_transition, TransitionEvent};
use crate::manager::context::ManagerContext;
use crate::objects::object_meta::{event_reference, write_status_over};
use crate::rollout::hcp_namespace_actor::{HcpNamespaceActor, PackageCommand, PackageWritten};
use crate::rollout::health_queries::unconfigured;
use crate::rollout::hosted_cluster_fleet::FleetChanged;
use crate::runtime::object_actor::{
    done, work, Action, ObjectActor, Reconcile, ReconcileError, Report, Work,
};
use crate::runtime::reconcile_gate::Backoff;
use crate::runtime::telemetry::{current_traceparent, trace_id_of};
use pko_proto::well_known::TRACE_PARENT_ANNOTATION;

/// The root span of one rollout step (the decision to create or update one Package), linked to the
/// reconcile that decided it.
fn rollout_step_span(name: &str, generation: i64, namespace: &str, group: Option<String>) -> Span {
    let span = info_span!(
        parent: None,
        "rollout step",
        pko.hostedclusterpackage = %name,
        pko.revision = generation,
        pko.partition = group.as_deref().unwrap_or(UNKNOWN_GROUP),
        k8s.namespace.name = %namespace,
    );
    let decided_in = Span::current().context().span().span_context().clone();
    if decided_in.is_valid() {
        span.add_link(decided_in);
    }
    span
}

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
    recheck_after: Option<Duration>,
    health_due: Vec<(String, HealthCheck)>,
}

/// The sooner of two optional delays.
fn sooner(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    a.into_iter().chain(b).min()
}

/// The HostedClusterPackage controller's own state.
#[derive(Default)]
pub struct HostedClusterPackageController {
    /// Owned Packages by namespace, from this supervisor's own watch of them; `None` until its first
    /// list is complete (planning on a partial view could recreate existing Packages past the budget).
    /// Shared, not copied: every reconcile snapshots the whole fleet's Packages.
    packages: Option<BTreeMap<String, Arc<OwnedPackage>>>,
    /// Whether the watch of the owned Packages runs; what its current re-list found so far.
    watching: bool,
    listing: BTreeMap<String, Arc<OwnedPackage>>,
    /// The resourceVersion of each owned Package as last taken into `packages` (from the watch or a
    /// write's response): a response older than what the watch showed is not taken.
    versions: BTreeMap<String, String>,
    children: BTreeMap<String, Addr<HcpNamespaceActor>>,
    /// Writes handed to children and not answered yet: planned as updated and unavailable.
    writing: BTreeSet<String>,
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
}

/// How often a health check of a soaking group is evaluated.
const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// What the progress hold waits for: a write that stores it along. Each Package moving through its
/// update changes the counts two or three times, and with several Packages in flight those changes are
/// merged into the writes that store the next updates, instead of one status write each.
const AWAITING_WRITE: &str = "a write that stores the progress";

/// One health check evaluated.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct HealthEvaluated {
    group: String,
    check: String,
    observation: HealthObservation,
}

/// What the fleet's hub reports changed.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct HubChanged;

pub type HostedClusterPackageActor = ObjectActor<HostedClusterPackageController>;

impl Reconcile for HostedClusterPackageController {
    type Shared = ManagerContext;
    type Object = HostedClusterPackage;
    type Reported = ();
    const CONTROLLER: &'static str = "hosted_cluster_package";
    const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));

    fn reconcile(
        actor: &mut HostedClusterPackageActor,
        hcpkg: HostedClusterPackage,
        ctx: &mut Context<HostedClusterPackageActor>,
    ) -> Work<Self> {
        let name = actor.name();
        actor.context.rollouts.fleet.set_selector(
            &name,
            &hcpkg.spec.hosted_cluster_selector,
            ctx.address().recipient(),
        );
        if !actor.state.watching {
            // Its own watch of the Packages it owns, wherever they live (sharded: on any replica);
            // it ends with the actor. Its first complete list wakes this actor.
            actor.state.watching = true;
            let api: Api<Package> = Api::all(actor.context.runtime.watch_client.clone());
            let owned = format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={name}");
            ctx.add_stream(
                watcher::watcher(api, watcher::Config::default().labels(&owned))
                    .default_backoff()
                    .boxed(),
            );
        }
        if !actor.context.rollouts.fleet.is_ready() {
            // Woken by the fleet once it is complete.
            return done();
        }
        let Some(packages) = actor.state.packages.clone() else {
            return done();
        };
        let hub = actor.context.rollouts.hub.clone();
        if let (Some(hub), false) = (&hub, actor.state.following_hub) {
            // A rollout in a fleet decides again whenever the hub's records or reachability change: a
            // gate may open, and a release halted elsewhere halts here.
            actor.state.following_hub = true;
            let changes = hub_changes(hub.subscribe());
            ctx.add_stream(changes);
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
            clusters: actor.context.rollouts.fleet.selected(selector),
            hcpkg,
            packages,
            writing: actor.state.writing.clone(),
            failures: actor.state.failures.clone(),
            gate,
            health: actor.state.health.clone(),
        };
        let decision = decide_rollout(&snapshot, Timestamp::now());
        actor.carry_out(decision)
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
        // Its Packages go with it through their owner references.
        actor.context.rollouts.fleet.remove_selector(&actor.name());
        None
    }
}

impl HostedClusterPackageActor {
    fn name(&self) -> String {
        self.object
            .as_ref()
            .and_then(|h| h.metadata.name.clone())
            .unwrap_or_default()
    }

    /// Persists the in-flight set, then writes Packages, then the status; publishes the steps.
    fn carry_out(&mut self, decision: RolloutDecision) -> Work<HostedClusterPackageController> {
        let Some(hcpkg) = self.object.clone() else {
            return done();
        };
        let previous_status = hcpkg.status.clone().unwrap_or_default();
        let step = match decision {
            RolloutDecision::Invalid(status) => StepToCarry::invalid(*status),
            RolloutDecision::Planned(step) => self.step_to_carry(&hcpkg, &previous_status, *step),
        };
        if !step.events.is_empty() {
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
        let events_sink = self.context.runtime.events.clone();
        let status = step.status.clone();
        let events = step.events.clone();
        let transitions = step.transitions.clone();
        let run = async move {
            // The in-flight set (and the rest of the status) goes first: a crash after this point
            // finds every update it was about to make already counted. It is written only over the
            // version it was planned from, so a replica that lost its leadership cannot overwrite it.
            let written_at = if write_now {
                write_status(&client, &name, read_at.as_deref(), &status).await?
            } else {
                None
            };
            events_sink.raise_transitions(&reference, transitions);
            if let Some(publisher) = publisher {
                publisher.enqueue(events);
            }
            Ok::<_, StatusWriteError>(written_at)
        };
        work(run, move |written, act: &mut Self, ctx| match written {
            Ok(written_at) => Ok(act.carried(&hcpkg, step, written_at, progress_wait, ctx)),
            Err(StatusWriteError::Conflict) => Ok(Action::Waiting(
                "the HostedClusterPackage changed since it was read; planning again".to_owned(),
            )),
            Err(StatusWriteError::Failed(error)) => Err(ReconcileError::Failed(format!(
                "{error}; no Package is written before the status"
            ))),
        })
    }

    /// What a planned step asks to be done: the rollout's story told since the last plan (events and
    /// the traces of Package updates), the status, and the writes.
    fn step_to_carry(
        &mut self,
        hcpkg: &HostedClusterPackage,
        previous_status: &HostedClusterPackageStatus,
        step: RolloutStep,
    ) -> StepToCarry {
        let RolloutStep {
            input,
            plan,
            status,
            deletes,
            gate,
            template_hash,
            template,
            recheck_after,
            health_due,
        } = step;
        let name = self.name();
        let generation = hcpkg.metadata.generation.unwrap_or_default();
        let view = RolloutView {
            generation,
            input: &input,
            plan: &plan,
        };
        let previous = self.state.last.as_ref().map(|l| RolloutView {
            generation: l.generation,
            input: &l.input,
            plan: &l.plan,
        });
        // Taking over a rollout under way: what was told before is not known here, so the stream gets
        // the story so far (it drops what it holds) and no Event is raised again.
        let (mut steps, retold) = match (&gate, previous) {
            // Held at the gate: nothing of the new template happens; the steps are told against the
            // last plan once it opens.
            (GateVerdict::Closed(_), _) => (Vec::new(), false),
            (_, Some(previous)) => (rollout_steps(Some(&previous), &view), false),
            (_, None) if under_way(hcpkg) => (story_so_far(&view), true),
            (_, None) => (rollout_steps(None, &view), false),
        };
        let gate_step = self.gate_step(&gate, generation);
        steps.splice(0..0, gate_step);
        steps.extend(policy_steps(previous_status, &status));
        // Each Package update is a trace of its own, from this decision to the hosted cluster.
        let writes: BTreeMap<String, Span> = plan
            .create
            .iter()
            .chain(&plan.update)
            .map(|namespace| {
                let group = input
                    .targets
                    .iter()
                    .find(|t| t.namespace == *namespace)
                    .and_then(|t| group_key(t.label.as_deref(), input.partition.as_ref()));
                let span = rollout_step_span(&name, generation, namespace, group);
                (namespace.clone(), span)
            })
            .collect();
        let events = self.rollout_events(hcpkg, steps, &writes);
        let partition = plan
            .current_group
            .and_then(|i| plan.groups.get(i))
            .map(|g| g.name.clone().unwrap_or_else(|| UNKNOWN_GROUP.to_owned()));
        let hub = HubReport {
            gate: gate.clone(),
            template_hash,
            counts: plan.counts,
            partition,
        };
        let next = (!gate.is_closed()).then_some(LastPlan {
            generation,
            input,
            plan,
        });
        let transitions = if retold {
            Vec::new()
        } else {
            events.iter().filter_map(rollout_transition).collect()
        };
        StepToCarry {
            status,
            writes,
            deletes,
            events,
            transitions,
            next,
            hub: Some(hub),
            guard: Some(Guard {
                template,
                recheck_after,
                health_due,
            }),
        }
    }

    /// The rollout events of `steps`; a Package update carries the trace of its step.
    fn rollout_events(
        &self,
        hcpkg: &HostedClusterPackage,
        steps: Vec<crate::engine::rollout_events::RolloutStep>,
        traced: &BTreeMap<String, Span>,
    ) -> Vec<RolloutEvent> {
        let decision = current_traceparent();
        steps
            .into_iter()
            .map(|s| {
                let step_span = s
                    .namespace
                    .as_ref()
                    .filter(|_| s.kind == RolloutEventKind::PackageUpdated)
                    .and_then(|namespace| traced.get(namespace));
                let traceparent = match step_span {
                    Some(span) => span.in_scope(current_traceparent),
                    None => decision.clone(),
                };
                let trace_id = traceparent
                    .as_deref()
                    .and_then(trace_id_of)
                    .map(str::to_owned);
                RolloutEvent {
                    version: EVENT_VERSION,
                    kind: s.kind,
                    hosted_cluster_package: self.name(),
                    uid: hcpkg.metadata.uid.clone().unwrap_or_default(),
                    generation: hcpkg.metadata.generation.unwrap_or_default(),
                    group: s.group,
                    namespace: s.namespace,
                    message: s.message,
                    source: self.context.rollouts.source.clone(),
                    trace_id,
                    traceparent,
                }
            })
            .collect()
    }

    /// Takes a carried step's result back: the hub's record, the status as written, the health checks
    /// due, and the Package writes handed to the namespaces' actors. Returns when to decide again
    /// (a soak or a progress deadline ends, a health check falls due, a held status must be written).
    fn carried(
        &mut self,
        hcpkg: &HostedClusterPackage,
        step: StepToCarry,
        written_at: Option<String>,
        progress_wait: Option<Duration>,
        ctx: &mut Context<Self>,
    ) -> Action {
        let StepToCarry {
            status,
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
            if let Some(h) = self.object.as_mut() {
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
        for (namespace, step) in writes {
            let write = info_span!(parent: &step, "write Package", k8s.namespace.name = %namespace);
            let mut body = desired_package(hcpkg, &guard.template, &namespace);
            // The Package's reconcile continues this trace from the annotation it is written with.
            if let Some(traceparent) = write.in_scope(current_traceparent) {
                body["metadata"]["annotations"][TRACE_PARENT_ANNOTATION] = traceparent.into();
            }
            self.state.writing.insert(namespace.clone());
            self.child(&namespace, ctx)
                .do_send(PackageCommand::Apply(body, write));
        }
        for namespace in &deletes {
            self.child(namespace, ctx).do_send(PackageCommand::Delete);
        }
        again.map_or(Action::AwaitChange, Action::RequeueAfter)
    }

    /// Evaluates the due health checks that were not evaluated within the interval, off the actor.
    /// Returns when the soonest check skipped now falls due.
    fn evaluate_health(
        &mut self,
        due: Vec<(String, HealthCheck)>,
        ctx: &mut Context<Self>,
    ) -> Option<Duration> {
        let now = Timestamp::now();
        let mut soonest: Option<Duration> = None;
        for (group, check) in due {
            let key = (group.clone(), check.name.clone());
            if self.state.evaluating.contains(&key) {
                continue;
            }
            let age = self.state.health.get(&key).map(|o| elapsed(o.at, now));
            if let Some(age) = age.filter(|a| *a < HEALTH_CHECK_INTERVAL) {
                // Evaluated lately: again once the interval is over.
                let left = HEALTH_CHECK_INTERVAL - age;
                soonest = Some(soonest.map_or(left, |s| s.min(left)));
                continue;
            }
            self.state.evaluating.insert(key);
            let prometheus = self.context.rollouts.prometheus.clone();
            let address = ctx.address();
            actix::spawn(async move {
                let observation = match prometheus {
                    Some(p) => p.evaluate(&check).await,
                    None => unconfigured(),
                };
                address.do_send(HealthEvaluated {
                    group,
                    check: check.name,
                    observation,
                });
            });
        }
        soonest
    }

    /// The promotion gate's own step: `promotionOpened` when it opened now, `promotionWaiting` when whom
    /// it waits for changed.
    fn gate_step(
        &mut self,
        gate: &GateVerdict,
        generation: i64,
    ) -> Option<crate::engine::rollout_events::RolloutStep> {
        let (kind, message) = match gate {
            GateVerdict::Ungated | GateVerdict::Open { opened: None } => return None,
            GateVerdict::Open { opened: Some(_) } => {
                self.state.gate_told = None;
                (RolloutEventKind::PromotionOpened, String::new())
            }
            GateVerdict::Closed(closed) => {
                let told = (
                    generation,
                    format!("{}: {}", closed.reason, closed.waiting_for),
                );
                if self.state.gate_told.as_ref() == Some(&told) {
                    return None;
                }
                self.state.gate_told = Some(told);
                (RolloutEventKind::PromotionWaiting, closed.message.clone())
            }
        };
        Some(crate::engine::rollout_events::RolloutStep {
            kind,
            group: None,
            namespace: None,
            message,
        })
    }

    /// Tells the fleet's hub (when in a fleet) where this rollout stands.
    fn report_to_hub(&self, status: &HostedClusterPackageStatus, report: &HubReport) {
        let HubReport {
            gate,
            template_hash,
            counts,
            partition,
        } = report;
        let Some(hub) = &self.context.rollouts.hub else {
            return;
        };
        let name = self.name();
        let generation = self
            .object
            .as_ref()
            .and_then(|h| h.metadata.generation)
            .unwrap_or_default();
        let available = status
            .conditions
            .iter()
            .any(|c| c.type_ == AVAILABLE && c.status == "True");
        let own = OwnRollout {
            cluster: hub.cluster(),
            name: &name,
            generation,
            template_hash,
            partition: partition.clone(),
            counts,
            available,
            gate,
            last_event_at: self.state.last_event_at,
            halted: status.halted.as_ref().map(|h| h.template_hash.as_str()),
        };
        let previous = hub.own_record(&name);
        let record = rollout_record(&own, previous.as_ref(), Timestamp::now());
        let changed = previous.as_ref().is_none_or(|p| record_changed(p, &record));
        hub.report(record, changed);
        let open = match gate {
            GateVerdict::Ungated => None,
            GateVerdict::Open { .. } => Some(true),
            GateVerdict::Closed(_) => Some(false),
        };
        hub.metrics().gate(&name, open);
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
    let generation = hcpkg.metadata.generation.unwrap_or_default();
    hcpkg.status.as_ref().is_some_and(|status| {
        status.observed_generation == generation
            && status
                .conditions
                .iter()
                .any(|c| c.type_ == PROGRESSING && c.status == "True")
    })
}

/// Why the status was not written.
#[derive(Debug)]
enum StatusWriteError {
    /// The object changed since the version the status was planned from.
    Conflict,
    Failed(String),
}

/// Writes `status` if the object is still at `read_at` (a resourceVersion precondition); returns the
/// resourceVersion written. Emptied lists (processing, partitions) are cleared too.
async fn write_status(
    client: &kube::Client,
    name: &str,
    read_at: Option<&str>,
    status: &HostedClusterPackageStatus,
) -> Result<Option<String>, StatusWriteError> {
    let lists = ["conditions", "partitions", "processing"];
    let api = Api::<HostedClusterPackage>::all(client.clone());
    match write_status_over(&api, name, status, &lists, read_at).await {
        Ok(written) => Ok(written),
        Err(kube::Error::Api(e)) if e.code == 409 => Err(StatusWriteError::Conflict),
        Err(e) => Err(StatusWriteError::Failed(format!("writing the status: {e}"))),
    }
}

/// The hub's changes as a stream of [`HubChanged`].
fn hub_changes(
    changes: tokio::sync::watch::Receiver<u64>,
) -> impl futures::Stream<Item = HubChanged> {
    futures::stream::unfold(changes, |mut changes| async move {
        changes.changed().await.ok()?;
        Some((HubChanged, changes))
    })
}

impl StreamHandler<HubChanged> for HostedClusterPackageActor {
    fn handle(&mut self, _: HubChanged, ctx: &mut Context<Self>) {
        self.request_reconcile(ctx);
    }

    /// The hub link lives as long as the manager.
    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl Handler<HealthEvaluated> for HostedClusterPackageActor {
    type Result = ();
    fn handle(&mut self, evaluated: HealthEvaluated, ctx: &mut Context<Self>) {
        let key = (evaluated.group, evaluated.check);
        self.state.evaluating.remove(&key);
        let result = match evaluated.observation.state {
            HealthState::Passing => "passing",
            HealthState::Failing => "failing",
            HealthState::Unknown => "unknown",
        };
        self.context
            .metrics
            .rollouts
            .health_check(&self.name(), result);
        self.state.health.insert(key, evaluated.observation);
        self.request_reconcile(ctx);
    }
}

impl Handler<FleetChanged> for HostedClusterPackageActor {
    type Result = ();
    fn handle(&mut self, _: FleetChanged, ctx: &mut Context<Self>) {
        self.request_reconcile(ctx);
    }
}

impl StreamHandler<Result<watcher::Event<Package>, watcher::Error>> for HostedClusterPackageActor {
    fn handle(
        &mut self,
        event: Result<watcher::Event<Package>, watcher::Error>,
        ctx: &mut Context<Self>,
    ) {
        let owned = |package: Package| {
            let owned = OwnedPackage::from(package);
            (
                owned.meta.namespace.clone().unwrap_or_default(),
                Arc::new(owned),
            )
        };
        let state = &mut self.state;
        // Every state the watch shows is the version a write's answer must be newer than to be taken.
        if let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = &event {
            if let (Some(namespace), Some(version)) =
                (&p.metadata.namespace, &p.metadata.resource_version)
            {
                state.versions.insert(namespace.clone(), version.clone());
            }
        }
        match event {
            Ok(watcher::Event::Init) => {
                state.listing.clear();
                return;
            }
            Ok(watcher::Event::InitApply(package)) => {
                let (namespace, package) = owned(package);
                state.listing.insert(namespace, package);
                return;
            }
            // A complete list replaces what was known: Packages deleted meanwhile are gone.
            Ok(watcher::Event::InitDone) => {
                let listed = std::mem::take(&mut state.listing);
                state
                    .versions
                    .retain(|namespace, _| listed.contains_key(namespace));
                if state.packages.as_ref() == Some(&listed) {
                    return;
                }
                state.packages = Some(listed);
            }
            // Most events of a Package change nothing the decision reads (its own status writes of
            // other fields, labels, the echo of this supervisor's write): those wake nobody.
            Ok(watcher::Event::Apply(package)) => {
                let (namespace, package) = owned(package);
                let Some(packages) = state.packages.as_mut() else {
                    return;
                };
                if packages.get(&namespace) == Some(&package) {
                    return;
                }
                packages.insert(namespace, package);
            }
            Ok(watcher::Event::Delete(package)) => {
                let (namespace, _) = owned(package);
                state.versions.remove(&namespace);
                let Some(packages) = state.packages.as_mut() else {
                    return;
                };
                if packages.remove(&namespace).is_none() {
                    return;
                }
            }
            Err(error) => {
                warn!(%error, "watching the owned Packages; retrying");
                return;
            }
        }
        self.request_reconcile(ctx);
    }

    /// The watch ends only with the actor.
    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl Handler<PackageWritten> for HostedClusterPackageActor {
    type Result = ();
    fn handle(&mut self, written: PackageWritten, ctx: &mut Context<Self>) {
        self.state.writing.remove(&written.namespace);
        match written.result {
            Ok(stored) => {
                self.state.failures.remove(&written.namespace);
                if let (Some(packages), Some(stored)) = (self.state.packages.as_mut(), stored) {
                    match serde_json::from_value::<Package>(stored) {
                        // Taken only when newer than what the watch already showed: the Package may
                        // have moved on (become available) between the write and this answer.
                        Ok(p) => {
                            let version = p.metadata.resource_version.clone();
                            let watched = self.state.versions.get(&written.namespace);
                            if response_is_newer(version.as_deref(), watched.map(String::as_str)) {
                                if let Some(version) = version {
                                    self.state
                                        .versions
                                        .insert(written.namespace.clone(), version);
                                }
                                packages.insert(written.namespace, Arc::new(p.into()));
                            }
                        }
                        Err(e) => warn!(error = %e, "cannot read back a written Package"),
                    }
                }
            }
            Err(error) => {
                self.state.failures.insert(written.namespace, error);
            }
        }
        self.request_reconcile(ctx);
    }
}

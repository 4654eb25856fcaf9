//! The phase actor: one per phase of an ObjectSet (or, in a connector, of an ObjectSetPhase). Runs the
//! phase (apply and probe, or teardown) one run at a time, coalescing requests that arrive meanwhile (the
//! latest command wins), retries transient failures with the shared jittered backoff
//! (`runtime::reconcile_gate`), and reports each result to its owner.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use crate::engine::objects::object_set_status::{BlockReason, PhaseProgress};
use crate::engine::objects::phase_plan::PhaseOutcome;
use crate::engine::objects::phase_plan::{PhasePlan, PhaseReport};
use crate::objects::applier::Applier;
use crate::objects::object_cache::ObjectCache;
use crate::objects::phase_runner::{reconcile_phase, teardown_phase, AppliedHashes};
use crate::runtime::reconcile_gate::{Backoff, ReconcileGate, Retire};
use crate::runtime::telemetry::{CapturedTrace, TraceCause};
use tracing::{info_span, Instrument};

const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));

/// What the owner asks a phase to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub enum PhaseCommand {
    Reconcile,
    Teardown,
}

/// Replaces the phase's plan (a new generation of the owner).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct UpdatePlan {
    pub plan: Arc<PhasePlan>,
    pub paused: bool,
    pub version: u64,
    /// The span that asked for it (the owner's reconcile, or a connector's request): the runs of this
    /// plan continue its trace.
    pub cause: CapturedTrace,
}

/// Result of one run, sent to the owner.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct PhaseFinished {
    pub index: usize,
    pub version: u64,
    pub outcome: PhaseOutcome,
    /// The run's span, for what the owner does with the result (a connector's reply).
    pub run: CapturedTrace,
}

pub struct PhaseActor {
    index: usize,
    /// The cluster the phase applies to: the manager's own, or a hosted cluster for a connector.
    applier: Applier,
    cache: ObjectCache,
    plan: Arc<PhasePlan>,
    paused: bool,
    version: u64,
    applied: AppliedHashes,
    /// The latest command; a run started during another one runs it after.
    command: PhaseCommand,
    gate: ReconcileGate,
    owner: Recipient<PhaseFinished>,
    cause: TraceCause,
}

impl PhaseActor {
    pub fn new(
        index: usize,
        applier: Applier,
        cache: ObjectCache,
        update: UpdatePlan,
        owner: Recipient<PhaseFinished>,
    ) -> Self {
        let mut cause = TraceCause::default();
        cause.adopt(update.cause);
        Self {
            cause,
            index,
            applier,
            cache,
            plan: update.plan,
            paused: update.paused,
            version: update.version,
            applied: AppliedHashes::new(),
            command: PhaseCommand::Reconcile,
            gate: ReconcileGate::new(BACKOFF),
            owner,
        }
    }

    /// Runs the latest command now, or right after the running one.
    fn run(&mut self, ctx: &mut Context<Self>) {
        if !self.gate.try_start(ctx) {
            return;
        }
        let command = self.command;
        let applier = self.applier.clone();
        let cache = self.cache.clone();
        let plan = self.plan.clone();
        let paused = self.paused;
        let version = self.version;
        let mut applied = std::mem::take(&mut self.applied);
        let span = info_span!(
            "phase",
            otel.name = %format_args!("phase {}", plan.name),
            pko.phase = %plan.name,
            pko.revision = plan.revision,
            mode = ?command,
        );
        self.cause.attach(&span);
        let run = span.in_scope(CapturedTrace::current);
        let work = async move {
            let outcome = match command {
                PhaseCommand::Reconcile => PhaseOutcome::Reconciled(
                    reconcile_phase(&applier, &cache, &plan, &mut applied, paused).await,
                ),
                PhaseCommand::Teardown => {
                    PhaseOutcome::TornDown(teardown_phase(&applier, &cache, &plan).await)
                }
            };
            (outcome, applied)
        }
        .instrument(span);
        ctx.spawn(
            work.into_actor(self)
                .map(move |(outcome, applied), act, ctx| {
                    act.applied = applied;
                    // A phase waiting on its probes, or on an object pko does not own, looks again with
                    // backoff, level-triggered: a status change whose event pko missed, or a colliding
                    // object deleted (pko does not watch it), cannot wedge it.
                    let retry = match &outcome {
                        PhaseOutcome::Reconciled(r) => r.transient_error || waits_on_others(r),
                        PhaseOutcome::TornDown(t) => !t.errors.is_empty(),
                    };
                    if !retry {
                        // Settled: later runs (an object changed) are not this cause's work.
                        act.cause.settle();
                    }
                    act.owner.do_send(PhaseFinished {
                        index: act.index,
                        version,
                        outcome,
                        run,
                    });
                    if act.gate.finish(ctx, retry, Self::run) {
                        act.run(ctx);
                    }
                }),
        );
    }
}

impl Actor for PhaseActor {
    type Context = Context<Self>;
}

impl Handler<PhaseCommand> for PhaseActor {
    type Result = ();
    fn handle(&mut self, command: PhaseCommand, ctx: &mut Context<Self>) {
        self.command = command;
        self.run(ctx);
    }
}

/// The owner stopped (its object deleted, or moved to another replica): the phase applies nothing more,
/// retries nothing, and stops once its running run ends.
impl Handler<Retire> for PhaseActor {
    type Result = ();
    fn handle(&mut self, retire: Retire, ctx: &mut Context<Self>) {
        self.gate.retire(ctx, retire);
    }
}

impl Handler<UpdatePlan> for PhaseActor {
    type Result = ();
    fn handle(&mut self, update: UpdatePlan, _: &mut Context<Self>) {
        self.plan = update.plan;
        self.paused = update.paused;
        self.version = update.version;
        self.cause.adopt(update.cause);
    }
}

/// Blocked by what others may change without pko hearing of it: its objects' status, a delegated
/// phase's first report, or an object someone else controls (a collision).
fn waits_on_others(report: &PhaseReport) -> bool {
    matches!(
        report.progress,
        PhaseProgress::Blocked {
            reason: BlockReason::ProbeFailure
                | BlockReason::AwaitingStatus
                | BlockReason::AwaitingReport
                | BlockReason::CollisionDetected,
            ..
        }
    )
}

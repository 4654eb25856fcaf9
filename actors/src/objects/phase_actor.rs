//! The phase actor: one per phase of an ObjectSet. Runs the phase (apply and probe, or teardown) one run at
//! a time, coalescing requests that arrive meanwhile, retries transient failures with backoff, and reports
//! each result to its ObjectSet.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use crate::engine::object_set_status::{BlockReason, PhaseProgress};
use crate::objects::applier::Applier;
use crate::objects::object_cache::ObjectCache;
use crate::objects::phase_runner::{
    reconcile_phase, teardown_phase, AppliedHashes, PhasePlan, PhaseReport, TeardownReport,
};

const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

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
}

/// Result of one run, sent to the owner.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct PhaseFinished {
    pub index: usize,
    pub version: u64,
    pub outcome: PhaseOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PhaseOutcome {
    Reconciled(PhaseReport),
    TornDown(TeardownReport),
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
    running: bool,
    queued: Option<PhaseCommand>,
    backoff: Duration,
    retry: Option<SpawnHandle>,
    owner: Recipient<PhaseFinished>,
}

impl PhaseActor {
    pub fn new(
        index: usize,
        applier: Applier,
        cache: ObjectCache,
        update: UpdatePlan,
        owner: Recipient<PhaseFinished>,
    ) -> Self {
        Self {
            index,
            applier,
            cache,
            plan: update.plan,
            paused: update.paused,
            version: update.version,
            applied: AppliedHashes::new(),
            running: false,
            queued: None,
            backoff: BACKOFF_MIN,
            retry: None,
            owner,
        }
    }

    fn run(&mut self, command: PhaseCommand, ctx: &mut Context<Self>) {
        if self.running {
            self.queued = Some(command);
            return;
        }
        if let Some(handle) = self.retry.take() {
            ctx.cancel_future(handle);
        }
        self.running = true;
        let applier = self.applier.clone();
        let cache = self.cache.clone();
        let plan = self.plan.clone();
        let paused = self.paused;
        let version = self.version;
        let mut applied = std::mem::take(&mut self.applied);
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
        };
        ctx.spawn(
            work.into_actor(self)
                .map(move |(outcome, applied), act, ctx| {
                    act.applied = applied;
                    act.running = false;
                    // A phase waiting on its probes looks again with backoff, level-triggered, so a
                    // status change whose event pko missed cannot wedge it.
                    let retry = match &outcome {
                        PhaseOutcome::Reconciled(r) => r.transient_error || waits_on_probes(r),
                        PhaseOutcome::TornDown(t) => !t.errors.is_empty(),
                    };
                    if retry {
                        let delay = act.backoff;
                        act.backoff = (act.backoff * 2).min(BACKOFF_MAX);
                        act.retry =
                            Some(ctx.run_later(delay, move |act, ctx| act.run(command, ctx)));
                    } else {
                        act.backoff = BACKOFF_MIN;
                    }
                    act.owner.do_send(PhaseFinished {
                        index: act.index,
                        version,
                        outcome,
                    });
                    if let Some(next) = act.queued.take() {
                        act.run(next, ctx);
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
        self.run(command, ctx);
    }
}

impl Handler<UpdatePlan> for PhaseActor {
    type Result = ();
    fn handle(&mut self, update: UpdatePlan, _: &mut Context<Self>) {
        self.plan = update.plan;
        self.paused = update.paused;
        self.version = update.version;
    }
}

fn waits_on_probes(report: &PhaseReport) -> bool {
    matches!(
        report.progress,
        PhaseProgress::Blocked {
            reason: BlockReason::ProbeFailure | BlockReason::AwaitingStatus,
            ..
        }
    )
}

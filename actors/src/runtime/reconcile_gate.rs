//! One run at a time per actor: a request arriving during a run is coalesced into one more run after it,
//! and a failed run is retried after a jittered exponential backoff (`backon`), which a success resets.
//! Used by the reconcile shell (`runtime/object_actor.rs`) and by the actors an object actor starts for
//! its parts (phases, HCP namespace writers), which it retires ([`Retire`]) when it stops: a child must
//! not run on, or retry, once its owner let the object go.

use std::time::Duration;

use actix::prelude::*;
use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The bounds of a retry backoff. Each delay is drawn from `[d/2, d)` where `d` doubles from `min` up to
/// `max`, so actors that failed together (an apiserver outage) do not retry in lockstep, and no delay
/// exceeds `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

impl Backoff {
    pub const fn new(min: Duration, max: Duration) -> Self {
        Self { min, max }
    }

    /// A delay drawn from `[d/2, d)`: periodic work of many actors spread out.
    pub fn jittered(d: Duration) -> Duration {
        Self::new(d, d).delays().next().unwrap_or(d)
    }

    /// The delays from `min` doubling to `max`, each drawn from `[d/2, d)`, without end.
    pub fn delays(self) -> ExponentialBackoff {
        // backon's jitter adds up to 100%: halving its bounds keeps every delay below `d`.
        ExponentialBuilder::new()
            .with_min_delay(self.min / 2)
            .with_max_delay(self.max / 2)
            .with_jitter()
            .without_max_times()
            .build()
    }
}

/// Asks an actor run by a [`ReconcileGate`] to stop for good: at once when idle, else as soon as its
/// running run ends (never with a request of its own in flight); the sender is answered then.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Retire(pub tokio::sync::oneshot::Sender<()>);

/// Retires `actor` ([`Retire`]); the receiver is answered (or closed) once it stopped.
pub fn retire<A>(actor: &Addr<A>) -> Retiring
where
    A: Actor + Handler<Retire>,
    A::Context: actix::dev::ToEnvelope<A, Retire>,
{
    let (stopped, answered) = tokio::sync::oneshot::channel();
    actor.do_send(Retire(stopped));
    Retiring(answered)
}

/// An actor asked to retire, until it has stopped.
#[derive(Debug)]
pub struct Retiring(tokio::sync::oneshot::Receiver<()>);

impl Retiring {
    /// Whether the actor has stopped.
    pub fn stopped(&mut self) -> bool {
        !matches!(
            self.0.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty)
        )
    }

    /// Resolves once every one of `retiring` stopped.
    pub async fn all(retiring: Vec<Retiring>) {
        // A closed channel: the actor had stopped already, or stopped without answering; either way it
        // runs no more.
        futures::future::join_all(retiring.into_iter().map(|Retiring(answered)| answered)).await;
    }
}

/// The run state of one actor's reconciles.
pub struct ReconcileGate {
    running: bool,
    dirty: bool,
    retry: Option<SpawnHandle>,
    backoff: Backoff,
    delays: ExponentialBackoff,
    /// Retired: no run starts again.
    retired: bool,
    /// Answered when the retired actor stops.
    retirement: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl ReconcileGate {
    pub fn new(backoff: Backoff) -> Self {
        Self {
            running: false,
            dirty: false,
            retry: None,
            backoff,
            delays: backoff.delays(),
            retired: false,
            retirement: Vec::new(),
        }
    }

    /// Whether a run is under way.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// True when a run may start now (a pending retry is cancelled); false when one is running, in which
    /// case another run follows it.
    pub fn try_start<A>(&mut self, ctx: &mut Context<A>) -> bool
    where
        A: Actor<Context = Context<A>>,
    {
        if self.retired {
            return false;
        }
        if self.running {
            self.dirty = true;
            return false;
        }
        if let Some(handle) = self.retry.take() {
            ctx.cancel_future(handle);
        }
        self.running = true;
        true
    }

    /// Ends a run. A failed one schedules `rerun` after the next backoff delay. Returns whether a request
    /// arrived during the run, so the caller runs again now.
    pub fn finish<A>(
        &mut self,
        ctx: &mut Context<A>,
        failed: bool,
        rerun: fn(&mut A, &mut Context<A>),
    ) -> bool
    where
        A: Actor<Context = Context<A>>,
    {
        self.running = false;
        if self.retired {
            stop_retired(ctx, std::mem::take(&mut self.retirement));
            return false;
        }
        if failed {
            let delay = self.delays.next().unwrap_or(self.backoff.max);
            self.retry = Some(ctx.run_later(delay, rerun));
        } else {
            self.reset_backoff();
        }
        std::mem::take(&mut self.dirty)
    }

    /// Starts the backoff over (the object changed: old failures say nothing about it).
    pub fn reset_backoff(&mut self) {
        self.delays = self.backoff.delays();
    }

    /// Ends the actor's runs for good ([`Retire`]): a pending retry is cancelled and no run starts again;
    /// the actor stops now if no run is under way, else when [`ReconcileGate::finish`] ends it.
    pub fn retire<A>(&mut self, ctx: &mut Context<A>, Retire(stopped): Retire)
    where
        A: Actor<Context = Context<A>>,
    {
        if let Some(handle) = self.retry.take() {
            ctx.cancel_future(handle);
        }
        self.retired = true;
        self.retirement.push(stopped);
        if !self.running {
            stop_retired(ctx, std::mem::take(&mut self.retirement));
        }
    }

    /// Ends a run whose result nobody acts on (the actor is letting its object go): nothing follows it.
    pub fn abandon(&mut self) {
        self.running = false;
        self.dirty = false;
    }
}

fn stop_retired<A>(ctx: &mut Context<A>, waiting: Vec<tokio::sync::oneshot::Sender<()>>)
where
    A: Actor<Context = Context<A>>,
{
    ctx.stop();
    for stopped in waiting {
        let _ = stopped.send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// An actor whose runs end when the test says, failed or not.
    struct Runner {
        gate: ReconcileGate,
        runs: Arc<AtomicUsize>,
        /// Told when a run ended.
        finished: Option<tokio::sync::mpsc::UnboundedSender<()>>,
    }

    #[derive(Message)]
    #[rtype(result = "()")]
    struct Finished(tokio::sync::mpsc::UnboundedSender<()>);

    impl Handler<Finished> for Runner {
        type Result = ();
        fn handle(&mut self, Finished(told): Finished, _: &mut Context<Self>) {
            self.finished = Some(told);
        }
    }

    impl Actor for Runner {
        type Context = Context<Self>;
    }

    #[derive(Message)]
    #[rtype(result = "()")]
    struct Run(tokio::sync::oneshot::Receiver<bool>);

    impl Handler<Run> for Runner {
        type Result = ();
        fn handle(&mut self, Run(ends): Run, ctx: &mut Context<Self>) {
            if !self.gate.try_start(ctx) {
                return;
            }
            self.runs.fetch_add(1, Ordering::SeqCst);
            ctx.spawn(fut::wrap_future(ends).map(|failed, act: &mut Self, ctx| {
                act.gate.finish(ctx, failed.unwrap_or(true), |act, _| {
                    act.runs.fetch_add(1, Ordering::SeqCst);
                });
                if let Some(told) = &act.finished {
                    let _ = told.send(());
                }
            }));
        }
    }

    impl Handler<Retire> for Runner {
        type Result = ();
        fn handle(&mut self, retire: Retire, ctx: &mut Context<Self>) {
            self.gate.retire(ctx, retire);
        }
    }

    fn runner() -> (Addr<Runner>, Arc<AtomicUsize>) {
        let runs = Arc::new(AtomicUsize::new(0));
        let gate = ReconcileGate::new(Backoff::new(Duration::from_secs(1), Duration::from_secs(8)));
        let actor = Runner {
            gate,
            runs: runs.clone(),
            finished: None,
        };
        (actor.start(), runs)
    }

    /// A retired child ends its running run first (its write is not cut off half-sent), then stops;
    /// nothing runs again, and the failure it ended with schedules no retry.
    #[actix::test]
    async fn a_retired_actor_stops_after_its_running_run_and_runs_nothing_more() {
        let (actor, runs) = runner();
        let (end, ends) = tokio::sync::oneshot::channel();
        actor.send(Run(ends)).await.unwrap();
        let mut retiring = retire(&actor);
        // Handled in order: the retirement was seen once a later message is answered.
        let (_, never) = tokio::sync::oneshot::channel();
        actor.send(Run(never)).await.unwrap();
        assert!(!retiring.stopped(), "stopped with a run under way");
        end.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), Retiring::all(vec![retiring]))
            .await
            .expect("retired once its run ended");
        let (_, another) = tokio::sync::oneshot::channel();
        let _ = actor.send(Run(another)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "a run started after the retirement"
        );
    }

    /// The zombie the chaos run found: a child whose run failed kept its retry after its owner let the
    /// object go, and applied again from a replica that no longer owned it. Retired, it stops at once
    /// and the retry never runs.
    #[actix::test]
    async fn a_retired_actor_with_a_retry_pending_stops_and_never_retries() {
        let (actor, runs) = runner();
        let (end, ends) = tokio::sync::oneshot::channel();
        let (ended, mut finished) = tokio::sync::mpsc::unbounded_channel();
        actor.send(Run(ends)).await.unwrap();
        actor.send(Finished(ended)).await.unwrap();
        end.send(true).unwrap();
        finished.recv().await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), Retiring::all(vec![retire(&actor)]))
            .await
            .expect("no run in flight: retired at once");
        pko_testenv::wait_until("the retired actor stopped", Duration::from_secs(10), || {
            let connected = actor.connected();
            async move {
                if connected {
                    Err("still running".to_owned())
                } else {
                    Ok(())
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the retry ran");
    }

    #[test]
    fn delays_double_within_jitter_and_never_exceed_the_maximum() {
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(8));
        let delays: Vec<Duration> = backoff.delays().take(6).collect();
        let ceilings = [1, 2, 4, 8, 8, 8];
        for (delay, ceiling) in delays.iter().zip(ceilings) {
            let ceiling = Duration::from_secs(ceiling);
            assert!(
                *delay >= ceiling / 2 && *delay < ceiling,
                "{delay:?} not in [{:?}, {ceiling:?})",
                ceiling / 2
            );
        }
    }
}

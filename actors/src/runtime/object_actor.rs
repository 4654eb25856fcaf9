//! The reconcile shell: one generic actor, [`ObjectActor`], for every watched object the manager owns. An
//! object actor is an implementation of [`Reconcile`] (how to tell a real change from our own status echo,
//! and the reconcile itself) plus the messages only it has; the shell does the rest, once:
//! - keeps the last observed object and filters echoes (`Reconcile::change`);
//! - runs one reconcile at a time, coalescing requests that arrive during a run ([`ReconcileGate`]);
//! - opens the reconcile's span, continuing the trace of the write that caused it (the object's
//!   trace-parent annotation, [`TraceCause`]), and measures its duration and result ([`RuntimeMetrics`]);
//! - retries a failed reconcile after a jittered exponential backoff, reset by a success or a new spec;
//! - records what each observed version tells the outside (`Reconcile::report`: its metrics, and the
//!   Kubernetes Events of its transitions) and drops the metrics when the object goes;
//! - stops the actor when the object is gone, after the implementation's cleanup.
//!
//! It must not know any kind: everything kind-specific is behind the trait.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use actix::dev::ToEnvelope;
use actix::fut::{self, ActorFuture, ActorFutureExt};
use actix::prelude::*;
use futures::future::LocalBoxFuture;
use tracing::{debug, info_span, warn, Span};

use k8s_openapi::api::core::v1::ObjectReference;

use crate::engine::transition_events::TransitionEvent;
use crate::runtime::kind_feed::{FeedTarget, Gone, Observed, Release};
use crate::runtime::meta_view::MetaView;
use crate::runtime::reconcile_gate::{Backoff, ReconcileGate};
use crate::runtime::registry::ObjectRef;
use crate::runtime::runtime_context::SharedContext;
use crate::runtime::runtime_metrics::{ReconcileResult, RuntimeMetrics};
use crate::runtime::telemetry::TraceCause;

/// What a newly observed version of the object asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing a reconcile would act on (our own status write coming back, a resync).
    Echo,
    /// Reconcile.
    Changed,
    /// Reconcile, and start the backoff over: earlier failures say nothing about the new spec.
    Respecified,
}

/// Whether `current` is pko's own status write of `previous` coming back through the watch: the same
/// generation and the same status, as `same_status` compares them (a kind adds what else of the object
/// its reconcile reads, such as an annotation). The rule every kind whose status only pko writes uses in
/// [`Reconcile::change`].
pub fn is_status_echo<O: MetaView>(
    previous: Option<&O>,
    current: &O,
    same_status: impl Fn(&O, &O) -> bool,
) -> bool {
    previous.is_some_and(|known| {
        known.generation() == current.generation() && same_status(known, current)
    })
}

/// How one reconcile ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Failed; run again after the backoff. The reason is logged as a warning.
    Retry(String),
    /// Not finished yet (waiting on something outside pko); look again after the backoff.
    Requeue(String),
}

/// One reconcile's work: an actor future, so it can take its result back into the actor (and, between
/// async steps, read what arrived meanwhile).
pub type Work<R> = Pin<Box<dyn ActorFuture<ObjectActor<R>, Output = Outcome>>>;

/// Work that runs `future` off the actor and hands its output to `finish` in the actor.
pub fn work<R, T>(
    future: impl Future<Output = T> + 'static,
    finish: impl FnOnce(T, &mut ObjectActor<R>, &mut Context<ObjectActor<R>>) -> Outcome + 'static,
) -> Work<R>
where
    R: Reconcile,
    T: 'static,
{
    Box::pin(fut::wrap_future::<_, ObjectActor<R>>(future).map(finish))
}

/// Work that is already finished.
pub fn done<R: Reconcile>() -> Work<R> {
    Box::pin(fut::ready(Outcome::Done))
}

/// The kind-specific part of an object actor.
pub trait Reconcile: Sized + Unpin + 'static {
    /// What the controller's actors share (the composition root's context).
    type Shared: SharedContext;
    /// The engine's view of the owned object.
    type Object: Clone + Unpin + Send + MetaView + 'static;
    /// Names the controller in spans, metrics and logs.
    const CONTROLLER: &'static str;
    const BACKOFF: Backoff;
    /// What [`Reconcile::report`] compares between watched versions (conditions, a revision).
    type Reported: Default + Unpin + 'static;
    /// Whether a running reconcile holds the actor's other messages until it ends (`ctx.wait`), for
    /// actors whose messages must not see a half-installed reconcile.
    const EXCLUSIVE: bool = false;
    /// Reconcile again this long (jittered, `[d/2, d)`) after a successful reconcile even without an
    /// event: drift repair where no watch reports drift, or work that falls due with time.
    fn resync(_context: &Self::Shared) -> Option<Duration> {
        None
    }

    fn new(context: &Self::Shared) -> Self;
    fn key(object: &Self::Object) -> ObjectRef;
    /// What the watch feed keeps of the object for a deletion a re-list finds; kinds whose objects are
    /// large (and followed by a tap) keep their metadata only.
    fn tombstone(object: &Self::Object) -> Self::Object {
        object.clone()
    }
    /// Whether this manager reconciles the object at all.
    fn wants(_object: &Self::Object) -> bool {
        true
    }
    /// What a newly observed version asks for, given the version it replaces (`None` the first time):
    /// where pko's own status echoes are told from real changes.
    fn change(previous: Option<&Self::Object>, current: &Self::Object) -> Change;
    /// Called once the new version is in `actor.object`, with what [`Reconcile::change`] found, before the
    /// shell acts on it: for controllers that act on an observation themselves (routes, finalizers) or
    /// decide from their own state. Returns what the shell does.
    fn observed(
        _actor: &mut ObjectActor<Self>,
        change: Change,
        _ctx: &mut Context<ObjectActor<Self>>,
    ) -> Change {
        change
    }
    /// Starts one reconcile of `object` (a copy of `actor.object`).
    fn reconcile(
        actor: &mut ObjectActor<Self>,
        object: Self::Object,
        ctx: &mut Context<ObjectActor<Self>>,
    ) -> Work<Self>;
    /// The object was deleted: cleanup that must finish before the actor stops.
    fn gone(
        _actor: &mut ObjectActor<Self>,
        _ctx: &mut Context<ObjectActor<Self>>,
    ) -> Option<LocalBoxFuture<'static, ()>> {
        None
    }
    /// The actor stopped (unregister routes).
    fn stopped(_actor: &mut ObjectActor<Self>) {}
    /// What a newly observed version tells the outside: records its metrics and returns the Events of
    /// its transitions from `previous`, what this returned to remember of the version the watch
    /// delivered before (`None` the first time this process sees the object). The shell keeps that
    /// apart from `actor.object`, which the actor updates with its own writes, so every transition the
    /// watch shows is seen once, and an Event is raised per transition, never per reconcile.
    fn report(
        _previous: Option<&Self::Reported>,
        _current: &Self::Object,
        _context: &Self::Shared,
    ) -> Report<Self::Reported> {
        Report::default()
    }
    /// The object is gone: its metrics go.
    fn forget(_object: &Self::Object, _context: &Self::Shared) {}
}

/// What [`Reconcile::report`] found in a watched version.
#[derive(Debug, Default)]
pub struct Report<T> {
    /// What the next report compares with.
    pub remember: T,
    pub notice: Option<Notice>,
}

/// Events to raise about one object.
#[derive(Debug, Clone)]
pub struct Notice {
    pub reference: ObjectReference,
    pub events: Vec<TransitionEvent>,
}

/// The actor that owns one object, reconciling it through `R`.
pub struct ObjectActor<R: Reconcile> {
    pub context: R::Shared,
    /// The last observed object.
    pub object: Option<R::Object>,
    /// What [`Reconcile::report`] kept of the last version the watch delivered.
    reported: Option<R::Reported>,
    /// The implementation's own state.
    pub state: R,
    gate: ReconcileGate,
    metrics: RuntimeMetrics,
    resync: Option<SpawnHandle>,
    /// The write whose trace the reconciles continue.
    cause: TraceCause,
    /// Set when the object moves to another replica: answered once the running reconcile is done.
    releasing: Option<tokio::sync::oneshot::Sender<()>>,
}

impl<R: Reconcile> ObjectActor<R> {
    pub fn new(context: R::Shared) -> Self {
        Self {
            state: R::new(&context),
            metrics: context.runtime().metrics.clone(),
            context,
            object: None,
            reported: None,
            gate: ReconcileGate::new(R::BACKOFF),
            resync: None,
            cause: TraceCause::default(),
            releasing: None,
        }
    }

    /// Reconciles now, or right after the running reconcile.
    pub fn request_reconcile(&mut self, ctx: &mut Context<Self>) {
        if self.releasing.is_some() {
            return;
        }
        let Some(object) = self.object.clone() else {
            return;
        };
        if !self.gate.try_start(ctx) {
            return;
        }
        if let Some(handle) = self.resync.take() {
            ctx.cancel_future(handle);
        }
        let key = R::key(&object);
        // Every reconcile's span: a field added here is on all of them.
        let span = info_span!(
            "reconcile",
            otel.name = %format_args!("reconcile {}", key.kind),
            controller = R::CONTROLLER,
            k8s.namespace.name = %key.namespace,
            pko.object.kind = key.kind,
            pko.object.name = %key.name,
        );
        self.cause.attach(&span);
        let started = Instant::now();
        self.metrics.started(R::CONTROLLER);
        let work = {
            let _entered = span.enter();
            R::reconcile(self, object, ctx)
        };
        let work = InSpan { span, work }.map(move |outcome, act: &mut Self, ctx| {
            let result = match &outcome {
                Outcome::Done => ReconcileResult::Success,
                Outcome::Retry(reason) => {
                    warn!(controller = R::CONTROLLER, %reason, "reconcile failed; retrying");
                    ReconcileResult::Error
                }
                Outcome::Requeue(reason) => {
                    debug!(controller = R::CONTROLLER, %reason, "looking again later");
                    ReconcileResult::Requeue
                }
            };
            act.metrics
                .finished(R::CONTROLLER, result, started.elapsed());
            let failed = result != ReconcileResult::Success;
            if act.releasing.is_some() {
                act.stop_released(ctx);
                return;
            }
            if let (false, Some(period)) = (failed, R::resync(&act.context)) {
                act.resync =
                    Some(ctx.run_later(Backoff::jittered(period), Self::request_reconcile));
            }
            if act.gate.finish(ctx, failed, Self::request_reconcile) {
                act.request_reconcile(ctx);
            }
        });
        if R::EXCLUSIVE {
            ctx.wait(work);
        } else {
            ctx.spawn(work);
        }
    }

    /// Stops after a release: no cleanup (the object lives on with another replica), metrics dropped, the
    /// feed told.
    fn stop_released(&mut self, ctx: &mut Context<Self>) {
        if let Some(object) = &self.object {
            R::forget(object, &self.context);
        }
        ctx.stop();
        if let Some(released) = self.releasing.take() {
            let _ = released.send(());
        }
    }

    /// Starts the retry backoff over.
    pub fn reset_backoff(&mut self) {
        self.gate.reset_backoff();
    }
}

/// An actor future polled inside a span, so its async steps and the code taking their results back are
/// traced under the reconcile.
struct InSpan<F> {
    span: Span,
    work: F,
}

impl<A: Actor, F: ActorFuture<A> + Unpin> ActorFuture<A> for InSpan<F> {
    type Output = F::Output;

    fn poll(
        self: Pin<&mut Self>,
        act: &mut A,
        ctx: &mut A::Context,
        task: &mut TaskContext<'_>,
    ) -> Poll<Self::Output> {
        let this = self.get_mut();
        let _entered = this.span.enter();
        Pin::new(&mut this.work).poll(act, ctx, task)
    }
}

impl<R: Reconcile> Actor for ObjectActor<R> {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        R::stopped(self);
    }
}

impl<R: Reconcile> FeedTarget for ObjectActor<R>
where
    Context<Self>: ToEnvelope<Self, Observed<R::Object>>,
{
    type Object = R::Object;
    type Shared = R::Shared;

    fn start_for(context: &R::Shared) -> Addr<Self> {
        Self::new(context.clone()).start()
    }

    fn wants(object: &R::Object) -> bool {
        R::wants(object)
    }

    fn key(object: &R::Object) -> ObjectRef {
        R::key(object)
    }

    fn tombstone(object: &R::Object) -> R::Object {
        R::tombstone(object)
    }
}

impl<R: Reconcile> Handler<Observed<R::Object>> for ObjectActor<R> {
    type Result = ();
    fn handle(&mut self, Observed(object): Observed<R::Object>, ctx: &mut Context<Self>) {
        let report = R::report(self.reported.as_ref(), &object, &self.context);
        self.reported = Some(report.remember);
        if let Some(Notice { reference, events }) = report.notice {
            self.context
                .runtime()
                .events
                .raise_transitions(&reference, events);
        }
        let change = R::change(self.object.as_ref(), &object);
        self.cause.observe(object.traceparent());
        self.object = Some(object);
        match R::observed(self, change, ctx) {
            Change::Echo => {}
            Change::Changed => self.request_reconcile(ctx),
            Change::Respecified => {
                self.reset_backoff();
                self.request_reconcile(ctx);
            }
        }
    }
}

impl<R: Reconcile> Handler<Release> for ObjectActor<R> {
    type Result = ();
    fn handle(&mut self, Release(released): Release, ctx: &mut Context<Self>) {
        self.releasing = Some(released);
        if let Some(handle) = self.resync.take() {
            ctx.cancel_future(handle);
        }
        if !self.gate.is_running() {
            self.stop_released(ctx);
        }
    }
}

impl<R: Reconcile> Handler<Gone> for ObjectActor<R> {
    type Result = ();
    fn handle(&mut self, _: Gone, ctx: &mut Context<Self>) {
        if let Some(object) = &self.object {
            R::forget(object, &self.context);
        }
        match R::gone(self, ctx) {
            Some(cleanup) => {
                ctx.wait(fut::wrap_future::<_, Self>(cleanup).map(|(), _, ctx| ctx.stop()));
            }
            None => ctx.stop(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    struct Viewed {
        meta: ObjectMeta,
        status: &'static str,
    }

    impl MetaView for Viewed {
        fn meta(&self) -> &ObjectMeta {
            &self.meta
        }
    }

    fn viewed(generation: i64, status: &'static str) -> Viewed {
        Viewed {
            meta: ObjectMeta {
                generation: Some(generation),
                ..Default::default()
            },
            status,
        }
    }

    #[test]
    fn only_the_same_generation_with_the_same_status_is_an_echo() {
        let same = |a: &Viewed, b: &Viewed| a.status == b.status;
        let known = viewed(3, "Available");
        assert!(is_status_echo(Some(&known), &viewed(3, "Available"), same));
        assert!(!is_status_echo(
            Some(&known),
            &viewed(3, "Progressing"),
            same
        ));
        assert!(!is_status_echo(Some(&known), &viewed(4, "Available"), same));
        assert!(!is_status_echo(None, &known, same));
    }
}

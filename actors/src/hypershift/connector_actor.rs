//! The hosted-cluster connector's actor (in `pko-connector`, one per HCP namespace): serves the manager's
//! phase apply and teardown requests for its namespace against the hosted cluster's apiserver, with one
//! [`PhaseActor`] per ObjectSetPhase, so hosted phases follow exactly the rules of local ones. A change
//! of a phase's hosted object re-runs that phase and pushes the new report on the status subject. On
//! every (re)connect it says hello, and the manager re-sends the phases it wants.
//!
//! It keeps nothing the manager cannot re-send: a restarted connector starts empty. It must not decide
//! phase order or availability gating; the manager's ObjectSet does.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use async_nats::{Message as NatsMessage, Subject};
use pko_proto::connector_wire::{
    decode, encode, ApplyPhase, ErrorReply, Hello, HostedClusterSubjects, PhaseRef, PhaseReport,
    PreviewObjects, PreviewOutcome, PreviewReport, PreviewVerdict, TeardownPhase, WireError,
    WIRE_VERSION,
};
use serde::Serialize;
use tokio::sync::mpsc;
use tracing::{debug, info, info_span, warn, Span};

use crate::engine::hypershift::hosted_phase::{plan_apply, plan_teardown, refused, report_of_run};
use crate::engine::objects::object_ref::ObjectKey;
use crate::engine::objects::phase_plan::PhaseOutcome;
use crate::engine::objects::phase_plan::PhasePlan;
use crate::engine::rollout::preflight_diff::Verdict;
use crate::objects::applier::Applier;
use crate::objects::object_cache::ObjectCache;
use crate::objects::object_dry_run::{dry_run, Introduced};
use crate::objects::phase_actor::{PhaseActor, PhaseCommand, PhaseFinished, UpdatePlan};
use crate::runtime::telemetry::CapturedTrace;

/// What arrives from NATS.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub enum ConnectorInput {
    Apply(NatsMessage),
    Teardown(NatsMessage),
    /// Dry-run a release's hosted objects (a HostedClusterPackage's preflight).
    Preview(NatsMessage),
    /// The client (re)connected: announce ourselves.
    Connected,
}

/// A hosted object of the phase with this UID changed.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct ObjectChanged(String);

/// One outgoing NATS message; sent in order by a single task so reports never overtake each other.
struct Outgoing {
    subject: Subject,
    payload: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Apply,
    Teardown,
}

struct HostedPhase {
    phase: PhaseRef,
    index: usize,
    actor: Addr<PhaseActor>,
    mode: Mode,
    /// Requests waiting for a run of at least this plan version.
    replies: Vec<(u64, Subject)>,
    last: Option<PhaseReport>,
}

pub struct ConnectorActor {
    subjects: HostedClusterSubjects,
    connector_id: String,
    applier: Applier,
    cache: ObjectCache,
    outgoing: mpsc::UnboundedSender<Outgoing>,
    phases: HashMap<String, HostedPhase>,
    uid_by_index: HashMap<usize, String>,
    next_index: usize,
    next_version: u64,
}

impl ConnectorActor {
    /// A connector for `subjects`' namespace applying to the hosted cluster behind `applier`/`cache`;
    /// `nats` carries its replies and pushes.
    pub fn new(
        subjects: HostedClusterSubjects,
        connector_id: String,
        applier: Applier,
        cache: ObjectCache,
        nats: async_nats::Client,
    ) -> Self {
        let (outgoing, mut queue) = mpsc::unbounded_channel::<Outgoing>();
        tokio::spawn(async move {
            while let Some(message) = queue.recv().await {
                let subject = message.subject.clone();
                if let Err(error) = nats.publish(message.subject, message.payload.into()).await {
                    warn!(%subject, %error, "NATS publish failed");
                }
            }
        });
        Self {
            subjects,
            connector_id,
            applier,
            cache,
            outgoing,
            phases: HashMap::new(),
            uid_by_index: HashMap::new(),
            next_index: 0,
            next_version: 0,
        }
    }

    fn send<T: Serialize>(&self, subject: Subject, message: &T) {
        match encode(message) {
            Ok(payload) => {
                let _ = self.outgoing.send(Outgoing { subject, payload });
            }
            Err(error) => warn!(%subject, %error, "cannot encode a message"),
        }
    }

    /// Sends the answer to a request; one that cannot be encoded (over the wire's size limit) is answered
    /// with an `ErrorReply` saying so, so the manager never waits out a reply that cannot come.
    fn answer<T: Serialize>(&self, reply: Subject, message: &T) {
        match encode(message) {
            Ok(payload) => {
                let _ = self.outgoing.send(Outgoing {
                    subject: reply,
                    payload,
                });
            }
            Err(error) => {
                warn!(subject = %reply, %error, "cannot encode an answer; answering with the error");
                self.send(reply, &ErrorReply::new(error.code(), error.to_string()));
            }
        }
    }

    fn reject(&self, request: &NatsMessage, error: &WireError) {
        warn!(subject = %request.subject, %error, "refusing a request");
        if let Some(reply) = &request.reply {
            self.send(
                reply.clone(),
                &ErrorReply::new(error.code(), error.to_string()),
            );
        }
    }

    /// Decodes a request for this connector's namespace, or answers it with the reason it cannot be served.
    fn accept<T: serde::de::DeserializeOwned>(
        &self,
        request: &NatsMessage,
        phase: impl Fn(&T) -> &PhaseRef,
    ) -> Option<T> {
        let decoded = decode::<T>(&request.payload).and_then(|message| {
            let namespace = &phase(&message).namespace;
            if namespace == self.subjects.namespace() {
                Ok(message)
            } else {
                Err(WireError::InvalidNamespace {
                    namespace: namespace.clone(),
                    problem: format!("this connector serves {:?}", self.subjects.namespace()),
                })
            }
        });
        decoded.map_err(|error| self.reject(request, &error)).ok()
    }

    /// Hands `plan` to the phase's actor (started on first use) and queues `reply` for the run.
    fn submit(
        &mut self,
        phase: PhaseRef,
        plan: PhasePlan,
        paused: bool,
        mode: Mode,
        reply: Option<Subject>,
        ctx: &mut Context<Self>,
    ) {
        self.next_version += 1;
        let version = self.next_version;
        let update = UpdatePlan {
            plan: Arc::new(plan),
            paused,
            version,
            cause: CapturedTrace::current(),
        };
        let uid = phase.uid.clone();
        let entry = match self.phases.remove(&uid) {
            Some(mut entry) => {
                entry.actor.do_send(update);
                entry.phase = phase;
                entry.mode = mode;
                entry
            }
            None => {
                let index = self.next_index;
                self.next_index += 1;
                let actor = PhaseActor::new(
                    index,
                    self.applier.clone(),
                    self.cache.clone(),
                    update,
                    ctx.address().recipient(),
                )
                .start();
                let addr = ctx.address();
                let route_uid = uid.clone();
                self.cache.add_route(
                    &uid,
                    Arc::new(move |_| addr.do_send(ObjectChanged(route_uid.clone()))),
                );
                self.uid_by_index.insert(index, uid.clone());
                HostedPhase {
                    phase,
                    index,
                    actor,
                    mode,
                    replies: Vec::new(),
                    last: None,
                }
            }
        };
        let mut entry = entry;
        entry.replies.extend(reply.map(|r| (version, r)));
        entry.actor.do_send(match mode {
            Mode::Apply => PhaseCommand::Reconcile,
            Mode::Teardown => PhaseCommand::Teardown,
        });
        self.phases.insert(uid, entry);
    }

    /// A request older than what the phase already runs is answered with the newest report instead: a
    /// redelivered request must not roll the phase back.
    fn is_stale(&self, phase: &PhaseRef) -> bool {
        self.phases
            .get(&phase.uid)
            .is_some_and(|entry| entry.phase.generation > phase.generation)
    }

    fn answer_stale(&mut self, phase: &PhaseRef, reply: Option<Subject>) {
        let Some(entry) = self.phases.get_mut(&phase.uid) else {
            return;
        };
        debug!(phase = %phase.name, generation = phase.generation, "stale request");
        match (&entry.last, reply) {
            (Some(last), Some(reply)) => {
                let last = last.clone();
                self.answer(reply, &last);
            }
            (None, Some(reply)) => entry.replies.push((self.next_version, reply)),
            (_, None) => {}
        }
    }

    fn on_apply(&mut self, request: NatsMessage, ctx: &mut Context<Self>) {
        let Some(apply) = self.accept::<ApplyPhase>(&request, |m| &m.phase) else {
            return;
        };
        let span = consumer_span(&request, &apply.phase.namespace, Some(&apply.phase));
        let _entered = span.enter();
        if self.is_stale(&apply.phase) {
            return self.answer_stale(&apply.phase, request.reply);
        }
        match plan_apply(&apply) {
            Ok(plan) => self.submit(
                apply.phase,
                plan,
                apply.paused,
                Mode::Apply,
                request.reply,
                ctx,
            ),
            Err(error) => {
                warn!(%error, "invalid phase");
                if let Some(reply) = request.reply {
                    self.answer(reply, &refused(&apply.phase, &error));
                }
            }
        }
    }

    fn on_teardown(&mut self, request: NatsMessage, ctx: &mut Context<Self>) {
        let Some(teardown) = self.accept::<TeardownPhase>(&request, |m| &m.phase) else {
            return;
        };
        let span = consumer_span(&request, &teardown.phase.namespace, Some(&teardown.phase));
        let _entered = span.enter();
        match plan_teardown(&teardown) {
            Ok(plan) => self.submit(
                teardown.phase,
                plan,
                false,
                Mode::Teardown,
                request.reply,
                ctx,
            ),
            Err(error) => {
                warn!(%error, "invalid teardown");
                if let Some(reply) = request.reply {
                    self.answer(reply, &refused(&teardown.phase, &error));
                }
            }
        }
    }

    fn hello(&self) {
        info!(namespace = self.subjects.namespace(), connector = %self.connector_id, "connected to NATS");
        self.send(
            self.subjects.hello().into(),
            &Hello {
                version: WIRE_VERSION,
                namespace: self.subjects.namespace().to_owned(),
                connector: self.connector_id.clone(),
            },
        );
    }
}

/// The span of handling one request: a consumer span in the manager's trace, its parent taken from the
/// request's W3C trace-context headers.
fn consumer_span(request: &NatsMessage, namespace: &str, phase: Option<&PhaseRef>) -> Span {
    let operation = HostedClusterSubjects::operation_of(&request.subject);
    let span = info_span!(
        "connector request",
        otel.kind = "consumer",
        otel.name = %format_args!("process {operation}"),
        messaging.system = "nats",
        messaging.operation = "process",
        messaging.destination.name = %request.subject,
        k8s.namespace.name = %namespace,
        pko.phase = tracing::field::Empty,
        pko.object.uid = tracing::field::Empty,
        generation = tracing::field::Empty,
    );
    if let Some(phase) = phase {
        span.record("pko.phase", phase.name.as_str());
        span.record("pko.object.uid", phase.uid.as_str());
        span.record("generation", phase.generation);
    }
    let headers = request.headers.as_ref();
    CapturedTrace::from_headers(|key| headers.and_then(|h| h.get(key)).map(|v| v.as_str()))
        .parent(&span);
    span
}

impl ConnectorActor {
    /// Dry-runs the objects of a preview request against the hosted cluster, off the actor, and
    /// answers with a verdict per object. It writes nothing, so it needs no ordering with phase runs.
    fn on_preview(&mut self, request: NatsMessage, ctx: &mut Context<Self>) {
        let Some(reply) = request.reply.clone() else {
            return;
        };
        let preview = decode::<PreviewObjects>(&request.payload).and_then(|p| {
            if p.namespace == self.subjects.namespace() {
                Ok(p)
            } else {
                Err(WireError::InvalidNamespace {
                    namespace: p.namespace.clone(),
                    problem: format!("this connector serves {:?}", self.subjects.namespace()),
                })
            }
        });
        let preview = match preview {
            Ok(p) => p,
            Err(error) => return self.reject(&request, &error),
        };
        let applier = self.applier.clone();
        let span = consumer_span(&request, &preview.namespace, None);
        let verdicts = async move {
            let introduced = Introduced::of(&preview.objects);
            let mut verdicts = Vec::with_capacity(preview.objects.len());
            for object in &preview.objects {
                let verdict = match ObjectKey::of(object) {
                    Some(key) => dry_run(&applier, &key, object, &introduced).await,
                    None => Verdict::Refused("the object has no apiVersion, kind or name".into()),
                };
                let (outcome, message) = match verdict {
                    Verdict::Accepted => (PreviewOutcome::Accepted, String::new()),
                    Verdict::Refused(m) => (PreviewOutcome::Refused, m),
                    Verdict::Unchecked(m) => (PreviewOutcome::Unchecked, m),
                };
                verdicts.push(PreviewVerdict { outcome, message });
            }
            verdicts
        };
        ctx.spawn(
            fut::wrap_future::<_, Self>(tracing::Instrument::instrument(verdicts, span)).map(
                move |verdicts, act, _| {
                    let report = PreviewReport {
                        version: WIRE_VERSION,
                        verdicts,
                    };
                    act.answer(reply, &report);
                },
            ),
        );
    }
}

impl Actor for ConnectorActor {
    type Context = Context<Self>;
}

impl Handler<ConnectorInput> for ConnectorActor {
    type Result = ();
    fn handle(&mut self, input: ConnectorInput, ctx: &mut Context<Self>) {
        match input {
            ConnectorInput::Apply(request) => self.on_apply(request, ctx),
            ConnectorInput::Teardown(request) => self.on_teardown(request, ctx),
            ConnectorInput::Preview(request) => self.on_preview(request, ctx),
            ConnectorInput::Connected => self.hello(),
        }
    }
}

impl StreamHandler<ConnectorInput> for ConnectorActor {
    fn handle(&mut self, input: ConnectorInput, ctx: &mut Context<Self>) {
        <Self as Handler<ConnectorInput>>::handle(self, input, ctx);
    }

    fn finished(&mut self, _: &mut Context<Self>) {
        // A subscription ends only when the client closes; the process is shutting down.
        debug!("a NATS subscription ended");
    }
}

impl Handler<ObjectChanged> for ConnectorActor {
    type Result = ();
    fn handle(&mut self, ObjectChanged(uid): ObjectChanged, _: &mut Context<Self>) {
        if let Some(entry) = self.phases.get(&uid) {
            entry.actor.do_send(match entry.mode {
                Mode::Apply => PhaseCommand::Reconcile,
                Mode::Teardown => PhaseCommand::Teardown,
            });
        }
    }
}

impl Handler<PhaseFinished> for ConnectorActor {
    type Result = ();
    fn handle(&mut self, finished: PhaseFinished, _: &mut Context<Self>) {
        let Some(uid) = self.uid_by_index.get(&finished.index).cloned() else {
            return;
        };
        let Some(entry) = self.phases.get_mut(&uid) else {
            return;
        };
        let report_span = info_span!("report phase", pko.phase = %entry.phase.name);
        finished.run.parent(&report_span);
        let _entered = report_span.enter();
        let report = report_of_run(&entry.phase, &finished.outcome);
        let (answered, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut entry.replies)
            .into_iter()
            .partition(|(version, _)| *version <= finished.version);
        entry.replies = waiting;
        let changed = entry.last.as_ref() != Some(&report);
        entry.last = Some(report.clone());
        let torn_down = entry.mode == Mode::Teardown
            && matches!(&finished.outcome, PhaseOutcome::TornDown(t) if t.complete());
        if torn_down && entry.replies.is_empty() {
            self.cache.remove_route(&uid);
            self.uid_by_index.remove(&entry.index);
            self.phases.remove(&uid);
        }
        // A change nobody asked about (a hosted object moved) is pushed; answered runs are replies.
        if answered.is_empty() && changed {
            self.send(self.subjects.status().into(), &report);
        }
        for (_, reply) in answered {
            self.answer(reply, &report);
        }
    }
}

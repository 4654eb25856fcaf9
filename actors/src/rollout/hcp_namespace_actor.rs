//! The HCP namespace actor: one per HostedClusterPackage and HCP namespace, the only writer of that
//! namespace's Package. It applies the newest desired Package (or deletes it), retries a failure (a
//! terminating namespace, a quota, a conflict) with backoff, and tells its supervisor each outcome, so one
//! failing namespace never holds up the others.

use std::time::Duration;

use actix::prelude::*;
use serde_json::Value;
use tracing::{info_span, warn, Instrument, Span};

use crate::engine::objects::object_ref::ObjectKey;
use crate::manager::context::ManagerContext;
use crate::runtime::reconcile_gate::{Backoff, ReconcileGate, Retire};

const BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));

/// What the supervisor wants in the namespace.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub enum PackageCommand {
    /// Server-side apply this Package, in `span` (the rollout step's write); with `over`, only over that
    /// resourceVersion of it (an update decided on that version that must not land on a newer one).
    Apply {
        body: Value,
        over: Option<String>,
        span: Span,
    },
    /// Delete the Package.
    Delete,
}

/// The outcome of one write, for the supervisor.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct PackageWritten {
    pub namespace: String,
    pub outcome: WriteOutcome,
    /// No wish is left to write: this one landed (or was refused as `Changed`) and none came after it.
    /// Otherwise a write is still on its way (this one retried, or a newer one) and may land at any
    /// time.
    pub settled: bool,
}

#[derive(Debug)]
pub enum WriteOutcome {
    /// The stored Package after an apply; `None` after a delete.
    Stored(Option<Value>),
    /// Not written: the Package changed since the version the write was to land on. Not retried: the
    /// supervisor decides again on what changed.
    Changed,
    /// Failed; retried with backoff until it lands or a newer wish replaces it.
    Failed(String),
}

pub struct HcpNamespaceActor {
    context: ManagerContext,
    namespace: String,
    name: String,
    /// The newest wish and its sequence number; cleared once exactly that one is written.
    desired: Option<(u64, PackageCommand)>,
    sequence: u64,
    gate: ReconcileGate,
    supervisor: Recipient<PackageWritten>,
}

impl HcpNamespaceActor {
    pub fn new(
        context: ManagerContext,
        namespace: String,
        name: String,
        supervisor: Recipient<PackageWritten>,
    ) -> Self {
        Self {
            context,
            namespace,
            name,
            desired: None,
            sequence: 0,
            gate: ReconcileGate::new(BACKOFF),
            supervisor,
        }
    }

    fn key(&self) -> ObjectKey {
        ObjectKey {
            group: pko_proto::GROUP.to_owned(),
            version: pko_proto::VERSION.to_owned(),
            kind: "Package".to_owned(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    fn write(&mut self, ctx: &mut Context<Self>) {
        let Some((written, command)) = self.desired.clone() else {
            return;
        };
        if !self.gate.try_start(ctx) {
            return;
        }
        let applier = self.context.applier.clone();
        let key = self.key();
        let span = match &command {
            PackageCommand::Apply { span, .. } => span.clone(),
            PackageCommand::Delete => {
                info_span!("delete Package", k8s.namespace.name = %self.namespace, pko.object.name = %self.name)
            }
        };
        let work = async move {
            match &command {
                PackageCommand::Apply { body, over, .. } => {
                    let applied = match over {
                        Some(version) => applier.apply_over(&key, body, version).await,
                        None => applier.apply(&key, body).await,
                    };
                    match applied {
                        Ok(stored) => WriteOutcome::Stored(Some(stored)),
                        Err(e) if over.is_some() && e.is_conflict() => WriteOutcome::Changed,
                        Err(e) => WriteOutcome::Failed(e.to_string()),
                    }
                }
                PackageCommand::Delete => match applier.get(&key).await {
                    Ok(Some(observed)) => match applier.delete_observed(&key, &observed).await {
                        Ok(_) => WriteOutcome::Stored(None),
                        Err(e) => WriteOutcome::Failed(e.to_string()),
                    },
                    Ok(None) => WriteOutcome::Stored(None),
                    Err(e) => WriteOutcome::Failed(e.to_string()),
                },
            }
        }
        .instrument(span);
        ctx.spawn(work.into_actor(self).map(move |outcome, act, ctx| {
            let failed = matches!(outcome, WriteOutcome::Failed(_));
            if let WriteOutcome::Failed(error) = &outcome {
                warn!(namespace = %act.namespace, %error, "writing the Package failed; retrying");
            } else if act.desired.as_ref().is_some_and(|(n, _)| *n == written) {
                act.desired = None;
            }
            act.supervisor.do_send(PackageWritten {
                namespace: act.namespace.clone(),
                outcome,
                settled: act.desired.is_none(),
            });
            if act.gate.finish(ctx, failed, Self::write) {
                act.write(ctx);
            }
        }));
    }
}

impl Actor for HcpNamespaceActor {
    type Context = Context<Self>;
}

/// The supervisor stopped (its HostedClusterPackage deleted, or moved to another replica): no Package
/// write starts or is retried from here; the running one ends first.
impl Handler<Retire> for HcpNamespaceActor {
    type Result = ();
    fn handle(&mut self, retire: Retire, ctx: &mut Context<Self>) {
        self.gate.retire(ctx, retire);
    }
}

impl Handler<PackageCommand> for HcpNamespaceActor {
    type Result = ();
    fn handle(&mut self, command: PackageCommand, ctx: &mut Context<Self>) {
        // The newest wish replaces an older one not yet written.
        self.sequence += 1;
        self.desired = Some((self.sequence, command));
        self.gate.reset_backoff();
        self.write(ctx);
    }
}

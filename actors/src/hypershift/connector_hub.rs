//! The manager's listener for what connectors publish: pushed phase reports and hellos, on the wildcard
//! subjects of every hosted cluster. A report wakes the remote phase actor it is about; a hello wakes every
//! remote phase actor of that HCP namespace, so a restarted connector gets all its phases again. The
//! manager's own reconnect re-sends every phase too: a hello sent while it was disconnected is lost.
//!
//! It trusts the subject, not the body, for the namespace: NATS permissions confine each connector to its
//! own subjects, so a report whose body names another namespace is dropped.

use std::sync::Arc;

use actix::prelude::*;
use async_nats::Message as NatsMessage;
use futures::StreamExt;
use pko_proto::connector_wire::{decode, Hello, HostedClusterSubjects, PhaseReport};
use tracing::{debug, info, warn};

use crate::hypershift::remote_phase_actor::{RemotePhaseActor, Resend};
use crate::metrics::connector_metrics::{ConnectorMetrics, ReportResult};
use crate::runtime::registry::{ObjectRef, Registry};

/// Subject patterns the hub listens on.
pub fn hub_subjects() -> [String; 2] {
    let prefix = pko_proto::connector_wire::SUBJECT_PREFIX;
    [
        format!("{prefix}.*.phase.status"),
        format!("{prefix}.*.hello"),
    ]
}

#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Published(pub NatsMessage);

/// The manager's NATS client (re)connected.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct Reconnected;

pub struct ConnectorHub {
    nats: async_nats::Client,
    connections: tokio::sync::watch::Receiver<u64>,
    phases: Arc<Registry<RemotePhaseActor>>,
    metrics: ConnectorMetrics,
}

impl ConnectorHub {
    pub fn new(
        nats: async_nats::Client,
        connections: tokio::sync::watch::Receiver<u64>,
        phases: Arc<Registry<RemotePhaseActor>>,
        metrics: ConnectorMetrics,
    ) -> Self {
        Self {
            nats,
            connections,
            phases,
            metrics,
        }
    }

    fn on_report(&self, namespace: &str, message: &NatsMessage) {
        let report: PhaseReport = match decode(&message.payload) {
            Ok(r) => r,
            Err(error) => {
                warn!(subject = %message.subject, %error, "dropping a malformed report");
                self.metrics.report(ReportResult::Malformed);
                return;
            }
        };
        if report.phase.namespace != namespace {
            warn!(subject = %message.subject, claimed = %report.phase.namespace,
                "dropping a report about another namespace");
            self.metrics.report(ReportResult::Foreign);
            return;
        }
        let key = ObjectRef {
            kind: "ObjectSetPhase",
            namespace: namespace.to_owned(),
            name: report.phase.name.clone(),
        };
        match self.phases.get(&key) {
            Some(addr) => {
                self.metrics.report(ReportResult::Accepted);
                addr.do_send(Resend);
            }
            None => {
                self.metrics.report(ReportResult::UnknownPhase);
                debug!(phase = %report.phase.name, namespace, "report for an unknown phase");
            }
        }
    }

    fn on_hello(&self, namespace: &str, message: &NatsMessage) {
        match decode::<Hello>(&message.payload) {
            Ok(hello) => {
                self.metrics.hello(namespace);
                let phases = self.phases.in_namespace(namespace);
                info!(namespace, connector = %hello.connector, phases = phases.len(),
                    "connector said hello; re-sending its phases");
                for addr in phases {
                    addr.do_send(Resend);
                }
            }
            Err(error) => warn!(subject = %message.subject, %error, "dropping a malformed hello"),
        }
    }
}

impl Actor for ConnectorHub {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Every connect after the one the hub started with: hellos may have been missed meanwhile.
        let mut connections = self.connections.clone();
        connections.mark_unchanged();
        let reconnects = futures::stream::unfold(connections, |mut connections| async move {
            connections.changed().await.ok()?;
            Some((Reconnected, connections))
        });
        ctx.add_stream(reconnects);
        for subject in hub_subjects() {
            let nats = self.nats.clone();
            let subscribe = async move { (nats.subscribe(subject.clone()).await, subject) };
            ctx.spawn(subscribe.into_actor(self).map(|(result, subject), _, ctx| {
                match result {
                    Ok(subscriber) => {
                        ctx.add_stream(subscriber.map(Published));
                    }
                    // Only an invalid subject fails here (the client queues while disconnected).
                    Err(error) => warn!(%subject, %error, "cannot subscribe"),
                }
            }));
        }
    }
}

impl StreamHandler<Reconnected> for ConnectorHub {
    fn handle(&mut self, _: Reconnected, _: &mut Context<Self>) {
        let phases = self.phases.all();
        info!(
            phases = phases.len(),
            "NATS reconnected; re-sending every hosted phase"
        );
        for addr in phases {
            addr.do_send(Resend);
        }
    }

    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl StreamHandler<Published> for ConnectorHub {
    fn handle(&mut self, Published(message): Published, _: &mut Context<Self>) {
        let Some(namespace) = HostedClusterSubjects::namespace_of(&message.subject) else {
            return;
        };
        let namespace = namespace.to_owned();
        if message.subject.ends_with(".hello") {
            self.on_hello(&namespace, &message);
        } else {
            self.on_report(&namespace, &message);
        }
    }

    fn finished(&mut self, _: &mut Context<Self>) {
        debug!("connector subscriptions ended");
    }
}

//! The manager's listener for what connectors publish: pushed phase reports and hellos, on the wildcard
//! subjects of every hosted cluster. A report wakes the remote phase actor it is about; a hello wakes every
//! remote phase actor of that HCP namespace, so a restarted connector gets all its phases again. The
//! manager's own reconnect re-sends every phase too: a hello sent while it was disconnected is lost.
//!
//! It trusts the subject, not the body, for the namespace: NATS permissions confine each connector to its
//! own subjects, so a report whose body names another namespace is dropped. A message on subjects bound
//! to another HostedCluster than the namespace's current one (credentials of an earlier cluster of the
//! namespace) is dropped and counted. The wakes one connector causes are limited (`engine::hypershift::wake_limit`):
//! the first at once, then at most one per second, with what came in between folded into it, so a flood of
//! hellos or reports costs each phase at most one re-send a second and none is lost. Hellos and reports
//! never shorten a phase's backoff.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use async_nats::Message as NatsMessage;
use futures::StreamExt;
use pko_proto::connector_wire::{decode, Hello, HostedClusterSubjects, PhaseReport};
use tracing::{debug, info, warn};

use crate::engine::hypershift::wake_limit::{Wake, WakeLimit};
use crate::hypershift::connector_link::ConnectorLink;
use crate::hypershift::hosted_leftovers;
use crate::hypershift::remote_phase_actor::{RemotePhaseActor, Resend};
use crate::metrics::connector_metrics::{HelloResult, ReportResult};
use crate::metrics::manager_metrics::ManagerMetrics;
use crate::rollout::hosted_cluster_index::HostedClusterIndex;
use crate::runtime::observer_clock::ObserverClock;
use crate::runtime::registry::{ObjectRef, Registry};

/// The least time between two wakes one connector causes.
const WAKE_INTERVAL: Duration = Duration::from_secs(1);

/// What a connector's messages ask to wake, gathered until the next wake.
#[derive(Debug)]
enum Pending {
    /// Every phase of the namespace (a hello).
    All,
    /// These phases (reports about them).
    Phases(BTreeSet<String>),
}

impl Pending {
    fn add(&mut self, phase: Option<&str>) {
        match (&mut *self, phase) {
            (Pending::All, _) => {}
            (_, None) => *self = Pending::All,
            (Pending::Phases(phases), Some(name)) => {
                phases.insert(name.to_owned());
            }
        }
    }
}

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
    link: ConnectorLink,
    /// Reads and clears the records of hosted objects given-up teardowns left (`hosted_leftovers`).
    client: kube::Client,
    phases: Arc<Registry<RemotePhaseActor>>,
    /// The HostedClusters, for the UID each namespace's subjects must be bound to.
    clusters: Arc<HostedClusterIndex>,
    metrics: ManagerMetrics,
    wakes: WakeLimit<String>,
    pending: HashMap<String, Pending>,
    clock: ObserverClock,
}

impl ConnectorHub {
    pub fn new(
        link: ConnectorLink,
        client: kube::Client,
        phases: Arc<Registry<RemotePhaseActor>>,
        clusters: Arc<HostedClusterIndex>,
        metrics: ManagerMetrics,
    ) -> Self {
        let interval = u64::try_from(WAKE_INTERVAL.as_millis()).unwrap_or(1_000);
        Self {
            link,
            client,
            phases,
            clusters,
            metrics,
            wakes: WakeLimit::new(interval),
            pending: HashMap::new(),
            clock: ObserverClock::start(),
        }
    }

    /// Whether `subject` is bound to another HostedCluster than the namespace's current one (unbound
    /// subjects count as another once the namespace has a HostedCluster).
    fn stale(&self, namespace: &str, subject: &str) -> bool {
        self.clusters
            .cluster_uid(namespace)
            .is_some_and(|current| HostedClusterSubjects::cluster_uid_of(subject) != Some(&current))
    }

    fn on_report(&mut self, namespace: &str, message: &NatsMessage, ctx: &mut Context<Self>) {
        if self.stale(namespace, &message.subject) {
            debug!(subject = %message.subject, "dropping a report under an earlier HostedCluster's subjects");
            self.metrics.connectors.report(ReportResult::StaleCluster);
            return;
        }
        let report: PhaseReport = match decode(&message.payload) {
            Ok(r) => r,
            Err(error) => {
                warn!(subject = %message.subject, %error, "dropping a malformed report");
                self.metrics.connectors.report(ReportResult::Malformed);
                return;
            }
        };
        if report.phase.namespace != namespace {
            warn!(subject = %message.subject, claimed = %report.phase.namespace,
                "dropping a report about another namespace");
            self.metrics.connectors.report(ReportResult::Foreign);
            return;
        }
        if self
            .phases
            .get(&phase_key(namespace, &report.phase.name))
            .is_none()
        {
            self.metrics.connectors.report(ReportResult::UnknownPhase);
            debug!(phase = %report.phase.name, namespace, "report for an unknown phase");
            return;
        }
        self.metrics.connectors.report(ReportResult::Accepted);
        self.wake(namespace, Some(&report.phase.name), ctx);
    }

    fn on_hello(&mut self, namespace: &str, message: &NatsMessage, ctx: &mut Context<Self>) {
        if self.stale(namespace, &message.subject) {
            debug!(subject = %message.subject, "dropping a hello under an earlier HostedCluster's subjects");
            self.metrics
                .connectors
                .hello(namespace, HelloResult::StaleCluster);
            return;
        }
        match decode::<Hello>(&message.payload) {
            Ok(hello) => {
                self.metrics
                    .connectors
                    .hello(namespace, HelloResult::Accepted);
                debug!(namespace, connector = %hello.connector, "connector said hello");
                self.wake(namespace, None, ctx);
            }
            Err(error) => {
                warn!(subject = %message.subject, %error, "dropping a malformed hello");
                self.metrics
                    .connectors
                    .hello(namespace, HelloResult::Malformed);
            }
        }
    }

    /// Wakes `phase` of `namespace` (every phase of it: `None`) now, or with the connector's next wake.
    fn wake(&mut self, namespace: &str, phase: Option<&str>, ctx: &mut Context<Self>) {
        self.pending
            .entry(namespace.to_owned())
            .or_insert_with(|| Pending::Phases(BTreeSet::new()))
            .add(phase);
        let now = self.clock.now_ms();
        match self.wakes.arrive(&namespace.to_owned(), now) {
            Wake::Now => self.flush(namespace, ctx),
            Wake::After(ms) => {
                let namespace = namespace.to_owned();
                self.metrics
                    .connectors
                    .wakes_pending(self.wakes.scheduled());
                ctx.run_later(Duration::from_millis(ms), move |act, ctx| {
                    let now = act.clock.now_ms();
                    act.wakes.fired(&namespace, now);
                    act.flush(&namespace, ctx);
                    act.metrics.connectors.wakes_pending(act.wakes.scheduled());
                });
            }
            Wake::Folded => self.metrics.connectors.wake_folded(),
        }
    }

    /// Re-sends what is pending for `namespace`. A hello first sweeps what given-up teardowns left in
    /// its hosted cluster, so a phase re-adding one of those names finds it gone rather than colliding.
    fn flush(&mut self, namespace: &str, ctx: &mut Context<Self>) {
        let Some(pending) = self.pending.remove(namespace) else {
            return;
        };
        let names = match pending {
            Pending::All => {
                let phases = self.phases.in_namespace(namespace);
                info!(
                    namespace,
                    phases = phases.len(),
                    "re-sending the phases of a connector that said hello"
                );
                let sweep = self.sweep(namespace);
                ctx.spawn(sweep.into_actor(self).map(move |(), _, _| {
                    for addr in phases {
                        addr.do_send(Resend);
                    }
                }));
                return;
            }
            Pending::Phases(names) => names,
        };
        for name in names {
            if let Some(addr) = self.phases.get(&phase_key(namespace, &name)) {
                addr.do_send(Resend);
            }
        }
    }

    /// Sweeps the leftovers recorded in `namespace` (`hosted_leftovers`); what fails stays recorded for
    /// the next hello.
    fn sweep(&self, namespace: &str) -> impl std::future::Future<Output = ()> + 'static {
        let (client, link, metrics) =
            (self.client.clone(), self.link.clone(), self.metrics.clone());
        let namespace = namespace.to_owned();
        let subjects =
            HostedClusterSubjects::of(&namespace, self.clusters.cluster_uid(&namespace).as_deref());
        async move {
            let subjects = match subjects {
                Ok(s) => s,
                Err(error) => return warn!(%namespace, %error, "cannot sweep hosted leftovers"),
            };
            match hosted_leftovers::sweep(&client, &link, &namespace, &subjects).await {
                Ok(done) => {
                    metrics.hosted_leftovers("swept", done.swept);
                    metrics.hosted_leftovers("dropped", done.dropped);
                }
                Err(error) => warn!(%namespace, %error, "sweeping hosted leftovers"),
            }
        }
    }
}

/// The registry key of ObjectSetPhase `name` in `namespace`.
fn phase_key(namespace: &str, name: &str) -> ObjectRef {
    ObjectRef {
        kind: "ObjectSetPhase",
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    }
}

impl Actor for ConnectorHub {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Every connect after the one the hub started with: hellos may have been missed meanwhile.
        let mut connections = self.link.connections.clone();
        connections.mark_unchanged();
        let reconnects = futures::stream::unfold(connections, |mut connections| async move {
            connections.changed().await.ok()?;
            Some((Reconnected, connections))
        });
        ctx.add_stream(reconnects);
        for subject in hub_subjects() {
            let nats = self.link.nats.clone();
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
    fn handle(&mut self, Published(message): Published, ctx: &mut Context<Self>) {
        let Some(namespace) = HostedClusterSubjects::namespace_of(&message.subject) else {
            return;
        };
        let namespace = namespace.to_owned();
        if message.subject.ends_with(".hello") {
            self.on_hello(&namespace, &message, ctx);
        } else {
            self.on_report(&namespace, &message, ctx);
        }
    }

    fn finished(&mut self, _: &mut Context<Self>) {
        debug!("connector subscriptions ended");
    }
}

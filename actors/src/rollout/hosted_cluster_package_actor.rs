//! The HostedClusterPackage supervisor: one per HostedClusterPackage. It keeps the selected HostedClusters
//! and their Packages in view, runs the rollout planner on every change, persists the in-flight set in
//! `status.processing` before any update is written, hands each write to the namespace's
//! [`HcpNamespaceActor`], writes the status when it changes, and publishes the rollout's steps.
//!
//! The rules live in `engine::rollout_plan`; this actor only gathers inputs and carries out plans.

use pko_proto::well_known::HOSTED_CLUSTER_PACKAGE_LABEL;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Api;
use kube::Resource;
use pko_proto::core::hosted_cluster_package::{HostedClusterPackage, HostedClusterPackageStatus};
use pko_proto::core::package::Package;
use pko_proto::hypershift::HostedCluster;
use pko_proto::rollout_events::{RolloutEvent, RolloutEventKind, EVENT_VERSION};
use tracing::{info_span, warn, Instrument};

use crate::engine::rollout_events::{failure_note, rollout_steps, RolloutView};
use crate::engine::rollout_plan::{
    plan_rollout, PackageState, PartitionOrder, RolloutInput, RolloutPlan, Target, UNKNOWN_GROUP,
};
use crate::packages::package_object::PackageObject;
use crate::rollout::hcp_namespace_actor::{HcpNamespaceActor, PackageCommand, PackageWritten};
use crate::rollout::hosted_cluster_fleet::{FleetChanged, RolloutShared};
use crate::rollout::hosted_cluster_package_object::{
    desired_package, invalid_status, package_state, rollout_settings, rollout_status,
};
use crate::runtime::context::ManagerContext;
use crate::runtime::kind_feed::{FeedTarget, Gone, Observed};
use crate::runtime::reconcile_gate::ReconcileGate;
use crate::runtime::registry::ObjectRef;

const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A Package this HostedClusterPackage owns changed or was deleted.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct OwnedPackageChanged {
    pub package: PackageObject,
    pub deleted: bool,
}

/// The previous plan, for the events between it and the next.
struct LastPlan {
    generation: i64,
    input: RolloutInput,
    plan: RolloutPlan,
}

pub struct HostedClusterPackageActor {
    context: ManagerContext,
    shared: RolloutShared,
    hcpkg: Option<HostedClusterPackage>,
    /// Owned Packages by namespace; `None` until the first LIST.
    /// Shared, not copied: every reconcile snapshots the whole fleet's Packages.
    packages: Option<BTreeMap<String, Arc<PackageObject>>>,
    children: BTreeMap<String, Addr<HcpNamespaceActor>>,
    /// Writes handed to children and not answered yet: planned as updated and unavailable.
    writing: BTreeSet<String>,
    /// Namespaces whose last write failed, with why.
    failures: BTreeMap<String, String>,
    last: Option<LastPlan>,
    gate: ReconcileGate,
}

/// The inputs one reconcile works from.
struct Snapshot {
    hcpkg: HostedClusterPackage,
    packages: BTreeMap<String, Arc<PackageObject>>,
    writing: BTreeSet<String>,
    clusters: Vec<Arc<HostedCluster>>,
}

/// What a reconcile decided.
enum Decision {
    Invalid(HostedClusterPackageStatus),
    Planned(Box<PlannedStep>),
}

/// A rollout step: the plan, the status to write, and the Packages to delete.
struct PlannedStep {
    input: RolloutInput,
    plan: RolloutPlan,
    status: HostedClusterPackageStatus,
    deletes: Vec<String>,
}

impl HostedClusterPackageActor {
    pub fn new(context: ManagerContext, shared: RolloutShared) -> Self {
        Self {
            context,
            shared,
            hcpkg: None,
            packages: None,
            children: BTreeMap::new(),
            writing: BTreeSet::new(),
            failures: BTreeMap::new(),
            last: None,
            gate: ReconcileGate::new(BACKOFF_MIN, BACKOFF_MAX),
        }
    }

    fn name(&self) -> String {
        self.hcpkg
            .as_ref()
            .and_then(|h| h.metadata.name.clone())
            .unwrap_or_default()
    }

    fn reconcile(&mut self, ctx: &mut Context<Self>) {
        let Some(hcpkg) = self.hcpkg.clone() else {
            return;
        };
        if !self.gate.try_start(ctx) {
            return;
        }
        let name = self.name();
        self.shared.fleet.set_selector(
            &name,
            &hcpkg.spec.hosted_cluster_selector,
            ctx.address().recipient(),
        );
        if !self.shared.fleet.is_ready() {
            // Woken by the fleet once it is complete.
            self.gate.finish(ctx, false, Self::reconcile);
            return;
        }
        let context = self.context.clone();
        let known = self.packages.clone();
        let writing = self.writing.clone();
        let span = info_span!("reconcile_hosted_cluster_package", name = %name);
        let gather = async move {
            // The first reconcile reads the owned Packages itself: planning on a partial view could
            // recreate existing Packages past the budget.
            let packages = match known {
                Some(p) => p,
                None => list_owned_packages(&context, &name).await?,
            };
            Ok::<Snapshot, String>(Snapshot {
                hcpkg,
                packages,
                writing,
                clusters: Vec::new(),
            })
        }
        .instrument(span);
        ctx.spawn(
            gather
                .into_actor(self)
                .map(|gathered, act, ctx| match gathered {
                    Ok(mut snapshot) => {
                        // Changes that arrived while gathering are in the live map: it wins.
                        match &act.packages {
                            Some(live) => snapshot.packages = live.clone(),
                            None => act.packages = Some(snapshot.packages.clone()),
                        }
                        snapshot.writing = act.writing.clone();
                        let selector = &snapshot.hcpkg.spec.hosted_cluster_selector;
                        snapshot.clusters = act.shared.fleet.selected(selector);
                        let decision = decide(&snapshot, &act.failures);
                        act.carry_out(decision, ctx);
                    }
                    Err(error) => {
                        warn!(%error, "cannot plan the rollout");
                        if act.gate.finish(ctx, true, Self::reconcile) {
                            act.reconcile(ctx);
                        }
                    }
                }),
        );
    }

    /// Persists the in-flight set, then writes Packages, then the status; publishes the steps.
    fn carry_out(&mut self, decision: Decision, ctx: &mut Context<Self>) {
        let Some(hcpkg) = self.hcpkg.clone() else {
            return;
        };
        let client = self.context.client.clone();
        let name = self.name();
        let (status, writes, deletes, events, next) = match decision {
            Decision::Invalid(status) => (status, Vec::new(), Vec::new(), Vec::new(), None),
            Decision::Planned(step) => {
                let PlannedStep {
                    input,
                    plan,
                    status,
                    deletes,
                } = *step;
                let generation = hcpkg.metadata.generation.unwrap_or_default();
                let view = RolloutView {
                    generation,
                    input: &input,
                    plan: &plan,
                };
                let previous = self.last.as_ref().map(|l| RolloutView {
                    generation: l.generation,
                    input: &l.input,
                    plan: &l.plan,
                });
                let events: Vec<RolloutEvent> = rollout_steps(previous.as_ref(), &view)
                    .into_iter()
                    .map(|s| RolloutEvent {
                        version: EVENT_VERSION,
                        kind: s.kind,
                        hosted_cluster_package: name.clone(),
                        uid: hcpkg.metadata.uid.clone().unwrap_or_default(),
                        generation,
                        group: s.group,
                        namespace: s.namespace,
                        message: s.message,
                        source: self.shared.source.clone(),
                    })
                    .collect();
                let writes: Vec<String> = plan.create.iter().chain(&plan.update).cloned().collect();
                let next = LastPlan {
                    generation,
                    input,
                    plan,
                };
                (status, writes, deletes, events, Some(next))
            }
        };
        if let Some(next) = next {
            self.last = Some(next);
        }
        let previous_status = hcpkg.status.clone().unwrap_or_default();
        let status_changed = status != previous_status;
        let publisher = self.shared.publisher.clone();
        let mut reference = hcpkg.object_ref(&());
        // Events of a cluster-scoped object live in "default"; apiservers before 1.22 also want the
        // reference to name that namespace.
        reference.namespace = Some("default".to_owned());
        let work = async move {
            // The in-flight set (and the rest of the status) goes first: a crash after this point
            // finds every update it was about to make already counted.
            if status_changed {
                write_status(&client, &name, &status).await?;
            }
            record_failures(&client, &reference, &events).await;
            if let Some(publisher) = publisher {
                publisher.publish(&events).await;
            }
            Ok::<HostedClusterPackageStatus, String>(status)
        };
        ctx.spawn(
            work.into_actor(self)
                .map(move |written, act, ctx| match written {
                    Ok(status) => {
                        if let Some(h) = act.hcpkg.as_mut() {
                            h.status = Some(status);
                        }
                        for namespace in &writes {
                            let body = desired_package(&hcpkg, namespace);
                            act.writing.insert(namespace.clone());
                            act.child(namespace, ctx)
                                .do_send(PackageCommand::Apply(body));
                        }
                        for namespace in &deletes {
                            act.child(namespace, ctx).do_send(PackageCommand::Delete);
                        }
                        if act.gate.finish(ctx, false, Self::reconcile) {
                            act.reconcile(ctx);
                        }
                    }
                    Err(error) => {
                        warn!(%error, "status write failed; no Package is written before it");
                        if act.gate.finish(ctx, true, Self::reconcile) {
                            act.reconcile(ctx);
                        }
                    }
                }),
        );
    }

    fn child(&mut self, namespace: &str, ctx: &mut Context<Self>) -> Addr<HcpNamespaceActor> {
        let name = self.name();
        let context = self.context.clone();
        let supervisor = ctx.address().recipient();
        self.children
            .entry(namespace.to_owned())
            .or_insert_with(|| {
                HcpNamespaceActor::new(context, namespace.to_owned(), name, supervisor).start()
            })
            .clone()
    }
}

async fn list_owned_packages(
    context: &ManagerContext,
    name: &str,
) -> Result<BTreeMap<String, Arc<PackageObject>>, String> {
    let list = Api::<Package>::all(context.client.clone())
        .list(&ListParams::default().labels(&format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={name}")))
        .await
        .map_err(|e| format!("listing owned Packages: {e}"))?;
    Ok(list
        .items
        .into_iter()
        .map(PackageObject::from)
        .map(|p| (p.meta.namespace.clone().unwrap_or_default(), Arc::new(p)))
        .collect())
}

/// A Warning Event on the HostedClusterPackage for each Package that started failing, naming it and why.
async fn record_failures(
    client: &kube::Client,
    reference: &ObjectReference,
    events: &[RolloutEvent],
) {
    let failed: Vec<&RolloutEvent> = events
        .iter()
        .filter(|e| e.kind == RolloutEventKind::PackageFailed)
        .collect();
    if failed.is_empty() {
        return;
    }
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "pko-manager".into(),
            instance: None,
        },
    );
    for e in failed {
        let note = failure_note(
            e.namespace.as_deref().unwrap_or_default(),
            &e.hosted_cluster_package,
            e.group.as_deref().unwrap_or(UNKNOWN_GROUP),
            &e.message,
        );
        let event = Event {
            type_: EventType::Warning,
            reason: "PackageFailed".into(),
            note: Some(note),
            action: "RolloutPackage".into(),
            secondary: None,
        };
        if let Err(error) = recorder.publish(&event, reference).await {
            warn!(%error, "cannot record an event on the HostedClusterPackage");
        }
    }
}

async fn write_status(
    client: &kube::Client,
    name: &str,
    status: &HostedClusterPackageStatus,
) -> Result<(), String> {
    // Emptied lists (processing, partitions) are cleared too.
    let lists = ["conditions", "partitions", "processing"];
    crate::objects::object_meta::write_status(
        &Api::<HostedClusterPackage>::all(client.clone()),
        name,
        status,
        &lists,
    )
    .await
    .map_err(|e| format!("writing the status: {e}"))
}

/// The rollout step for this snapshot: pure apart from the clock.
fn decide(snapshot: &Snapshot, failures: &BTreeMap<String, String>) -> Decision {
    let hcpkg = &snapshot.hcpkg;
    let generation = hcpkg.metadata.generation.unwrap_or_default();
    let previous = hcpkg.status.clone().unwrap_or_default();
    let settings = match rollout_settings(hcpkg) {
        Ok(s) => s,
        Err(problem) => {
            return Decision::Invalid(invalid_status(
                &previous,
                generation,
                &problem,
                Timestamp::now(),
            ))
        }
    };
    let (label_key, order): (Option<&str>, Option<PartitionOrder>) = match &settings.partition {
        Some((key, order)) => (Some(key.as_str()), Some(order.clone())),
        None => (None, None),
    };
    let mut targets = Vec::new();
    let mut wanted = BTreeSet::new();
    for cluster in &snapshot.clusters {
        let Some(namespace) = cluster.hosted_control_plane_namespace() else {
            continue;
        };
        let package = snapshot.packages.get(&namespace);
        // Not Available yet: no Package until it is; one that has its Package keeps being counted.
        if !cluster.is_available() && package.is_none() {
            continue;
        }
        wanted.insert(namespace.clone());
        let (state, failure) = if snapshot.writing.contains(&namespace) {
            (Some(PackageState::just_updated()), None)
        } else {
            match package.map(|p| package_state(&hcpkg.spec.template, p)) {
                Some((state, failure)) => (Some(state), failure),
                None => (None, None),
            }
        };
        let label = label_key.and_then(|k| {
            cluster
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(k).cloned())
        });
        targets.push(Target {
            namespace,
            label,
            package: state,
            failure,
        });
    }
    let input = RolloutInput {
        targets,
        partition: order,
        strategy: settings.strategy,
        processing: previous
            .processing
            .iter()
            .map(|p| p.namespace.clone())
            .collect(),
    };
    let plan = plan_rollout(&input);
    let mut status = rollout_status(
        &previous.conditions,
        generation,
        &input,
        &plan,
        settings.strategy,
        &snapshot.packages,
        Timestamp::now(),
    );
    if !failures.is_empty() {
        let failing: Vec<String> = failures
            .iter()
            .map(|(ns, e)| format!("{ns}: {e}"))
            .collect();
        if let Some(c) = status
            .conditions
            .iter_mut()
            .find(|c| c.type_ == "Progressing")
        {
            c.message = format!(
                "{} Failing, retried with backoff: {}.",
                c.message,
                failing.join("; ")
            );
        }
    }
    let deletes = snapshot
        .packages
        .keys()
        .filter(|ns| !wanted.contains(*ns))
        .cloned()
        .collect();
    Decision::Planned(Box::new(PlannedStep {
        input,
        plan,
        status,
        deletes,
    }))
}

impl Actor for HostedClusterPackageActor {
    type Context = Context<Self>;
}

impl FeedTarget for HostedClusterPackageActor {
    type Object = HostedClusterPackage;

    fn start_for(context: &ManagerContext) -> Addr<Self> {
        HostedClusterPackageActor::new(context.clone(), context.rollouts.clone()).start()
    }

    fn key(hcpkg: &HostedClusterPackage) -> ObjectRef {
        ObjectRef {
            kind: "HostedClusterPackage",
            namespace: String::new(),
            name: hcpkg.metadata.name.clone().unwrap_or_default(),
        }
    }
}

impl Handler<Observed<HostedClusterPackage>> for HostedClusterPackageActor {
    type Result = ();
    fn handle(&mut self, Observed(hcpkg): Observed<HostedClusterPackage>, ctx: &mut Context<Self>) {
        let changed = self.hcpkg.as_ref().is_none_or(|h| {
            h.metadata.generation != hcpkg.metadata.generation || h.status != hcpkg.status
        });
        self.hcpkg = Some(hcpkg);
        if changed {
            self.gate.reset_backoff();
            self.reconcile(ctx);
        }
    }
}

impl Handler<Gone> for HostedClusterPackageActor {
    type Result = ();
    fn handle(&mut self, _: Gone, ctx: &mut Context<Self>) {
        // Its Packages go with it through their owner references.
        self.shared.fleet.remove_selector(&self.name());
        ctx.stop();
    }
}

impl Handler<FleetChanged> for HostedClusterPackageActor {
    type Result = ();
    fn handle(&mut self, _: FleetChanged, ctx: &mut Context<Self>) {
        self.reconcile(ctx);
    }
}

impl Handler<OwnedPackageChanged> for HostedClusterPackageActor {
    type Result = ();
    fn handle(&mut self, changed: OwnedPackageChanged, ctx: &mut Context<Self>) {
        let namespace = changed.package.meta.namespace.clone().unwrap_or_default();
        if let Some(packages) = self.packages.as_mut() {
            if changed.deleted {
                packages.remove(&namespace);
            } else {
                packages.insert(namespace, Arc::new(changed.package));
            }
        }
        self.reconcile(ctx);
    }
}

impl Handler<PackageWritten> for HostedClusterPackageActor {
    type Result = ();
    fn handle(&mut self, written: PackageWritten, ctx: &mut Context<Self>) {
        self.writing.remove(&written.namespace);
        match written.result {
            Ok(stored) => {
                self.failures.remove(&written.namespace);
                if let (Some(packages), Some(stored)) = (self.packages.as_mut(), stored) {
                    match serde_json::from_value::<Package>(stored) {
                        Ok(p) => {
                            packages.insert(written.namespace, Arc::new(p.into()));
                        }
                        Err(e) => warn!(error = %e, "cannot read back a written Package"),
                    }
                }
            }
            Err(error) => {
                self.failures.insert(written.namespace, error);
            }
        }
        self.reconcile(ctx);
    }
}

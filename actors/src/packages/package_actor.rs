//! The Package actor: one per Package or ClusterPackage. When the spec changes it pulls the image (cached
//! by digest), loads the package with the package's template context, and applies the ObjectDeployment;
//! when the deployment changes it only recomputes status. Pull failures retry with backoff (10 s .. 300 s)
//! and show in `Unpacked`; an image that breaks an unpack limit shows in `Unpacked` too but is not pulled
//! again, and a broken package is `Invalid`, both until the spec changes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use actix::prelude::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use pko_proto::core::package::PackageStatus;

use crate::engine::conditions::{find_condition, reported_for};
use crate::engine::packages::package_deployment::{
    package_conditions, package_deployment, UnpackOutcome,
};
use crate::engine::status_hold::StatusHold;
use crate::engine::transition_events::package_transitions;
use crate::manager::context::ManagerContext;
use crate::metrics::upstream_metrics::PackageFacts;
use crate::objects::object_meta::{creation_seconds, event_reference, tombstone_meta};
use crate::packages::package_object::{DeploymentView, PackageObject};
use crate::packages::package_render::{pull_package, render_package};
use crate::runtime::meta_view::MetaView;
use crate::runtime::object_actor::{
    work, Action, Notice, ObjectActor, Reconcile, ReconcileError, Report, Work,
};
use crate::runtime::reconcile_gate::Backoff;
use crate::runtime::telemetry::current_traceparent;
use pko_package::canonical_hash::value_hash;
use pko_package::chunking::{chunk, ChunkingStrategy};
use pko_proto::well_known::SHARD_OWNER_LABEL;
use pko_proto::well_known::TRACE_PARENT_ANNOTATION;

/// The package's ObjectDeployment changed: its state as the watch delivered it (`None`: deleted).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct DeploymentChanged(pub Option<DeploymentView>);

/// The HostedCluster of the Package's namespace became known: what the last render read of
/// `.environment.hyperShift` is stale, so the next reconcile renders again (the image stays cached).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct HostedClusterArrived;

/// Hash of what an unpack depends on (spec and chunking strategy): a new one means unpacking again.
fn spec_hash(package: &PackageObject) -> String {
    let input = serde_json::json!({
        "spec": package.spec,
        "chunking": package.chunking_annotation(),
    });
    format!("{:016x}", value_hash(&input))
}

/// What an unpack did.
struct Unpack {
    outcome: UnpackOutcome,
    /// The deployment as the apply answered it, when the package was applied.
    applied: Option<DeploymentView>,
    /// The slices the Package owns after it, when known (see [`PackageObject::prune_slices`]).
    slices: Option<BTreeSet<String>>,
}

impl Unpack {
    /// An outcome that applied nothing: a refused image or package, or the last unpack's outcome kept.
    fn not_applied(outcome: UnpackOutcome, slices: Option<BTreeSet<String>>) -> Self {
        Self {
            outcome,
            applied: None,
            slices,
        }
    }
}

/// Pulls, loads and applies the deployment (errors become outcomes, except apiserver failures).
/// `slices`: what the Package owned after the last unpack, if known.
/// With `first_unpack` (this process has not unpacked the Package before: it just started, or took the
/// Package over), an ObjectDeployment already as wanted is not written again.
async fn unpack(
    context: &ManagerContext,
    package: &PackageObject,
    slices: Option<BTreeSet<String>>,
    first_unpack: bool,
) -> Result<Unpack, kube::Error> {
    let files = match pull_package(context, &package.spec.image).await? {
        Ok(files) => files,
        Err(outcome) => return Ok(Unpack::not_applied(outcome, slices)),
    };
    let mut loaded = match render_package(context, package, files).await? {
        Ok(loaded) => loaded,
        Err(outcome) => return Ok(Unpack::not_applied(outcome, slices)),
    };
    let reference = package.package_ref();
    let strategy = match ChunkingStrategy::from_annotation(package.chunking_annotation()) {
        Ok(strategy) => strategy,
        Err(message) => return Ok(Unpack::not_applied(UnpackOutcome::Invalid(message), slices)),
    };
    let known = slices;
    let (phases, slices) = chunk(package.name(), std::mem::take(&mut loaded.phases), strategy);
    loaded.phases = phases;
    package
        .apply_slices(context.runtime.client.clone(), &slices)
        .await?;
    let mut deployment = package_deployment(&reference, &loaded);
    // The ObjectDeployment's reconcile continues this trace (written only when the package changed).
    if let Some(traceparent) = current_traceparent() {
        deployment["metadata"]["annotations"][TRACE_PARENT_ANNOTATION] = traceparent.into();
    }
    // Sharded: this replica works on the Package's key, so on its ObjectDeployment too.
    if let Some(shard) = &context.runtime.shard {
        deployment["metadata"]["labels"][SHARD_OWNER_LABEL] = (*shard.member).into();
    }
    let applied = package
        .apply_deployment(context.runtime.client.clone(), &deployment, first_unpack)
        .await?;
    let slices = package
        .prune_slices(context.runtime.client.clone(), &slices, known.as_ref())
        .await?;
    Ok(Unpack {
        outcome: UnpackOutcome::Unpacked,
        applied: Some(applied),
        slices,
    })
}

/// The Package controller's own state.
#[derive(Default)]
pub struct PackageController {
    /// The spec hash and outcome of the last unpack.
    unpacked: Option<(String, UnpackOutcome)>,
    /// The slices the Package owns as this process last saw them, if it knows.
    slices: Option<BTreeSet<String>>,
    /// The ObjectDeployment as its watch last delivered it, so a reconcile woken by its change needs no
    /// read of it.
    deployment: Option<DeploymentView>,
    /// The generation the last read of the ObjectDeployment found: a delivered state of an older
    /// generation predates pko's own apply and is not trusted.
    deployment_generation: i64,
    /// The deployment has not reported on the spec just applied: the status waits for it, briefly,
    /// instead of being written without the deployment's conditions and again a moment later.
    hold: StatusHold,
}

impl PackageController {
    /// The delivered state of the ObjectDeployment, if a reconcile may report from it: not when this
    /// reconcile unpacks (it applies the deployment and must read what that made), and not when it is of
    /// an older generation than the last read found (it predates pko's own apply).
    fn usable_deployment(&self, unpacking: bool) -> Option<DeploymentView> {
        self.deployment
            .clone()
            .filter(|d| !unpacking && d.generation >= self.deployment_generation)
    }
}

pub type PackageActor = ObjectActor<PackageController>;

impl Reconcile for PackageController {
    type Shared = ManagerContext;
    type Object = PackageObject;
    type Reported = Vec<Condition>;
    const CONTROLLER: &'static str = "package";
    const BACKOFF: Backoff = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));

    /// Metadata only: the taps following this kind read nothing else of a deleted object.
    fn tombstone(object: &PackageObject) -> PackageObject {
        PackageObject {
            cluster: object.cluster,
            meta: tombstone_meta(&object.meta),
            spec: Default::default(),
            status: Default::default(),
        }
    }

    fn report(
        previous: Option<&Vec<Condition>>,
        package: &PackageObject,
        context: &ManagerContext,
    ) -> Report<Vec<Condition>> {
        let metrics = &context.metrics;
        if package.meta.deletion_timestamp.is_some() {
            Self::forget(package, context);
        } else {
            let available = find_condition(&package.status.conditions, "Available")
                .filter(|c| c.status != "Unknown")
                .map(|c| c.status == "True");
            metrics.upstream.package(&PackageFacts {
                name: package.name(),
                namespace: package.namespace(),
                image: &package.spec.image,
                available,
                created: creation_seconds(&package.meta),
                revision: package.status.revision,
            });
        }
        Report {
            remember: package.status.conditions.clone(),
            notice: previous.map(|previous| Notice {
                reference: event_reference(package.kind(), &package.meta),
                events: package_transitions(previous, &package.status.conditions),
            }),
        }
    }

    fn forget(package: &PackageObject, context: &ManagerContext) {
        let metrics = &context.metrics;
        metrics
            .upstream
            .forget_package(package.name(), package.namespace());
    }

    fn reconcile(
        actor: &mut PackageActor,
        package: PackageObject,
        _: &mut Context<PackageActor>,
    ) -> Work<Self> {
        let hash = spec_hash(&package);
        let previous = actor
            .state
            .unpacked
            .clone()
            .filter(|(h, o)| *h == hash && !matches!(o, UnpackOutcome::PullFailed(_)))
            .map(|(_, outcome)| outcome);
        let run = PackageRun {
            context: actor.context.clone(),
            first_unpack: actor.state.unpacked.is_none(),
            // Usable when no unpack runs now (an unpack applies the deployment and reports from its
            // answer).
            delivered: actor.state.usable_deployment(previous.is_none()),
            previous,
            slices: actor.state.slices.clone(),
            // Reconciles of one actor never overlap: the hold goes with this one and comes back with it.
            hold: actor.state.hold.clone(),
            hash,
        };
        work(
            run.reconcile(package),
            |result, actor: &mut PackageActor, _| match result {
                Ok(ran) => {
                    actor.state.slices = ran.slices;
                    actor.state.hold = ran.hold;
                    if let Some(generation) = ran.read_generation {
                        actor.state.deployment_generation = generation;
                    }
                    // A failed pull is retried like a failed reconcile.
                    let outcome = match &ran.outcome {
                        UnpackOutcome::PullFailed(message) => Err(ReconcileError::Failed(format!(
                            "pulling the image: {message}"
                        ))),
                        // The deployment's report wakes the Package sooner.
                        _ => Ok(ran
                            .held_for
                            .map_or(Action::AwaitChange, Action::RequeueAfter)),
                    };
                    actor.state.unpacked = Some((ran.hash, ran.outcome));
                    if let (Some(p), Some(status)) = (actor.object.as_mut(), ran.written) {
                        p.status = status;
                    }
                    outcome
                }
                Err(e) => {
                    // A failed unpack may have applied slices it did not prune: the next one lists them.
                    actor.state.slices = None;
                    Err(e.into())
                }
            },
        )
    }
}

/// What one reconcile of a Package starts from: taken from the actor, carried off it.
struct PackageRun {
    context: ManagerContext,
    hash: String,
    /// The last unpack's outcome when the spec it unpacked is still the Package's.
    previous: Option<UnpackOutcome>,
    /// No unpack of this Package ran in this process yet.
    first_unpack: bool,
    delivered: Option<DeploymentView>,
    slices: Option<BTreeSet<String>>,
    hold: StatusHold,
}

/// What one reconcile of a Package found and did, taken back into the actor.
struct PackageRan {
    hash: String,
    outcome: UnpackOutcome,
    /// The status written, if one was.
    written: Option<PackageStatus>,
    /// The deployment's generation, when this run read it (the apply's answer is a read).
    read_generation: Option<i64>,
    slices: Option<BTreeSet<String>>,
    hold: StatusHold,
    /// How long the status write is held back for the deployment's first report.
    held_for: Option<Duration>,
}

impl PackageRun {
    /// Unpacks (unless the spec was unpacked already), reads the deployment, and writes the status.
    async fn reconcile(self, package: PackageObject) -> Result<PackageRan, kube::Error> {
        let PackageRun {
            context,
            hash,
            previous,
            first_unpack,
            delivered,
            slices,
            mut hold,
        } = self;
        let Unpack {
            outcome,
            applied,
            slices,
        } = match previous {
            Some(outcome) => Unpack::not_applied(outcome, slices),
            None => {
                let started = std::time::Instant::now();
                let unpacked = unpack(&context, &package, slices, first_unpack).await?;
                context.metrics.upstream.package_loaded(
                    package.name(),
                    package.namespace(),
                    started.elapsed().as_secs_f64(),
                );
                unpacked
            }
        };
        // The generation is kept only from a read (the apply's answer is one): a delivered state sets no
        // new floor.
        let (deployment, read_generation) = match (&outcome, delivered) {
            (UnpackOutcome::Unpacked, _) if applied.is_some() => {
                let generation = applied.as_ref().map(|d| d.generation);
                (applied, generation)
            }
            (UnpackOutcome::Unpacked, Some(delivered)) => (Some(delivered), None),
            (UnpackOutcome::Unpacked, None) => {
                let read = package
                    .deployment_status(context.runtime.client.clone())
                    .await?;
                let generation = read.as_ref().map(|d| d.generation);
                (read, generation)
            }
            _ => (None, None),
        };
        let (conditions, phase) = package_conditions(
            &package.status.conditions,
            package.generation(),
            package.spec.paused,
            &outcome,
            deployment
                .as_ref()
                .map(|d| (d.conditions.as_slice(), d.generation)),
            Timestamp::now(),
        );
        let status = PackageStatus {
            conditions,
            phase: Some(phase.to_owned()),
            unpacked_hash: if outcome == UnpackOutcome::Unpacked {
                hash.clone()
            } else {
                package.status.unpacked_hash.clone()
            },
            revision: deployment
                .as_ref()
                .and_then(|d| d.revision)
                .unwrap_or(package.status.revision),
        };
        // A deployment that has not reported on its current generation yet (pko just applied a new spec
        // to it) is waited for, briefly: its first report follows within moments.
        let unreported = deployment
            .as_ref()
            .filter(|_| outcome == UnpackOutcome::Unpacked)
            .filter(|d| !reported_for(&d.conditions, d.generation))
            .map(|d| d.generation.to_string());
        let mut held_for = None;
        if status != package.status {
            held_for = hold.hold(unreported.as_deref(), Instant::now());
            if held_for.is_none() {
                package
                    .write_status(context.runtime.client.clone(), &status)
                    .await?;
            }
        }
        Ok(PackageRan {
            hash,
            outcome,
            written: held_for.is_none().then_some(status),
            read_generation,
            slices,
            hold,
            held_for,
        })
    }
}

impl Handler<HostedClusterArrived> for PackageActor {
    type Result = ();
    fn handle(&mut self, _: HostedClusterArrived, ctx: &mut Context<Self>) {
        self.state.unpacked = None;
        self.request_reconcile(ctx);
    }
}

impl Handler<DeploymentChanged> for PackageActor {
    type Result = ();
    fn handle(&mut self, DeploymentChanged(view): DeploymentChanged, ctx: &mut Context<Self>) {
        self.state.deployment = view;
        self.request_reconcile(ctx);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::runtime::object_actor::Change;
    use pko_proto::core::package::Package;
    use pko_proto::well_known::CHUNKING_ANNOTATION;

    fn package(generation: i64, chunking: Option<&str>, phase: &str) -> PackageObject {
        let annotations = chunking
            .map(|c| serde_json::json!({ CHUNKING_ANNOTATION: c }))
            .unwrap_or_else(|| serde_json::json!({}));
        let p: Package = serde_json::from_value(serde_json::json!({
            "apiVersion": "package-operator.run/v1alpha1", "kind": "Package",
            "metadata": {"name": "p", "namespace": "n", "generation": generation,
                "annotations": annotations},
            "spec": {"image": "registry/p:v1"},
            "status": {"phase": phase},
        }))
        .unwrap();
        p.into()
    }

    #[test]
    fn a_delivered_deployment_speaks_only_when_not_older_than_the_last_read() {
        let view = |generation| DeploymentView {
            conditions: Vec::new(),
            generation,
            revision: Some(1),
        };
        let mut state = PackageController {
            unpacked: None,
            slices: None,
            deployment: None,
            deployment_generation: 2,
            hold: StatusHold::default(),
        };
        assert_eq!(state.usable_deployment(false), None, "nothing delivered");
        state.deployment = Some(view(1));
        assert_eq!(
            state.usable_deployment(false),
            None,
            "generation 1 predates the apply that the last read (generation 2) saw"
        );
        state.deployment = Some(view(2));
        assert_eq!(state.usable_deployment(false), Some(view(2)));
        assert_eq!(
            state.usable_deployment(true),
            None,
            "an unpacking reconcile reads what its apply made"
        );
    }

    #[test]
    fn own_status_echoes_are_not_changes_but_spec_and_chunking_are() {
        let known = package(1, None, "Progressing");
        let change = |current: &PackageObject| PackageController::change(Some(&known), current);
        assert_eq!(PackageController::change(None, &known), Change::Changed);
        assert_eq!(change(&package(1, None, "Progressing")), Change::Echo);
        // A status someone else wrote is corrected.
        assert_eq!(change(&package(1, None, "Available")), Change::Changed);
        assert_eq!(
            change(&package(1, Some("EachObject"), "Progressing")),
            Change::Changed
        );
        // A new spec starts the backoff over.
        assert_eq!(
            change(&package(2, None, "Progressing")),
            Change::Respecified
        );
    }
}

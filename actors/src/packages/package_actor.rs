//! The Package actor: one per Package or ClusterPackage. When the spec changes it pulls the image (cached
//! by digest), loads the package with the package's template context, and applies the ObjectDeployment;
//! when the deployment changes it only recomputes status. Pull failures retry with backoff (10 s .. 300 s)
//! and show in `Unpacked`; a broken package is `Invalid` until its spec changes.

use std::time::Duration;

use actix::prelude::*;
use k8s_openapi::jiff::Timestamp;
use pko_proto::core::package::PackageStatus;
use tracing::{info_span, warn, Instrument};

use crate::engine::package_deployment::{
    package_conditions, package_deployment, scope_error, UnpackOutcome,
};
use crate::objects::object_meta::MetaView;
use crate::packages::package_object::{environment_facts, PackageObject};
use crate::runtime::context::ManagerContext;
use crate::runtime::kind_feed::{FeedTarget, Gone, Observed};
use crate::runtime::reconcile_gate::ReconcileGate;
use crate::runtime::registry::ObjectRef;
use pko_package::canonical_hash::value_hash;
use pko_package::chunking::{chunk, ChunkingStrategy};
use pko_package::environment::{environment_value, package_environment};
use pko_package::loader::load_installable;
use pko_proto::well_known::CHUNKING_ANNOTATION;

const BACKOFF_MIN: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The package's ObjectDeployment changed.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct DeploymentChanged;

/// The package's chunking annotation.
fn chunking_annotation(package: &PackageObject) -> Option<&str> {
    package
        .meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(CHUNKING_ANNOTATION))
        .map(String::as_str)
}

/// Hash of what an unpack depends on (spec and chunking strategy): a new one means unpacking again.
fn spec_hash(package: &PackageObject) -> String {
    let input = serde_json::json!({
        "spec": package.spec,
        "chunking": chunking_annotation(package),
    });
    format!("{:016x}", value_hash(&input))
}

/// Pulls, loads and applies; returns the outcome (errors become outcomes, except apiserver failures).
async fn unpack(
    context: &ManagerContext,
    package: &PackageObject,
) -> Result<UnpackOutcome, kube::Error> {
    let auth = context
        .pull_secrets
        .auth_for(&context.client, &package.spec.image)
        .await?;
    let files = match context.images.fetch(&package.spec.image, &auth).await {
        Ok((_, files)) => files,
        Err(e) => return Ok(UnpackOutcome::PullFailed(e.to_string())),
    };
    let hosted_clusters = context
        .rollouts
        .fleet
        .hosted_cluster_for((!package.cluster).then(|| package.namespace()))
        .await;
    let facts = environment_facts(context.client.clone(), hosted_clusters).await?;
    let environment = environment_value(&package_environment(
        &facts,
        (!package.cluster).then(|| package.namespace()),
    ));
    let loaded = load_installable(
        &files,
        Some(package.spec.component.as_str()),
        package.spec.config.as_ref(),
        |_, config| package.template_context(config, environment),
    );
    let mut loaded = match loaded {
        Ok(loaded) => loaded,
        Err(e) => return Ok(UnpackOutcome::Invalid(e.to_string())),
    };
    let reference = package.package_ref();
    if let Some(message) = scope_error(&reference, &loaded) {
        return Ok(UnpackOutcome::Invalid(message));
    }
    let strategy = match ChunkingStrategy::from_annotation(chunking_annotation(package)) {
        Ok(strategy) => strategy,
        Err(message) => return Ok(UnpackOutcome::Invalid(message)),
    };
    let (phases, slices) = chunk(package.name(), std::mem::take(&mut loaded.phases), strategy);
    loaded.phases = phases;
    package
        .apply_slices(context.client.clone(), &slices)
        .await?;
    package
        .apply_deployment(
            context.client.clone(),
            &package_deployment(&reference, &loaded),
        )
        .await?;
    package
        .prune_slices(context.client.clone(), &slices)
        .await?;
    Ok(UnpackOutcome::Unpacked)
}

pub struct PackageActor {
    context: ManagerContext,
    package: Option<PackageObject>,
    /// The spec hash and outcome of the last unpack.
    unpacked: Option<(String, UnpackOutcome)>,
    gate: ReconcileGate,
}

impl PackageActor {
    pub fn new(context: ManagerContext) -> Self {
        Self {
            context,
            package: None,
            unpacked: None,
            gate: ReconcileGate::new(BACKOFF_MIN, BACKOFF_MAX),
        }
    }

    fn reconcile(&mut self, ctx: &mut Context<Self>) {
        let Some(package) = self.package.clone() else {
            return;
        };
        if !self.gate.try_start(ctx) {
            return;
        }
        let hash = spec_hash(&package);
        let previous = self
            .unpacked
            .clone()
            .filter(|(h, o)| *h == hash && !matches!(o, UnpackOutcome::PullFailed(_)));
        let context = self.context.clone();
        let span = info_span!(
            "reconcile_package",
            kind = package.kind(),
            namespace = package.namespace(),
            name = package.name()
        );
        let work = async move {
            let outcome = match previous {
                Some((_, outcome)) => outcome,
                None => unpack(&context, &package).await?,
            };
            let deployment = match outcome {
                UnpackOutcome::Unpacked => {
                    package.deployment_status(context.client.clone()).await?
                }
                _ => None,
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
            if status != package.status {
                package
                    .write_status(context.client.clone(), &status)
                    .await?;
            }
            Ok::<_, kube::Error>((hash, outcome, status))
        }
        .instrument(span);
        ctx.spawn(work.into_actor(self).map(|result, act, ctx| {
            // A failed pull is retried like a failed reconcile.
            let failed = match result {
                Ok((hash, outcome, status)) => {
                    let pull_failed = matches!(outcome, UnpackOutcome::PullFailed(_));
                    act.unpacked = Some((hash, outcome));
                    if let Some(p) = act.package.as_mut() {
                        p.status = status;
                    }
                    pull_failed
                }
                Err(e) => {
                    warn!(error = %e, "Package reconcile failed; retrying");
                    true
                }
            };
            if act.gate.finish(ctx, failed, Self::reconcile) {
                act.reconcile(ctx);
            }
        }));
    }
}

impl Actor for PackageActor {
    type Context = Context<Self>;
}

impl FeedTarget for PackageActor {
    type Object = PackageObject;

    fn start_for(context: &ManagerContext) -> Addr<Self> {
        PackageActor::new(context.clone()).start()
    }

    fn key(p: &PackageObject) -> ObjectRef {
        ObjectRef {
            kind: p.kind(),
            namespace: p.namespace().to_owned(),
            name: p.name().to_owned(),
        }
    }
}

impl Handler<Observed<PackageObject>> for PackageActor {
    type Result = ();
    fn handle(&mut self, Observed(package): Observed<PackageObject>, ctx: &mut Context<Self>) {
        // Our own status writes come back through the watch; they need no reconcile.
        let unchanged = self.package.as_ref().is_some_and(|known| {
            known.generation() == package.generation()
                && known.status == package.status
                && chunking_annotation(known) == chunking_annotation(&package)
        });
        if self
            .package
            .as_ref()
            .is_some_and(|k| k.generation() != package.generation())
        {
            self.gate.reset_backoff();
        }
        self.package = Some(package);
        if !unchanged {
            self.reconcile(ctx);
        }
    }
}

impl Handler<DeploymentChanged> for PackageActor {
    type Result = ();
    fn handle(&mut self, _: DeploymentChanged, ctx: &mut Context<Self>) {
        self.reconcile(ctx);
    }
}

impl Handler<Gone> for PackageActor {
    type Result = ();
    fn handle(&mut self, _: Gone, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

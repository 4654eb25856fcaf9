//! The supervisor's own view of the Packages it owns: a label-selected watch of them (a complete list
//! replaces what was known), and the answers of the writes it handed to the HCP namespace actors; each
//! Package at the newest version either path showed (`engine::resource_version::NewestSeen`). Either
//! wakes the supervisor when the decision's inputs changed.

use std::sync::Arc;

use actix::prelude::*;
use kube::runtime::watcher;
use pko_proto::core::package::Package;
use tracing::{info, warn};

use super::HostedClusterPackageActor;
use crate::engine::rollout::hosted_cluster_package::OwnedPackage;
use crate::rollout::hcp_namespace_actor::{PackageWritten, WriteOutcome};

impl StreamHandler<Result<watcher::Event<Package>, watcher::Error>> for HostedClusterPackageActor {
    fn handle(
        &mut self,
        event: Result<watcher::Event<Package>, watcher::Error>,
        ctx: &mut Context<Self>,
    ) {
        let packages = &mut self.state.packages;
        let changed = match event {
            Ok(watcher::Event::Init) => {
                packages.list_started();
                false
            }
            Ok(watcher::Event::InitApply(package)) => {
                let (namespace, package, version) = owned(package);
                packages.listed(namespace, package, version);
                false
            }
            // A complete list replaces what was known: Packages deleted meanwhile are gone.
            Ok(watcher::Event::InitDone) => packages.list_done(),
            // Most events of a Package change nothing the decision reads (its own status writes of
            // other fields, labels, the echo of this supervisor's write): those wake nobody. Nor does
            // one older than a write's answer already taken.
            Ok(watcher::Event::Apply(package)) => {
                let (namespace, package, version) = owned(package);
                packages.watched(namespace, package, version)
            }
            Ok(watcher::Event::Delete(package)) => {
                let (namespace, _, version) = owned(package);
                packages.deleted(&namespace, version.as_deref())
            }
            Err(error) => {
                warn!(%error, "watching the owned Packages; retrying");
                false
            }
        };
        if changed {
            self.request_reconcile(ctx);
        }
    }

    /// The watch ends only with the actor.
    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl Handler<PackageWritten> for HostedClusterPackageActor {
    type Result = ();
    fn handle(&mut self, written: PackageWritten, ctx: &mut Context<Self>) {
        // A failed write stays counted as on its way while it is retried: it may land at any time,
        // so its slot in the budget stays taken, and a decision that no longer wants it (a rollback)
        // replaces it instead of leaving it to land later.
        if written.settled {
            self.state.writing.remove(&written.namespace);
        }
        match written.outcome {
            WriteOutcome::Stored(stored) => {
                self.state.failures.remove(&written.namespace);
                // Taken only when newer than what the watch already showed: the Package may have
                // moved on (become available) between the write and this answer.
                match stored.map(serde_json::from_value::<Package>) {
                    Some(Ok(p)) => {
                        let (namespace, package, version) = owned(p);
                        self.state.packages.written(namespace, package, version);
                    }
                    Some(Err(e)) => warn!(error = %e, "cannot read back a written Package"),
                    None => {}
                }
            }
            WriteOutcome::Failed(error) => {
                self.state.failures.insert(written.namespace, error);
            }
            // Its watch brings the newer version; the next decision is made on that.
            WriteOutcome::Changed => {
                info!(namespace = %written.namespace, "a Package seen down changed before its update landed; deciding again");
                self.context
                    .metrics
                    .rollouts
                    .update_refused_changed(&self.name());
            }
        }
        self.request_reconcile(ctx);
    }
}

/// A Package as the supervisor keeps it: by namespace, with the version it was read at.
fn owned(package: Package) -> (String, Arc<OwnedPackage>, Option<String>) {
    let version = package.metadata.resource_version.clone();
    let owned = OwnedPackage::from(package);
    let namespace = owned.meta.namespace.clone().unwrap_or_default();
    (namespace, Arc::new(owned), version)
}

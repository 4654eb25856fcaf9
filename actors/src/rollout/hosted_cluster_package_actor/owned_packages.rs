//! The supervisor's own view of the Packages it owns: a label-selected watch of them (a complete list
//! replaces what was known), and the answers of the writes it handed to the HCP namespace actors, taken
//! only when newer than what the watch showed. Either wakes the supervisor when the decision's inputs
//! changed.

use std::sync::Arc;

use actix::prelude::*;
use kube::runtime::watcher;
use pko_proto::core::package::Package;
use tracing::{info, warn};

use super::HostedClusterPackageActor;
use crate::engine::resource_version::response_is_newer;
use crate::engine::rollout::hosted_cluster_package::OwnedPackage;
use crate::rollout::hcp_namespace_actor::{PackageWritten, WriteOutcome};

impl StreamHandler<Result<watcher::Event<Package>, watcher::Error>> for HostedClusterPackageActor {
    fn handle(
        &mut self,
        event: Result<watcher::Event<Package>, watcher::Error>,
        ctx: &mut Context<Self>,
    ) {
        let owned = |package: Package| {
            let owned = OwnedPackage::from(package);
            (
                owned.meta.namespace.clone().unwrap_or_default(),
                Arc::new(owned),
            )
        };
        let state = &mut self.state;
        // The version each entry of `packages` was read at: a write's answer must be newer to be taken,
        // and an update decided on the entry lands only over it. A re-list's versions count once the
        // list replaces `packages`.
        if let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = &event {
            if let (Some(namespace), Some(version)) =
                (&p.metadata.namespace, &p.metadata.resource_version)
            {
                let versions = match &event {
                    Ok(watcher::Event::InitApply(_)) => &mut state.listing_versions,
                    _ => &mut state.versions,
                };
                versions.insert(namespace.clone(), version.clone());
            }
        }
        match event {
            Ok(watcher::Event::Init) => {
                state.listing.clear();
                state.listing_versions.clear();
                return;
            }
            Ok(watcher::Event::InitApply(package)) => {
                let (namespace, package) = owned(package);
                state.listing.insert(namespace, package);
                return;
            }
            // A complete list replaces what was known: Packages deleted meanwhile are gone.
            Ok(watcher::Event::InitDone) => {
                let listed = std::mem::take(&mut state.listing);
                state.versions = std::mem::take(&mut state.listing_versions);
                if state.packages.as_ref() == Some(&listed) {
                    return;
                }
                state.packages = Some(listed);
            }
            // Most events of a Package change nothing the decision reads (its own status writes of
            // other fields, labels, the echo of this supervisor's write): those wake nobody.
            Ok(watcher::Event::Apply(package)) => {
                let (namespace, package) = owned(package);
                let Some(packages) = state.packages.as_mut() else {
                    return;
                };
                if packages.get(&namespace) == Some(&package) {
                    return;
                }
                packages.insert(namespace, package);
            }
            Ok(watcher::Event::Delete(package)) => {
                let (namespace, _) = owned(package);
                state.versions.remove(&namespace);
                let Some(packages) = state.packages.as_mut() else {
                    return;
                };
                if packages.remove(&namespace).is_none() {
                    return;
                }
            }
            Err(error) => {
                warn!(%error, "watching the owned Packages; retrying");
                return;
            }
        }
        self.request_reconcile(ctx);
    }

    /// The watch ends only with the actor.
    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl Handler<PackageWritten> for HostedClusterPackageActor {
    type Result = ();
    fn handle(&mut self, written: PackageWritten, ctx: &mut Context<Self>) {
        self.state.writing.remove(&written.namespace);
        match written.outcome {
            WriteOutcome::Stored(stored) => {
                self.state.failures.remove(&written.namespace);
                if let (Some(packages), Some(stored)) = (self.state.packages.as_mut(), stored) {
                    match serde_json::from_value::<Package>(stored) {
                        // Taken only when newer than what the watch already showed: the Package may
                        // have moved on (become available) between the write and this answer.
                        Ok(p) => {
                            let version = p.metadata.resource_version.clone();
                            let watched = self.state.versions.get(&written.namespace);
                            if response_is_newer(version.as_deref(), watched.map(String::as_str)) {
                                if let Some(version) = version {
                                    self.state
                                        .versions
                                        .insert(written.namespace.clone(), version);
                                }
                                packages.insert(written.namespace, Arc::new(p.into()));
                            }
                        }
                        Err(e) => warn!(error = %e, "cannot read back a written Package"),
                    }
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

//! Notices the HostedCluster API: watches for the `hostedclusters.hypershift.openshift.io` CRD and, once it
//! is established (at start or any time later, without a restart), lists the HostedClusters into the
//! HostedCluster index and starts the HostedCluster feed (connectors and index updates). Without
//! the API the index is complete and empty, and nothing HyperShift-related runs.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ListParams;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use pko_proto::hypershift::HostedCluster;
use tracing::{info, warn};

use crate::hypershift::hosted_cluster_actor::HostedClusterActor;
use crate::manager::context::ManagerContext;
use crate::rollout::hosted_cluster_index::HostedClusterIndex;
use crate::runtime::kind_feed::{KindFeed, Tap};
use crate::runtime::registry::Registry;

/// Name of the HostedCluster CRD.
pub const HOSTED_CLUSTER_CRD: &str = "hostedclusters.hypershift.openshift.io";

pub struct HyperShiftDetector {
    context: ManagerContext,
    clusters: Arc<Registry<HostedClusterActor>>,
    /// Sees every HostedCluster event too (the HostedCluster index).
    tap: Tap<HostedCluster>,
    index: Arc<HostedClusterIndex>,
    starting: bool,
    feed: Option<Addr<KindFeed<HostedCluster, HostedClusterActor>>>,
}

impl HyperShiftDetector {
    pub fn new(
        context: ManagerContext,
        clusters: Arc<Registry<HostedClusterActor>>,
        tap: Tap<HostedCluster>,
    ) -> Self {
        Self {
            index: context.rollouts.clusters.clone(),
            context,
            clusters,
            tap,
            starting: false,
            feed: None,
        }
    }

    /// Lists the HostedClusters into the index (so it is complete before anything plans on it), then
    /// starts the feed that keeps it current. A failed LIST is retried.
    fn start_feed(&mut self, ctx: &mut Context<Self>) {
        let api: Api<HostedCluster> = Api::all(self.context.runtime.watch_client.clone());
        let list = async move { api.list(&ListParams::default()).await };
        ctx.spawn(list.into_actor(self).map(|listed, act, ctx| match listed {
            Ok(list) => {
                act.index.seed(Some(list.items.clone()));
                act.feed = Some(
                    KindFeed::<HostedCluster, _>::new(
                        act.context.clone(),
                        act.clusters.clone(),
                        Some(act.tap.clone()),
                    )
                    // A cluster deleted before the feed's own first list leaves the index then.
                    .knowing(list.items)
                    // Sharded, every replica's index holds every HostedCluster; each runs the actors
                    // of its own.
                    .gated()
                    .start(),
                );
            }
            Err(e) => {
                warn!(error = %e, "listing HostedClusters; retrying");
                ctx.run_later(Duration::from_secs(2), |act, ctx| act.start_feed(ctx));
            }
        }));
    }
}

fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

impl Actor for HyperShiftDetector {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let api: Api<CustomResourceDefinition> =
            Api::all(self.context.runtime.watch_client.clone());
        let config =
            watcher::Config::default().fields(&format!("metadata.name={HOSTED_CLUSTER_CRD}"));
        ctx.add_stream(watcher::watcher(api, config).default_backoff().boxed());
    }
}

impl StreamHandler<Result<Event<CustomResourceDefinition>, watcher::Error>> for HyperShiftDetector {
    fn handle(
        &mut self,
        event: Result<Event<CustomResourceDefinition>, watcher::Error>,
        ctx: &mut Context<Self>,
    ) {
        match event {
            Ok(Event::Apply(crd)) | Ok(Event::InitApply(crd)) => {
                if !self.starting && established(&crd) {
                    info!("HostedCluster API found; following HostedClusters");
                    self.starting = true;
                    self.start_feed(ctx);
                }
            }
            // No HostedCluster API at start: the index is complete, and empty.
            Ok(Event::InitDone) if !self.starting => self.index.seed(None),
            Ok(_) => {}
            Err(e) => warn!(error = %e, "watching for the HostedCluster CRD; retrying"),
        }
    }
}

//! Notices the HostedCluster API: watches for the `hostedclusters.hypershift.openshift.io` CRD and, once it
//! is established (at start or any time later, without a restart), starts the HostedCluster feed. Until
//! then a manager on a plain cluster does nothing HyperShift-related.

use std::sync::Arc;

use actix::prelude::*;
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::runtime::watcher::{self, Event};
use kube::Api;
use pko_proto::hypershift::HostedCluster;
use tracing::{info, warn};

use crate::context::ManagerContext;
use crate::hosted_cluster_actor::HostedClusterActor;
use crate::kind_feed::KindFeed;
use crate::registry::Registry;

/// Name of the HostedCluster CRD.
pub const HOSTED_CLUSTER_CRD: &str = "hostedclusters.hypershift.openshift.io";

pub struct HyperShiftDetector {
    context: ManagerContext,
    clusters: Arc<Registry<HostedClusterActor>>,
    feed: Option<Addr<KindFeed<HostedCluster, HostedClusterActor>>>,
}

impl HyperShiftDetector {
    pub fn new(context: ManagerContext, clusters: Arc<Registry<HostedClusterActor>>) -> Self {
        Self {
            context,
            clusters,
            feed: None,
        }
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
        let api: Api<CustomResourceDefinition> = Api::all(self.context.client.clone());
        let config =
            watcher::Config::default().fields(&format!("metadata.name={HOSTED_CLUSTER_CRD}"));
        ctx.add_stream(watcher::watcher(api, config).boxed());
    }
}

impl StreamHandler<Result<Event<CustomResourceDefinition>, watcher::Error>> for HyperShiftDetector {
    fn handle(
        &mut self,
        event: Result<Event<CustomResourceDefinition>, watcher::Error>,
        _: &mut Context<Self>,
    ) {
        match event {
            Ok(Event::Apply(crd)) | Ok(Event::InitApply(crd)) => {
                if self.feed.is_none() && established(&crd) {
                    info!("HostedCluster API found; managing hosted-cluster connectors");
                    self.feed = Some(
                        KindFeed::<HostedCluster, _>::new(
                            self.context.clone(),
                            self.clusters.clone(),
                            None,
                        )
                        .start(),
                    );
                }
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "watching for the HostedCluster CRD; retrying"),
        }
    }
}

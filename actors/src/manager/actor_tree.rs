//! Starts the manager's actor tree: the feeds for each kind pko reconciles, the registries behind them,
//! and the taps that wake one kind's actors on another kind's changes.

use std::sync::Arc;

use actix::{Actor, System};
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::object_deployment::{ClusterObjectDeployment, ObjectDeployment};
use pko_proto::core::object_set::{ClusterObjectSet, ObjectSet};
use pko_proto::core::object_set_phase::{ClusterObjectSetPhase, ObjectSetPhase};
use pko_proto::core::object_template::{ClusterObjectTemplate, ObjectTemplate};
use pko_proto::core::package::{ClusterPackage, Package};
use pko_proto::hypershift::HostedCluster;

use crate::hypershift::connector_hub::ConnectorHub;
use crate::hypershift::hosted_cluster_actor::HostedClusterActor;
use crate::manager::context::ManagerContext;
use crate::objects::deployment_object::DeploymentObject;
use crate::rollout::hosted_cluster_package_actor::HostedClusterPackageActor;

use crate::hypershift::hypershift_detector::HyperShiftDetector;
use crate::hypershift::remote_phase_actor::RemotePhaseActor;
use crate::objects::object_deployment_actor::{ObjectDeploymentActor, RevisionChanged};
use crate::objects::object_set_actor::ObjectSetActor;
use crate::objects::object_template_actor::ObjectTemplateActor;
use crate::objects::revision_index::{IndexChange, RevisionIndex};
use crate::objects::set_object::{SetKind, SetObject};
use crate::packages::package_actor::{DeploymentChanged, HostedClusterArrived, PackageActor};
use crate::runtime::kind_feed::{KindFeed, Tap};
use crate::runtime::registry::Registry;
use crate::runtime::relations::wake_controller;

/// The running actor tree: a registry of actors per controller.
pub struct ActorTree {
    pub sets: Arc<Registry<ObjectSetActor>>,
    pub deployments: Arc<Registry<ObjectDeploymentActor>>,
    pub packages: Arc<Registry<PackageActor>>,
    pub templates: Arc<Registry<ObjectTemplateActor>>,
    pub remote_phases: Arc<Registry<RemotePhaseActor>>,
    pub hosted_clusters: Arc<Registry<HostedClusterActor>>,
    pub rollouts: Arc<Registry<HostedClusterPackageActor>>,
}

impl ActorTree {
    /// Stops every actor of this System.
    pub fn stop(&self) {
        System::current().stop();
    }
}

/// Files every set in the deployments' index and wakes the deployment that controls it whenever the set
/// changes in what the deployment reads of it: a finalizer, or a status message only the set reports,
/// wake nobody.
fn deployment_tap(
    deployments: Arc<Registry<ObjectDeploymentActor>>,
    index: RevisionIndex,
) -> Tap<SetObject> {
    let owner_kind = |set: &SetObject| match set.kind {
        SetKind::Namespaced => Some("ObjectDeployment"),
        SetKind::Cluster => Some("ClusterObjectDeployment"),
        SetKind::Phase | SetKind::ClusterPhase => None,
    };
    let wake = wake_controller(deployments, owner_kind, |_, _| RevisionChanged);
    Arc::new(move |set: &SetObject, deleted| {
        if index.observe(set, deleted) != IndexChange::Unchanged {
            wake(set, deleted);
        }
    })
}

/// Wakes the package that controls a deployment whenever the deployment changes.
fn package_tap(packages: Arc<Registry<PackageActor>>) -> Tap<DeploymentObject> {
    let owner_kind = |od: &DeploymentObject| {
        Some(if od.sets.is_namespaced() {
            "Package"
        } else {
            "ClusterPackage"
        })
    };
    wake_controller(packages, owner_kind, |od, deleted| {
        DeploymentChanged((!deleted).then(|| od.into()))
    })
}

/// Starts the feeds on the current actix System.
pub fn start(context: ManagerContext) -> ActorTree {
    let sets: Arc<Registry<ObjectSetActor>> = Arc::default();
    let deployments: Arc<Registry<ObjectDeploymentActor>> = Arc::default();
    let tap = Some(deployment_tap(
        deployments.clone(),
        context.revisions.clone(),
    ));
    KindFeed::<ObjectSet, _>::new(context.clone(), sets.clone(), tap.clone()).start();
    KindFeed::<ClusterObjectSet, _>::new(context.clone(), sets.clone(), tap).start();
    // ObjectSetPhases of class `default` are sets of one phase; other classes are filtered out.
    KindFeed::<ObjectSetPhase, _>::new(context.clone(), sets.clone(), None).start();
    KindFeed::<ClusterObjectSetPhase, _>::new(context.clone(), sets.clone(), None).start();
    // ObjectSetPhases of class `hosted-cluster` go to their connector.
    let remote_phases: Arc<Registry<RemotePhaseActor>> = Arc::default();
    KindFeed::<ObjectSetPhase, _>::new(context.clone(), remote_phases.clone(), None).start();
    let hosted_clusters: Arc<Registry<HostedClusterActor>> = Arc::default();
    if let Some(link) = &context.connectors {
        ConnectorHub::new(
            link.clone(),
            context.runtime.client.clone(),
            remote_phases.clone(),
            context.rollouts.clusters.clone(),
            context.metrics.clone(),
        )
        .start();
    }
    let packages: Arc<Registry<PackageActor>> = Arc::default();
    // A Package rendered in an HCP namespace before its HostedCluster was known renders again.
    let arrivals = packages.clone();
    context
        .rollouts
        .clusters
        .on_arrival(Arc::new(move |namespace: &str| {
            for package in arrivals.in_namespace(namespace) {
                package.do_send(HostedClusterArrived);
            }
        }));
    // HostedClusters feed both their connectors and the HostedCluster index.
    let index = context.rollouts.clusters.clone();
    let index_tap: Tap<HostedCluster> =
        Arc::new(move |cluster: &HostedCluster, deleted| index.observe(cluster, deleted));
    HyperShiftDetector::new(context.clone(), hosted_clusters.clone(), index_tap).start();
    let rollouts: Arc<Registry<HostedClusterPackageActor>> = Arc::default();
    KindFeed::<HostedClusterPackage, _>::new(context.clone(), rollouts.clone(), None).start();
    let od_tap = Some(package_tap(packages.clone()));
    KindFeed::<ObjectDeployment, _>::new(context.clone(), deployments.clone(), od_tap.clone())
        .start();
    KindFeed::<ClusterObjectDeployment, _>::new(context.clone(), deployments.clone(), od_tap)
        .start();
    KindFeed::<Package, _>::new(context.clone(), packages.clone(), None).start();
    KindFeed::<ClusterPackage, _>::new(context.clone(), packages.clone(), None).start();
    let templates: Arc<Registry<ObjectTemplateActor>> = Arc::default();
    KindFeed::<ObjectTemplate, _>::new(context.clone(), templates.clone(), None).start();
    KindFeed::<ClusterObjectTemplate, _>::new(context, templates.clone(), None).start();
    ActorTree {
        sets,
        deployments,
        packages,
        templates,
        remote_phases,
        hosted_clusters,
        rollouts,
    }
}

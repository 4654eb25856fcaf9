//! Makes the management apiserver look like a HyperShift management cluster: the HostedCluster CRD (a
//! stand-in), and for each hosted-cluster apiserver a HostedCluster reporting Available=True, its HCP
//! namespace, and the `service-network-admin-kubeconfig` Secret holding that apiserver's kubeconfig, as
//! HyperShift provides it to components next to the control plane.

use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use pko_proto::hypershift::{HostedCluster, HostedClusterCondition, HostedClusterStatus};
use serde_json::json;

use crate::apiserver::ApiServer;
use crate::crds::install_crds;
use crate::env::TestEnv;
use crate::error::{io_error, TestEnvError};

/// Namespace the simulated HostedCluster objects live in (HyperShift's conventional `clusters`).
pub const HOSTED_CLUSTERS_NAMESPACE: &str = "clusters";
/// Secret in each HCP namespace holding the hosted cluster's kubeconfig.
pub const KUBECONFIG_SECRET: &str = "service-network-admin-kubeconfig";

/// One hosted cluster as the management cluster sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimulatedHostedCluster {
    /// HostedCluster name (the hosted apiserver's name, e.g. `hosted-0`).
    pub name: String,
    /// HostedCluster namespace.
    pub namespace: String,
    /// HCP namespace holding the kubeconfig Secret.
    pub hcp_namespace: String,
}

impl TestEnv {
    /// Registers every hosted-cluster apiserver as a HostedCluster of the management apiserver. Idempotent.
    pub async fn simulate_hypershift(&self) -> Result<Vec<SimulatedHostedCluster>, TestEnvError> {
        let management = self.management();
        let client = management.client().await?;
        let crd = pko_proto::hypershift::stand_in_crd().map_err(|error| TestEnvError::Kube {
            server: management.name().to_owned(),
            source: Box::new(error),
        })?;
        install_crds(&client, &[crd]).await?;

        let kube_error = |error: kube::Error| TestEnvError::Kube {
            server: management.name().to_owned(),
            source: Box::new(error),
        };
        let params = PatchParams::apply("pko-testenv").force();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let hosted_clusters: Api<HostedCluster> =
            Api::namespaced(client.clone(), HOSTED_CLUSTERS_NAMESPACE);
        apply_namespace(&namespaces, &params, HOSTED_CLUSTERS_NAMESPACE)
            .await
            .map_err(kube_error)?;
        let mut simulated = Vec::new();
        for server in self.hosted_clusters() {
            let name = server.name().to_owned();
            let mut cluster = HostedCluster {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(HOSTED_CLUSTERS_NAMESPACE.to_owned()),
                    ..Default::default()
                },
                spec: Some(json!({ "release": { "image": "simulated" } })),
                status: None,
            };
            let hcp_namespace = pko_proto::hypershift::hosted_control_plane_namespace(
                HOSTED_CLUSTERS_NAMESPACE,
                &name,
            );
            hosted_clusters
                .patch(&name, &params, &Patch::Apply(&cluster))
                .await
                .map_err(kube_error)?;
            cluster.status = Some(HostedClusterStatus {
                conditions: vec![HostedClusterCondition {
                    type_: pko_proto::hypershift::AVAILABLE.to_owned(),
                    status: "True".to_owned(),
                    reason: Some("AsExpected".to_owned()),
                    message: Some("simulated by pko-testenv".to_owned()),
                    observed_generation: None,
                    last_transition_time: None,
                }],
                other: Default::default(),
            });
            hosted_clusters
                .patch_status(&name, &params, &Patch::Apply(&cluster))
                .await
                .map_err(kube_error)?;

            apply_hcp_namespace(&namespaces, &params, &hcp_namespace)
                .await
                .map_err(kube_error)?;
            connect_hosted_cluster(management, &hcp_namespace, server).await?;
            simulated.push(SimulatedHostedCluster {
                name,
                namespace: HOSTED_CLUSTERS_NAMESPACE.to_owned(),
                hcp_namespace,
            });
        }
        Ok(simulated)
    }
}

impl TestEnv {
    /// Adds a HostedCluster `namespace/name` with `labels`, reporting Available=`available`, and creates its
    /// HCP namespace. It has no apiserver behind it: for fleets larger than the hosted apiservers (rollouts
    /// of Packages that live in the HCP namespace). Needs the CRD ([`TestEnv::simulate_hypershift`]).
    pub async fn add_hosted_cluster(
        &self,
        namespace: &str,
        name: &str,
        labels: std::collections::BTreeMap<String, String>,
        available: bool,
    ) -> Result<SimulatedHostedCluster, TestEnvError> {
        add_hosted_cluster_to(self.management(), namespace, name, labels, available).await
    }
}

/// Installs the HostedCluster stand-in CRD into `server` (another apiserver playing a management
/// cluster of a fleet).
pub async fn install_hosted_cluster_crd(server: &ApiServer) -> Result<(), TestEnvError> {
    let client = server.client().await?;
    let crd = pko_proto::hypershift::stand_in_crd().map_err(|error| TestEnvError::Kube {
        server: server.name().to_owned(),
        source: Box::new(error),
    })?;
    install_crds(&client, &[crd]).await
}

/// Like [`TestEnv::add_hosted_cluster`], on the apiserver `management` (needs the CRD there).
pub async fn add_hosted_cluster_to(
    management: &ApiServer,
    namespace: &str,
    name: &str,
    labels: std::collections::BTreeMap<String, String>,
    available: bool,
) -> Result<SimulatedHostedCluster, TestEnvError> {
    let client = management.client().await?;
    let kube_error = |error: kube::Error| TestEnvError::Kube {
        server: management.name().to_owned(),
        source: Box::new(error),
    };
    let params = PatchParams::apply("pko-testenv").force();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    apply_namespace(&namespaces, &params, namespace)
        .await
        .map_err(kube_error)?;
    let mut cluster = HostedCluster {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(json!({ "release": { "image": "simulated" } })),
        status: None,
    };
    let api: Api<HostedCluster> = Api::namespaced(client.clone(), namespace);
    api.patch(name, &params, &Patch::Apply(&cluster))
        .await
        .map_err(kube_error)?;
    cluster.status = Some(HostedClusterStatus {
        conditions: vec![HostedClusterCondition {
            type_: pko_proto::hypershift::AVAILABLE.to_owned(),
            status: if available { "True" } else { "False" }.to_owned(),
            reason: Some("Simulated".to_owned()),
            message: Some("simulated by pko-testenv".to_owned()),
            observed_generation: None,
            last_transition_time: None,
        }],
        other: Default::default(),
    });
    api.patch_status(name, &params, &Patch::Apply(&cluster))
        .await
        .map_err(kube_error)?;
    let hcp_namespace = pko_proto::hypershift::hosted_control_plane_namespace(namespace, name);
    apply_hcp_namespace(&namespaces, &params, &hcp_namespace)
        .await
        .map_err(kube_error)?;
    Ok(SimulatedHostedCluster {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        hcp_namespace,
    })
}

/// Puts `hosted`'s admin kubeconfig into HCP namespace `hcp_namespace` of `management`, as HyperShift
/// provides it ([`KUBECONFIG_SECRET`]): the HostedCluster there is then backed by that apiserver (several
/// may share one).
pub async fn connect_hosted_cluster(
    management: &ApiServer,
    hcp_namespace: &str,
    hosted: &ApiServer,
) -> Result<(), TestEnvError> {
    let client = management.client().await?;
    let path = hosted.kubeconfig_path();
    let kubeconfig = std::fs::read(path).map_err(io_error("read", path))?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(KUBECONFIG_SECRET.to_owned()),
            namespace: Some(hcp_namespace.to_owned()),
            ..Default::default()
        },
        data: Some([("kubeconfig".to_owned(), ByteString(kubeconfig))].into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client, hcp_namespace)
        .patch(
            KUBECONFIG_SECRET,
            &PatchParams::apply("pko-testenv").force(),
            &Patch::Apply(&secret),
        )
        .await
        .map(drop)
        .map_err(|error| TestEnvError::Kube {
            server: management.name().to_owned(),
            source: Box::new(error),
        })
}

pub(crate) async fn apply_namespace(
    api: &Api<Namespace>,
    params: &PatchParams,
    name: &str,
) -> Result<(), kube::Error> {
    apply_labelled_namespace(api, params, name, None).await
}

/// A hosted control plane's namespace, labelled as HyperShift labels the namespaces it makes.
async fn apply_hcp_namespace(
    api: &Api<Namespace>,
    params: &PatchParams,
    name: &str,
) -> Result<(), kube::Error> {
    let label = (
        pko_proto::hypershift::CONTROL_PLANE_NAMESPACE_LABEL.to_owned(),
        "true".to_owned(),
    );
    apply_labelled_namespace(api, params, name, Some([label].into())).await
}

async fn apply_labelled_namespace(
    api: &Api<Namespace>,
    params: &PatchParams,
    name: &str,
    labels: Option<std::collections::BTreeMap<String, String>>,
) -> Result<(), kube::Error> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels,
            ..Default::default()
        },
        ..Default::default()
    };
    api.patch(name, params, &Patch::Apply(&namespace))
        .await
        .map(|_| ())
}

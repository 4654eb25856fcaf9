//! Which applier an owner's objects go through: the manager's own, or one impersonating the owner's
//! ServiceAccount (`engine::objects::apply_identity` decides; this module gathers what it needs: the annotation,
//! the manager's `--default-service-account`, whether the namespace hosts a HostedCluster's control
//! plane (a HostedCluster names it and HyperShift labelled it), and the labels of an account the
//! annotation names). It must not decide anything itself.

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use pko_proto::hypershift::CONTROL_PLANE_NAMESPACE_LABEL;

use crate::engine::objects::apply_identity::{
    apply_identity, requested_account_allowed, ApplyIdentity, IdentityInputs,
};
use crate::manager::context::ManagerContext;
use crate::objects::applier::Applier;
use crate::objects::object_meta::requested_service_account;
use crate::runtime::object_actor::ReconcileError;

/// Whether HyperShift made namespace `ns` for a hosted control plane (its label, which only who may
/// edit namespaces can set). A HostedCluster whose `<namespace>-<name>` is `ns` is not enough: whoever may
/// create a HostedCluster could name a tenant's namespace so, and owners there act as the manager.
async fn labelled_by_hypershift(
    context: &ManagerContext,
    ns: &str,
) -> Result<bool, ReconcileError> {
    let namespaces: Api<Namespace> = Api::all(context.runtime.client.clone());
    let found = namespaces
        .get_opt(ns)
        .await
        .map_err(|e| ReconcileError::Failed(format!("reading namespace {ns}: {e}")))?;
    Ok(found.is_some_and(|n| {
        n.metadata
            .labels
            .is_some_and(|l| l.contains_key(CONTROL_PLANE_NAMESPACE_LABEL))
    }))
}

/// The identity for the owner with `meta` (namespaced when `namespace` is set) and the applier acting as
/// it; `Err` names the problem for the owner's status: a spec error for an invalid annotation, a failure
/// a later try may mend for an account that is missing or has not opted in (its owner may fix that
/// without touching the owner).
pub async fn owner_applier(
    context: &ManagerContext,
    namespace: Option<&str>,
    meta: &ObjectMeta,
) -> Result<(ApplyIdentity, Applier), ReconcileError> {
    let requested = requested_service_account(meta);
    let default_service_account = context.default_service_account.as_deref();
    // Only asked when it can matter: it waits until the HostedClusters are listed.
    let hosted_control_plane = match (namespace, requested, default_service_account) {
        (Some(ns), None, Some(_)) => {
            context
                .rollouts
                .clusters
                .hosted_cluster_for(Some(ns))
                .await
                .is_some_and(|clusters| !clusters.is_empty())
                && labelled_by_hypershift(context, ns).await?
        }
        _ => false,
    };
    let identity = apply_identity(IdentityInputs {
        owner_namespace: namespace,
        requested,
        default_service_account,
        hosted_control_plane,
    })
    .map_err(|e| ReconcileError::Spec(e.to_string()))?;
    if let (Some(_), ApplyIdentity::ServiceAccount { namespace, name }) = (requested, &identity) {
        // Read as the manager: whether the account opted in is the account's own label.
        let accounts: Api<ServiceAccount> =
            Api::namespaced(context.runtime.client.clone(), namespace);
        let labels = accounts
            .get_opt(name)
            .await
            .map_err(|e| ReconcileError::Failed(format!("reading {identity}: {e}")))?
            .map(|account| account.metadata.labels.unwrap_or_default());
        requested_account_allowed(&identity, labels.as_ref())
            .map_err(|e| ReconcileError::Failed(e.to_string()))?;
    }
    let applier = context
        .applier
        .acting_as(&identity)
        .map_err(|e| ReconcileError::Failed(e.to_string()))?;
    Ok((identity, applier))
}

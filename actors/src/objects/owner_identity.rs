//! Which applier an owner's objects go through: the manager's own, or one impersonating the owner's
//! ServiceAccount (`engine::objects::apply_identity` decides; this module gathers what it needs: the annotation,
//! the manager's `--default-service-account`, and whether the namespace hosts a HostedCluster's control
//! plane). It must not decide anything itself.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::engine::objects::apply_identity::{apply_identity, ApplyIdentity, IdentityInputs};
use crate::manager::context::ManagerContext;
use crate::objects::applier::Applier;
use crate::objects::object_meta::requested_service_account;

/// The identity for the owner with `meta` (namespaced when `namespace` is set) and the applier acting as
/// it; `Err` names the problem (an invalid annotation) for the owner's status.
pub async fn owner_applier(
    context: &ManagerContext,
    namespace: Option<&str>,
    meta: &ObjectMeta,
) -> Result<(ApplyIdentity, Applier), String> {
    let requested = requested_service_account(meta);
    let default_service_account = context.default_service_account.as_deref();
    // Only asked when it can matter: it waits until the HostedClusters are listed.
    let hosted_control_plane = match (namespace, requested, default_service_account) {
        (Some(ns), None, Some(_)) => context
            .rollouts
            .clusters
            .hosted_cluster_for(Some(ns))
            .await
            .is_some_and(|clusters| !clusters.is_empty()),
        _ => false,
    };
    let identity = apply_identity(IdentityInputs {
        owner_namespace: namespace,
        requested,
        default_service_account,
        hosted_control_plane,
    })
    .map_err(|e| e.to_string())?;
    let applier = context
        .applier
        .acting_as(&identity)
        .map_err(|e| e.to_string())?;
    Ok((identity, applier))
}

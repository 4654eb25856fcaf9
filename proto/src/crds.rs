//! The CRDs of every package-operator.run kind, as committed under `deploy/crds/`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::core::{self, crd_for, CrdError};

/// Every CRD pko serves, in a stable order.
pub fn all() -> Result<Vec<CustomResourceDefinition>, CrdError> {
    Ok(vec![
        crd_for::<core::Package>()?,
        crd_for::<core::ClusterPackage>()?,
        crd_for::<core::ObjectDeployment>()?,
        crd_for::<core::ClusterObjectDeployment>()?,
        crd_for::<core::ObjectSet>()?,
        crd_for::<core::ClusterObjectSet>()?,
        crd_for::<core::ObjectSetPhase>()?,
        crd_for::<core::ClusterObjectSetPhase>()?,
        crd_for::<core::ObjectSlice>()?,
        crd_for::<core::ClusterObjectSlice>()?,
        crd_for::<core::ObjectTemplate>()?,
        crd_for::<core::ClusterObjectTemplate>()?,
        crd_for::<core::HostedClusterPackage>()?,
    ])
}

/// Errors rendering CRDs to files.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// A CRD could not be built.
    #[error(transparent)]
    Crd(#[from] CrdError),
    /// A CRD could not be written as YAML.
    #[error("cannot render CRD {name} as YAML: {message}")]
    Yaml {
        /// CRD name.
        name: String,
        /// What the serializer reported.
        message: String,
    },
}

/// `(file name, YAML)` for every CRD, as `deploy/crds/` holds them: `<group>_<plural>.yaml`.
pub fn render() -> Result<Vec<(String, String)>, RenderError> {
    all()?
        .into_iter()
        .map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let file = format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
            // k8s-openapi's Serialize writes apiVersion and kind itself.
            let yaml = serde_saphyr::to_string(&crd).map_err(|error| RenderError::Yaml {
                name: name.clone(),
                message: error.to_string(),
            })?;
            Ok((
                file,
                format!("# Generated from proto/ by `PKO_UPDATE_CRDS=1 cargo test -p pko-proto --test crds`; do not edit.\n{yaml}"),
            ))
        })
        .collect()
}

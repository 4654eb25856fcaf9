//! Installing CRDs into an apiserver and waiting until they are served.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;

use crate::error::TestEnvError;
use crate::wait::wait_until;

const ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(60);

/// Server-side applies `crds` and waits until each is Established.
pub async fn install_crds(
    client: &Client,
    crds: &[CustomResourceDefinition],
) -> Result<(), TestEnvError> {
    apply_and_wait(client, crds, "pko-testenv").await
}

/// pko's own CRDs, applied as the manager applies them: its `--install-crds` then finds them as it
/// would have left them, and writes none.
pub(crate) async fn install_pko_crds(client: &Client) -> Result<(), TestEnvError> {
    let crds = pko_proto::crds::all()
        .map_err(|e| TestEnvError::SharedStartFailed(format!("pko's CRDs: {e}")))?;
    apply_and_wait(client, &crds, "pko-manager").await
}

async fn apply_and_wait(
    client: &Client,
    crds: &[CustomResourceDefinition],
    field_manager: &str,
) -> Result<(), TestEnvError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(field_manager).force();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .map_err(|error| TestEnvError::Kube {
                server: format!("CRD {name}"),
                source: Box::new(error),
            })?;
    }
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        wait_until(
            &format!("CRD {name} established"),
            ESTABLISHED_TIMEOUT,
            || {
                let (api, name) = (api.clone(), name.clone());
                async move {
                    let crd = api.get(&name).await.map_err(|error| error.to_string())?;
                    let established = crd
                        .status
                        .and_then(|status| status.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|condition| {
                            condition.type_ == "Established" && condition.status == "True"
                        });
                    if established {
                        Ok(())
                    } else {
                        Err("not established yet".to_owned())
                    }
                }
            },
        )
        .await?;
    }
    Ok(())
}

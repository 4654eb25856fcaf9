//! `--install-crds`: server-side applies every pko CRD that is not as wanted already (a restart over
//! installed CRDs writes none), and waits until the apiserver serves them.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::{conditions, wait::await_condition};
use kube::{Api, Client};

use crate::ManagerError;
use pko_actors::engine::objects::drift::apply_is_current;

const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(60);
/// The field manager of the CRDs' applies.
const CRD_FIELD_MANAGER: &str = "pko-manager";

pub async fn install_crds(client: &Client) -> Result<(), ManagerError> {
    let crds = pko_proto::crds::all().map_err(|e| ManagerError::Crds(e.to_string()))?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(CRD_FIELD_MANAGER).force();
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let read = api
            .get_opt(&name)
            .await
            .map_err(|e| ManagerError::Crds(format!("reading CRD {name}: {e}")))?;
        let current = read.is_some_and(|installed| {
            let (Ok(desired), Ok(installed)) =
                (serde_json::to_value(crd), serde_json::to_value(&installed))
            else {
                return false;
            };
            apply_is_current(&desired, &installed, CRD_FIELD_MANAGER)
        });
        if current {
            continue;
        }
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .map_err(|e| ManagerError::Crds(format!("applying CRD {name}: {e}")))?;
    }
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(ESTABLISH_TIMEOUT, established)
            .await
            .map_err(|_| {
                ManagerError::Crds(format!(
                    "CRD {name} not established after {ESTABLISH_TIMEOUT:?}"
                ))
            })?
            .map_err(|e| ManagerError::Crds(format!("waiting for CRD {name}: {e}")))?;
    }
    Ok(())
}

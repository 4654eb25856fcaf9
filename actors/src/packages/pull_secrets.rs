//! Registry credentials for package pulls from the `imagePullSecrets` of the manager's ServiceAccount,
//! read at each pull so a rotated or newly added secret applies without a restart. A missing
//! ServiceAccount or Secret means no credentials from it, not an error: the pull then runs anonymously
//! and a registry that wants credentials says so in the Package's Unpacked condition.

use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::{Api, Client};
use oci_client::secrets::RegistryAuth;
use tracing::instrument;

use pko_package::pull_auth::credentials_for;

/// Where the pull secrets come from: a ServiceAccount.
#[derive(Clone, Debug)]
pub struct PullSecretSource {
    pub namespace: String,
    pub service_account: String,
}

impl PullSecretSource {
    /// Credentials for `image`, or anonymous when no pull secret has an entry for its registry.
    #[instrument(skip(self, client), fields(service_account = %self.service_account, namespace = %self.namespace))]
    pub async fn auth_for(
        &self,
        client: &Client,
        image: &str,
    ) -> Result<RegistryAuth, kube::Error> {
        let accounts = Api::<ServiceAccount>::namespaced(client.clone(), &self.namespace);
        let Some(account) = accounts.get_opt(&self.service_account).await? else {
            return Ok(RegistryAuth::Anonymous);
        };
        let secrets = Api::<Secret>::namespaced(client.clone(), &self.namespace);
        let mut data = Vec::new();
        for reference in account.image_pull_secrets.unwrap_or_default() {
            if let Some(secret) = secrets.get_opt(&reference.name).await? {
                data.push(
                    secret
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0))
                        .collect(),
                );
            }
        }
        Ok(match credentials_for(image, &data) {
            Some(c) => RegistryAuth::Basic(c.username, c.password),
            None => RegistryAuth::Anonymous,
        })
    }
}

//! Registry credentials for package pulls from the `imagePullSecrets` of the manager's ServiceAccount.
//! The secrets' contents are kept for [`CREDENTIALS_TTL`] and shared by every Package's pull, so a wave of
//! Package updates reads the ServiceAccount once instead of once per Package; a rotated or newly added
//! secret still applies without a restart: within the TTL, and at once for a pull that failed (the
//! caller [`forgets`](PullSecretSource::forget) the contents then, so the retry reads them again).
//! A missing ServiceAccount or Secret means no credentials from it, not an error: the pull then runs
//! anonymously and a registry that wants credentials says so in the Package's Unpacked condition.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::{Api, Client};
use oci_client::secrets::RegistryAuth;
use tokio::sync::Mutex;
use tracing::instrument;

use pko_package::pull_auth::credentials_for;

/// How long the secrets' contents are reused: short enough that a rotation applies within seconds,
/// long enough to cover a rollout wave's Package updates.
pub const CREDENTIALS_TTL: Duration = Duration::from_secs(10);

/// The data of each pull secret, in the ServiceAccount's order.
type SecretData = Vec<BTreeMap<String, Vec<u8>>>;

/// What the last read found, and when.
type LastRead = Option<(Instant, Arc<SecretData>)>;

/// Where the pull secrets come from: a ServiceAccount. Cheap to clone; clones share what was read.
#[derive(Clone, Debug)]
pub struct PullSecretSource {
    namespace: String,
    service_account: String,
    read: Arc<Mutex<LastRead>>,
}

/// Where a pull's credentials came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialsSource {
    /// Read within the last [`CREDENTIALS_TTL`].
    Kept,
    /// Read from the apiserver for this pull.
    Read,
}

impl PullSecretSource {
    pub fn new(namespace: String, service_account: String) -> Self {
        Self {
            namespace,
            service_account,
            read: Arc::default(),
        }
    }

    /// Credentials for `image`, or anonymous when no pull secret has an entry for its registry.
    /// Concurrent pulls wait for one read instead of each reading.
    #[instrument(skip(self, client), fields(service_account = %self.service_account, namespace = %self.namespace))]
    pub async fn auth_for(
        &self,
        client: &Client,
        image: &str,
    ) -> Result<(RegistryAuth, CredentialsSource), kube::Error> {
        let mut read = self.read.lock().await;
        let (data, source) = match read.as_ref() {
            Some((at, data)) if at.elapsed() < CREDENTIALS_TTL => {
                (data.clone(), CredentialsSource::Kept)
            }
            _ => {
                let data = Arc::new(self.secret_data(client).await?);
                *read = Some((Instant::now(), data.clone()));
                (data, CredentialsSource::Read)
            }
        };
        drop(read);
        let auth = match credentials_for(image, &data) {
            Some(c) => RegistryAuth::Basic(c.username, c.password),
            None => RegistryAuth::Anonymous,
        };
        Ok((auth, source))
    }

    /// Drops what was read: the next pull reads the secrets again (after a pull failed, a secret may
    /// have been added or rotated to fix it).
    pub async fn forget(&self) {
        *self.read.lock().await = None;
    }

    async fn secret_data(&self, client: &Client) -> Result<SecretData, kube::Error> {
        let accounts = Api::<ServiceAccount>::namespaced(client.clone(), &self.namespace);
        let Some(account) = accounts.get_opt(&self.service_account).await? else {
            return Ok(Vec::new());
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
        Ok(data)
    }
}

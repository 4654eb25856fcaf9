//! Kubeconfig files for the apiservers (token auth, loopback, self-signed serving certificate) and
//! clients built from them.

use std::path::Path;

use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};

use crate::error::{io_error, TestEnvError};

/// Writes a kubeconfig for `server` authenticating with `token`. The apiserver's serving certificate is
/// self-signed and generated at start, so the kubeconfig skips verification; it only ever points at
/// loopback.
pub(crate) fn write(
    path: &Path,
    name: &str,
    server: &str,
    token: &str,
) -> Result<(), TestEnvError> {
    let config = Kubeconfig {
        clusters: vec![NamedCluster {
            name: name.to_owned(),
            cluster: Some(Cluster {
                server: Some(server.to_owned()),
                insecure_skip_tls_verify: Some(true),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "admin".to_owned(),
            auth_info: Some(AuthInfo {
                token: Some(token.to_owned().into()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: name.to_owned(),
            context: Some(Context {
                cluster: name.to_owned(),
                user: Some("admin".to_owned()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        current_context: Some(name.to_owned()),
        api_version: Some("v1".to_owned()),
        kind: Some("Config".to_owned()),
        ..Default::default()
    };
    let yaml = serde_saphyr::to_string(&config).map_err(|error| TestEnvError::Kube {
        server: name.to_owned(),
        source: error.to_string().into(),
    })?;
    std::fs::write(path, yaml).map_err(io_error("write kubeconfig", path))
}

/// A client for the kubeconfig at `path` (`name` labels its errors).
pub async fn client(path: &Path, name: &str) -> Result<kube::Client, TestEnvError> {
    let kube_error = |source: Box<dyn std::error::Error + Send + Sync>| TestEnvError::Kube {
        server: name.to_owned(),
        source,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(|error| kube_error(error.into()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|error| kube_error(error.into()))?;
    kube::Client::try_from(config).map_err(|error| kube_error(error.into()))
}

/// Copies the kubeconfig at `from` to `to` with every cluster's server replaced by `server`.
pub(crate) fn with_server(from: &Path, to: &Path, server: &str) -> Result<(), TestEnvError> {
    let error = |source: Box<dyn std::error::Error + Send + Sync>| TestEnvError::Kube {
        server: server.to_owned(),
        source,
    };
    let mut config = Kubeconfig::read_from(from).map_err(|e| error(e.into()))?;
    for cluster in config.clusters.iter_mut().filter_map(|c| c.cluster.as_mut()) {
        cluster.server = Some(server.to_owned());
    }
    let yaml = serde_saphyr::to_string(&config).map_err(|e| error(e.to_string().into()))?;
    std::fs::write(to, yaml).map_err(io_error("write kubeconfig", to))
}

/// Writes to `path` a kubeconfig for `server` with a token (valid a day) of the ServiceAccount
/// `namespace/account`, asked of the apiserver through `client`: what a pod gets in-cluster.
pub(crate) async fn for_service_account(
    client: &kube::Client,
    server: &str,
    namespace: &str,
    account: &str,
    path: &Path,
) -> Result<(), TestEnvError> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    use kube::api::{Api, PostParams};
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(24 * 3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let kube_error = |error: kube::Error| TestEnvError::Kube {
        server: format!("token for ServiceAccount {namespace}/{account}"),
        source: Box::new(error),
    };
    let token = accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .map_err(kube_error)?
        .status
        .map(|s| s.token)
        .unwrap_or_default();
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(crate::error::io_error("create", parent))?;
    }
    write(path, namespace, server, &token)
}

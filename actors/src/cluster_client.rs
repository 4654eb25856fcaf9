//! Kubernetes clients for the processes: from a kubeconfig file, or inferred ($KUBECONFIG, ~/.kube/config,
//! in-cluster service account).

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;

/// A client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig { path: PathBuf, message: String },
    #[error("building the kubernetes client: {0}")]
    Client(#[source] kube::Error),
}

/// A client for the cluster `kubeconfig` points at, or the inferred one without it.
pub async fn cluster_client(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let err = |message: String| ClientError::Kubeconfig {
                path: path.to_owned(),
                message,
            };
            let file = Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| err(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| ClientError::Kubeconfig {
                path: PathBuf::from("(inferred)"),
                message: e.to_string(),
            })?,
    };
    Client::try_from(config).map_err(ClientError::Client)
}

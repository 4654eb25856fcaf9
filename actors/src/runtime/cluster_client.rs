//! Kubernetes clients for the processes: from a kubeconfig file, or inferred ($KUBECONFIG, ~/.kube/config,
//! in-cluster service account), with a bound on requests in flight.

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

/// Requests in flight at once when the process does not say otherwise.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;

/// A client for the cluster `kubeconfig` points at, or the inferred one without it, with at most
/// `max_in_flight` requests awaiting their response headers; the others queue. Every actor reconciles on
/// its own, so 500 Packages changing at once would otherwise open a connection each (over 1,200 sockets
/// in the 500-cluster benchmark, each with its TLS and read buffers) and swamp the apiserver. A watch
/// holds its slot only until its stream starts, so long-running watches never starve other requests.
pub async fn cluster_client(
    kubeconfig: Option<&Path>,
    max_in_flight: usize,
) -> Result<Client, ClientError> {
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
    let limit = tower::limit::ConcurrencyLimitLayer::new(max_in_flight.max(1));
    Ok(kube::client::ClientBuilder::try_from(config)
        .map_err(ClientError::Client)?
        .with_layer(&limit)
        .build())
}

//! Kubernetes clients for the processes: from a kubeconfig file, or inferred ($KUBECONFIG, ~/.kube/config,
//! in-cluster service account), with a bound on requests in flight and, for a replica under leader
//! election, the write fence its Lease keeps open.

use std::path::{Path, PathBuf};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;

use crate::runtime::api_request_metrics::{ApiRequestLayer, ApiRequestMetrics};
use crate::runtime::write_fence::{WriteFence, WriteFenceLayer};

/// A client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig { path: PathBuf, message: String },
    #[error("building the kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("impersonating {user:?}: not a valid header value")]
    Impersonation { user: String },
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
    limited_client(
        cluster_config(kubeconfig).await?,
        max_in_flight,
        &WriteFence::open(),
        &ApiRequestMetrics::default(),
    )
}

/// The client configuration from `kubeconfig`, or the inferred one without it.
pub async fn cluster_config(kubeconfig: Option<&Path>) -> Result<kube::Config, ClientError> {
    Ok(match kubeconfig {
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
    })
}

/// A client for `config` with at most `max_in_flight` requests in flight (see [`cluster_client`]) whose
/// writes pass only while `fence` is open. The fence is checked after the queue, right before a request
/// goes out, so a write that waited in the queue past the deadline is refused too. Requests that go out
/// are counted and timed in `metrics` (the queue not included).
pub fn limited_client(
    config: kube::Config,
    max_in_flight: usize,
    fence: &WriteFence,
    metrics: &ApiRequestMetrics,
) -> Result<Client, ClientError> {
    let limit = tower::limit::ConcurrencyLimitLayer::new(max_in_flight.max(1));
    // Each layer wraps the ones added before it: measured innermost, then fenced, then queued.
    Ok(kube::client::ClientBuilder::try_from(config)
        .map_err(ClientError::Client)?
        .with_layer(&ApiRequestLayer(metrics.clone()))
        .with_layer(&WriteFenceLayer(fence.clone()))
        .with_layer(&limit)
        .build())
}

/// `client`, sending every request as `user` (the `Impersonate-User` header): the apiserver authorizes
/// each request as that user, after checking that the manager may impersonate it. The requests share
/// `client`'s connections, queue, write fence and request metrics, so an identity costs one small
/// forwarding task, not a connection pool.
pub fn impersonating(client: &Client, user: &str) -> Result<Client, ClientError> {
    let user = http::HeaderValue::from_str(user).map_err(|_| ClientError::Impersonation {
        user: user.to_owned(),
    })?;
    let service = Impersonating {
        client: client.clone(),
        user,
    };
    Ok(Client::new(service, client.default_namespace().to_owned()))
}

/// Adds the impersonation header and hands the request to the manager's own client.
#[derive(Clone)]
struct Impersonating {
    client: Client,
    user: http::HeaderValue,
}

impl tower::Service<http::Request<kube::client::Body>> for Impersonating {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, kube::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        // The manager's client queues by itself.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: http::Request<kube::client::Body>) -> Self::Future {
        request
            .headers_mut()
            .insert("impersonate-user", self.user.clone());
        let client = self.client.clone();
        Box::pin(async move { client.send(request).await })
    }
}

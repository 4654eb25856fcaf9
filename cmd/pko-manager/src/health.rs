//! `/healthz`, `/readyz` and `/metrics` over HTTP/1.1 (hyper, which the tree carries for the admission
//! webhook). `/metrics` is the manager's registry in the OpenMetrics text format. `/readyz` is ready for
//! a standby waiting for the leader Lease (it can take over at once, and a Deployment's rollout must not
//! wait for it) and for the leader once every watch feed listed its kind; its body says which.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use pko_actors::metrics::exposition::{
    prometheus_text, wants_openmetrics, OPENMETRICS, PROMETHEUS_TEXT,
};
use pko_actors::metrics::manager_metrics::ManagerMetrics;
use pko_actors::runtime::feed_sync::FeedSync;
use tokio::net::TcpListener;
use tracing::{debug, warn};

/// Where the process stands, for `/readyz`.
#[derive(Debug, Clone)]
pub enum Readiness {
    Starting,
    /// Waiting for the leader Lease.
    Standby,
    /// Reconciling; ready once the feeds listed their kinds.
    Leading(FeedSync),
    /// Sharded: reconciling this replica's share; ready once the feeds listed it.
    ShardMember(FeedSync),
    Stopping,
}

/// What the endpoints report; cheap to clone.
#[derive(Clone)]
pub struct HealthState {
    readiness: Arc<RwLock<Readiness>>,
    metrics: ManagerMetrics,
}

impl HealthState {
    pub fn new(metrics: ManagerMetrics) -> Self {
        Self {
            readiness: Arc::new(RwLock::new(Readiness::Starting)),
            metrics,
        }
    }

    pub fn set(&self, readiness: Readiness) {
        *self
            .readiness
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = readiness;
    }

    fn readyz(&self) -> (StatusCode, String) {
        let readiness = self
            .readiness
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        match readiness {
            Readiness::Starting => (StatusCode::SERVICE_UNAVAILABLE, "starting\n".into()),
            Readiness::Stopping => (StatusCode::SERVICE_UNAVAILABLE, "stopping\n".into()),
            Readiness::Standby => (StatusCode::OK, "ok: standby\n".into()),
            Readiness::Leading(feeds) if feeds.all_synced() => {
                (StatusCode::OK, "ok: leader, caches synced\n".into())
            }
            Readiness::Leading(feeds) => {
                let (all, synced) = feeds.progress();
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("leader, caches syncing ({synced}/{all} feeds listed)\n"),
                )
            }
            Readiness::ShardMember(feeds) if feeds.all_synced() => {
                (StatusCode::OK, "ok: shard member, caches synced\n".into())
            }
            Readiness::ShardMember(feeds) => {
                let (all, synced) = feeds.progress();
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("shard member, caches syncing ({synced}/{all} feeds listed)\n"),
                )
            }
        }
    }

    fn respond(&self, request: &Request<Incoming>) -> Response<Full<Bytes>> {
        let (status, content_type, body) = match (request.method(), request.uri().path()) {
            (&Method::GET, "/healthz") => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
            (&Method::GET, "/readyz") => {
                let (status, body) = self.readyz();
                (status, "text/plain", body)
            }
            (&Method::GET, "/metrics") => {
                let openmetrics = self.metrics.encode();
                let accept = request
                    .headers()
                    .get(hyper::header::ACCEPT)
                    .and_then(|v| v.to_str().ok());
                if wants_openmetrics(accept) {
                    (StatusCode::OK, OPENMETRICS, openmetrics)
                } else {
                    (
                        StatusCode::OK,
                        PROMETHEUS_TEXT,
                        prometheus_text(&openmetrics),
                    )
                }
            }
            _ => (
                StatusCode::NOT_FOUND,
                "text/plain",
                "not found\n".to_owned(),
            ),
        };
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if let Ok(value) = content_type.parse() {
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, value);
        }
        response
    }
}

/// Binds the listener; serving runs in the background until the process ends.
pub async fn serve(addr: SocketAddr, state: HealthState) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) => {
                    warn!(%error, "health listener accept failed");
                    continue;
                }
            };
            let state = state.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let response = state.respond(&request);
                    async move { Ok::<_, Infallible>(response) }
                });
                if let Err(error) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    debug!(%error, "health connection failed");
                }
            });
        }
    });
    Ok(bound)
}

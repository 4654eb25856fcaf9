//! The HTTPS listener the apiserver calls for admission reviews. Every replica serves it (the Service
//! in front of them, or one shared port in tests, picks any), answering from `engine::objects::immutable_fields`.
//!
//! Owns the transport and the AdmissionReview envelope; the rules live in the engine and the TLS
//! identity in `serving_cert`. It never reads the cluster: a review is answered from its own content.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::{DynamicObject, Status};
use tokio::net::TcpSocket;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info_span, warn};

use crate::engine::objects::immutable_fields::{changed_fields, denial_message, GuardedKind};
use crate::metrics::manager_metrics::ManagerMetrics;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

/// The path the webhook configuration names.
pub const IMMUTABLE_FIELDS_PATH: &str = "/validate/immutable-fields";
/// The apiserver's own request-body limit (3 MiB): its AdmissionReview carries objects etcd holds (at most
/// 1.5 MiB each), so a larger body is nobody's review.
const MAX_REVIEW_BYTES: usize = 3 * 1024 * 1024;
/// Connections served at once; past it, new connections wait in the listen backlog until one ends. Every
/// connection ends within the deadlines below, so a flood of slow ones cannot hold the port for long.
const MAX_CONNECTIONS: usize = 512;
/// A TLS handshake must finish within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A request's headers must arrive within this (also ends idle kept-alive connections).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A request's body must arrive within this; the apiserver's own webhook timeout is at most 30 s.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Reviews answered, by outcome, and the listener's connections; exposed on /metrics.
#[derive(Debug, Clone, Default)]
pub struct ReviewCounts {
    allowed: Counter,
    denied: Counter,
    malformed: Counter,
    connections: Gauge,
    timed_out: Counter,
}

impl ReviewCounts {
    pub fn allowed(&self) -> u64 {
        self.allowed.get()
    }

    pub fn denied(&self) -> u64 {
        self.denied.get()
    }

    pub fn malformed(&self) -> u64 {
        self.malformed.get()
    }

    /// Adds the counts to the manager's metrics.
    pub fn register_metrics(&self, metrics: &ManagerMetrics) {
        metrics.register(
            "pko_admission_reviews_allowed",
            "Admission reviews the webhook allowed.",
            self.allowed.clone(),
        );
        metrics.register(
            "pko_admission_reviews_denied",
            "Admission reviews the webhook denied (an immutable field changed).",
            self.denied.clone(),
        );
        metrics.register(
            "pko_admission_reviews_malformed",
            "Admission requests the webhook could not read (too large or not an AdmissionReview).",
            self.malformed.clone(),
        );
        metrics.register(
            "pko_admission_connections",
            "Connections the webhook listener serves now (at most 512; more wait to be accepted).",
            self.connections.clone(),
        );
        metrics.register(
            "pko_admission_timeouts",
            "Webhook connections closed for a TLS handshake or request body slower than its deadline.",
            self.timed_out.clone(),
        );
    }
}

/// Binds `addr` and serves reviews in the background until the process ends. The socket is bound with
/// SO_REUSEPORT so replicas on one host (tests, a node running two) share the port and the kernel
/// spreads connections over whichever are alive.
pub async fn serve(
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    counts: Arc<ReviewCounts>,
) -> std::io::Result<SocketAddr> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    let listener = socket.listen(1024)?;
    let bound = listener.local_addr()?;
    let acceptor = TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            // The semaphore lives as long as this loop and is never closed.
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    warn!(%error, "admission webhook accept failed");
                    continue;
                }
            };
            let (acceptor, counts) = (acceptor.clone(), counts.clone());
            tokio::spawn(async move {
                counts.connections.inc();
                serve_connection(&acceptor, stream, peer, &counts).await;
                counts.connections.dec();
                drop(slot);
            });
        }
    });
    Ok(bound)
}

/// One connection, from the TLS handshake to its close, each step within its deadline.
async fn serve_connection(
    acceptor: &TlsAcceptor,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    counts: &Arc<ReviewCounts>,
) {
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            debug!(%peer, %error, "admission webhook TLS handshake failed");
            return;
        }
        Err(_) => {
            counts.timed_out.inc();
            debug!(%peer, "admission webhook TLS handshake timed out");
            return;
        }
    };
    let counts = counts.clone();
    let service = hyper::service::service_fn(move |request| {
        let counts = counts.clone();
        async move { Ok::<_, Infallible>(respond(request, &counts).await) }
    });
    if let Err(error) = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(64 * 1024)
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        debug!(%peer, %error, "admission webhook connection ended with an error");
    }
}

async fn respond(request: Request<Incoming>, counts: &ReviewCounts) -> Response<Full<Bytes>> {
    if request.method() != Method::POST || request.uri().path() != IMMUTABLE_FIELDS_PATH {
        return plain(StatusCode::NOT_FOUND, "not found");
    }
    let read = tokio::time::timeout(
        BODY_TIMEOUT,
        Limited::new(request.into_body(), MAX_REVIEW_BYTES).collect(),
    );
    let body = match read.await {
        Ok(Ok(body)) => body.to_bytes(),
        Err(_) => {
            counts.timed_out.inc();
            let mut response = plain(
                StatusCode::REQUEST_TIMEOUT,
                &format!("admission review body not received within {BODY_TIMEOUT:?}"),
            );
            // The connection is held by a slow sender: end it with this answer.
            response.headers_mut().insert(
                "connection",
                hyper::header::HeaderValue::from_static("close"),
            );
            return response;
        }
        Ok(Err(error)) => {
            counts.malformed.inc();
            return plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("admission review body: {error} (limit {MAX_REVIEW_BYTES} bytes)"),
            );
        }
    };
    let response = answer(&body, counts);
    match serde_json::to_vec(&response.into_review()) {
        Ok(json) => Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(json)))
            .unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, "response")),
        Err(error) => plain(StatusCode::INTERNAL_SERVER_ERROR, &error.to_string()),
    }
}

/// The response to one request body: a verdict on a readable review, `invalid` on anything else.
fn answer(body: &[u8], counts: &ReviewCounts) -> AdmissionResponse {
    let request = serde_json::from_slice::<AdmissionReview<DynamicObject>>(body)
        .map_err(|e| e.to_string())
        .and_then(|review| {
            let request: Result<AdmissionRequest<DynamicObject>, _> = review.try_into();
            request.map_err(|_| "review holds no request".to_owned())
        });
    match request {
        Ok(request) => review(&request, counts),
        Err(error) => {
            counts.malformed.inc();
            AdmissionResponse::invalid(format!("malformed AdmissionReview: {error}"))
        }
    }
}

/// Answers one review: updates that change an immutable spec field are denied, naming the fields.
fn review(request: &AdmissionRequest<DynamicObject>, counts: &ReviewCounts) -> AdmissionResponse {
    let span = info_span!(
        "admission.review",
        kind = %request.kind.kind,
        k8s.namespace.name = request.namespace.as_deref().unwrap_or_default(),
        name = %request.name,
        allowed = tracing::field::Empty,
    );
    let _entered = span.enter();
    let response = AdmissionResponse::from(request);
    let changed = match (
        &request.operation,
        GuardedKind::of(&request.kind.kind),
        &request.old_object,
        &request.object,
    ) {
        (&Operation::Update, Some(kind), Some(old), Some(new)) => changed_fields(
            kind,
            old.data.get("spec").unwrap_or(&serde_json::Value::Null),
            new.data.get("spec").unwrap_or(&serde_json::Value::Null),
        ),
        _ => Vec::new(),
    };
    span.record("allowed", changed.is_empty());
    if changed.is_empty() {
        counts.allowed.inc();
        return response;
    }
    counts.denied.inc();
    let message = denial_message(&changed);
    let mut denied = response.deny(&message);
    denied.result = Status::failure(&message, "Invalid").with_code(422);
    denied
}

fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text.to_owned())));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn review_body(operation: &str, kind: &str, old: Value, new: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "7f2c",
                "kind": {"group": "package-operator.run", "version": "v1alpha1", "kind": kind},
                "resource": {"group": "package-operator.run", "version": "v1alpha1", "resource": "objectsets"},
                "name": "rev-1",
                "namespace": "team",
                "operation": operation,
                "userInfo": {"username": "alice"},
                "object": {"apiVersion": "package-operator.run/v1alpha1", "kind": kind,
                           "metadata": {"name": "rev-1"}, "spec": new},
                "oldObject": {"apiVersion": "package-operator.run/v1alpha1", "kind": kind,
                              "metadata": {"name": "rev-1"}, "spec": old},
                "dryRun": false,
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_changed_immutable_field_is_denied_with_the_request_uid() {
        let counts = ReviewCounts::default();
        let body = review_body(
            "UPDATE",
            "ObjectSet",
            json!({"phases": [{"name": "a"}]}),
            json!({"phases": [{"name": "b"}]}),
        );
        let response = answer(&body, &counts);
        assert!(!response.allowed);
        assert_eq!(response.uid, "7f2c");
        assert_eq!(response.result.code, 422);
        assert_eq!(
            response.result.message,
            "spec.phases: Invalid value: phases is immutable"
        );
        assert_eq!((counts.allowed(), counts.denied()), (0, 1));
    }

    #[test]
    fn mutable_changes_and_other_kinds_are_allowed() {
        let counts = ReviewCounts::default();
        let paused = review_body(
            "UPDATE",
            "ObjectSetPhase",
            json!({"objects": [], "paused": false}),
            json!({"objects": [], "paused": true}),
        );
        assert!(answer(&paused, &counts).allowed);
        let other = review_body(
            "UPDATE",
            "ObjectDeployment",
            json!({"a": 1}),
            json!({"a": 2}),
        );
        assert!(answer(&other, &counts).allowed);
        assert_eq!(counts.allowed(), 2);
    }

    #[test]
    fn unreadable_bodies_are_answered_not_panicked_on() {
        let counts = ReviewCounts::default();
        for body in [
            &b"not json"[..],
            br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#,
            br#"{"request": 5}"#,
        ] {
            let response = answer(body, &counts);
            assert!(!response.allowed);
            assert!(response
                .result
                .message
                .starts_with("malformed AdmissionReview"));
        }
        assert_eq!(counts.malformed(), 3);
    }
}

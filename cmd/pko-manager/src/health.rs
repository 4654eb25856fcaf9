//! `/healthz`, `/readyz` and Prometheus `/metrics` on one small HTTP/1.1 listener. Deliberately minimal:
//! three GET endpoints do not justify an HTTP framework in the dependency tree.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pko_actors::admission::webhook_server::ReviewCounts;
use pko_actors::objects::applier::RequestCounts;
use pko_actors::runtime::manager_metrics::ManagerMetrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

/// What the endpoints report.
#[derive(Clone)]
pub struct HealthState {
    ready: Arc<AtomicBool>,
    counts: Arc<dyn Fn() -> Vec<(&'static str, &'static str, u64)> + Send + Sync>,
    reconciles: ManagerMetrics,
}

impl HealthState {
    pub fn new(
        metrics: impl Fn() -> Vec<(&'static str, &'static str, u64)> + Send + Sync + 'static,
        reconciles: ManagerMetrics,
    ) -> Self {
        Self {
            ready: Arc::default(),
            counts: Arc::new(metrics),
            reconciles,
        }
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    fn metrics_text(&self) -> String {
        let mut out = String::new();
        for (name, help, value) in (self.counts)() {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n"
            ));
        }
        // Last: it ends with `# EOF`.
        out.push_str(&self.reconciles.encode());
        out
    }
}

/// Metric lines for the applier's request counters.
pub fn request_metrics(counts: &RequestCounts) -> Vec<(&'static str, &'static str, u64)> {
    vec![
        (
            "pko_object_reads_total",
            "Reads of managed objects (GET).",
            counts.reads(),
        ),
        (
            "pko_object_writes_total",
            "Writes to managed objects (apply, patch, delete).",
            counts.writes(),
        ),
    ]
}

/// Metric lines for the admission webhook's reviews.
pub fn review_metrics(counts: &ReviewCounts) -> Vec<(&'static str, &'static str, u64)> {
    vec![
        (
            "pko_admission_reviews_allowed_total",
            "Admission reviews the webhook allowed.",
            counts.allowed(),
        ),
        (
            "pko_admission_reviews_denied_total",
            "Admission reviews the webhook denied (an immutable field changed).",
            counts.denied(),
        ),
        (
            "pko_admission_reviews_malformed_total",
            "Admission requests the webhook could not read (too large or not an AdmissionReview).",
            counts.malformed(),
        ),
    ]
}

/// Binds the listener; serving runs in the background until the process ends.
pub async fn serve(addr: SocketAddr, state: HealthState) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let state = state.clone();
                    tokio::spawn(async move {
                        if let Err(e) = respond(stream, &state).await {
                            debug!(error = %e, "health connection failed");
                        }
                    });
                }
                Err(e) => warn!(error = %e, "health listener accept failed"),
            }
        }
    });
    Ok(bound)
}

async fn respond(mut stream: TcpStream, state: &HealthState) -> std::io::Result<()> {
    let mut buf = vec![0u8; 2048];
    let n = stream.read(&mut buf).await?;
    let request = String::from_utf8_lossy(&buf[..n]);
    let path = request.split_whitespace().nth(1).unwrap_or("/");
    let (status, body) = match path {
        "/healthz" => ("200 OK", "ok\n".to_owned()),
        "/readyz" if state.ready.load(Ordering::SeqCst) => ("200 OK", "ok\n".to_owned()),
        "/readyz" => ("503 Service Unavailable", "not ready\n".to_owned()),
        "/metrics" => ("200 OK", state.metrics_text()),
        _ => ("404 Not Found", "not found\n".to_owned()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

//! An OTLP trace receiver: the collector's real `TraceService` over gRPC (the service `opentelemetry-proto`
//! generates, served by tonic) and OTLP/HTTP with protobuf bodies (`POST /v1/traces`), keeping every span it
//! receives in memory. Tests point `OTEL_EXPORTER_OTLP_ENDPOINT` at it and assert on the spans; the local
//! environment prints a rollout step's span tree from it. It only receives and keeps; it judges nothing.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::error::TestEnvError;

/// One received span, with the `service.name` of the process that sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedSpan {
    pub service: String,
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// `SPAN_KIND_*` as OTLP names it, lower case without the prefix (`internal`, `producer`, …).
    pub kind: &'static str,
    /// Attributes as text (numbers and booleans formatted).
    pub attributes: BTreeMap<String, String>,
    /// `(trace id, span id)` of each linked span.
    pub links: Vec<(String, String)>,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

type Store = Arc<Mutex<Vec<ReceivedSpan>>>;

fn locked(store: &Store) -> MutexGuard<'_, Vec<ReceivedSpan>> {
    store.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The running receiver; its servers stop when it is dropped.
pub struct OtlpReceiver {
    grpc: SocketAddr,
    http: SocketAddr,
    spans: Store,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for OtlpReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpReceiver")
            .field("grpc", &self.grpc)
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

struct Collector(Store);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl OtlpReceiver {
    /// Starts both listeners on free loopback ports, on the current tokio runtime.
    pub async fn start() -> Result<Self, TestEnvError> {
        let bind = |what: &'static str| async move {
            TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|source| TestEnvError::Spawn {
                    name: what.into(),
                    source,
                })
        };
        let grpc_listener = bind("OTLP gRPC receiver").await?;
        let http_listener = bind("OTLP HTTP receiver").await?;
        let local = |listener: &TcpListener, what: &'static str| {
            listener
                .local_addr()
                .map_err(|source| TestEnvError::Spawn {
                    name: what.into(),
                    source,
                })
        };
        let grpc = local(&grpc_listener, "OTLP gRPC receiver")?;
        let http = local(&http_listener, "OTLP HTTP receiver")?;
        let spans = Store::default();
        let service = TraceServiceServer::new(Collector(spans.clone()));
        let grpc_task = tokio::spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(grpc_listener);
            if let Err(e) = tonic::transport::Server::builder()
                .serve_with_incoming(service, incoming)
                .await
            {
                tracing::warn!(error = %e, "OTLP gRPC receiver stopped");
            }
        });
        let http_spans = spans.clone();
        let http_task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = http_listener.accept().await else {
                    continue;
                };
                let spans = http_spans.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let spans = spans.clone();
                        async move { Ok::<_, Infallible>(http_export(&spans, request).await) }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
        Ok(Self {
            grpc,
            http,
            spans,
            tasks: vec![grpc_task, http_task],
        })
    }

    /// For `OTEL_EXPORTER_OTLP_ENDPOINT` with `OTEL_EXPORTER_OTLP_PROTOCOL=grpc`.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// For `OTEL_EXPORTER_OTLP_ENDPOINT` with `OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf` (the exporter
    /// appends `/v1/traces`).
    pub fn http_endpoint(&self) -> String {
        format!("http://{}", self.http)
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        locked(&self.spans).clone()
    }

    /// The spans of one trace, in arrival order.
    pub fn trace(&self, trace_id: &str) -> Vec<ReceivedSpan> {
        locked(&self.spans)
            .iter()
            .filter(|s| s.trace_id == trace_id)
            .cloned()
            .collect()
    }
}

async fn http_export(store: &Store, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: Vec<u8>| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
    };
    if request.method() != hyper::Method::POST || request.uri().path() != "/v1/traces" {
        return reply(StatusCode::NOT_FOUND, Vec::new());
    }
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return reply(StatusCode::BAD_REQUEST, Vec::new()),
    };
    match ExportTraceServiceRequest::decode(body) {
        Ok(export) => {
            keep(store, export);
            let answer = ExportTraceServiceResponse {
                partial_success: None,
            };
            reply(StatusCode::OK, answer.encode_to_vec())
        }
        Err(_) => reply(StatusCode::BAD_REQUEST, Vec::new()),
    }
}

fn keep(store: &Store, export: ExportTraceServiceRequest) {
    let mut received = Vec::new();
    for resource_spans in export.resource_spans {
        let service = resource_spans
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
            .map(attribute_text)
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                received.push(ReceivedSpan {
                    service: service.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    kind: kind_name(span.kind),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|a| (a.key.clone(), attribute_text(a)))
                        .collect(),
                    links: span
                        .links
                        .iter()
                        .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                        .collect(),
                    name: span.name,
                    start_unix_nanos: span.start_time_unix_nano,
                    end_unix_nanos: span.end_time_unix_nano,
                });
            }
        }
    }
    locked(store).extend(received);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

fn kind_name(kind: i32) -> &'static str {
    match kind {
        1 => "internal",
        2 => "server",
        3 => "client",
        4 => "producer",
        5 => "consumer",
        _ => "unspecified",
    }
}

fn attribute_text(attribute: &KeyValue) -> String {
    match attribute.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// One trace as an indented tree, children under their parent in start order, each line the span's
/// service, name, duration and its `pko.*`/`k8s.*`/`messaging.destination.name` attributes. Spans whose
/// parent is not among `spans` are shown as roots.
pub fn span_tree(spans: &[ReceivedSpan]) -> String {
    let ids: std::collections::HashSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let mut children: BTreeMap<&str, Vec<&ReceivedSpan>> = BTreeMap::new();
    let mut roots = Vec::new();
    for span in spans {
        if span.parent_span_id.is_empty() || !ids.contains(span.parent_span_id.as_str()) {
            roots.push(span);
        } else {
            children
                .entry(span.parent_span_id.as_str())
                .or_default()
                .push(span);
        }
    }
    let by_start = |list: &mut Vec<&ReceivedSpan>| list.sort_by_key(|s| s.start_unix_nanos);
    by_start(&mut roots);
    for list in children.values_mut() {
        by_start(list);
    }
    let mut out = String::new();
    let mut stack: Vec<(&ReceivedSpan, usize)> = roots.into_iter().rev().map(|s| (s, 0)).collect();
    while let Some((span, depth)) = stack.pop() {
        let millis = span.end_unix_nanos.saturating_sub(span.start_unix_nanos) as f64 / 1e6;
        let shown: Vec<String> = span
            .attributes
            .iter()
            .filter(|(k, _)| {
                k.starts_with("pko.") || k.starts_with("k8s.") || *k == "messaging.destination.name"
            })
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let kind = match span.kind {
            "internal" | "unspecified" => String::new(),
            other => format!(" [{other}]"),
        };
        let _ = writeln!(
            out,
            "{:indent$}{} {}{kind} {millis:.1} ms {}",
            "",
            span.service,
            span.name,
            shown.join(" "),
            indent = depth * 2
        );
        if let Some(list) = children.get(span.span_id.as_str()) {
            stack.extend(list.iter().rev().map(|s| (*s, depth + 1)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn span(id: &str, parent: &str, name: &str, start: u64) -> ReceivedSpan {
        ReceivedSpan {
            service: "svc".into(),
            trace_id: "t".into(),
            span_id: id.into(),
            parent_span_id: parent.into(),
            name: name.into(),
            kind: "internal",
            attributes: BTreeMap::new(),
            links: Vec::new(),
            start_unix_nanos: start,
            end_unix_nanos: start + 2_000_000,
        }
    }

    #[test]
    fn a_tree_puts_children_under_their_parent_in_start_order() {
        let spans = [
            span("c2", "a", "second", 30),
            span("a", "", "root", 10),
            span("c1", "a", "first", 20),
            span("g", "c1", "grandchild", 25),
        ];
        let tree = span_tree(&spans);
        let names: Vec<&str> = tree
            .lines()
            .map(|l| l.trim_start().split(' ').nth(1).unwrap())
            .collect();
        assert_eq!(names, ["root", "first", "grandchild", "second"]);
        assert!(tree.lines().nth(2).unwrap().starts_with("    svc grandchild"));
    }
}

//! Requests to the apiserver, counted by verb and response code and timed by verb, from a layer on the
//! client's request stack: every request of the process is seen once, whichever actor sent it. The verb
//! is the Kubernetes one (get, list, watch, create, update, patch, delete), read off the method and path.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Method, Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    verb: &'static str,
    /// The HTTP status code, or `error` when no response came.
    code: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct VerbLabels {
    verb: &'static str,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~16 s: a local apiserver answers in milliseconds, a loaded one in seconds.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// The request metrics; cheap to clone (clones count into the same series).
#[derive(Clone)]
pub struct ApiRequestMetrics {
    requests: Family<RequestLabels, Counter>,
    duration: Family<VerbLabels, Histogram, fn() -> Histogram>,
}

impl Default for ApiRequestMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
        }
    }
}

impl ApiRequestMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "pko_apiserver_requests",
            "Requests to the apiserver by verb and HTTP status code (`error`: no response).",
            self.requests.clone(),
        );
        registry.register(
            "pko_apiserver_request_duration_seconds",
            "Time from sending a request to the apiserver to its response headers, by verb.",
            self.duration.clone(),
        );
    }

    fn record(&self, verb: &'static str, code: Option<u16>, took: f64) {
        let code = code.map_or_else(|| "error".to_owned(), |c| c.to_string());
        self.requests
            .get_or_create(&RequestLabels { verb, code })
            .inc();
        self.duration
            .get_or_create(&VerbLabels { verb })
            .observe(took);
    }
}

/// The Kubernetes verb of a request: `watch` and `list` are GETs of a collection, `get` of one object.
pub fn verb_of(method: &Method, path: &str, query: Option<&str>) -> &'static str {
    match *method {
        Method::GET | Method::HEAD => {}
        Method::POST => return "create",
        Method::PUT => return "update",
        Method::PATCH => return "patch",
        Method::DELETE if names_one_object(path) => return "delete",
        Method::DELETE => return "deletecollection",
        _ => return "other",
    }
    let watching = query.is_some_and(|q| {
        q.split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    });
    if watching {
        "watch"
    } else if names_one_object(path) {
        "get"
    } else {
        "list"
    }
}

/// Whether a resource path names one object (`…/configmaps/x`, `…/namespaces/x`, a subresource) rather
/// than a collection (`…/configmaps`, `…/namespaces/n/configmaps`). Discovery paths count as objects.
fn names_one_object(path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return true,
    };
    match rest {
        [] => true,
        ["namespaces", _namespace, _resource] => false,
        ["namespaces", _namespace, _resource, ..] => true,
        [_resource] => false,
        _ => true,
    }
}

/// Adds request metrics to a client's request stack.
#[derive(Clone)]
pub struct ApiRequestLayer(pub ApiRequestMetrics);

impl<S> tower::Layer<S> for ApiRequestLayer {
    type Service = Measured<S>;

    fn layer(&self, inner: S) -> Measured<S> {
        Measured {
            inner,
            metrics: self.0.clone(),
        }
    }
}

/// A request service that records each request's verb, code and latency.
#[derive(Clone)]
pub struct Measured<S> {
    inner: S,
    metrics: ApiRequestMetrics,
}

impl<S, B, R> tower::Service<Request<B>> for Measured<S>
where
    S: tower::Service<Request<B>, Response = Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let verb = verb_of(
            request.method(),
            request.uri().path(),
            request.uri().query(),
        );
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            let code = response.as_ref().ok().map(|r| r.status().as_u16());
            metrics.record(verb, code, started.elapsed().as_secs_f64());
            response
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_are_read_off_method_path_and_query() {
        let cm = "/api/v1/namespaces/n/configmaps";
        let get = |path: &str, query: Option<&str>| verb_of(&Method::GET, path, query);
        assert_eq!(get(cm, None), "list");
        assert_eq!(get(&format!("{cm}/x"), None), "get");
        assert_eq!(get(cm, Some("labelSelector=a&watch=true")), "watch");
        assert_eq!(get("/api/v1/namespaces", None), "list");
        assert_eq!(get("/api/v1/namespaces/n", None), "get");
        assert_eq!(
            get(
                "/apis/package-operator.run/v1alpha1/hostedclusterpackages",
                None
            ),
            "list"
        );
        assert_eq!(
            get(
                "/apis/package-operator.run/v1alpha1/hostedclusterpackages/h/status",
                None
            ),
            "get"
        );
        assert_eq!(get("/apis/apps/v1", None), "get");
        assert_eq!(verb_of(&Method::PATCH, cm, None), "patch");
        assert_eq!(verb_of(&Method::POST, cm, None), "create");
        assert_eq!(verb_of(&Method::PUT, &format!("{cm}/x"), None), "update");
        assert_eq!(verb_of(&Method::DELETE, &format!("{cm}/x"), None), "delete");
        assert_eq!(verb_of(&Method::DELETE, cm, None), "deletecollection");
    }

    #[tokio::test]
    async fn each_request_is_counted_by_verb_and_code() {
        use tower::{Layer, ServiceExt};
        let metrics = ApiRequestMetrics::default();
        let inner = tower::service_fn(|request: Request<()>| async move {
            let status = if request.method() == Method::GET {
                200
            } else {
                409
            };
            Ok::<_, std::convert::Infallible>(
                Response::builder()
                    .status(status)
                    .body(())
                    .unwrap_or_default(),
            )
        });
        let service = ApiRequestLayer(metrics.clone()).layer(inner);
        let request = |method: Method| {
            Request::builder()
                .method(method)
                .uri("/api/v1/namespaces/n/configmaps/x")
                .body(())
                .unwrap_or_default()
        };
        for method in [Method::GET, Method::GET, Method::PATCH] {
            let _ = service.clone().oneshot(request(method)).await;
        }
        let text = crate::runtime::runtime_metrics::encoded(|registry| metrics.register(registry));
        assert!(
            text.contains(r#"pko_apiserver_requests_total{verb="get",code="200"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"pko_apiserver_requests_total{verb="patch",code="409"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"pko_apiserver_request_duration_seconds_count{verb="get"} 2"#),
            "{text}"
        );
    }
}

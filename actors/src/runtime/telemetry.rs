//! Logs and traces of both binaries: one tracing subscriber with the log formatter (text or JSON lines,
//! filtered by `RUST_LOG`) and, when an OTLP endpoint is configured, the OpenTelemetry layer that turns
//! every `tracing` span into an OTel span exported over OTLP. Configuration is the standard `OTEL_*`
//! environment: `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT` switches export on, `…_PROTOCOL` picks `grpc` or
//! `http/protobuf` (the default), `…_HEADERS`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER(_ARG)` and `OTEL_SDK_DISABLED` are honoured by the SDK and the exporter.
//!
//! Also the W3C trace-context plumbing the domains use to continue a trace across a NATS message or a
//! Kubernetes watch. This module must not know what the process does.

use std::fmt;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::{Event, Span, Subscriber};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// What failed while setting up trace export.
#[derive(Debug, thiserror::Error)]
#[error("OTLP trace export ({endpoint}): {source}")]
pub struct TelemetryError {
    endpoint: String,
    source: opentelemetry_otlp::ExporterBuildError,
}

/// The installed trace pipeline; `shutdown` flushes what is still buffered.
pub struct TracePipeline {
    provider: Option<SdkTracerProvider>,
}

impl TracePipeline {
    /// Installs the global subscriber: logs to stderr (JSON lines carrying `trace_id`/`span_id` when
    /// `json`), plus OTLP export when an endpoint is configured. Must run inside the tokio runtime (the gRPC
    /// channel spawns its worker there). `service` is `service.name` unless the environment names one.
    pub fn install(service: &'static str, json: bool) -> Result<Self, TelemetryError> {
        let filter =
            || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
        let logs = if json {
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .fmt_fields(JsonFields::new())
                .event_format(JsonLogLine)
                .boxed()
        } else {
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .boxed()
        };
        let endpoint = export_endpoint();
        let provider = match &endpoint {
            Some(endpoint) => Some(tracer_provider(service).map_err(|source| TelemetryError {
                endpoint: endpoint.clone(),
                source,
            })?),
            None => None,
        };
        let traces = provider.as_ref().map(|provider| {
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer(service))
                .with_threads(false)
                .with_filter(filter())
        });
        tracing_subscriber::registry()
            .with(logs.with_filter(filter()))
            .with(traces)
            .init();
        if let Some(endpoint) = endpoint {
            tracing::info!(endpoint, "exporting traces over OTLP");
        }
        Ok(Self { provider })
    }

    /// Flushes and stops the exporter. Call it outside the actix System (from the thread that ran it): the
    /// provider's shutdown blocks, and inside a System it deadlocks until its timeout.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            if let Err(e) = provider.shutdown() {
                eprintln!("flushing traces at shutdown: {e}");
            }
        }
    }
}

/// The `OTEL_*` settings of this process that its connectors get in their Deployments, so they export
/// where the manager does: endpoint, protocol, timeout, compression, sampler and batching. Not the headers (they may
/// hold credentials; connectors needing them get them by other means, see docs/observability.md) and not
/// the service name or resource attributes (a connector is `pko-connector`).
pub fn connector_trace_env() -> Vec<(String, String)> {
    const PASSED: [&str; 12] = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
        "OTEL_TRACES_SAMPLER",
        "OTEL_TRACES_SAMPLER_ARG",
        "OTEL_BSP_SCHEDULE_DELAY",
        "OTEL_BSP_MAX_QUEUE_SIZE",
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
        "OTEL_BSP_EXPORT_TIMEOUT",
    ];
    PASSED
        .iter()
        .filter_map(|name| {
            let value = std::env::var(name).ok().filter(|v| !v.is_empty())?;
            Some(((*name).to_owned(), value))
        })
        .collect()
}

/// The endpoint traces go to, or None when export is off (no endpoint, or `OTEL_SDK_DISABLED=true`).
fn export_endpoint() -> Option<String> {
    let set = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return None;
    }
    set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

fn tracer_provider(
    service: &'static str,
) -> Result<SdkTracerProvider, opentelemetry_otlp::ExporterBuildError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder().build()?;
    // The environment's detectors read OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the binary's name
    // is only the fallback.
    let named_by_env = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let mut resource = Resource::builder().with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    if let Ok(namespace) = std::env::var("POD_NAMESPACE") {
        resource = resource.with_attribute(opentelemetry::KeyValue::new(
            "k8s.namespace.name",
            namespace,
        ));
    }
    if !named_by_env {
        resource = resource.with_service_name(service);
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// The current span's `traceparent`, if OpenTelemetry records it (export on and sampled in).
pub fn current_traceparent() -> Option<String> {
    let mut traceparent = None;
    inject_current(|key, value| {
        if key == "traceparent" {
            traceparent = Some(value);
        }
    });
    traceparent
}

/// The trace id (32 hex digits) a W3C `traceparent` names.
pub fn trace_id_of(traceparent: &str) -> Option<&str> {
    traceparent.split('-').nth(1).filter(|id| id.len() == 32)
}

/// The remote context a set of W3C headers names (read through `get`), or None when they name none.
fn remote_context<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Option<Context> {
    // The marker ties the values' lifetime to the struct, so a borrow of it never outlives them.
    struct Headers<'a, F>(F, std::marker::PhantomData<&'a str>);
    impl<'a, F: Fn(&str) -> Option<&'a str>> Extractor for Headers<'a, F> {
        fn get(&self, key: &str) -> Option<&str> {
            (self.0)(key)
        }
        fn keys(&self) -> Vec<&str> {
            vec!["traceparent", "tracestate"]
        }
    }
    let context = TraceContextPropagator::new().extract(&Headers(get, std::marker::PhantomData));
    context.span().span_context().is_valid().then_some(context)
}

/// How many runs one cause may parent: a write's trace holds the work it caused until that work settles,
/// but an object that never settles (a probe that never passes) must not grow one trace forever; later
/// runs start their own trace, linked to the cause.
const RUNS_PER_CAUSE: u32 = 16;

/// The trace context of a span, captured to travel in a message to another actor (the receiving actor
/// runs later, outside the sender's span).
#[derive(Debug, Clone, Default)]
pub struct CapturedTrace(Option<Context>);

impl CapturedTrace {
    /// The current span's context, if OpenTelemetry records it.
    pub fn current() -> Self {
        let context = Span::current().context();
        Self(context.span().span_context().is_valid().then_some(context))
    }

    /// The context a message's W3C trace-context headers (read through `get`) name, if any.
    pub fn from_headers<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Self {
        Self(remote_context(get))
    }

    /// Makes `span` a child of the captured context.
    pub fn parent(&self, span: &Span) {
        if let Some(context) = &self.0 {
            // Only fails when the span was already started, which a new span is not.
            let _ = span.set_parent(context.clone());
        }
    }
}

/// The trace an actor's next runs continue: the context of the write (or request) that caused them, taken
/// from a trace-parent annotation, a message header or the sender's span.
#[derive(Debug, Default)]
pub struct TraceCause {
    /// The `traceparent` the cause came from, so the same annotation seen again is not a new cause.
    origin: Option<String>,
    context: Option<Context>,
    runs: u32,
}

impl TraceCause {
    /// The cause an annotation value names; a value already adopted keeps its run count.
    pub fn observe(&mut self, traceparent: Option<&str>) {
        if traceparent.is_some() && traceparent != self.origin.as_deref() {
            self.origin = traceparent.map(str::to_owned);
            self.context =
                traceparent.and_then(|t| remote_context(|key| (key == "traceparent").then_some(t)));
            self.runs = 0;
        }
    }

    /// A span's context handed over in process (a message to another actor) as the cause of the next
    /// runs; an empty capture leaves the cause as it was.
    pub fn adopt(&mut self, captured: CapturedTrace) {
        if let Some(context) = captured.0 {
            self.origin = None;
            self.context = Some(context);
            self.runs = 0;
        }
    }

    /// Makes `span` continue the cause: as its child while the cause has runs left, else linked to it.
    pub fn attach(&mut self, span: &Span) {
        let Some(context) = &self.context else {
            return;
        };
        if self.runs < RUNS_PER_CAUSE {
            self.runs += 1;
            // Only fails when the span was already started, which a new span is not.
            let _ = span.set_parent(context.clone());
        } else {
            span.add_link(context.span().span_context().clone());
        }
    }

    /// The caused work settled: later runs are their own traces.
    pub fn settle(&mut self) {
        self.context = None;
    }
}

/// Injects W3C headers into any string map a message type offers.
struct HeaderWriter<'a, F: FnMut(&str, String)>(&'a mut F);

impl<F: FnMut(&str, String)> Injector for HeaderWriter<'_, F> {
    fn set(&mut self, key: &str, value: String) {
        (self.0)(key, value)
    }
}

/// Writes the current span's trace-context headers through `set`.
pub fn inject_current(mut set: impl FnMut(&str, String)) {
    TraceContextPropagator::new()
        .inject_context(&Span::current().context(), &mut HeaderWriter(&mut set));
}

/// One log event as a JSON line: timestamp, level, target, the event's fields, the span it happened in
/// (with its fields) and, when the span is traced, `trace_id` and `span_id`, so a log search and a trace
/// search meet.
struct JsonLogLine;

impl<S, N> FormatEvent<S, N> for JsonLogLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let metadata = event.metadata();
        let mut line = serde_json::Map::new();
        line.insert(
            "timestamp".into(),
            k8s_openapi::jiff::Timestamp::now().to_string().into(),
        );
        line.insert("level".into(), metadata.level().as_str().into());
        line.insert("target".into(), metadata.target().into());
        let mut fields = JsonVisitor::default();
        event.record(&mut fields);
        line.insert("fields".into(), fields.0.into());
        if let Some(span) = ctx.lookup_current() {
            let mut current = serde_json::Map::new();
            current.insert("name".into(), span.name().into());
            if let Some(formatted) = span.extensions().get::<FormattedFields<N>>() {
                if let Ok(serde_json::Value::Object(span_fields)) =
                    serde_json::from_str::<serde_json::Value>(formatted.as_str())
                {
                    current.extend(span_fields);
                }
            }
            line.insert("span".into(), current.into());
            let otel = tracing::dispatcher::get_default(|dispatch| {
                tracing_opentelemetry::get_otel_context(&span.id(), dispatch)
            });
            if let Some(otel) = otel {
                let otel_span = otel.span();
                let ids = otel_span.span_context();
                if ids.is_valid() {
                    line.insert("trace_id".into(), ids.trace_id().to_string().into());
                    line.insert("span_id".into(), ids.span_id().to_string().into());
                }
            }
        }
        let text = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

#[derive(Default)]
struct JsonVisitor(serde_json::Map<String, serde_json::Value>);

impl tracing::field::Visit for JsonVisitor {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_names_its_span_context_and_garbage_names_none() {
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let span_context_of = |traceparent: &str| {
            remote_context(|key| (key == "traceparent").then_some(traceparent))
                .map(|context| context.span().span_context().clone())
        };
        let context = span_context_of(parent).expect("valid traceparent");
        assert_eq!(
            context.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(context.span_id().to_string(), "b7ad6b7169203331");
        assert_eq!(
            trace_id_of(parent),
            Some("0af7651916cd43dd8448eb211c80319c")
        );
        assert_eq!(trace_id_of("00-short-b7ad6b7169203331-01"), None);
        assert!(context.is_remote());
        for bad in [
            "",
            "00-zz-yy-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
        ] {
            assert!(span_context_of(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn without_an_otel_layer_nothing_is_injected() {
        let span = tracing::info_span!("untraced");
        let _entered = span.enter();
        assert!(current_traceparent().is_none());
    }

    /// Spans made by `runs` under `cause`, as the SDK exports them.
    fn traced(runs: impl FnOnce()) -> Vec<opentelemetry_sdk::trace::SpanData> {
        let exporter = opentelemetry_sdk::trace::InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, runs);
        exporter.get_finished_spans().unwrap_or_default()
    }

    #[test]
    fn a_cause_parents_its_first_runs_then_is_only_linked() {
        let write = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let spans = traced(|| {
            let mut cause = TraceCause::default();
            cause.observe(Some(write));
            for _ in 0..=RUNS_PER_CAUSE {
                let span = tracing::info_span!("run");
                cause.attach(&span);
                // The same annotation seen again is not a new cause.
                cause.observe(Some(write));
            }
        });
        assert_eq!(spans.len(), RUNS_PER_CAUSE as usize + 1);
        let (continued, later) = spans.split_at(RUNS_PER_CAUSE as usize);
        for span in continued {
            assert_eq!(
                span.span_context.trace_id().to_string(),
                "0af7651916cd43dd8448eb211c80319c"
            );
            assert_eq!(span.parent_span_id.to_string(), "b7ad6b7169203331");
        }
        let last = &later[0];
        assert_ne!(
            last.span_context.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(last.links.links.len(), 1, "linked to its cause");
    }

    #[test]
    fn a_settled_cause_parents_nothing_and_a_new_write_starts_over() {
        let first = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let second = "00-11111111111111111111111111111111-2222222222222222-01";
        let spans = traced(|| {
            let mut cause = TraceCause::default();
            cause.observe(Some(first));
            cause.settle();
            cause.attach(&tracing::info_span!("after settling"));
            cause.observe(Some(second));
            cause.attach(&tracing::info_span!("after a new write"));
        });
        assert_eq!(spans.len(), 2);
        assert_ne!(
            spans[0].span_context.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert!(spans[0].links.links.is_empty());
        assert_eq!(
            spans[1].span_context.trace_id().to_string(),
            "11111111111111111111111111111111"
        );
    }
}

//! One sink's deliveries. It reads the rollout event stream through its durable consumer (one event
//! outstanding at a time, so in stream order), turns each event it wants into a CloudEvents request,
//! POSTs it until the sink takes it (or refuses that event itself), and only then acknowledges it. The
//! stream already holds each step once (by message id); an event redelivered after a lost
//! acknowledgement is recognised by its id and not sent twice. A manager that stops lets the delivery
//! under way end and acknowledges it; the next one (on any replica) resumes at the consumer's next
//! event.
//!
//! It must not touch the rollout: a sink that is down only grows its consumer's backlog in the stream.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::notifications::notification_sink::{
    delivery_verdict, DeliveryVerdict, NotificationSink, SinkScope,
};
use crate::engine::notifications::sink_address::SinkAddressPolicy;
use async_nats::jetstream::consumer::{pull, AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::{self, AckKind};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use pko_proto::connector_wire::TRACEPARENT_HEADER;
use pko_proto::rollout_events::{RolloutEvent, STREAM};
use tokio::sync::watch;
use tracing::{info, info_span, warn, Instrument};

use crate::metrics::notification_metrics::{DeliveryResult, NotificationMetrics};
use crate::notifications::cloudevent_request::{cloudevent_request, CloudEventRequest};
use crate::notifications::sink_addresses::{address_refusal, literal_refusal, SinkResolver};
use crate::notifications::sink_credentials::{read_credentials, SinkCredentials};
use crate::rollout::rollout_publisher::ensure_stream;
use crate::runtime::reconcile_gate::Backoff;
use crate::runtime::telemetry::{current_traceparent, CapturedTrace};

/// How long one POST may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the stream waits for an acknowledgement before it hands the event out again; every attempt
/// tells it the delivery is still under way, and the backoff between attempts stays below it.
const ACK_WAIT: Duration = Duration::from_secs(60);
/// A sink consumer nobody reads for this long is removed by the server (a sink whose HostedClusterPackage
/// went while no manager ran).
const INACTIVE_THRESHOLD: Duration = Duration::from_secs(7 * 24 * 3600);
/// Event ids remembered as delivered, against redeliveries after a lost acknowledgement.
const REMEMBERED_IDS: usize = 1024;
/// Credentials are read again after this long (and after the sink refused them).
const CREDENTIALS_TTL: Duration = Duration::from_secs(300);

/// What every sink's deliveries use.
pub struct SinkServices {
    pub jetstream: jetstream::Context,
    pub http: reqwest::Client,
    /// Which addresses sinks may reach (the client's resolver holds it too).
    pub addresses: Arc<SinkAddressPolicy>,
    /// Secrets of the manager's namespace.
    pub secrets: Api<Secret>,
    pub metrics: NotificationMetrics,
}

/// One sink to serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkTask {
    /// How metrics and logs name it.
    pub label: String,
    pub scope: SinkScope,
    pub sink: NotificationSink,
}

impl SinkTask {
    pub fn consumer_name(&self) -> String {
        self.sink.consumer_name(&self.scope)
    }
}

/// The ids of the events delivered last.
struct RecentIds {
    order: VecDeque<String>,
    ids: HashSet<String>,
}

impl RecentIds {
    fn new() -> Self {
        Self {
            order: VecDeque::new(),
            ids: HashSet::new(),
        }
    }

    fn contains(&self, id: &str) -> bool {
        self.ids.contains(id)
    }

    fn insert(&mut self, id: String) {
        if self.ids.insert(id.clone()) {
            self.order.push_back(id);
        }
        while self.order.len() > REMEMBERED_IDS {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
    }
}

/// The sink's credentials as last read.
#[derive(Default)]
struct CredentialsCache {
    read: Option<(SinkCredentials, Instant)>,
}

impl CredentialsCache {
    async fn get(
        &mut self,
        task: &SinkTask,
        secrets: &Api<Secret>,
    ) -> Result<SinkCredentials, String> {
        let Some(name) = &task.sink.credentials_secret else {
            return Ok(SinkCredentials::None);
        };
        if let Some((credentials, at)) = &self.read {
            if at.elapsed() < CREDENTIALS_TTL {
                return Ok(credentials.clone());
            }
        }
        let credentials = read_credentials(secrets, name, &task.sink.url).await?;
        self.read = Some((credentials.clone(), Instant::now()));
        Ok(credentials)
    }

    fn forget(&mut self) {
        self.read = None;
    }
}

/// What became of one event.
enum Handled {
    /// Acknowledge it: delivered, refused for good, or not for this sink.
    Done,
    /// The manager stops: leave it to the stream to hand out again.
    Stopping,
}

/// Serves `task` until `stop` says so.
pub async fn run_sink(
    task: SinkTask,
    services: Arc<SinkServices>,
    mut stop: watch::Receiver<bool>,
) {
    let mut delays = retry_delays();
    let mut delivered = RecentIds::new();
    let mut credentials = CredentialsCache::default();
    info!(sink = %task.label, consumer = %task.consumer_name(), "CloudEvents sink started");
    loop {
        if *stop.borrow() {
            return;
        }
        match sink_consumer(&services.jetstream, &task).await {
            Ok(consumer) => match consumer.messages().await {
                Ok(mut messages) => loop {
                    let next = tokio::select! {
                        next = messages.next() => next,
                        _ = stop.changed() => return,
                    };
                    let message = match next {
                        Some(Ok(message)) => message,
                        Some(Err(error)) => {
                            warn!(sink = %task.label, %error, "reading the sink's consumer; reading again");
                            break;
                        }
                        None => break,
                    };
                    delays = retry_delays();
                    let handled = deliver(
                        &task,
                        &services,
                        &message,
                        (&mut delivered, &mut credentials),
                        &mut stop,
                    )
                    .await;
                    match handled {
                        Handled::Done => {
                            if let Err(error) = message.ack().await {
                                warn!(sink = %task.label, %error, "acknowledging a delivered event");
                            }
                            let left = message.info().map(|i| i.pending).unwrap_or_default();
                            services.metrics.pending(&task.label, left);
                        }
                        Handled::Stopping => {
                            // Handed out again at once, to whoever serves the sink next.
                            let _ = message.ack_with(AckKind::Nak(None)).await;
                            return;
                        }
                    }
                },
                Err(error) => warn!(sink = %task.label, %error, "reading the sink's consumer"),
            },
            Err(error) => warn!(sink = %task.label, %error, "making the sink's consumer"),
        }
        let delay = delays.next().unwrap_or(Duration::from_secs(30));
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
    }
}

/// The sink's durable consumer of the stream, made if missing (and the stream with it). A sink of one
/// HostedClusterPackage starts at that object's oldest event the stream holds, so a sink set with the
/// object misses none; the manager's sink starts at what comes next, not at a week of every rollout.
async fn sink_consumer(
    jetstream: &jetstream::Context,
    task: &SinkTask,
) -> Result<PullConsumer, String> {
    ensure_stream(jetstream).await?;
    let stream = jetstream
        .get_stream(STREAM)
        .await
        .map_err(|e| format!("reading stream {STREAM}: {e}"))?;
    let name = task.consumer_name();
    let deliver_policy = match task.scope {
        SinkScope::Manager => DeliverPolicy::New,
        SinkScope::HostedClusterPackage { .. } => DeliverPolicy::All,
    };
    stream
        .get_or_create_consumer(
            &name,
            pull::Config {
                durable_name: Some(name.clone()),
                description: Some(format!("pko CloudEvents sink {}", task.label)),
                filter_subject: task.scope.filter_subject(),
                deliver_policy,
                ack_policy: AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                max_ack_pending: 1,
                inactive_threshold: INACTIVE_THRESHOLD,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("making consumer {name}: {e}"))
}

/// Delivers one message of the stream to the sink, retrying until it is taken or refused for good.
async fn deliver(
    task: &SinkTask,
    services: &SinkServices,
    message: &jetstream::Message,
    (delivered, credentials): (&mut RecentIds, &mut CredentialsCache),
    stop: &mut watch::Receiver<bool>,
) -> Handled {
    let metrics = &services.metrics;
    let info = message.info().ok();
    metrics.pending(&task.label, info.as_ref().map_or(1, |i| i.pending + 1));
    let published = info
        .as_ref()
        .and_then(|i| Timestamp::from_nanosecond(i.published.unix_timestamp_nanos()).ok())
        .map(|t| t.to_string());
    let parsed = serde_json::from_slice::<serde_json::Value>(&message.payload)
        .ok()
        .and_then(|data| {
            Some((
                serde_json::from_value::<RolloutEvent>(data.clone()).ok()?,
                data,
            ))
        });
    let Some((event, data)) = parsed else {
        metrics.delivery(&task.label, DeliveryResult::Malformed);
        return Handled::Done;
    };
    let id = event.message_id();
    if !task.sink.wants(event.kind) || !task.scope.carries(&event.uid) || delivered.contains(&id) {
        metrics.delivery(&task.label, DeliveryResult::Skipped);
        return Handled::Done;
    }
    let span = info_span!("deliver cloudevent", sink = %task.label, ce.id = %id, ce.r#type = ?event.kind, otel.kind = "client");
    let cause = message
        .headers
        .as_ref()
        .and_then(|h| h.get(TRACEPARENT_HEADER))
        .map(|v| v.as_str().to_owned());
    CapturedTrace::from_headers(|key| (key == "traceparent").then_some(cause.as_deref()).flatten())
        .parent(&span);
    let request = span.in_scope(|| {
        cloudevent_request(
            &event,
            data,
            published.as_deref(),
            current_traceparent().as_deref(),
        )
    });
    let request = match request {
        Ok(request) => request,
        Err(error) => {
            warn!(sink = %task.label, %id, %error, "an event that cannot be a CloudEvent; dropped");
            metrics.delivery(&task.label, DeliveryResult::Malformed);
            return Handled::Done;
        }
    };
    let mut delays = retry_delays();
    let mut attempts = 0u32;
    loop {
        // Still under way: the stream does not hand the event out again meanwhile.
        let _ = message.ack_with(AckKind::Progress).await;
        attempts += 1;
        let outcome = match credentials.get(task, &services.secrets).await {
            Ok(with) => post(services, &task.sink.url, &request, &with)
                .instrument(span.clone())
                .await
                .map_err(|failed| {
                    if failed.address_refused {
                        metrics.address_refused(&task.label);
                    }
                    failed.message
                }),
            Err(error) => Err(error),
        };
        let verdict = match &outcome {
            Ok(status) => delivery_verdict(*status),
            Err(_) => DeliveryVerdict::Retry,
        };
        match verdict {
            DeliveryVerdict::Delivered => {
                if attempts > 1 {
                    info!(sink = %task.label, %id, attempts, "CloudEvent delivered after retries");
                }
                metrics.delivery(&task.label, DeliveryResult::Delivered);
                delivered.insert(id);
                return Handled::Done;
            }
            DeliveryVerdict::Refused => {
                warn!(sink = %task.label, %id, status = ?outcome, "the sink refused the CloudEvent; the next one goes");
                metrics.delivery(&task.label, DeliveryResult::Refused);
                return Handled::Done;
            }
            DeliveryVerdict::Retry => {
                if matches!(outcome, Ok(401 | 403)) {
                    credentials.forget();
                }
                if attempts == 1 {
                    warn!(sink = %task.label, %id, outcome = ?outcome, "CloudEvent not taken; retrying with backoff");
                }
                metrics.delivery(&task.label, DeliveryResult::Retried);
            }
        }
        let delay = delays.next().unwrap_or(Duration::from_secs(30));
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return Handled::Stopping,
        }
    }
}

/// Why a POST got no answer.
struct PostFailed {
    message: String,
    /// The sink's address is one the manager may not reach.
    address_refused: bool,
}

/// One POST; the status it was answered with.
async fn post(
    services: &SinkServices,
    url: &str,
    request: &CloudEventRequest,
    credentials: &SinkCredentials,
) -> Result<u16, PostFailed> {
    if let Some(refused) = literal_refusal(&services.addresses, url) {
        return Err(PostFailed {
            message: refused.to_string(),
            address_refused: true,
        });
    }
    let mut builder = services.http.post(url).body(request.body.clone());
    for (name, value) in &request.headers {
        builder = builder.header(name.as_str(), value.clone());
    }
    match credentials.apply(builder).send().await {
        Ok(response) => Ok(response.status().as_u16()),
        Err(error) => Err(match address_refusal(&error) {
            Some(refused) => PostFailed {
                message: refused.to_string(),
                address_refused: true,
            },
            None => PostFailed {
                message: error.to_string(),
                address_refused: false,
            },
        }),
    }
}

/// Delays between attempts: 200 ms doubling to 30 s, jittered.
fn retry_delays() -> impl Iterator<Item = Duration> {
    Backoff::new(Duration::from_millis(200), Duration::from_secs(30)).delays()
}

/// The HTTP client of every sink: a time limit per request, redirects not followed (a sink that moved
/// says so with its answer, and the event is not carried to an address nobody configured), hosts
/// resolved through [`SinkResolver`] under `addresses`, and no proxy.
pub fn sink_http_client(
    addresses: Arc<SinkAddressPolicy>,
) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(SinkResolver { policy: addresses })
        .user_agent(concat!("pko-manager/", env!("CARGO_PKG_VERSION")))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An id delivered is recognised when it comes again, for the last `REMEMBERED_IDS` ids.
    #[test]
    fn delivered_ids_are_remembered_within_their_bound() {
        let mut ids = RecentIds::new();
        for i in 0..=REMEMBERED_IDS {
            ids.insert(format!("id-{i}"));
        }
        ids.insert(format!("id-{REMEMBERED_IDS}"));
        assert!(ids.contains(&format!("id-{REMEMBERED_IDS}")));
        assert!(ids.contains("id-1"));
        assert!(!ids.contains("id-0"), "the oldest made room");
        assert_eq!(ids.order.len(), REMEMBERED_IDS);
    }
}

//! Publishes HostedClusterPackage rollout events to the JetStream stream `PKO_ROLLOUTS`, through a bounded
//! outbox: a supervisor hands its events over without waiting (a NATS outage never holds a Package write
//! back), and one task publishes them oldest first, each with its message id, retrying an event until the
//! stream acknowledges it before it takes the next. The stream drops what it already holds by message id,
//! so a retry whose acknowledgement was lost, or a restarted manager telling a rollout's story again, is
//! stored once. The stream is created, or its limits brought up to date, before the first publish.
//! A story told again of a rollout that had finished ([`RolloutPublisher::enqueue_unless_stored`]) is
//! told only if the stream does not hold its end, so a restart long after a rollout does not repeat it.
//!
//! It must not decide what to tell; `engine::rollout::rollout_events` does.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::{self, stream};
use pko_proto::rollout_events::{
    RolloutEvent, RolloutEventKind, STREAM, STREAM_DUPLICATE_WINDOW, STREAM_MAX_AGE,
    STREAM_MAX_BYTES, STREAM_MAX_MESSAGE_BYTES, SUBJECT_PREFIX,
};
use tokio::sync::Notify;
use tracing::{info, warn};

use pko_proto::connector_wire::TRACEPARENT_HEADER;

use crate::metrics::manager_metrics::{ManagerMetrics, Published};
use crate::runtime::reconcile_gate::Backoff;

/// Events the outbox holds at most when the manager does not say otherwise (about 3 MB).
pub const DEFAULT_OUTBOX_CAPACITY: usize = 10_000;

/// Tell the events that carry it only if the stream's last message on `subject` is not `message_id`.
#[derive(Debug, PartialEq, Eq)]
pub struct UnlessStored {
    pub subject: String,
    pub message_id: String,
}

/// One event waiting for the stream, with the condition of the batch it came in, if any.
#[derive(Debug)]
pub struct QueuedEvent {
    pub event: RolloutEvent,
    pub unless: Option<Arc<UnlessStored>>,
}

/// The events not yet acknowledged by the stream, oldest first, at most `capacity` of them.
#[derive(Debug)]
pub struct EventOutbox {
    events: VecDeque<QueuedEvent>,
    capacity: usize,
}

impl EventOutbox {
    pub fn new(capacity: usize) -> Self {
        Self {
            events: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Queues `events` behind the others; returns how many did not fit and were dropped (the newest:
    /// what is queued keeps its order, and the stream shows no step out of order).
    pub fn push(&mut self, events: Vec<RolloutEvent>, unless: Option<Arc<UnlessStored>>) -> usize {
        let room = self.capacity.saturating_sub(self.events.len());
        let dropped = events.len().saturating_sub(room);
        self.events
            .extend(events.into_iter().take(room).map(|event| QueuedEvent {
                event,
                unless: unless.clone(),
            }));
        dropped
    }

    /// The event to publish next.
    pub fn next(&self) -> Option<&QueuedEvent> {
        self.events.front()
    }

    /// The stream acknowledged the event [`EventOutbox::next`] gave.
    pub fn acknowledged(&mut self) {
        self.events.pop_front();
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

/// Shared by every HostedClusterPackage actor.
pub struct RolloutPublisher {
    outbox: Mutex<EventOutbox>,
    /// Something was queued.
    queued: Notify,
    /// The outbox became empty.
    emptied: Notify,
    metrics: ManagerMetrics,
}

impl RolloutPublisher {
    /// A publisher with an outbox of `capacity` events, and its delivery task on the current runtime.
    pub fn start(nats: async_nats::Client, capacity: usize, metrics: ManagerMetrics) -> Arc<Self> {
        let publisher = Arc::new(Self {
            outbox: Mutex::new(EventOutbox::new(capacity)),
            queued: Notify::new(),
            emptied: Notify::new(),
            metrics,
        });
        tokio::spawn(publisher.clone().deliver(jetstream::new(nats)));
        publisher
    }

    fn outbox(&self) -> MutexGuard<'_, EventOutbox> {
        // A panic while holding the lock cannot leave the queue half-changed: every change is one call.
        self.outbox
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `events` for publishing, in order, without waiting.
    pub fn enqueue(&self, events: Vec<RolloutEvent>) {
        self.queue(events, None);
    }

    /// Queues the story of a rollout told again: when it tells the rollout finished, it is published
    /// only if the stream does not hold that `rolloutFinished` yet, as the last of its subject. A story
    /// whose end the stream holds was told whole before (events are stored in order).
    pub fn enqueue_unless_stored(&self, events: Vec<RolloutEvent>) {
        let unless = events
            .iter()
            .find(|e| e.kind == RolloutEventKind::RolloutFinished)
            .map(|finished| {
                Arc::new(UnlessStored {
                    subject: finished.subject(),
                    message_id: finished.message_id(),
                })
            });
        self.queue(events, unless);
    }

    fn queue(&self, events: Vec<RolloutEvent>, unless: Option<Arc<UnlessStored>>) {
        if events.is_empty() {
            return;
        }
        let (dropped, pending) = {
            let mut outbox = self.outbox();
            let dropped = outbox.push(events, unless);
            (dropped, outbox.len())
        };
        if dropped > 0 {
            warn!(
                dropped,
                pending, "rollout event outbox full; newest events dropped"
            );
            self.metrics.rollout_events_dropped(dropped);
        }
        self.metrics.rollout_events_pending(pending);
        self.queued.notify_one();
    }

    /// Waits until every queued event is acknowledged, at most `limit` (on shutdown); returns how many
    /// are left.
    pub async fn flush(&self, limit: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let emptied = self.emptied.notified();
            tokio::pin!(emptied);
            emptied.as_mut().enable();
            let pending = self.outbox().len();
            if pending == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, emptied).await.is_err() {
                return self.outbox().len();
            }
        }
    }

    /// Publishes queued events one by one, each until the stream acknowledges it.
    async fn deliver(self: Arc<Self>, jetstream: jetstream::Context) {
        let mut stream_ready = false;
        let mut failures = 0u32;
        let mut backoff = retry_delays();
        // The condition looked up last and whether the stream held it: one lookup per batch.
        let mut checked: Option<(Arc<UnlessStored>, bool)> = None;
        loop {
            let next = self
                .outbox()
                .next()
                .map(|q| (q.event.clone(), q.unless.clone()));
            let Some((event, unless)) = next else {
                self.emptied.notify_waiters();
                self.queued.notified().await;
                continue;
            };
            let outcome = if stream_ready {
                let told = match &unless {
                    None => false,
                    Some(unless) => match &checked {
                        Some((looked_up, held)) if Arc::ptr_eq(looked_up, unless) => *held,
                        _ => {
                            let held = holds_last(&jetstream, unless).await;
                            checked = Some((unless.clone(), held));
                            held
                        }
                    },
                };
                if told {
                    Ok(Published::ToldBefore)
                } else {
                    publish(&jetstream, &event).await
                }
            } else {
                ensure_stream(&jetstream).await.map(|()| Published::Stored)
            };
            match outcome {
                Ok(_) if !stream_ready => stream_ready = true,
                Ok(published) => {
                    let pending = {
                        let mut outbox = self.outbox();
                        outbox.acknowledged();
                        outbox.len()
                    };
                    self.metrics.rollout_event_published(published);
                    self.metrics.rollout_events_pending(pending);
                    if failures > 0 {
                        info!(
                            failures,
                            pending, "rollout events delivered again after failures"
                        );
                        failures = 0;
                        backoff = retry_delays();
                    }
                }
                Err(error) => {
                    // The stream may have gone with the server's storage: make sure of it again.
                    stream_ready = false;
                    if failures == 0 {
                        warn!(%error, subject = %event.subject(), "rollout event not acknowledged; retrying until it is");
                    }
                    failures = failures.saturating_add(1);
                    self.metrics.rollout_event_publish_failed();
                    let delay = backoff.next().unwrap_or(Duration::from_secs(5));
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}

/// Delays between attempts to deliver one event: 100 ms doubling to 5 s, jittered.
fn retry_delays() -> impl Iterator<Item = Duration> {
    Backoff::new(Duration::from_millis(100), Duration::from_secs(5)).delays()
}

/// Creates the stream, or updates its limits to this build's.
pub(crate) async fn ensure_stream(jetstream: &jetstream::Context) -> Result<(), String> {
    jetstream
        .create_or_update_stream(stream::Config {
            name: STREAM.to_owned(),
            subjects: vec![format!("{SUBJECT_PREFIX}.>")],
            max_age: STREAM_MAX_AGE,
            max_bytes: STREAM_MAX_BYTES,
            max_message_size: STREAM_MAX_MESSAGE_BYTES,
            duplicate_window: STREAM_DUPLICATE_WINDOW,
            discard: stream::DiscardPolicy::Old,
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map(|_| ())
        .map_err(|e| format!("creating or updating stream {STREAM}: {e}"))
}

/// Whether the stream's last message on the condition's subject is its message id. Not known (the
/// lookup failed) counts as not held: the story is told, and the duplicate window keeps it once.
async fn holds_last(jetstream: &jetstream::Context, unless: &UnlessStored) -> bool {
    let last = match jetstream.get_stream_no_info(STREAM).await {
        Ok(stream) => stream
            .get_last_raw_message_by_subject(&unless.subject)
            .await
            .map_err(|e| {
                let none = matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound);
                (none, e.to_string())
            }),
        Err(e) => Err((false, e.to_string())),
    };
    match last {
        Ok(message) => message
            .headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .is_some_and(|id| id.as_str() == unless.message_id),
        Err((true, _)) => false,
        Err((false, error)) => {
            warn!(%error, subject = %unless.subject, "could not look up whether a finished rollout's story was told; telling it");
            false
        }
    }
}

/// Publishes one event with its message id.
async fn publish(
    jetstream: &jetstream::Context,
    event: &RolloutEvent,
) -> Result<Published, String> {
    let payload = serde_json::to_vec(event).map_err(|e| format!("encoding the event: {e}"))?;
    let mut message = PublishMessage::build()
        .payload(payload.into())
        .message_id(event.message_id());
    if let Some(traceparent) = &event.traceparent {
        message = message.header(TRACEPARENT_HEADER, traceparent.as_str());
    }
    let ack = jetstream
        .send_publish(event.subject(), message)
        .await
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| e.to_string())?;
    Ok(if ack.duplicate {
        Published::Duplicate
    } else {
        Published::Stored
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_proto::rollout_events::EVENT_VERSION;

    fn event(namespace: &str) -> RolloutEvent {
        RolloutEvent {
            version: EVENT_VERSION,
            kind: RolloutEventKind::PackageUpdated,
            hosted_cluster_package: "addon".into(),
            uid: "u".into(),
            generation: 1,
            group: None,
            namespace: Some(namespace.into()),
            message: String::new(),
            source: "mc".into(),
            trace_id: None,
            traceparent: None,
        }
    }

    #[test]
    fn the_outbox_keeps_order_and_drops_the_newest_when_full() {
        let mut outbox = EventOutbox::new(3);
        assert_eq!(outbox.push(vec![event("a"), event("b")], None), 0);
        assert_eq!(
            outbox.push(vec![event("c"), event("d"), event("e")], None),
            2
        );
        assert_eq!(outbox.len(), 3);
        let mut published = Vec::new();
        while let Some(next) = outbox.next() {
            published.push(next.event.namespace.clone().unwrap());
            outbox.acknowledged();
        }
        assert_eq!(published, ["a", "b", "c"]);
        assert!(outbox.is_empty());
        assert_eq!(outbox.push(vec![event("f")], None), 0);
    }
}

//! Kubernetes Events leave the manager through one task: actors hand an Event over and go on; the task
//! publishes them in order with the one `kube` Recorder (which folds repeats into a series). No actor
//! awaits an Event, so a slow apiserver or a suspended actor can never hold up another actor's Events
//! or its reconciles. Events are best effort: a full queue drops rather than blocks, and counts what it
//! dropped (`pko_events_dropped_total`); the log says so at the first drop and at every doubling, not
//! once per Event (a fleet-wide burst would otherwise flood it).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use tracing::warn;

use crate::engine::transition_events::TransitionEvent;

/// Events waiting to be published; beyond it new ones are dropped.
const QUEUE: usize = 4096;

/// Where actors raise Events; cheap to clone.
#[derive(Clone)]
pub struct EventSink {
    queue: mpsc::Sender<(Event, ObjectReference)>,
    dropped: Counter,
}

type Queued = mpsc::Receiver<(Event, ObjectReference)>;

impl EventSink {
    /// Starts the publishing task (on the current tokio runtime) for Events as `pko-manager`.
    pub fn start(client: Client) -> Self {
        let (sink, mut events) = Self::queued(QUEUE);
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: "pko-manager".into(),
                instance: None,
            },
        );
        tokio::spawn(async move {
            while let Some((event, regarding)) = events.recv().await {
                if let Err(error) = recorder.publish(&event, &regarding).await {
                    warn!(%error, reason = %event.reason, object = ?regarding.name, "cannot record an event");
                }
            }
        });
        sink
    }

    /// A sink whose Events wait in a queue of `capacity`, and that queue's receiving end.
    fn queued(capacity: usize) -> (Self, Queued) {
        let (queue, events) = mpsc::channel(capacity);
        let sink = Self {
            queue,
            dropped: Counter::default(),
        };
        (sink, events)
    }

    /// The count of Events dropped so far (the manager serves it as `pko_events_dropped_total`).
    pub fn dropped(&self) -> Counter {
        self.dropped.clone()
    }

    /// Raises `event` about `regarding`.
    pub fn raise(&self, event: Event, regarding: ObjectReference) {
        if let Err(error) = self.queue.try_send((event, regarding)) {
            let dropped = self.dropped.inc() + 1;
            if dropped.is_power_of_two() {
                warn!(%error, dropped, "event queue full or closed; dropping Events");
            }
        }
    }

    /// Raises each of `transitions` about `regarding`.
    pub fn raise_transitions(
        &self,
        regarding: &ObjectReference,
        transitions: Vec<TransitionEvent>,
    ) {
        for transition in transitions {
            let event = Event {
                type_: if transition.warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: transition.reason.into(),
                note: Some(transition.note),
                action: transition.action.into(),
                secondary: None,
            };
            self.raise(event, regarding.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(reason: &str) -> (Event, ObjectReference) {
        let event = Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: None,
            action: "Test".into(),
            secondary: None,
        };
        (event, ObjectReference::default())
    }

    /// What does not fit the queue is counted, and so is what is raised once the publisher is gone; what
    /// fits is kept, in order.
    #[tokio::test]
    async fn events_beyond_the_queue_are_counted_not_kept() {
        let (sink, mut queued) = EventSink::queued(2);
        for reason in ["A", "B", "C", "D", "E"] {
            let (event, regarding) = event(reason);
            sink.raise(event, regarding);
        }
        assert_eq!(sink.dropped().get(), 3);
        let kept: Vec<String> = [queued.recv().await, queued.recv().await]
            .into_iter()
            .flatten()
            .map(|(event, _)| event.reason)
            .collect();
        assert_eq!(kept, ["A", "B"]);
        drop(queued);
        let (event, regarding) = event("F");
        sink.raise(event, regarding);
        assert_eq!(sink.dropped().get(), 4);
    }
}

//! Kubernetes Events leave the manager through one task: actors hand an Event over and go on; the task
//! publishes them in order with the one `kube` Recorder (which folds repeats into a series). No actor
//! awaits an Event, so a slow apiserver or a suspended actor can never hold up another actor's Events
//! or its reconciles. Events are best effort: a full queue drops (and logs) rather than blocks.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use tokio::sync::mpsc;
use tracing::warn;

use crate::engine::transition_events::TransitionEvent;

/// Events waiting to be published; beyond it new ones are dropped.
const QUEUE: usize = 4096;

/// Where actors raise Events; cheap to clone.
#[derive(Clone)]
pub struct EventSink {
    queue: mpsc::Sender<(Event, ObjectReference)>,
}

impl EventSink {
    /// Starts the publishing task (on the current tokio runtime) for Events as `pko-manager`.
    pub fn start(client: Client) -> Self {
        let (queue, mut events) = mpsc::channel::<(Event, ObjectReference)>(QUEUE);
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
        Self { queue }
    }

    /// Raises `event` about `regarding`.
    pub fn raise(&self, event: Event, regarding: ObjectReference) {
        if let Err(error) = self.queue.try_send((event, regarding)) {
            warn!(%error, "event queue full or closed; dropping an event");
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

//! Publishes HostedClusterPackage rollout events to the JetStream stream `PKO_ROLLOUTS` (created on first
//! use). A failed publish is logged and dropped: the events describe the rollout, they do not drive it.

use async_nats::jetstream::{self, stream};
use pko_proto::rollout_events::{RolloutEvent, STREAM, SUBJECT_PREFIX};
use tokio::sync::OnceCell;
use tracing::{instrument, warn};

/// Shared by every HostedClusterPackage actor.
pub struct RolloutPublisher {
    jetstream: jetstream::Context,
    stream: OnceCell<()>,
}

impl RolloutPublisher {
    pub fn new(nats: async_nats::Client) -> Self {
        Self {
            jetstream: jetstream::new(nats),
            stream: OnceCell::new(),
        }
    }

    async fn ensure_stream(&self) -> Result<(), String> {
        self.stream
            .get_or_try_init(|| async {
                self.jetstream
                    .get_or_create_stream(stream::Config {
                        name: STREAM.to_owned(),
                        subjects: vec![format!("{SUBJECT_PREFIX}.>")],
                        ..Default::default()
                    })
                    .await
                    .map(|_| ())
                    .map_err(|e| format!("creating stream {STREAM}: {e}"))
            })
            .await
            .map(|_| ())
    }

    /// Publishes `events` in order, each acknowledged by the stream before the next.
    #[instrument(skip_all, fields(events = events.len()))]
    pub async fn publish(&self, events: &[RolloutEvent]) {
        if events.is_empty() {
            return;
        }
        if let Err(error) = self.ensure_stream().await {
            warn!(%error, "rollout events not published");
            return;
        }
        for event in events {
            let payload = match serde_json::to_vec(event) {
                Ok(p) => p,
                Err(error) => {
                    warn!(%error, "cannot encode a rollout event");
                    continue;
                }
            };
            let acked = match self
                .jetstream
                .publish(event.subject(), payload.into())
                .await
            {
                Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(error) = acked {
                warn!(subject = %event.subject(), %error, "rollout event not published");
            }
        }
    }
}

//! The CloudEvents notification sinks: deliveries by result and the events each sink still has to get.
//! Labels: the sink's name (`manager`, or `<hostedclusterpackage>/<index>`) and a fixed result; never
//! a URL (it may carry a tenant's path) or an event.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    sink: String,
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SinkLabels {
    sink: String,
}

/// What one delivery attempt, or one event, came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryResult {
    /// The sink took the event (2xx).
    Delivered,
    /// An attempt failed and is tried again after a backoff.
    Retried,
    /// The sink refused the event itself; the next one goes.
    Refused,
    /// Not sent: a kind the sink does not want, another object's event of the same name, or an id it
    /// already got.
    Skipped,
    /// The stream held something that is not a rollout event; acknowledged and dropped.
    Malformed,
}

impl DeliveryResult {
    const ALL: [DeliveryResult; 5] = [
        Self::Delivered,
        Self::Retried,
        Self::Refused,
        Self::Skipped,
        Self::Malformed,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Retried => "retried",
            Self::Refused => "refused",
            Self::Skipped => "skipped",
            Self::Malformed => "malformed",
        }
    }
}

/// Cheap to clone.
#[derive(Clone, Default)]
pub struct NotificationMetrics {
    deliveries: Family<ResultLabels, Counter>,
    pending: Family<SinkLabels, Gauge>,
    address_refusals: Family<SinkLabels, Counter>,
}

impl NotificationMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "pko_cloudevents_deliveries",
            "Rollout events sent to CloudEvents sinks, by result: delivered (2xx), retried (an \
             attempt failed; tried again after a backoff), refused (the sink refused the event \
             itself), skipped (a kind the sink does not want, or an id it already got), malformed.",
            self.deliveries.clone(),
        );
        registry.register(
            "pko_cloudevents_address_refusals",
            "Delivery attempts not made because the sink's host is, or resolved to, an address the \
             manager may not reach (loopback, link-local, private, …; --notification-sink-allowed-cidrs).",
            self.address_refusals.clone(),
        );
        registry.register(
            "pko_cloudevents_pending",
            "Rollout events a CloudEvents sink has not taken yet, the one being delivered included.",
            self.pending.clone(),
        );
    }

    pub fn delivery(&self, sink: &str, result: DeliveryResult) {
        self.deliveries
            .get_or_create(&ResultLabels {
                sink: sink.to_owned(),
                result: result.label(),
            })
            .inc();
    }

    /// An attempt was not made: the sink's address is refused.
    pub fn address_refused(&self, sink: &str) {
        self.address_refusals
            .get_or_create(&SinkLabels {
                sink: sink.to_owned(),
            })
            .inc();
    }

    pub fn pending(&self, sink: &str, events: u64) {
        self.pending
            .get_or_create(&SinkLabels {
                sink: sink.to_owned(),
            })
            .set(i64::try_from(events).unwrap_or(i64::MAX));
    }

    /// The sink is gone.
    pub fn forget(&self, sink: &str) {
        for result in DeliveryResult::ALL {
            self.deliveries.remove(&ResultLabels {
                sink: sink.to_owned(),
                result: result.label(),
            });
        }
        self.pending.remove(&SinkLabels {
            sink: sink.to_owned(),
        });
        self.address_refusals.remove(&SinkLabels {
            sink: sink.to_owned(),
        });
    }
}

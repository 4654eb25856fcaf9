//! The manager's HTTP listener (`/healthz`, `/readyz`, `/metrics`): connections open, and those it
//! closed at once or cut because a bound was reached. Anything in the pod network may reach the port,
//! so these say when someone holds it.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Why the listener refused or cut a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ListenerRefusal {
    /// The peer address held its share of the slots.
    Peer,
    /// Told to go, to make room for a newcomer, after waiting longest for a request head.
    Displaced,
    /// The connection reached its lifetime.
    Lifetime,
    /// `/metrics` could not be rendered in time (every render slot busy).
    MetricsBusy,
}

impl ListenerRefusal {
    fn label(self) -> &'static str {
        match self {
            Self::Peer => "peer",
            Self::Displaced => "displaced",
            Self::Lifetime => "lifetime",
            Self::MetricsBusy => "metrics_busy",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Cheap to clone.
#[derive(Clone, Default)]
pub struct ListenerMetrics {
    open: Gauge,
    refused: Family<ReasonLabels, Counter>,
}

impl ListenerMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "pko_http_connections_open",
            "Connections open on the health and metrics listener.",
            self.open.clone(),
        );
        registry.register(
            "pko_http_connections_refused",
            "Connections the health and metrics listener closed or cut because a bound was reached, by \
             reason: peer, displaced, lifetime, metrics_busy.",
            self.refused.clone(),
        );
    }

    pub fn opened(&self) {
        self.open.inc();
    }

    pub fn closed(&self) {
        self.open.dec();
    }

    pub fn refused(&self, reason: ListenerRefusal) {
        self.refused
            .get_or_create(&ReasonLabels {
                reason: reason.label(),
            })
            .inc();
    }
}

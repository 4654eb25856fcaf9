//! The manager's side of the hosted-cluster connectors: whether each HCP namespace's connector answered
//! the last request, how long requests take, and the reports and hellos connectors push. The connected
//! gauge is the only pko metric labelled by HCP namespace (one series per hosted cluster, removed with
//! it); the others carry fixed labels only.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct NamespaceLabels {
    namespace: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    operation: &'static str,
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~32 s: the request timeout is far below the top bucket.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// What became of a request to a connector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestResult {
    /// The connector answered (accepted or refused the phase).
    Answered,
    /// No connector listens on the namespace's subjects.
    NoConnector,
    TimedOut,
    /// NATS or the message failed (too large, undecodable).
    Failed,
}

impl RequestResult {
    fn label(self) -> &'static str {
        match self {
            RequestResult::Answered => "answered",
            RequestResult::NoConnector => "no_connector",
            RequestResult::TimedOut => "timed_out",
            RequestResult::Failed => "failed",
        }
    }
}

/// What the hub did with a pushed report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportResult {
    /// Handed to the phase it is about.
    Accepted,
    /// Not a report.
    Malformed,
    /// About another namespace than the subject it came on.
    Foreign,
    /// About a phase this manager does not know.
    UnknownPhase,
    /// On subjects bound to another HostedCluster than the namespace's current one.
    StaleCluster,
}

/// What the hub did with a hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloResult {
    /// The namespace's phases are re-sent.
    Accepted,
    /// Not a hello.
    Malformed,
    /// On subjects bound to another HostedCluster than the namespace's current one.
    StaleCluster,
}

impl HelloResult {
    fn label(self) -> &'static str {
        match self {
            HelloResult::Accepted => "accepted",
            HelloResult::Malformed => "malformed",
            HelloResult::StaleCluster => "stale_cluster",
        }
    }
}

impl ReportResult {
    fn label(self) -> &'static str {
        match self {
            ReportResult::Accepted => "accepted",
            ReportResult::Malformed => "malformed",
            ReportResult::Foreign => "foreign",
            ReportResult::UnknownPhase => "unknown_phase",
            ReportResult::StaleCluster => "stale_cluster",
        }
    }
}

/// The connector metrics; cheap to clone.
#[derive(Clone)]
pub struct ConnectorMetrics {
    connected: Family<NamespaceLabels, Gauge>,
    requests: Family<RequestLabels, Histogram, fn() -> Histogram>,
    reports: Family<ResultLabels, Counter>,
    hellos: Family<ResultLabels, Counter>,
    wakes_folded: Counter,
    wakes_pending: Gauge,
    user_mints: Counter,
    user_expiry: Gauge,
}

impl Default for ConnectorMetrics {
    fn default() -> Self {
        Self {
            connected: Family::default(),
            requests: Family::new_with_constructor(latency_histogram),
            reports: Family::default(),
            hellos: Family::default(),
            wakes_folded: Counter::default(),
            wakes_pending: Gauge::default(),
            user_mints: Counter::default(),
            user_expiry: Gauge::default(),
        }
    }
}

impl ConnectorMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "pko_connector_connected",
            "1 when the HCP namespace's connector answered the last request or said hello, 0 when \
             the last request found no connector or timed out.",
            self.connected.clone(),
        );
        registry.register(
            "pko_connector_request_duration_seconds",
            "Time from a request to a connector (apply, teardown) to its answer or failure, by result.",
            self.requests.clone(),
        );
        registry.register(
            "pko_connector_reports",
            "Phase reports pushed by connectors, by what the manager did with them.",
            self.reports.clone(),
        );
        registry.register(
            "pko_connector_hellos",
            "Hellos of (re)started connectors, by what the manager did with them.",
            self.hellos.clone(),
        );
        registry.register(
            "pko_connector_wakes_folded",
            "Hellos and reports that came while a connector's next wake was already due, and went with \
             it (at most one wake a second per connector).",
            self.wakes_folded.clone(),
        );
        registry.register(
            "pko_connector_wakes_pending",
            "HCP namespaces whose connector's next wake is scheduled (hellos or reports wait for it).",
            self.wakes_pending.clone(),
        );
        registry.register(
            "pko_nats_user_mints",
            "Users the manager minted for itself to (re)connect to NATS (one per connection).",
            self.user_mints.clone(),
        );
        registry.register(
            "pko_nats_user_expiry_timestamp_seconds",
            "Unix time the manager's current NATS user expires; nats-server then closes the connection \
             and the manager reconnects as a fresh user.",
            self.user_expiry.clone(),
        );
    }

    /// The manager minted a NATS user for itself, valid until `expires_at` (Unix seconds).
    pub fn user_minted(&self, expires_at: u64) {
        self.user_mints.inc();
        self.user_expiry
            .set(i64::try_from(expires_at).unwrap_or(i64::MAX));
    }

    /// A request to the connector of `namespace` ended.
    pub fn request(
        &self,
        namespace: &str,
        operation: &'static str,
        result: RequestResult,
        seconds: f64,
    ) {
        self.requests
            .get_or_create(&RequestLabels {
                operation,
                result: result.label(),
            })
            .observe(seconds);
        let connected = match result {
            RequestResult::Answered => 1,
            RequestResult::NoConnector | RequestResult::TimedOut => 0,
            // Says nothing about the connector.
            RequestResult::Failed => return,
        };
        self.connected
            .get_or_create(&NamespaceLabels {
                namespace: namespace.to_owned(),
            })
            .set(connected);
    }

    /// A connector pushed a report.
    pub fn report(&self, result: ReportResult) {
        self.reports
            .get_or_create(&ResultLabels {
                result: result.label(),
            })
            .inc();
    }

    /// The connector of `namespace` said hello (`result`: what became of it).
    pub fn hello(&self, namespace: &str, result: HelloResult) {
        self.hellos
            .get_or_create(&ResultLabels {
                result: result.label(),
            })
            .inc();
        if result == HelloResult::Accepted {
            self.connected
                .get_or_create(&NamespaceLabels {
                    namespace: namespace.to_owned(),
                })
                .set(1);
        }
    }

    /// A hello or report went with a wake already due.
    pub fn wake_folded(&self) {
        self.wakes_folded.inc();
    }

    /// How many namespaces have a wake scheduled.
    pub fn wakes_pending(&self, namespaces: usize) {
        self.wakes_pending
            .set(i64::try_from(namespaces).unwrap_or(i64::MAX));
    }

    /// The connector of `namespace` was removed (its HostedCluster went).
    pub fn forget(&self, namespace: &str) {
        self.connected.remove(&NamespaceLabels {
            namespace: namespace.to_owned(),
        });
    }
}

//! The manager's side of the hosted-cluster connectors: its NATS connection (as an account user it mints
//! for itself), the account key that mints each connector's restricted credentials, and request/reply
//! with W3C trace context in the headers.
//!
//! It must not interpret reports; the remote phase actors do.

use std::sync::Arc;
use std::time::Duration;

use async_nats::client::RequestErrorKind;
use async_nats::{ConnectOptions, HeaderMap, Request};
use pko_proto::connector_wire::{decode, encode, HostedClusterSubjects, Reply, WireError};
use pko_proto::nats_credentials::{
    expiry_after, AccountSigner, CredentialsError, NatsPermissions, UserLimits,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::{info, instrument, warn};

use crate::engine::hypershift::connector_deployment::ConnectorResources;
use crate::metrics::connector_metrics::{ConnectorMetrics, RequestResult};
use crate::runtime::telemetry::inject_current;

/// How long a request waits for a connector's reply.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("no connector is serving {subject} (no responders)")]
    NoConnector { subject: String },
    #[error("the connector did not answer on {subject} within {REQUEST_TIMEOUT:?}")]
    TimedOut { subject: String },
    #[error("NATS request on {subject}: {message}")]
    Nats { subject: String, message: String },
    #[error("message on {subject}: {source}")]
    Wire { subject: String, source: WireError },
    #[error("the message on {subject} is {bytes} bytes, over the NATS server's max_payload of {limit} bytes")]
    TooLarge {
        subject: String,
        bytes: usize,
        limit: usize,
    },
}

impl LinkError {
    /// How a request went, for `pko_connector_requests_total`.
    pub fn result_of<T>(reply: &Result<T, LinkError>) -> RequestResult {
        match reply {
            Ok(_) => RequestResult::Answered,
            Err(LinkError::NoConnector { .. }) => RequestResult::NoConnector,
            Err(LinkError::TimedOut { .. }) => RequestResult::TimedOut,
            Err(_) => RequestResult::Failed,
        }
    }
}

/// Why the link could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LinkSetupError {
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    #[error("connecting to NATS at {url}: {message}")]
    Connect { url: String, message: String },
}

/// Shared by every actor that talks to connectors; cheap to clone.
#[derive(Clone)]
pub struct ConnectorLink {
    pub nats: async_nats::Client,
    pub signer: Arc<AccountSigner>,
    /// The NATS URL connectors are given (the in-cluster address may differ from the manager's).
    pub connector_nats_url: String,
    /// Image of the connector Deployments (the manager's own image, which holds both binaries).
    pub connector_image: String,
    /// How many times the client has connected; it moves on every reconnect. A connector's hello sent
    /// while the manager was disconnected is lost, so a reconnect re-sends every phase.
    pub connections: tokio::sync::watch::Receiver<u64>,
    /// How long a deleted hosted-cluster phase waits for an unreachable connector before its teardown is
    /// given up and its finalizer released.
    pub teardown_timeout: Duration,
    /// How long connector credentials are valid; they are minted again once a third of that is left.
    pub credentials_validity: Duration,
    /// Requests and limits of each connector container.
    pub connector_resources: ConnectorResources,
}

/// Who the manager is on its NATS: a user it mints for itself at every connect, held to the subjects it
/// needs and expiring (nats-server closes the connection then; the reconnect mints a fresh user).
#[derive(Debug, Clone)]
pub struct ManagerNatsUser {
    pub permissions: NatsPermissions,
    /// The inbox prefix replies come back under (`None`: the client's default, `_INBOX`).
    pub inbox_prefix: Option<String>,
    pub validity: Duration,
}

/// [`ManagerNatsUser::validity`] unless the manager says otherwise.
pub const DEFAULT_MANAGER_USER_VALIDITY: Duration = Duration::from_secs(24 * 60 * 60);
/// Subscriptions the manager's own user may hold: one per hosted cluster's reports and hellos, its
/// inboxes and consumers, with room for thousands of hosted clusters.
const MANAGER_SUBSCRIPTIONS: i64 = 50_000;

impl ManagerNatsUser {
    /// Mints the user for one connection; its seed never leaves this process.
    fn mint(
        &self,
        signer: &AccountSigner,
        metrics: &ConnectorMetrics,
    ) -> Result<pko_proto::nats_credentials::UserCredentials, CredentialsError> {
        let expires_at = expiry_after(self.validity);
        let user = signer.issue_limited_user(
            "pko-manager",
            &self.permissions,
            &UserLimits {
                expires_at,
                subscriptions: MANAGER_SUBSCRIPTIONS,
                payload_bytes: -1,
                leaf_node_only: false,
            },
        )?;
        metrics.user_minted(expires_at);
        info!(expires_at, "minted the manager's NATS user");
        Ok(user)
    }
}

/// [`ConnectorLink::credentials_validity`] unless the manager says otherwise.
pub const DEFAULT_CREDENTIALS_VALIDITY: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// [`ConnectorLink::teardown_timeout`] unless the manager says otherwise.
pub const DEFAULT_TEARDOWN_TIMEOUT: Duration = Duration::from_secs(600);

impl ConnectorLink {
    /// This link, giving up the teardown of hosted phases after `timeout` without a connector.
    pub fn with_teardown_timeout(self, timeout: Duration) -> Self {
        Self {
            teardown_timeout: timeout,
            ..self
        }
    }

    /// This link, minting connector credentials valid for `validity`.
    pub fn with_credentials_validity(self, validity: Duration) -> Self {
        Self {
            credentials_validity: validity,
            ..self
        }
    }

    /// Connector Deployments ask for and are held to `resources`.
    pub fn with_connector_resources(self, resources: ConnectorResources) -> Self {
        Self {
            connector_resources: resources,
            ..self
        }
    }

    /// Connects to `url` as `user`, minted by `signer`'s account. NATS may be down at start: the client
    /// keeps retrying in the background, and requests fail (and are retried by their callers) until it
    /// is up.
    pub async fn connect(
        url: &str,
        signer: AccountSigner,
        user: ManagerNatsUser,
        metrics: ConnectorMetrics,
        connector_nats_url: Option<String>,
        connector_image: String,
    ) -> Result<Self, LinkSetupError> {
        let signer = Arc::new(signer);
        // A user that cannot be minted is a configuration error: say so now, not at every reconnect.
        user.mint(&signer, &ConnectorMetrics::default())?;
        let connect_error = |message: String| LinkSetupError::Connect {
            url: url.to_owned(),
            message,
        };
        let (connected, connections) = tokio::sync::watch::channel(0u64);
        let minting = (signer.clone(), user.clone(), metrics);
        let mut options = ConnectOptions::with_auth_callback(move |nonce| {
            let (signer, user, metrics) = minting.clone();
            async move {
                let fail = |e: CredentialsError| async_nats::AuthError::new(e.to_string());
                let credentials = user.mint(&signer, &metrics).map_err(fail)?;
                let mut auth = async_nats::Auth::new();
                auth.signature = Some(credentials.sign_nonce(&nonce).map_err(fail)?);
                auth.jwt = Some(credentials.jwt);
                Ok(auth)
            }
        });
        if let Some(prefix) = &user.inbox_prefix {
            options = options.custom_inbox_prefix(prefix);
        }
        let nats = options
            .name("pko-manager")
            .retry_on_initial_connect()
            .max_reconnects(None)
            .event_callback(move |event| {
                if matches!(event, async_nats::Event::Connected) {
                    connected.send_modify(|n| *n += 1);
                }
                async move { info!(%event, "NATS") }
            })
            .connect(url)
            .await
            .map_err(|e| connect_error(e.to_string()))?;
        Ok(Self {
            nats,
            signer,
            connector_nats_url: connector_nats_url.unwrap_or_else(|| url.to_owned()),
            connector_image,
            connections,
            teardown_timeout: DEFAULT_TEARDOWN_TIMEOUT,
            credentials_validity: DEFAULT_CREDENTIALS_VALIDITY,
            connector_resources: ConnectorResources::default(),
        })
    }

    /// Sends `message` on `subject` and decodes the answer; the connector's refusal is `Ok(Refused)`.
    #[instrument(
        name = "nats request",
        skip(self, message),
        fields(
            otel.kind = "producer",
            otel.name = %format_args!("send {}", HostedClusterSubjects::operation_of(&subject)),
            messaging.system = "nats",
            messaging.operation = "send",
            messaging.destination.name = %subject,
        )
    )]
    pub async fn request<T: Serialize, R: DeserializeOwned>(
        &self,
        subject: String,
        message: &T,
    ) -> Result<Reply<R>, LinkError> {
        let wire = |source| LinkError::Wire {
            subject: subject.clone(),
            source,
        };
        let payload = encode(message).map_err(wire)?;
        // The server refuses larger messages; saying so beats a request that can never succeed.
        let limit = self.nats.server_info().max_payload;
        if limit > 0 && payload.len() > limit {
            return Err(LinkError::TooLarge {
                subject,
                bytes: payload.len(),
                limit,
            });
        }
        // The connector's span continues this one: W3C traceparent/tracestate of the producer span.
        let mut headers = HeaderMap::new();
        inject_current(|key, value| headers.insert(key, value.as_str()));
        let request = Request::new()
            .payload(payload.into())
            .headers(headers)
            .timeout(Some(REQUEST_TIMEOUT));
        let reply = self
            .nats
            .send_request(subject.clone(), request)
            .await
            .map_err(|error| match error.kind() {
                RequestErrorKind::NoResponders => LinkError::NoConnector {
                    subject: subject.clone(),
                },
                RequestErrorKind::TimedOut => LinkError::TimedOut {
                    subject: subject.clone(),
                },
                _ => LinkError::Nats {
                    subject: subject.clone(),
                    message: error.to_string(),
                },
            })?;
        decode(&reply.payload).map_err(|source| {
            warn!(%subject, %source, "undecodable reply");
            wire(source)
        })
    }
}

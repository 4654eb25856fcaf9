//! nats-server with JetStream in operator (decentralized JWT) mode: one application account whose signing
//! seed the manager gets, so it can mint restricted users for connectors while the server runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::binaries::Binaries;
use crate::error::{io_error, TestEnvError};
use crate::net::free_port;
use crate::process::{start_with_retries, ManagedProcess};
use pko_proto::nats_credentials::{
    AccountLimits, AccountSigner, NatsPermissions, OperatorSetup, UserCredentials,
};

const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a round trip through the server may take (it is a local server).
const ROUND_TRIP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running nats-server with JetStream enabled.
#[derive(Debug)]
pub struct Nats {
    pub(crate) process: ManagedProcess,
    port: u16,
    config: PathBuf,
    /// The command line after the binary (restarts reuse it).
    args: Vec<String>,
    /// The environment its configuration reads (restarts reuse it).
    env: Vec<(String, String)>,
    signing: Signing,
    account_seed_file: PathBuf,
    binary: PathBuf,
}

/// The key users are signed with, and the account they belong to when it is a signing key.
#[derive(Clone)]
pub(crate) struct Signing {
    pub(crate) seed: String,
    pub(crate) account: Option<String>,
}

impl std::fmt::Debug for Signing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signing")
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

impl Nats {
    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's configuration file.
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// Kills nats-server (SIGKILL): clients see the connection drop.
    pub fn kill(&self) {
        self.process.stop();
    }

    /// Starts nats-server again on the same port with the same configuration and JetStream store, and
    /// waits until it answers.
    pub async fn restart(&self) -> Result<(), TestEnvError> {
        let mut command = Command::new(&self.binary);
        command.args(&self.args).envs(self.env.iter().cloned());
        self.process.respawn(command)?;
        let probe_user = issue(&self.signing, "pko-testenv-ready", None)?;
        let url = self.url();
        self.process
            .wait_ready(READY_TIMEOUT, || {
                let (url, probe_user) = (url.clone(), probe_user.clone());
                async move {
                    connect_as(&url, &probe_user, async_nats::ConnectOptions::new())
                        .await
                        .map(|_| ())
                }
            })
            .await
    }

    /// The seed the manager signs connector users with: the application account's own (the
    /// environment's server), or its signing key (a server started from a bootstrap's configuration).
    pub fn account_seed(&self) -> &str {
        &self.signing.seed
    }

    /// The account users belong to when [`Nats::account_seed`] is one of its signing keys.
    pub fn account(&self) -> Option<&str> {
        self.signing.account.as_deref()
    }

    /// A file holding [`Nats::account_seed`] (the manager's `--nats-account-seed-file`).
    pub fn account_seed_file(&self) -> &Path {
        &self.account_seed_file
    }

    /// Credentials of a new user of the application account; `None` allows everything.
    pub fn credentials(
        &self,
        name: &str,
        permissions: Option<&NatsPermissions>,
    ) -> Result<UserCredentials, TestEnvError> {
        issue(&self.signing, name, permissions)
    }

    /// Credentials as the manager mints them for the connector of HCP namespace `namespace`: only that
    /// namespace's subjects.
    pub fn connector_credentials(&self, namespace: &str) -> Result<UserCredentials, TestEnvError> {
        let subjects = pko_proto::connector_wire::HostedClusterSubjects::new(namespace)?;
        self.credentials(
            &format!("pko-connector-{namespace}"),
            Some(&subjects.connector_permissions()),
        )
    }

    /// A new client connection with every permission.
    pub async fn client(&self) -> Result<async_nats::Client, TestEnvError> {
        let credentials = self.credentials("pko-testenv", None)?;
        self.connect(&credentials, async_nats::ConnectOptions::new())
            .await
    }

    /// Returns once the server has processed everything `client` sent before: the client's own message,
    /// published to a fresh inbox after them, has come back. `flush` only empties the client's buffer, so
    /// after it a new subscription may still be unknown to the server when another connection publishes;
    /// a test that subscribes and then makes someone else publish waits here. The client must be allowed
    /// to use `_INBOX.>`.
    pub async fn round_trip(&self, client: &async_nats::Client) -> Result<(), TestEnvError> {
        use futures::StreamExt as _;
        let failed = |error: String| TestEnvError::NotReady {
            what: "nats round trip".to_owned(),
            after: ROUND_TRIP_TIMEOUT,
            last_error: error,
            log_tail: Some(self.process.log_tail()),
        };
        let inbox = client.new_inbox();
        let mut echo = client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| failed(e.to_string()))?;
        client
            .publish(inbox, "".into())
            .await
            .map_err(|e| failed(e.to_string()))?;
        match tokio::time::timeout(ROUND_TRIP_TIMEOUT, echo.next()).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(failed("subscription closed".to_owned())),
            Err(_) => Err(failed("no echo".to_owned())),
        }
    }

    /// A new client connection as the user `credentials` names, with `options` (event callbacks, ...).
    pub async fn connect(
        &self,
        credentials: &UserCredentials,
        options: async_nats::ConnectOptions,
    ) -> Result<async_nats::Client, TestEnvError> {
        let not_ready = |error: String| TestEnvError::NotReady {
            what: "nats connection".to_owned(),
            after: Duration::ZERO,
            last_error: error,
            log_tail: Some(self.process.log_tail()),
        };
        connect_as(&self.url(), credentials, options)
            .await
            .map_err(not_ready)
    }
}

fn issue(
    signing: &Signing,
    name: &str,
    permissions: Option<&NatsPermissions>,
) -> Result<UserCredentials, TestEnvError> {
    Ok(
        AccountSigner::from_seed(&signing.seed, signing.account.as_deref())?
            .issue_user(name, permissions)?,
    )
}

async fn connect_as(
    url: &str,
    credentials: &UserCredentials,
    options: async_nats::ConnectOptions,
) -> Result<async_nats::Client, String> {
    options
        .credentials(&credentials.creds_file())
        .map_err(|error| error.to_string())?
        .connect(url)
        .await
        .map_err(|error| error.to_string())
}

/// The environment's server: a fresh operator, its configuration written to `dir`.
pub(crate) async fn start(binaries: &Binaries, dir: &Path) -> Result<Nats, TestEnvError> {
    start_with_retries(|attempt| async move {
        let port = free_port().map_err(io_error("allocate port", dir))?;
        let store = dir.join(format!("jetstream-{attempt}"));
        let config = dir.join("nats.conf");
        let operator = OperatorSetup::generate("PKO", &AccountLimits::MANAGEMENT_CLUSTER)?;
        let operator_jwt = dir.join("operator.jwt");
        std::fs::write(&operator_jwt, &operator.operator_jwt).map_err(io_error("write", &operator_jwt))?;
        let text = format!(
            "listen: 127.0.0.1:{port}\nmax_payload: 8MB\njetstream {{\n  store_dir: \"{}\"\n  max_memory_store: 256MB\n  max_file_store: 2GB\n}}\n{}",
            store.display(),
            operator.server_config(&operator_jwt.display().to_string()),
        );
        std::fs::write(&config, text).map_err(io_error("write", &config))?;
        let signing = Signing {
            seed: operator.account_seed().to_owned(),
            account: None,
        };
        launch(binaries, dir, "nats-server", port, config, Vec::new(), Vec::new(), signing).await
    })
    .await
}

/// Runs nats-server with `config`, `extra` arguments and `env`, and waits until JetStream answers a user
/// `signing` issued.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn launch(
    binaries: &Binaries,
    dir: &Path,
    name: &str,
    port: u16,
    config: PathBuf,
    extra: Vec<String>,
    env: Vec<(String, String)>,
    signing: Signing,
) -> Result<Nats, TestEnvError> {
    let account_seed_file = dir.join("account.seed");
    std::fs::write(&account_seed_file, &signing.seed).map_err(io_error("write", &account_seed_file))?;
    let mut args = vec!["-c".to_owned(), config.display().to_string()];
    args.extend(extra);
    let mut command = Command::new(&binaries.nats_server);
    command.args(&args).envs(env.iter().cloned());
    let process = ManagedProcess::spawn(name, command, &dir.join(format!("{name}.log")))?;
    let url = format!("nats://127.0.0.1:{port}");
    let probe_user = issue(&signing, "pko-testenv-ready", None)?;
    process
        .wait_ready(READY_TIMEOUT, || {
            let url = url.clone();
            let probe_user = probe_user.clone();
            async move {
                let client = connect_as(&url, &probe_user, async_nats::ConnectOptions::new()).await?;
                async_nats::jetstream::new(client)
                    .query_account()
                    .await
                    .map(drop)
                    .map_err(|error| format!("JetStream: {error}"))
            }
        })
        .await?;
    Ok(Nats {
        process,
        port,
        config,
        args,
        env,
        signing,
        account_seed_file,
        binary: binaries.nats_server.clone(),
    })
}

/// One message of a rollout event stream, as stored.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    /// Its `Nats-Msg-Id`.
    pub id: String,
    /// Unix nanoseconds the stream stored it at.
    pub time: i128,
    /// The sequence in the stream it was sourced from (`Nats-Stream-Source`; the hub's aggregate).
    pub source_sequence: Option<u64>,
    /// The management cluster the hub took it from, by the subject it filed it under (`None` in a
    /// cluster's own stream): who sent an event, whatever its `source` says.
    pub origin: Option<String>,
    pub event: pko_proto::rollout_events::RolloutEvent,
}

impl Nats {
    /// Every message of rollout event stream `stream` on this server (its own domain), in order; none
    /// when the stream does not exist yet.
    pub async fn stored_events(&self, stream: &str) -> Result<Vec<StoredEvent>, TestEnvError> {
        let failed = |message: String| TestEnvError::Stream {
            stream: stream.to_owned(),
            message,
        };
        let js = async_nats::jetstream::new(self.client().await?);
        let Ok(mut handle) = js.get_stream(stream).await else {
            return Ok(Vec::new());
        };
        let state = handle
            .info()
            .await
            .map_err(|e| failed(e.to_string()))?
            .state
            .clone();
        let mut messages = Vec::new();
        if state.messages == 0 {
            return Ok(messages);
        }
        for sequence in state.first_sequence..=state.last_sequence {
            let message = handle
                .get_raw_message(sequence)
                .await
                .map_err(|e| failed(format!("message {sequence}: {e}")))?;
            let header = |name: &str| message.headers.get(name).map(|v| v.to_string());
            messages.push(StoredEvent {
                id: header("Nats-Msg-Id").unwrap_or_default(),
                time: message.time.unix_timestamp_nanos(),
                source_sequence: header("Nats-Stream-Source")
                    .and_then(|s| s.split_whitespace().nth(1)?.parse().ok()),
                origin: pko_proto::fleet::event_origin(&message.subject).map(str::to_owned),
                event: serde_json::from_slice(&message.payload)
                    .map_err(|e| failed(format!("message {sequence}: {e}")))?,
            });
        }
        Ok(messages)
    }
}

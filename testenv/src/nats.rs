//! nats-server with JetStream in operator (decentralized JWT) mode: one application account whose signing
//! seed the manager gets, so it can mint restricted users for connectors while the server runs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::binaries::Binaries;
use crate::env::TestEnv;
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
struct Signing {
    seed: String,
    account: Option<String>,
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

impl TestEnv {
    /// Starts another nats-server from the configuration file `config` as an SRE would run it (on free
    /// loopback ports and a JetStream store of its own, given on the command line), whose users are
    /// signed with `seed`, a signing key of `account`. Its files and log go to a directory named `name`.
    pub async fn start_nats_from(
        &self,
        name: &str,
        config: &Path,
        seed: &str,
        account: &str,
    ) -> Result<Nats, TestEnvError> {
        let signing = Signing {
            seed: seed.trim().to_owned(),
            account: Some(account.trim().to_owned()),
        };
        self.start_configured_nats(name, config, signing, Vec::new()).await
    }

    /// Starts nats-server from `config` with `env` (what the configuration reads), signing users as
    /// `signing` says.
    async fn start_configured_nats(
        &self,
        name: &str,
        config: &Path,
        signing: Signing,
        env: Vec<(String, String)>,
    ) -> Result<Nats, TestEnvError> {
        let dir = self.root_dir().join(name);
        std::fs::create_dir_all(&dir).map_err(io_error("create", &dir))?;
        let binaries = Binaries::locate()?;
        start_with_retries(|attempt| {
            let (dir, binaries, signing, env) =
                (dir.clone(), binaries.clone(), signing.clone(), env.clone());
            async move {
                let port = free_port().map_err(io_error("allocate port", &dir))?;
                let monitor = free_port().map_err(io_error("allocate port", &dir))?;
                let store = dir.join(format!("jetstream-{attempt}"));
                let args = vec![
                    "-a".to_owned(),
                    "127.0.0.1".to_owned(),
                    "-p".to_owned(),
                    port.to_string(),
                    "-m".to_owned(),
                    monitor.to_string(),
                    "-sd".to_owned(),
                    store.display().to_string(),
                ];
                launch(&binaries, &dir, "nats-server", port, config.to_owned(), args, env, signing).await
            }
        })
        .await
    }
}

/// Runs nats-server with `config`, `extra` arguments and `env`, and waits until JetStream answers a user
/// `signing` issued.
#[allow(clippy::too_many_arguments)]
async fn launch(
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
                // A raw request: async-nats' typed account info needs fields nats-server 2.9 lacks.
                let reply = client
                    .request("$JS.API.INFO", Vec::new().into())
                    .await
                    .map_err(|error| format!("JetStream: {error}"))?;
                let info: serde_json::Value =
                    serde_json::from_slice(&reply.payload).map_err(|error| format!("JetStream: {error}"))?;
                match info.get("error") {
                    None => Ok(()),
                    Some(error) => Err(format!("JetStream: {error}")),
                }
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

/// A fleet's NATS: the hub and a leaf node per management cluster, each from the configuration
/// `deploy/nats/fleet` ships. As in production, the hub trusts only the fleet's operator (made by
/// `pko-manager nats-bootstrap fleet hub`), each management cluster's NATS its own operator, and each
/// leaf joins the hub with the cluster's own credentials (`… fleet member`).
#[derive(Debug)]
pub struct FleetNats {
    hub: Nats,
    leaves: Vec<(String, Nats)>,
    keys_dir: PathBuf,
    viewer_credentials: PathBuf,
}

impl FleetNats {
    /// The hub; its users are signed by the fleet account (what the fleet's administrators hold).
    pub fn hub(&self) -> &Nats {
        &self.hub
    }

    /// The NATS of management cluster `cluster`; its users are signed by that cluster's own account.
    pub fn leaf(&self, cluster: &str) -> Option<&Nats> {
        self.leaves
            .iter()
            .find(|(name, _)| name == cluster)
            .map(|(_, nats)| nats)
    }

    /// Read-only credentials for the hub (`kubectl package fleet --nats-creds`).
    pub fn credentials_file(&self) -> &Path {
        &self.viewer_credentials
    }

    /// The credentials management cluster `cluster`'s NATS joins the hub with.
    pub fn member_credentials_file(&self, cluster: &str) -> PathBuf {
        self.keys_dir.join("members").join(format!("{cluster}.creds"))
    }
}

/// Runs `pko-manager nats-bootstrap fleet <step>` as the fleet's administrators would.
fn fleet_bootstrap(manager: &Path, keys: &Path, step: &[&str]) -> Result<(), TestEnvError> {
    let output = Command::new(manager)
        .args(["nats-bootstrap", "fleet"])
        .args(step)
        .arg("--dir")
        .arg(keys)
        .output()
        .map_err(io_error("run", manager))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(TestEnvError::Command {
            command: format!("pko-manager nats-bootstrap fleet {}", step.join(" ")),
            detail: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }
}

impl TestEnv {
    /// Starts a hub NATS from `deploy_dir/nats/fleet/hub.conf` and, for each of `clusters`, a NATS from
    /// `leaf.conf` with that cluster's JetStream domain and operator, joined to the hub as a leaf node.
    /// `manager` (a pko-manager build) makes the fleet's trust.
    pub async fn start_fleet_nats(
        &self,
        name: &str,
        deploy_dir: &Path,
        manager: &Path,
        clusters: &[&str],
    ) -> Result<FleetNats, TestEnvError> {
        let dir = self.root_dir().join(name);
        let (hub_dir, keys_dir) = (dir.join("hub"), dir.join("fleet-keys"));
        std::fs::create_dir_all(&hub_dir).map_err(io_error("create", &hub_dir))?;
        fleet_bootstrap(manager, &keys_dir, &["hub"])?;
        fleet_bootstrap(manager, &keys_dir, &["viewer"])?;
        let hub_config = hub_dir.join("hub.conf");
        let from = deploy_dir.join("nats/fleet/hub.conf");
        std::fs::copy(&from, &hub_config).map_err(io_error("copy", &from))?;
        let resolver = keys_dir.join("hub-resolver.conf");
        let to = hub_dir.join("hub-resolver.conf");
        std::fs::copy(&resolver, &to).map_err(io_error("copy", &resolver))?;
        let fleet_keys = keys_dir.join("fleet-operator.json");
        let stored: std::collections::BTreeMap<String, String> = serde_json::from_slice(
            &std::fs::read(&fleet_keys).map_err(io_error("read", &fleet_keys))?,
        )
        .map_err(|e| TestEnvError::Command {
            command: format!("reading {}", fleet_keys.display()),
            detail: e.to_string(),
        })?;
        let fleet = OperatorSetup::from_stored(|part| stored.get(part).cloned())?;
        let leaf_port = free_port().map_err(io_error("allocate port", &dir))?;
        let hub = self
            .start_configured_nats(
                &format!("{name}-hub"),
                &hub_config,
                Signing {
                    seed: fleet.signing_seed().to_owned(),
                    account: Some(fleet.account.clone()),
                },
                vec![("PKO_FLEET_LEAF_PORT".to_owned(), leaf_port.to_string())],
            )
            .await?;
        let mut leaves = Vec::new();
        for cluster in clusters {
            fleet_bootstrap(
                manager,
                &keys_dir,
                &["member", "--cluster", cluster, "--hub-url", &hub.url()],
            )?;
            // The cluster's own trust, as `pko-manager nats-bootstrap` makes it on the cluster.
            let cluster_dir = dir.join(cluster);
            let (config_dir, resolver_dir) = (cluster_dir.join("config"), cluster_dir.join("resolver"));
            for d in [&config_dir, &resolver_dir] {
                std::fs::create_dir_all(d).map_err(io_error("create", d))?;
            }
            let operator = OperatorSetup::generate("PKO", &AccountLimits::MANAGEMENT_CLUSTER)?;
            let resolver = resolver_dir.join("resolver.conf");
            std::fs::write(&resolver, operator.inline_server_config())
                .map_err(io_error("write", &resolver))?;
            let config = config_dir.join("leaf.conf");
            let from = deploy_dir.join("nats/fleet/leaf.conf");
            std::fs::copy(&from, &config).map_err(io_error("copy", &from))?;
            let env = vec![
                ("PKO_CLUSTER_NAME".to_owned(), (*cluster).to_owned()),
                (
                    "PKO_FLEET_HUB_URL".to_owned(),
                    format!("nats-leaf://127.0.0.1:{leaf_port}"),
                ),
                (
                    "PKO_FLEET_LEAF_CREDENTIALS".to_owned(),
                    keys_dir
                        .join("members")
                        .join(format!("{cluster}.creds"))
                        .display()
                        .to_string(),
                ),
                ("PKO_NATS_ACCOUNT".to_owned(), operator.account.clone()),
            ];
            let signing = Signing {
                seed: operator.signing_seed().to_owned(),
                account: Some(operator.account.clone()),
            };
            let leaf = self
                .start_configured_nats(&format!("{name}-{cluster}"), &config, signing, env)
                .await?;
            leaves.push(((*cluster).to_owned(), leaf));
        }
        Ok(FleetNats {
            hub,
            leaves,
            viewer_credentials: keys_dir.join("viewer.creds"),
            keys_dir,
        })
    }
}

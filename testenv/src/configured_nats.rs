//! nats-servers started from the configuration files pko ships (`deploy/nats`), as an SRE would run them:
//! one more server beside the environment's, or a fleet's hub with a leaf node per management cluster.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::binaries::Binaries;
use crate::env::TestEnv;
use crate::error::{io_error, TestEnvError};
use crate::nats::{launch, Nats, Signing};
use crate::net::free_port;
use crate::process::start_with_retries;
use pko_proto::nats_credentials::{AccountLimits, OperatorSetup};

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

/// A fleet's NATS: the hub and a leaf node per management cluster, each from the configuration
/// `deploy/nats/fleet` ships. As in production, the hub trusts only the fleet's operator (made by
/// `pko-manager nats-bootstrap fleet hub`), each management cluster's NATS its own operator, and each
/// leaf joins the hub with the cluster's own credentials (`… fleet member`).
#[derive(Debug)]
pub struct FleetNats {
    hub: Nats,
    leaves: Vec<(String, Nats)>,
    /// Each leaf's link to the hub through a proxy that can cut it, when started with cuttable links.
    links: Vec<(String, crate::stall_proxy::StallLink)>,
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

    /// Cuts (`true`) or restores management cluster `cluster`'s link to the hub: both servers run on,
    /// no byte moves between them. False when the fleet was not started with cuttable links.
    pub fn cut_link(&self, cluster: &str, cut: bool) -> bool {
        let Some((_, link)) = self.links.iter().find(|(name, _)| name == cluster) else {
            return false;
        };
        if cut {
            link.stall();
        } else {
            link.resume();
        }
        true
    }

    /// Read-only credentials for the hub (`kubectl package fleet --nats-creds`).
    pub fn credentials_file(&self) -> &Path {
        &self.viewer_credentials
    }
}

/// Where `pko-manager nats-bootstrap fleet member` puts the credentials cluster `cluster`'s NATS joins
/// the hub with.
fn member_credentials(keys_dir: &Path, cluster: &str) -> PathBuf {
    keys_dir.join("members").join(format!("{cluster}.creds"))
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
        self.start_fleet_nats_with(name, deploy_dir, manager, clusters, false)
            .await
    }

    /// [`TestEnv::start_fleet_nats`], with each leaf's link to the hub through a proxy when
    /// `cuttable_links` ([`FleetNats::cut_link`]); the proxies' tasks run on the calling runtime.
    pub async fn start_fleet_nats_with(
        &self,
        name: &str,
        deploy_dir: &Path,
        manager: &Path,
        clusters: &[&str],
        cuttable_links: bool,
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
        let fleet = OperatorSetup::from_stored_json(
            &std::fs::read_to_string(&fleet_keys).map_err(io_error("read", &fleet_keys))?,
        )?;
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
        let mut links = Vec::new();
        for cluster in clusters {
            let hub_port = if cuttable_links {
                let link = crate::stall_proxy::StallLink::start(
                    format!("127.0.0.1:{leaf_port}"),
                    &format!("{name}-{cluster}-link"),
                )
                .await?;
                let port = link.port();
                links.push(((*cluster).to_owned(), link));
                port
            } else {
                leaf_port
            };
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
                    format!("nats-leaf://127.0.0.1:{hub_port}"),
                ),
                (
                    "PKO_FLEET_LEAF_CREDENTIALS".to_owned(),
                    member_credentials(&keys_dir, cluster)
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
            links,
            viewer_credentials: keys_dir.join("viewer.creds"),
        })
    }
}

//! A pko-manager process against the environment's management apiserver, for tests and benchmarks that
//! exercise the real binary (and can kill it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::apiserver::ApiServer;
use crate::env::TestEnv;
use crate::nats::Nats;
use crate::error::{io_error, TestEnvError};
use crate::net::{free_port, http_get};
use crate::process::{start_with_retries, ManagedProcess};

/// The namespace a manager runs in unless told otherwise (its POD_NAMESPACE default).
pub const MANAGER_NAMESPACE: &str = "package-operator-system";

const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// A running manager; killed when dropped.
#[derive(Debug)]
pub struct ManagerProcess {
    process: ManagedProcess,
    health_port: u16,
}

impl ManagerProcess {
    /// Port of /healthz, /readyz and /metrics.
    pub fn health_port(&self) -> u16 {
        self.health_port
    }

    /// Process id.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    /// Path of its log file.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// GET on the health listener: (status code, body).
    pub async fn get(&self, path: &str) -> Result<(u16, String), String> {
        http_get(self.health_port, path).await
    }

    /// Value of one counter on /metrics.
    pub async fn metric(&self, name: &str) -> Result<u64, String> {
        let (_, body) = self.get("/metrics").await?;
        body.lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
            .ok_or_else(|| format!("metric {name} not found in:\n{body}"))
    }

    /// Waits until /readyz says the manager works with its caches synced: it leads, or it is a shard
    /// member (a standby is ready too, but reconciles nothing).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), TestEnvError> {
        let port = self.health_port;
        self.process
            .wait_ready(timeout, || async move {
                match http_get(port, "/readyz").await? {
                    (200, body) if body.contains("leader") || body.contains("shard member") => {
                        Ok(())
                    }
                    (code, body) => Err(format!("/readyz answered {code}: {body}")),
                }
            })
            .await
    }

    /// Waits until the process exits by itself (it is not killed) and returns how it ended.
    pub async fn wait_exit(
        &self,
        timeout: Duration,
    ) -> Result<std::process::ExitStatus, TestEnvError> {
        self.process.wait_exit(timeout).await
    }

    /// An error (with the exit status and the log's tail) once the process has exited.
    pub fn check_running(&self) -> Result<(), TestEnvError> {
        self.process.check_running()
    }

    /// Freezes the process (SIGSTOP): it holds its connections but neither reads nor writes.
    pub fn pause(&self) -> Result<(), TestEnvError> {
        self.process.signal("-STOP")
    }

    /// Lets a paused process run again (SIGCONT).
    pub fn resume(&self) -> Result<(), TestEnvError> {
        self.process.signal("-CONT")
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&self) {
        self.process.stop();
    }

    /// Stops the process as a kubelet does (SIGTERM, then SIGKILL after `grace`); how it ended.
    pub async fn terminate(
        &self,
        grace: Duration,
    ) -> Result<std::process::ExitStatus, TestEnvError> {
        self.process.terminate(grace).await
    }
}

/// The coordinator Lease of managers started with [`sharded_manager_args`].
pub const SHARD_COORDINATOR_LEASE: &str = "pko-shard-coordinator";

/// The arguments of a `--sharding` replica whose member Leases and coordinator Lease live in
/// `lease_namespace` and last `lease_seconds`.
pub fn sharded_manager_args(lease_namespace: &str, lease_seconds: u64) -> Vec<String> {
    [
        "--sharding",
        "--leader-election-namespace",
        lease_namespace,
        "--lease-name",
        SHARD_COORDINATOR_LEASE,
        "--lease-duration-seconds",
        &lease_seconds.to_string(),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The arguments that put a manager in a fleet of management clusters as `cluster` (its NATS a leaf of
/// the hub with that JetStream domain), announcing `labels` (`key=value,...`).
pub fn fleet_manager_args(cluster: &str, labels: &str) -> Vec<String> {
    [
        "--cluster-name",
        cluster,
        "--fleet-hub-domain",
        "hub",
        "--cluster-labels",
        labels,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// How a manager is started when not as the environment's admin with its NATS.
#[derive(Debug, Default, Clone)]
pub struct ManagerLaunch<'a> {
    /// Its kubeconfig (a ServiceAccount's, or a proxy's in front of the apiserver); it then installs no CRDs.
    pub kubeconfig: Option<PathBuf>,
    /// Its namespace (POD_NAMESPACE), where its Lease lives.
    pub namespace: Option<String>,
    /// Another nats-server than the environment's.
    pub nats: Option<&'a Nats>,
    /// More environment variables (`OTEL_*` for trace export).
    pub env: Vec<(String, String)>,
    /// Another apiserver than the management one, as its admin (installing the CRDs): a management
    /// cluster of a fleet.
    pub apiserver: Option<&'a ApiServer>,
    /// Its wall clock shifted by libfaketime (`"+30s"`, `"-30s"`): a replica on a machine whose clock is
    /// off. Only the wall clock moves; the monotonic clock, which times its own deadlines, stays true.
    pub clock_offset: Option<&'a str>,
}

impl TestEnv {
    /// Starts `binary` (a pko-manager build) against the management apiserver and the environment's NATS
    /// with `--install-crds` plus `extra_args`, and waits until it reports ready.
    pub async fn start_manager(
        &self,
        binary: &Path,
        extra_args: &[&str],
    ) -> Result<ManagerProcess, TestEnvError> {
        self.start_manager_with(binary, &ManagerLaunch::default(), extra_args)
            .await
    }

    /// Like [`TestEnv::start_manager`], started as `launch` says.
    pub async fn start_manager_with(
        &self,
        binary: &Path,
        launch: &ManagerLaunch<'_>,
        extra_args: &[&str],
    ) -> Result<ManagerProcess, TestEnvError> {
        // Its namespace exists, as `kubectl apply -k deploy/manager` makes it: what it keeps there (its
        // Lease, release preflight reports) has a place.
        let server = launch.apiserver.unwrap_or(self.management());
        let namespace = launch.namespace.as_deref().unwrap_or(MANAGER_NAMESPACE);
        let client = server.client().await?;
        crate::hypershift::apply_namespace(
            &kube::Api::all(client),
            &kube::api::PatchParams::apply("pko-testenv").force(),
            namespace,
        )
        .await
        .map_err(|error| TestEnvError::Kube {
            server: server.name().to_owned(),
            source: Box::new(error),
        })?;
        // Its health port is picked free, then bound by the manager: another process may take it in
        // between, and the manager exits; it is started again on a new port, as the servers are.
        start_with_retries(|_| async {
            let manager = self.spawn_manager_with(binary, launch, extra_args)?;
            manager.wait_ready(READY_TIMEOUT).await?;
            Ok(manager)
        })
        .await
    }

    /// Like [`TestEnv::start_manager`] without waiting for readiness (a standby replica never leads).
    pub fn spawn_manager(
        &self,
        binary: &Path,
        extra_args: &[&str],
    ) -> Result<ManagerProcess, TestEnvError> {
        self.spawn_manager_with(binary, &ManagerLaunch::default(), extra_args)
    }

    /// Starts a manager as `launch` says (another identity, namespace or NATS), with `extra_args`.
    pub fn spawn_manager_with(
        &self,
        binary: &Path,
        launch: &ManagerLaunch,
        extra_args: &[&str],
    ) -> Result<ManagerProcess, TestEnvError> {
        static MANAGERS: AtomicUsize = AtomicUsize::new(0);
        let n = MANAGERS.fetch_add(1, Ordering::Relaxed);
        let dir = self.root_dir();
        let health_port = free_port().map_err(io_error("allocate port", dir))?;
        let mut command = Command::new(binary);
        match &launch.kubeconfig {
            // Another identity or route (a ServiceAccount's token, a proxy in front of the apiserver)
            // installs nothing: the CRDs are the environment's.
            Some(kubeconfig) => {
                command.arg("--kubeconfig").arg(kubeconfig);
            }
            None => {
                command
                    .arg("--kubeconfig")
                    .arg(launch.apiserver.unwrap_or(self.management()).kubeconfig_path())
                    .arg("--install-crds");
            }
        }
        if let Some(namespace) = &launch.namespace {
            // The leader Lease goes there (POD_NAMESPACE).
            command.env("POD_NAMESPACE", namespace);
        }
        let nats = launch.nats.unwrap_or_else(|| self.nats());
        command
            .arg("--health-addr")
            .arg(format!("127.0.0.1:{health_port}"))
            // The environment's registries speak plain HTTP.
            .arg("--plain-http-registry")
            .arg(format!(
                "{},{}",
                self.registry().host(),
                self.authenticated_registry().host()
            ))
            // Hosted-cluster phases travel over NATS.
            .arg("--nats-url")
            .arg(nats.url())
            .arg("--nats-account-seed-file")
            .arg(nats.account_seed_file())
            .args(extra_args)
            .env(
                "RUST_LOG",
                std::env::var("PKO_MANAGER_LOG").unwrap_or_else(|_| "info".into()),
            );
        if let Some(account) = nats.account() {
            command.arg("--nats-account").arg(account);
        }
        if let Some(offset) = launch.clock_offset {
            command
                .env("LD_PRELOAD", crate::binaries::libfaketime()?)
                .env("FAKETIME", offset)
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        command.envs(launch.env.iter().map(|(k, v)| (k, v)));
        let process = ManagedProcess::spawn(
            "pko-manager",
            command,
            &dir.join(format!("pko-manager-{n}.log")),
        )?;
        Ok(ManagerProcess {
            process,
            health_port,
        })
    }
}

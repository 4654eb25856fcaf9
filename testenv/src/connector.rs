//! pko-connector processes on the host: the environment has no kubelet to run connector Deployments, so
//! tests (and the connector runner) start the real binary with the arguments a Deployment would give it.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use pko_proto::nats_credentials::UserCredentials;

use crate::apiserver::ApiServer;
use crate::env::TestEnv;
use crate::error::{io_error, TestEnvError};
use crate::process::ManagedProcess;

/// What a connector process is started with: the arguments its Deployment's container has (with mounted
/// files at host paths) and the environment the Downward API would give it.
#[derive(Debug, Clone)]
pub struct ConnectorLaunch {
    /// The HCP namespace it serves (`POD_NAMESPACE`).
    pub namespace: String,
    /// `POD_NAME` (the pod name in a cluster).
    pub connector_id: String,
    /// Command-line arguments.
    pub args: Vec<String>,
    /// More environment variables (`KUBECONFIG` standing in for the pod's ServiceAccount credentials).
    pub env: Vec<(String, String)>,
}

/// A running pko-connector; killed when dropped.
#[derive(Debug)]
pub struct ConnectorProcess {
    process: ManagedProcess,
}

impl ConnectorProcess {
    /// Process id.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    /// Whether it still runs; its exit status and log tail when not.
    pub fn check_running(&self) -> Result<(), TestEnvError> {
        self.process.check_running()
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&self) {
        self.process.stop();
    }

    /// Stops the process as a kubelet does (SIGTERM, then SIGKILL after `grace`); how it ended.
    pub async fn terminate(
        &self,
        grace: std::time::Duration,
    ) -> Result<std::process::ExitStatus, TestEnvError> {
        self.process.terminate(grace).await
    }
}

impl TestEnv {
    /// A launch for a connector of `namespace` using `hosted`'s kubeconfig and `credentials` (written to a
    /// file), as the manager's Deployment would configure it.
    pub fn connector_launch(
        &self,
        namespace: &str,
        hosted: &ApiServer,
        credentials: &UserCredentials,
    ) -> Result<ConnectorLaunch, TestEnvError> {
        let creds = self.root_dir().join(format!("{namespace}.creds"));
        std::fs::write(&creds, credentials.creds_file()).map_err(io_error("write", &creds))?;
        Ok(ConnectorLaunch {
            namespace: namespace.to_owned(),
            connector_id: format!("{namespace}-connector"),
            args: vec![
                format!("--nats-url={}", self.nats().url()),
                format!("--nats-creds={}", creds.display()),
                format!("--hosted-kubeconfig={}", hosted.kubeconfig_path().display()),
            ],
            env: Vec::new(),
        })
    }

    /// Starts `binary` (a pko-connector build) as `launch` says.
    pub fn spawn_connector(
        &self,
        binary: &Path,
        launch: &ConnectorLaunch,
    ) -> Result<ConnectorProcess, TestEnvError> {
        spawn_connector_in(self.root_dir(), binary, launch)
    }
}

/// Starts a connector process logging into `dir`.
pub(crate) fn spawn_connector_in(
    dir: &Path,
    binary: &Path,
    launch: &ConnectorLaunch,
) -> Result<ConnectorProcess, TestEnvError> {
    static CONNECTORS: AtomicUsize = AtomicUsize::new(0);
    let n = CONNECTORS.fetch_add(1, Ordering::Relaxed);
    let mut command = Command::new(binary);
    command
        .args(&launch.args)
        .env("POD_NAMESPACE", &launch.namespace)
        .env("POD_NAME", &launch.connector_id)
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .env(
            "RUST_LOG",
            std::env::var("PKO_CONNECTOR_LOG").unwrap_or_else(|_| "info".into()),
        );
    let log = dir.join(format!("pko-connector-{n}-{}.log", launch.namespace));
    let process = ManagedProcess::spawn("pko-connector", command, &log)?;
    Ok(ConnectorProcess { process })
}

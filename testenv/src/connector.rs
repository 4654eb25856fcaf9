//! pko-connector processes on the host: the environment has no kubelet to run connector Deployments, so
//! tests (and the connector runner) start the real binary with the arguments a Deployment would give it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::env::TestEnv;
use crate::error::{io_error, TestEnvError};
use crate::process::ManagedProcess;

/// What a connector process is started with.
#[derive(Debug, Clone)]
pub struct ConnectorLaunch {
    /// The HCP namespace it serves.
    pub namespace: String,
    /// Kubeconfig of its hosted cluster.
    pub hosted_kubeconfig: PathBuf,
    /// Its NATS credentials (`.creds` text).
    pub nats_creds: String,
    /// `--connector-id` (the pod name in a cluster).
    pub connector_id: String,
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
}

impl TestEnv {
    /// Starts `binary` (a pko-connector build) against this environment's NATS.
    pub fn spawn_connector(
        &self,
        binary: &Path,
        launch: &ConnectorLaunch,
    ) -> Result<ConnectorProcess, TestEnvError> {
        static CONNECTORS: AtomicUsize = AtomicUsize::new(0);
        let n = CONNECTORS.fetch_add(1, Ordering::Relaxed);
        let dir = self.root_dir();
        let creds = dir.join(format!("connector-{n}.creds"));
        std::fs::write(&creds, &launch.nats_creds).map_err(io_error("write", &creds))?;
        let mut command = Command::new(binary);
        command
            .arg("--namespace")
            .arg(&launch.namespace)
            .arg("--nats-url")
            .arg(self.nats().url())
            .arg("--nats-creds")
            .arg(&creds)
            .arg("--hosted-kubeconfig")
            .arg(&launch.hosted_kubeconfig)
            .arg("--connector-id")
            .arg(&launch.connector_id)
            .env(
                "RUST_LOG",
                std::env::var("PKO_CONNECTOR_LOG").unwrap_or_else(|_| "info".into()),
            );
        let process = ManagedProcess::spawn(
            "pko-connector",
            command,
            &dir.join(format!("pko-connector-{n}-{}.log", launch.namespace)),
        )?;
        Ok(ConnectorProcess { process })
    }
}

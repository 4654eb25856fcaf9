//! The one etcd every apiserver of an environment stores into (each under its own prefix).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::binaries::Binaries;
use crate::error::TestEnvError;
use crate::net::{free_port, http_get};
use crate::process::{start_with_retries, ManagedProcess};

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A running etcd.
#[derive(Debug)]
pub(crate) struct Etcd {
    pub(crate) process: ManagedProcess,
    pub(crate) client_port: u16,
}

pub(crate) async fn start(binaries: &Binaries, dir: &Path) -> Result<Etcd, TestEnvError> {
    start_with_retries(|attempt| async move {
        let client_port = free_port().map_err(crate::error::io_error("allocate port", dir))?;
        let peer_port = free_port().map_err(crate::error::io_error("allocate port", dir))?;
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut command = Command::new(&binaries.etcd);
        command
            .arg("--name=pko")
            .arg(format!(
                "--data-dir={}",
                dir.join(format!("etcd-data-{attempt}")).display()
            ))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=pko={peer_url}"))
            .arg("--logger=zap")
            .arg("--log-level=warn");
        let process = ManagedProcess::spawn("etcd", command, &dir.join("etcd.log"))?;
        process
            .wait_ready(READY_TIMEOUT, || async move {
                match http_get(client_port, "/health").await? {
                    (200, body) if body.contains("true") => Ok(()),
                    (status, body) => Err(format!("/health answered {status}: {body}")),
                }
            })
            .await?;
        Ok(Etcd {
            process,
            client_port,
        })
    })
    .await
}

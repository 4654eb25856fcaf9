//! An OCI registry (distribution), plain HTTP on loopback.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::binaries::Binaries;
use crate::error::{io_error, TestEnvError};
use crate::net::{free_port, http_get};
use crate::process::{start_with_retries, ManagedProcess};

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A running OCI registry.
#[derive(Debug)]
pub struct Registry {
    pub(crate) process: ManagedProcess,
    port: u16,
}

impl Registry {
    /// `127.0.0.1:<port>`, the registry part of image references (`127.0.0.1:5000/pkg:v1`).
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

pub(crate) async fn start(binaries: &Binaries, dir: &Path) -> Result<Registry, TestEnvError> {
    start_with_retries(|attempt| async move {
        let port = free_port().map_err(io_error("allocate port", dir))?;
        let config = dir.join("registry.yaml");
        let text = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: \"{}\"\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.join(format!("registry-data-{attempt}")).display()
        );
        std::fs::write(&config, text).map_err(io_error("write", &config))?;
        let mut command = Command::new(&binaries.registry);
        command.arg("serve").arg(&config);
        let process = ManagedProcess::spawn("docker-registry", command, &dir.join("registry.log"))?;
        process
            .wait_ready(READY_TIMEOUT, || async move {
                match http_get(port, "/v2/").await? {
                    (200, _) => Ok(()),
                    (status, body) => Err(format!("/v2/ answered {status}: {body}")),
                }
            })
            .await?;
        Ok(Registry { process, port })
    })
    .await
}

//! nats-server with JetStream.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::binaries::Binaries;
use crate::error::{io_error, TestEnvError};
use crate::net::free_port;
use crate::process::{start_with_retries, ManagedProcess};

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A running nats-server with JetStream enabled.
#[derive(Debug)]
pub struct Nats {
    pub(crate) process: ManagedProcess,
    port: u16,
    config: PathBuf,
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

    /// A new client connection.
    pub async fn client(&self) -> Result<async_nats::Client, TestEnvError> {
        async_nats::connect(self.url())
            .await
            .map_err(|error| TestEnvError::NotReady {
                what: "nats connection".to_owned(),
                after: Duration::ZERO,
                last_error: error.to_string(),
                log_tail: Some(self.process.log_tail()),
            })
    }
}

pub(crate) async fn start(binaries: &Binaries, dir: &Path) -> Result<Nats, TestEnvError> {
    start_with_retries(|attempt| async move {
        let port = free_port().map_err(io_error("allocate port", dir))?;
        let store = dir.join(format!("jetstream-{attempt}"));
        let config = dir.join("nats.conf");
        let text = format!(
            "listen: 127.0.0.1:{port}\nmax_payload: 8MB\njetstream {{\n  store_dir: \"{}\"\n  max_memory_store: 256MB\n  max_file_store: 2GB\n}}\n",
            store.display()
        );
        std::fs::write(&config, text).map_err(io_error("write", &config))?;
        let mut command = Command::new(&binaries.nats_server);
        command.arg("-c").arg(&config);
        let process = ManagedProcess::spawn("nats-server", command, &dir.join("nats-server.log"))?;
        let url = format!("nats://127.0.0.1:{port}");
        process
            .wait_ready(READY_TIMEOUT, || {
                let url = url.clone();
                async move {
                    let client = async_nats::connect(&url).await.map_err(|error| error.to_string())?;
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
        Ok(Nats { process, port, config })
    })
    .await
}

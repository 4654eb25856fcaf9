//! OCI registries (distribution), plain HTTP on loopback: an anonymous one, and one behind basic auth
//! (htpasswd) for pull-secret tests.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::binaries::Binaries;
use crate::error::{io_error, TestEnvError};
use crate::net::{free_port, http_get};
use crate::process::{start_with_retries, ManagedProcess};
use crate::workdir::{new_root_dir, start_on_own_runtime};

const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The user of the authenticated registry.
pub const REGISTRY_USER: &str = "pko";
/// Its password.
pub const REGISTRY_PASSWORD: &str = "pko-registry-secret";
/// bcrypt (cost 6) of `REGISTRY_PASSWORD`, precomputed: distribution's htpasswd auth takes bcrypt only.
const REGISTRY_PASSWORD_BCRYPT: &str =
    "$2b$06$FW93WH9qzeu6tYe2dd4UDO30YZBOy2jLFcURfxEXpAhY0uoLCvLsy";

/// A running OCI registry.
#[derive(Debug)]
pub struct Registry {
    /// Held for its drop, which stops the server; the environment also reads its pid.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) process: ManagedProcess,
    port: u16,
    /// Its debug listener, which serves its own Prometheus metrics.
    debug_port: u16,
    authenticated: bool,
    /// The binary and configuration it was started with, to start it again.
    command: (std::path::PathBuf, std::path::PathBuf),
}

impl Registry {
    /// `127.0.0.1:<port>`, the registry part of image references (`127.0.0.1:5000/pkg:v1`).
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the registry (SIGKILL): pulls and pushes fail until [`Registry::restart`].
    pub fn kill(&self) {
        self.process.stop();
    }

    /// Starts the registry again with the same port and storage, and waits until it answers.
    pub async fn restart(&self) -> Result<(), TestEnvError> {
        let (binary, config) = &self.command;
        let mut command = Command::new(binary);
        command.arg("serve").arg(config);
        self.process.respawn(command)?;
        wait_serving(&self.process, self.port, self.authenticated).await
    }

    /// The requests the registry itself counted (`registry_http_requests_total`) of `handler`
    /// (`manifest`, `blob`, …) and HTTP `method` (`get`, `head`, …), of any status: what a client
    /// really asked of it, whatever the client counts.
    pub async fn requests(&self, handler: &str, method: &str) -> Result<u64, TestEnvError> {
        let (status, text) = http_get(self.debug_port, "/metrics")
            .await
            .map_err(TestEnvError::Registry)?;
        if status != 200 {
            return Err(TestEnvError::Registry(format!(
                "/metrics answered {status}"
            )));
        }
        let wanted = [
            format!("handler=\"{handler}\""),
            format!("method=\"{method}\""),
        ];
        Ok(text
            .lines()
            .filter(|l| l.starts_with("registry_http_requests_total{"))
            .filter(|l| wanted.iter().all(|w| l.contains(w.as_str())))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum())
    }

    /// (user, password) when the registry requires basic auth (`REGISTRY_USER`/`REGISTRY_PASSWORD`).
    pub fn credentials(&self) -> Option<(&'static str, &'static str)> {
        self.authenticated
            .then_some((REGISTRY_USER, REGISTRY_PASSWORD))
    }
}

/// An anonymous and an authenticated registry on their own, for tests that need nothing else (the
/// package CLI and the image store).
#[derive(Debug)]
pub struct Registries {
    pub open: Registry,
    pub authenticated: Registry,
}

/// The registries every test of this test binary shares, started by the first caller; they stop when
/// the test binary exits.
pub fn shared_registries() -> Result<&'static Registries, TestEnvError> {
    static SHARED: OnceLock<Result<Registries, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            start_on_own_runtime(|| async {
                let binaries = Binaries::locate()?;
                let root = new_root_dir()?;
                let (open, authenticated) = tokio::join!(
                    start(&binaries, &root, false),
                    start(&binaries, &root, true)
                );
                Ok(Registries {
                    open: open?,
                    authenticated: authenticated?,
                })
            })
        })
        .as_ref()
        .map_err(|message| TestEnvError::SharedStartFailed(message.clone()))
}

/// Starts a registry; `authenticated` ones answer only `REGISTRY_USER` with `REGISTRY_PASSWORD`.
pub(crate) async fn start(
    binaries: &Binaries,
    dir: &Path,
    authenticated: bool,
) -> Result<Registry, TestEnvError> {
    let name = if authenticated {
        "registry-auth"
    } else {
        "registry"
    };
    start_with_retries(|attempt| async move {
        let port = free_port().map_err(io_error("allocate port", dir))?;
        let debug_port = free_port().map_err(io_error("allocate port", dir))?;
        let config = dir.join(format!("{name}.yaml"));
        let mut text = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: \"{}\"\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n  debug:\n    addr: 127.0.0.1:{debug_port}\n    prometheus:\n      enabled: true\n      path: /metrics\n",
            dir.join(format!("{name}-data-{attempt}")).display()
        );
        if authenticated {
            let htpasswd = dir.join(format!("{name}.htpasswd"));
            std::fs::write(
                &htpasswd,
                format!("{REGISTRY_USER}:{REGISTRY_PASSWORD_BCRYPT}\n"),
            )
            .map_err(io_error("write", &htpasswd))?;
            text.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: pko-test\n    path: \"{}\"\n",
                htpasswd.display()
            ));
        }
        std::fs::write(&config, text).map_err(io_error("write", &config))?;
        let mut command = Command::new(&binaries.registry);
        command.arg("serve").arg(&config);
        let process =
            ManagedProcess::spawn("docker-registry", command, &dir.join(format!("{name}.log")))?;
        wait_serving(&process, port, authenticated).await?;
        Ok(Registry {
            process,
            port,
            debug_port,
            authenticated,
            command: (binaries.registry.clone(), config),
        })
    })
    .await
}

/// Until the registry on `port` answers as it should.
async fn wait_serving(
    process: &ManagedProcess,
    port: u16,
    authenticated: bool,
) -> Result<(), TestEnvError> {
    // An authenticated registry is up when it challenges anonymous requests.
    let ready = if authenticated { 401 } else { 200 };
    process
        .wait_ready(READY_TIMEOUT, || async move {
            match http_get(port, "/v2/").await? {
                (status, _) if status == ready => Ok(()),
                (status, body) => Err(format!("/v2/ answered {status}: {body}")),
            }
        })
        .await
}

//! Errors of the harness. Each names the component and, where a server misbehaved, ends with the tail of
//! its log so a failing CI run explains itself.

use std::path::PathBuf;
use std::time::Duration;

/// What can go wrong starting or using the environment.
#[derive(Debug, thiserror::Error)]
pub enum TestEnvError {
    /// A server binary is not installed.
    #[error("{binary} not found ({looked}); install the test components with deploy/install-test-components.sh")]
    MissingBinary {
        /// The binary.
        binary: &'static str,
        /// Where it was looked for.
        looked: String,
    },
    /// A file operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A process could not be started.
    #[error("cannot start {name}: {source}")]
    Spawn {
        /// Component name.
        name: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A server exited while it was expected to run.
    #[error("{name} exited ({status}); last log lines:\n{log_tail}")]
    Exited {
        /// Component name.
        name: String,
        /// Exit status.
        status: String,
        /// End of its log.
        log_tail: String,
    },
    /// A condition did not hold before its deadline.
    #[error("{what} not ready after {after:?}: {last_error}{}", log_suffix(.log_tail))]
    NotReady {
        /// What was awaited.
        what: String,
        /// How long it was awaited.
        after: Duration,
        /// The last reason it was not ready.
        last_error: String,
        /// End of the component's log, if it has one.
        log_tail: Option<String>,
    },
    /// A command run to prepare the environment failed.
    #[error("{command} failed: {detail}")]
    Command {
        /// The command.
        command: String,
        /// Its exit status and output.
        detail: String,
    },
    /// A kube client could not be built or a request failed.
    #[error("kubernetes client for {server}: {source}")]
    Kube {
        /// Which apiserver.
        server: String,
        /// The client error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// NATS credentials could not be made.
    #[error("NATS credentials: {0}")]
    Credentials(#[from] pko_proto::nats_credentials::CredentialsError),
    /// A name is not usable for NATS subjects.
    #[error(transparent)]
    Subjects(#[from] pko_proto::connector_wire::WireError),
    /// A JetStream stream could not be read.
    #[error("reading stream {stream}: {message}")]
    Stream {
        /// Which stream.
        stream: String,
        /// What failed.
        message: String,
    },
    /// The registry's own metrics could not be read.
    #[error("reading the registry's metrics: {0}")]
    Registry(String),
    /// The shared environment failed to start earlier in this test binary.
    #[error("shared test environment failed to start: {0}")]
    SharedStartFailed(String),
}

fn log_suffix(log_tail: &Option<String>) -> String {
    log_tail
        .as_ref()
        .map(|tail| format!("; last log lines:\n{tail}"))
        .unwrap_or_default()
}

pub(crate) fn io_error(
    action: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(std::io::Error) -> TestEnvError {
    let path = path.into();
    move |source| TestEnvError::Io {
        action,
        path,
        source,
    }
}

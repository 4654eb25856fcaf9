//! What both binaries (pko-manager, pko-connector) do around their actor system: logging, the actix System
//! on a multi-thread tokio runtime (kube futures and watches run on its workers), the exit code, and
//! waiting for SIGTERM or SIGINT. Nothing here knows what the process does.

use std::fmt::Display;
use std::future::Future;
use std::process::ExitCode;

use tracing::error;

/// Logs to stderr, as JSON lines or text, filtered by `RUST_LOG` (default `info`).
pub fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Runs `run` on an actix System backed by a multi-thread tokio runtime; a returned error is logged and
/// makes the exit code a failure.
pub fn run_system<F, E>(run: F) -> ExitCode
where
    F: Future<Output = Result<(), E>>,
    E: Display,
{
    let system = actix::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| {
                eprintln!("cannot build the async runtime: {e}");
                std::process::exit(1)
            })
    });
    match system.block_on(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Resolves with the name of the first of SIGTERM and SIGINT to arrive.
pub async fn shutdown_signal() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

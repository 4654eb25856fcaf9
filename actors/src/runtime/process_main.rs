//! What both binaries (pko-manager, pko-connector) do around their actor system: logs and traces, the actix System
//! on a multi-thread tokio runtime (kube futures and watches run on its workers), the exit code, and
//! waiting for SIGTERM or SIGINT. Nothing here knows what the process does.

use std::fmt::Display;
use std::future::Future;
use std::process::ExitCode;

use tracing::error;

use super::telemetry;

/// How the process logs and traces.
#[derive(Debug, Clone, Copy)]
pub struct Telemetry {
    /// `service.name` of its spans unless `OTEL_SERVICE_NAME` says otherwise.
    pub service: &'static str,
    /// JSON log lines (with `trace_id`/`span_id`) instead of text.
    pub json_logs: bool,
}

/// Runs `run` on an actix System backed by a multi-thread tokio runtime, with logging (stderr, filtered by
/// `RUST_LOG`, default `info`) and OTLP trace export set up first and flushed last; a returned error is
/// logged and makes the exit code a failure.
pub fn run_system<F, E>(telemetry: Telemetry, run: F) -> ExitCode
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
    // Inside the runtime: the gRPC exporter's channel spawns its worker task on it.
    let traces = match system.block_on(async {
        telemetry::TracePipeline::install(telemetry.service, telemetry.json_logs)
    }) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match system.block_on(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    };
    // Out of the System (its worker threads still run the exporter's channel): flushing inside it would
    // block the thread the System needs.
    traces.shutdown();
    code
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

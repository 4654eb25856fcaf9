//! `pko-connector`: runs next to a hosted control plane, in its HCP namespace. Connects to NATS with the
//! credentials the manager minted for this namespace and to the hosted cluster's apiserver with the
//! `service-network-admin-kubeconfig`, then serves the manager's phase requests until SIGTERM or SIGINT.
//! With `--leader-election` it first waits for the Lease in its HCP namespace, so only one replica serves.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use actix::prelude::*;
use async_nats::{ConnectOptions, Event};
use clap::{Parser, ValueEnum};
use futures::StreamExt;
use pko_actors::hypershift::connector_actor::{ConnectorActor, ConnectorInput};
use pko_actors::objects::applier::Applier;
use pko_actors::objects::object_cache::ObjectCache;
use pko_actors::runtime::api_request_metrics::ApiRequestMetrics;
use pko_actors::runtime::cluster_client::{
    cluster_config, limited_client, ClientError, DEFAULT_MAX_IN_FLIGHT,
};
use pko_actors::runtime::leader_lease::{LeaseConfig, LeaseError, LeaseHolder};
use pko_actors::runtime::process_main::{run_system, shutdown_signal, Telemetry};
use pko_actors::runtime::write_fence::WriteFence;
use pko_proto::connector_wire::{HostedClusterSubjects, WireError};
use tokio::sync::mpsc;
use tracing::info;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Applies the hosted-cluster phases of one HCP namespace, as the manager asks over NATS.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The HCP namespace served (the connector's own namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: String,
    /// NATS server URL(s), comma-separated.
    #[arg(long, env = "PKO_NATS_URL")]
    nats_url: String,
    /// NATS credentials file (user JWT and seed) minted for this namespace.
    #[arg(long, env = "PKO_NATS_CREDS")]
    nats_creds: PathBuf,
    /// Kubeconfig of the hosted cluster (the mounted `service-network-admin-kubeconfig`).
    #[arg(long, env = "PKO_HOSTED_KUBECONFIG")]
    hosted_kubeconfig: PathBuf,
    /// UID of the HostedCluster served: its subjects are bound to it (the manager sets it in the
    /// Deployment). Without it, the namespace's unbound subjects (a namespace without a HostedCluster).
    #[arg(long, env = "PKO_HOSTED_CLUSTER_UID")]
    hosted_cluster_uid: Option<String>,
    /// Names this process in hellos and logs; defaults to the pod name.
    #[arg(long, env = "POD_NAME")]
    connector_id: Option<String>,
    /// Serve only while holding the `pko-connector` Lease in --namespace of the management cluster (its own
    /// ServiceAccount's credentials), so replicas never serve at the same time.
    #[arg(long)]
    leader_election: bool,
    /// Seconds a leader's Lease lasts without renewal; the leader renews every 2/15 of it and stops 2/3
    /// of it after its last successful renewal.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
}

/// Why the connector could not start.
#[derive(Debug, thiserror::Error)]
enum ConnectorError {
    #[error("--namespace: {0}")]
    Namespace(#[from] WireError),
    #[error("hosted cluster: {0}")]
    Hosted(#[from] ClientError),
    #[error("NATS credentials {path}: {source}")]
    Credentials {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("NATS {url}: {message}")]
    Nats { url: String, message: String },
    #[error("leader election: {0}")]
    Lease(#[from] LeaseError),
    #[error("waiting for a shutdown signal: {0}")]
    Signal(#[source] std::io::Error),
}

async fn run(args: Args) -> Result<(), ConnectorError> {
    let subjects = match args
        .hosted_cluster_uid
        .as_deref()
        .filter(|uid| !uid.is_empty())
    {
        Some(uid) => HostedClusterSubjects::new(&args.namespace)?.bound_to(uid)?,
        None => HostedClusterSubjects::new(&args.namespace)?,
    };
    let connector_id = args.connector_id.clone().unwrap_or_else(|| {
        format!(
            "{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "pko-connector".to_owned()),
            std::process::id()
        )
    });
    // The hosted cluster is written only while this replica's leadership is confirmed.
    let fence = WriteFence::for_leader_election(args.leader_election);
    let hosted = limited_client(
        cluster_config(Some(&args.hosted_kubeconfig)).await?,
        DEFAULT_MAX_IN_FLIGHT,
        &fence,
        // The connector serves no metrics.
        &ApiRequestMetrics::default(),
    )?;
    let lease = if args.leader_election {
        // In a pod: the ServiceAccount; elsewhere $KUBECONFIG.
        let config = LeaseConfig::new(
            subjects.namespace(),
            "pko-connector",
            &connector_id,
            Duration::from_secs(args.lease_duration_seconds),
        );
        info!(identity = %connector_id, "waiting for the connector lease");
        // Losing the Lease closes the fence and exits the process from the Lease's own thread.
        Some(LeaseHolder::acquire(cluster_config(None).await?, config, fence).await?)
    } else {
        None
    };

    let creds = tokio::fs::read_to_string(&args.nats_creds)
        .await
        .map_err(|source| ConnectorError::Credentials {
            path: args.nats_creds.clone(),
            source,
        })?;
    let nats_error = |message: String| ConnectorError::Nats {
        url: args.nats_url.clone(),
        message,
    };
    let (events, connected) = mpsc::unbounded_channel();
    let options = ConnectOptions::with_credentials(&creds)
        .map_err(|source| ConnectorError::Credentials {
            path: args.nats_creds.clone(),
            source,
        })?
        .name(format!("pko-connector {}", subjects.namespace()))
        // NATS may be down when the connector starts: keep trying, and say hello once it is up.
        .retry_on_initial_connect()
        .max_reconnects(None)
        .event_callback(move |event| {
            let events = events.clone();
            async move {
                match event {
                    Event::Connected => {
                        let _ = events.send(ConnectorInput::Connected);
                    }
                    other => info!(event = %other, "NATS"),
                }
            }
        });
    let nats = options
        .connect(&args.nats_url)
        .await
        .map_err(|e| nats_error(e.to_string()))?;
    let apply = nats
        .subscribe(subjects.apply())
        .await
        .map_err(|e| nats_error(e.to_string()))?;
    let teardown = nats
        .subscribe(subjects.teardown())
        .await
        .map_err(|e| nats_error(e.to_string()))?;
    let preview = nats
        .subscribe(subjects.preview())
        .await
        .map_err(|e| nats_error(e.to_string()))?;

    let applier = Applier::new(hosted.clone());
    let cache = ObjectCache::new(hosted);
    let namespace = subjects.namespace().to_owned();
    let connector = ConnectorActor::create(move |ctx| {
        ctx.add_stream(apply.map(ConnectorInput::Apply));
        ctx.add_stream(teardown.map(ConnectorInput::Teardown));
        ctx.add_stream(preview.map(ConnectorInput::Preview));
        ctx.add_stream(futures::stream::unfold(connected, |mut rx| async move {
            rx.recv().await.map(|input| (input, rx))
        }));
        ConnectorActor::new(subjects, connector_id, applier, cache, nats.clone())
    });
    info!(%namespace, "connector running");
    let outcome = shutdown_signal()
        .await
        .map(|s| info!(signal = s, "shutting down"))
        .map_err(ConnectorError::Signal);
    drop(connector);
    if let Some(lease) = lease {
        lease.release().await;
    }
    outcome
}

fn main() -> ExitCode {
    let args = Args::parse();
    let telemetry = Telemetry {
        service: "pko-connector",
        json_logs: matches!(args.log_format, LogFormat::Json),
    };
    run_system(telemetry, run(args))
}

//! `pko-manager`: the operator process. Parses flags, connects to the apiserver, optionally installs the
//! CRDs and takes the leader lease, then runs the actor system until SIGTERM or SIGINT.

mod bootstrap_writes;
mod crd_install;
mod fleet_bootstrap;
mod health;
mod nats_bootstrap;
mod platform_version;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use pko_actors::engine::hypershift::connector_deployment::ConnectorResources;
use pko_actors::engine::notifications::notification_sink::NotificationSink;
use pko_actors::engine::notifications::sink_address::SinkAddressPolicy;
use pko_actors::fleet::hub_link::FleetMember;
use pko_actors::hypershift::connector_link::{
    ConnectorLink, LinkSetupError, ManagerNatsUser, DEFAULT_CREDENTIALS_VALIDITY,
    DEFAULT_MANAGER_USER_VALIDITY, DEFAULT_TEARDOWN_TIMEOUT,
};
use pko_actors::manager::context::ManagerContext;
use pko_actors::metrics::manager_metrics::ManagerMetrics;
use pko_actors::packages::pull_secrets::PullSecretSource;
use pko_actors::rollout::health_queries::{PrometheusQueries, PrometheusQueriesError};
use pko_actors::rollout::hosted_cluster_index::PreflightSettings;
use pko_actors::rollout::rollout_publisher::DEFAULT_OUTBOX_CAPACITY;
use pko_actors::runtime::api_request_metrics::ApiRequestMetrics;
use pko_actors::runtime::cluster_client::{
    cluster_config, limited_client, ClientError, DEFAULT_MAX_IN_FLIGHT,
};
use pko_actors::runtime::heap_trim;
use pko_actors::runtime::initial_lists::{self, InitialLists};
use pko_actors::runtime::leader_lease::{LeaseConfig, LeaseError, LeaseHolder};
use pko_actors::runtime::process_main::{run_system, shutdown_signal, Telemetry};
use pko_actors::runtime::shard_coordinator;
use pko_actors::runtime::shard_membership::{MemberIdentity, MemberNameError, ShardMembership};
use pko_actors::runtime::write_fence::WriteFence;
use pko_package::image_limits::ImageLimits;
use pko_proto::core::rollout_notifications::HostedClusterPackageNotificationSink;
use pko_proto::fleet::check_cluster_name;
use pko_proto::nats_credentials::AccountSigner;
use pko_proto::nats_permissions::{manager_permissions, member_inbox_prefix};
use tracing::{info, warn};

use crate::health::{HealthState, Readiness};

/// How the watches read what exists when they start (`--initial-lists`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum InitialListsArg {
    /// Streaming lists where the apiserver serves them (asked once at start), else paged lists.
    Auto,
    Paged,
    Streaming,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// What else the binary does besides running the manager.
#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Create (once) the NATS operator, system and pko accounts with a signing key, the Secret the
    /// manager reads its account seed from, and the resolver configuration nats-server includes.
    NatsBootstrap(nats_bootstrap::BootstrapArgs),
}

/// Reconciles package-operator.run objects on the cluster it runs against.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Kubeconfig to use; without it, $KUBECONFIG, ~/.kube/config or the in-cluster service account.
    #[arg(long, env = "PKO_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Requests to the apiserver in flight at once (awaiting their response headers); more queue. Bounds
    /// the manager's connections and memory, and the load it puts on the apiserver when many objects
    /// change together. The watch feeds' lists and watches have a queue of their own of this size.
    #[arg(long, env = "PKO_MAX_IN_FLIGHT_REQUESTS", default_value_t = DEFAULT_MAX_IN_FLIGHT)]
    max_in_flight_requests: usize,
    /// Install or upgrade pko's CRDs before starting.
    #[arg(long)]
    install_crds: bool,
    /// How the watches read what exists when they start: streaming lists (`sendInitialEvents`, served
    /// by default from Kubernetes 1.32) hand objects over one at a time from the watch cache; paged
    /// lists read etcd a page at a time. `auto` asks the apiserver once at start.
    #[arg(long, env = "PKO_INITIAL_LISTS", value_enum, default_value = "auto")]
    initial_lists: InitialListsArg,
    /// Only reconcile while holding the leader Lease.
    #[arg(long, conflicts_with = "sharding")]
    leader_election: bool,
    /// Every replica works, each on its share (docs/sharding.md): a member Lease per replica, the
    /// replica holding the manager's Lease (`--lease-name`) labels objects with their owner.
    #[arg(long, env = "PKO_SHARDING")]
    sharding: bool,
    /// This replica's shard member name, when it outlives the process (a StatefulSet's pod name, as
    /// deploy/manager-sharded sets it): on SIGTERM the replica keeps its member Lease for the restart,
    /// and the restarted process takes its share back without moving a key. Unset: a member per process.
    #[arg(long, env = "PKO_MEMBER_NAME", requires = "sharding")]
    member_name: Option<String>,
    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "package-operator-system")]
    leader_election_namespace: String,
    /// How long a HostedClusterPackage release preflight waits for its image: past it, the preflight
    /// leaves its namespaces unchecked instead of holding the rollout.
    #[arg(long, default_value_t = 30)]
    preflight_pull_timeout_seconds: u64,
    /// Name of the leader Lease.
    #[arg(long, default_value = "pko-manager")]
    lease_name: String,
    /// How long the leader Lease lasts without renewal. The leader renews every 2/15 of it and stops
    /// writing (and exits) 2/3 of it after its last successful renewal, before a standby may take over.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, default_value = "127.0.0.1:8080")]
    health_addr: SocketAddr,
    /// Registries to pull package images from over plain HTTP (local registries), comma-separated hosts.
    #[arg(long, env = "PKO_PLAIN_HTTP_REGISTRIES", value_delimiter = ',')]
    plain_http_registry: Vec<String>,
    /// Package images: bytes of all layers together, as downloaded.
    #[arg(long, default_value_t = ImageLimits::default().max_layer_bytes)]
    max_image_layer_bytes: u64,
    /// Package images: bytes unpacked from all layers together.
    #[arg(long, default_value_t = ImageLimits::default().max_unpacked_bytes)]
    max_unpacked_bytes: u64,
    /// Package images: files in the package.
    #[arg(long, default_value_t = ImageLimits::default().max_files)]
    max_image_files: u64,
    /// Package images: bytes of one file.
    #[arg(long, default_value_t = ImageLimits::default().max_file_bytes)]
    max_image_file_bytes: u64,
    /// Package images: unpacked bytes per compressed byte of a layer (checked past 1 MiB unpacked).
    #[arg(long, default_value_t = ImageLimits::default().max_compression_ratio)]
    max_compression_ratio: u64,
    /// Bytes of unpacked packages kept in the pull cache (least recently used go first).
    #[arg(long, default_value_t = ImageLimits::default().cache_bytes)]
    image_cache_bytes: u64,
    /// ServiceAccount whose imagePullSecrets authenticate package image pulls (the manager's own).
    #[arg(long, env = "POD_SERVICE_ACCOUNT", default_value = "package-operator")]
    service_account: String,
    /// Namespace of that ServiceAccount.
    #[arg(long, env = "POD_NAMESPACE", default_value = "package-operator-system")]
    service_account_namespace: String,
    /// NATS server URL(s), comma-separated: hosted-cluster phases travel to their connectors over it.
    #[arg(long, env = "PKO_NATS_URL")]
    nats_url: Option<String>,
    /// File holding the NATS account seed (`SA...`) that signs the manager's and the connectors' users.
    #[arg(long, env = "PKO_NATS_ACCOUNT_SEED_FILE", requires = "nats_url")]
    nats_account_seed_file: Option<PathBuf>,
    /// Public key of the NATS account, when the seed is one of its signing keys rather than its own key.
    #[arg(long, env = "PKO_NATS_ACCOUNT")]
    nats_account: Option<String>,
    /// NATS URL handed to connectors, when they reach NATS by another address than the manager.
    #[arg(long, env = "PKO_CONNECTOR_NATS_URL")]
    connector_nats_url: Option<String>,
    /// Seconds a deleted hosted-cluster phase waits for an unreachable connector before its hosted teardown
    /// is skipped and its finalizer released (at once when its HostedCluster is gone).
    #[arg(long, default_value_t = DEFAULT_TEARDOWN_TIMEOUT.as_secs())]
    hosted_teardown_timeout_seconds: u64,
    /// Seconds connector NATS credentials are valid; they are minted again (and the connector restarted
    /// with them) once a third of that is left.
    #[arg(long, default_value_t = DEFAULT_CREDENTIALS_VALIDITY.as_secs())]
    connector_credentials_validity_seconds: u64,
    /// Seconds the manager's own NATS user is valid: nats-server then closes the connection, and the
    /// reconnect mints a fresh user (every phase is sent to its connector again).
    #[arg(long, default_value_t = DEFAULT_MANAGER_USER_VALIDITY.as_secs())]
    nats_user_validity_seconds: u64,
    /// Image of the hosted-cluster connector Deployments: the manager's own image, which holds both binaries.
    #[arg(long, env = "PKO_CONNECTOR_IMAGE", default_value = "localhost/pko:dev")]
    connector_image: String,
    /// CPU each connector container requests.
    #[arg(long, default_value = "10m", value_parser = quantity)]
    connector_cpu_request: String,
    /// Memory each connector container requests.
    #[arg(long, default_value = "64Mi", value_parser = quantity)]
    connector_memory_request: String,
    /// Memory each connector container may use before it is restarted.
    #[arg(long, default_value = "256Mi", value_parser = quantity)]
    connector_memory_limit: String,
    /// Names this management cluster in the rollout events it publishes.
    #[arg(long, env = "PKO_CLUSTER_NAME", default_value = "management")]
    cluster_name: String,
    /// Joins the fleet of management clusters whose hub NATS has this JetStream domain (this manager's
    /// NATS is a leaf node of it, with the JetStream domain named like --cluster-name): the hub then
    /// aggregates this cluster's rollout events, and promotion gates read and write rollout records there.
    #[arg(long, env = "PKO_FLEET_HUB_DOMAIN", requires = "nats_url")]
    fleet_hub_domain: Option<String>,
    /// Labels of this management cluster that promotion gates elsewhere select it by, as key=value pairs,
    /// comma-separated (with --fleet-hub-domain).
    #[arg(
        long,
        env = "PKO_CLUSTER_LABELS",
        value_delimiter = ',',
        requires = "fleet_hub_domain"
    )]
    cluster_labels: Vec<String>,
    /// The Prometheus that rollout health checks (`spec.rolloutPolicy…healthChecks`) query, e.g.
    /// `http://prometheus:9090`. Without it every health check is unknown and a soak with checks never
    /// ends.
    #[arg(long, env = "PKO_PROMETHEUS_URL")]
    prometheus_url: Option<String>,
    /// An HTTP sink that receives every HostedClusterPackage's rollout events as CloudEvents (binary
    /// content mode), once and in order, from the rollout event stream. Needs --nats-url.
    #[arg(long, env = "PKO_CLOUDEVENTS_SINK")]
    cloudevents_sink: Option<String>,
    /// A Secret in the manager's namespace, labelled rollout.package-operator.run/sink-credentials=true,
    /// whose `token` (bearer) or `username` and `password` (basic) the manager-wide sink is sent.
    #[arg(
        long,
        env = "PKO_CLOUDEVENTS_SINK_SECRET",
        requires = "cloudevents_sink"
    )]
    cloudevents_sink_secret: Option<String>,
    /// The rollout event kinds the manager-wide sink receives (default: every kind).
    #[arg(long, value_delimiter = ',', requires = "cloudevents_sink")]
    cloudevents_sink_kinds: Vec<String>,
    /// Address ranges CloudEvents sinks may reach although they are not public (`10.0.0.0/8,fd00::/8`).
    /// By default sinks reach only public addresses: no loopback, link-local, private, shared or
    /// reserved ones, judged on each address connected to.
    #[arg(
        long,
        value_delimiter = ',',
        env = "PKO_NOTIFICATION_SINK_ALLOWED_CIDRS"
    )]
    notification_sink_allowed_cidrs: Vec<String>,
    /// Rollout events held while NATS does not acknowledge them (about 300 bytes each); beyond it the
    /// newest are dropped and counted in pko_rollout_events_dropped_total.
    #[arg(long, default_value_t = DEFAULT_OUTBOX_CAPACITY)]
    rollout_event_outbox: usize,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Namespaced owners (Package, ObjectDeployment, ObjectSet, ObjectSetPhase, ObjectTemplate) read and
    /// write their objects as this ServiceAccount of their own namespace (impersonated), unless they name
    /// another with the annotation `package-operator.run/service-account`. Cluster-scoped owners and the
    /// HCP namespaces of HostedClusters keep the manager's identity. Unset: the manager's identity.
    #[arg(long, env = "PKO_DEFAULT_SERVICE_ACCOUNT", value_parser = service_account_name)]
    default_service_account: Option<String>,
}

/// A flag holding a resource quantity.
fn quantity(text: &str) -> Result<String, String> {
    if pko_actors::engine::hypershift::connector_deployment::valid_quantity(text) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?} is not a quantity (digits, an optional fraction, a suffix such as m, Mi or Gi)"
        ))
    }
}

/// A flag naming a ServiceAccount.
fn service_account_name(name: &str) -> Result<String, String> {
    pko_actors::engine::objects::apply_identity::valid_service_account_name(name)
        .map(|()| name.to_owned())
}

/// Why the manager could not start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Prometheus(#[from] PrometheusQueriesError),
    #[error("installing CRDs: {0}")]
    Crds(String),
    #[error("health endpoint {addr}: {source}")]
    Health {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("--nats-account-seed-file {path}: {message}")]
    NatsSeed { path: PathBuf, message: String },
    #[error("--nats-url is set but --nats-account-seed-file is not: connectors need credentials")]
    NatsSeedMissing,
    #[error(transparent)]
    Nats(#[from] LinkSetupError),
    #[error(transparent)]
    PlatformVersion(#[from] platform_version::PlatformVersionError),
    #[error("reading the apiserver's version: {0}")]
    ApiServerVersion(#[source] kube::Error),
    #[error("{0}")]
    CloudEventsSink(String),
    #[error("waiting for a shutdown signal: {0}")]
    Signal(#[source] std::io::Error),
    #[error("leader election: {0}")]
    Lease(#[from] LeaseError),
    #[error("--member-name: {0}")]
    MemberName(#[from] MemberNameError),
    #[error("nats-bootstrap: {0}")]
    Bootstrap(#[from] nats_bootstrap::BootstrapError),
    #[error(transparent)]
    FleetBootstrap(#[from] fleet_bootstrap::FleetBootstrapError),
    #[error("--cluster-name: {0}")]
    ClusterName(String),
    #[error("--cluster-labels: {0:?} is not key=value")]
    ClusterLabel(String),
}

/// Who this manager is in the fleet of management clusters, when it joins one.
fn fleet_member(args: &Args) -> Result<Option<FleetMember>, ManagerError> {
    let Some(hub_domain) = &args.fleet_hub_domain else {
        return Ok(None);
    };
    check_cluster_name(&args.cluster_name).map_err(ManagerError::ClusterName)?;
    let labels = args
        .cluster_labels
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
            _ => Err(ManagerError::ClusterLabel(pair.clone())),
        })
        .collect::<Result<_, _>>()?;
    Ok(Some(FleetMember {
        cluster: args.cluster_name.clone(),
        labels,
        hub_domain: hub_domain.clone(),
    }))
}

async fn connector_link(
    args: &Args,
    metrics: &ManagerMetrics,
) -> Result<Option<ConnectorLink>, ManagerError> {
    let Some(url) = &args.nats_url else {
        return Ok(None);
    };
    let path = args
        .nats_account_seed_file
        .as_ref()
        .ok_or(ManagerError::NatsSeedMissing)?;
    let seed_error = |message: String| ManagerError::NatsSeed {
        path: path.clone(),
        message,
    };
    let seed = tokio::fs::read_to_string(path)
        .await
        .map_err(|e| seed_error(e.to_string()))?;
    let signer = AccountSigner::from_seed(&seed, args.nats_account.as_deref())
        .map_err(|e| seed_error(e.to_string()))?;
    // In a fleet, the user reaches the hub for this cluster's records only, and replies come back under
    // this cluster's inbox prefix (the only one the hub sends across its link).
    let fleet = fleet_member(args)?;
    let user = ManagerNatsUser {
        permissions: manager_permissions(
            fleet
                .as_ref()
                .map(|m| (m.cluster.as_str(), m.hub_domain.as_str())),
        ),
        inbox_prefix: fleet.as_ref().map(|m| member_inbox_prefix(&m.cluster)),
        validity: Duration::from_secs(args.nats_user_validity_seconds.max(10)),
    };
    Ok(Some(
        ConnectorLink::connect(
            url,
            signer,
            user,
            metrics.connectors.clone(),
            args.connector_nats_url.clone(),
            args.connector_image.clone(),
        )
        .await?
        .with_teardown_timeout(Duration::from_secs(args.hosted_teardown_timeout_seconds))
        .with_credentials_validity(Duration::from_secs(
            args.connector_credentials_validity_seconds.max(3),
        ))
        .with_connector_resources(ConnectorResources {
            cpu_request: args.connector_cpu_request.clone(),
            memory_request: args.connector_memory_request.clone(),
            memory_limit: args.connector_memory_limit.clone(),
        }),
    ))
}

/// The initial lists the watches make: as told, or (`auto`) streaming where the apiserver answers the
/// question with a streaming list. A failed question falls back to paged lists, which every apiserver
/// serves. Shown as `pko_watch_streaming_lists` (1: streaming).
async fn initial_lists(
    told: InitialListsArg,
    client: &kube::Client,
    metrics: &ManagerMetrics,
) -> InitialLists {
    let lists = match told {
        InitialListsArg::Paged => InitialLists::Paged,
        InitialListsArg::Streaming => InitialLists::Streaming,
        InitialListsArg::Auto => match initial_lists::probe(client).await {
            Ok(lists) => lists,
            Err(error) => {
                warn!(%error, "asking the apiserver for a streaming list failed; listing page by page");
                InitialLists::Paged
            }
        },
    };
    info!(
        initial_lists = lists.name(),
        ?told,
        "watches start with these lists"
    );
    metrics.register(
        "pko_watch_streaming_lists",
        "1 when the watches start with streaming lists (sendInitialEvents), 0 with paged lists.",
        lists.gauge(),
    );
    lists
}

async fn run(args: Args) -> Result<(), ManagerError> {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "pko-manager".to_owned());
    // A shard member's name is one process's unless it is given (a StatefulSet's pod name): then a
    // restarted replica takes its share back (engine::sharding::shard_assignment).
    let member = match (&args.member_name, args.sharding) {
        (Some(name), true) => MemberIdentity::named(name, std::process::id())?,
        (None, true) => MemberIdentity::per_process(&host, std::process::id()),
        (_, false) => MemberIdentity::unsharded(&host, std::process::id()),
    };
    // The process, not the member: the audit log tells a restarted replica's writes from its
    // predecessor's.
    let identity = member.holder.clone();
    let mut kube_config = cluster_config(args.kubeconfig.as_deref()).await?;
    // Every request names the replica, so the apiserver's audit log tells which one wrote what.
    kube_config.headers.push(user_agent(&identity, None));
    // What every replica does, leader or not (CRDs), goes unfenced; the
    // engine's client writes only while this replica's leadership is confirmed.
    let api_requests = ApiRequestMetrics::default();
    let client = limited_client(
        kube_config.clone(),
        args.max_in_flight_requests,
        &WriteFence::open(),
        &api_requests,
    )?;
    let fence = WriteFence::for_leader_election(args.leader_election || args.sharding);
    let engine_client = limited_client(
        kube_config.clone(),
        args.max_in_flight_requests,
        &fence,
        &api_requests,
    )?;
    let version = client
        .apiserver_version()
        .await
        .map_err(ManagerError::ApiServerVersion)?;
    platform_version::check(&version)?;
    info!(kubernetes = %version.git_version, "apiserver version supported");
    let metrics = ManagerMetrics::new(api_requests.clone());
    let initial_lists = initial_lists(args.initial_lists, &client, &metrics).await;
    // What a burst of work freed goes back to the system instead of staying in the RSS.
    tokio::spawn(heap_trim::keep_trimmed(metrics.heap.clone()));
    if args.install_crds {
        crd_install::install_crds(&client).await?;
        info!("CRDs installed");
    }
    let image_limits = ImageLimits {
        max_layer_bytes: args.max_image_layer_bytes,
        max_unpacked_bytes: args.max_unpacked_bytes,
        max_files: args.max_image_files,
        max_file_bytes: args.max_image_file_bytes,
        max_compression_ratio: args.max_compression_ratio,
        cache_bytes: args.image_cache_bytes,
    };
    let mut context = ManagerContext::new(
        engine_client,
        args.plain_http_registry.clone(),
        image_limits,
        PullSecretSource::new(
            args.service_account_namespace.clone(),
            args.service_account.clone(),
        ),
        metrics.clone(),
    )
    .with_default_service_account(args.default_service_account.clone())
    .with_initial_lists(initial_lists)
    .with_preflight(PreflightSettings {
        // Next to the manager's Lease: a namespace that exists wherever the manager runs.
        report_namespace: args.leader_election_namespace.clone(),
        pull_timeout: Duration::from_secs(args.preflight_pull_timeout_seconds),
    })
    .with_watch_client(limited_client(
        kube_config.clone(),
        args.max_in_flight_requests,
        &fence,
        &api_requests,
    )?);
    if let Some(link) = connector_link(&args, &metrics).await? {
        info!(url = ?args.nats_url, account = link.signer.account(), "delivering hosted-cluster phases over NATS");
        context =
            context.with_connectors(link, args.cluster_name.clone(), args.rollout_event_outbox);
        if let Some(member) = fleet_member(&args)? {
            info!(cluster = %member.cluster, hub = %member.hub_domain, "in a fleet of management clusters");
            context = context.in_fleet(member);
        }
    }
    let manager_sink = manager_wide_sink(&args)?;
    if let Some(sink) = &manager_sink {
        info!(url = %sink.url, "every rollout event goes to this CloudEvents sink");
    }
    let sink_addresses = SinkAddressPolicy::parse(&args.notification_sink_allowed_cidrs)
        .map_err(ManagerError::CloudEventsSink)?;
    context = context
        .with_notifications(
            &args.leader_election_namespace,
            manager_sink,
            sink_addresses,
        )
        .map_err(ManagerError::CloudEventsSink)?;
    if let Some(url) = &args.prometheus_url {
        info!(%url, "rollout health checks query this Prometheus");
        context = context.with_health_checks(PrometheusQueries::new(url)?);
    }
    let health = HealthState::new(metrics.clone());
    let bound = health::serve(args.health_addr, health.clone())
        .await
        .map_err(|source| ManagerError::Health {
            addr: args.health_addr,
            source,
        })?;
    info!(addr = %bound, "serving /healthz, /readyz, /metrics");

    let mut leader_config = LeaseConfig::new(
        &args.leader_election_namespace,
        &args.lease_name,
        &identity,
        Duration::from_secs(args.lease_duration_seconds),
    );
    leader_config.metrics = metrics.leases.clone();
    let (lease, membership) = if args.sharding {
        // Every replica works on its share from the start; the Lease holder also coordinates.
        let membership = ShardMembership::join(
            kube_config.clone(),
            client.clone(),
            &args.leader_election_namespace,
            &member,
            Duration::from_secs(args.lease_duration_seconds),
            fence.clone(),
            metrics.leases.clone(),
        )
        .await?;
        info!(member = %member.member, process = %identity, "sharded: working on this replica's share");
        let view = membership.view();
        context = context.sharded(&member.member, view.clone());
        let lease_namespace = args.leader_election_namespace.clone();
        // Its own client and user agent: its label writes are told apart from the replica's work.
        let mut coordinator_config = kube_config.clone();
        coordinator_config.headers = vec![user_agent(&identity, Some("shard-coordinator"))];
        let coordinator_client = limited_client(
            coordinator_config,
            args.max_in_flight_requests,
            &fence,
            &api_requests,
        )?;
        let shard_metrics = context.metrics.shards.clone();
        let (kube_config, fence) = (kube_config.clone(), fence.clone());
        tokio::spawn(async move {
            match LeaseHolder::acquire(kube_config, leader_config, fence).await {
                Ok(holder) => {
                    shard_coordinator::run(
                        coordinator_client,
                        &lease_namespace,
                        view,
                        shard_metrics,
                    )
                    .await;
                    holder.release().await;
                }
                Err(error) => warn!(%error, "cannot take part in electing the shard coordinator"),
            }
        });
        (None, Some(membership))
    } else if args.leader_election {
        // Losing the Lease closes the fence and exits the process from the Lease's own thread.
        health.set(Readiness::Standby);
        (
            Some(LeaseHolder::acquire(kube_config, leader_config, fence).await?),
            None,
        )
    } else {
        (None, None)
    };

    let publisher = context.rollouts.publisher.clone();
    let sinks = context.rollouts.sinks.clone();
    health.set(if args.sharding {
        Readiness::ShardMember(context.runtime.feeds.clone())
    } else {
        Readiness::Leading(context.runtime.feeds.clone())
    });
    let engine = pko_actors::manager::actor_tree::start(context);
    info!("manager running");

    let outcome = shutdown_signal()
        .await
        .map(|s| info!(signal = s, "shutting down"))
        .map_err(ManagerError::Signal);
    health.set(Readiness::Stopping);
    engine.stop();
    if let Some(publisher) = publisher {
        let left = publisher.flush(Duration::from_secs(5)).await;
        if left > 0 {
            warn!(left, "rollout events not acknowledged at shutdown");
        }
    }
    if let Some(sinks) = sinks {
        // Deliveries under way end and are acknowledged; the next manager resumes after them.
        let left = sinks.drain(Duration::from_secs(12)).await;
        if left > 0 {
            warn!(left, "CloudEvents deliveries still under way at shutdown");
        }
    }
    if let Some(lease) = lease {
        lease.release().await;
    }
    if let Some(membership) = membership {
        membership.leave().await;
    }
    outcome
}

/// The manager-wide CloudEvents sink the flags name, checked like a HostedClusterPackage's.
fn manager_wide_sink(args: &Args) -> Result<Option<NotificationSink>, ManagerError> {
    let Some(url) = &args.cloudevents_sink else {
        return Ok(None);
    };
    let spec = HostedClusterPackageNotificationSink {
        url: url.clone(),
        credentials_secret: args.cloudevents_sink_secret.clone(),
        kinds: args.cloudevents_sink_kinds.clone(),
    };
    NotificationSink::parse(&spec, "--cloudevents-sink")
        .map(Some)
        .map_err(ManagerError::CloudEventsSink)
}

/// `pko-manager/<version> (<identity>[; <role>])`.
fn user_agent(identity: &str, role: Option<&str>) -> (http::HeaderName, http::HeaderValue) {
    let text = match role {
        Some(role) => format!(
            "pko-manager/{} ({identity}; {role})",
            env!("CARGO_PKG_VERSION")
        ),
        None => format!("pko-manager/{} ({identity})", env!("CARGO_PKG_VERSION")),
    };
    let value = http::HeaderValue::from_str(&text)
        .unwrap_or_else(|_| http::HeaderValue::from_static("pko-manager"));
    (http::header::USER_AGENT, value)
}

async fn bootstrap(
    args: &Args,
    bootstrap: &nats_bootstrap::BootstrapArgs,
) -> Result<(), ManagerError> {
    if let Some(nats_bootstrap::BootstrapFleet::Fleet(step)) = &bootstrap.fleet {
        return Ok(fleet_bootstrap::run(step).await?);
    }
    let config = cluster_config(args.kubeconfig.as_deref()).await?;
    let client = limited_client(
        config,
        args.max_in_flight_requests,
        &WriteFence::open(),
        &ApiRequestMetrics::default(),
    )?;
    Ok(nats_bootstrap::run(client, bootstrap).await?)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let telemetry = Telemetry {
        service: "pko-manager",
        json_logs: matches!(args.log_format, LogFormat::Json),
    };
    match &args.command {
        Some(Command::NatsBootstrap(bootstrap_args)) => {
            run_system(telemetry, bootstrap(&args, bootstrap_args))
        }
        None => run_system(telemetry, run(args)),
    }
}

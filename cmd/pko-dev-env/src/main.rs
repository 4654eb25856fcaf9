//! `pko-dev-env`: the local environment. Starts a management kube-apiserver (with kube-controller-manager),
//! hosted-cluster kube-apiservers registered as HyperShift HostedClusters, nats-server with JetStream and
//! an OCI registry; installs pko's CRDs; starts pko-manager against it (with the connector runner standing
//! in for a kubelet) and rolls out the samples `deploy/examples/object-deployment.yaml` and
//! `deploy/examples/hosted-object-deployment.yaml` (phases across a hosted cluster), then a
//! HostedClusterPackage rollout across a fleet of simulated HostedClusters
//! (`deploy/examples/hosted-cluster-package.yaml`, progress printed as it goes); prints how to reach
//! everything and writes it to an env file; runs until interrupted, then stops every server.

mod fleet_rollout;
mod management_fleet;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Patch, PatchParams};
use kube::Api;
use pko_proto::core::object_deployment::ObjectDeployment;
use pko_testenv::{
    span_tree, wait_until, Dashboard, EnvConfig, ManagerLaunch, OtlpReceiver, Prometheus,
    SimulatedHostedCluster, TestEnv,
};
use serde_json::json;
use tokio::signal::unix::{signal, SignalKind};

/// Runs the local pko environment.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Number of hosted clusters (each its own kube-apiserver).
    #[arg(long, default_value_t = 2)]
    hosted_clusters: usize,
    /// Simulated HostedClusters (objects only, no apiservers) for the HostedClusterPackage rollout; 0
    /// skips it.
    #[arg(long, default_value_t = 6)]
    fleet: usize,
    /// Management clusters in a fleet: more than 1 makes the environment's management cluster the
    /// `canary` of a fleet under a hub NATS, adds `prod-1`.. (a kube-apiserver and a pko-manager each), and
    /// rolls the fleet sample to every one, prod gated on the canary (needs --fleet > 0).
    #[arg(long, default_value_t = 1)]
    management_clusters: usize,
    /// Where to write `env.sh` (KUBECONFIG and friends).
    #[arg(long, default_value = ".pko-dev")]
    state_dir: PathBuf,
    /// Stop as soon as everything is ready (for checking the setup).
    #[arg(long)]
    exit_when_ready: bool,
    /// pko-manager binary (default: next to this binary, as `cargo build` puts it).
    #[arg(long)]
    manager: Option<PathBuf>,
    /// Once the samples rolled out, draw deploy/monitoring/pko-dashboard.json's panels from this
    /// environment's Prometheus to this file (SVG; PNG through rsvg-convert when it ends in .png).
    #[arg(long)]
    dashboard_picture: Option<PathBuf>,
}

/// The samples rolled out once the manager runs: local phases, then phases across a hosted cluster.
const SAMPLE: &str = include_str!("../../../deploy/examples/object-deployment.yaml");
const HOSTED_SAMPLE: &str = include_str!("../../../deploy/examples/hosted-object-deployment.yaml");
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug)]
enum LaunchError {
    Env(pko_testenv::TestEnvError),
    Crds(pko_proto::core::CrdError),
    Io(String, std::io::Error),
    Manager(String),
    Sample(String),
}

impl std::fmt::Display for LaunchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Env(error) => write!(f, "{error}"),
            Self::Crds(error) => write!(f, "{error}"),
            Self::Io(what, error) => write!(f, "{what}: {error}"),
            Self::Manager(message) => write!(f, "pko-manager: {message}"),
            Self::Sample(message) => write!(f, "sample rollout: {message}"),
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            // The builder logs every refused connection while the apiservers start (readiness polling);
            // the launcher reports the errors that matter itself.
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(
                    "warn,kube_client::client::tls=error,kube_client::client::builder=off",
                )
            }),
        )
        .init();
    let args = Args::parse();
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("pko-dev-env: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), LaunchError> {
    let started = Instant::now();
    println!("Starting etcd, {} kube-apiservers, kube-controller-manager, nats-server and an OCI registry...", args.hosted_clusters + 1);
    let env = TestEnv::start(EnvConfig {
        hosted_clusters: args.hosted_clusters,
        controller_manager: true,
    })
    .await
    .map_err(LaunchError::Env)?;
    let client = env.management().client().await.map_err(LaunchError::Env)?;
    let crds = pko_proto::crds::all().map_err(LaunchError::Crds)?;
    pko_testenv::install_crds(&client, &crds)
        .await
        .map_err(LaunchError::Env)?;
    let hosted = env.simulate_hypershift().await.map_err(LaunchError::Env)?;

    // Ctrl-C or SIGTERM from here on stops everything cleanly, also while the samples roll out.
    let mut terminate = signal(SignalKind::terminate())
        .map_err(|error| LaunchError::Io("SIGTERM handler".into(), error))?;
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|error| LaunchError::Io("SIGINT handler".into(), error))?;
    let stop = async {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    };
    tokio::pin!(stop);

    let manager_bin = manager_path(args.manager.clone())?;
    let in_fleet = args.management_clusters > 1;
    let fleet_names = management_fleet::names(args.management_clusters);
    let fleet_nats = if in_fleet {
        println!(
            "Starting a hub NATS and {} leaf NATS servers for a fleet of management clusters...",
            fleet_names.len()
        );
        Some(
            management_fleet::start_nats(&env, &manager_bin, &fleet_names)
                .await
                .map_err(LaunchError::Manager)?,
        )
    } else {
        None
    };
    // Traces go to OTEL_EXPORTER_OTLP_ENDPOINT when set, else to a receiver of our own that prints a
    // rollout step's span tree at the end (connectors get the manager's settings through their Deployments).
    let receiver = if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() {
        None
    } else {
        Some(OtlpReceiver::start().await.map_err(LaunchError::Env)?)
    };
    let launch = ManagerLaunch {
        env: receiver
            .iter()
            .flat_map(|r| {
                [
                    ("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), r.http_endpoint()),
                    (
                        "OTEL_EXPORTER_OTLP_PROTOCOL".to_owned(),
                        "http/protobuf".to_owned(),
                    ),
                    ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "200".to_owned()),
                ]
            })
            .collect(),
        nats: fleet_nats
            .as_ref()
            .and_then(|nats| nats.leaf(management_fleet::CANARY)),
        ..ManagerLaunch::default()
    };
    let member_args = if in_fleet {
        management_fleet::member_args(management_fleet::CANARY)
    } else {
        Vec::new()
    };
    let member_args: Vec<&str> = member_args.iter().map(String::as_str).collect();
    let manager = env
        .start_manager_with(&manager_bin, &launch, &member_args)
        .await
        .map_err(|e| LaunchError::Manager(e.to_string()))?;
    let prod = match &fleet_nats {
        Some(nats) => management_fleet::start_prod(&env, nats, &manager_bin, &fleet_names)
            .await
            .map_err(LaunchError::Manager)?,
        None => Vec::new(),
    };
    // Prometheus scrapes the manager every second, with pko's alert rules loaded; for a picture of
    // the dashboard every 100 ms, since the samples roll out in about a second, and from before
    // they start.
    let monitoring = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/monitoring");
    let scrape_interval = if args.dashboard_picture.is_some() {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(1)
    };
    let prometheus = Prometheus::start(
        &env.root_dir().join("prometheus"),
        "pko-manager",
        &[format!("127.0.0.1:{}", manager.health_port())],
        &[monitoring.join("pko-alerts.yaml")],
        scrape_interval,
    )
    .await
    .map_err(LaunchError::Env)?;
    let scraping_since = Instant::now();
    if args.dashboard_picture.is_some() {
        wait_until("Prometheus scrapes the manager", SAMPLE_TIMEOUT, || async {
            match prometheus.query("up == 1").await?.len() {
                0 => Err("no scrape yet".to_owned()),
                _ => Ok(()),
            }
        })
        .await
        .map_err(LaunchError::Env)?;
    }
    let env_file = write_env_file(&args.state_dir, &env, &prometheus, fleet_nats.as_ref())?;
    print_summary(&env, &hosted, &env_file, started);
    if let Some(nats) = &fleet_nats {
        println!(
            "  fleet hub NATS        {}  credentials {}",
            nats.hub().url(),
            nats.credentials_file().display()
        );
        for name in &fleet_names {
            let server = prod
                .iter()
                .find(|p| p.name == *name)
                .map(|p| (&p.server, &p.manager));
            let (url, log) = match server {
                Some((server, manager)) => (server.url(), manager.log_path().display().to_string()),
                None => (
                    env.management().url(),
                    manager.log_path().display().to_string(),
                ),
            };
            let leaf = nats.leaf(name).map(|n| n.url()).unwrap_or_default();
            println!("  management cluster {name:<8} apiserver {url}  NATS {leaf}  pko-manager log {log}");
        }
    }
    println!(
        "pko-manager:       pid {}, log {}, metrics http://127.0.0.1:{}/metrics",
        manager.pid().unwrap_or_default(),
        manager.log_path().display(),
        manager.health_port()
    );
    println!(
        "prometheus:        {}  e.g. {}/graph?g0.expr=pko_hostedclusterpackage_packages",
        prometheus.url(),
        prometheus.url()
    );
    // No kubelet here: the runner starts the connector Deployments the manager creates as processes.
    let _runner = env
        .start_connector_runner(&manager_bin.with_file_name("pko-connector"))
        .await
        .map_err(LaunchError::Env)?;
    let samples = async {
        roll_out_sample(
            &env,
            SAMPLE,
            "deploy/examples/object-deployment.yaml",
            Some("pko-sample"),
        )
        .await?;
        roll_out_sample(
            &env,
            HOSTED_SAMPLE,
            "deploy/examples/hosted-object-deployment.yaml",
            None,
        )
        .await?;
        if args.fleet > 0 {
            fleet_rollout::roll_out(&env, args.fleet)
                .await
                .map_err(|e| LaunchError::Sample(format!("{}: {e}", fleet_rollout::SAMPLE_FILE)))?;
            if let Some(nats) = &fleet_nats {
                management_fleet::roll_out(&env, &prod, nats)
                    .await
                    .map_err(|e| {
                        LaunchError::Sample(format!("fleet of management clusters: {e}"))
                    })?;
            }
        }
        Ok::<(), LaunchError>(())
    };
    let stopped_early = tokio::select! {
        result = samples => {
            result?;
            false
        }
        () = &mut stop => true,
    };
    if let (false, Some(receiver), true) = (stopped_early, &receiver, args.fleet > 0) {
        print_rollout_trace(receiver).await;
    }
    if let (false, Some(path)) = (stopped_early, &args.dashboard_picture) {
        draw_dashboard(&prometheus, &monitoring, path, scraping_since.elapsed()).await?;
    }
    if !stopped_early {
        println!("\nCtrl-C stops everything.");
        if args.exit_when_ready {
            return Ok(());
        }
        stop.await;
    }
    println!("Stopping...");
    drop(prometheus);
    drop(prod);
    drop(manager);
    drop(fleet_nats);
    drop(env);
    let _ = std::fs::remove_file(&env_file);
    println!("Stopped.");
    Ok(())
}

fn manager_path(explicit: Option<PathBuf>) -> Result<PathBuf, LaunchError> {
    if let Some(path) = explicit {
        return Ok(path);
    }
    let exe =
        std::env::current_exe().map_err(|e| LaunchError::Io("locate this binary".into(), e))?;
    let sibling = exe.with_file_name("pko-manager");
    let connector = exe.with_file_name("pko-connector");
    match (sibling.exists(), connector.exists()) {
        (true, true) => Ok(sibling),
        (false, _) => Err(LaunchError::Manager(format!(
            "{} not found: build it first (cargo build -p pko-manager -p pko-connector) or pass --manager",
            sibling.display()
        ))),
        (true, false) => Err(LaunchError::Manager(format!(
            "{} not found: build it first (cargo build -p pko-manager -p pko-connector)",
            connector.display()
        ))),
    }
}

/// Applies a sample ObjectDeployment (creating `create_namespace` first) and waits until the manager
/// reports it Available.
async fn roll_out_sample(
    env: &TestEnv,
    yaml: &str,
    file: &str,
    create_namespace: Option<&str>,
) -> Result<(), LaunchError> {
    let sample = |e: String| LaunchError::Sample(e);
    let client = env.management().client().await.map_err(LaunchError::Env)?;
    let od: ObjectDeployment = serde_saphyr::from_str(yaml).map_err(|e| sample(e.to_string()))?;
    let apply = PatchParams::apply("pko-dev-env").force();
    if let Some(name) = create_namespace {
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        namespaces
            .patch(name, &apply, &Patch::Apply(&ns))
            .await
            .map_err(|e| sample(e.to_string()))?;
    }
    let namespace = od.metadata.namespace.clone().unwrap_or_default();
    let name = od.metadata.name.clone().unwrap_or_default();
    let api: Api<ObjectDeployment> = Api::namespaced(client, &namespace);
    api.patch(&name, &apply, &Patch::Apply(&od))
        .await
        .map_err(|e| sample(e.to_string()))?;
    println!("\nSample rollout: ObjectDeployment {namespace}/{name} ({file})");
    let last = std::sync::Arc::new(ProgressLine::default());
    wait_until("sample ObjectDeployment Available", SAMPLE_TIMEOUT, || {
        let api = api.clone();
        let last = last.clone();
        let name = name.clone();
        async move {
            let od = api.get(&name).await.map_err(|e| e.to_string())?;
            let status = od.status.unwrap_or_default();
            let line = status
                .conditions
                .iter()
                .map(|c| format!("{}={} ({})", c.type_, c.status, c.reason))
                .collect::<Vec<_>>()
                .join(", ");
            if !line.is_empty() && last.changed(&line) {
                println!("  revision {}: {line}", status.revision.unwrap_or_default());
            }
            let available = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True");
            if available {
                Ok(())
            } else {
                Err(line)
            }
        }
    })
    .await
    .map_err(|e| sample(e.to_string()))?;
    println!("  see it: source the env file, then kubectl get objectdeployments,objectsets,objectsetphases,configmaps -n {namespace}");
    Ok(())
}

/// The last progress line printed, so progress prints once per change.
#[derive(Default)]
pub(crate) struct ProgressLine(std::sync::Mutex<String>);

impl ProgressLine {
    /// Whether `line` differs from the last one seen (and remember it).
    pub(crate) fn changed(&self, line: &str) -> bool {
        let Ok(mut last) = self.0.lock() else {
            return true;
        };
        if *last == line {
            return false;
        }
        line.clone_into(&mut last);
        true
    }
}

/// Draws the dashboard's panels over the last `window` (the whole run) to `path`.
async fn draw_dashboard(
    prometheus: &Prometheus,
    monitoring: &Path,
    path: &Path,
    window: Duration,
) -> Result<(), LaunchError> {
    let dashboard =
        Dashboard::load(&monitoring.join("pko-dashboard.json")).map_err(LaunchError::Env)?;
    // Panels whose series lived between two scrapes stay empty (the sample rolls out in about a
    // second); a query Prometheus refuses is an error.
    let panels = dashboard
        .fetch(prometheus, window, false)
        .await
        .map_err(LaunchError::Sample)?;
    dashboard.draw(&panels, path).map_err(LaunchError::Env)?;
    println!("\nDashboard drawn to {}", path.display());
    Ok(())
}

fn write_env_file(
    state_dir: &Path,
    env: &TestEnv,
    prometheus: &Prometheus,
    fleet: Option<&pko_testenv::FleetNats>,
) -> Result<PathBuf, LaunchError> {
    std::fs::create_dir_all(state_dir)
        .map_err(|error| LaunchError::Io(format!("create {}", state_dir.display()), error))?;
    let hosted: Vec<String> = env
        .hosted_clusters()
        .iter()
        .map(|server| server.kubeconfig_path().display().to_string())
        .collect();
    let mut text = format!(
        "# written by pko-dev-env; valid while it runs\n# the platform's kubectl first: its version matches the apiservers'\nexport PATH={}:$PATH\nexport KUBECONFIG={}\nexport PKO_HOSTED_KUBECONFIGS={}\nexport PKO_NATS_URL={}\nexport PKO_REGISTRY={}\nexport PKO_PROMETHEUS_URL={}\n",
        pko_testenv::platform_dir().display(),
        env.management().kubeconfig_path().display(),
        hosted.join(":"),
        fleet
            .and_then(|f| f.leaf(management_fleet::CANARY))
            .map_or_else(|| env.nats().url(), |leaf| leaf.url()),
        env.registry().host(),
        prometheus.url(),
    );
    if let Some(fleet) = fleet {
        text.push_str(&format!(
            "export PKO_FLEET_HUB_URL={}\nexport PKO_FLEET_CREDS={}\n",
            fleet.hub().url(),
            fleet.credentials_file().display()
        ));
    }
    let path = state_dir.join("env.sh");
    std::fs::write(&path, text)
        .map_err(|error| LaunchError::Io(format!("write {}", path.display()), error))?;
    Ok(path)
}

fn print_summary(
    env: &TestEnv,
    hosted: &[SimulatedHostedCluster],
    env_file: &Path,
    started: Instant,
) {
    println!("\nReady in {:.1}s.\n", started.elapsed().as_secs_f64());
    println!(
        "  management apiserver  {}  kubeconfig {}",
        env.management().url(),
        env.management().kubeconfig_path().display()
    );
    for (server, cluster) in env.hosted_clusters().iter().zip(hosted) {
        println!(
            "  {:<20}  {}  kubeconfig {}  (HostedCluster {}/{}, HCP namespace {})",
            server.name(),
            server.url(),
            server.kubeconfig_path().display(),
            cluster.namespace,
            cluster.name,
            cluster.hcp_namespace
        );
    }
    println!("  nats (JetStream)      {}", env.nats().url());
    println!(
        "  OCI registry          {} (plain HTTP)",
        env.registry().host()
    );
    println!("  etcd                  {}", env.etcd_url());
    println!("  logs and data         {}", env.root_dir().display());
    println!("\nIn another shell:\n  source {}\n  kubectl get objectdeployments,objectsets -n pko-sample\n  kubectl get hostedclusters -A\n", env_file.display());
}

/// The span tree of one rollout step of the sample fleet rollout, as the receiver got it.
async fn print_rollout_trace(receiver: &OtlpReceiver) {
    let found = wait_until(
        "a rollout step's trace",
        Duration::from_secs(10),
        || async {
            let spans = receiver.spans();
            let step = spans
                .iter()
                .filter(|s| s.name == "rollout step")
                .max_by_key(|s| s.start_unix_nanos)
                .ok_or("no rollout step traced yet")?;
            let trace = receiver.trace(&step.trace_id);
            // A phase span ends after its applies, so once it is here the path down to them is.
            if trace.iter().any(|s| s.attribute("pko.phase").is_some()) {
                Ok((step.trace_id.clone(), trace))
            } else {
                Err("the step's trace has not reached its phases yet".to_owned())
            }
        },
    )
    .await;
    match found {
        Ok((trace_id, spans)) => {
            println!("\nOne rollout step as a trace (trace id {trace_id}):");
            print!("{}", span_tree(&spans));
        }
        Err(e) => println!("\nNo rollout step trace to show: {e}"),
    }
}

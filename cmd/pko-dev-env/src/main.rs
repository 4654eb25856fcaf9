//! `pko-dev-env`: the local environment. Starts a management kube-apiserver (with kube-controller-manager),
//! hosted-cluster kube-apiservers registered as HyperShift HostedClusters, nats-server with JetStream and
//! an OCI registry; installs pko's CRDs; prints how to reach everything and writes it to an env file;
//! runs until interrupted, then stops every server.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Parser;
use pko_testenv::{EnvConfig, SimulatedHostedCluster, TestEnv};
use tokio::signal::unix::{signal, SignalKind};

/// Runs the local pko environment.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Number of hosted clusters (each its own kube-apiserver).
    #[arg(long, default_value_t = 2)]
    hosted_clusters: usize,
    /// Where to write `env.sh` (KUBECONFIG and friends).
    #[arg(long, default_value = ".pko-dev")]
    state_dir: PathBuf,
    /// Stop as soon as everything is ready (for checking the setup).
    #[arg(long)]
    exit_when_ready: bool,
}

#[derive(Debug)]
enum LaunchError {
    Env(pko_testenv::TestEnvError),
    Crds(pko_proto::core::CrdError),
    Io(String, std::io::Error),
}

impl std::fmt::Display for LaunchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Env(error) => write!(f, "{error}"),
            Self::Crds(error) => write!(f, "{error}"),
            Self::Io(what, error) => write!(f, "{what}: {error}"),
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
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

    let env_file = write_env_file(&args.state_dir, &env)?;
    print_summary(&env, &hosted, &env_file, started);
    if args.exit_when_ready {
        return Ok(());
    }

    let mut terminate = signal(SignalKind::terminate())
        .map_err(|error| LaunchError::Io("SIGTERM handler".into(), error))?;
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|error| LaunchError::Io("SIGINT handler".into(), error))?;
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    println!("Stopping...");
    drop(env);
    let _ = std::fs::remove_file(&env_file);
    println!("Stopped.");
    Ok(())
}

fn write_env_file(state_dir: &Path, env: &TestEnv) -> Result<PathBuf, LaunchError> {
    std::fs::create_dir_all(state_dir)
        .map_err(|error| LaunchError::Io(format!("create {}", state_dir.display()), error))?;
    let hosted: Vec<String> = env
        .hosted_clusters()
        .iter()
        .map(|server| server.kubeconfig_path().display().to_string())
        .collect();
    let text = format!(
        "# written by pko-dev-env; valid while it runs\nexport KUBECONFIG={}\nexport PKO_HOSTED_KUBECONFIGS={}\nexport PKO_NATS_URL={}\nexport PKO_REGISTRY={}\n",
        env.management().kubeconfig_path().display(),
        hosted.join(":"),
        env.nats().url(),
        env.registry().host(),
    );
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
    println!("\nIn another shell:\n  source {}\n  kubectl apply -f deploy/crds/\n  kubectl get hostedclusters -A\n", env_file.display());
    println!("Ctrl-C stops everything.");
}

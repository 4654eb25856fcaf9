//! A whole environment: start-up order, timings, teardown, and the per-test-binary shared instance.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::apiserver::{self, ApiServer};
use crate::binaries::Binaries;
use crate::error::{io_error, TestEnvError};
use crate::nats::{self, Nats};
use crate::process::ManagedProcess;
use crate::registry::{self, Registry};
use crate::workdir::{new_root_dir, start_on_own_runtime, KEPT_MARKER};
use crate::{controller_manager, etcd};

/// What to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvConfig {
    /// Number of hosted-cluster apiservers (`hosted-0`, `hosted-1`, ...).
    pub hosted_clusters: usize,
    /// Whether to run kube-controller-manager against the management apiserver.
    pub controller_manager: bool,
}

impl Default for EnvConfig {
    /// What [`shared()`] starts: two hosted clusters and the controller manager.
    fn default() -> Self {
        Self {
            hosted_clusters: 2,
            controller_manager: true,
        }
    }
}

/// How long each part of the start took.
#[derive(Clone, Debug, Default)]
pub struct StartupTimings {
    /// etcd until healthy.
    pub etcd: Duration,
    /// nats-server until JetStream answers.
    pub nats: Duration,
    /// Registry until `/v2/` answers.
    pub registry: Duration,
    /// All apiservers until every `/readyz` is ok (they start in parallel).
    pub apiservers: Duration,
    /// kube-controller-manager until its controllers act.
    pub controller_manager: Duration,
    /// The whole start.
    pub total: Duration,
}

/// A running environment. Dropping it stops every server and removes its files.
#[derive(Debug)]
pub struct TestEnv {
    root: PathBuf,
    controller_manager: Option<ManagedProcess>,
    management: ApiServer,
    hosted: Vec<ApiServer>,
    nats: Nats,
    registry: Registry,
    authenticated_registry: Registry,
    etcd: etcd::Etcd,
    timings: StartupTimings,
    /// The admin token every apiserver of the environment accepts.
    token: String,
    /// Whether dropping the environment leaves its files (logs, audit logs) for a look afterwards.
    keep_files: std::sync::atomic::AtomicBool,
}

impl TestEnv {
    /// Starts everything `config` asks for. Independent servers start in parallel.
    pub async fn start(config: EnvConfig) -> Result<Self, TestEnvError> {
        let started = Instant::now();
        let binaries = Binaries::locate()?;
        let root = new_root_dir()?;
        let result = start_in(&binaries, &root, &config, started).await;
        if result.is_err() {
            // The servers started so far were stopped when their handles dropped.
            let _ = std::fs::remove_dir_all(&root);
        }
        result
    }

    /// Leaves the environment's files (every server's log, the audit logs) when it is dropped, and marks
    /// them so a later environment's clean-up of dead owners' directories spares them; returns where.
    pub fn keep_files(&self) -> Result<&Path, TestEnvError> {
        let marker = self.root.join(KEPT_MARKER);
        std::fs::write(&marker, b"").map_err(io_error("write", &marker))?;
        self.keep_files
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(&self.root)
    }

    /// The management cluster's apiserver.
    pub fn management(&self) -> &ApiServer {
        &self.management
    }

    /// The hosted clusters' apiservers.
    pub fn hosted_clusters(&self) -> &[ApiServer] {
        &self.hosted
    }

    /// nats-server.
    pub fn nats(&self) -> &Nats {
        &self.nats
    }

    /// OCI registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// OCI registry behind basic auth (see `Registry::credentials`).
    pub fn authenticated_registry(&self) -> &Registry {
        &self.authenticated_registry
    }

    /// `http://127.0.0.1:<port>` of etcd.
    pub fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.etcd.client_port)
    }

    /// Whether kube-controller-manager runs.
    /// Starts one more kube-apiserver on the environment's etcd (a prefix of its own), named `name` (a
    /// management cluster of a fleet). It stops when the handle drops.
    pub async fn start_apiserver(&self, name: &str) -> Result<ApiServer, TestEnvError> {
        let binaries = Binaries::locate()?;
        let shared = apiserver::Shared {
            binaries: &binaries,
            etcd_port: self.etcd.client_port,
            service_account_key: &self.root.join("sa.key"),
            service_account_public_key: &self.root.join("sa.pub"),
            token_file: &self.root.join("tokens.csv"),
            token: &self.token,
        };
        apiserver::start(&shared, name, &self.root.join(name)).await
    }

    pub fn has_controller_manager(&self) -> bool {
        self.controller_manager.is_some()
    }

    /// Directory holding every server's data, configuration and log.
    pub fn root_dir(&self) -> &Path {
        &self.root
    }

    /// How long the start took, per part.
    pub fn timings(&self) -> &StartupTimings {
        &self.timings
    }

    /// Process ids of every server, with their names (for resource measurements).
    pub fn processes(&self) -> Vec<(String, u32)> {
        let mut processes = vec![("etcd".to_owned(), self.etcd.process.pid())];
        processes.push((self.management.name().to_owned(), self.management.pid()));
        processes.extend(
            self.hosted
                .iter()
                .map(|server| (server.name().to_owned(), server.pid())),
        );
        if let Some(manager) = &self.controller_manager {
            processes.push(("kube-controller-manager".to_owned(), manager.pid()));
        }
        processes.push(("nats-server".to_owned(), self.nats.process.pid()));
        processes.push(("docker-registry".to_owned(), self.registry.process.pid()));
        processes.push((
            "docker-registry (auth)".to_owned(),
            self.authenticated_registry.process.pid(),
        ));
        processes
            .into_iter()
            .filter_map(|(name, pid)| pid.map(|pid| (name, pid)))
            .collect()
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        // Clients of etcd first, so nothing logs about a vanished etcd; then the files.
        if let Some(manager) = &self.controller_manager {
            manager.stop();
        }
        self.management.process.stop();
        for server in &self.hosted {
            server.process.stop();
        }
        self.nats.process.stop();
        self.registry.process.stop();
        self.authenticated_registry.process.stop();
        self.etcd.process.stop();
        if !self.keep_files.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

async fn start_in(
    binaries: &Binaries,
    root: &Path,
    config: &EnvConfig,
    started: Instant,
) -> Result<TestEnv, TestEnvError> {
    let mut timings = StartupTimings::default();
    let token = format!(
        "pko-{}-{}",
        std::process::id(),
        started.elapsed().as_nanos()
    );
    let token_file = root.join("tokens.csv");
    std::fs::write(&token_file, format!("{token},admin,admin,system:masters\n"))
        .map_err(io_error("write", &token_file))?;
    let (key, public_key) = (root.join("sa.key"), root.join("sa.pub"));

    let timed = |since: Instant| since.elapsed();
    let (etcd, nats, registry, keys) = tokio::join!(
        async {
            let t = Instant::now();
            etcd::start(binaries, root)
                .await
                .map(|etcd| (etcd, timed(t)))
        },
        async {
            let t = Instant::now();
            nats::start(binaries, root)
                .await
                .map(|nats| (nats, timed(t)))
        },
        async {
            let t = Instant::now();
            let (open, authenticated) = tokio::join!(
                registry::start(binaries, root, false),
                registry::start(binaries, root, true)
            );
            Ok::<_, TestEnvError>(((open?, authenticated?), timed(t)))
        },
        service_account_keys(binaries, &key, &public_key),
    );
    let (etcd, nats, registry) = (etcd?, nats?, registry?);
    let ((registry, authenticated_registry), registry_time) = registry;
    let registry = (registry, registry_time);
    keys?;
    (timings.etcd, timings.nats, timings.registry) = (etcd.1, nats.1, registry.1);

    let shared = apiserver::Shared {
        binaries,
        etcd_port: etcd.0.client_port,
        service_account_key: &key,
        service_account_public_key: &public_key,
        token_file: &token_file,
        token: &token,
    };
    let apiservers_started = Instant::now();
    let names: Vec<String> = std::iter::once("management".to_owned())
        .chain((0..config.hosted_clusters).map(|index| format!("hosted-{index}")))
        .collect();
    let dirs: Vec<PathBuf> = names.iter().map(|name| root.join(name)).collect();
    let servers = futures::future::join_all(
        names
            .iter()
            .zip(&dirs)
            .map(|(name, dir)| apiserver::start(&shared, name, dir)),
    )
    .await;
    let mut servers = servers
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .into_iter();
    timings.apiservers = apiservers_started.elapsed();
    let management = servers
        .next()
        .ok_or_else(|| TestEnvError::SharedStartFailed("no management apiserver".into()))?;
    let hosted: Vec<ApiServer> = servers.collect();

    let controller_manager = if config.controller_manager {
        let t = Instant::now();
        // The garbage collector learns of new resources on a 30 s discovery tick. CRDs installed after
        // it started (the manager's `--install-crds`) can land on both sides of one tick, and until the
        // next the collector knows ObjectDeployments but not their ObjectSets: a foreground deletion
        // then finds no dependent to wait for and leaves the sets behind (CI, `object_deployment.rs`).
        // Installed first, every pko kind is in the collector's first discovery.
        crate::crds::install_pko_crds(&management.client().await?).await?;
        let process =
            controller_manager::start(binaries, &management, &root.join("management")).await?;
        timings.controller_manager = t.elapsed();
        Some(process)
    } else {
        None
    };
    timings.total = started.elapsed();
    tracing::info!(?timings, root = %root.display(), "test environment ready");
    Ok(TestEnv {
        root: root.to_owned(),
        controller_manager,
        management,
        hosted,
        nats: nats.0,
        registry: registry.0,
        authenticated_registry,
        etcd: etcd.0,
        timings,
        token,
        keep_files: std::sync::atomic::AtomicBool::new(false),
    })
}

/// The ECDSA key pair apiservers sign and verify service-account tokens with.
async fn service_account_keys(
    binaries: &Binaries,
    key: &Path,
    public_key: &Path,
) -> Result<(), TestEnvError> {
    let key_arg = key.display().to_string();
    let public_arg = public_key.display().to_string();
    run(
        &binaries.openssl,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            &key_arg,
        ],
    )
    .await?;
    run(
        &binaries.openssl,
        &["ec", "-in", &key_arg, "-pubout", "-out", &public_arg],
    )
    .await
}

async fn run(program: &Path, args: &[&str]) -> Result<(), TestEnvError> {
    let command = format!("{} {}", program.display(), args.join(" "));
    let output = tokio::process::Command::new(program)
        .args(args)
        .output()
        .await
        .map_err(|error| TestEnvError::Command {
            command: command.clone(),
            detail: error.to_string(),
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(TestEnvError::Command {
            command,
            detail: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }
}

/// The environment every test of this test binary shares ([`EnvConfig::default`]), started by the first
/// caller. Blocks while it starts; later callers get it at once. Its servers stop when the test binary
/// exits. Tests take their own clients from it and work in their own namespaces.
pub fn shared() -> Result<&'static TestEnv, TestEnvError> {
    shared_with(EnvConfig::default())
}

/// [`shared()`] with another configuration, for a test binary whose every test calls this first (the
/// first caller's configuration wins).
pub fn shared_with(config: EnvConfig) -> Result<&'static TestEnv, TestEnvError> {
    static SHARED: OnceLock<Result<TestEnv, String>> = OnceLock::new();
    SHARED
        .get_or_init(|| start_on_own_runtime(move || TestEnv::start(config)))
        .as_ref()
        .map_err(|message| TestEnvError::SharedStartFailed(message.clone()))
}

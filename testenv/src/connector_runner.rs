//! The connector runner: this environment has no kubelet, so the runner plays its part for connector
//! Deployments only. It watches the Deployments labelled `package-operator.run/connector=True` on the
//! management apiserver and, for each, runs one pko-connector process with the container's arguments, its
//! Secret volumes written to host directories standing in for the mount paths, and `POD_NAMESPACE` /
//! `POD_NAME` as the Downward API would set them. Like a kubelet it restarts a process that died or whose
//! Deployment changed, stops it when the Deployment goes, and retries a Deployment whose Secret is not
//! there yet. In a real cluster nothing of this runs.

use pko_proto::well_known::CONNECTOR_LABEL;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use tokio::sync::oneshot;

use crate::apiserver::ApiServer;
use crate::connector::{spawn_connector_in, ConnectorLaunch, ConnectorProcess};
use crate::env::TestEnv;
use crate::error::TestEnvError;

/// How often dead processes are noticed and restarted.
const LIVENESS_INTERVAL: Duration = Duration::from_millis(500);

/// The process id of each connector running now, by its Deployment's namespace and name.
type RunningPids = Arc<Mutex<BTreeMap<(String, String), u32>>>;

/// Runs connector Deployments as host processes until dropped (which kills them) or stopped.
pub struct ConnectorRunner {
    /// `Some(grace)`: terminate the connectors as a kubelet would; `None`: kill them.
    stop: Option<oneshot::Sender<Option<Duration>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pids: RunningPids,
}

impl std::fmt::Debug for ConnectorRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectorRunner").finish_non_exhaustive()
    }
}

impl ConnectorRunner {
    /// The process id of each connector running now, by its Deployment's namespace and name: for a
    /// test that kills or freezes one (the runner starts a killed one again, as a kubelet would).
    pub fn pids(&self) -> BTreeMap<(String, String), u32> {
        self.pids
            .lock()
            .map(|pids| pids.clone())
            .unwrap_or_default()
    }

    /// Sends `signal` (`-KILL`, `-STOP`, `-CONT`) to the connector of Deployment `namespace/name`.
    pub fn signal(&self, deployment: &(String, String), signal: &str) -> Result<(), TestEnvError> {
        let name = format!("connector {}/{}", deployment.0, deployment.1);
        let pid = self
            .pids()
            .get(deployment)
            .copied()
            .ok_or_else(|| TestEnvError::Exited {
                name: name.clone(),
                status: "not running".to_owned(),
                log_tail: String::new(),
            })?;
        crate::process::signal_process(&name, pid, signal, String::new)
    }

    /// Stops every connector as a kubelet deleting its pod would (SIGTERM, SIGKILL after `grace`), so they
    /// shut down cleanly (release their Lease, flush their traces), and stops the runner.
    pub fn stop(mut self, grace: Duration) {
        self.finish(Some(grace));
    }

    fn finish(&mut self, grace: Option<Duration>) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(grace);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for ConnectorRunner {
    fn drop(&mut self) {
        self.finish(None);
    }
}

struct Running {
    /// The Deployment's pod template and Secrets as last started.
    fingerprint: String,
    launch: ConnectorLaunch,
    process: ConnectorProcess,
}

struct Runner {
    client: Client,
    /// Deployments waiting for a Secret they mount: tried again each liveness tick, as a kubelet
    /// retries a volume.
    waiting: HashMap<(String, String), Deployment>,
    pids: RunningPids,
    /// URL of the management apiserver, for the ServiceAccount kubeconfigs.
    server: String,
    dir: PathBuf,
    binary: PathBuf,
    /// Set on every connector after the Deployment's own variables (overriding them).
    env_overrides: Vec<(String, String)>,
    running: HashMap<(String, String), Running>,
}

impl TestEnv {
    /// Starts the connector runner for `binary` (a pko-connector build) on its own thread.
    pub async fn start_connector_runner(
        &self,
        binary: &Path,
    ) -> Result<ConnectorRunner, TestEnvError> {
        self.start_connector_runner_with(binary, Vec::new()).await
    }

    /// Like [`TestEnv::start_connector_runner`], with environment variables that override what the
    /// Deployments set (another trace endpoint or protocol, say).
    pub async fn start_connector_runner_with(
        &self,
        binary: &Path,
        env_overrides: Vec<(String, String)>,
    ) -> Result<ConnectorRunner, TestEnvError> {
        self.start_connector_runner_on(self.management(), binary, env_overrides)
            .await
    }

    /// Like [`TestEnv::start_connector_runner_with`], for the connector Deployments of `management`
    /// (another apiserver playing a management cluster of a fleet).
    pub async fn start_connector_runner_on(
        &self,
        management: &ApiServer,
        binary: &Path,
        env_overrides: Vec<(String, String)>,
    ) -> Result<ConnectorRunner, TestEnvError> {
        let dir = self
            .root_dir()
            .join(format!("connector-runner-{}", management.name()));
        std::fs::create_dir_all(&dir).map_err(crate::error::io_error("create", &dir))?;
        let kubeconfig = management.kubeconfig_path().to_owned();
        let name = management.name().to_owned();
        let server = management.url();
        let binary = binary.to_owned();
        let pids = RunningPids::default();
        let runner_pids = pids.clone();
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("connector-runner".into())
            .spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    tracing::error!("connector runner: cannot build a runtime");
                    return;
                };
                runtime.block_on(async move {
                    // The client is made on this thread's runtime: one made on the caller's would need
                    // the caller's runtime to serve every request, and a caller blocked in dropping the
                    // runner (which joins this thread) would then wait forever.
                    let client = match crate::kubeconfig::client(&kubeconfig, &name).await {
                        Ok(client) => client,
                        Err(e) => {
                            tracing::error!(error = %e, "connector runner: no client");
                            return;
                        }
                    };
                    let mut runner = Runner {
                        client,
                        waiting: HashMap::new(),
                        pids: runner_pids,
                        server,
                        dir,
                        binary,
                        env_overrides,
                        running: HashMap::new(),
                    };
                    runner.run(stopped).await;
                });
            })
            .map_err(|source| TestEnvError::Spawn {
                name: "connector-runner".into(),
                source,
            })?;
        Ok(ConnectorRunner {
            stop: Some(stop),
            thread: Some(thread),
            pids,
        })
    }
}

/// Why a connector Deployment is not run (yet).
enum NotRun {
    /// A Secret it mounts does not exist.
    MissingSecret(String),
    Failed(String),
}

impl From<String> for NotRun {
    fn from(message: String) -> Self {
        Self::Failed(message)
    }
}

impl From<&str> for NotRun {
    fn from(message: &str) -> Self {
        Self::Failed(message.to_owned())
    }
}

impl Runner {
    async fn run(&mut self, mut stopped: oneshot::Receiver<Option<Duration>>) {
        let api: Api<Deployment> = Api::all(self.client.clone());
        let config = watcher::Config::default().labels(&format!("{CONNECTOR_LABEL}=True"));
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        let mut liveness = tokio::time::interval(LIVENESS_INTERVAL);
        loop {
            tokio::select! {
                stop = &mut stopped => {
                    if let Ok(Some(grace)) = stop {
                        let running = std::mem::take(&mut self.running);
                        futures::future::join_all(
                            running.values().map(|r| r.process.terminate(grace)),
                        )
                        .await;
                    }
                    return;
                }
                event = events.next() => match event {
                    Some(Ok(Event::Apply(d))) | Some(Ok(Event::InitApply(d))) => self.ensure(&d).await,
                    Some(Ok(Event::Delete(d))) => {
                        self.waiting.remove(&key(&d));
                        self.running.remove(&key(&d));
                        self.publish_pids();
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => tracing::warn!(error = %e, "connector runner: watch error"),
                    None => return,
                },
                _ = liveness.tick() => {
                    self.restart_dead();
                    for deployment in self.waiting.clone().into_values() {
                        self.ensure(&deployment).await;
                    }
                }
            }
        }
    }

    fn restart_dead(&mut self) {
        for (key, running) in &mut self.running {
            if running.process.check_running().is_err() {
                tracing::info!(namespace = %key.0, "connector runner: restarting a dead connector");
                match spawn_connector_in(&self.dir, &self.binary, &running.launch) {
                    Ok(process) => running.process = process,
                    Err(e) => tracing::warn!(error = %e, "connector runner: restart failed"),
                }
            }
        }
        self.publish_pids();
    }

    fn publish_pids(&self) {
        if let Ok(mut pids) = self.pids.lock() {
            *pids = self
                .running
                .iter()
                .filter_map(|(key, running)| Some((key.clone(), running.process.pid()?)))
                .collect();
        }
    }

    async fn ensure(&mut self, deployment: &Deployment) {
        let key = key(deployment);
        self.waiting.remove(&key);
        match self.launch(deployment).await {
            Ok((fingerprint, launch)) => {
                if self
                    .running
                    .get(&key)
                    .is_some_and(|r| r.fingerprint == fingerprint)
                {
                    return;
                }
                // Like a rollout: the old process goes before the new one starts.
                self.running.remove(&key);
                match spawn_connector_in(&self.dir, &self.binary, &launch) {
                    Ok(process) => {
                        tracing::info!(namespace = %key.0, "connector runner: started a connector");
                        self.running.insert(
                            key,
                            Running {
                                fingerprint,
                                launch,
                                process,
                            },
                        );
                    }
                    Err(e) => tracing::warn!(error = %e, "connector runner: start failed"),
                }
                self.publish_pids();
            }
            // Like a pod waiting for its volume; simulated HostedClusters have no hosted apiserver, so
            // no kubeconfig Secret, and nothing to connect to.
            Err(NotRun::MissingSecret(what)) => {
                tracing::debug!(namespace = %key.0, %what, "connector runner: waiting for a Secret");
                self.waiting.insert(key, deployment.clone());
            }
            Err(NotRun::Failed(e)) => {
                tracing::warn!(namespace = %key.0, error = %e, "connector runner: cannot run")
            }
        }
    }

    /// The process a Deployment describes: its first container's args with each Secret mount path
    /// replaced by a host directory holding that Secret's keys.
    async fn launch(&self, deployment: &Deployment) -> Result<(String, ConnectorLaunch), NotRun> {
        let (namespace, name) = key(deployment);
        let pod = deployment
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.as_ref())
            .ok_or("no pod template")?;
        let container = pod.containers.first().ok_or("no container")?;
        let mut args = container.args.clone().unwrap_or_default();
        let mut fingerprint = serde_json::to_string(&deployment.spec.as_ref().map(|s| &s.template))
            .map_err(|e| e.to_string())?;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
        for mount in container.volume_mounts.iter().flatten() {
            let Some(secret_name) = pod
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == mount.name)
                .and_then(|v| v.secret.as_ref())
                .and_then(|s| s.secret_name.clone())
            else {
                continue;
            };
            let secret = secrets
                .get_opt(&secret_name)
                .await
                .map_err(|e| format!("Secret {namespace}/{secret_name}: {e}"))?
                .ok_or_else(|| NotRun::MissingSecret(format!("{namespace}/{secret_name}")))?;
            let dir = self.dir.join(&namespace).join(&mount.name);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            for (file, bytes) in secret.data.iter().flatten() {
                let path = dir.join(file);
                std::fs::write(&path, &bytes.0).map_err(|e| format!("{}: {e}", path.display()))?;
                fingerprint.push_str(&format!("{file}={:?}", bytes.0));
            }
            let host = dir.display().to_string();
            for arg in &mut args {
                *arg = arg.replace(&mount.mount_path, &host);
            }
        }
        // Plain values as a kubelet would set them (the Downward API ones are set by the launch).
        let mut env: Vec<(String, String)> = container
            .env
            .iter()
            .flatten()
            .filter_map(|var| Some((var.name.clone(), var.value.clone()?)))
            .filter(|(name, _)| !self.env_overrides.iter().any(|(n, _)| n == name))
            .chain(self.env_overrides.iter().cloned())
            .collect();
        if let Some(account) = &pod.service_account_name {
            let kubeconfig = self.service_account_kubeconfig(&namespace, account).await?;
            env.push(("KUBECONFIG".to_owned(), kubeconfig.display().to_string()));
        }
        Ok((
            fingerprint,
            ConnectorLaunch {
                namespace,
                connector_id: format!("{name}-runner"),
                args,
                env,
            },
        ))
    }

    /// A kubeconfig with a token of the pod's ServiceAccount: what a pod gets in-cluster, so the connector
    /// runs with exactly the permissions its Role grants.
    async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        account: &str,
    ) -> Result<PathBuf, String> {
        let path = self.dir.join(namespace).join("service-account.kubeconfig");
        crate::kubeconfig::for_service_account(&self.client, &self.server, namespace, account, &path)
            .await
            .map_err(|e| e.to_string())?;
        Ok(path)
    }
}

fn key(deployment: &Deployment) -> (String, String) {
    (
        deployment.metadata.namespace.clone().unwrap_or_default(),
        deployment.metadata.name.clone().unwrap_or_default(),
    )
}

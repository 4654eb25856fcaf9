//! kube-apiserver processes: the management cluster's and one per simulated hosted cluster.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::binaries::Binaries;
use crate::error::{io_error, TestEnvError};
use crate::kubeconfig;
use crate::net::free_port;
use crate::process::{start_with_retries, ManagedProcess};

const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// A running kube-apiserver with an admin kubeconfig.
#[derive(Debug)]
pub struct ApiServer {
    name: String,
    pub(crate) process: ManagedProcess,
    port: u16,
    kubeconfig: PathBuf,
    namespaces_created: AtomicU64,
    /// The command line, to start the server again on the same port and etcd prefix.
    command: (PathBuf, Vec<OsString>),
}

/// What every apiserver of an environment shares.
pub(crate) struct Shared<'a> {
    pub(crate) binaries: &'a Binaries,
    pub(crate) etcd_port: u16,
    pub(crate) service_account_key: &'a Path,
    pub(crate) service_account_public_key: &'a Path,
    pub(crate) token_file: &'a Path,
    pub(crate) token: &'a str,
}

impl ApiServer {
    /// Name within the environment: `management`, `hosted-0`, `hosted-1`, ...
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Admin kubeconfig (usable by kubectl and by kube clients).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Path of the server's log.
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// Process id of the server.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Kills kube-apiserver (SIGKILL): its clients get refused connections until [`ApiServer::restart`].
    pub fn kill(&self) {
        self.process.stop();
    }

    /// Kills kube-apiserver (SIGKILL) and starts it again with the same flags, port and etcd data, then
    /// waits until it is ready. Its watch cache starts afresh at the current etcd revision, so a client
    /// that resumes a watch from an older resourceVersion gets 410 Gone and must re-list.
    pub async fn restart(&self) -> Result<(), TestEnvError> {
        let (binary, args) = &self.command;
        let mut command = Command::new(binary);
        command.args(args);
        self.process.respawn(command)?;
        let client = self.client().await?;
        wait_api_ready(&self.process, &client).await
    }

    /// The apiserver's audit log (JSON lines): every write to pko's kinds, with its user agent.
    pub fn audit_log_path(&self) -> std::path::PathBuf {
        self.kubeconfig.with_file_name(AUDIT_LOG)
    }

    /// A new admin client. Clients are bound to the async runtime that uses them first, so each test
    /// takes its own.
    pub async fn client(&self) -> Result<kube::Client, TestEnvError> {
        kubeconfig::client(&self.kubeconfig, &self.name).await
    }

    /// A kubeconfig for this apiserver with a token of the ServiceAccount `namespace/account`, written
    /// beside the admin kubeconfig: to run a process with exactly that account's permissions.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        account: &str,
    ) -> Result<std::path::PathBuf, TestEnvError> {
        let path = self
            .kubeconfig
            .with_file_name(format!("{namespace}-{account}.kubeconfig"));
        kubeconfig::for_service_account(&self.client().await?, &self.url(), namespace, account, &path)
            .await?;
        Ok(path)
    }

    /// Creates a namespace named `<prefix>-<n>`, unique within this environment, for a test to work in.
    pub async fn create_namespace(&self, prefix: &str) -> Result<String, TestEnvError> {
        let number = self.namespaces_created.fetch_add(1, Ordering::Relaxed);
        let suffix = format!("-{number}");
        let prefix: String = prefix
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(63 - suffix.len())
            .collect();
        let name = format!("{}{suffix}", prefix.trim_matches('-'));
        let namespaces: Api<Namespace> = Api::all(self.client().await?);
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("pko.test/namespace".to_owned(), "true".to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .map_err(|error| TestEnvError::Kube {
                server: self.name.clone(),
                source: Box::new(error),
            })?;
        Ok(name)
    }
}

/// The audit log's file name beside the kubeconfig.
const AUDIT_LOG: &str = "audit.log";

/// Writes to pko's kinds (who, what, when; no bodies), and the patches of Leases that record a shard
/// take-over (renewals are updates, left out): tests audit which process wrote what.
const AUDIT_POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
  verbs: ["create", "update", "patch", "delete"]
  resources:
  - group: package-operator.run
- level: Metadata
  verbs: ["patch"]
  resources:
  - group: coordination.k8s.io
    resources: ["leases"]
- level: None
"#;

pub(crate) async fn start(
    shared: &Shared<'_>,
    name: &str,
    dir: &Path,
) -> Result<ApiServer, TestEnvError> {
    std::fs::create_dir_all(dir).map_err(io_error("create directory", dir))?;
    let kubeconfig_path = dir.join("kubeconfig");
    let audit_policy = dir.join("audit-policy.yaml");
    std::fs::write(&audit_policy, AUDIT_POLICY).map_err(io_error("write", &audit_policy))?;
    let etcd_url = format!("http://127.0.0.1:{}", shared.etcd_port);
    start_with_retries(|_| {
        let kubeconfig_path = kubeconfig_path.clone();
        let etcd_url = etcd_url.clone();
        let audit_policy = audit_policy.clone();
        async move {
            let port = free_port().map_err(io_error("allocate port", dir))?;
            let mut command = Command::new(&shared.binaries.kube_apiserver);
            command
                .arg(format!("--etcd-servers={etcd_url}"))
                .arg(format!("--etcd-prefix=/pko/{name}"))
                .arg(format!("--secure-port={port}"))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--cert-dir={}", dir.join("certs").display()))
                .arg("--service-account-issuer=https://kubernetes.default.svc")
                .arg(format!(
                    "--service-account-key-file={}",
                    shared.service_account_public_key.display()
                ))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    shared.service_account_key.display()
                ))
                .arg(format!("--token-auth-file={}", shared.token_file.display()))
                .arg("--authorization-mode=RBAC")
                .arg("--service-cluster-ip-range=10.0.0.0/24")
                // Loopback cannot be advertised in Endpoints; nothing here needs the kubernetes Service.
                .arg("--endpoint-reconciler-type=none")
                .arg("--enable-priority-and-fairness=false")
                .arg("--profiling=false")
                .arg(format!("--audit-policy-file={}", audit_policy.display()))
                .arg(format!("--audit-log-path={}", dir.join(AUDIT_LOG).display()));
            let command_line = (
                shared.binaries.kube_apiserver.clone(),
                command.get_args().map(ToOwned::to_owned).collect(),
            );
            let process = ManagedProcess::spawn(name, command, &dir.join("kube-apiserver.log"))?;
            let server = format!("https://127.0.0.1:{port}");
            kubeconfig::write(&kubeconfig_path, name, &server, shared.token)?;
            let client = kubeconfig::client(&kubeconfig_path, name).await?;
            wait_api_ready(&process, &client).await?;
            Ok(ApiServer {
                name: name.to_owned(),
                process,
                port,
                kubeconfig: kubeconfig_path,
                namespaces_created: AtomicU64::new(0),
                command: command_line,
            })
        }
    })
    .await
}

/// Waits until the apiserver answers `/readyz` with `ok`.
async fn wait_api_ready(process: &ManagedProcess, client: &kube::Client) -> Result<(), TestEnvError> {
    process
        .wait_ready(READY_TIMEOUT, || {
            let client = client.clone();
            async move {
                let request = http::Request::get("/readyz")
                    .body(Vec::new())
                    .map_err(|error| error.to_string())?;
                match client.request_text(request).await {
                    Ok(body) if body.trim() == "ok" => Ok(()),
                    Ok(body) => Err(format!("/readyz: {body}")),
                    Err(error) => Err(format!("/readyz: {error}")),
                }
            }
        })
        .await
}

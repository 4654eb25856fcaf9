//! kube-controller-manager for the management apiserver: only the controllers tests rely on (garbage
//! collection of owned objects, namespace deletion, default ServiceAccounts, and Deployment/ReplicaSet
//! status so packages can probe a Deployment's Available condition; aggregated ClusterRoles, as pko's
//! managed-objects role is; there is no scheduler or kubelet).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::Api;

use crate::apiserver::ApiServer;
use crate::binaries::Binaries;
use crate::error::TestEnvError;
use crate::process::ManagedProcess;

const READY_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) async fn start(
    binaries: &Binaries,
    management: &ApiServer,
    dir: &Path,
) -> Result<ManagedProcess, TestEnvError> {
    let mut command = Command::new(&binaries.kube_controller_manager);
    command
        .arg(format!(
            "--kubeconfig={}",
            management.kubeconfig_path().display()
        ))
        .arg("--leader-elect=false")
        .arg("--controllers=garbagecollector,namespace,serviceaccount,deployment,replicaset,clusterrole-aggregation")
        .arg("--secure-port=0")
        .arg("--use-service-account-credentials=false");
    let process = ManagedProcess::spawn(
        "kube-controller-manager",
        command,
        &dir.join("kube-controller-manager.log"),
    )?;
    let client = management.client().await?;
    // The serviceaccount controller creating `default/default` shows the controllers are running.
    let service_accounts: Api<ServiceAccount> = Api::namespaced(client, "default");
    process
        .wait_ready(READY_TIMEOUT, || {
            let service_accounts = service_accounts.clone();
            async move {
                match service_accounts.get_opt("default").await {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err("ServiceAccount default/default not created yet".to_owned()),
                    Err(error) => Err(error.to_string()),
                }
            }
        })
        .await?;
    Ok(process)
}

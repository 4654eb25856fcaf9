//! pko's shipped install as the tests apply it: `kubectl kustomize deploy/...` rendered and applied
//! server-side, once per test binary, so the manager can run on its own ServiceAccount with exactly the
//! RBAC the manifests grant.

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use pko_testenv::{run_with_input, wait_until};
use serde_json::Value;

use super::{env, TIMEOUT};

pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// `kubectl kustomize deploy/<dir>`, as YAML documents.
pub fn kustomize(dir: &str) -> Vec<String> {
    let out = Command::new(pko_testenv::kubectl())
        .arg("kustomize")
        .arg(deploy_dir().join(dir))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .split("\n---\n")
        .map(str::to_owned)
        .collect()
}

pub fn parsed(document: &str) -> Value {
    serde_saphyr::from_str(document).unwrap()
}

/// Applies deploy/manager with kubectl (server-side, as for CRDs too large for client-side apply), every
/// document as shipped. Waits until the managed-objects role is aggregated. Once per test binary: two
/// applies at once race to create the same objects.
pub async fn install_manifests() {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    INSTALLED.get_or_init(|| apply_manifests("manager")).await;
}

/// Like [`install_manifests`], the tenants install (deploy/manager-tenants: impersonation granted).
pub async fn install_tenant_manifests() {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    INSTALLED
        .get_or_init(|| apply_manifests("manager-tenants"))
        .await;
}

/// `kubectl apply --server-side <flags> -f -` of `documents` on the management apiserver, as an admin;
/// asserts it succeeded and returns its output.
pub fn kubectl_apply(flags: &[&str], documents: &str) -> std::process::Output {
    let out = run_with_input(
        Command::new(pko_testenv::kubectl())
            .arg("--kubeconfig")
            .arg(env().management().kubeconfig_path())
            .args(["apply", "--server-side"])
            .args(flags)
            .args(["-f", "-"]),
        documents,
    )
    .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

async fn apply_manifests(dir: &str) {
    let documents: Vec<String> = kustomize(dir);
    kubectl_apply(&["--force-conflicts"], &documents.join("\n---\n"));
    let client = env().management().client().await.unwrap();
    let roles: Api<ClusterRole> = Api::all(client);
    wait_until("managed-objects role aggregated", TIMEOUT, || async {
        let role = roles
            .get("pko-manager-managed-objects")
            .await
            .map_err(|e| e.to_string())?;
        match role.rules {
            Some(rules) if !rules.is_empty() => Ok(()),
            _ => Err("no rules aggregated yet".to_owned()),
        }
    })
    .await
    .unwrap();
}

/// The manager container of the rendered Deployment.
pub fn manager_container() -> Value {
    manager_container_of("manager")
}

/// The manager's container of the install in deploy/`dir`.
pub fn manager_container_of(dir: &str) -> Value {
    let deployment = kustomize(dir)
        .iter()
        .map(|d| parsed(d))
        .find(|d| {
            (d["kind"] == "Deployment" || d["kind"] == "StatefulSet")
                && d["metadata"]["name"] == "pko-manager"
        })
        .unwrap();
    deployment["spec"]["template"]["spec"]["containers"][0].clone()
}

//! The commands that talk to a cluster: `pause`/`unpause` set `spec.paused` on a (Cluster)Package or
//! (Cluster)ObjectDeployment; `rollout history` lists the revisions (ObjectSets) behind one.

use std::path::PathBuf;

use clap::ValueEnum;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use pko_actors::deployment_object::DEPLOYMENT_LABEL;
use pko_proto::core::object_deployment::{ClusterObjectDeployment, ObjectDeployment};
use pko_proto::core::object_set::{ClusterObjectSet, ObjectSet};
use pko_proto::core::package::{ClusterPackage, Package};
use serde_json::{json, Value};

/// The kinds `pause`, `unpause` and `rollout history` work on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    #[value(alias = "pkg")]
    Package,
    #[value(alias = "cpkg")]
    Clusterpackage,
    #[value(alias = "od")]
    Objectdeployment,
    #[value(alias = "cod")]
    Clusterobjectdeployment,
}

impl Kind {
    fn cluster_scoped(self) -> bool {
        matches!(self, Kind::Clusterpackage | Kind::Clusterobjectdeployment)
    }

    fn resource(self) -> ApiResource {
        match self {
            Kind::Package => ApiResource::erase::<Package>(&()),
            Kind::Clusterpackage => ApiResource::erase::<ClusterPackage>(&()),
            Kind::Objectdeployment => ApiResource::erase::<ObjectDeployment>(&()),
            Kind::Clusterobjectdeployment => ApiResource::erase::<ClusterObjectDeployment>(&()),
        }
    }

    fn set_resource(self) -> ApiResource {
        if self.cluster_scoped() {
            ApiResource::erase::<ClusterObjectSet>(&())
        } else {
            ApiResource::erase::<ObjectSet>(&())
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kind::Package => "package",
            Kind::Clusterpackage => "clusterpackage",
            Kind::Objectdeployment => "objectdeployment",
            Kind::Clusterobjectdeployment => "clusterobjectdeployment",
        }
    }
}

/// Which object, on which cluster.
#[derive(Debug, clap::Args)]
pub struct Target {
    /// package, clusterpackage, objectdeployment or clusterobjectdeployment (pkg, cpkg, od, cod).
    pub kind: Kind,
    /// Object name.
    pub name: String,
    /// Namespace of a Package or ObjectDeployment.
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
    /// Kubeconfig; without it $KUBECONFIG or ~/.kube/config.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// Why a cluster command failed (always "could not run": exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("{kind}/{name}: {source}")]
    Api {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("{kind}/{name} not found")]
    NotFound { kind: &'static str, name: String },
}

async fn client(kubeconfig: Option<&PathBuf>) -> Result<Client, ClusterError> {
    let err = |e: &dyn std::fmt::Display| ClusterError::Kubeconfig(e.to_string());
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| ClusterError::Kubeconfig(format!("{}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| err(&e))?
        }
        None => kube::Config::infer().await.map_err(|e| err(&e))?,
    };
    Client::try_from(config).map_err(|e| err(&e))
}

fn api(
    client: Client,
    target: &Target,
    resource: &ApiResource,
    cluster: bool,
) -> Api<DynamicObject> {
    if cluster {
        Api::all_with(client, resource)
    } else {
        Api::namespaced_with(client, &target.namespace, resource)
    }
}

impl Target {
    fn api_error(&self, source: kube::Error) -> ClusterError {
        match source {
            kube::Error::Api(ref status) if status.code == 404 => ClusterError::NotFound {
                kind: self.kind.label(),
                name: self.name.clone(),
            },
            source => ClusterError::Api {
                kind: self.kind.label(),
                name: self.name.clone(),
                source,
            },
        }
    }
}

/// Sets `spec.paused`; returns kubectl-style output (`package/x paused`).
pub async fn set_paused(target: &Target, paused: bool) -> Result<String, ClusterError> {
    let client = client(target.kubeconfig.as_ref()).await?;
    let resource = target.kind.resource();
    api(client, target, &resource, target.kind.cluster_scoped())
        .patch(
            &target.name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"paused": paused}})),
        )
        .await
        .map_err(|e| target.api_error(e))?;
    let verb = if paused { "paused" } else { "unpaused" };
    Ok(format!("{}/{} {verb}", target.kind.label(), target.name))
}

/// One revision of a rollout, as `rollout history` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revision {
    pub revision: i64,
    pub name: String,
    pub lifecycle: String,
    pub available: String,
}

fn revision_of(set: &DynamicObject) -> Revision {
    let field = |pointer: &str| set.data.pointer(pointer).cloned().unwrap_or(Value::Null);
    let available = field("/status/conditions")
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Available"))
        .and_then(|c| c["status"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "Unknown".to_owned());
    Revision {
        revision: field("/status/revision").as_i64().unwrap_or_default(),
        name: set.metadata.name.clone().unwrap_or_default(),
        lifecycle: field("/spec/lifecycleState")
            .as_str()
            .unwrap_or("Active")
            .to_owned(),
        available,
    }
}

/// The table `rollout history` prints, oldest revision first.
pub fn history_table(mut revisions: Vec<Revision>) -> String {
    revisions.sort_by_key(|r| r.revision);
    let width = revisions
        .iter()
        .map(|r| r.name.len())
        .chain(["OBJECTSET".len()])
        .max()
        .unwrap_or_default();
    let mut out = format!(
        "{:<10}{:<w$}  {:<11}AVAILABLE\n",
        "REVISION",
        "OBJECTSET",
        "LIFECYCLE",
        w = width
    );
    for r in revisions {
        out.push_str(&format!(
            "{:<10}{:<w$}  {:<11}{}\n",
            r.revision,
            r.name,
            r.lifecycle,
            r.available,
            w = width
        ));
    }
    out
}

/// The revisions of the deployment behind `target` (a Package's deployment has the Package's name).
pub async fn history(target: &Target) -> Result<String, ClusterError> {
    let client = client(target.kubeconfig.as_ref()).await?;
    let cluster = target.kind.cluster_scoped();
    // The object must exist: an empty history of a typo would mislead.
    api(client.clone(), target, &target.kind.resource(), cluster)
        .get(&target.name)
        .await
        .map_err(|e| target.api_error(e))?;
    let sets = api(client, target, &target.kind.set_resource(), cluster)
        .list(&ListParams::default().labels(&format!("{DEPLOYMENT_LABEL}={}", target.name)))
        .await
        .map_err(|e| target.api_error(e))?;
    Ok(history_table(sets.items.iter().map(revision_of).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_is_sorted_and_aligned() {
        let r = |revision, name: &str, lifecycle: &str, available: &str| Revision {
            revision,
            name: name.to_owned(),
            lifecycle: lifecycle.to_owned(),
            available: available.to_owned(),
        };
        let table = history_table(vec![
            r(2, "app-7d9f8c6b5", "Active", "True"),
            r(1, "app-5f6d", "Archived", "Unknown"),
        ]);
        assert_eq!(
            table,
            "REVISION  OBJECTSET      LIFECYCLE  AVAILABLE\n1         app-5f6d       Archived   Unknown\n2         app-7d9f8c6b5  Active     True\n"
        );
    }
}

//! The ObjectSet of its own the chaos run deletes with orphaning (upstream parity: its objects stay, losing
//! their owner reference). A deployment's set would be made again and refuse the orphan under collision
//! protection `Prevent`, by design; this one is made again by the run, with `IfNoController`, as an SRE
//! re-creating a set over objects it orphaned would. At the end its ConfigMap must be the very object
//! created at the start (never deleted) and controlled by the set again.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use pko_proto::core::object_set::ObjectSet;
use pko_testenv::wait_until;
use serde_json::json;

const NAMESPACE: &str = "chaos-standalone";
const SET: &str = "standalone";
const KEPT: &str = "kept";
/// How long the set may take to be back and in control at the end.
const READOPT_BOUND: Duration = Duration::from_secs(120);

fn object_set() -> Result<ObjectSet, String> {
    serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSet",
        "metadata": {"name": SET, "namespace": NAMESPACE},
        "spec": {"phases": [{"name": "only", "objects": [{
            "collisionProtection": "IfNoController",
            "object": {"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": KEPT}, "data": {"kept": "yes"}},
        }]}]},
    }))
    .map_err(|e| e.to_string())
}

/// Creates the namespace and the set; returns the UID of its ConfigMap once the set made it.
pub async fn start(client: &Client) -> Result<String, String> {
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))
        .map_err(|e| e.to_string())?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(|e| e.to_string())?;
    recreate(client).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    wait_until("the standalone set's ConfigMap", READOPT_BOUND, || async {
        configmaps
            .get_opt(KEPT)
            .await
            .map_err(|e| e.to_string())?
            .and_then(|c| c.metadata.uid)
            .ok_or_else(|| "not yet".to_owned())
    })
    .await
    .map_err(|e| e.to_string())
}

/// Deletes the set with `propagationPolicy: Orphan`.
pub async fn orphan(client: &Client) -> Result<(), String> {
    Api::<ObjectSet>::namespaced(client.clone(), NAMESPACE)
        .delete(SET, &DeleteParams::orphan())
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Creates the set again (an error while the orphaning deletion is still under way).
pub async fn recreate(client: &Client) -> Result<(), String> {
    Api::<ObjectSet>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &object_set()?)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

/// What is wrong with the set and its ConfigMap at the end, once the set had `READOPT_BOUND` to be back
/// (made again here if the run's own attempt came while the deletion was under way).
pub async fn findings(client: &Client, kept_uid: &str) -> Vec<String> {
    let sets: Api<ObjectSet> = Api::namespaced(client.clone(), NAMESPACE);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let back = wait_until("the standalone set in control again", READOPT_BOUND, || async {
        let Some(set) = sets.get_opt(SET).await.map_err(|e| e.to_string())? else {
            // Still deleting when the run made it again: made again now.
            let _ = recreate(client).await;
            return Err("no set".to_owned());
        };
        let cm = configmaps
            .get_opt(KEPT)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the orphaned ConfigMap is gone")?;
        let controller = cm
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.clone());
        match (cm.metadata.uid.as_deref(), controller) {
            (Some(uid), _) if uid != kept_uid => Ok(Some(format!(
                "the orphaned ConfigMap {NAMESPACE}/{KEPT} was deleted and made again (uid {kept_uid} → {uid})"
            ))),
            (_, Some(owner)) if Some(owner.as_str()) == set.metadata.uid.as_deref() => Ok(None),
            (_, owner) => Err(format!("controlled by {owner:?}, not the set")),
        }
    })
    .await;
    match back {
        Ok(finding) => finding.into_iter().collect(),
        Err(e) => vec![format!("standalone set: {e}")],
    }
}

//! The HostedCluster actor: one per HostedCluster. Once the cluster is Available=True it keeps the
//! connector of its HCP namespace installed and current (credentials minted per NATS account and
//! HostedCluster, expiring, and minted again before they do; objects
//! server-side applied on every change of the HostedCluster or the manager's settings), and removes it when
//! the HostedCluster is deleted. Events on the HostedCluster tell an SRE what happened to its connector.
//!
//! It must not touch the phases themselves; the remote phase actors deliver those.

use crate::runtime::telemetry::connector_trace_env;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use futures::future::LocalBoxFuture;
use kube::runtime::events::{Event, EventType};
use kube::Resource;
use pko_proto::connector_wire::{HostedClusterSubjects, MAX_MESSAGE_BYTES};
use pko_proto::hypershift::HostedCluster;
use pko_proto::nats_credentials::UserLimits;
use serde_json::{json, Value};
use tracing::{info, warn};

use crate::engine::hypershift::connector_deployment::{
    connector_objects, credentials_current, credentials_hash, credentials_secret,
    ConnectorSettings, CredentialsBinding, CREDENTIALS_KEY, CREDENTIALS_SECRET,
};
use crate::engine::objects::object_ref::ObjectKey;
use crate::manager::context::ManagerContext;
use crate::objects::object_meta::tombstone_meta;
use crate::runtime::object_actor::{
    work, Action, Change, ObjectActor, Reconcile, ReconcileError, Work,
};
use crate::runtime::reconcile_gate::Backoff;
use pko_package::canonical_hash::value_hash;

const BACKOFF_MIN: Duration = Duration::from_secs(2);
/// Subscriptions a connector holds: apply, teardown and its client's request inbox, with room to spare.
const CONNECTOR_SUBSCRIPTIONS: i64 = 16;
/// The largest message a connector publishes: a report within the wire limit, with its headers.
const CONNECTOR_PAYLOAD_BYTES: i64 = 2 * MAX_MESSAGE_BYTES as i64;

/// What a reconcile did, for the event it deserves.
enum InstallOutcome {
    /// Nothing to do: no NATS, or not available yet.
    Unchanged,
    /// The connector objects are as wanted (hash of them); nothing was written, or only a repair of
    /// objects already installed.
    Current(u64),
    /// The connector objects were created or changed (hash of what was applied).
    Installed(u64),
    Failed(String),
}

fn settings(context: &ManagerContext) -> Option<ConnectorSettings> {
    let link = context.connectors.as_ref()?;
    Some(ConnectorSettings {
        image: link.connector_image.clone(),
        nats_url: link.connector_nats_url.clone(),
        trace_env: connector_trace_env(),
        resources: link.connector_resources.clone(),
    })
}

fn key_of(object: &Value) -> Result<ObjectKey, String> {
    ObjectKey::of(object).ok_or_else(|| format!("malformed object {object}"))
}

async fn apply(context: &ManagerContext, object: &Value) -> Result<Value, String> {
    context
        .applier
        .apply(&key_of(object)?, object)
        .await
        .map_err(|e| e.to_string())
}

/// Applies `object` only if it is not as wanted already; whether it was written. Every reconcile looks
/// (a restart, a resync), so an unchanged connector costs reads only.
async fn apply_unless_current(context: &ManagerContext, object: &Value) -> Result<bool, String> {
    context
        .applier
        .apply_unless_current(&key_of(object)?, object)
        .await
        .map_err(|e| e.to_string())
}

/// The connector's credentials Secret in `namespace`.
fn credentials_key(namespace: &str) -> ObjectKey {
    ObjectKey {
        group: String::new(),
        version: "v1".into(),
        kind: "Secret".into(),
        namespace: namespace.to_owned(),
        name: CREDENTIALS_SECRET.to_owned(),
    }
}

/// The connector's credentials Secret: the existing one while it is bound to the current account and
/// HostedCluster and more than a third of its validity is left, otherwise freshly minted credentials
/// limited to `namespace`'s subjects, expiring after the link's credentials validity.
async fn ensure_credentials(
    context: &ManagerContext,
    namespace: &str,
    cluster_uid: &str,
) -> Result<Value, String> {
    let link = context.connectors.as_ref().ok_or("no NATS configured")?;
    let key = credentials_key(namespace);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let validity = link.credentials_validity.as_secs();
    let binding = CredentialsBinding {
        account: link.signer.account().to_owned(),
        cluster_uid: cluster_uid.to_owned(),
        expires_at: now + validity,
    };
    let existing = context.applier.get(&key).await.map_err(|e| e.to_string())?;
    let renew_at = now + validity / 3;
    if let Some(existing) = existing.filter(|s| credentials_current(s, &binding, renew_at)) {
        return Ok(existing);
    }
    let subjects =
        HostedClusterSubjects::of(namespace, Some(cluster_uid)).map_err(|e| e.to_string())?;
    let credentials = link
        .signer
        .issue_limited_user(
            &format!("pko-connector-{namespace}"),
            &subjects.connector_permissions(),
            &UserLimits {
                expires_at: binding.expires_at,
                subscriptions: CONNECTOR_SUBSCRIPTIONS,
                payload_bytes: CONNECTOR_PAYLOAD_BYTES,
                leaf_node_only: false,
            },
        )
        .map_err(|e| e.to_string())?;
    let mut secret = credentials_secret(namespace, &binding, "");
    // Applied as data: stringData is write-only, so server-side apply could not tell it is unchanged.
    secret.as_object_mut().map(|s| s.remove("stringData"));
    secret["data"] = json!({ CREDENTIALS_KEY: STANDARD.encode(credentials.creds_file()) });
    info!(
        namespace,
        expires_at = binding.expires_at,
        "minted connector NATS credentials"
    );
    apply(context, &secret).await
}

async fn ensure_connector(
    context: &ManagerContext,
    cluster: &HostedCluster,
    applied: Option<u64>,
) -> InstallOutcome {
    let Some(settings) = settings(context) else {
        return InstallOutcome::Unchanged;
    };
    if !cluster.is_available() || cluster.metadata.deletion_timestamp.is_some() {
        return InstallOutcome::Unchanged;
    }
    let Some(namespace) = cluster.hosted_control_plane_namespace() else {
        return InstallOutcome::Unchanged;
    };
    let uid = cluster.metadata.uid.as_deref().unwrap_or_default();
    let secret = match ensure_credentials(context, &namespace, uid).await {
        Ok(s) => s,
        Err(e) => {
            return InstallOutcome::Failed(format!("connector credentials in {namespace}: {e}"))
        }
    };
    let objects = connector_objects(&namespace, uid, &settings, &credentials_hash(&secret));
    let hash = value_hash(&Value::Array(objects.clone()));
    let mut written = false;
    for object in &objects {
        match apply_unless_current(context, object).await {
            Ok(wrote) => written |= wrote,
            Err(e) => return InstallOutcome::Failed(format!("connector in {namespace}: {e}")),
        }
    }
    if written && applied != Some(hash) {
        InstallOutcome::Installed(hash)
    } else {
        InstallOutcome::Current(hash)
    }
}

/// An event on the HostedCluster for what changed; repeats are not recorded.
fn record(context: &ManagerContext, cluster: &HostedCluster, outcome: &InstallOutcome) {
    let (type_, reason, note) = match outcome {
        InstallOutcome::Unchanged | InstallOutcome::Current(_) => return,
        InstallOutcome::Installed(_) => (
            EventType::Normal,
            "ConnectorInstalled",
            format!(
                "pko-connector installed in {}",
                cluster.hosted_control_plane_namespace().unwrap_or_default()
            ),
        ),
        InstallOutcome::Failed(message) => (EventType::Warning, "ConnectorFailed", message.clone()),
    };
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "InstallConnector".into(),
        secondary: None,
    };
    context.runtime.events.raise(event, cluster.object_ref(&()));
}

/// Deletes the connector objects of a deleted HostedCluster's HCP namespace.
async fn remove_connector(context: &ManagerContext, namespace: &str) -> Result<(), String> {
    let Some(settings) = settings(context) else {
        return Ok(());
    };
    let mut keys: Vec<ObjectKey> = connector_objects(namespace, "", &settings, "")
        .iter()
        .filter_map(ObjectKey::of)
        .collect();
    keys.push(credentials_key(namespace));
    context.metrics.connectors.forget(namespace);
    for key in keys.iter().rev() {
        let observed = context.applier.get(key).await.map_err(|e| e.to_string())?;
        let Some(observed) = observed else { continue };
        context
            .applier
            .delete_observed(key, &observed)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// What `ensure_connector` reads of a HostedCluster.
#[derive(PartialEq)]
struct ConnectorInputs<'c> {
    uid: Option<&'c str>,
    available: bool,
    deleting: bool,
}

impl<'c> ConnectorInputs<'c> {
    fn of(cluster: &'c HostedCluster) -> Self {
        Self {
            uid: cluster.metadata.uid.as_deref(),
            available: cluster.is_available(),
            deleting: cluster.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// The HostedCluster controller's own state.
#[derive(Default)]
pub struct HostedClusterController {
    /// Hash of the connector objects last applied, to tell a change from a repeat.
    applied: Option<u64>,
}

pub type HostedClusterActor = ObjectActor<HostedClusterController>;

impl Reconcile for HostedClusterController {
    type Shared = ManagerContext;
    type Object = HostedCluster;
    type Reported = ();
    const CONTROLLER: &'static str = "hosted_cluster";
    const RECONCILED_WHILE_DELETING: bool = true;
    const BACKOFF: Backoff = Backoff::new(BACKOFF_MIN, Duration::from_secs(120));

    /// Credentials fall due for renewal with time alone: look again six times per validity.
    fn resync(context: &ManagerContext) -> Option<Duration> {
        context
            .connectors
            .as_ref()
            .map(|link| link.credentials_validity / 6)
    }

    /// Metadata only: the fleet reads its key and labels of a deleted cluster.
    fn tombstone(cluster: &HostedCluster) -> HostedCluster {
        HostedCluster {
            metadata: tombstone_meta(&cluster.metadata),
            spec: None,
            status: None,
        }
    }

    /// Only what the connector is made from counts: a relabelled cluster (fleets relabel often, and
    /// every label change reached here) would otherwise read and compare every connector object again.
    fn change(previous: Option<&HostedCluster>, current: &HostedCluster) -> Change {
        match previous {
            Some(known) if ConnectorInputs::of(known) == ConnectorInputs::of(current) => {
                Change::Echo
            }
            _ => Change::Respecified,
        }
    }

    fn reconcile(
        actor: &mut HostedClusterActor,
        cluster: HostedCluster,
        _: &mut Context<HostedClusterActor>,
    ) -> Work<Self> {
        let context = actor.context.clone();
        let applied = actor.state.applied;
        let run = async move {
            let outcome = ensure_connector(&context, &cluster, applied).await;
            record(&context, &cluster, &outcome);
            outcome
        };
        work(
            run,
            |outcome, actor: &mut HostedClusterActor, _| match outcome {
                InstallOutcome::Installed(hash) | InstallOutcome::Current(hash) => {
                    actor.state.applied = Some(hash);
                    Ok(Action::AwaitChange)
                }
                InstallOutcome::Unchanged => Ok(Action::AwaitChange),
                InstallOutcome::Failed(message) => Err(ReconcileError::Failed(message)),
            },
        )
    }

    fn gone(
        actor: &mut HostedClusterActor,
        _: &mut Context<HostedClusterActor>,
    ) -> Option<LocalBoxFuture<'static, ()>> {
        let namespace = actor
            .object
            .as_ref()
            .and_then(HostedCluster::hosted_control_plane_namespace)?;
        let context = actor.context.clone();
        Some(Box::pin(async move {
            // A few attempts: after that the HCP namespace is usually being deleted by HyperShift anyway.
            for attempt in 1..=5u32 {
                match remove_connector(&context, &namespace).await {
                    Ok(()) => {
                        info!(%namespace, "connector removed");
                        return;
                    }
                    Err(e) => {
                        warn!(%namespace, attempt, error = %e, "removing the connector failed");
                        tokio::time::sleep(BACKOFF_MIN * attempt).await;
                    }
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn cluster(labels: Value, available: &str, deleting: bool) -> HostedCluster {
        let mut metadata =
            json!({"name": "a", "namespace": "clusters", "uid": "u1", "labels": labels});
        if deleting {
            metadata["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(json!({
            "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
            "metadata": metadata,
            "status": {"conditions": [{"type": "Available", "status": available, "reason": "R",
                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }))
        .unwrap()
    }

    /// A relabel is nothing to the connector; availability, deletion and a first sight are.
    #[test]
    fn only_what_the_connector_is_made_from_starts_a_reconcile() {
        let known = cluster(json!({"team": "a"}), "True", false);
        let change =
            |current: &HostedCluster| HostedClusterController::change(Some(&known), current);
        assert_eq!(
            change(&cluster(json!({"team": "b"}), "True", false)),
            Change::Echo
        );
        assert_eq!(
            change(&cluster(json!({"team": "a"}), "False", false)),
            Change::Respecified
        );
        assert_eq!(
            change(&cluster(json!({"team": "a"}), "True", true)),
            Change::Respecified
        );
        let mut replaced = known.clone();
        replaced.metadata.uid = Some("u2".into());
        assert_eq!(change(&replaced), Change::Respecified);
        assert_eq!(
            HostedClusterController::change(None, &known),
            Change::Respecified
        );
    }
}

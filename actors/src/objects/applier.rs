//! The applier: every read and write pko makes to objects it manages. Server-side apply with field owner
//! `package-operator`, adoption patches, deletes with UID+resourceVersion preconditions, and kind discovery.
//!
//! It decides nothing (the engine does); it counts the requests it makes so benchmarks and tests can assert
//! that an unchanged set issues no writes.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use std::sync::Arc;

use dashmap::DashMap;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    Preconditions,
};
use kube::discovery::Scope;
use kube::{Api, Client};
use serde_json::{json, Value};
use tracing::instrument;

use crate::engine::objects::apply_identity::ApplyIdentity;
use crate::engine::objects::desired_object::FIELD_MANAGER;
use crate::engine::objects::drift::apply_is_current;
use crate::engine::objects::object_ref::ObjectKey;
use crate::metrics::manager_metrics::ManagerMetrics;
use crate::runtime::cluster_client::impersonating;

/// A request the apiserver refused or could not serve.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("unknown kind {kind} in {api_version}: the apiserver does not serve it")]
    UnknownKind { api_version: String, kind: String },
    #[error("{object}: {kind} is namespaced but the object has no namespace")]
    MissingNamespace { object: String, kind: String },
    #[error("{object}: {kind} is cluster-scoped but the object names namespace {namespace:?}")]
    UnexpectedNamespace {
        object: String,
        kind: String,
        namespace: String,
    },
    #[error("{object}: {source}")]
    Api {
        object: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("cannot act as {identity}: {message}")]
    Identity { identity: String, message: String },
    #[error("{object}: response is not a valid object: {source}")]
    Decode {
        object: String,
        #[source]
        source: serde_json::Error,
    },
}

impl ApplyError {
    /// True when retrying the same request cannot help: the kind is not served, the namespace does not
    /// fit its scope, or the apiserver rejected the object itself (400, 403, 404, 422).
    pub fn is_permanent(&self) -> bool {
        match self {
            ApplyError::UnknownKind { .. }
            | ApplyError::MissingNamespace { .. }
            | ApplyError::UnexpectedNamespace { .. }
            | ApplyError::Identity { .. } => true,
            ApplyError::Api { source, .. } => {
                matches!(source.as_ref(), kube::Error::Api(s) if matches!(s.code, 400 | 403 | 404 | 422))
            }
            ApplyError::Decode { .. } => false,
        }
    }

    /// True when the object is not there (404).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ApplyError::Api { source, .. } if matches!(source.as_ref(), kube::Error::Api(s) if s.code == 404))
    }

    /// True for conflicts and failed preconditions: the object changed under us; re-read and retry.
    pub fn is_conflict(&self) -> bool {
        matches!(self, ApplyError::Api { source, .. } if matches!(source.as_ref(), kube::Error::Api(s) if s.code == 409))
    }
}

/// `body` with `metadata.resourceVersion` set: the apiserver then applies it only over that version.
fn with_resource_version(body: &Value, resource_version: &str) -> Value {
    let mut guarded = body.clone();
    if let Some(metadata) = guarded
        .as_object_mut()
        .map(|o| o.entry("metadata").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
    {
        metadata.insert("resourceVersion".to_owned(), json!(resource_version));
    }
    guarded
}

/// A kind as the apiserver serves it.
#[derive(Debug, Clone)]
pub struct ResolvedKind {
    pub resource: ApiResource,
    pub namespaced: bool,
}

/// Request counts since start, how long applies take, and how many identities have a client.
#[derive(Debug, Clone)]
struct RequestCounts {
    reads: Counter,
    writes: Counter,
    apply_duration: Histogram,
    identities: Gauge,
}

impl Default for RequestCounts {
    fn default() -> Self {
        Self {
            reads: Counter::default(),
            writes: Counter::default(),
            // 1 ms .. ~16 s.
            apply_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            identities: Gauge::default(),
        }
    }
}

/// Reads and writes managed objects; cheap to clone.
#[derive(Clone)]
pub struct Applier {
    /// Reads and writes go out through this client: the manager's, or one impersonating an owner's
    /// ServiceAccount.
    client: Client,
    /// The manager's own client: discovery, and what impersonating clients are made from.
    own_client: Client,
    kinds: Arc<DashMap<(String, String, String), ResolvedKind>>,
    /// One client per impersonated user, made on first use and kept for the process lifetime (a
    /// namespace's ServiceAccounts are few; each costs a forwarding task).
    identities: Arc<DashMap<String, Client>>,
    counts: RequestCounts,
}

impl Applier {
    pub fn new(client: Client) -> Self {
        Self {
            own_client: client.clone(),
            client,
            kinds: Arc::default(),
            identities: Arc::default(),
            counts: RequestCounts::default(),
        }
    }

    /// This applier, reading and writing as `identity`. Kinds, counts and connections are shared.
    pub fn acting_as(&self, identity: &ApplyIdentity) -> Result<Applier, ApplyError> {
        let Some(user) = identity.impersonated_user() else {
            return Ok(Applier {
                client: self.own_client.clone(),
                ..self.clone()
            });
        };
        // Made under the entry's lock: owners planning at once for a new identity share one client.
        let mut made = false;
        let client = self
            .identities
            .entry(user.clone())
            .or_try_insert_with(|| {
                made = true;
                impersonating(&self.own_client, &user)
            })
            .map_err(|e| ApplyError::Identity {
                identity: identity.to_string(),
                message: e.to_string(),
            })?
            .clone();
        if made {
            self.counts.identities.set(self.identities.len() as i64);
        }
        Ok(Applier {
            client,
            ..self.clone()
        })
    }

    /// Adds the request counts and apply latency to the manager's metrics.
    pub fn register_metrics(&self, metrics: &ManagerMetrics) {
        metrics.register(
            "pko_object_reads",
            "Reads of managed objects (GET).",
            self.counts.reads.clone(),
        );
        metrics.register(
            "pko_object_writes",
            "Writes to managed objects (apply, patch, delete).",
            self.counts.writes.clone(),
        );
        metrics.register(
            "pko_apply_duration_seconds",
            "Time a server-side apply of a managed object takes, to the stored object or the error.",
            self.counts.apply_duration.clone(),
        );
        metrics.register(
            "pko_impersonated_identities",
            "ServiceAccounts the manager has a client for, impersonating them for their owners' objects.",
            self.counts.identities.clone(),
        );
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Looks up how the apiserver serves a kind (cached for the process lifetime).
    pub async fn resolve(&self, key: &ObjectKey) -> Result<ResolvedKind, ApplyError> {
        let id = (key.group.clone(), key.version.clone(), key.kind.clone());
        if let Some(k) = self.kinds.get(&id) {
            return Ok(k.clone());
        }
        let gvk = GroupVersionKind::gvk(&key.group, &key.version, &key.kind);
        let (resource, caps) = match kube::discovery::pinned_kind(&self.own_client, &gvk).await {
            Ok(found) => found,
            // The group/version is not served (404) or does not have the kind.
            Err(kube::Error::Api(s)) if s.code == 404 => return Err(self.unknown_kind(key)),
            Err(kube::Error::Discovery(_)) => return Err(self.unknown_kind(key)),
            Err(source) => {
                return Err(ApplyError::Api {
                    object: key.to_string(),
                    source: Box::new(source),
                })
            }
        };
        let resolved = ResolvedKind {
            resource,
            namespaced: caps.scope == Scope::Namespaced,
        };
        self.kinds.insert(id, resolved.clone());
        Ok(resolved)
    }

    fn unknown_kind(&self, key: &ObjectKey) -> ApplyError {
        ApplyError::UnknownKind {
            api_version: key.api_version(),
            kind: key.kind.clone(),
        }
    }

    /// Checks that the apiserver serves the object's kind and that the object's namespace fits the kind's
    /// scope, without writing anything.
    pub async fn preflight(&self, key: &ObjectKey) -> Result<(), ApplyError> {
        self.api(key).await.map(|_| ())
    }

    async fn api(&self, key: &ObjectKey) -> Result<Api<DynamicObject>, ApplyError> {
        let kind = self.resolve(key).await?;
        match (kind.namespaced, key.namespace.is_empty()) {
            (true, false) => Ok(Api::namespaced_with(
                self.client.clone(),
                &key.namespace,
                &kind.resource,
            )),
            (false, true) => Ok(Api::all_with(self.client.clone(), &kind.resource)),
            (true, true) => Err(ApplyError::MissingNamespace {
                object: key.to_string(),
                kind: key.kind.clone(),
            }),
            (false, false) => Err(ApplyError::UnexpectedNamespace {
                object: key.to_string(),
                kind: key.kind.clone(),
                namespace: key.namespace.clone(),
            }),
        }
    }

    fn api_error(key: &ObjectKey) -> impl Fn(kube::Error) -> ApplyError + '_ {
        move |source| ApplyError::Api {
            object: key.to_string(),
            source: Box::new(source),
        }
    }

    fn to_value(key: &ObjectKey, object: DynamicObject) -> Result<Value, ApplyError> {
        serde_json::to_value(object).map_err(|source| ApplyError::Decode {
            object: key.to_string(),
            source,
        })
    }

    /// Reads an object; `None` when it does not exist.
    #[instrument(skip(self), fields(pko.object.kind = %key.kind, pko.object.name = %key.name, k8s.namespace.name = %key.namespace))]
    pub async fn get(&self, key: &ObjectKey) -> Result<Option<Value>, ApplyError> {
        let api = self.api(key).await?;
        self.counts.reads.inc();
        let got = api.get_opt(&key.name).await.map_err(Self::api_error(key))?;
        got.map(|o| Self::to_value(key, o)).transpose()
    }

    /// Like [`Applier::get`], with a kind the apiserver does not serve (its CRD gone) read as no
    /// object: what lets go of objects has nothing to let go of there.
    pub async fn get_served(&self, key: &ObjectKey) -> Result<Option<Value>, ApplyError> {
        match self.get(key).await {
            Err(ApplyError::UnknownKind { .. }) => Ok(None),
            got => got,
        }
    }

    /// Lists every object of `key`'s kind in `key`'s namespace (cluster-wide for cluster-scoped kinds).
    #[instrument(skip(self), fields(pko.object.kind = %key.kind, k8s.namespace.name = %key.namespace))]
    pub async fn list_like(&self, key: &ObjectKey) -> Result<Vec<Value>, ApplyError> {
        let api = self.api(key).await?;
        self.counts.reads.inc();
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(Self::api_error(key))?;
        list.items
            .into_iter()
            .map(|o| Self::to_value(key, o))
            .collect()
    }

    /// Server-side applies `body` (force, field owner `package-operator`) and returns the stored object.
    #[instrument(skip(self, body), fields(pko.object.kind = %key.kind, pko.object.name = %key.name, k8s.namespace.name = %key.namespace))]
    pub async fn apply(&self, key: &ObjectKey, body: &Value) -> Result<Value, ApplyError> {
        let api = self.api(key).await?;
        self.counts.writes.inc();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let started = std::time::Instant::now();
        let stored = api.patch(&key.name, &params, &Patch::Apply(body)).await;
        self.counts
            .apply_duration
            .observe(started.elapsed().as_secs_f64());
        Self::to_value(key, stored.map_err(Self::api_error(key))?)
    }

    /// Asks the apiserver whether it would take `body` as [`Applier::apply`] writes it (`dryRun=All`:
    /// validation, admission webhooks, immutable fields, quota), storing nothing. Not counted as a write.
    #[instrument(skip(self, body), fields(pko.object.kind = %key.kind, pko.object.name = %key.name, k8s.namespace.name = %key.namespace))]
    pub async fn dry_run_apply(&self, key: &ObjectKey, body: &Value) -> Result<(), ApplyError> {
        let api = self.api(key).await?;
        let params = PatchParams::apply(FIELD_MANAGER).force().dry_run();
        api.patch(&key.name, &params, &Patch::Apply(body))
            .await
            .map(|_| ())
            .map_err(Self::api_error(key))
    }

    /// Like [`Applier::apply`], but reads the object first and applies only when the apply would change
    /// it ([`apply_is_current`]): what a process that does not know its own last apply (a restarted
    /// manager) uses, so that re-observing an unchanged object costs a read, not a write. Whether it
    /// was written.
    pub async fn apply_unless_current(
        &self,
        key: &ObjectKey,
        body: &Value,
    ) -> Result<bool, ApplyError> {
        if let Some(observed) = self.get(key).await? {
            if apply_is_current(body, &observed, FIELD_MANAGER) {
                return Ok(false);
            }
        }
        self.apply(key, body).await?;
        Ok(true)
    }

    /// Like [`Applier::apply`], but only over the object at `resource_version`: a forced apply that
    /// follows a decision made on that version (taking the object over) must not land on a newer one,
    /// which may have another controller by now. A changed object fails with a conflict.
    pub async fn apply_over(
        &self,
        key: &ObjectKey,
        body: &Value,
        resource_version: &str,
    ) -> Result<Value, ApplyError> {
        self.apply(key, &with_resource_version(body, resource_version))
            .await
    }

    /// Turns the controller reference with `controller_uid` into a plain owner reference, so another owner
    /// can become controller. Guarded by the observed resourceVersion: a concurrent change makes it fail.
    #[instrument(skip(self, observed), fields(pko.object.kind = %key.kind, pko.object.name = %key.name, k8s.namespace.name = %key.namespace))]
    pub async fn demote_controller(
        &self,
        key: &ObjectKey,
        observed: &Value,
        controller_uid: &str,
    ) -> Result<Value, ApplyError> {
        self.rewrite_owner_references(key, observed, controller_uid, |mut r| {
            r["controller"] = json!(false);
            Some(r)
        })
        .await
    }

    /// Drops the owner reference to `owner_uid`, so the garbage collector does not delete the object with
    /// an owner that no longer controls it. Guarded by the observed resourceVersion.
    #[instrument(skip(self, observed), fields(pko.object.kind = %key.kind, pko.object.name = %key.name, k8s.namespace.name = %key.namespace))]
    pub async fn release_owner(
        &self,
        key: &ObjectKey,
        observed: &Value,
        owner_uid: &str,
    ) -> Result<Value, ApplyError> {
        self.rewrite_owner_references(key, observed, owner_uid, |_| None)
            .await
    }

    /// Rewrites the owner reference to `uid` with `change` (None drops it), guarded by the observed
    /// resourceVersion. Without such a reference (e.g. a controller recorded in the owners annotation,
    /// which the apply itself replaces) nothing is written.
    async fn rewrite_owner_references(
        &self,
        key: &ObjectKey,
        observed: &Value,
        uid: &str,
        change: impl Fn(Value) -> Option<Value>,
    ) -> Result<Value, ApplyError> {
        let refs = observed
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let names = |r: &Value| r.get("uid").and_then(Value::as_str) == Some(uid);
        if !refs.iter().any(names) {
            return Ok(observed.clone());
        }
        let rewritten: Vec<Value> = refs
            .into_iter()
            .filter_map(|r| if names(&r) { change(r) } else { Some(r) })
            .collect();
        let rv = observed.pointer("/metadata/resourceVersion").cloned();
        let patch = json!({"metadata": {"ownerReferences": rewritten, "resourceVersion": rv}});
        let api = self.api(key).await?;
        self.counts.writes.inc();
        let stored = api
            .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Self::api_error(key))?;
        Self::to_value(key, stored)
    }

    /// Deletes `observed` only if it is still exactly that version (its UID and resourceVersion).
    /// `Ok(false)` when it was already gone.
    pub async fn delete_observed(
        &self,
        key: &ObjectKey,
        observed: &Value,
    ) -> Result<bool, ApplyError> {
        let field = |pointer: &str| {
            observed
                .pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        self.delete_exact(
            key,
            &field("/metadata/uid"),
            &field("/metadata/resourceVersion"),
        )
        .await
    }

    /// Deletes the object only if it still has this UID and resourceVersion. `Ok(false)` when it was
    /// already gone.
    #[instrument(skip(self), fields(pko.object.kind = %key.kind, pko.object.name = %key.name, k8s.namespace.name = %key.namespace))]
    pub async fn delete_exact(
        &self,
        key: &ObjectKey,
        uid: &str,
        resource_version: &str,
    ) -> Result<bool, ApplyError> {
        let api = self.api(key).await?;
        self.counts.writes.inc();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: Some(resource_version.to_owned()),
            }),
            ..DeleteParams::background()
        };
        match api.delete(&key.name, &params).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(source) => Err(ApplyError::Api {
                object: key.to_string(),
                source: Box::new(source),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guarded_apply_names_the_version_it_was_decided_on() {
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
        let guarded = with_resource_version(&body, "4711");
        assert_eq!(guarded["metadata"]["resourceVersion"], "4711");
        assert_eq!(guarded["metadata"]["name"], "x");
        assert_eq!(
            with_resource_version(&json!({"kind": "ConfigMap"}), "1")["metadata"],
            json!({"resourceVersion": "1"})
        );
    }
}

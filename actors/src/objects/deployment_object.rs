//! One view of ObjectDeployment and ClusterObjectDeployment, with the apiserver calls their actor makes
//! on the ObjectSets they own.

use crate::runtime::telemetry::current_traceparent;
use pko_proto::well_known::TRACE_PARENT_ANNOTATION;
use pko_proto::well_known::{
    DEPLOYMENT_LABEL, HASH_ANNOTATION, REVISION_ANNOTATION, TEARDOWN_FINALIZER,
};
use pko_proto::well_known::{SERVICE_ACCOUNT_ANNOTATION, SHARD_OWNER_LABEL};
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource};
use pko_proto::core::common::LifecycleState;
use pko_proto::core::object_deployment::{
    ClusterObjectDeployment, ObjectDeployment, ObjectDeploymentSpec, ObjectDeploymentStatus,
};
use pko_proto::core::object_set::{ClusterObjectSet, ObjectSet, ObjectSetSpec};
use serde_json::json;

use crate::objects::object_meta::{requested_service_account, write_status};
use crate::objects::set_object::{SetKind, SetObject};
use crate::runtime::meta_view::MetaView;

/// An ObjectDeployment or ClusterObjectDeployment.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentObject {
    pub sets: SetKind,
    pub meta: ObjectMeta,
    pub spec: ObjectDeploymentSpec,
    pub status: ObjectDeploymentStatus,
}

impl From<ObjectDeployment> for DeploymentObject {
    fn from(o: ObjectDeployment) -> Self {
        Self {
            sets: SetKind::Namespaced,
            meta: o.metadata,
            spec: o.spec,
            status: o.status.unwrap_or_default(),
        }
    }
}

impl From<ClusterObjectDeployment> for DeploymentObject {
    fn from(o: ClusterObjectDeployment) -> Self {
        Self {
            sets: SetKind::Cluster,
            meta: o.metadata,
            spec: o.spec,
            status: o.status.unwrap_or_default(),
        }
    }
}

impl MetaView for DeploymentObject {
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    fn kind(&self) -> &'static str {
        if self.sets.is_namespaced() {
            "ObjectDeployment"
        } else {
            "ClusterObjectDeployment"
        }
    }

    fn same_status(&self, other: &Self) -> bool {
        self.status == other.status
    }
}

impl DeploymentObject {
    fn own_api(&self, client: Client) -> Api<kube::api::DynamicObject> {
        if self.sets.is_namespaced() {
            let resource = kube::api::ApiResource::erase::<ObjectDeployment>(&());
            Api::namespaced_with(client, self.namespace(), &resource)
        } else {
            let resource = kube::api::ApiResource::erase::<ClusterObjectDeployment>(&());
            Api::all_with(client, &resource)
        }
    }

    /// The ObjectSets labelled as this deployment's.
    pub async fn list_sets(&self, client: Client) -> Result<Vec<SetObject>, kube::Error> {
        let params = ListParams::default().labels(&format!("{DEPLOYMENT_LABEL}={}", self.name()));
        Ok(if self.sets.is_namespaced() {
            Api::<ObjectSet>::namespaced(client, self.namespace())
                .list(&params)
                .await?
                .items
                .into_iter()
                .map(SetObject::from)
                .collect()
        } else {
            Api::<ClusterObjectSet>::all(client)
                .list(&params)
                .await?
                .items
                .into_iter()
                .map(SetObject::from)
                .collect()
        })
    }

    /// Creates the ObjectSet of a new revision, controlled by this deployment; returns it as created.
    pub async fn create_set(
        &self,
        client: Client,
        name: &str,
        hash: &str,
        revision: i64,
        previous: &[String],
        shard_owner: Option<&str>,
    ) -> Result<SetObject, kube::Error> {
        let template = &self.spec.template;
        let mut labels: BTreeMap<String, String> =
            template.metadata.labels.clone().unwrap_or_default();
        labels.insert(DEPLOYMENT_LABEL.to_owned(), self.name().to_owned());
        // Sharded: the replica creating it works on it; its watch sees the set at once.
        if let Some(owner) = shard_owner {
            labels.insert(SHARD_OWNER_LABEL.to_owned(), owner.to_owned());
        }
        let mut annotations: BTreeMap<String, String> =
            template.metadata.annotations.clone().unwrap_or_default();
        // The deployment's identity is its revisions' (a template's own annotation gives way to it).
        if let Some(account) = requested_service_account(&self.meta) {
            annotations.insert(SERVICE_ACCOUNT_ANNOTATION.to_owned(), account.to_owned());
        }
        annotations.insert(HASH_ANNOTATION.to_owned(), hash.to_owned());
        annotations.insert(REVISION_ANNOTATION.to_owned(), revision.to_string());
        // The new ObjectSet's reconcile continues the trace of this one.
        if let Some(traceparent) = current_traceparent() {
            annotations.insert(TRACE_PARENT_ANNOTATION.to_owned(), traceparent);
        }
        let meta = ObjectMeta {
            name: Some(name.to_owned()),
            namespace: self
                .sets
                .is_namespaced()
                .then(|| self.namespace().to_owned()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: ObjectDeployment::api_version(&()).into_owned(),
                kind: self.kind().to_owned(),
                name: self.name().to_owned(),
                uid: self.uid().to_owned(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            // The ObjectSet's own controller would add it on its first reconcile: one write less per
            // revision.
            finalizers: Some(vec![TEARDOWN_FINALIZER.to_owned()]),
            ..ObjectMeta::default()
        };
        let spec = ObjectSetSpec {
            lifecycle_state: LifecycleState::Active,
            previous: previous
                .iter()
                .map(|n| pko_proto::core::common::PreviousRevisionReference { name: n.clone() })
                .collect(),
            revision: Some(revision),
            template: template.spec.clone(),
        };
        let params = PostParams::default();
        if self.sets.is_namespaced() {
            let set = ObjectSet {
                metadata: meta,
                spec,
                status: None,
            };
            Api::<ObjectSet>::namespaced(client, self.namespace())
                .create(&params, &set)
                .await
                .map(SetObject::from)
        } else {
            let set = ClusterObjectSet {
                metadata: meta,
                spec,
                status: None,
            };
            Api::<ClusterObjectSet>::all(client)
                .create(&params, &set)
                .await
                .map(SetObject::from)
        }
    }

    /// Sets an owned set's lifecycleState.
    pub async fn set_lifecycle(
        &self,
        client: Client,
        name: &str,
        state: LifecycleState,
    ) -> Result<(), kube::Error> {
        let patch = json!({"spec": {"lifecycleState": state.as_str()}});
        self.sets
            .api(client, self.namespace())
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }

    /// Deletes an owned set (its objects are torn down under the deletion if archival had not finished);
    /// returns its UID when the apiserver named it (`None` when it was gone already).
    pub async fn delete_set(
        &self,
        client: Client,
        name: &str,
    ) -> Result<Option<String>, kube::Error> {
        match self
            .sets
            .api(client, self.namespace())
            .delete(name, &Default::default())
            .await
        {
            Ok(deleted) => Ok(deleted.either(
                |set| set.metadata.uid,
                |status| status.details.map(|d| d.uid).filter(|uid| !uid.is_empty()),
            )),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes `status` through the status subresource.
    pub async fn write_status(
        &self,
        client: Client,
        status: &ObjectDeploymentStatus,
    ) -> Result<(), kube::Error> {
        let lists = ["conditions", "controllerOf"];
        write_status(&self.own_api(client), self.name(), status, &lists).await
    }
}

//! One view of Package and ClusterPackage for the Package actor, with the calls it makes.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, Preconditions,
};
use kube::{Api, Client};
use pko_proto::core::object_deployment::{ClusterObjectDeployment, ObjectDeployment};
use pko_proto::core::package::{ClusterPackage, Package, PackageSpec, PackageStatus};
use pko_proto::well_known::{CHUNKING_ANNOTATION, TRACE_PARENT_ANNOTATION};
use serde_json::{json, Value};

use crate::engine::objects::desired_object::FIELD_MANAGER;
use crate::engine::objects::drift::apply_is_current;
use crate::engine::packages::package_deployment::PackageRef;
use crate::objects::deployment_object::DeploymentObject;
use crate::objects::object_meta::{requested_service_account, write_status};
use crate::runtime::meta_view::MetaView;
use pko_package::chunking::Slice;
use pko_proto::core::object_slice::{ClusterObjectSlice, ObjectSlice};
use pko_proto::well_known::SLICE_OWNER_LABEL;

/// What a Package copies from its ObjectDeployment.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentView {
    pub conditions: Vec<Condition>,
    pub generation: i64,
    pub revision: Option<i64>,
}

impl DeploymentView {
    /// What the apiserver answered of the deployment (a read, or an apply's answer).
    fn of(od: &DynamicObject) -> Result<Self, kube::Error> {
        let conditions = od
            .data
            .pointer("/status/conditions")
            .cloned()
            .map(serde_json::from_value)
            .transpose()
            .map_err(kube::Error::SerdeError)?
            .unwrap_or_default();
        Ok(Self {
            conditions,
            generation: od.metadata.generation.unwrap_or_default(),
            revision: od.data.pointer("/status/revision").and_then(Value::as_i64),
        })
    }
}

impl From<&DeploymentObject> for DeploymentView {
    fn from(od: &DeploymentObject) -> Self {
        Self {
            conditions: od.status.conditions.clone(),
            generation: od.generation(),
            revision: od.status.revision,
        }
    }
}

/// A Package (namespaced) or ClusterPackage.
#[derive(Debug, Clone, PartialEq)]
pub struct PackageObject {
    pub cluster: bool,
    pub meta: ObjectMeta,
    pub spec: PackageSpec,
    pub status: PackageStatus,
}

impl From<Package> for PackageObject {
    fn from(p: Package) -> Self {
        Self {
            cluster: false,
            meta: p.metadata,
            spec: p.spec,
            status: p.status.unwrap_or_default(),
        }
    }
}

impl From<ClusterPackage> for PackageObject {
    fn from(p: ClusterPackage) -> Self {
        Self {
            cluster: true,
            meta: p.metadata,
            spec: p.spec,
            status: p.status.unwrap_or_default(),
        }
    }
}

impl MetaView for PackageObject {
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    fn kind(&self) -> &'static str {
        if self.cluster {
            "ClusterPackage"
        } else {
            "Package"
        }
    }

    /// The chunking annotation counts too: the reconcile reads it, and a change of it is no echo.
    fn same_status(&self, other: &Self) -> bool {
        self.status == other.status && self.chunking_annotation() == other.chunking_annotation()
    }
}

impl PackageObject {
    /// The package's chunking annotation.
    pub fn chunking_annotation(&self) -> Option<&str> {
        self.meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(CHUNKING_ANNOTATION))
            .map(String::as_str)
    }

    pub fn package_ref(&self) -> PackageRef {
        PackageRef {
            name: self.name().to_owned(),
            namespace: (!self.cluster).then(|| self.namespace().to_owned()),
            uid: self.uid().to_owned(),
            image: self.spec.image.clone(),
            paused: self.spec.paused,
            service_account: requested_service_account(&self.meta).map(str::to_owned),
        }
    }

    /// The template context (`.package`, `.config`, `.environment`) for this package, given its admitted
    /// config.
    pub fn template_context(&self, config: Value, environment: Value) -> Value {
        json!({
            "package": {
                "metadata": {
                    "name": self.name(),
                    "namespace": self.namespace(),
                    "labels": self.meta.labels.clone().unwrap_or_default(),
                    "annotations": self.meta.annotations.clone().unwrap_or_default(),
                },
                "image": self.spec.image,
            },
            "config": config,
            "environment": environment,
        })
    }

    fn api(&self, client: Client, resource: &ApiResource) -> Api<DynamicObject> {
        if self.cluster {
            Api::all_with(client, resource)
        } else {
            Api::namespaced_with(client, self.namespace(), resource)
        }
    }

    fn deployment_resource(&self) -> ApiResource {
        if self.cluster {
            ApiResource::erase::<ClusterObjectDeployment>(&())
        } else {
            ApiResource::erase::<ObjectDeployment>(&())
        }
    }

    /// Server-side applies the package's ObjectDeployment.
    ///
    /// With `unless_current`, the deployment is read first and left alone when the apply would change
    /// nothing but its trace annotation ([`apply_is_current`]): a restarted manager re-observes its
    /// Packages without a write each.
    pub async fn apply_deployment(
        &self,
        client: Client,
        deployment: &Value,
        unless_current: bool,
    ) -> Result<DeploymentView, kube::Error> {
        let api = self.api(client, &self.deployment_resource());
        if unless_current {
            if let Some(observed) = api.get_opt(self.name()).await? {
                let observed_value = serde_json::to_value(&observed).unwrap_or_default();
                if apply_is_current(
                    &with_trace_of(deployment, &observed_value),
                    &observed_value,
                    FIELD_MANAGER,
                ) {
                    return DeploymentView::of(&observed);
                }
            }
        }
        let applied = api
            .patch(
                self.name(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(deployment),
            )
            .await?;
        DeploymentView::of(&applied)
    }

    /// The ObjectDeployment's status as the Package reports it, if the deployment exists.
    pub async fn deployment_status(
        &self,
        client: Client,
    ) -> Result<Option<DeploymentView>, kube::Error> {
        let api = self.api(client, &self.deployment_resource());
        api.get_opt(self.name())
            .await?
            .map(|od| DeploymentView::of(&od))
            .transpose()
    }

    fn slice_api(&self, client: Client) -> Api<DynamicObject> {
        let resource = if self.cluster {
            ApiResource::erase::<ClusterObjectSlice>(&())
        } else {
            ApiResource::erase::<ObjectSlice>(&())
        };
        self.api(client, &resource)
    }

    /// Server-side applies the slices of the package's deployment: labelled with the deployment, owned
    /// (not controlled) by the Package; the ObjectSets using a slice add themselves as owners.
    pub async fn apply_slices(&self, client: Client, slices: &[Slice]) -> Result<(), kube::Error> {
        let api = self.slice_api(client);
        for slice in slices {
            let mut metadata = json!({
                "name": slice.name,
                "labels": { SLICE_OWNER_LABEL: self.name() },
                "ownerReferences": [self.owner_reference()],
            });
            if !self.cluster {
                metadata["namespace"] = json!(self.namespace());
            }
            let body = json!({
                "apiVersion": format!("{}/{}", pko_proto::GROUP, pko_proto::VERSION),
                "kind": if self.cluster { "ClusterObjectSlice" } else { "ObjectSlice" },
                "metadata": metadata,
                "objects": slice.objects,
            });
            api.patch(
                &slice.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await?;
        }
        Ok(())
    }

    /// Lets go of the deployment's slices the current template no longer names: deleted when only the
    /// Package owns them, otherwise the Package's owner reference is dropped so the garbage collector
    /// removes them with the last ObjectSet using them.
    ///
    /// `known` are the slices this Package was left owning by the last prune of this process, if it
    /// knows: when every one of them is still current, nothing can be pruned and no list is needed (a
    /// package without slices then lists never again). Returns what it leaves the Package owning, if it
    /// knows (`None` when a slice could not be removed).
    pub async fn prune_slices(
        &self,
        client: Client,
        current: &[Slice],
        known: Option<&BTreeSet<String>>,
    ) -> Result<Option<BTreeSet<String>>, kube::Error> {
        let owned: BTreeSet<String> = current.iter().map(|s| s.name.clone()).collect();
        if known.is_some_and(|known| known.is_subset(&owned)) {
            return Ok(Some(owned));
        }
        let mut settled = true;
        let api = self.slice_api(client);
        let listed = api
            .list(&ListParams::default().labels(&format!("{SLICE_OWNER_LABEL}={}", self.name())))
            .await?;
        for slice in listed.items {
            let name = slice.metadata.name.clone().unwrap_or_default();
            if current.iter().any(|s| s.name == name) {
                continue;
            }
            let owners = slice.metadata.owner_references.clone().unwrap_or_default();
            let others: Vec<_> = owners.iter().filter(|o| o.uid != self.uid()).collect();
            if others.len() == owners.len() {
                continue;
            }
            let result = if others.is_empty() {
                let preconditions = Preconditions {
                    uid: slice.metadata.uid.clone(),
                    resource_version: slice.metadata.resource_version.clone(),
                };
                api.delete(&name, &DeleteParams::default().preconditions(preconditions))
                    .await
                    .map(|_| ())
            } else {
                // The resourceVersion makes the patch fail if an ObjectSet changed the list meanwhile.
                let patch = json!({"metadata": {
                    "ownerReferences": others,
                    "resourceVersion": slice.metadata.resource_version,
                }});
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
            };
            match result {
                Ok(()) => {}
                // Gone or changed meanwhile: the next unpack looks again.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => settled = false,
                Err(e) => return Err(e),
            }
        }
        Ok(settled.then_some(owned))
    }

    fn owner_reference(&self) -> Value {
        json!({
            "apiVersion": format!("{}/{}", pko_proto::GROUP, pko_proto::VERSION),
            "kind": self.kind(),
            "name": self.name(),
            "uid": self.uid(),
        })
    }

    /// Writes `status` through the status subresource.
    pub async fn write_status(
        &self,
        client: Client,
        status: &PackageStatus,
    ) -> Result<(), kube::Error> {
        let resource = if self.cluster {
            ApiResource::erase::<ClusterPackage>(&())
        } else {
            ApiResource::erase::<Package>(&())
        };
        write_status(
            &self.api(client, &resource),
            self.name(),
            status,
            &["conditions"],
        )
        .await
    }
}

/// `deployment` with the trace annotation `observed` carries (or none if it carries none): the trace of
/// an apply says which reconcile wrote it, not what the deployment should be.
fn with_trace_of(deployment: &Value, observed: &Value) -> Value {
    let mut compared = deployment.clone();
    let observed_trace = observed
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(TRACE_PARENT_ANNOTATION))
        .cloned();
    if let Some(annotations) = compared
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        match observed_trace {
            Some(trace) => {
                annotations.insert(TRACE_PARENT_ANNOTATION.to_owned(), trace);
            }
            None => {
                annotations.remove(TRACE_PARENT_ANNOTATION);
            }
        }
    }
    compared
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_annotations(annotations: Value) -> Value {
        json!({"metadata": {"name": "p", "annotations": annotations}, "spec": {"revisionHistoryLimit": 10}})
    }

    #[test]
    fn the_trace_annotation_is_compared_as_the_deployment_carries_it() {
        let desired = with_annotations(json!({"keep": "1", TRACE_PARENT_ANNOTATION: "00-new-01"}));
        // The deployment carries an older trace: compared with that one, the rest as wanted.
        let observed = with_annotations(json!({"keep": "1", TRACE_PARENT_ANNOTATION: "00-old-01"}));
        assert_eq!(
            with_trace_of(&desired, &observed),
            with_annotations(json!({"keep": "1", TRACE_PARENT_ANNOTATION: "00-old-01"}))
        );
        // The deployment carries none: compared without one.
        let untraced = with_annotations(json!({"keep": "1"}));
        assert_eq!(with_trace_of(&desired, &untraced), untraced);
        // Other annotations are compared as wanted: a changed one is still a change.
        let changed = with_annotations(json!({"keep": "2"}));
        assert_ne!(
            with_trace_of(&desired, &changed)["metadata"]["annotations"]["keep"],
            "2"
        );
    }
}

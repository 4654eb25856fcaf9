//! One view of ObjectSet and ClusterObjectSet, so a single actor and planner serve both kinds.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client, Resource};
use pko_proto::core::object_set::{ClusterObjectSet, ObjectSet, ObjectSetSpec, ObjectSetStatus};
use pko_proto::core::object_slice::{ClusterObjectSlice, ObjectSlice};
use pko_proto::core::common::ObjectSetObject;
use serde_json::json;

use crate::engine::desired_object::{OwnerRef, FIELD_MANAGER};

/// Which of the two kinds an ObjectSet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetKind {
    Namespaced,
    Cluster,
}

impl SetKind {
    pub fn kind(self) -> &'static str {
        match self {
            SetKind::Namespaced => "ObjectSet",
            SetKind::Cluster => "ClusterObjectSet",
        }
    }

    pub fn api_resource(self) -> ApiResource {
        match self {
            SetKind::Namespaced => ApiResource::erase::<ObjectSet>(&()),
            SetKind::Cluster => ApiResource::erase::<ClusterObjectSet>(&()),
        }
    }

    /// API for sets of this kind in `namespace` (ignored for cluster sets).
    pub fn api(self, client: Client, namespace: &str) -> Api<DynamicObject> {
        match self {
            SetKind::Namespaced => Api::namespaced_with(client, namespace, &self.api_resource()),
            SetKind::Cluster => Api::all_with(client, &self.api_resource()),
        }
    }
}

/// An ObjectSet or ClusterObjectSet as the engine sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SetObject {
    pub kind: SetKind,
    pub meta: ObjectMeta,
    pub spec: ObjectSetSpec,
    pub status: ObjectSetStatus,
}

impl From<ObjectSet> for SetObject {
    fn from(o: ObjectSet) -> Self {
        Self {
            kind: SetKind::Namespaced,
            meta: o.metadata,
            spec: o.spec,
            status: o.status.unwrap_or_default(),
        }
    }
}

impl From<ClusterObjectSet> for SetObject {
    fn from(o: ClusterObjectSet) -> Self {
        Self {
            kind: SetKind::Cluster,
            meta: o.metadata,
            spec: o.spec,
            status: o.status.unwrap_or_default(),
        }
    }
}

impl SetObject {
    pub fn name(&self) -> &str {
        self.meta.name.as_deref().unwrap_or_default()
    }

    pub fn namespace(&self) -> &str {
        self.meta.namespace.as_deref().unwrap_or_default()
    }

    pub fn uid(&self) -> &str {
        self.meta.uid.as_deref().unwrap_or_default()
    }

    pub fn generation(&self) -> i64 {
        self.meta.generation.unwrap_or_default()
    }

    /// Owner reference data for the objects this set applies.
    pub fn owner(&self) -> OwnerRef {
        OwnerRef {
            api_version: ObjectSet::api_version(&()).into_owned(),
            kind: self.kind.kind().to_owned(),
            name: self.name().to_owned(),
            uid: self.uid().to_owned(),
            namespace: (self.kind == SetKind::Namespaced).then(|| self.namespace().to_owned()),
        }
    }

    /// Writes `status` through the status subresource.
    pub async fn write_status(&self, client: Client, status: &ObjectSetStatus) -> Result<(), kube::Error> {
        let api = self.kind.api(client, self.namespace());
        let patch = json!({ "status": status });
        api.patch_status(self.name(), &PatchParams::apply(FIELD_MANAGER), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }

    /// Reads the objects of an ObjectSlice (ClusterObjectSlice for cluster sets); `None` if it is missing.
    pub async fn slice_objects(&self, client: Client, name: &str) -> Result<Option<Vec<ObjectSetObject>>, kube::Error> {
        match self.kind {
            SetKind::Namespaced => Api::<ObjectSlice>::namespaced(client, self.namespace())
                .get_opt(name)
                .await
                .map(|s| s.map(|s| s.objects)),
            SetKind::Cluster => Api::<ClusterObjectSlice>::all(client)
                .get_opt(name)
                .await
                .map(|s| s.map(|s| s.objects)),
        }
    }
}

//! One view of ObjectTemplate and ClusterObjectTemplate for the ObjectTemplate actor, with its status write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject};
use kube::{Api, Client};
use pko_proto::core::object_template::{
    ClusterObjectTemplate, ObjectTemplate, ObjectTemplateSpec, ObjectTemplateStatus,
};
use serde_json::{json, Value};

use crate::objects::object_meta::write_status;
use crate::runtime::meta_view::MetaView;

/// An ObjectTemplate (namespaced) or ClusterObjectTemplate.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateObject {
    pub cluster: bool,
    pub meta: ObjectMeta,
    pub spec: ObjectTemplateSpec,
    pub status: ObjectTemplateStatus,
}

impl From<ObjectTemplate> for TemplateObject {
    fn from(t: ObjectTemplate) -> Self {
        Self {
            cluster: false,
            meta: t.metadata,
            spec: t.spec,
            status: t.status.unwrap_or_default(),
        }
    }
}

impl From<ClusterObjectTemplate> for TemplateObject {
    fn from(t: ClusterObjectTemplate) -> Self {
        Self {
            cluster: true,
            meta: t.metadata,
            spec: t.spec,
            status: t.status.unwrap_or_default(),
        }
    }
}

impl MetaView for TemplateObject {
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    fn kind(&self) -> &'static str {
        if self.cluster {
            "ClusterObjectTemplate"
        } else {
            "ObjectTemplate"
        }
    }

    fn same_status(&self, other: &Self) -> bool {
        self.status == other.status
    }
}

impl TemplateObject {
    /// The namespace sources and the object are confined to (None for ClusterObjectTemplate).
    pub fn own_namespace(&self) -> Option<&str> {
        (!self.cluster).then(|| self.namespace())
    }

    /// The controller reference the templated object carries.
    pub fn owner_reference(&self) -> Value {
        json!({
            "apiVersion": format!("{}/{}", pko_proto::GROUP, pko_proto::VERSION),
            "kind": self.kind(),
            "name": self.name(),
            "uid": self.uid(),
            "controller": true,
            "blockOwnerDeletion": true,
        })
    }

    /// Writes `status` through the status subresource.
    pub async fn write_status(
        &self,
        client: Client,
        status: &ObjectTemplateStatus,
    ) -> Result<(), kube::Error> {
        let api: Api<DynamicObject> = if self.cluster {
            Api::all_with(client, &ApiResource::erase::<ClusterObjectTemplate>(&()))
        } else {
            Api::namespaced_with(
                client,
                self.namespace(),
                &ApiResource::erase::<ObjectTemplate>(&()),
            )
        };
        // `phase` explicitly (null clears it); the serialized status would skip it when unset.
        let body = json!({"conditions": status.conditions, "phase": status.phase});
        write_status(&api, self.name(), &body, &["conditions"]).await
    }
}

//! What the runtime reads of any object it feeds and reconciles: name, namespace, UID, generation, the
//! controlling owner and the trace parent of the write that made the version. Kinds implement it for
//! their views; the runtime knows no kind.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// Name, namespace, UID, generation and controller of an object, empty or zero when unset.
pub trait MetaView {
    fn meta(&self) -> &ObjectMeta;

    /// The object's kind, as keys, spans and Events name it.
    fn kind(&self) -> &'static str;

    /// Whether `other` carries the same status as this version: what pko writes of the object itself
    /// (its status, and an annotation pko writes with it), compared to tell pko's own write coming
    /// back from a change. `false` unless a kind says how, so that every version is taken as a change.
    fn same_status(&self, _other: &Self) -> bool
    where
        Self: Sized,
    {
        false
    }

    fn name(&self) -> &str {
        self.meta().name.as_deref().unwrap_or_default()
    }

    fn namespace(&self) -> &str {
        self.meta().namespace.as_deref().unwrap_or_default()
    }

    fn uid(&self) -> &str {
        self.meta().uid.as_deref().unwrap_or_default()
    }

    fn generation(&self) -> i64 {
        self.meta().generation.unwrap_or_default()
    }

    /// The `traceparent` of the write that made this version (`well_known::TRACE_PARENT_ANNOTATION`).
    fn traceparent(&self) -> Option<&str> {
        self.meta()
            .annotations
            .as_ref()?
            .get(pko_proto::well_known::TRACE_PARENT_ANNOTATION)
            .map(String::as_str)
    }

    /// The owner reference marked as controller, if any.
    fn controller(&self) -> Option<&OwnerReference> {
        self.meta()
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true))
    }
}

impl MetaView for pko_proto::core::hosted_cluster_package::HostedClusterPackage {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn kind(&self) -> &'static str {
        "HostedClusterPackage"
    }

    /// Annotations are compared too: approvals and undo requests come as annotations, which leave the
    /// generation as it was.
    fn same_status(&self, other: &Self) -> bool {
        self.status == other.status && self.metadata.annotations == other.metadata.annotations
    }
}

impl MetaView for pko_proto::hypershift::HostedCluster {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn kind(&self) -> &'static str {
        "HostedCluster"
    }
}

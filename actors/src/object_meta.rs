//! Accessors shared by the engine's views of package-operator objects.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// Name, namespace, UID, generation and controller of an object, empty or zero when unset.
pub trait MetaView {
    fn meta(&self) -> &ObjectMeta;

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

    /// The owner reference marked as controller, if any.
    fn controller(&self) -> Option<&OwnerReference> {
        self.meta()
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true))
    }
}

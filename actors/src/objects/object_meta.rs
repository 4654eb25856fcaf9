//! Accessors shared by the engine's views of package-operator objects, and their status writes (the one
//! function every actor writes status through).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::engine::desired_object::FIELD_MANAGER;

/// The merge patch that writes `status`. Empty lists are not serialized, and a merge patch keeps what it
/// does not name, so each of `lists` that is absent is spelled out as `[]`: a list that became empty (a
/// set's `controllerOf` after archival) must not keep its old items.
pub fn status_merge_patch(status: &impl serde::Serialize, lists: &[&str]) -> Value {
    let mut status = serde_json::to_value(status).unwrap_or_else(|_| json!({}));
    if let Some(map) = status.as_object_mut() {
        for list in lists {
            map.entry(*list).or_insert_with(|| json!([]));
        }
    }
    json!({ "status": status })
}

/// Writes `status` through the status subresource: the one way pko writes a status. A JSON merge patch
/// (not server-side apply): pko is the only writer of these statuses, so there is no field ownership to
/// share, and the patch carries exactly the status pko computed. `lists` are spelled out even when empty
/// ([`status_merge_patch`]).
pub async fn write_status<K>(
    api: &Api<K>,
    name: &str,
    status: &impl serde::Serialize,
    lists: &[&str],
) -> Result<(), kube::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER),
        &Patch::Merge(&status_merge_patch(status, lists)),
    )
    .await
    .map(|_| ())
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emptied_lists_are_spelled_out_in_status_patches() {
        let status = json!({"phase": "Archived", "conditions": [{"type": "Archived"}]});
        assert_eq!(
            status_merge_patch(&status, &["conditions", "controllerOf"]),
            json!({"status": {"phase": "Archived", "conditions": [{"type": "Archived"}], "controllerOf": []}})
        );
    }
}

//! Accessors shared by the engine's views of package-operator objects, and their status writes (the one
//! function every actor writes status through).

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::engine::objects::desired_object::FIELD_MANAGER;
use crate::engine::objects::status_patch::merge_patch_between;
use pko_proto::well_known::SERVICE_ACCOUNT_ANNOTATION;

/// The object's creation time in Unix seconds (0 when the apiserver has not set it).
pub fn creation_seconds(meta: &ObjectMeta) -> i64 {
    meta.creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
        .unwrap_or_default()
}

/// What Events about a package-operator.run object of `kind` name. Events of a cluster-scoped object
/// live in `default` (kube's recorder puts them there; apiservers before 1.22 want the reference to say
/// so too).
pub fn event_reference(kind: &str, meta: &ObjectMeta) -> ObjectReference {
    ObjectReference {
        api_version: Some(format!("{}/{}", pko_proto::GROUP, pko_proto::VERSION)),
        kind: Some(kind.to_owned()),
        name: meta.name.clone(),
        namespace: Some(
            meta.namespace
                .clone()
                .filter(|ns| !ns.is_empty())
                .unwrap_or_else(|| "default".to_owned()),
        ),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        field_path: None,
    }
}

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

/// [`status_merge_patch`] with `read_at`, when given, as its resourceVersion precondition: the apiserver
/// refuses it (409) when the object changed since.
pub fn status_merge_patch_over(
    status: &impl serde::Serialize,
    lists: &[&str],
    read_at: Option<&str>,
) -> Value {
    over_version(status_merge_patch(status, lists), read_at)
}

/// `patch` with `read_at`, when given, as its resourceVersion precondition.
fn over_version(mut patch: Value, read_at: Option<&str>) -> Value {
    if let Some(version) = read_at {
        patch["metadata"] = json!({ "resourceVersion": version });
    }
    patch
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
    K: Clone + DeserializeOwned + std::fmt::Debug + Resource,
{
    write_status_over(api, name, status, lists, None)
        .await
        .map(|_| ())
}

/// [`write_status`], only over the object at `read_at` when given (a resourceVersion precondition: a
/// changed object fails with 409). Returns the resourceVersion written.
pub async fn write_status_over<K>(
    api: &Api<K>,
    name: &str,
    status: &impl serde::Serialize,
    lists: &[&str],
    read_at: Option<&str>,
) -> Result<Option<String>, kube::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug + Resource,
{
    send_status_patch(api, name, status_merge_patch_over(status, lists, read_at)).await
}

/// Writes `status` over `stored`, the status of the object at `read_at`: the patch is the difference
/// between the two ([`merge_patch_between`]), so a field `status` no longer has is removed, where
/// [`write_status_over`] would keep it. Returns the resourceVersion written.
pub async fn replace_status_over<K>(
    api: &Api<K>,
    name: &str,
    stored: &impl serde::Serialize,
    status: &impl serde::Serialize,
    read_at: Option<&str>,
) -> Result<Option<String>, kube::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug + Resource,
{
    let stored = serde_json::to_value(stored).unwrap_or_else(|_| json!({}));
    let status = serde_json::to_value(status).unwrap_or_else(|_| json!({}));
    let patch = json!({ "status": merge_patch_between(&stored, &status) });
    send_status_patch(api, name, over_version(patch, read_at)).await
}

async fn send_status_patch<K>(
    api: &Api<K>,
    name: &str,
    patch: Value,
) -> Result<Option<String>, kube::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug + Resource,
{
    let written = api
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(written.meta().resource_version.clone())
}

/// The ServiceAccount an owner names with [`SERVICE_ACCOUNT_ANNOTATION`], if any: whose rights its objects
/// are written with (`objects::owner_identity`), and what a Package, an ObjectDeployment and an ObjectSet
/// carry down to what they create.
pub fn requested_service_account(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(SERVICE_ACCOUNT_ANNOTATION)
        .map(String::as_str)
}

/// `meta` without its managed fields, the bulk of it: what a watch feed keeps of a deleted object.
pub fn tombstone_meta(meta: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        managed_fields: None,
        ..meta.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_written_only_over_the_version_it_was_planned_from() {
        let status = json!({});
        let patch = status_merge_patch_over(&status, &["processing"], Some("4711"));
        assert_eq!(patch["metadata"]["resourceVersion"], "4711");
        assert_eq!(patch["status"]["processing"], json!([]));
        assert!(status_merge_patch_over(&status, &["processing"], None)
            .get("metadata")
            .is_none());
    }

    #[test]
    fn emptied_lists_are_spelled_out_in_status_patches() {
        let status = json!({"phase": "Archived", "conditions": [{"type": "Archived"}]});
        assert_eq!(
            status_merge_patch(&status, &["conditions", "controllerOf"]),
            json!({"status": {"phase": "Archived", "conditions": [{"type": "Archived"}], "controllerOf": []}})
        );
    }
}

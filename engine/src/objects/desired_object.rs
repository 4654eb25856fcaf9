//! Turns the objects of a phase, as a user wrote them, into the objects pko applies: validated, namespaced,
//! labelled, annotated with the revision and controlled by their owner.
//!
//! Owns every rule about what a desired object may look like (no ownerReferences, no foreign namespace, no
//! duplicates, a known collision protection, none of pko's own objects). It must not talk to the apiserver.

use pko_proto::well_known::{CACHE_LABEL, OWNERS_ANNOTATION, REVISION_ANNOTATION};
use std::collections::BTreeMap;

use pko_proto::core::common::{CollisionProtection, ConditionMapping, ObjectSetObject};
use serde_json::{json, Map, Value};

use crate::objects::object_ref::ObjectKey;
use crate::objects::reserved_objects::reserved_for_pko;

/// Field manager of every server-side apply pko makes.
pub const FIELD_MANAGER: &str = "package-operator";

/// The object that owns a phase's objects (an ObjectSet, ClusterObjectSet or ObjectSetPhase).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
    /// `None` for cluster-scoped owners, which may own objects in any namespace.
    pub namespace: Option<String>,
    /// The owner lives in another cluster (an ObjectSetPhase applied by a hosted-cluster connector): it is
    /// recorded in [`OWNERS_ANNOTATION`], and its `namespace` neither defaults nor confines the objects'.
    pub remote: bool,
}

/// One object ready to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct DesiredObject {
    pub key: ObjectKey,
    /// The full apply body, including pko's metadata.
    pub object: Value,
    pub collision_protection: CollisionProtection,
    pub condition_mappings: Vec<ConditionMapping>,
    /// False for externalObjects: observed and probed, never written.
    pub managed: bool,
}

/// A desired object pko refuses to apply; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct InvalidObject {
    pub field: String,
    pub problem: String,
}

/// Prepares the `objects` and `externalObjects` of one phase. `field` is the phase's path in the owner's spec
/// (`spec.phases[1]`), used in error messages.
pub fn prepare_phase(
    owner: &OwnerRef,
    revision: i64,
    field: &str,
    objects: &[ObjectSetObject],
    external_objects: &[ObjectSetObject],
) -> Result<Vec<DesiredObject>, InvalidObject> {
    let managed = objects
        .iter()
        .enumerate()
        .map(|(i, o)| (format!("{field}.objects[{i}]"), o, true));
    let external = external_objects
        .iter()
        .enumerate()
        .map(|(i, o)| (format!("{field}.externalObjects[{i}]"), o, false));
    managed
        .chain(external)
        .map(|(f, o, is_managed)| prepare_object(owner, revision, &f, o, is_managed))
        .collect()
}

/// `object` checked and placed as a phase of `owner` applies it (namespace confined or defaulted), but
/// without pko's marks: what a preview of the apply (a release's dry run) sends. `field` names it.
pub fn unmarked_object(
    owner: &OwnerRef,
    field: &str,
    object: &Value,
) -> Result<DesiredObject, InvalidObject> {
    let spec = ObjectSetObject {
        object: object.clone(),
        ..ObjectSetObject::default()
    };
    prepare_object(owner, 0, field, &spec, false)
}

fn invalid(field: &str, problem: impl Into<String>) -> InvalidObject {
    InvalidObject {
        field: field.to_owned(),
        problem: problem.into(),
    }
}

fn prepare_object(
    owner: &OwnerRef,
    revision: i64,
    field: &str,
    spec: &ObjectSetObject,
    managed: bool,
) -> Result<DesiredObject, InvalidObject> {
    if !spec.collision_protection.is_known() {
        return Err(invalid(
            &format!("{field}.collisionProtection"),
            format!(
                "unknown value {:?} (want Prevent, IfNoController or None)",
                spec.collision_protection.as_str()
            ),
        ));
    }
    let mut object = spec.object.clone();
    let body = object
        .as_object_mut()
        .ok_or_else(|| invalid(&format!("{field}.object"), "must be a JSON object"))?;
    for required in ["apiVersion", "kind"] {
        if body
            .get(required)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(invalid(
                &format!("{field}.object.{required}"),
                "is required",
            ));
        }
    }
    let metadata = body
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| invalid(&format!("{field}.object.metadata"), "must be an object"))?;
    check_metadata(field, metadata)?;
    confine_namespace(owner, field, metadata)?;
    if managed {
        mark_managed(owner, revision, metadata);
    }
    let key = ObjectKey::of(&object)
        .ok_or_else(|| invalid(&format!("{field}.object.apiVersion"), "is malformed"))?;
    // A hosted cluster has no connector objects of pko's; on the management cluster they are pko's own.
    if !owner.remote {
        if let Some(problem) = reserved_for_pko(&key, &object) {
            return Err(invalid(&format!("{field}.object"), problem));
        }
    }
    Ok(DesiredObject {
        key,
        object,
        collision_protection: spec.collision_protection.clone(),
        condition_mappings: spec.condition_mappings.clone(),
        managed,
    })
}

/// The metadata checks of an object in a spec: a name, and no owners of its own (pko sets them).
fn check_metadata(field: &str, metadata: &Map<String, Value>) -> Result<(), InvalidObject> {
    if metadata
        .get("name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(invalid(
            &format!("{field}.object.metadata.name"),
            "is required",
        ));
    }
    if metadata
        .get("ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| !refs.is_empty())
    {
        return Err(invalid(
            &format!("{field}.object.metadata.ownerReferences"),
            "must be empty: pko sets the owner itself",
        ));
    }
    if metadata
        .get("annotations")
        .and_then(|a| a.get(OWNERS_ANNOTATION))
        .is_some()
    {
        return Err(invalid(
            &format!("{field}.object.metadata.annotations[{OWNERS_ANNOTATION}]"),
            "must not be set: pko sets the owner itself",
        ));
    }
    Ok(())
}

/// An object of a namespaced owner goes into the owner's namespace (the default) and no other one.
fn confine_namespace(
    owner: &OwnerRef,
    field: &str,
    metadata: &mut Map<String, Value>,
) -> Result<(), InvalidObject> {
    if let Some(owner_ns) = owner.namespace.as_ref().filter(|_| !owner.remote) {
        match metadata.get("namespace").and_then(Value::as_str) {
            None | Some("") => {
                metadata.insert("namespace".to_owned(), json!(owner_ns));
            }
            Some(ns) if ns != owner_ns => {
                return Err(invalid(
                    &format!("{field}.object.metadata.namespace"),
                    format!("{ns:?} is outside the owner's namespace {owner_ns:?}"),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// What marks an object as managed by `owner` at `revision`: the cache label, the revision annotation,
/// and the owner (a controller reference, or for a hosted cluster the owners annotation).
fn mark_managed(owner: &OwnerRef, revision: i64, metadata: &mut Map<String, Value>) {
    insert_string(metadata, "labels", CACHE_LABEL, "True");
    insert_string(
        metadata,
        "annotations",
        REVISION_ANNOTATION,
        &revision.to_string(),
    );
    if owner.remote {
        let owners = json!([{
            "apiVersion": owner.api_version,
            "kind": owner.kind,
            "name": owner.name,
            "namespace": owner.namespace,
            "uid": owner.uid,
            "controller": true,
        }]);
        insert_string(
            metadata,
            "annotations",
            OWNERS_ANNOTATION,
            &owners.to_string(),
        );
    } else {
        metadata.insert(
            "ownerReferences".to_owned(),
            json!([{
                "apiVersion": owner.api_version,
                "kind": owner.kind,
                "name": owner.name,
                "uid": owner.uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }]),
        );
    }
}

fn insert_string(metadata: &mut Map<String, Value>, map: &str, key: &str, value: &str) {
    let entry = metadata
        .entry(map.to_owned())
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    if let Some(m) = entry.as_object_mut() {
        m.insert(key.to_owned(), json!(value));
    }
}

/// Rejects an object that appears twice across the phases of one set (same group, kind, namespace and
/// name); `fields` are the objects' field paths in the same order as `objects`.
pub fn find_duplicate<'a>(
    objects: impl IntoIterator<Item = (&'a str, &'a DesiredObject)>,
) -> Result<(), InvalidObject> {
    let mut seen: BTreeMap<(String, String, String, String), &str> = BTreeMap::new();
    for (field, object) in objects {
        if let Some(first) = seen.insert(object.key.without_version(), field) {
            return Err(invalid(
                field,
                format!("duplicates {first} ({})", object.key),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(namespace: Option<&str>) -> OwnerRef {
        OwnerRef {
            api_version: "package-operator.run/v1alpha1".to_owned(),
            kind: "ObjectSet".to_owned(),
            name: "set".to_owned(),
            uid: "uid-1".to_owned(),
            namespace: namespace.map(str::to_owned),
            remote: false,
        }
    }

    fn cm(extra: Value) -> ObjectSetObject {
        let mut object =
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}});
        if let (Some(o), Some(e)) = (object.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                o.insert(k.clone(), v.clone());
            }
        }
        ObjectSetObject {
            object,
            ..Default::default()
        }
    }

    #[test]
    fn defaults_namespace_and_adds_ownership() {
        let got = prepare_phase(
            &owner(Some("ns")),
            3,
            "spec.phases[0]",
            &[cm(json!({}))],
            &[],
        )
        .unwrap();
        let o = &got[0].object;
        assert_eq!(o["metadata"]["namespace"], "ns");
        assert_eq!(o["metadata"]["labels"][CACHE_LABEL], "True");
        assert_eq!(o["metadata"]["annotations"][REVISION_ANNOTATION], "3");
        assert_eq!(o["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(o["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(got[0].key.namespace, "ns");
    }

    #[test]
    fn remote_owners_are_recorded_in_the_annotation_and_do_not_confine_namespaces() {
        let remote = OwnerRef {
            kind: "ObjectSetPhase".to_owned(),
            remote: true,
            ..owner(Some("clusters-a"))
        };
        let elsewhere = cm(json!({"metadata": {"name": "cm", "namespace": "hosted-ns"}}));
        let got = prepare_phase(&remote, 2, "p", &[elsewhere, cm(json!({}))], &[]).unwrap();
        let o = &got[0].object;
        assert_eq!(got[0].key.namespace, "hosted-ns");
        assert!(o["metadata"].get("ownerReferences").is_none());
        let owners: Value = serde_json::from_str(
            o["metadata"]["annotations"][OWNERS_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            owners,
            json!([{"apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSetPhase",
                    "name": "set", "namespace": "clusters-a", "uid": "uid-1", "controller": true}])
        );
        assert_eq!(o["metadata"]["annotations"][REVISION_ANNOTATION], "2");
        // No namespace is made up for the hosted cluster: the applier's preflight names a missing one.
        assert_eq!(got[1].key.namespace, "");

        let forged =
            cm(json!({"metadata": {"name": "cm", "annotations": {OWNERS_ANNOTATION: "[]"}}}));
        let err = prepare_phase(&remote, 1, "p", &[forged], &[]).unwrap_err();
        assert_eq!(
            err.field,
            format!("p.objects[0].object.metadata.annotations[{OWNERS_ANNOTATION}]")
        );
    }

    #[test]
    fn external_objects_are_not_marked() {
        let got = prepare_phase(&owner(Some("ns")), 1, "p", &[], &[cm(json!({}))]).unwrap();
        assert!(!got[0].managed);
        assert!(got[0].object["metadata"].get("ownerReferences").is_none());
    }

    #[test]
    fn rejects_bad_objects_naming_the_field() {
        let foreign = cm(json!({"metadata": {"name": "cm", "namespace": "other"}}));
        let err =
            prepare_phase(&owner(Some("ns")), 1, "spec.phases[0]", &[foreign], &[]).unwrap_err();
        assert_eq!(
            err.field,
            "spec.phases[0].objects[0].object.metadata.namespace"
        );

        let owned = cm(json!({"metadata": {"name": "cm", "ownerReferences": [{"uid": "x"}]}}));
        let err = prepare_phase(&owner(Some("ns")), 1, "p", &[owned], &[]).unwrap_err();
        assert!(err.to_string().contains("ownerReferences"), "{err}");

        let no_kind = ObjectSetObject {
            object: json!({"apiVersion": "v1", "metadata": {"name": "x"}}),
            ..Default::default()
        };
        let err = prepare_phase(&owner(None), 1, "p", &[no_kind], &[]).unwrap_err();
        assert_eq!(err.field, "p.objects[0].object.kind");

        let mut unknown = cm(json!({}));
        unknown.collision_protection = CollisionProtection::Unknown("Maybe".to_owned());
        let err = prepare_phase(&owner(None), 1, "p", &[unknown], &[]).unwrap_err();
        assert_eq!(err.field, "p.objects[0].collisionProtection");
    }

    #[test]
    fn duplicates_are_found_across_versions() {
        let a = prepare_phase(&owner(Some("ns")), 1, "p", &[cm(json!({}))], &[]).unwrap();
        let mut b = a[0].clone();
        b.key.version = "v2".to_owned();
        let err = find_duplicate([("a", &a[0]), ("b", &b)]).unwrap_err();
        assert_eq!(err.field, "b");
        assert!(err.problem.contains("duplicates a"));
    }
}

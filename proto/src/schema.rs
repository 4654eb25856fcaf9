//! Hand-written OpenAPI schemas for the fields whose Rust type cannot say what the CRD must say:
//! embedded Kubernetes objects, free-form configuration, and the reduced ObjectMeta that nested templates
//! carry. Everything else is derived from the types.

use schemars::{json_schema, Schema, SchemaGenerator};

/// A complete Kubernetes object stored verbatim (`unstructured.Unstructured` in Package Operator):
/// apiVersion, kind and metadata are validated by the apiserver, everything else is kept.
pub(crate) fn embedded_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-embedded-resource": true,
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Arbitrary JSON object kept verbatim (`runtime.RawExtension`, e.g. Package `spec.config`).
pub(crate) fn preserved_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// ObjectMeta nested inside a spec (ObjectSet and Package templates). Only the fields a template can
/// meaningfully set are kept; the apiserver prunes the rest, as it does for Package Operator's CRDs.
pub(crate) fn template_object_meta(_: &mut SchemaGenerator) -> Schema {
    let string_map = json_schema!({
        "type": "object",
        "additionalProperties": { "type": "string" },
    });
    json_schema!({
        "type": "object",
        "properties": {
            "name": { "type": "string" },
            "namespace": { "type": "string" },
            "labels": string_map.clone(),
            "annotations": string_map,
            "finalizers": { "type": "array", "items": { "type": "string" } },
        },
    })
}

/// `true` when a value equals its type's default; used to omit empty optional structs on output, as
/// Package Operator's `omitempty` does.
pub(crate) fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

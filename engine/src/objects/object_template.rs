//! The rules of ObjectTemplate and ClusterObjectTemplate: where each source lives, how its values are
//! copied into `.config`, how the rendered object is made ours, and the status conditions.
//!
//! Pure: sources come in as already-read JSON, the rendered object goes out as JSON. Reading sources,
//! watching them and applying the object is the actor's.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use pko_proto::core::object_template::ObjectTemplateSource;
use pko_proto::well_known::CACHE_LABEL;
use serde_json::{json, Map, Value};

use crate::conditions::{remove_condition, set_condition, ConditionUpdate};

use crate::objects::object_ref::{split_api_version, ObjectKey};
use crate::objects::reserved_objects::reserved_for_pko;
use pko_package::template::render;
use pko_package::template_funcs::package_funcs;
use pko_package::yaml::parse_untrusted_yaml;

/// The condition an unusable template or source sets.
pub const INVALID: &str = "Invalid";

/// Why a template cannot produce its object; becomes `Invalid=True` with this reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateProblem {
    #[error("{0}")]
    Source(String),
    #[error("{0}")]
    Template(String),
}

impl TemplateProblem {
    pub fn reason(&self) -> &'static str {
        match self {
            TemplateProblem::Source(_) => "SourceError",
            TemplateProblem::Template(_) => "TemplateError",
        }
    }
}

/// Where source `index` lives. An ObjectTemplate (`own_namespace` set) reads only its own namespace;
/// a ClusterObjectTemplate reads any.
pub fn source_key(
    own_namespace: Option<&str>,
    index: usize,
    source: &ObjectTemplateSource,
) -> Result<ObjectKey, TemplateProblem> {
    let namespace = match own_namespace {
        Some(own) if !source.namespace.is_empty() && source.namespace != own => {
            return Err(TemplateProblem::Source(format!(
                "spec.sources[{index}]: namespace {:?} is not the ObjectTemplate's namespace {own:?}",
                source.namespace
            )))
        }
        Some(own) => own.to_owned(),
        None => source.namespace.clone(),
    };
    let (group, version) = split_api_version(&source.api_version);
    if version.is_empty() || source.kind.is_empty() || source.name.is_empty() {
        return Err(TemplateProblem::Source(format!(
            "spec.sources[{index}]: apiVersion, kind and name are required"
        )));
    }
    let key = ObjectKey {
        group: group.to_owned(),
        version: version.to_owned(),
        kind: source.kind.clone(),
        namespace,
        name: source.name.clone(),
    };
    // pko's own objects are not a template's to read (the manager may read them where a tenant may not).
    match reserved_for_pko(&key, &Value::Null) {
        Some(problem) => Err(TemplateProblem::Source(format!(
            "spec.sources[{index}]: {problem}"
        ))),
        None => Ok(key),
    }
}

/// `.a.b` → `["a", "b"]`; the leading dot is required, as in Package Operator.
fn path_segments<'a>(path: &'a str, field: &str) -> Result<Vec<&'a str>, String> {
    let rest = path
        .strip_prefix('.')
        .ok_or_else(|| format!("{field} {path:?} must start with '.'"))?;
    let segments: Vec<&str> = rest.split('.').collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err(format!("{field} {path:?} has an empty segment"));
    }
    Ok(segments)
}

/// Copies the items of source `index` from `object` into `config`. Values are copied as the apiserver
/// holds them: a Secret's `.data` stays base64, as in Package Operator (templates use `b64dec`).
pub fn copy_items(
    index: usize,
    source: &ObjectTemplateSource,
    object: &Value,
    config: &mut Map<String, Value>,
) -> Result<(), TemplateProblem> {
    let problem = |message: String| {
        TemplateProblem::Source(format!(
            "spec.sources[{index}] ({} {}): {message}",
            source.kind, source.name
        ))
    };
    for (i, item) in source.items.iter().enumerate() {
        let key = path_segments(&item.key, &format!("items[{i}].key")).map_err(problem)?;
        let destination = path_segments(&item.destination, &format!("items[{i}].destination"))
            .map_err(problem)?;
        let value = key
            .iter()
            .try_fold(object, |v, segment| v.get(segment))
            .cloned()
            .ok_or_else(|| problem(format!("key {:?} not found", item.key)))?;
        let (last, parents) = destination
            .split_last()
            .ok_or_else(|| problem(format!("destination {:?} is empty", item.destination)))?;
        let mut target = &mut *config;
        for segment in parents {
            let entry = target
                .entry((*segment).to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
            target = entry.as_object_mut().ok_or_else(|| {
                problem(format!(
                    "destination {:?}: {segment:?} already holds a value",
                    item.destination
                ))
            })?;
        }
        target.insert((*last).to_owned(), value);
    }
    Ok(())
}

/// Renders the template with `.config` and `.environment` (a Package's, see `package::environment`) and
/// makes the object ours: namespace forced to the template's (ObjectTemplate), pko's cache label, and a
/// controller reference to `owner`.
pub fn render_object(
    template: &str,
    config: Map<String, Value>,
    environment: Value,
    own_namespace: Option<&str>,
    owner: &Value,
) -> Result<Value, TemplateProblem> {
    let context = json!({ "config": config, "environment": environment });
    let funcs = package_funcs(Default::default(), std::sync::Arc::new(context.clone()));
    let text = render("spec.template", template, &[], &funcs, &context)
        .map_err(|e| TemplateProblem::Template(e.to_string()))?;
    let mut object: Value = parse_untrusted_yaml(&text)
        .map_err(|e| TemplateProblem::Template(format!("spec.template: rendered YAML: {e}")))?;
    let Some(map) = object.as_object_mut() else {
        return Err(TemplateProblem::Template(
            "spec.template: does not render to an object".to_owned(),
        ));
    };
    let metadata = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(metadata) = metadata.as_object_mut() else {
        return Err(TemplateProblem::Template(
            "spec.template: metadata is not a map".to_owned(),
        ));
    };
    if let Some(own) = own_namespace {
        match metadata.get("namespace").and_then(Value::as_str) {
            Some(ns) if !ns.is_empty() && ns != own => {
                return Err(TemplateProblem::Template(format!(
                    "spec.template: renders namespace {ns:?}; an ObjectTemplate creates objects in its own namespace {own:?}"
                )))
            }
            _ => {
                metadata.insert("namespace".to_owned(), Value::String(own.to_owned()));
            }
        }
    }
    let labels = metadata
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(labels) = labels.as_object_mut() {
        labels.insert(CACHE_LABEL.to_owned(), Value::String("True".to_owned()));
    }
    metadata.insert("ownerReferences".to_owned(), json!([owner]));
    let Some(key) = ObjectKey::of(&object) else {
        return Err(TemplateProblem::Template(
            "spec.template: the object needs apiVersion, kind and metadata.name".to_owned(),
        ));
    };
    if let Some(problem) = reserved_for_pko(&key, &object) {
        return Err(TemplateProblem::Template(format!(
            "spec.template: {problem}"
        )));
    }
    Ok(object)
}

/// The template's conditions: `Invalid` from `problem`, plus every condition of the templated object that
/// is current for the object's generation, copied with the template's generation.
pub fn template_conditions(
    existing: &[Condition],
    generation: i64,
    problem: Option<&TemplateProblem>,
    object: Option<&Value>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut conditions = existing.to_vec();
    match problem {
        Some(p) => set_condition(
            &mut conditions,
            ConditionUpdate::new(INVALID, true, p.reason(), p.to_string()),
            generation,
            now,
        ),
        None => remove_condition(&mut conditions, INVALID),
    }
    let Some(object) = object else {
        return conditions;
    };
    let object_generation = object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64);
    let copied = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| serde_json::from_value::<Condition>(c.clone()).ok())
        .filter(|c| c.type_ != INVALID)
        .filter(|c| c.observed_generation.is_none() || c.observed_generation == object_generation);
    for c in copied {
        set_condition(
            &mut conditions,
            ConditionUpdate::new(&c.type_, c.status == "True", &c.reason, c.message),
            generation,
            now,
        );
    }
    conditions
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_proto::core::object_template::ObjectTemplateSourceItem;

    fn source(kind: &str, ns: &str, items: &[(&str, &str)]) -> ObjectTemplateSource {
        ObjectTemplateSource {
            api_version: "v1".to_owned(),
            kind: kind.to_owned(),
            namespace: ns.to_owned(),
            name: "src".to_owned(),
            items: items
                .iter()
                .map(|(k, d)| ObjectTemplateSourceItem {
                    key: (*k).to_owned(),
                    destination: (*d).to_owned(),
                })
                .collect(),
            optional: false,
        }
    }

    #[test]
    fn sources_stay_in_the_templates_namespace() {
        let key = source_key(Some("team"), 0, &source("ConfigMap", "", &[])).unwrap();
        assert_eq!(key.namespace, "team");
        let err = source_key(Some("team"), 1, &source("ConfigMap", "other", &[])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.sources[1]: namespace \"other\" is not the ObjectTemplate's namespace \"team\""
        );
        let key = source_key(None, 0, &source("ConfigMap", "other", &[])).unwrap();
        assert_eq!(key.namespace, "other");
    }

    #[test]
    fn items_copy_nested_values_and_keep_secrets_base64() {
        let mut config = Map::new();
        let cm = json!({"data": {"host": "db.local", "port": "5432"}});
        copy_items(
            0,
            &source(
                "ConfigMap",
                "",
                &[(".data.host", ".db.host"), (".data", ".raw")],
            ),
            &cm,
            &mut config,
        )
        .unwrap();
        let secret = json!({"data": {"password": "czNjcmV0"}});
        copy_items(
            1,
            &source("Secret", "", &[(".data.password", ".db.password")]),
            &secret,
            &mut config,
        )
        .unwrap();
        assert_eq!(
            Value::Object(config),
            json!({"db": {"host": "db.local", "password": "czNjcmV0"}, "raw": {"host": "db.local", "port": "5432"}})
        );
    }

    #[test]
    fn bad_paths_and_missing_keys_name_the_source_and_item() {
        let mut config = Map::new();
        let err = copy_items(
            2,
            &source("ConfigMap", "", &[("data.host", ".x")]),
            &json!({}),
            &mut config,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.sources[2] (ConfigMap src): items[0].key \"data.host\" must start with '.'"
        );
        let err = copy_items(
            0,
            &source("ConfigMap", "", &[(".data.nope", ".x")]),
            &json!({"data": {}}),
            &mut config,
        )
        .unwrap_err();
        assert_eq!(err.reason(), "SourceError");
        assert!(
            err.to_string().ends_with("key \".data.nope\" not found"),
            "{err}"
        );
    }

    #[test]
    fn rendered_objects_are_ours_and_stay_in_the_namespace() {
        let owner = json!({"apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectTemplate", "name": "t", "uid": "u1", "controller": true});
        let mut config = Map::new();
        config.insert("host".to_owned(), json!("db.local"));
        let environment = json!({"kubernetes": {"version": "v1.37.2"}});
        let object = render_object(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: out\ndata:\n  host: {{ .config.host | upper }}\n  kube: {{ .environment.kubernetes.version }}\n",
            config.clone(),
            environment.clone(),
            Some("team"),
            &owner,
        )
        .unwrap();
        assert_eq!(object["metadata"]["namespace"], "team");
        assert_eq!(object["metadata"]["labels"][CACHE_LABEL], "True");
        assert_eq!(object["metadata"]["ownerReferences"][0]["uid"], "u1");
        assert_eq!(object["data"]["host"], "DB.LOCAL");
        assert_eq!(object["data"]["kube"], "v1.37.2");

        let err = render_object(
            "kind: ConfigMap\nmetadata: {name: x, namespace: elsewhere}\napiVersion: v1\n",
            config.clone(),
            environment.clone(),
            Some("team"),
            &owner,
        )
        .unwrap_err();
        assert_eq!(err.reason(), "TemplateError");
        let err = render_object(
            "{{ .config.missing }}",
            config,
            environment,
            Some("team"),
            &owner,
        )
        .unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[test]
    fn conditions_copy_fresh_object_conditions_and_track_invalid() {
        let now = Timestamp::now();
        let object = json!({"metadata": {"generation": 2}, "status": {"conditions": [
            {"type": "Available", "status": "True", "reason": "Ok", "message": "", "observedGeneration": 2, "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Stale", "status": "True", "reason": "Old", "message": "", "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ]}});
        let problem = TemplateProblem::Source("nope".to_owned());
        let invalid = template_conditions(&[], 5, Some(&problem), Some(&object), now);
        let types: Vec<&str> = invalid.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Invalid", "Available"]);
        assert!(invalid.iter().all(|c| c.observed_generation == Some(5)));
        let fixed = template_conditions(&invalid, 5, None, Some(&object), now);
        assert_eq!(fixed.len(), 1);
        assert_eq!(fixed[0].type_, "Available");
    }
}

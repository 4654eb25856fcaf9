//! Package config admission against the manifest's `config.openAPIV3Schema`, with Kubernetes' structural
//! schema semantics: unknown fields are pruned (unless `x-kubernetes-preserve-unknown-fields` or
//! `additionalProperties` allow them), defaults are applied, then the value is validated (`type`,
//! `nullable`, `x-kubernetes-int-or-string`, `required`, `enum`, bounds, lengths, `pattern`). Without a
//! schema, config is dropped, as in Package Operator.

use regex::Regex;
use serde_json::{Map, Value};

/// Where a Package's config sits; admission errors name fields below it (`spec.config.replicas: ...`).
pub const PACKAGE_CONFIG_PATH: &str = "spec.config";

/// Admits `config` (`None`: none given) under `schema` (`None`: the manifest declares none): pruned,
/// defaulted, validated. Errors are Kubernetes field errors below `root` (`spec.config.replicas: Required
/// value`), in the wording the apiserver uses for CRD validation.
pub fn admit_config(
    schema: Option<&Value>,
    config: Option<&Value>,
    root: &str,
) -> Result<Value, Vec<String>> {
    let value = default_config(schema, config);
    match schema {
        Some(schema) => check_config(schema, &value, root).map(|()| value),
        None => Ok(value),
    }
}

/// `config` pruned and defaulted under `schema`, not validated (`{}` without a schema).
pub fn default_config(schema: Option<&Value>, config: Option<&Value>) -> Value {
    let Some(schema) = schema else {
        return Value::Object(Map::new());
    };
    let mut value = config.cloned().unwrap_or_else(|| Value::Object(Map::new()));
    prune_and_default(schema, &mut value);
    value
}

/// Validates `config` under `schema` as given: no pruning, no defaults (upstream checks a manifest's
/// test-template configs this way).
pub fn check_config(schema: &Value, config: &Value, root: &str) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    validate(schema, config, root, &mut errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Kubernetes' rendering of a list of field errors: one is printed bare, several as `[e1, e2]` with
/// duplicates removed.
pub fn field_error_aggregate(errors: &[String]) -> String {
    let mut unique: Vec<&str> = Vec::new();
    for e in errors {
        if !unique.contains(&e.as_str()) {
            unique.push(e);
        }
    }
    match unique.as_slice() {
        [one] => (*one).to_owned(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// `"value"` as Go's `%q` would print a scalar in a field error.
fn quoted(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

fn preserves_unknown(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
}

fn prune_and_default(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            if let Some(props) = properties {
                if !preserves_unknown(schema) && additional.is_none() {
                    map.retain(|k, _| props.contains_key(k));
                }
                for (key, prop) in props {
                    if !map.contains_key(key) {
                        if let Some(default) = prop.get("default") {
                            map.insert(key.clone(), default.clone());
                        }
                    }
                    if let Some(child) = map.get_mut(key) {
                        prune_and_default(prop, child);
                    }
                }
            } else if let Some(additional) = additional {
                for child in map.values_mut() {
                    prune_and_default(additional, child);
                }
            } else if !preserves_unknown(schema)
                && schema.get("type").and_then(Value::as_str) == Some("object")
            {
                map.clear();
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    prune_and_default(item_schema, item);
                }
            }
        }
        _ => {}
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `minimum` and `maximum` of a number.
fn check_bounds(schema: &Value, value: &Value, n: f64, path: &str, errors: &mut Vec<String>) {
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
        if n < min {
            errors.push(format!(
                "{path}: Invalid value: {value}: {path} in body should be greater than or equal to {min}"
            ));
        }
    }
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
        if n > max {
            errors.push(format!(
                "{path}: Invalid value: {value}: {path} in body should be less than or equal to {max}"
            ));
        }
    }
}

/// `minLength`, `maxLength` and `pattern` of a string.
fn check_string(schema: &Value, s: &str, path: &str, errors: &mut Vec<String>) {
    let len = s.chars().count() as u64;
    if let Some(m) = schema
        .get("minLength")
        .and_then(Value::as_u64)
        .filter(|m| len < *m)
    {
        errors.push(format!(
            "{path}: Invalid value: {s:?}: {path} in body should be at least {m} chars long"
        ));
    }
    if let Some(m) = schema
        .get("maxLength")
        .and_then(Value::as_u64)
        .filter(|m| len > *m)
    {
        errors.push(format!("{path}: Too long: may not be more than {m} bytes"));
    }
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        match Regex::new(pattern) {
            Ok(re) if !re.is_match(s) => errors.push(format!(
                "{path}: Invalid value: {s:?}: {path} in body should match '{pattern}'"
            )),
            Ok(_) => {}
            Err(e) => errors.push(format!(
                "{path}: the schema's pattern {pattern:?} is invalid: {e}"
            )),
        }
    }
}

fn validate(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    let nullable = schema.get("nullable").and_then(Value::as_bool) == Some(true);
    if value.is_null() {
        if !nullable && schema.get("type").is_some() {
            let want = schema
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or_default();
            errors.push(format!(
                "{path}: Invalid value: \"null\": {path} in body must be of type {want}: \"null\""
            ));
        }
        return;
    }
    let int_or_string = schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true);
    if let Some(want) = schema.get("type").and_then(Value::as_str) {
        let got = type_name(value);
        let ok = got == want || (want == "number" && got == "integer");
        let int_or_string_ok = int_or_string && matches!(got, "integer" | "string");
        if !(ok || int_or_string_ok) {
            errors.push(format!(
                "{path}: Invalid value: \"{got}\": {path} in body must be of type {want}: \"{got}\""
            ));
            return;
        }
    } else if int_or_string && !matches!(type_name(value), "integer" | "string") {
        let got = type_name(value);
        errors.push(format!(
            "{path}: Invalid value: \"{got}\": {path} in body must be of type integer,string: \"{got}\""
        ));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            let supported: Vec<String> = allowed.iter().map(quoted).collect();
            errors.push(format!(
                "{path}: Unsupported value: {}: supported values: {}",
                quoted(value),
                supported.join(", ")
            ));
        }
    }
    if let Some(n) = value.as_f64() {
        check_bounds(schema, value, n, path, errors);
    }
    if let Some(text) = value.as_str() {
        check_string(schema, text, path, errors);
    }
    match value {
        Value::Object(map) => {
            for required in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(key) = required.as_str() {
                    if !map.contains_key(key) {
                        errors.push(format!("{path}.{key}: Required value"));
                    }
                }
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, child) in map {
                let child_schema = properties.and_then(|p| p.get(key)).or(additional);
                if let Some(child_schema) = child_schema {
                    validate(child_schema, child, &format!("{path}.{key}"), errors);
                }
            }
        }
        Value::Array(items) => {
            let len = items.len() as u64;
            if schema
                .get("minItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| len < m)
            {
                errors.push(format!("{path}: fewer than minItems"));
            }
            if schema
                .get("maxItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| len > m)
            {
                errors.push(format!("{path}: more than maxItems"));
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate(item_schema, item, &format!("{path}[{i}]"), errors);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "required": ["replicas"],
            "properties": {
                "replicas": {"type": "integer", "minimum": 1},
                "mode": {"type": "string", "enum": ["fast", "safe"], "default": "safe"},
                "port": {"x-kubernetes-int-or-string": true},
                "image": {"type": "string", "nullable": true, "pattern": "^[a-z./:0-9-]+$"},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        })
    }

    #[test]
    fn prunes_defaults_and_accepts() {
        let admitted = admit_config(
            Some(&schema()),
            Some(&json!({"replicas": 2, "unknown": 1, "port": "http", "image": null, "extra": {"any": [1]}, "labels": {"a": "b"}})),
            PACKAGE_CONFIG_PATH,
        )
        .unwrap();
        assert_eq!(
            admitted,
            json!({"replicas": 2, "mode": "safe", "port": "http", "image": null, "extra": {"any": [1]}, "labels": {"a": "b"}})
        );
    }

    #[test]
    fn every_violation_is_named() {
        let errors = admit_config(
            Some(&schema()),
            Some(&json!({"replicas": "two", "mode": "yolo", "port": [1], "image": "UPPER", "labels": {"a": 1}})),
            PACKAGE_CONFIG_PATH,
        )
        .unwrap_err();
        assert_eq!(
            errors,
            vec![
                "spec.config.image: Invalid value: \"UPPER\": spec.config.image in body should match '^[a-z./:0-9-]+$'",
                "spec.config.labels.a: Invalid value: \"integer\": spec.config.labels.a in body must be of type string: \"integer\"",
                "spec.config.mode: Unsupported value: \"yolo\": supported values: \"fast\", \"safe\"",
                "spec.config.port: Invalid value: \"array\": spec.config.port in body must be of type integer,string: \"array\"",
                "spec.config.replicas: Invalid value: \"string\": spec.config.replicas in body must be of type integer: \"string\"",
            ]
        );
        let missing = admit_config(Some(&schema()), None, PACKAGE_CONFIG_PATH).unwrap_err();
        assert_eq!(
            missing,
            vec!["spec.config.replicas: Required value".to_owned()]
        );
        assert_eq!(
            admit_config(Some(&schema()), Some(&json!({"replicas": 0})), "test.template[0].context.config")
                .unwrap_err(),
            vec!["test.template[0].context.config.replicas: Invalid value: 0: test.template[0].context.config.replicas in body should be greater than or equal to 1"]
        );
    }

    #[test]
    fn without_a_schema_config_is_dropped() {
        assert_eq!(
            admit_config(None, Some(&json!({"a": 1})), PACKAGE_CONFIG_PATH).unwrap(),
            json!({})
        );
    }

    #[test]
    fn one_field_error_prints_bare_several_in_brackets() {
        let e = |s: &str| s.to_owned();
        assert_eq!(
            field_error_aggregate(&[e("a: Required value")]),
            "a: Required value"
        );
        assert_eq!(
            field_error_aggregate(&[e("a: x"), e("b: y"), e("a: x")]),
            "[a: x, b: y]"
        );
    }
}

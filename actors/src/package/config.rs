//! Package config admission against the manifest's `config.openAPIV3Schema`, with Kubernetes' structural
//! schema semantics: unknown fields are pruned (unless `x-kubernetes-preserve-unknown-fields` or
//! `additionalProperties` allow them), defaults are applied, then the value is validated (`type`,
//! `nullable`, `x-kubernetes-int-or-string`, `required`, `enum`, bounds, lengths, `pattern`). Without a
//! schema, config is dropped, as in Package Operator.

use regex::Regex;
use serde_json::{Map, Value};

/// Admits `config` (`None`: none given) under `schema` (`None`: the manifest declares none). Errors name
/// each offending path (`config.replicas: ...`).
pub fn admit_config(schema: Option<&Value>, config: Option<&Value>) -> Result<Value, Vec<String>> {
    let Some(schema) = schema else {
        return Ok(Value::Object(Map::new()));
    };
    let mut value = config.cloned().unwrap_or_else(|| Value::Object(Map::new()));
    prune_and_default(schema, &mut value);
    let mut errors = Vec::new();
    validate(schema, &value, "config", &mut errors);
    if errors.is_empty() {
        Ok(value)
    } else {
        Err(errors)
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

fn validate(schema: &Value, value: &Value, path: &str, errors: &mut Vec<String>) {
    let nullable = schema.get("nullable").and_then(Value::as_bool) == Some(true);
    if value.is_null() {
        if !nullable && schema.get("type").is_some() {
            errors.push(format!("{path}: must not be null"));
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
            errors.push(format!("{path}: must be {want}, got {got}"));
            return;
        }
    } else if int_or_string && !matches!(type_name(value), "integer" | "string") {
        errors.push(format!(
            "{path}: must be an integer or a string, got {}",
            type_name(value)
        ));
        return;
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            errors.push(format!(
                "{path}: {value} is not one of {}",
                Value::Array(allowed.clone())
            ));
        }
    }
    if let Some(n) = value.as_f64() {
        if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
            if n < min {
                errors.push(format!("{path}: {value} is less than the minimum {min}"));
            }
        }
        if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
            if n > max {
                errors.push(format!("{path}: {value} is greater than the maximum {max}"));
            }
        }
    }
    if let Some(s) = value.as_str() {
        let len = s.chars().count() as u64;
        if schema
            .get("minLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| len < m)
        {
            errors.push(format!("{path}: shorter than minLength"));
        }
        if schema
            .get("maxLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| len > m)
        {
            errors.push(format!("{path}: longer than maxLength"));
        }
        if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
            match Regex::new(pattern) {
                Ok(re) if !re.is_match(s) => {
                    errors.push(format!("{path}: {s:?} does not match {pattern:?}"))
                }
                Ok(_) => {}
                Err(e) => errors.push(format!(
                    "{path}: the schema's pattern {pattern:?} is invalid: {e}"
                )),
            }
        }
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
                        errors.push(format!("{path}.{key}: required"));
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
        )
        .unwrap_err();
        assert_eq!(
            errors,
            vec![
                "config.image: \"UPPER\" does not match \"^[a-z./:0-9-]+$\"".to_owned(),
                "config.labels.a: must be string, got integer".to_owned(),
                "config.mode: \"yolo\" is not one of [\"fast\",\"safe\"]".to_owned(),
                "config.port: must be an integer or a string, got array".to_owned(),
                "config.replicas: must be integer, got string".to_owned(),
            ]
        );
        let missing = admit_config(Some(&schema()), None).unwrap_err();
        assert_eq!(missing, vec!["config.replicas: required".to_owned()]);
        assert!(
            admit_config(Some(&schema()), Some(&json!({"replicas": 0}))).unwrap_err()[0]
                .contains("minimum")
        );
    }

    #[test]
    fn without_a_schema_config_is_dropped() {
        assert_eq!(
            admit_config(None, Some(&json!({"a": 1}))).unwrap(),
            json!({})
        );
    }
}

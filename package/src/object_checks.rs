//! What every object of a package must satisfy, checked as Package Operator checks it: apiVersion and
//! kind, no duplicates, labels (keys and values as Kubernetes validates them), a phase annotation naming
//! a declared phase, and pko's object annotations (collision protection, condition map). Problems are
//! reported in upstream's words; pure.

use pko_proto::well_known::{COLLISION_ANNOTATION, CONDITION_MAP_ANNOTATION, PHASE_ANNOTATION};

use pko_proto::core::common::{CollisionProtection, ConditionMapping, ObjectSetObject};
use serde_json::Value;

use super::config::field_error_aggregate;
use super::violation::{reason, Violation};

/// An object's (group, version, kind); the core group is "".
pub fn object_gvk(object: &Value) -> (&str, &str, &str) {
    let field = |p: &str| {
        object
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let api_version = field("/apiVersion");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    (group, version, field("/kind"))
}

/// Objects with the same group, kind, namespace and name (the version does not count).
pub fn duplicate_objects(objects: &[(String, usize, Value)]) -> Vec<Violation> {
    let mut seen = std::collections::HashSet::new();
    let mut found = Vec::new();
    for (path, index, object) in objects {
        let (group, _, kind) = object_gvk(object);
        let field = |p: &str| {
            object
                .pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
        };
        let key = (
            group,
            kind,
            field("/metadata/namespace"),
            field("/metadata/name"),
        );
        if !seen.insert(key) {
            found.push(Violation::new(reason::DUPLICATE_OBJECT).at(path.clone(), *index));
        }
    }
    found
}

/// Upstream's object validators (GVK set, labels valid, phase annotation) plus pko's (the phase is
/// declared, pko's annotations parse); returns the object's phase and spec, or every violation found.
pub fn check_object(
    file: &str,
    index: usize,
    object: Value,
    declared: &[&str],
) -> Result<(String, ObjectSetObject), Vec<Violation>> {
    let at = |r: &'static str| Violation::new(r).at(file.to_owned(), index);
    let mut violations = Vec::new();
    let (_, version, kind) = object_gvk(&object);
    if version.is_empty() || kind.is_empty() {
        violations.push(at(reason::MISSING_GVK));
    }
    if let Some(labels) = object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
    {
        let errors: Vec<String> = labels
            .iter()
            .flat_map(|(key, value)| {
                let key_errors = check_label_key(key).err().map(|p| (key.as_str(), p));
                let value_errors = check_label_value(value.as_str().unwrap_or("\u{0}"))
                    .err()
                    .map(|p| (value.as_str().unwrap_or_default(), p));
                key_errors.into_iter().chain(value_errors)
            })
            .map(|(v, problem)| format!("metadata.labels: Invalid value: {v:?}: {problem}"))
            .collect();
        if !errors.is_empty() {
            violations.push(at(reason::LABELS_INVALID).details(field_error_aggregate(&errors)));
        }
    }
    let annotations = |key: &str| {
        object
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(key))
            .and_then(Value::as_str)
    };
    let phase = annotations(PHASE_ANNOTATION).unwrap_or_default().to_owned();
    if phase.is_empty() {
        violations.push(at(reason::MISSING_PHASE_ANNOTATION));
    } else if !declared.contains(&phase.as_str()) {
        violations.push(at(reason::UNKNOWN_PHASE));
    }
    let invalid_annotation = |annotation: &str, problem: String| {
        at(reason::ANNOTATION_INVALID).details(format!("{annotation}: {problem}"))
    };
    let collision_protection = match annotations(COLLISION_ANNOTATION) {
        None => CollisionProtection::default(),
        Some(v) => match serde_json::from_value::<CollisionProtection>(Value::String(v.to_owned()))
        {
            Ok(parsed) if parsed.is_known() => parsed,
            _ => {
                violations.push(invalid_annotation(
                    COLLISION_ANNOTATION,
                    format!("{v:?} is not Prevent, IfNoController or None"),
                ));
                CollisionProtection::default()
            }
        },
    };
    let condition_mappings = match annotations(CONDITION_MAP_ANNOTATION).map(parse_condition_map) {
        None => Vec::new(),
        Some(Ok(mappings)) => mappings,
        Some(Err(problem)) => {
            violations.push(invalid_annotation(CONDITION_MAP_ANNOTATION, problem));
            Vec::new()
        }
    };
    if !violations.is_empty() {
        return Err(violations);
    }
    Ok((
        phase,
        ObjectSetObject {
            object,
            collision_protection,
            condition_mappings,
        },
    ))
}

/// Parses `SourceType => domain/DestinationType` lines.
pub fn parse_condition_map(text: &str) -> Result<Vec<ConditionMapping>, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|line| {
            let (source, destination) = line.split_once("=>").ok_or_else(|| {
                format!("line {line:?}: want `SourceType => domain/DestinationType`")
            })?;
            let (source, destination) = (source.trim(), destination.trim());
            if source.is_empty() || !destination.contains('/') {
                return Err(format!(
                    "line {line:?}: want `SourceType => domain/DestinationType`"
                ));
            }
            Ok(ConditionMapping {
                source_type: source.to_owned(),
                destination_type: destination.to_owned(),
            })
        })
        .collect()
}

fn is_label_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    !s.is_empty()
        && s.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !part.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && part
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        })
}

const QUALIFIED_NAME_RULE: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// Kubernetes label key rules (`IsQualifiedName`): optional DNS-subdomain prefix and `/`, then a name of at
/// most 63 characters. The error is Kubernetes' wording.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let parts: Vec<&str> = key.split('/').collect();
    let (prefix, name) = match parts.as_slice() {
        [name] => (None, *name),
        [prefix, name] => (Some(*prefix), *name),
        _ => {
            return Err(format!("a qualified name {QUALIFIED_NAME_RULE} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"));
        }
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err("prefix part must be non-empty".to_owned());
        }
        if !is_dns_subdomain(prefix) {
            return Err("prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_owned());
        }
    }
    if name.is_empty() {
        return Err("name part must be non-empty".to_owned());
    }
    if name.len() > 63 {
        return Err("name part must be no more than 63 characters".to_owned());
    }
    if !is_label_name(name) {
        return Err(format!("name part {QUALIFIED_NAME_RULE} (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"));
    }
    Ok(())
}

/// Kubernetes label value rules: empty, or a name of at most 63 characters. The error is Kubernetes'
/// wording.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.len() > 63 {
        Err("must be no more than 63 characters".to_owned())
    } else if value.is_empty() || is_label_name(value) {
        Ok(())
    } else {
        Err("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn condition_maps_parse_and_reject_garbage() {
        assert_eq!(
            parse_condition_map("Available => my.domain/Available\n\n Ready=>x/Ready ").unwrap(),
            vec![
                ConditionMapping {
                    source_type: "Available".into(),
                    destination_type: "my.domain/Available".into()
                },
                ConditionMapping {
                    source_type: "Ready".into(),
                    destination_type: "x/Ready".into()
                },
            ]
        );
        assert!(parse_condition_map("Available -> x/Y").is_err());
        assert!(parse_condition_map("Available => NoDomain").is_err());
    }

    #[test]
    fn label_rules() {
        assert!(check_label_key("app.kubernetes.io/name").is_ok());
        assert!(check_label_key("simple").is_ok());
        assert!(check_label_key("Bad_Prefix/x").is_err());
        assert!(check_label_key(&"a".repeat(64)).is_err());
        assert!(check_label_value("").is_ok());
        assert!(check_label_value("-leading").is_err());
    }

    proptest! {
        /// Any label name the apiserver would accept as a plain key is accepted, and vice versa for junk.
        #[test]
        fn generated_valid_names_pass(name in "[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?") {
            prop_assert!(check_label_key(&name).is_ok());
            prop_assert!(check_label_value(&name).is_ok());
        }

        #[test]
        fn names_with_spaces_fail(name in "[a-z]{1,10} [a-z]{1,10}") {
            prop_assert!(check_label_key(&name).is_err());
        }
    }
}

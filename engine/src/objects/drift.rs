//! Drift detection: does an observed object still carry everything pko wants it to, and nothing its last
//! apply set that pko no longer wants? Lets a reconcile of an unchanged set, and a restarted manager,
//! skip its writes entirely.

use serde_json::Value;

/// True when every field of `desired` is present in `observed` with an equal value. Extra fields in
/// `observed` (defaults, status, other managers' fields) do not count as drift; lists must match in length
/// and element by element.
pub fn is_subset(desired: &Value, observed: &Value) -> bool {
    match (desired, observed) {
        (Value::Object(d), Value::Object(o)) => d
            .iter()
            .all(|(k, dv)| o.get(k).is_some_and(|ov| is_subset(dv, ov))),
        (Value::Array(d), Value::Array(o)) => {
            d.len() == o.len() && d.iter().zip(o).all(|(dv, ov)| is_subset(dv, ov))
        }
        (Value::Number(d), Value::Number(o)) => d == o || d.as_f64() == o.as_f64(),
        (d, o) => d == o,
    }
}

/// True when applying `desired` as `field_manager` would change nothing in `observed`, an object read
/// whole (with its `managedFields`): `observed` carries every field of `desired` ([`is_subset`]), and
/// the field manager's last apply set no field that `desired` lacks (a server-side apply removes such
/// fields). What the manager applies is known from the apiserver's record of it, so this holds for a
/// process that never applied the object itself, such as a manager after a restart. An object without
/// that record, or with a record this does not understand, is not current: the apply goes out.
pub fn apply_is_current(desired: &Value, observed: &Value, field_manager: &str) -> bool {
    if !is_subset(desired, observed) {
        return false;
    }
    let Some(entries) = observed
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return false;
    };
    let mut applies = entries.iter().filter(|entry| {
        entry.get("manager").and_then(Value::as_str) == Some(field_manager)
            && entry.get("operation").and_then(Value::as_str) == Some("Apply")
    });
    match (applies.next(), applies.next()) {
        (Some(entry), None) => entry
            .get("fieldsV1")
            .is_some_and(|owned| owned_within(owned, desired)),
        _ => false,
    }
}

/// Whether every field in `owned` (a `fieldsV1` set: `f:` map keys, `k:` list elements by their key
/// fields, `v:` set values, `i:` list indexes, `.` the element itself) is present in `desired`.
fn owned_within(owned: &Value, desired: &Value) -> bool {
    let Some(fields) = owned.as_object() else {
        return false;
    };
    fields.iter().all(|(path, children)| {
        let within = |element: &Value| owned_within(children, element);
        if path == "." {
            true
        } else if let Some(name) = path.strip_prefix("f:") {
            desired.get(name).is_some_and(within)
        } else if let Some(key) = path.strip_prefix("k:") {
            let (Ok(Value::Object(key)), Some(elements)) =
                (serde_json::from_str::<Value>(key), desired.as_array())
            else {
                return false;
            };
            elements
                .iter()
                .find(|e| {
                    key.iter()
                        .all(|(k, v)| e.get(k).is_some_and(|ev| same_scalar(v, ev)))
                })
                .is_some_and(within)
        } else if let Some(value) = path.strip_prefix("v:") {
            let (Ok(value), Some(elements)) =
                (serde_json::from_str::<Value>(value), desired.as_array())
            else {
                return false;
            };
            elements.iter().any(|e| same_scalar(&value, e))
        } else if let Some(index) = path.strip_prefix("i:") {
            index
                .parse::<usize>()
                .ok()
                .and_then(|i| desired.as_array()?.get(i))
                .is_some_and(within)
        } else {
            false
        }
    })
}

/// Equal, with numbers compared by value (`1` and `1.0` are one number).
fn same_scalar(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(a), Value::Number(b)) => a == b || a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn defaults_are_not_drift_but_edits_are() {
        let desired = json!({"metadata": {"name": "a", "labels": {"x": "1"}}, "data": {"k": "v"}});
        let observed = json!({"metadata": {"name": "a", "uid": "u", "labels": {"x": "1", "y": "2"}}, "data": {"k": "v"}});
        assert!(is_subset(&desired, &observed));
        let edited =
            json!({"metadata": {"name": "a", "labels": {"x": "1"}}, "data": {"k": "manual"}});
        assert!(!is_subset(&desired, &edited));
        assert!(!is_subset(&json!({"l": [1, 2]}), &json!({"l": [1, 2, 3]})));
        assert!(is_subset(&json!({"n": 1}), &json!({"n": 1.0})));
    }

    /// A Deployment as the apiserver returns it after pko applied `desired`-like fields.
    fn applied(fields: Value, manager: &str) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "labels": {"app": "x", "other": "y"},
                         "managedFields": [
                             {"manager": "someone", "operation": "Update", "fieldsV1": {"f:metadata": {"f:labels": {"f:other": {}}}}},
                             {"manager": manager, "operation": "Apply", "fieldsV1": fields}]},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [
                {"name": "c", "image": "i:1", "env": [{"name": "A", "value": "1"}], "ports": [{"containerPort": 80, "protocol": "TCP"}]}]}}},
        })
    }

    fn deployment_fields() -> Value {
        json!({"f:metadata": {"f:labels": {"f:app": {}}},
               "f:spec": {"f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {
                   ".": {}, "f:name": {}, "f:image": {},
                   "f:env": {"k:{\"name\":\"A\"}": {".": {}, "f:name": {}, "f:value": {}}},
                   "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}}}}}}}})
    }

    fn desired() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "labels": {"app": "x"}},
               "spec": {"template": {"spec": {"containers": [
                   {"name": "c", "image": "i:1", "env": [{"name": "A", "value": "1"}], "ports": [{"containerPort": 80, "protocol": "TCP"}]}]}}}})
    }

    #[test]
    fn an_apply_of_what_the_last_apply_set_is_current() {
        let observed = applied(deployment_fields(), "pko");
        assert!(apply_is_current(&desired(), &observed, "pko"));
        // Another manager's record is not pko's.
        assert!(!apply_is_current(&desired(), &observed, "someone-else"));
    }

    #[test]
    fn a_field_the_last_apply_set_and_desired_lacks_needs_the_apply() {
        let observed = applied(deployment_fields(), "pko");
        // The env var is in the record and the object, but no longer desired: the apply removes it.
        let mut without_env = desired();
        without_env["spec"]["template"]["spec"]["containers"][0]
            .as_object_mut()
            .map(|c| c.remove("env"));
        assert!(is_subset(&without_env, &observed));
        assert!(!apply_is_current(&without_env, &observed, "pko"));
        // The same for a label.
        let mut without_label = desired();
        without_label["metadata"]["labels"] = json!({});
        assert!(!apply_is_current(&without_label, &observed, "pko"));
    }

    #[test]
    fn a_changed_value_or_a_missing_record_needs_the_apply() {
        let observed = applied(deployment_fields(), "pko");
        let mut newer = desired();
        newer["spec"]["template"]["spec"]["containers"][0]["image"] = json!("i:2");
        assert!(!apply_is_current(&newer, &observed, "pko"));
        let mut unrecorded = observed.clone();
        unrecorded["metadata"]["managedFields"] = json!([]);
        assert!(!apply_is_current(&desired(), &unrecorded, "pko"));
        // A record this does not understand counts as not current.
        let odd = applied(json!({"f:spec": {"x:weird": {}}}), "pko");
        assert!(!apply_is_current(&desired(), &odd, "pko"));
    }

    #[test]
    fn set_values_and_indexes_are_matched_in_desired() {
        let desired = json!({"spec": {"finalizers": ["a", "b"], "args": ["x", "y"]}});
        let observed = |fields: Value| {
            json!({"metadata": {"managedFields": [{"manager": "pko", "operation": "Apply", "fieldsV1": fields}]},
                   "spec": {"finalizers": ["a", "b"], "args": ["x", "y"]}})
        };
        let set = json!({"f:spec": {"f:finalizers": {"v:\"a\"": {}, "v:\"b\"": {}}, "f:args": {}}});
        assert!(apply_is_current(&desired, &observed(set), "pko"));
        let gone = json!({"f:spec": {"f:finalizers": {"v:\"c\"": {}}}});
        assert!(!apply_is_current(&desired, &observed(gone), "pko"));
        let indexed = json!({"f:spec": {"f:args": {"i:1": {}}}});
        assert!(apply_is_current(&desired, &observed(indexed), "pko"));
        let past_the_end = json!({"f:spec": {"f:args": {"i:2": {}}}});
        assert!(!apply_is_current(&desired, &observed(past_the_end), "pko"));
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            "[a-z]{0,4}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-c]", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// The `fieldsV1` record of `value`'s map fields, lists and scalars as leaves.
    fn field_record(value: &Value) -> Value {
        match value {
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, v)| (format!("f:{k}"), field_record(v)))
                    .collect(),
            ),
            _ => json!({}),
        }
    }

    proptest! {
        #[test]
        fn every_value_is_a_subset_of_itself(v in json_value()) {
            prop_assert!(is_subset(&v, &v));
        }

        /// A record of exactly the desired map fields (lists and scalars as leaves) is current; a field
        /// in the record beyond desired never is.
        #[test]
        fn a_record_beyond_desired_is_never_current(
            v in prop::collection::btree_map("[a-c]", json_value(), 0..4),
            extra in "[d-f]",
        ) {
            let desired = Value::Object(v.into_iter().collect());
            let observed_with = |record: Value| {
                let mut observed = desired.clone();
                observed["metadata"] = json!({"managedFields": [{"manager": "pko", "operation": "Apply", "fieldsV1": record}]});
                observed
            };
            prop_assert!(apply_is_current(&desired, &observed_with(field_record(&desired)), "pko"));
            let mut beyond = field_record(&desired);
            beyond[format!("f:{extra}")] = json!({});
            prop_assert!(!apply_is_current(&desired, &observed_with(beyond), "pko"));
        }

        #[test]
        fn adding_a_field_keeps_the_subset(v in prop::collection::btree_map("[a-c]", json_value(), 0..4), extra in json_value()) {
            let desired = Value::Object(v.clone().into_iter().collect());
            let mut observed = v;
            observed.insert("zz".to_owned(), extra);
            prop_assert!(is_subset(&desired, &Value::Object(observed.into_iter().collect())));
        }
    }
}

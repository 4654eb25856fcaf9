//! Drift detection: does an observed object still carry everything pko wants it to? Lets a reconcile of an
//! unchanged set skip its writes entirely.

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

    proptest! {
        #[test]
        fn every_value_is_a_subset_of_itself(v in json_value()) {
            prop_assert!(is_subset(&v, &v));
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

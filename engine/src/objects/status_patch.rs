//! The JSON merge patch (RFC 7396) that turns one status into another. A merge patch keeps every field
//! it does not name, and pko's statuses leave out what is unset, so a patch of the new status alone
//! keeps a field that went away: a halt's `rolledBackAt` from an earlier halt stayed on the next one,
//! which then read as rolled back before it began (chaos seed 3). The patch between the stored status
//! and the new one names each field that went away as `null`. It must not be used for values that hold
//! `null` themselves (a merge patch cannot write one); pko's statuses leave such fields out.

use serde_json::{Map, Value};

/// The merge patch that, applied to `stored`, gives `wanted`: the fields of `wanted` that differ (objects
/// compared field by field, anything else replaced whole), and `null` for each field `stored` has and
/// `wanted` has not.
pub fn merge_patch_between(stored: &Value, wanted: &Value) -> Value {
    let (Value::Object(stored), Value::Object(wanted)) = (stored, wanted) else {
        return wanted.clone();
    };
    let mut patch = Map::new();
    for (field, value) in wanted {
        match stored.get(field) {
            Some(before) if before == value => {}
            Some(before) => {
                patch.insert(field.clone(), merge_patch_between(before, value));
            }
            None => {
                patch.insert(field.clone(), value.clone());
            }
        }
    }
    for field in stored.keys().filter(|f| !wanted.contains_key(*f)) {
        patch.insert(field.clone(), Value::Null);
    }
    Value::Object(patch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn a_field_that_went_away_is_removed() {
        let stored =
            json!({"halted": {"templateHash": "a", "rolledBackAt": "t0"}, "observedGeneration": 3});
        let wanted = json!({"halted": {"templateHash": "b"}, "observedGeneration": 3});
        assert_eq!(
            merge_patch_between(&stored, &wanted),
            json!({"halted": {"templateHash": "b", "rolledBackAt": null}})
        );
        assert_eq!(
            merge_patch_between(&wanted, &json!({"observedGeneration": 4})),
            json!({"halted": null, "observedGeneration": 4})
        );
    }

    /// JSON without nulls (what a merge patch can write), objects nested a few levels.
    fn document() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<bool>().prop_map(Value::from),
            (0i64..4).prop_map(Value::from),
            "[ab]{0,2}".prop_map(Value::from),
            prop::collection::vec(0i64..3, 0..3).prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop::collection::btree_map("[a-d]", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect()))
        })
    }

    proptest! {
        #[test]
        fn applying_the_patch_to_the_stored_status_gives_the_wanted_one(
            stored in prop::collection::btree_map("[a-d]", document(), 0..4),
            wanted in prop::collection::btree_map("[a-d]", document(), 0..4),
        ) {
            let stored = Value::Object(stored.into_iter().collect());
            let wanted = Value::Object(wanted.into_iter().collect());
            let mut applied = stored.clone();
            json_patch::merge(&mut applied, &merge_patch_between(&stored, &wanted));
            prop_assert_eq!(applied, wanted);
        }
    }
}

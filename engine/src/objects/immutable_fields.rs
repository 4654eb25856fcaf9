//! Which spec fields of an ObjectSet or ObjectSetPhase an update may not change, and the words the
//! apiserver answers with when one does. Upstream declares these as CRD validation rules
//! (`self == oldSelf`); kube-apiserver 1.20 has no such rules, so pko's admission webhook asks this.
//! Pure: the webhook server owns the transport, this module only compares two specs.

use serde_json::Value;

/// The kinds whose specs carry immutable fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardedKind {
    /// ObjectSet and ClusterObjectSet.
    ObjectSet,
    /// ObjectSetPhase and ClusterObjectSetPhase.
    ObjectSetPhase,
}

impl GuardedKind {
    /// The guarded kind of a package-operator.run kind name, if it has immutable fields.
    pub fn of(kind: &str) -> Option<Self> {
        match kind {
            "ObjectSet" | "ClusterObjectSet" => Some(Self::ObjectSet),
            "ObjectSetPhase" | "ClusterObjectSetPhase" => Some(Self::ObjectSetPhase),
            _ => None,
        }
    }

    /// The spec fields that are fixed at creation, in upstream's order.
    pub fn immutable_fields(self) -> &'static [&'static str] {
        match self {
            Self::ObjectSet => &[
                "phases",
                "availabilityProbes",
                "successDelaySeconds",
                "previous",
                "revision",
            ],
            Self::ObjectSetPhase => &["availabilityProbes", "objects", "previous", "revision"],
        }
    }
}

/// The immutable fields whose value differs between `old_spec` and `new_spec`.
///
/// Absent, `null` and empty lists or maps count as the same "unset" value: clients that drop an empty
/// list on a round trip (kubectl, most SDKs) must not be refused for it.
pub fn changed_fields(kind: GuardedKind, old_spec: &Value, new_spec: &Value) -> Vec<&'static str> {
    kind.immutable_fields()
        .iter()
        .copied()
        .filter(|field| unset_as_none(old_spec.get(field)) != unset_as_none(new_spec.get(field)))
        .collect()
}

/// The denial message for `fields` in the apiserver's field-error form, e.g.
/// `spec.phases: Invalid value: phases is immutable`; several are bracketed as the apiserver does.
pub fn denial_message(fields: &[&str]) -> String {
    let errors: Vec<String> = fields
        .iter()
        .map(|f| format!("spec.{f}: Invalid value: {f} is immutable"))
        .collect();
    match errors.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

fn unset_as_none(value: Option<&Value>) -> Option<&Value> {
    match value? {
        Value::Null => None,
        Value::Array(items) if items.is_empty() => None,
        Value::Object(map) if map.is_empty() => None,
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn set_spec() -> Value {
        json!({
            "lifecycleState": "Active",
            "phases": [{"name": "deploy", "objects": [{"object": {"kind": "ConfigMap"}}]}],
            "availabilityProbes": [{"selector": {"kind": {"group": "", "kind": "ConfigMap"}}, "probes": []}],
            "successDelaySeconds": 5,
            "previous": [{"name": "rev-1"}],
            "revision": 2,
        })
    }

    #[test]
    fn mutable_fields_may_change() {
        let old = set_spec();
        let mut new = old.clone();
        new["lifecycleState"] = json!("Paused");
        new["paused"] = json!(true);
        assert!(changed_fields(GuardedKind::ObjectSet, &old, &new).is_empty());
    }

    #[test]
    fn every_immutable_field_of_a_set_is_named_when_changed() {
        let old = set_spec();
        for (field, value) in [
            ("phases", json!([])),
            (
                "availabilityProbes",
                json!([{"selector": {}, "probes": [{"condition": {}}]}]),
            ),
            ("successDelaySeconds", json!(6)),
            ("previous", json!([{"name": "rev-0"}])),
            ("revision", json!(3)),
        ] {
            let mut new = old.clone();
            new[field] = value;
            assert_eq!(
                changed_fields(GuardedKind::ObjectSet, &old, &new),
                vec![field],
                "{field}"
            );
        }
    }

    #[test]
    fn adding_or_removing_a_field_is_a_change() {
        let old = json!({"objects": [], "revision": 1});
        let added = json!({"objects": [], "revision": 1, "previous": [{"name": "a"}]});
        assert_eq!(
            changed_fields(GuardedKind::ObjectSetPhase, &old, &added),
            vec!["previous"]
        );
        assert_eq!(
            changed_fields(GuardedKind::ObjectSetPhase, &added, &old),
            vec!["previous"]
        );
        let removed = json!({"objects": []});
        assert_eq!(
            changed_fields(GuardedKind::ObjectSetPhase, &old, &removed),
            vec!["revision"]
        );
    }

    #[test]
    fn an_empty_list_equals_an_absent_one() {
        let old = json!({"objects": [{"object": {}}], "revision": 1, "previous": []});
        let new = json!({"objects": [{"object": {}}], "revision": 1, "previous": null});
        assert!(changed_fields(GuardedKind::ObjectSetPhase, &old, &new).is_empty());
        let dropped = json!({"objects": [{"object": {}}], "revision": 1});
        assert!(changed_fields(GuardedKind::ObjectSetPhase, &old, &dropped).is_empty());
    }

    #[test]
    fn phase_objects_are_immutable_but_paused_is_not() {
        let old = json!({"objects": [{"object": {"kind": "A"}}], "revision": 1, "paused": false});
        let mut new = old.clone();
        new["paused"] = json!(true);
        assert!(changed_fields(GuardedKind::ObjectSetPhase, &old, &new).is_empty());
        new["objects"] = json!([{"object": {"kind": "B"}}]);
        assert_eq!(
            changed_fields(GuardedKind::ObjectSetPhase, &old, &new),
            vec!["objects"]
        );
    }

    #[test]
    fn messages_name_the_field() {
        assert_eq!(
            denial_message(&["phases"]),
            "spec.phases: Invalid value: phases is immutable"
        );
        assert_eq!(
            denial_message(&["phases", "revision"]),
            "[spec.phases: Invalid value: phases is immutable, \
             spec.revision: Invalid value: revision is immutable]"
        );
    }

    #[test]
    fn only_set_and_phase_kinds_are_guarded() {
        assert_eq!(
            GuardedKind::of("ClusterObjectSet"),
            Some(GuardedKind::ObjectSet)
        );
        assert_eq!(
            GuardedKind::of("ClusterObjectSetPhase"),
            Some(GuardedKind::ObjectSetPhase)
        );
        assert_eq!(GuardedKind::of("ObjectDeployment"), None);
    }

    proptest! {
        /// A spec compared with itself never changes, and a change to any one immutable field is
        /// reported as exactly that field.
        #[test]
        fn exactly_the_changed_field_is_reported(revision in 0i64..1000, delay in 0i64..100, bump in 1i64..10) {
            let old = json!({"phases": [], "revision": revision, "successDelaySeconds": delay});
            prop_assert!(changed_fields(GuardedKind::ObjectSet, &old, &old).is_empty());
            let mut new = old.clone();
            new["successDelaySeconds"] = json!(delay + bump);
            prop_assert_eq!(changed_fields(GuardedKind::ObjectSet, &old, &new), vec!["successDelaySeconds"]);
        }
    }
}

//! The adoption decision: may this revision take over an object that already exists?
//!
//! Owns the collision-protection matrix (Prevent / IfNoController / None) and the revision rule (never adopt
//! from a newer revision). It must not look objects up or patch them; the applier acts on the decision.

use pko_proto::core::common::CollisionProtection;
use pko_proto::well_known::{OWNERS_ANNOTATION, REVISION_ANNOTATION};
use serde_json::Value;

/// Who is asking to adopt: the owning ObjectSet (or ObjectSetPhase acting for it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopter<'a> {
    pub uid: &'a str,
    pub revision: i64,
    /// UIDs of the revisions listed in `previous`.
    pub previous_uids: &'a [String],
}

/// What to do with an existing object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdoptionDecision {
    /// The object is already controlled by the adopter.
    AlreadyOwned,
    /// Take it over; `demote` names the current controller's UID, whose reference must become a plain owner
    /// reference first (the apiserver allows only one controller), unless the taking apply drops it
    /// ([`reference_applied_only_by`]).
    Adopt { demote: Option<String> },
    /// Leave it alone: the set reports CollisionDetected with this reason.
    Refuse(String),
    /// A newer revision controls it: it was handed over. Leave it alone, and vouch no more for it.
    Superseded(String),
}

/// The current controller of an object: (uid, kind, name), from its controller reference or, for objects
/// whose owner lives in another cluster, from the owners annotation.
pub fn controller_of(object: &Value) -> Option<(String, String, String)> {
    let controller = |refs: &[Value]| {
        refs.iter()
            .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
            .map(|r| {
                let field = |f: &str| r.get(f).and_then(Value::as_str).unwrap_or("").to_owned();
                (field("uid"), field("kind"), field("name"))
            })
    };
    let metadata = object.get("metadata")?;
    if let Some(found) = metadata
        .get("ownerReferences")
        .and_then(Value::as_array)
        .and_then(|refs| controller(refs))
    {
        return Some(found);
    }
    controller(&annotated_owners(metadata)?)
}

/// The owners annotation of objects whose owner lives in another cluster. An unparsable annotation names
/// no owner: the object is then treated as unowned.
fn annotated_owners(metadata: &Value) -> Option<Vec<Value>> {
    metadata
        .get("annotations")?
        .get(OWNERS_ANNOTATION)?
        .as_str()
        .and_then(|text| serde_json::from_str(text).ok())
}

/// Whether `uid` is among the object's owners (controller or not), by reference or owners annotation.
fn is_owner(object: &Value, uid: &str) -> bool {
    let Some(metadata) = object.get("metadata") else {
        return false;
    };
    let names = |refs: &[Value]| {
        refs.iter()
            .any(|r| r.get("uid").and_then(Value::as_str) == Some(uid))
    };
    let by_reference = metadata
        .get("ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| names(refs));
    let by_annotation = annotated_owners(metadata).is_some_and(|refs| names(&refs));
    by_reference || by_annotation
}

/// Revision recorded on an object by the revision that last applied it.
pub fn revision_of(object: &Value) -> Option<i64> {
    object
        .pointer("/metadata/annotations")?
        .get(REVISION_ANNOTATION)?
        .as_str()?
        .parse()
        .ok()
}

/// Decides whether `adopter` may take over `existing` under `protection`.
pub fn decide_adoption(
    adopter: &Adopter<'_>,
    protection: &CollisionProtection,
    existing: &Value,
) -> AdoptionDecision {
    let controller = controller_of(existing);
    if let Some((uid, _, _)) = &controller {
        if uid == adopter.uid {
            return AdoptionDecision::AlreadyOwned;
        }
    }
    if controller.is_none() && is_owner(existing, adopter.uid) {
        // Only a handover demotes a controller: a newer revision is taking the object over.
        return AdoptionDecision::Superseded(format!(
            "being handed over to a newer revision; this is revision {}",
            adopter.revision
        ));
    }
    if let Some(theirs) = revision_of(existing) {
        if theirs > adopter.revision && controller.is_some() {
            let holder = controller
                .as_ref()
                .map(|(_, kind, name)| format!(" ({kind} {name})"))
                .unwrap_or_default();
            return AdoptionDecision::Superseded(format!(
                "handed over to revision {theirs}{holder}; this is revision {}",
                adopter.revision
            ));
        }
    }
    let demote = controller.as_ref().map(|(uid, _, _)| uid.clone());
    let controlled_by_previous = controller
        .as_ref()
        .is_some_and(|(uid, _, _)| adopter.previous_uids.iter().any(|p| p == uid));
    let allowed = match protection {
        CollisionProtection::None => true,
        CollisionProtection::IfNoController => controller.is_none() || controlled_by_previous,
        CollisionProtection::Prevent => controlled_by_previous,
        // Rejected earlier by validation; refusing is the safe answer if it ever gets here.
        CollisionProtection::Unknown(_) => false,
    };
    if allowed {
        return AdoptionDecision::Adopt { demote };
    }
    let holder = match &controller {
        Some((_, kind, name)) => format!("controlled by {kind} {name}"),
        None => "not controlled by any previous revision".to_owned(),
    };
    AdoptionDecision::Refuse(format!(
        "refusing to adopt object {holder} (collisionProtection {})",
        protection.as_str()
    ))
}

/// Whether `object` is another owner's and keeps no reference to `uid` at all: a revision tearing down
/// has nothing to delete or release there. Handing over only ever moves an object to a newer revision,
/// so a state that says so (even one seen a while ago) stays true for the revision that handed it over.
pub fn handed_over_entirely(object: &Value, uid: &str) -> bool {
    controller_of(object).is_some_and(|(controller, _, _)| controller != uid)
        && !is_owner(object, uid)
}

/// Whether `existing`'s owner reference to `uid` was written by server-side applies of `field_manager`
/// alone (as its `managedFields` record). An apply of the same field manager that leaves the reference
/// out then drops it, so taking the object over needs no demotion first: one write both removes the
/// former controller and makes the adopter controller. A reference anyone else wrote (or an object
/// without field records) is demoted first, since the apply would leave it, and the apiserver refuses
/// two controllers.
pub fn reference_applied_only_by(existing: &Value, uid: &str, field_manager: &str) -> bool {
    let key = format!("k:{{\"uid\":\"{uid}\"}}");
    let Some(entries) = existing
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return false;
    };
    let mut writers = entries.iter().filter(|entry| {
        entry
            .pointer("/fieldsV1/f:metadata/f:ownerReferences")
            .and_then(|refs| refs.get(&key))
            .is_some()
    });
    let mut any = false;
    let only_ours = writers.all(|entry| {
        any = true;
        entry.get("manager").and_then(Value::as_str) == Some(field_manager)
            && entry.get("operation").and_then(Value::as_str) == Some("Apply")
    });
    any && only_ours
}

/// `object` as the managed-object cache keeps it: its `managedFields` cut to the one thing pko reads of
/// them ([`reference_applied_only_by`]: who wrote which owner reference, and how). The field sets are
/// often the bulk of a small object's metadata and are held for every managed object; of the owner
/// references' sets only their keys are kept (each set's fields are a map of maps, about 1 KB as JSON
/// values, and nothing reads them).
pub fn without_unread_field_records(mut object: Value) -> Value {
    let Some(entries) = object
        .pointer_mut("/metadata/managedFields")
        .and_then(Value::as_array_mut)
    else {
        return object;
    };
    entries.retain_mut(|entry| {
        let Some(references) = entry
            .pointer("/fieldsV1/f:metadata/f:ownerReferences")
            .and_then(Value::as_object)
        else {
            return false;
        };
        let references: serde_json::Map<String, Value> = references
            .keys()
            .map(|key| (key.clone(), Value::Null))
            .collect();
        let kept = |field: &str| entry.get(field).cloned().unwrap_or(Value::Null);
        *entry = serde_json::json!({
            "manager": kept("manager"),
            "operation": kept("operation"),
            "fieldsV1": {"f:metadata": {"f:ownerReferences": references}},
        });
        true
    });
    object
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn object(controller: Option<&str>, revision: Option<i64>) -> Value {
        let mut obj = json!({"metadata": {"name": "cm"}});
        if let Some(uid) = controller {
            obj["metadata"]["ownerReferences"] =
                json!([{"uid": uid, "kind": "ObjectSet", "name": "owner", "controller": true}]);
        }
        if let Some(rev) = revision {
            obj["metadata"]["annotations"] = json!({ REVISION_ANNOTATION: rev.to_string() });
        }
        obj
    }

    fn adopter(previous: &[String]) -> Adopter<'_> {
        Adopter {
            uid: "me",
            revision: 2,
            previous_uids: previous,
        }
    }

    #[test]
    fn an_object_handed_over_entirely_keeps_no_reference_to_the_old_revision() {
        let refs = |refs: Value| json!({"metadata": {"name": "cm", "ownerReferences": refs}});
        let new = json!({"uid": "new", "kind": "ObjectSet", "name": "rev2", "controller": true});
        let old_plain =
            json!({"uid": "old", "kind": "ObjectSet", "name": "rev1", "controller": false});
        let old_controller =
            json!({"uid": "old", "kind": "ObjectSet", "name": "rev1", "controller": true});
        assert!(handed_over_entirely(&refs(json!([new.clone()])), "old"));
        assert!(
            !handed_over_entirely(&refs(json!([old_plain, new])), "old"),
            "a plain reference of ours is still to be released"
        );
        assert!(!handed_over_entirely(&refs(json!([old_controller])), "old"));
        assert!(
            !handed_over_entirely(&json!({"metadata": {"name": "cm"}}), "old"),
            "no controller: not known to be anyone's"
        );
    }

    #[test]
    fn a_reference_only_our_applies_wrote_needs_no_demotion() {
        let entry = |manager: &str, operation: &str, uid: &str| {
            json!({"manager": manager, "operation": operation, "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:ownerReferences": {
                    format!("k:{{\"uid\":\"{uid}\"}}"): {".": {}, "f:controller": {}}}}}})
        };
        let object = |entries: Vec<Value>| json!({"metadata": {"managedFields": entries}});
        let ours = object(vec![
            entry("package-operator", "Apply", "old"),
            entry("someone", "Update", "other"),
        ]);
        assert!(reference_applied_only_by(&ours, "old", "package-operator"));
        assert!(
            !reference_applied_only_by(&ours, "other", "package-operator"),
            "written by an update of someone else"
        );
        let shared = object(vec![
            entry("package-operator", "Apply", "old"),
            entry("pko-manager", "Update", "old"),
        ]);
        assert!(!reference_applied_only_by(
            &shared,
            "old",
            "package-operator"
        ));
        let updated = object(vec![entry("package-operator", "Update", "old")]);
        assert!(!reference_applied_only_by(
            &updated,
            "old",
            "package-operator"
        ));
        assert!(
            !reference_applied_only_by(&json!({"metadata": {}}), "old", "package-operator"),
            "no field records: demote to be safe"
        );
        assert!(!reference_applied_only_by(
            &ours,
            "absent",
            "package-operator"
        ));
    }

    #[test]
    fn controllers_recorded_in_the_owners_annotation_count() {
        let owners = json!([
            {"uid": "old", "kind": "ObjectSetPhase", "name": "a", "controller": false},
            {"uid": "remote", "kind": "ObjectSetPhase", "name": "b", "controller": true},
        ]);
        let annotated =
            json!({"metadata": {"annotations": {OWNERS_ANNOTATION: owners.to_string()}}});
        assert_eq!(
            controller_of(&annotated),
            Some(("remote".into(), "ObjectSetPhase".into(), "b".into()))
        );
        let garbage = json!({"metadata": {"annotations": {OWNERS_ANNOTATION: "{not json"}}});
        assert_eq!(controller_of(&garbage), None);
        // Adoption rules apply unchanged: a phase of a previous revision hands over under Prevent.
        let previous = vec!["remote".to_owned()];
        let decision = decide_adoption(
            &adopter(&previous),
            &CollisionProtection::Prevent,
            &annotated,
        );
        assert_eq!(
            decision,
            AdoptionDecision::Adopt {
                demote: Some("remote".into())
            }
        );
    }

    #[test]
    fn collision_matrix() {
        let prev = vec!["prev".to_owned()];
        let a = adopter(&prev);
        use AdoptionDecision::*;
        let cases = [
            (CollisionProtection::Prevent, None, false),
            (CollisionProtection::Prevent, Some("stranger"), false),
            (CollisionProtection::Prevent, Some("prev"), true),
            (CollisionProtection::IfNoController, None, true),
            (CollisionProtection::IfNoController, Some("stranger"), false),
            (CollisionProtection::IfNoController, Some("prev"), true),
            (CollisionProtection::None, None, true),
            (CollisionProtection::None, Some("stranger"), true),
        ];
        for (protection, controller, adopt) in cases {
            let got = decide_adoption(&a, &protection, &object(controller, Some(1)));
            assert_eq!(
                matches!(got, Adopt { .. }),
                adopt,
                "{protection:?} controller={controller:?}: {got:?}"
            );
        }
        assert_eq!(
            decide_adoption(
                &a,
                &CollisionProtection::Prevent,
                &object(Some("me"), Some(2))
            ),
            AlreadyOwned
        );
        assert_eq!(
            decide_adoption(
                &a,
                &CollisionProtection::None,
                &object(Some("prev"), Some(1))
            ),
            Adopt {
                demote: Some("prev".to_owned())
            }
        );
    }

    #[test]
    fn a_demoted_owner_sees_its_object_handed_over() {
        let demoted = json!({"metadata": {
            "annotations": {REVISION_ANNOTATION: "2"},
            "ownerReferences": [{"uid": "ME", "kind": "ObjectSet", "name": "me", "controller": false}],
        }});
        let me = Adopter {
            uid: "ME",
            revision: 2,
            previous_uids: &[],
        };
        assert!(matches!(
            decide_adoption(&me, &CollisionProtection::Prevent, &demoted),
            AdoptionDecision::Superseded(_)
        ));
    }

    #[test]
    fn unknown_protection_refuses() {
        let got = decide_adoption(
            &adopter(&[]),
            &CollisionProtection::Unknown("Sometimes".to_owned()),
            &object(None, None),
        );
        assert!(matches!(got, AdoptionDecision::Refuse(_)));
    }

    proptest! {
        /// Whatever the protection, an object controlled by a newer revision is never taken.
        #[test]
        fn never_adopts_from_a_newer_revision(
            theirs in 3i64..1000,
            protection in prop::sample::select(vec![
                CollisionProtection::Prevent, CollisionProtection::IfNoController, CollisionProtection::None,
            ]),
            in_previous in any::<bool>(),
        ) {
            let prev = if in_previous { vec!["other".to_owned()] } else { vec![] };
            let got = decide_adoption(&adopter(&prev), &protection, &object(Some("other"), Some(theirs)));
            prop_assert!(matches!(got, AdoptionDecision::Superseded(_)));
        }

        /// Prevent adopts exactly the objects a previous revision controls.
        #[test]
        fn prevent_adopts_only_from_previous(controller in prop::option::of("[a-z]{1,5}"), previous in prop::collection::vec("[a-z]{1,5}", 0..4)) {
            let a = Adopter { uid: "ME", revision: 5, previous_uids: &previous };
            let got = decide_adoption(&a, &CollisionProtection::Prevent, &object(controller.as_deref(), Some(1)));
            let expected = controller.as_ref().is_some_and(|c| previous.contains(c));
            prop_assert_eq!(matches!(got, AdoptionDecision::Adopt { .. }), expected);
        }
    }

    #[test]
    fn the_cached_field_records_answer_the_adoption_question_as_the_whole_ones() {
        let reference = |uid: &str| {
            json!({format!("k:{{\"uid\":\"{uid}\"}}"): {
                ".": {}, "f:apiVersion": {}, "f:controller": {}, "f:kind": {}, "f:name": {}, "f:uid": {}}})
        };
        let entry = |manager: &str, operation: &str, uid: Option<&str>| {
            let mut metadata = json!({"f:labels": {"f:a": {}}});
            if let Some(uid) = uid {
                metadata["f:ownerReferences"] = reference(uid);
            }
            json!({"manager": manager, "operation": operation, "apiVersion": "v1",
                   "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                   "fieldsV1": {"f:metadata": metadata, "f:data": {"f:big": {}}}})
        };
        let cases = [
            vec![entry("package-operator", "Apply", Some("u1"))],
            vec![
                entry("package-operator", "Apply", Some("u1")),
                entry("kubectl", "Update", Some("u1")),
            ],
            vec![entry("package-operator", "Update", Some("u1"))],
            vec![
                entry("package-operator", "Apply", Some("u2")),
                entry("kubectl", "Update", None),
            ],
            vec![],
        ];
        for entries in cases {
            let whole = json!({"metadata": {"name": "cm", "managedFields": entries}});
            let slim = without_unread_field_records(whole.clone());
            for uid in ["u1", "u2"] {
                assert_eq!(
                    reference_applied_only_by(&slim, uid, "package-operator"),
                    reference_applied_only_by(&whole, uid, "package-operator"),
                    "{whole}"
                );
            }
            assert!(slim.to_string().len() <= whole.to_string().len());
            assert!(!slim.to_string().contains("f:big"));
            // A reference's own fields are not read: only its key is kept.
            assert!(!slim.to_string().contains("f:controller"));
        }
    }
}

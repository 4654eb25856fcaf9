//! The objects pko makes for itself and no owner's phase may write, adopt or read: each hosted cluster's
//! connector objects (ServiceAccount, Role, RoleBinding, Deployment named `pko-connector`, the Secret
//! `pko-connector-nats`) and any binding of the connector's Role.
//!
//! Why a rule and not RBAC alone: the manager needs `escalate`/`bind` on the Role `pko-connector` and
//! `patch` on those names in every namespace to install connectors, and an owner's objects are written
//! with the manager's rights unless the owner runs under a ServiceAccount. Without this rule a tenant's
//! ObjectSet carrying a Role `pko-connector` with every rule, bound to the tenant, would be applied with
//! the manager's `escalate`. Pure; the ObjectSet planner and the ObjectTemplate actor call it.

use pko_proto::well_known::{CONNECTOR_CREDENTIALS_SECRET, CONNECTOR_NAME};
use serde_json::Value;

use crate::objects::object_ref::ObjectKey;

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Why `object` (at `key`) is pko's own, or `None` when an owner may have it.
pub fn reserved_for_pko(key: &ObjectKey, object: &Value) -> Option<String> {
    let named = |name: &str| key.name == name;
    let connector_object = match (key.group.as_str(), key.kind.as_str()) {
        ("", "ServiceAccount") | ("apps", "Deployment") => named(CONNECTOR_NAME),
        (RBAC_GROUP, "Role" | "RoleBinding") => named(CONNECTOR_NAME),
        ("", "Secret") => named(CONNECTOR_CREDENTIALS_SECRET),
        _ => false,
    };
    if connector_object {
        return Some(format!(
            "{} {:?} is reserved for pko's hosted-cluster connector",
            key.kind, key.name
        ));
    }
    let binds_connector_role = key.group == RBAC_GROUP
        && matches!(key.kind.as_str(), "RoleBinding" | "ClusterRoleBinding")
        && object.pointer("/roleRef/kind").and_then(Value::as_str) == Some("Role")
        && object.pointer("/roleRef/name").and_then(Value::as_str) == Some(CONNECTOR_NAME);
    binds_connector_role.then(|| {
        format!(
            "roleRef: the Role {CONNECTOR_NAME:?} is reserved for pko's hosted-cluster connector"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key_of(object: &Value) -> ObjectKey {
        ObjectKey::of(object).unwrap()
    }

    #[test]
    fn the_connector_objects_are_reserved_in_every_namespace() {
        for (api_version, kind, name) in [
            ("v1", "ServiceAccount", "pko-connector"),
            ("v1", "Secret", "pko-connector-nats"),
            ("apps/v1", "Deployment", "pko-connector"),
            ("rbac.authorization.k8s.io/v1", "Role", "pko-connector"),
            (
                "rbac.authorization.k8s.io/v1",
                "RoleBinding",
                "pko-connector",
            ),
        ] {
            let object = json!({"apiVersion": api_version, "kind": kind,
                "metadata": {"name": name, "namespace": "tenant"}});
            let reason = reserved_for_pko(&key_of(&object), &object);
            assert!(reason.is_some_and(|r| r.contains(name)), "{kind} {name}");
        }
    }

    #[test]
    fn a_binding_of_the_connector_role_is_reserved_whatever_its_name() {
        let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "mine", "namespace": "tenant"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pko-connector"}});
        assert!(reserved_for_pko(&key_of(&binding), &binding).is_some());
        let other_role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "mine", "namespace": "tenant"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"}});
        assert_eq!(reserved_for_pko(&key_of(&other_role), &other_role), None);
    }

    #[test]
    fn the_same_names_on_other_kinds_are_an_owners_to_use() {
        for (api_version, kind, name) in [
            ("v1", "ConfigMap", "pko-connector"),
            ("v1", "Secret", "pko-connector"),
            ("v1", "ServiceAccount", "pko-connector-nats"),
            ("apps/v1", "StatefulSet", "pko-connector"),
        ] {
            let object =
                json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name}});
            assert_eq!(
                reserved_for_pko(&key_of(&object), &object),
                None,
                "{kind} {name}"
            );
        }
    }
}

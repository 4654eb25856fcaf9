//! Whose rights an owner's objects are read and written with: the manager's own, or a ServiceAccount of
//! the owner's namespace that the manager impersonates (`--default-service-account`, or the owner's
//! `package-operator.run/service-account` annotation naming an account that opted in with the label
//! `package-operator.run/owners-may-use: "true"`). The apiserver's RBAC then decides what a tenant's
//! objects may be, as it would for the tenant's own requests; only the tenants install grants the
//! manager `impersonate`.
//!
//! Pure; the ObjectSet planner and the ObjectTemplate actor ask it, the applier acts on the answer.

use std::fmt;

use std::collections::BTreeMap;

use pko_proto::well_known::{SERVICE_ACCOUNT_ANNOTATION, SERVICE_ACCOUNT_OPT_IN_LABEL};

use crate::objects::desired_object::InvalidObject;

/// The identity an owner's reads and writes go out as.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum ApplyIdentity {
    /// The manager's own ServiceAccount.
    #[default]
    Manager,
    /// `system:serviceaccount:<namespace>:<name>`, impersonated.
    ServiceAccount { namespace: String, name: String },
}

impl ApplyIdentity {
    /// The user name the apiserver sees; `None` for the manager's own identity.
    pub fn impersonated_user(&self) -> Option<String> {
        match self {
            ApplyIdentity::Manager => None,
            ApplyIdentity::ServiceAccount { namespace, name } => {
                Some(format!("system:serviceaccount:{namespace}:{name}"))
            }
        }
    }
}

impl fmt::Display for ApplyIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApplyIdentity::Manager => f.write_str("the manager's ServiceAccount"),
            ApplyIdentity::ServiceAccount { namespace, name } => {
                write!(f, "ServiceAccount {namespace}/{name}")
            }
        }
    }
}

/// What decides an owner's identity.
#[derive(Debug, Clone, Copy, Default)]
pub struct IdentityInputs<'a> {
    /// The owner's namespace; `None` for cluster-scoped owners.
    pub owner_namespace: Option<&'a str>,
    /// The owner's [`SERVICE_ACCOUNT_ANNOTATION`], if set.
    pub requested: Option<&'a str>,
    /// The manager's `--default-service-account`.
    pub default_service_account: Option<&'a str>,
    /// The owner lives in the HCP namespace of a HostedCluster: the HostedClusterPackage's Packages (and
    /// what they make) are the manager's own work there, not a tenant's.
    pub hosted_control_plane: bool,
}

/// The identity for an owner. Cluster-scoped owners always act as the manager (they are an admin's to
/// create); an annotation, when set, names a ServiceAccount of the owner's own namespace and wins; HCP
/// namespaces keep the manager's identity unless annotated; elsewhere the default applies when set.
pub fn apply_identity(inputs: IdentityInputs<'_>) -> Result<ApplyIdentity, InvalidObject> {
    let Some(namespace) = inputs.owner_namespace else {
        return Ok(ApplyIdentity::Manager);
    };
    let account = |name: &str| ApplyIdentity::ServiceAccount {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    };
    if let Some(requested) = inputs.requested {
        let invalid = |problem: String| InvalidObject {
            field: format!("metadata.annotations[{SERVICE_ACCOUNT_ANNOTATION}]"),
            problem,
        };
        return valid_service_account_name(requested)
            .map(|()| account(requested))
            .map_err(invalid);
    }
    match inputs.default_service_account {
        Some(name) if !inputs.hosted_control_plane => Ok(account(name)),
        _ => Ok(ApplyIdentity::Manager),
    }
}

/// Whether the ServiceAccount an owner's annotation named (with `labels`; `None`: not found) may be acted
/// as for it. The default account needs no label: the operator chose it.
pub fn requested_account_allowed(
    identity: &ApplyIdentity,
    labels: Option<&BTreeMap<String, String>>,
) -> Result<(), InvalidObject> {
    let field = format!("metadata.annotations[{SERVICE_ACCOUNT_ANNOTATION}]");
    match labels {
        None => Err(InvalidObject {
            field,
            problem: format!("{identity} does not exist"),
        }),
        Some(labels) if labels.get(SERVICE_ACCOUNT_OPT_IN_LABEL).map(String::as_str) == Some("true") => {
            Ok(())
        }
        Some(_) => Err(InvalidObject {
            field,
            problem: format!(
                "{identity} is not labelled {SERVICE_ACCOUNT_OPT_IN_LABEL}=true: owners may not act as it"
            ),
        }),
    }
}

/// A ServiceAccount name is a DNS-1123 subdomain: at most 253 characters of lower-case letters, digits,
/// '-' and '.', starting and ending with a letter or digit. Anything else could smuggle another user name
/// (`a:b`) into the impersonation header.
pub fn valid_service_account_name(name: &str) -> Result<(), String> {
    if is_dns1123_subdomain(name) {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a ServiceAccount name (a DNS-1123 subdomain of at most 253 characters)"
        ))
    }
}

/// Whether `name` is a DNS-1123 subdomain, as the names of most Kubernetes objects must be.
pub fn is_dns1123_subdomain(name: &str) -> bool {
    let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| alphanumeric(c) || c == '-' || c == '.')
        && name.starts_with(alphanumeric)
        && name.ends_with(alphanumeric)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sa(namespace: &str, name: &str) -> ApplyIdentity {
        ApplyIdentity::ServiceAccount {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    #[test]
    fn without_a_default_or_annotation_the_manager_acts() {
        let inputs = IdentityInputs {
            owner_namespace: Some("tenant"),
            ..IdentityInputs::default()
        };
        assert_eq!(apply_identity(inputs), Ok(ApplyIdentity::Manager));
    }

    #[test]
    fn the_default_applies_to_namespaced_owners_outside_hcp_namespaces() {
        let inputs = IdentityInputs {
            owner_namespace: Some("tenant"),
            default_service_account: Some("deployer"),
            ..IdentityInputs::default()
        };
        assert_eq!(apply_identity(inputs), Ok(sa("tenant", "deployer")));
        let hcp = IdentityInputs {
            hosted_control_plane: true,
            ..inputs
        };
        assert_eq!(apply_identity(hcp), Ok(ApplyIdentity::Manager));
        let cluster_scoped = IdentityInputs {
            owner_namespace: None,
            requested: Some("deployer"),
            ..inputs
        };
        assert_eq!(apply_identity(cluster_scoped), Ok(ApplyIdentity::Manager));
    }

    #[test]
    fn an_annotation_names_an_account_of_the_owners_own_namespace() {
        let inputs = IdentityInputs {
            owner_namespace: Some("tenant"),
            requested: Some("other"),
            default_service_account: Some("deployer"),
            hosted_control_plane: true,
        };
        assert_eq!(apply_identity(inputs), Ok(sa("tenant", "other")));
        let smuggled = IdentityInputs {
            requested: Some("x:kube-system:admin"),
            ..inputs
        };
        let error = apply_identity(smuggled).unwrap_err();
        assert_eq!(
            error.field,
            "metadata.annotations[package-operator.run/service-account]"
        );
        assert_eq!(
            sa("tenant", "other").impersonated_user().as_deref(),
            Some("system:serviceaccount:tenant:other")
        );
    }

    #[test]
    fn an_annotation_counts_only_for_an_account_that_opted_in() {
        let ci = sa("tenant", "ci");
        let opted_in =
            BTreeMap::from([(SERVICE_ACCOUNT_OPT_IN_LABEL.to_owned(), "true".to_owned())]);
        assert_eq!(requested_account_allowed(&ci, Some(&opted_in)), Ok(()));
        let refused = requested_account_allowed(&ci, Some(&BTreeMap::new())).unwrap_err();
        assert_eq!(
            refused.field,
            "metadata.annotations[package-operator.run/service-account]"
        );
        assert_eq!(
            refused.problem,
            "ServiceAccount tenant/ci is not labelled package-operator.run/owners-may-use=true: owners may not act as it"
        );
        let other_value =
            BTreeMap::from([(SERVICE_ACCOUNT_OPT_IN_LABEL.to_owned(), "yes".to_owned())]);
        assert!(requested_account_allowed(&ci, Some(&other_value)).is_err());
        assert!(requested_account_allowed(&ci, None)
            .unwrap_err()
            .problem
            .contains("does not exist"));
    }

    proptest! {
        #[test]
        fn a_valid_name_never_carries_a_separator(name in "\\PC{0,40}") {
            if valid_service_account_name(&name).is_ok() {
                prop_assert!(!name.contains(':') && !name.contains('/') && !name.is_empty());
            }
        }
    }
}

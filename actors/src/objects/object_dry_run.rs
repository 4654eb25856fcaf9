//! One object put to an apiserver as a server-side dry run (`dryRun=All`: validation, admission
//! webhooks, immutable fields, quota), and what the answer says: accepted, refused with the apiserver's
//! message, or unchecked when the dry run cannot tell (a kind or namespace the same release creates, a
//! webhook that cannot dry-run, a failed request). The manager runs it for a release's preflight against
//! its own cluster, a connector against its hosted cluster. It stores nothing.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::engine::objects::object_ref::ObjectKey;
use crate::engine::rollout::preflight_diff::Verdict;
use crate::objects::applier::{Applier, ApplyError};

/// What a release itself brings that a dry run cannot see yet: the kinds its CRDs define and the
/// namespaces it creates.
#[derive(Debug, Default)]
pub struct Introduced {
    kinds: BTreeSet<(String, String)>,
    namespaces: BTreeSet<String>,
}

impl Introduced {
    /// From the objects a release creates or changes.
    pub fn of<'a>(objects: impl IntoIterator<Item = &'a Value>) -> Self {
        let mut introduced = Self::default();
        for object in objects {
            let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str);
            match text("/kind") {
                Some("CustomResourceDefinition") => {
                    if let (Some(group), Some(kind)) =
                        (text("/spec/group"), text("/spec/names/kind"))
                    {
                        introduced.kinds.insert((group.to_owned(), kind.to_owned()));
                    }
                }
                Some("Namespace") if text("/apiVersion") == Some("v1") => {
                    if let Some(name) = text("/metadata/name") {
                        introduced.namespaces.insert(name.to_owned());
                    }
                }
                _ => {}
            }
        }
        introduced
    }
}

/// The dry run of applying `object` (created or updated). `default_namespace`: where an object that
/// names none goes (a namespaced owner's namespace), if anywhere.
pub async fn dry_run(
    applier: &Applier,
    object: &Value,
    default_namespace: Option<&str>,
    introduced: &Introduced,
) -> Verdict {
    let mut object = object.clone();
    if let Some(ns) = default_namespace.filter(|_| object.pointer("/metadata/namespace").is_none())
    {
        object["metadata"]["namespace"] = json!(ns);
    }
    let Some(mut key) = ObjectKey::of(&object) else {
        return Verdict::Refused("the object has no apiVersion, kind or name".into());
    };
    match applier.resolve(&key).await {
        Ok(kind) if !kind.namespaced && default_namespace.is_some() => {
            // Cluster-scoped: applied without the namespace defaulted above.
            key.namespace.clear();
            if let Some(meta) = object["metadata"].as_object_mut() {
                meta.remove("namespace");
            }
        }
        Ok(_) => {}
        Err(ApplyError::UnknownKind { .. })
            if introduced
                .kinds
                .contains(&(key.group.clone(), key.kind.clone())) =>
        {
            return Verdict::Unchecked("its kind is defined by this release's CRD".into());
        }
        Err(e) => return Verdict::Refused(e.to_string()),
    }
    match applier.dry_run_apply(&key, &object).await {
        Ok(()) => Verdict::Accepted,
        Err(e) => refusal(&e, &key, introduced),
    }
}

/// A dry run's error as a verdict: the apiserver's refusal, or why it proves nothing.
fn refusal(error: &ApplyError, key: &ObjectKey, introduced: &Introduced) -> Verdict {
    let status = match error {
        ApplyError::Api { source, .. } => match source.as_ref() {
            kube::Error::Api(status) => Some(status),
            _ => None,
        },
        _ => None,
    };
    match status {
        Some(s) if s.code == 404 && introduced.namespaces.contains(&key.namespace) => {
            Verdict::Unchecked("its namespace is created by this release".into())
        }
        // An admission webhook with side effects refuses every dry run: that says nothing of the object.
        Some(s) if s.message.contains("does not support dry run") => {
            Verdict::Unchecked(format!("a webhook cannot dry-run it: {}", s.message))
        }
        Some(s) if (400..500).contains(&s.code) && s.code != 429 => {
            Verdict::Refused(s.message.clone())
        }
        _ => Verdict::Unchecked(format!("the dry run failed: {error}")),
    }
}

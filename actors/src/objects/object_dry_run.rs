//! One object put to an apiserver as a server-side dry run (`dryRun=All`: validation, admission
//! webhooks, immutable fields, quota), and what the answer says: accepted, refused with the apiserver's
//! message, or unchecked when the dry run cannot tell (a kind or namespace the same release creates, a
//! webhook that cannot dry-run, a failed request). The manager runs it for a release's preflight against
//! its own cluster, a connector against its hosted cluster. It stores nothing.

use std::collections::BTreeSet;

use serde_json::Value;

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

/// The dry run of applying `body` (created or updated) as `key`.
pub async fn dry_run(
    applier: &Applier,
    key: &ObjectKey,
    body: &Value,
    introduced: &Introduced,
) -> Verdict {
    match applier.dry_run_apply(key, body).await {
        Ok(()) => Verdict::Accepted,
        Err(ApplyError::UnknownKind { .. })
            if introduced
                .kinds
                .contains(&(key.group.clone(), key.kind.clone())) =>
        {
            Verdict::Unchecked("its kind is defined by this release's CRD".into())
        }
        Err(e) => refusal(&e, key, introduced),
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
        // The kind is not served, or the namespace does not fit its scope: the apply fails the same.
        None if error.is_permanent() => Verdict::Refused(error.to_string()),
        _ => Verdict::Unchecked(format!("the dry run failed: {error}")),
    }
}

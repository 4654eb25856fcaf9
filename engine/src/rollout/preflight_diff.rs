//! The preflight diff of a HostedClusterPackage's release (pko extension, issue 43): what the release
//! changes in each HCP namespace against what the namespace's current revision holds, object by object
//! and field by field, in the form namespaces are compared in across the fleet
//! (`engine::rollout::preflight_report` groups them).
//!
//! Values that differ only by the namespace they are in (the HCP namespace, its HostedCluster's name)
//! are written as `$(namespace)` and `$(hostedCluster)` before comparing, so one change rolled to 400
//! namespaces is one group. A Secret's values are never shown nor hashed: only whether each key changed.
//!
//! Pure: the render, the reads and the apiserver's dry runs are the caller's.

use std::collections::{BTreeMap, BTreeSet};

use pko_proto::{GROUP, VERSION};
use serde_json::{json, Map, Value};

use crate::objects::desired_object::{unmarked_object, DesiredObject, InvalidObject, OwnerRef};
use crate::objects::object_ref::ObjectKey;

pub const NAMESPACE_PLACEHOLDER: &str = "$(namespace)";
pub const HOSTED_CLUSTER_PLACEHOLDER: &str = "$(hostedCluster)";

/// The objects of one phase, as a revision holds them or a render makes them.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseObjects {
    pub phase: String,
    /// A hosted-cluster phase: applied in the hosted cluster, through its connector.
    pub hosted: bool,
    pub objects: Vec<Value>,
}

/// What happens to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Create,
    Update,
    Delete,
}

impl Action {
    pub fn label(self) -> &'static str {
        match self {
            Action::Create => "Create",
            Action::Update => "Update",
            Action::Delete => "Delete",
        }
    }
}

/// One object the release changes: where it is (the rendered phase, or the current one for a delete)
/// and what it was and becomes.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectChange {
    pub phase: String,
    pub hosted: bool,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

impl ObjectChange {
    pub fn action(&self) -> Action {
        match (&self.before, &self.after) {
            (None, _) => Action::Create,
            (Some(_), Some(_)) => Action::Update,
            (Some(_), None) => Action::Delete,
        }
    }

    /// The object as it will be (as it was, for a delete).
    pub fn object(&self) -> &Value {
        self.after
            .as_ref()
            .or(self.before.as_ref())
            .unwrap_or(&Value::Null)
    }
}

/// What the apiserver said of a change's dry run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    /// Refused, with the apiserver's message.
    Refused(String),
    /// Not checked, with why (a kind or namespace this very release creates, a hosted cluster whose
    /// connector did not answer, a delete).
    Unchecked(String),
}

impl Verdict {
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Verdict::Accepted => "Accepted",
            Verdict::Refused(_) => "Refused",
            Verdict::Unchecked(_) => "Unchecked",
        }
    }

    pub(crate) fn message(&self) -> &str {
        match self {
            Verdict::Accepted => "",
            Verdict::Refused(m) | Verdict::Unchecked(m) => m,
        }
    }
}

/// One HCP namespace's preflight: its changes with their verdicts, or why it could not be compared.
#[derive(Debug, Clone, PartialEq)]
pub struct NamespacePreflight {
    pub namespace: String,
    /// Its HostedCluster's name.
    pub hosted_cluster: Option<String>,
    pub outcome: Result<Vec<(ObjectChange, Verdict)>, String>,
}

/// Who an object is across revisions: group, kind, namespace and name, as the object engine keys it
/// (a new version of the same kind is the same object).
pub(crate) fn identity(object: &Value) -> (String, String, String, String) {
    ObjectKey::of(object)
        .map(|k| k.without_version())
        .unwrap_or_default()
}

/// `change`'s object as its phase would hand it to the apiserver, through the object engine's own
/// checks (`objects::desired_object`): in a management-cluster phase confined to, or defaulted into,
/// HCP namespace `namespace`. pko's ownership marks are left out, since the revision that would own it
/// does not exist yet. `None` for a delete; an object the engine itself refuses says why.
pub fn as_applied(
    change: &ObjectChange,
    namespace: &str,
) -> Option<Result<DesiredObject, InvalidObject>> {
    let object = change
        .after
        .as_ref()
        .filter(|_| change.action() != Action::Delete)?;
    let owner = OwnerRef {
        api_version: format!("{GROUP}/{VERSION}"),
        kind: if change.hosted {
            "ObjectSetPhase"
        } else {
            "ObjectSet"
        }
        .to_owned(),
        name: String::new(),
        uid: String::new(),
        namespace: Some(namespace.to_owned()),
        remote: change.hosted,
    };
    let field = format!("phase {}", change.phase);
    Some(unmarked_object(&owner, &field, object))
}

/// The objects that differ between what the current revision holds and what the release renders
/// (`current` is empty when the namespace has no revision yet: every object is created).
pub fn object_changes(current: &[PhaseObjects], rendered: &[PhaseObjects]) -> Vec<ObjectChange> {
    let mut before: BTreeMap<_, (&PhaseObjects, &Value)> = current
        .iter()
        .flat_map(|p| p.objects.iter().map(move |o| (identity(o), (p, o))))
        .collect();
    let mut changes = Vec::new();
    for phase in rendered {
        for object in &phase.objects {
            let was = before.remove(&identity(object)).map(|(_, o)| o);
            if was != Some(object) {
                changes.push(ObjectChange {
                    phase: phase.phase.clone(),
                    hosted: phase.hosted,
                    before: was.cloned(),
                    after: Some(object.clone()),
                });
            }
        }
    }
    changes.extend(before.into_values().map(|(phase, object)| ObjectChange {
        phase: phase.phase.clone(),
        hosted: phase.hosted,
        before: Some(object.clone()),
        after: None,
    }));
    changes
}

/// Replaces `needle` in `text` where it stands as a whole token (no letter or digit on either side).
fn replace_token(text: &str, needle: &str, with: &str) -> String {
    if needle.is_empty() || !text.contains(needle) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut previous: Option<char> = None;
    while let Some(at) = rest.find(needle) {
        let before = rest[..at].chars().next_back().or(previous);
        let after = rest[at + needle.len()..].chars().next();
        let bounded = |c: Option<char>| !c.is_some_and(|c| c.is_ascii_alphanumeric());
        out.push_str(&rest[..at]);
        if bounded(before) && bounded(after) {
            out.push_str(with);
        } else {
            out.push_str(needle);
        }
        previous = needle.chars().next_back();
        rest = &rest[at + needle.len()..];
    }
    out.push_str(rest);
    out
}

/// What is written in place of a namespace's own names.
struct Placeholders<'a> {
    namespace: &'a str,
    hosted_cluster: Option<&'a str>,
}

impl Placeholders<'_> {
    fn text(&self, text: &str) -> String {
        let text = replace_token(text, self.namespace, NAMESPACE_PLACEHOLDER);
        match self.hosted_cluster {
            Some(name) => replace_token(&text, name, HOSTED_CLUSTER_PLACEHOLDER),
            None => text,
        }
    }

    fn value(&self, value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(self.text(s)),
            Value::Array(items) => Value::Array(items.iter().map(|i| self.value(i)).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (self.text(k), self.value(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

fn is_secret(object: &Value) -> bool {
    object["kind"] == "Secret" && object["apiVersion"] == "v1"
}

/// A Secret's values, replaced by whether each changed: `(redacted)`, or `(redacted, old)` and
/// `(redacted, new)` on the two sides of a change.
fn redact_secret(change: &mut ObjectChange) {
    if !is_secret(change.object()) {
        return;
    }
    for field in ["data", "stringData"] {
        let old: Map<String, Value> = change
            .before
            .as_ref()
            .and_then(|b| b[field].as_object().cloned())
            .unwrap_or_default();
        let new: Map<String, Value> = change
            .after
            .as_ref()
            .and_then(|a| a[field].as_object().cloned())
            .unwrap_or_default();
        let mark = |side: &mut Option<Value>,
                    mine: &Map<String, Value>,
                    other: &Map<String, Value>,
                    tag| {
            let Some(values) = side.as_mut().and_then(|s| s[field].as_object_mut()) else {
                return;
            };
            for (key, value) in values.iter_mut() {
                *value = match other.get(key) {
                    Some(theirs) if Some(theirs) != mine.get(key) => {
                        json!(format!("(redacted, {tag})"))
                    }
                    _ => json!("(redacted)"),
                };
            }
        };
        mark(&mut change.before, &old, &new, "old");
        mark(&mut change.after, &new, &old, "new");
    }
}

/// `a.b[name].c` paths where two values differ; list items with a `name` are matched by it.
fn changed_fields(before: &Value, after: &Value, path: &str, out: &mut Vec<String>) {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            let keys: BTreeSet<&String> = b.keys().chain(a.keys()).collect();
            for key in keys {
                let sub = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match (b.get(key), a.get(key)) {
                    (Some(x), Some(y)) => changed_fields(x, y, &sub, out),
                    _ => out.push(sub),
                }
            }
        }
        (Value::Array(b), Value::Array(a)) if b.len() == a.len() || named(b) && named(a) => {
            let key = |i: usize, item: &Value| match item["name"].as_str() {
                Some(name) if named(b) && named(a) => name.to_owned(),
                _ => i.to_string(),
            };
            let old: BTreeMap<String, &Value> =
                b.iter().enumerate().map(|(i, v)| (key(i, v), v)).collect();
            let new: BTreeMap<String, &Value> =
                a.iter().enumerate().map(|(i, v)| (key(i, v), v)).collect();
            let keys: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
            for k in keys {
                let sub = format!("{path}[{k}]");
                match (old.get(k), new.get(k)) {
                    (Some(x), Some(y)) => changed_fields(x, y, &sub, out),
                    _ => out.push(sub),
                }
            }
        }
        _ if before != after => out.push(path.to_owned()),
        _ => {}
    }
}

/// Every item is an object with a unique `name`.
fn named(items: &[Value]) -> bool {
    let names: BTreeSet<&str> = items.iter().filter_map(|i| i["name"].as_str()).collect();
    names.len() == items.len()
}

/// `<apiVersion> <kind> <name>`, with ` in <namespace>` when the object names one.
fn object_label(object: &Value) -> String {
    let (_, kind, namespace, name) = identity(object);
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    match namespace.as_str() {
        "" => format!("{api_version} {kind} {name}"),
        ns => format!("{api_version} {kind} {name} in {ns}"),
    }
}

/// One namespace's change as compared across the fleet (placeholders in, Secret values out).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NormalizedChange {
    pub(crate) phase: String,
    pub(crate) hosted: bool,
    pub(crate) object: String,
    pub(crate) action: Action,
    pub(crate) fields: Vec<String>,
    pub(crate) verdict: Verdict,
    pub(crate) change: ObjectChange,
}

/// One namespace's changes as compared across the fleet, or why it was not compared.
pub(crate) type NamespaceChange = Result<Vec<NormalizedChange>, String>;

fn normalize(
    placeholders: &Placeholders<'_>,
    (change, verdict): &(ObjectChange, Verdict),
) -> NormalizedChange {
    let mut change = ObjectChange {
        phase: change.phase.clone(),
        hosted: change.hosted,
        before: change.before.as_ref().map(|v| placeholders.value(v)),
        after: change.after.as_ref().map(|v| placeholders.value(v)),
    };
    redact_secret(&mut change);
    let mut fields = Vec::new();
    if let (Some(b), Some(a)) = (&change.before, &change.after) {
        changed_fields(b, a, "", &mut fields);
    }
    let verdict = match verdict {
        Verdict::Accepted => Verdict::Accepted,
        Verdict::Refused(m) => Verdict::Refused(placeholders.text(m)),
        Verdict::Unchecked(m) => Verdict::Unchecked(placeholders.text(m)),
    };
    NormalizedChange {
        phase: change.phase.clone(),
        hosted: change.hosted,
        object: object_label(change.object()),
        action: change.action(),
        fields,
        verdict,
        change,
    }
}

/// `ns`'s changes as compared across the fleet: its own names as placeholders, Secret values out.
pub(crate) fn normalized(ns: &NamespacePreflight) -> NamespaceChange {
    let placeholders = Placeholders {
        namespace: &ns.namespace,
        hosted_cluster: ns.hosted_cluster.as_deref(),
    };
    match &ns.outcome {
        Ok(changes) => Ok(changes
            .iter()
            .map(|c| normalize(&placeholders, c))
            .collect()),
        Err(why) => Err(placeholders.text(why)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn phase(objects: Vec<Value>) -> Vec<PhaseObjects> {
        vec![PhaseObjects {
            phase: "deploy".into(),
            hosted: false,
            objects,
        }]
    }
    #[test]
    fn placeholders_replace_whole_tokens_only() {
        assert_eq!(replace_token("hc1", "hc1", "X"), "X");
        assert_eq!(
            replace_token("hc1.example.com/hc1", "hc1", "X"),
            "X.example.com/X"
        );
        assert_eq!(
            replace_token("hc10 xhc1 hc1-db", "hc1", "X"),
            "hc10 xhc1 X-db"
        );
        assert_eq!(replace_token("hc1hc1", "hc1", "X"), "hc1hc1");
        assert_eq!(replace_token("a", "", "X"), "a");
    }
    #[test]
    fn creates_deletes_and_unchanged_objects() {
        let cm = |name: &str, v: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": v}});
        let changes = object_changes(
            &phase(vec![cm("same", "1"), cm("gone", "1"), cm("moved", "1")]),
            &[
                PhaseObjects {
                    phase: "a".into(),
                    hosted: false,
                    objects: vec![cm("same", "1"), cm("new", "1")],
                },
                PhaseObjects {
                    phase: "b".into(),
                    hosted: true,
                    objects: vec![cm("moved", "1")],
                },
            ],
        );
        let seen: Vec<(Action, &str)> = changes
            .iter()
            .map(|c| (c.action(), c.object()["metadata"]["name"].as_str().unwrap()))
            .collect();
        assert_eq!(seen, [(Action::Create, "new"), (Action::Delete, "gone")]);
    }
    #[test]
    fn dry_runs_send_what_the_phase_would_apply_and_nothing_the_engine_refuses() {
        let cm = |ns: Option<&str>| {
            let mut o = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
            if let Some(ns) = ns {
                o["metadata"]["namespace"] = json!(ns);
            }
            o
        };
        let change = |object: Value, hosted: bool| ObjectChange {
            phase: "deploy".into(),
            hosted,
            before: None,
            after: Some(object),
        };
        let local = as_applied(&change(cm(None), false), "clusters-a")
            .unwrap()
            .unwrap();
        assert_eq!(
            local.object["metadata"]["namespace"], "clusters-a",
            "defaulted like the phase"
        );
        assert_eq!(local.key.namespace, "clusters-a");
        assert!(
            local.object["metadata"].get("ownerReferences").is_none(),
            "no revision owns it yet"
        );
        let foreign = as_applied(&change(cm(Some("kube-system")), false), "clusters-a").unwrap();
        let refused = foreign.unwrap_err().to_string();
        assert!(
            refused.contains("outside the owner's namespace"),
            "{refused}"
        );
        let hosted = as_applied(&change(cm(None), true), "clusters-a")
            .unwrap()
            .unwrap();
        assert!(
            hosted.object["metadata"].get("namespace").is_none(),
            "a hosted phase keeps it as written"
        );
        let gone = ObjectChange {
            before: Some(cm(None)),
            after: None,
            ..change(cm(None), false)
        };
        assert!(as_applied(&gone, "clusters-a").is_none());
    }

    #[test]
    fn list_items_with_names_are_matched_by_name() {
        let mut fields = Vec::new();
        changed_fields(
            &json!({"c": [{"name": "a", "v": 1}, {"name": "b", "v": 1}]}),
            &json!({"c": [{"name": "b", "v": 2}, {"name": "a", "v": 1}, {"name": "z"}]}),
            "",
            &mut fields,
        );
        assert_eq!(fields, ["c[b].v", "c[z]"]);
    }
}

//! The ObjectSets of every ObjectDeployment as the deployments read them, kept from the ObjectSet watch so
//! a deployment's reconcile does not list its sets from the apiserver each time.
//!
//! The index only ever holds what the watch delivered, so it can lag: a set just created, one relabelled
//! onto this replica, or a watch that has not listed yet are missing from it. A reader trusts it only when
//! it holds every set the deployment knows of ([`RevisionIndex::revisions`]); otherwise it lists.
//! It holds views without templates (a digest and the object names instead), so templates are not kept
//! twice. It never writes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use pko_proto::well_known::DEPLOYMENT_LABEL;
use serde_json::json;

use crate::engine::conditions::{is_current, is_mapped, is_true_for, reported_for};
use crate::engine::objects::adoption::{controller_of, revision_of};
use crate::engine::objects::deployment_plan::{RevisionContent, RevisionView};
use crate::objects::set_object::{SetKind, SetObject};
use crate::runtime::meta_view::MetaView;

/// The sets labelled for one deployment: kind of set, namespace, deployment name.
type DeploymentKey = (SetKind, String, String);
/// One set: kind, namespace, name.
type SetId = (SetKind, String, String);

/// A set as indexed: its generation, its controller's UID and the deployment's view of it (with `ours`
/// left to the reader, which knows its own UID), and what a newer revision reads of it as its previous
/// ([`RevisionIndex::previous`]).
#[derive(Debug, Clone, PartialEq)]
struct IndexedRevision {
    generation: i64,
    controller_uid: Option<String>,
    view: RevisionView,
    previous: PreviousRevision,
}

/// What a set's successor reads of it when planning: its UID (objects it controls may be adopted) and
/// the revision number its status reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviousRevision {
    pub uid: Option<String>,
    pub status_revision: i64,
}

#[derive(Default)]
struct Revisions {
    by_deployment: HashMap<DeploymentKey, BTreeMap<String, IndexedRevision>>,
    /// Which deployment each set is filed under (a relabelled set moves).
    filed_under: HashMap<SetId, DeploymentKey>,
}

/// Shared by the ObjectSet feeds (writers) and the deployment actors (readers); cheap to clone.
#[derive(Clone, Default)]
pub struct RevisionIndex(Arc<Mutex<Revisions>>);

/// What an observed set changed in the index.
#[derive(Debug, PartialEq, Eq)]
pub enum IndexChange {
    /// Nothing a deployment reads of the set changed: its deployment need not wake.
    Unchanged,
    /// The set is new, gone, or changed in what its deployment reads.
    Changed,
}

impl RevisionIndex {
    /// Files what the watch delivered of `set` (or forgets it when `deleted`). The template is digested
    /// only when the set is new or its generation changed (a set's template changes only with it).
    pub fn observe(&self, set: &SetObject, deleted: bool) -> IndexChange {
        let id: SetId = (set.kind, set.namespace().to_owned(), set.name().to_owned());
        let mut revisions = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (previous_key, previous) = match revisions.filed(&id) {
            Some((key, indexed)) => (Some(key.clone()), Some(indexed.clone())),
            None => (None, None),
        };
        let key = set
            .meta
            .labels
            .as_ref()
            .and_then(|labels| labels.get(DEPLOYMENT_LABEL))
            .map(|deployment| (set.kind, id.1.clone(), deployment.clone()));
        if let Some(previous_key) = previous_key
            .as_ref()
            .filter(|p| deleted || Some(*p) != key.as_ref())
        {
            revisions.unfile(&id, previous_key);
        }
        // A deletion, or a set not labelled for a deployment (nothing to compare it with), always counts.
        let (Some(key), false) = (key, deleted) else {
            return IndexChange::Changed;
        };
        let generation = set.generation();
        let content = match &previous {
            Some(p) if p.generation == generation => p.view.content.clone(),
            _ => RevisionContent::of(&set.spec.template),
        };
        let controller_uid = controller_uid(set);
        let indexed = IndexedRevision {
            generation,
            view: revision_view(set, content, None),
            controller_uid,
            previous: PreviousRevision {
                uid: set.meta.uid.clone(),
                status_revision: set.status.revision,
            },
        };
        let change = if previous_key.as_ref() == Some(&key) && previous.as_ref() == Some(&indexed) {
            IndexChange::Unchanged
        } else {
            IndexChange::Changed
        };
        revisions.filed_under.insert(id.clone(), key.clone());
        revisions
            .by_deployment
            .entry(key)
            .or_default()
            .insert(id.2, indexed);
        change
    }

    /// The sets labelled for the deployment `name` (UID `uid`), if the index holds every one of
    /// `known` (the sets the deployment's status names, and the current revision's): `None` tells the
    /// reader to list instead.
    pub fn revisions(
        &self,
        kind: SetKind,
        namespace: &str,
        name: &str,
        uid: &str,
        known: &[&str],
    ) -> Option<Vec<RevisionView>> {
        let revisions = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let sets = revisions
            .by_deployment
            .get(&(kind, namespace.to_owned(), name.to_owned()))?;
        if !known.iter().all(|k| sets.contains_key(*k)) {
            return None;
        }
        Some(
            sets.values()
                .map(|indexed| RevisionView {
                    ours: indexed.controller_uid.as_deref() == Some(uid),
                    ..indexed.view.clone()
                })
                .collect(),
        )
    }

    /// The set `name` of `kind` in `namespace` as its successor reads it, if the watch delivered it
    /// (labelled for a deployment); `None` tells the reader to ask the apiserver.
    pub fn previous(&self, kind: SetKind, namespace: &str, name: &str) -> Option<PreviousRevision> {
        let revisions = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let id: SetId = (kind, namespace.to_owned(), name.to_owned());
        revisions
            .filed(&id)
            .map(|(_, indexed)| indexed.previous.clone())
    }
}

impl Revisions {
    /// The set as filed, with the deployment it is filed under.
    fn filed(&self, id: &SetId) -> Option<(&DeploymentKey, &IndexedRevision)> {
        let key = self.filed_under.get(id)?;
        let indexed = self.by_deployment.get(key)?.get(&id.2)?;
        Some((key, indexed))
    }

    fn unfile(&mut self, id: &SetId, key: &DeploymentKey) {
        self.filed_under.remove(id);
        if let Some(sets) = self.by_deployment.get_mut(key) {
            sets.remove(&id.2);
            if sets.is_empty() {
                self.by_deployment.remove(key);
            }
        }
    }
}

/// What a deployment reads of one of its sets; `ours` when `owner_uid` controls it.
pub fn revision_view(
    set: &SetObject,
    content: RevisionContent,
    owner_uid: Option<&str>,
) -> RevisionView {
    let generation = set.generation();
    let conditions = &set.status.conditions;
    RevisionView {
        name: set.name().to_owned(),
        ours: owner_uid.is_some_and(|uid| controller_uid(set).as_deref() == Some(uid)),
        revision: if set.status.revision > 0 {
            set.status.revision
        } else {
            revision_of(&set_meta(set)).unwrap_or(0)
        },
        content,
        lifecycle: set.spec.lifecycle_state.clone(),
        available: is_true_for(conditions, "Available", generation),
        unavailable: conditions
            .iter()
            .find(|c| {
                // Objects whose status does not speak for the change yet are on their way, not failing.
                c.type_ == "Available"
                    && c.status == "False"
                    && c.reason != "AwaitingStatus"
                    && is_current(c, generation)
            })
            .map(|c| c.message.clone()),
        succeeded: is_true_for(conditions, "Succeeded", generation),
        archived: is_true_for(conditions, "Archived", generation),
        mapped: conditions
            .iter()
            .filter(|c| is_mapped(&c.type_) && is_current(c, generation))
            .cloned()
            .collect(),
        reported: reported_for(conditions, generation),
        controls: set
            .status
            .controller_of
            .iter()
            .map(|c| {
                (
                    c.group.clone(),
                    c.kind.clone(),
                    c.namespace.clone(),
                    c.name.clone(),
                )
            })
            .collect(),
    }
}

/// What the adoption rules read of a set's metadata.
fn set_meta(set: &SetObject) -> serde_json::Value {
    json!({"metadata": {
        "ownerReferences": set.meta.owner_references,
        "annotations": set.meta.annotations,
    }})
}

/// The set's controller: from its owner references or, when its owner lives elsewhere, pko's owners
/// annotation.
fn controller_uid(set: &SetObject) -> Option<String> {
    controller_of(&set_meta(set)).map(|(uid, _, _)| uid)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pko_proto::core::common::LifecycleState;
    use pko_proto::core::object_set::ObjectSet;

    fn set(name: &str, finalizers: &[&str], available: &str, message: &str) -> SetObject {
        let set: ObjectSet = serde_json::from_value(json!({
            "apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSet",
            "metadata": {"name": name, "namespace": "n", "generation": 1, "uid": format!("uid-{name}"),
                "labels": {DEPLOYMENT_LABEL: "od"},
                "finalizers": finalizers,
                "ownerReferences": [{"apiVersion": "package-operator.run/v1alpha1",
                    "kind": "ObjectDeployment", "name": "od", "uid": "od-uid", "controller": true}]},
            "spec": {"lifecycleState": "Active", "phases": [{"name": "p", "objects": []}]},
            "status": {"revision": 1, "conditions": [
                {"type": "Available", "status": available, "reason": "R", "message": "m",
                 "observedGeneration": 1, "lastTransitionTime": "2026-11-25T00:00:00Z"},
                {"type": "InTransition", "status": "True", "reason": "R", "message": message,
                 "observedGeneration": 1, "lastTransitionTime": "2026-11-25T00:00:00Z"}]}
        }))
        .unwrap();
        set.into()
    }

    fn read(index: &RevisionIndex, uid: &str, known: &[&str]) -> Option<Vec<RevisionView>> {
        index.revisions(SetKind::Namespaced, "n", "od", uid, known)
    }

    #[test]
    fn a_set_event_counts_only_when_the_deployment_reads_a_change() {
        let index = RevisionIndex::default();
        assert_eq!(
            index.observe(&set("od-a", &[], "True", "one"), false),
            IndexChange::Changed
        );
        assert_eq!(
            index.observe(
                &set("od-a", &["package-operator.run/teardown"], "True", "two"),
                false
            ),
            IndexChange::Unchanged,
            "a finalizer and a condition the deployment does not read change nothing for it"
        );
        assert_eq!(
            index.observe(&set("od-a", &[], "False", "two"), false),
            IndexChange::Changed
        );
        let mut archived = set("od-a", &[], "False", "two");
        archived.spec.lifecycle_state = LifecycleState::Archived;
        assert_eq!(index.observe(&archived, false), IndexChange::Changed);
        let mut respecified = archived.clone();
        respecified.meta.generation = Some(2);
        assert_eq!(index.observe(&respecified, false), IndexChange::Changed);
        assert_eq!(index.observe(&respecified, true), IndexChange::Changed);
        assert_eq!(
            read(&index, "od-uid", &[]),
            None,
            "a deleted set is forgotten"
        );
    }

    #[test]
    fn a_successor_reads_its_previous_revision_while_the_watch_holds_it() {
        let index = RevisionIndex::default();
        let previous = |name: &str| index.previous(SetKind::Namespaced, "n", name);
        assert_eq!(
            previous("od-a"),
            None,
            "not delivered yet: ask the apiserver"
        );
        let a = set("od-a", &[], "True", "m");
        index.observe(&a, false);
        assert_eq!(
            previous("od-a"),
            Some(PreviousRevision {
                uid: Some("uid-od-a".to_owned()),
                status_revision: 1
            })
        );
        assert_eq!(index.previous(SetKind::Cluster, "n", "od-a"), None);
        let mut unlabelled = a.clone();
        unlabelled.meta.labels = None;
        index.observe(&unlabelled, false);
        assert_eq!(previous("od-a"), None, "no longer filed under a deployment");
        index.observe(&a, false);
        index.observe(&a, true);
        assert_eq!(previous("od-a"), None, "deleted");
    }

    #[test]
    fn the_index_answers_only_when_it_holds_every_set_the_deployment_knows() {
        let index = RevisionIndex::default();
        index.observe(&set("od-a", &[], "True", "m"), false);
        assert_eq!(
            read(&index, "od-uid", &["od-a", "od-b"]),
            None,
            "od-b not seen yet"
        );
        let views = read(&index, "od-uid", &["od-a"]).unwrap();
        assert_eq!(views.len(), 1);
        assert!(views[0].ours && views[0].available);
        let theirs = read(&index, "other-uid", &["od-a"]).unwrap();
        assert!(
            !theirs[0].ours,
            "`ours` is the reader's controller, not the label's"
        );
        assert_eq!(
            views[0].content,
            RevisionContent::of(&set("od-a", &[], "True", "m").spec.template)
        );
    }

    #[test]
    fn a_relabelled_set_moves_to_its_new_deployment() {
        let index = RevisionIndex::default();
        let mut moved = set("od-a", &[], "True", "m");
        index.observe(&moved, false);
        moved
            .meta
            .labels
            .as_mut()
            .unwrap()
            .insert(DEPLOYMENT_LABEL.to_owned(), "other".to_owned());
        assert_eq!(index.observe(&moved, false), IndexChange::Changed);
        assert_eq!(read(&index, "od-uid", &[]), None);
        let under_other = index.revisions(SetKind::Namespaced, "n", "other", "od-uid", &["od-a"]);
        assert_eq!(under_other.map(|v| v.len()), Some(1));
    }
}

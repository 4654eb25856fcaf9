//! What one watch feed (`kind_feed.rs`) has routed, by key: each object's UID, the watch that saw it last and (when a tap
//! follows the kind) its state, and what each re-listing watch listed so far, so that a re-list tells
//! which objects went while the watch was down and which name came back as a new object.

use std::collections::{HashMap, HashSet};

use crate::engine::sharding::shard_assignment::Member;
use crate::runtime::registry::ObjectRef;

/// Which watch of a feed saw an object: the one on this replica's label (on every object unsharded or
/// gated), or one on a departed member's label for as long as this replica takes over from it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WatchSource {
    Own,
    Departed(Member),
}

/// The last sighting of an object: its UID, the watch that saw it and, when a tap follows the kind, its
/// state (a deletion found by a re-list has no event to hand the tap).
pub struct Sighting<O> {
    pub uid: String,
    pub source: WatchSource,
    pub state: Option<O>,
}

/// What one feed has routed, by key.
pub struct KnownObjects<O> {
    objects: HashMap<ObjectRef, Sighting<O>>,
    keep_state: bool,
    /// For each watch re-listing now, the keys it listed so far.
    relisting: HashMap<WatchSource, HashSet<ObjectRef>>,
}

impl<O: Clone> KnownObjects<O> {
    pub fn new(keep_state: bool) -> Self {
        Self {
            objects: HashMap::new(),
            keep_state,
            relisting: HashMap::new(),
        }
    }

    /// Records a sighting by `source`. Returns the former incarnation when `key` held an object of another
    /// UID (it was deleted and created again while the watch looked away): `Some(None)` when no state was
    /// kept.
    pub fn seen(
        &mut self,
        key: &ObjectRef,
        uid: &str,
        source: &WatchSource,
        state: impl FnOnce() -> O,
    ) -> Option<Option<O>> {
        if let Some(listed) = self.relisting.get_mut(source) {
            listed.insert(key.clone());
        }
        // Made only for feeds whose taps need it: this runs on every watch event.
        let sighting = Sighting {
            uid: uid.to_owned(),
            source: source.clone(),
            state: self.keep_state.then(state),
        };
        match self.objects.insert(key.clone(), sighting) {
            Some(former) if former.uid != uid => Some(former.state),
            _ => None,
        }
    }

    pub fn sighting(&self, key: &ObjectRef) -> Option<&Sighting<O>> {
        self.objects.get(key)
    }

    /// The object under `key` is now followed by `source`'s watch.
    pub fn moved(&mut self, key: &ObjectRef, source: WatchSource) {
        if let Some(sighting) = self.objects.get_mut(key) {
            sighting.source = source;
        }
    }

    /// `from`'s watch ends: the own watch's next re-list answers for what it saw.
    pub fn hand_to_own(&mut self, from: &WatchSource) {
        self.relisting.remove(from);
        for sighting in self.objects.values_mut() {
            if sighting.source == *from {
                sighting.source = WatchSource::Own;
            }
        }
    }

    pub fn deleted(&mut self, key: &ObjectRef) {
        self.objects.remove(key);
    }

    pub fn relist_started(&mut self, source: &WatchSource) {
        self.relisting.insert(source.clone(), HashSet::new());
    }

    /// Ends `source`'s re-list: the objects it saw before and did not list now, forgotten, with their
    /// last state if kept.
    pub fn relist_done(&mut self, source: &WatchSource) -> Vec<(ObjectRef, Option<O>)> {
        self.unlisted(source)
            .into_iter()
            .filter_map(|key| {
                let sighting = self.objects.remove(&key)?;
                Some((key, sighting.state))
            })
            .collect()
    }

    /// Ends `source`'s re-list like [`relist_done`](Self::relist_done) but keeps the sightings of the
    /// objects it did not list: their UID and last state, for a read to tell what became of them.
    pub fn relist_done_unsure(
        &mut self,
        source: &WatchSource,
    ) -> Vec<(ObjectRef, String, Option<O>)> {
        self.unlisted(source)
            .into_iter()
            .filter_map(|key| {
                let sighting = self.objects.get(&key)?;
                Some((key, sighting.uid.clone(), sighting.state.clone()))
            })
            .collect()
    }

    /// The objects `source` saw before its re-list and did not list now; the re-list ends.
    fn unlisted(&mut self, source: &WatchSource) -> Vec<ObjectRef> {
        let Some(listed) = self.relisting.remove(source) else {
            return Vec::new();
        };
        self.objects
            .iter()
            .filter(|(key, sighting)| sighting.source == *source && !listed.contains(*key))
            .map(|(key, _)| key.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectRef {
        ObjectRef {
            kind: "HostedCluster",
            namespace: "clusters".to_owned(),
            name: name.to_owned(),
        }
    }

    const OWN: WatchSource = WatchSource::Own;

    #[test]
    fn a_relist_reports_exactly_the_objects_it_did_not_list() {
        let mut known = KnownObjects::new(true);
        known.seen(&key("a"), "uid-a", &OWN, || "a1");
        known.seen(&key("b"), "uid-b", &OWN, || "b1");
        known.seen(&key("c"), "uid-c", &OWN, || "c1");
        known.deleted(&key("c"));
        known.relist_started(&OWN);
        assert_eq!(known.seen(&key("a"), "uid-a", &OWN, || "a2"), None);
        assert_eq!(known.relist_done(&OWN), vec![(key("b"), Some("b1"))]);
        // Outside a re-list nothing vanishes, and b is forgotten.
        assert!(known.relist_done(&OWN).is_empty());
        known.relist_started(&OWN);
        assert!(known.relist_done(&OWN) == vec![(key("a"), Some("a2"))]);
    }

    #[test]
    fn a_new_uid_under_a_known_name_is_a_replacement() {
        let mut known = KnownObjects::new(false);
        assert_eq!(known.seen(&key("a"), "uid-1", &OWN, || ()), None);
        assert_eq!(known.seen(&key("a"), "uid-1", &OWN, || ()), None);
        assert_eq!(known.seen(&key("a"), "uid-2", &OWN, || ()), Some(None));
        assert_eq!(known.seen(&key("a"), "uid-2", &OWN, || ()), None);
        let mut kept = KnownObjects::new(true);
        kept.seen(&key("a"), "uid-1", &OWN, || "old");
        assert_eq!(
            kept.seen(&key("a"), "uid-2", &OWN, || "new"),
            Some(Some("old"))
        );
    }

    #[test]
    fn a_watch_relists_only_for_what_it_saw_last() {
        let departed = WatchSource::Departed("b-1".to_owned());
        let mut known = KnownObjects::new(false);
        known.seen(&key("own"), "uid-own", &OWN, || ());
        known.seen(&key("taken"), "uid-taken", &departed, || ());
        known.seen(&key("moved"), "uid-moved", &departed, || ());
        // Relabelled for this replica: its own watch saw it after the departed member's.
        known.seen(&key("moved"), "uid-moved", &OWN, || ());
        // The departed member's watch lists again and finds nothing: only what it saw last is gone.
        known.relist_started(&departed);
        assert_eq!(known.relist_done(&departed), vec![(key("taken"), None)]);
        // The own watch listing meanwhile does not answer for the departed member's objects.
        known.seen(&key("taken"), "uid-taken", &departed, || ());
        known.relist_started(&OWN);
        known.seen(&key("own"), "uid-own", &OWN, || ());
        assert_eq!(known.relist_done(&OWN), vec![(key("moved"), None)]);
        assert!(known.sighting(&key("taken")).is_some());
        // When its watch ends the own watch answers for it.
        known.hand_to_own(&departed);
        known.relist_started(&OWN);
        known.seen(&key("own"), "uid-own", &OWN, || ());
        assert_eq!(known.relist_done(&OWN), vec![(key("taken"), None)]);
    }
}

//! Which of two observations of one object is newer, by resourceVersion, and a view that keeps the
//! newest observation of each object whichever path it came by.
//!
//! A write's response and a watch's events reach an actor by different paths, in either order: a
//! response can arrive after the watch already showed a later state of the object (its status moved
//! on), and a watch event can arrive after a response that is newer than it (the watch lags the write).
//! Taking the older one in either case puts an older object over a newer one, and no further event
//! comes to correct it soon. A rollout that plans on such a view can count a Package it already took
//! down as live, and take down one more than its budget allows. An etcd-backed apiserver's
//! resourceVersion is etcd's revision, which grows with every write; a version that does not read as
//! such an integer is never called newer, so the watch stays the authority.

use std::collections::BTreeMap;
use std::sync::Arc;

/// Whether `candidate` is known to be newer than `held` (`None`: nothing held yet).
pub fn is_newer(candidate: Option<&str>, held: Option<&str>) -> bool {
    let Some(candidate) = candidate.and_then(|v| v.parse::<u64>().ok()) else {
        return false;
    };
    match held {
        None => true,
        Some(held) => held.parse::<u64>().is_ok_and(|held| candidate > held),
    }
}

/// The newest observation of each object by key: from a watch (its lists and events) and from the
/// answers of writes. A watch event or list entry is taken unless what is held is known to be newer; a
/// write's answer only when it is known to be newer than what is held. `None` until the first list is
/// complete.
#[derive(Debug, Clone)]
pub struct NewestSeen<T> {
    objects: Option<BTreeMap<String, Arc<T>>>,
    /// The version each entry of `objects` was read at.
    versions: BTreeMap<String, String>,
    /// The list under way, with its versions: it replaces `objects` once complete.
    listing: BTreeMap<String, (Arc<T>, Option<String>)>,
}

impl<T> Default for NewestSeen<T> {
    fn default() -> Self {
        Self {
            objects: None,
            versions: BTreeMap::new(),
            listing: BTreeMap::new(),
        }
    }
}

impl<T: PartialEq> NewestSeen<T> {
    /// Every object, once a list was complete.
    pub fn objects(&self) -> Option<&BTreeMap<String, Arc<T>>> {
        self.objects.as_ref()
    }

    /// The version `key` was read at.
    pub fn version(&self, key: &str) -> Option<&str> {
        self.versions.get(key).map(String::as_str)
    }

    /// A (re-)list starts: what it finds replaces what is known once it is complete.
    pub fn list_started(&mut self) {
        self.listing.clear();
    }

    pub fn listed(&mut self, key: String, object: Arc<T>, version: Option<String>) {
        self.listing.insert(key, (object, version));
    }

    /// The list is complete: objects it did not find are gone; one held at a newer version than the
    /// list found (a write's answer the list did not see yet) stays. Whether anything changed.
    pub fn list_done(&mut self) -> bool {
        let listing = std::mem::take(&mut self.listing);
        let mut objects = BTreeMap::new();
        let mut versions = BTreeMap::new();
        for (key, (listed, listed_version)) in listing {
            let held = self.version(&key).map(str::to_owned);
            let kept = match self.objects.as_ref().and_then(|o| o.get(&key)) {
                Some(current) if is_newer(held.as_deref(), listed_version.as_deref()) => {
                    (current.clone(), held)
                }
                _ => (listed, listed_version),
            };
            if let Some(version) = kept.1 {
                versions.insert(key.clone(), version);
            }
            objects.insert(key, kept.0);
        }
        self.versions = versions;
        let changed = self.objects.as_ref() != Some(&objects);
        self.objects = Some(objects);
        changed
    }

    /// A watch event: taken unless what is held is newer. Whether the view changed.
    pub fn watched(&mut self, key: String, object: Arc<T>, version: Option<String>) -> bool {
        if is_newer(self.version(&key), version.as_deref()) {
            return false;
        }
        self.take(key, object, version)
    }

    /// A write's answer: taken only when newer than what is held. Whether the view changed.
    pub fn written(&mut self, key: String, object: Arc<T>, version: Option<String>) -> bool {
        if !is_newer(version.as_deref(), self.version(&key)) {
            return false;
        }
        self.take(key, object, version)
    }

    /// A watch's deletion at `version`: taken unless what is held is newer (written again since).
    /// Whether the view changed.
    pub fn deleted(&mut self, key: &str, version: Option<&str>) -> bool {
        if is_newer(self.version(key), version) {
            return false;
        }
        self.versions.remove(key);
        self.objects
            .as_mut()
            .is_some_and(|objects| objects.remove(key).is_some())
    }

    fn take(&mut self, key: String, object: Arc<T>, version: Option<String>) -> bool {
        match version {
            Some(version) => self.versions.insert(key.clone(), version),
            None => self.versions.remove(&key),
        };
        let Some(objects) = self.objects.as_mut() else {
            return false;
        };
        if objects.get(&key) == Some(&object) {
            return false;
        }
        objects.insert(key, object);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_older_than_the_watch_does_not_replace_it() {
        assert!(!is_newer(Some("41"), Some("42")));
        assert!(!is_newer(Some("42"), Some("42")), "the echo itself");
        assert!(is_newer(Some("43"), Some("42")));
        assert!(
            is_newer(Some("100"), Some("99")),
            "numerically, not by text"
        );
        assert!(is_newer(Some("7"), None), "nothing watched yet");
    }

    #[test]
    fn versions_that_are_not_integers_leave_the_watch_in_charge() {
        assert!(!is_newer(None, None));
        assert!(!is_newer(Some("abc"), None));
        assert!(!is_newer(Some("43"), Some("x")));
        let mut view = listed(&[("a", "old", "x")]);
        assert!(!view.written("a".into(), o("response"), Some("5".into())));
        assert!(view.watched("a".into(), o("event"), Some("y".into())));
        assert_eq!(state(&view, "a"), "event");
    }

    fn o(s: &str) -> Arc<String> {
        Arc::new(s.to_owned())
    }

    fn listed(entries: &[(&str, &str, &str)]) -> NewestSeen<String> {
        let mut view = NewestSeen::default();
        view.list_started();
        for (key, object, version) in entries {
            view.listed((*key).to_owned(), o(object), Some((*version).to_owned()));
        }
        view.list_done();
        view
    }

    fn state<'a>(view: &'a NewestSeen<String>, key: &str) -> &'a str {
        view.objects()
            .and_then(|o| o.get(key))
            .map_or("-", |s| s.as_str())
    }

    /// Found in CI (a rollback took a third Package down under a budget of 2): the supervisor took its
    /// write's answer (rv 150: updated, not live), then the watch delivered the Package's status from
    /// before the write (rv 140: live on the old spec). The view went back to "live", and the planner
    /// spent the slot again.
    #[test]
    fn a_watch_event_older_than_a_taken_response_does_not_replace_it() {
        let mut view = listed(&[("ns", "in flight", "130")]);
        assert!(view.written("ns".into(), o("written"), Some("150".into())));
        assert!(!view.watched("ns".into(), o("live before"), Some("140".into())));
        assert_eq!(state(&view, "ns"), "written");
        assert_eq!(view.version("ns"), Some("150"));
        assert!(
            !view.watched("ns".into(), o("written"), Some("150".into())),
            "the echo"
        );
        assert!(view.watched("ns".into(), o("live after"), Some("160".into())));
        assert_eq!(state(&view, "ns"), "live after");
    }

    #[test]
    fn a_response_is_taken_only_when_newer_than_the_watch() {
        let mut view = listed(&[("ns", "live", "160")]);
        assert!(!view.written("ns".into(), o("written"), Some("150".into())));
        assert_eq!(state(&view, "ns"), "live");
        assert!(view.written("ns".into(), o("rewritten"), Some("170".into())));
        assert_eq!(view.version("ns"), Some("170"));
    }

    #[test]
    fn a_relist_keeps_what_it_is_older_than_and_drops_what_it_did_not_find() {
        let mut view = listed(&[("a", "a1", "10"), ("b", "b1", "11")]);
        assert!(view.written("a".into(), o("a2"), Some("20".into())));
        view.list_started();
        view.listed("a".into(), o("a1"), Some("10".into()));
        view.listed("c".into(), o("c1"), Some("12".into()));
        assert!(view.list_done());
        assert_eq!(state(&view, "a"), "a2", "the answer is newer than the list");
        assert_eq!(view.version("a"), Some("20"));
        assert_eq!(state(&view, "b"), "-", "not listed: gone");
        assert_eq!(view.version("b"), None);
        assert_eq!(state(&view, "c"), "c1");
        view.list_started();
        view.listed("a".into(), o("a3"), Some("30".into()));
        view.listed("c".into(), o("c1"), Some("12".into()));
        assert!(view.list_done());
        assert_eq!(state(&view, "a"), "a3");
        view.list_started();
        view.listed("a".into(), o("a3"), Some("30".into()));
        view.listed("c".into(), o("c1"), Some("12".into()));
        assert!(!view.list_done(), "the same list changes nothing");
    }

    #[test]
    fn a_deletion_older_than_a_write_again_leaves_the_object() {
        let mut view = listed(&[("ns", "old", "10")]);
        assert!(view.written("ns".into(), o("created again"), Some("30".into())));
        assert!(!view.deleted("ns", Some("20")));
        assert_eq!(state(&view, "ns"), "created again");
        assert!(view.deleted("ns", Some("40")));
        assert_eq!(state(&view, "ns"), "-");
        assert_eq!(view.version("ns"), None);
    }

    #[test]
    fn nothing_is_known_before_the_first_list_completes() {
        let mut view: NewestSeen<String> = NewestSeen::default();
        assert!(!view.watched("a".into(), o("a"), Some("1".into())));
        assert!(view.objects().is_none());
        view.list_started();
        view.listed("a".into(), o("a"), Some("1".into()));
        assert!(view.objects().is_none(), "a partial list is no view");
        assert!(view.list_done());
        assert_eq!(state(&view, "a"), "a");
    }
}

//! Shared, label-filtered watches of the objects pko manages: one watch per kind, whatever the number of
//! owners, keeping a store of the last observed state and routing each change to the owner that controls
//! the object (by controller UID).
//!
//! Owners register a route when they start and remove it when they stop. Only objects whose controller has a
//! route are held: the label is anyone's to set, and an object held for nobody would be memory any
//! ConfigMap creator could fill. The cache never writes objects.
//!
//! resourceVersions are opaque: the cache never compares them. The watch delivers each object's states in
//! order, so a watched state always replaces the one held. pko's own apply answers overtake the watch or
//! lag behind it; an answer is taken only when the watch delivered nothing for the object since the
//! request was sent ([`WatchMark`]). A request sent after a watched state was delivered reads at least
//! that state, so nothing newer is ever replaced by something older; an answer refused that way is
//! delivered by the watch in its turn.
//!
//! An object pko deleted and saw gone is forgotten at once, but the watch may still have states of it to
//! deliver from before the deletion: those would hold it again, counted for an owner whose objects are all
//! gone, until the watch's DELETED arrives. A tombstone (the object's UID) refuses them until then.

use pko_proto::well_known::CACHE_LABEL;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Client;
use prometheus_client::metrics::counter::Counter;
use serde_json::Value;
use tracing::{debug, warn};

use crate::engine::objects::adoption::{controller_of, without_unread_field_records};
use crate::objects::applier::ResolvedKind;
use crate::runtime::initial_lists::InitialLists;

use crate::engine::objects::object_ref::ObjectKey;

type KindId = (String, String, String);

/// Objects per page of a managed-object watch's (re-)list. Each page is read whole before its objects are
/// passed over, and anyone may label objects of up to ~1.5 MiB each: a page of 500 could hold most of a
/// gigabyte for a moment.
const LIST_PAGE: u32 = 25;
/// Called with the key of a changed object controlled by the route's owner.
pub type Route = Arc<dyn Fn(ObjectKey) + Send + Sync>;

/// How far the cache's watches had got when a request was sent; see [`ObjectCache::mark`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct WatchMark(u64);

/// A state the cache holds, and the number of the watch delivery that brought it (0: an apply answer
/// taken before the watch said anything of the object).
#[derive(Debug, Clone)]
struct Held {
    state: Arc<Value>,
    delivery: u64,
    /// When this state came.
    since: Instant,
}

/// One external object's watch and the owners it tells.
struct ExternalWatch {
    owners: Vec<String>,
    /// `None` only while the watch is being started.
    task: Option<tokio::task::AbortHandle>,
}

/// A count of what [`ObjectCache`] holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheCensus {
    /// Kinds watched (one shared watch each).
    pub watches: usize,
    /// Objects per owner UID and kind.
    pub owners: BTreeMap<String, BTreeMap<String, u64>>,
    /// Watches of single external objects (each ends with the last owner reading it).
    pub external_watches: usize,
}

/// Last observed managed objects, per kind, and who to tell when they change.
#[derive(Clone)]
pub struct ObjectCache {
    client: Client,
    objects: Arc<DashMap<ObjectKey, Held>>,
    /// Numbers every watch delivery, across kinds.
    deliveries: Arc<AtomicU64>,
    watched: Arc<DashMap<KindId, ()>>,
    routes: Arc<DashMap<String, Route>>,
    /// Owners observing each external object (objects pko reads but does not label or own), and the
    /// watch that tells them; the watch ends with its last owner.
    external: Arc<DashMap<ObjectKey, ExternalWatch>>,
    /// Watched objects carrying pko's label that were not held: no owner running here controls them.
    foreign: Counter,
    /// Objects pko saw gone while holding a state of them, whose DELETED the watch has not delivered yet:
    /// the UID of the deleted object and its controller. Bounded by the objects of owners running here.
    deleted: Arc<DashMap<ObjectKey, Tombstone>>,
    initial_lists: InitialLists,
}

/// A deleted object whose earlier states the watch may still deliver.
#[derive(Debug, Clone)]
struct Tombstone {
    uid: String,
    owner: Option<String>,
}

impl ObjectCache {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            objects: Arc::default(),
            deliveries: Arc::default(),
            watched: Arc::default(),
            routes: Arc::default(),
            external: Arc::default(),
            foreign: Counter::default(),
            deleted: Arc::default(),
            initial_lists: InitialLists::default(),
        }
    }

    /// This cache, its watches starting with `lists`. A streaming list passes objects over one at a
    /// time; a paged one [`LIST_PAGE`] at a time.
    pub fn with_initial_lists(self, lists: InitialLists) -> Self {
        Self {
            initial_lists: lists,
            ..self
        }
    }

    /// Counts labelled objects the watches passed over because no owner here controls them.
    pub fn foreign_objects(&self) -> Counter {
        self.foreign.clone()
    }

    /// The last observed state, if the object carries pko's cache label and has been seen.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<Value>> {
        self.objects.get(key).map(|held| held.state.clone())
    }

    /// Taken right before a request whose answer will be [`ObjectCache::record`]ed.
    pub fn mark(&self) -> WatchMark {
        WatchMark(self.deliveries.load(Ordering::SeqCst))
    }

    /// Records a state pko itself just wrote, answering a request sent at `sent` (the watch will confirm
    /// it). If the watch delivered a state of the object since, that state stays: a no-op apply answers
    /// with the object as the apiserver read it, which can be older than a controller's status write the
    /// watch delivered meanwhile, and the owner would probe the stale state and, the watch having nothing
    /// more to say, never look again.
    pub fn record(&self, key: &ObjectKey, object: Value, sent: WatchMark) {
        // Not for a controller that is not running here, as the watch's deliveries are not: an answer
        // arriving after its owner let go (a teardown's last request) would be held, and counted, for
        // nobody.
        let unrouted =
            controller_of(&object).is_some_and(|(uid, _, _)| !self.routes.contains_key(&uid));
        if unrouted {
            return;
        }
        // Our own apply may take an object over: the revision it left must hear of it.
        let former = self.hold(key, object, Source::Answer(sent));
        self.tell(key, former);
    }

    /// Tells the owner `owner_uid` that `key` changed (an adopter telling the controller it replaced).
    pub fn notify(&self, key: &ObjectKey, owner_uid: &str) {
        self.tell(key, Some(owner_uid.to_owned()));
    }

    /// Forgets a state pko decided on that turned out stale; the next look reads the apiserver.
    pub fn forget(&self, key: &ObjectKey) {
        self.objects.remove(key);
    }

    /// Forgets an object pko saw gone from the apiserver. States of it the watch delivers before its
    /// DELETED are older than the deletion and are not held again.
    pub fn forget_deleted(&self, key: &ObjectKey) {
        let Some((_, held)) = self.objects.remove(key) else {
            // Nothing held: either the watch delivered the DELETED already, or it never delivered a
            // state of the object, and then its states come before the DELETED in order and the
            // DELETED lets go of them.
            return;
        };
        if let Some(uid) = held.state.pointer("/metadata/uid").and_then(Value::as_str) {
            let owner = controller_of(&held.state).map(|(uid, _, _)| uid);
            self.deleted.insert(
                key.clone(),
                Tombstone {
                    uid: uid.to_owned(),
                    owner,
                },
            );
        }
    }

    /// Forgets `observed` if it is still the state held for `key` and has been for `held_for`, so the
    /// next look reads the object from the apiserver. A state the watch delivered meanwhile stays: it is
    /// newer than the one judged, and an object that does not change again would otherwise never be held
    /// again.
    pub fn forget_if_unchanged_for(&self, key: &ObjectKey, observed: &Value, held_for: Duration) {
        self.objects.remove_if(key, |_, held| {
            held.since.elapsed() >= held_for && held.state.as_ref() == observed
        });
    }

    /// Sends changes of objects controlled by `owner_uid` to `route`.
    pub fn add_route(&self, owner_uid: &str, route: Route) {
        self.routes.insert(owner_uid.to_owned(), route);
    }

    /// Stops routing to `owner_uid` and lets go of what was kept for it: the objects it controls, and the
    /// watches of external objects no other owner reads.
    pub fn remove_route(&self, owner_uid: &str) {
        self.routes.remove(owner_uid);
        self.objects.retain(|_, held| {
            controller_of(&held.state).is_none_or(|(uid, _, _)| uid != owner_uid)
        });
        // With the route gone, nothing of this owner is held again: its tombstones have done their work.
        self.deleted
            .retain(|_, tomb| tomb.owner.as_deref() != Some(owner_uid));
        self.release_external(owner_uid, |_| false);
    }

    /// `owner_uid` reads only `reading` of the external objects now (an ObjectTemplate whose sources
    /// changed): it leaves the others' watches, which end if it was their last reader.
    pub fn read_external_only(&self, owner_uid: &str, reading: &HashSet<ObjectKey>) {
        self.release_external(owner_uid, |key| reading.contains(key));
    }

    /// Removes `owner_uid` from the readers of every external object `keep` does not keep, ending the
    /// watches left without a reader.
    fn release_external(&self, owner_uid: &str, keep: impl Fn(&ObjectKey) -> bool) {
        self.external.retain(|key, watch| {
            if keep(key) {
                return true;
            }
            watch.owners.retain(|o| o != owner_uid);
            if watch.owners.is_empty() {
                if let Some(task) = &watch.task {
                    task.abort();
                }
                return false;
            }
            true
        });
    }

    /// What the cache holds now: the kinds it watches, and per controlling owner (UID; objects without a
    /// controller under `""`) the objects per kind (`group/version, Kind=Kind`, as Go prints a GVK).
    pub fn census(&self) -> CacheCensus {
        let mut owners: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for held in self.objects.iter() {
            let key = held.key();
            let owner = controller_of(&held.value().state)
                .map(|(uid, _, _)| uid)
                .unwrap_or_default();
            let gvk = format!("{}/{}, Kind={}", key.group, key.version, key.kind);
            *owners.entry(owner).or_default().entry(gvk).or_default() += 1;
        }
        CacheCensus {
            watches: self.watched.len(),
            owners,
            external_watches: self.external.len(),
        }
    }

    /// Starts the shared watch for a kind unless it runs already.
    pub fn ensure_watch(&self, key: &ObjectKey, kind: &ResolvedKind) {
        let id = (key.group.clone(), key.version.clone(), key.kind.clone());
        if self.watched.insert(id.clone(), ()).is_some() {
            return;
        }
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &kind.resource);
        let config = self
            .initial_lists
            .config()
            .labels(&format!("{CACHE_LABEL}=True"))
            .page_size(LIST_PAGE);
        let cache = self.clone();
        tokio::spawn(async move {
            debug!(kind = %id.2, "starting managed-object watch");
            let mut stream = watcher::watcher(api, config).default_backoff().boxed();
            let mut listed: HashSet<ObjectKey> = HashSet::new();
            while let Some(event) = stream.next().await {
                match event {
                    Ok(Event::Apply(o)) | Ok(Event::InitApply(o)) => {
                        if let Some(key) = cache.observe(&id, o, false) {
                            listed.insert(key);
                        }
                    }
                    Ok(Event::Delete(o)) => {
                        cache.observe(&id, o, true);
                    }
                    Ok(Event::Init) => {
                        listed.clear();
                        // A re-list delivers only objects that exist: no state from before a deletion.
                        cache.forget_tombstones_of(&id);
                    }
                    Ok(Event::InitDone) => cache.drop_unlisted(&id, &listed),
                    Err(e) => {
                        warn!(kind = %id.2, error = %e, "managed-object watch error; retrying")
                    }
                }
            }
        });
    }

    /// Tells `owner_uid` about every change of an external object. One watch per object (by field
    /// selector), since such objects carry no label to share a watch on; they are read with GETs, not
    /// cached.
    pub fn watch_external(&self, key: &ObjectKey, kind: &ResolvedKind, owner_uid: &str) {
        let mut first = false;
        {
            let mut watch = self.external.entry(key.clone()).or_insert_with(|| {
                first = true;
                ExternalWatch {
                    owners: Vec::new(),
                    task: None,
                }
            });
            if !watch.owners.iter().any(|o| o == owner_uid) {
                watch.owners.push(owner_uid.to_owned());
            }
        }
        if !first {
            return;
        }
        let api: Api<DynamicObject> = if kind.namespaced {
            Api::namespaced_with(self.client.clone(), &key.namespace, &kind.resource)
        } else {
            Api::all_with(self.client.clone(), &kind.resource)
        };
        let config = watcher::Config::default().fields(&format!("metadata.name={}", key.name));
        let cache = self.clone();
        let watched = key.clone();
        let task = tokio::spawn(async move {
            let key = watched;
            let mut stream = watcher::watcher(api, config).default_backoff().boxed();
            while let Some(event) = stream.next().await {
                match event {
                    Ok(Event::Apply(_)) | Ok(Event::Delete(_)) | Ok(Event::InitDone) => {
                        let owners = cache
                            .external
                            .get(&key)
                            .map(|w| w.owners.clone())
                            .unwrap_or_default();
                        for owner in owners {
                            cache.tell(&key, Some(owner));
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        warn!(object = %key, error = %e, "external-object watch error; retrying")
                    }
                }
            }
        });
        match self.external.get_mut(key) {
            Some(mut watch) => watch.task = Some(task.abort_handle()),
            // Its last owner left while it was being started.
            None => task.abort(),
        }
    }

    fn observe(&self, id: &KindId, object: DynamicObject, deleted: bool) -> Option<ObjectKey> {
        let value = serde_json::to_value(object).ok()?;
        let mut key = ObjectKey::of(&value)?;
        key.group.clone_from(&id.0);
        key.version.clone_from(&id.1);
        let owner = controller_of(&value).map(|(uid, _, _)| uid);
        let delivery = self.deliveries.fetch_add(1, Ordering::SeqCst) + 1;
        // Anyone who may write the kind can put pko's label on an object: only objects whose controller is
        // an owner running here are held. Another's object is read when an owner needs it (adoption).
        let ours = owner
            .as_ref()
            .is_some_and(|uid| self.routes.contains_key(uid));
        let uid = value.pointer("/metadata/uid").and_then(Value::as_str);
        let buried = !deleted
            && uid.is_some_and(|uid| self.deleted.get(&key).is_some_and(|tomb| tomb.uid == uid));
        let former = if deleted {
            self.objects.remove(&key);
            self.deleted.remove(&key);
            None
        } else if buried {
            // A state from before the deletion pko saw: the owner knows the object is gone.
            return Some(key);
        } else if ours {
            self.hold(&key, value, Source::Watch(delivery))
        } else {
            // An object held for an owner of ours that another took over: that owner must hear of it.
            self.foreign.inc();
            self.objects
                .remove(&key)
                .and_then(|(_, held)| controller_of(&held.state).map(|(uid, _, _)| uid))
        };
        self.tell(&key, owner);
        // A handover moves an object to a newer revision: the revision it left must hear of it, or it
        // keeps reporting on an object it no longer controls.
        self.tell(&key, former);
        Some(key)
    }

    /// Tells the owner `uid` (if any, and if it has a route) that `key` changed.
    fn tell(&self, key: &ObjectKey, uid: Option<String>) {
        if let Some(route) = uid.and_then(|uid| self.routes.get(&uid).map(|r| r.clone())) {
            route(key.clone());
        }
    }

    /// Holds `value` unless it is an answer the watch has overtaken ([`Source`]). Check and insert under one
    /// entry lock, so a concurrent watch delivery cannot slip in between. Returns the controller the object
    /// had before, when this state names another one.
    fn hold(&self, key: &ObjectKey, value: Value, source: Source) -> Option<String> {
        let value = without_unread_field_records(value);
        let delivery = match source {
            Source::Watch(delivery) => delivery,
            Source::Answer(_) => 0,
        };
        match self.objects.entry(key.clone()) {
            dashmap::Entry::Occupied(mut known) => {
                if !source.replaces(known.get().delivery) {
                    return None;
                }
                let before = controller_of(&known.get().state).map(|(uid, _, _)| uid);
                let after = controller_of(&value).map(|(uid, _, _)| uid);
                known.insert(Held {
                    state: Arc::new(value),
                    delivery,
                    since: Instant::now(),
                });
                before.filter(|uid| after.as_ref() != Some(uid))
            }
            dashmap::Entry::Vacant(slot) => {
                slot.insert(Held {
                    state: Arc::new(value),
                    delivery,
                    since: Instant::now(),
                });
                None
            }
        }
    }

    /// Drops the tombstones of a kind whose watch starts over.
    fn forget_tombstones_of(&self, id: &KindId) {
        self.deleted.retain(|k, _| !is_of_kind(k, id));
    }

    /// After a re-list, objects of this kind not listed again were deleted while the watch was down.
    fn drop_unlisted(&self, id: &KindId, listed: &HashSet<ObjectKey>) {
        let gone: Vec<(ObjectKey, Option<String>)> = self
            .objects
            .iter()
            .filter(|e| {
                let k = e.key();
                is_of_kind(k, id) && !listed.contains(k)
            })
            .map(|e| {
                (
                    e.key().clone(),
                    controller_of(&e.value().state).map(|(uid, _, _)| uid),
                )
            })
            .collect();
        for (key, owner) in gone {
            self.objects.remove(&key);
            self.tell(&key, owner);
        }
    }
}

/// Whether `key` names an object of the watched kind `id`.
fn is_of_kind(key: &ObjectKey, id: &KindId) -> bool {
    key.group == id.0 && key.version == id.1 && key.kind == id.2
}

/// Where a state comes from.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// The watch, with the number of its delivery: always the newest the cache knows.
    Watch(u64),
    /// pko's own request, sent at this mark.
    Answer(WatchMark),
}

impl Source {
    /// Whether this state replaces one brought by watch delivery `held` (0: an answer).
    fn replaces(self, held: u64) -> bool {
        match self {
            Source::Watch(_) => true,
            Source::Answer(WatchMark(sent)) => held <= sent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(rv: &str, status: Value) -> Value {
        json!({"metadata": {"name": "x", "resourceVersion": rv}, "status": status})
    }

    fn cache() -> ObjectCache {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        ObjectCache::new(Client::try_from(config).unwrap())
    }

    fn configmap_key() -> ObjectKey {
        ObjectKey::of(&json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": "ns"}}))
        .unwrap()
    }

    fn watched(cache: &ObjectCache, key: &ObjectKey, state: Value) {
        let delivery = cache.deliveries.fetch_add(1, Ordering::SeqCst) + 1;
        cache.hold(key, state, Source::Watch(delivery));
    }

    #[tokio::test]
    async fn an_answer_the_watch_overtook_is_not_taken() {
        let cache = cache();
        let key = configmap_key();
        // Our apply goes out; meanwhile the watch delivers a controller's status write.
        let sent = cache.mark();
        watched(&cache, &key, at("655", json!({"ready": true})));
        cache.record(&key, at("653", json!({})), sent);
        assert_eq!(cache.get(&key).unwrap()["status"]["ready"], true);
        // An answer to a request sent after that delivery is newer, whatever its resourceVersion
        // looks like: versions are opaque.
        let sent = cache.mark();
        cache.record(&key, at("1000", json!({"ready": false})), sent);
        assert_eq!(cache.get(&key).unwrap()["status"]["ready"], false);
        let sent = cache.mark();
        cache.record(&key, at("999", json!({"ready": "again"})), sent);
        assert_eq!(cache.get(&key).unwrap()["status"]["ready"], "again");
        // The watch always replaces, answers included.
        watched(&cache, &key, at("2", json!({"ready": "watched"})));
        assert_eq!(cache.get(&key).unwrap()["status"]["ready"], "watched");
    }

    #[tokio::test]
    async fn forgetting_a_judged_state_keeps_a_newer_or_recent_one() {
        let cache = cache();
        let key = configmap_key();
        watched(&cache, &key, at("5", json!({"ready": false})));
        let judged = (*cache.get(&key).unwrap()).clone();
        // While the probe judged it, the watch delivered the object's next state.
        watched(&cache, &key, at("6", json!({"ready": true})));
        cache.forget_if_unchanged_for(&key, &judged, Duration::ZERO);
        assert_eq!(cache.get(&key).unwrap()["status"]["ready"], true);
        // The judged state, but held only briefly: an object on its way, kept.
        let judged = (*cache.get(&key).unwrap()).clone();
        cache.forget_if_unchanged_for(&key, &judged, Duration::from_secs(3600));
        assert!(cache.get(&key).is_some());
        // The judged state, held long enough: forgotten, the next look reads the apiserver.
        cache.forget_if_unchanged_for(&key, &judged, Duration::ZERO);
        assert!(cache.get(&key).is_none());
    }

    #[tokio::test]
    async fn only_objects_of_owners_running_here_are_held() {
        let cache = cache();
        let id: KindId = ("".into(), "v1".into(), "ConfigMap".into());
        let labelled = |name: &str, owner: &str| {
            serde_json::from_value::<DynamicObject>(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": "ns", "labels": {"package-operator.run/cache": "True"},
                    "ownerReferences": [{"apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSet",
                        "name": owner, "uid": owner, "controller": true}]},
                "data": {"big": "x".repeat(1024)}}))
            .unwrap()
        };
        let told: Arc<std::sync::Mutex<Vec<ObjectKey>>> = Arc::default();
        let sink = told.clone();
        cache.add_route("ours", Arc::new(move |key| sink.lock().unwrap().push(key)));
        let ours = cache.observe(&id, labelled("a", "ours"), false).unwrap();
        let forged = cache
            .observe(&id, labelled("b", "forged-uid"), false)
            .unwrap();
        assert!(cache.get(&ours).is_some());
        assert!(cache.get(&forged).is_none(), "nobody here controls it");
        assert_eq!(cache.census().owners.keys().collect::<Vec<_>>(), ["ours"]);
        assert_eq!(cache.foreign_objects().get(), 1);
        // Taken over by someone else: let go, and its owner hears of it.
        told.lock().unwrap().clear();
        cache.observe(&id, labelled("a", "someone-else"), false);
        assert!(cache.get(&ours).is_none());
        assert_eq!(*told.lock().unwrap(), std::slice::from_ref(&ours));
        // An owner that stops takes its objects with it.
        cache.observe(&id, labelled("a", "ours"), false);
        cache.remove_route("ours");
        assert!(cache.get(&ours).is_none());
    }

    #[tokio::test]
    async fn a_state_from_before_a_seen_deletion_is_not_held_again() {
        let cache = cache();
        let id: KindId = ("".into(), "v1".into(), "ConfigMap".into());
        let state = |uid: &str, ready: bool| {
            serde_json::from_value::<DynamicObject>(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "a", "namespace": "ns", "uid": uid,
                    "ownerReferences": [{"apiVersion": "package-operator.run/v1alpha1", "kind": "ObjectSet",
                        "name": "set", "uid": "set", "controller": true}]},
                "data": {"ready": ready.to_string()}}))
            .unwrap()
        };
        cache.add_route("set", Arc::new(|_| {}));
        let key = cache.observe(&id, state("first", false), false).unwrap();
        // Torn down: deleted and seen gone; the watch still has a status write from before to deliver.
        cache.forget_deleted(&key);
        cache.observe(&id, state("first", true), false);
        assert!(cache.get(&key).is_none(), "a state older than the deletion");
        assert!(cache.census().owners.is_empty());
        assert_eq!(cache.foreign_objects().get(), 0);
        // The DELETED ends the tombstone: the object made again (a new UID) is held.
        cache.observe(&id, state("first", true), true);
        assert!(cache.deleted.is_empty());
        cache.observe(&id, state("second", false), false);
        assert_eq!(cache.get(&key).unwrap()["data"]["ready"], "false");
        // Forgotten with the DELETED delivered already: nothing held, so no tombstone to outlive it.
        cache.observe(&id, state("second", false), true);
        cache.forget_deleted(&key);
        assert!(cache.deleted.is_empty());
        // A tombstone whose DELETED never comes goes with its owner's route.
        cache.observe(&id, state("third", false), false);
        cache.forget_deleted(&key);
        assert_eq!(cache.deleted.len(), 1);
        cache.remove_route("set");
        assert!(cache.deleted.is_empty());
        // An answer arriving after the owner let go is held for nobody.
        let late = serde_json::to_value(state("late", false)).unwrap();
        cache.record(&key, late, cache.mark());
        assert!(cache.get(&key).is_none(), "held after its owner let go");
    }

    #[tokio::test]
    async fn an_external_watch_ends_with_its_last_reader() {
        let cache = cache();
        let kind = ResolvedKind {
            resource: kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            namespaced: true,
        };
        let a = configmap_key();
        let b = ObjectKey {
            name: "y".into(),
            ..configmap_key()
        };
        cache.watch_external(&a, &kind, "template-1");
        cache.watch_external(&b, &kind, "template-1");
        cache.watch_external(&a, &kind, "template-2");
        assert_eq!(cache.census().external_watches, 2);
        // Template 1 no longer names b: its watch ends; a is still read by both.
        cache.read_external_only("template-1", &HashSet::from([a.clone()]));
        assert_eq!(cache.census().external_watches, 1);
        cache.remove_route("template-1");
        assert_eq!(
            cache.census().external_watches,
            1,
            "template 2 still reads a"
        );
        cache.remove_route("template-2");
        assert_eq!(cache.census().external_watches, 0);
    }

    #[tokio::test]
    async fn a_handover_tells_the_revision_the_object_left() {
        let cache = cache();
        let told: Arc<std::sync::Mutex<Vec<&str>>> = Arc::default();
        for uid in ["rev-1", "rev-2"] {
            let told = told.clone();
            cache.add_route(uid, Arc::new(move |_| told.lock().unwrap().push(uid)));
        }
        let key = configmap_key();
        let controlled_by = |uid: &str, rv: &str| {
            json!({"metadata": {"name": "x", "resourceVersion": rv,
                "ownerReferences": [{"uid": uid, "kind": "ObjectSet", "name": uid, "controller": true}]}})
        };
        cache.record(&key, controlled_by("rev-1", "10"), cache.mark());
        cache.record(&key, controlled_by("rev-1", "11"), cache.mark());
        assert!(
            told.lock().unwrap().is_empty(),
            "same controller: nobody to tell"
        );
        // Revision 2's apply took it over: revision 1 hears of it; revision 2 wrote it and needs no call.
        let sent = cache.mark();
        cache.record(&key, controlled_by("rev-2", "12"), sent);
        assert_eq!(*told.lock().unwrap(), ["rev-1"]);
        // The watch confirms it; an answer to a request sent before that changes nothing, tells nobody.
        watched(&cache, &key, controlled_by("rev-2", "12"));
        cache.record(&key, controlled_by("rev-1", "11"), sent);
        assert_eq!(*told.lock().unwrap(), ["rev-1"]);
    }
}

//! Watch feeds for the package-operator kinds: one watch per kind for the whole manager, routing each event
//! to the actor that owns the object (started on first sight, told when the object is gone).
//!
//! A watch that was down long enough re-lists instead of replaying events: an object deleted meanwhile
//! sends no delete event, and one deleted and created again under its name shows up as an update. The
//! feed keeps what it routed (key and UID) so it can tell both: after a re-list every object missing from
//! it is gone, and an object with a new UID is a new object whose predecessor is gone.
//!
//! Sharded, a feed works on the objects the engine's `works_on` gives this replica under the current
//! [`ShardView`]: those labelled for it, and those of departed members it takes over. Its watch selects
//! both labels; when the take-overs change, the watch starts again with the new selection.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix::dev::ToEnvelope;
use actix::prelude::*;
use futures::StreamExt;
use kube::runtime::watcher::{self, Event, ListSemantic};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use pko_proto::well_known::{SHARD_DRAIN_LABEL, SHARD_OWNER_LABEL};
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use crate::engine::shard_assignment::{drained, works_on, Member, Placement, ShardKey, ShardView};

use crate::runtime::context::ManagerContext;
use crate::runtime::registry::{ObjectRef, Registry};

/// The latest state of an object, from its watch.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Observed<T>(pub T);

/// The object was deleted; its actor stops.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Gone;

/// The object moves to another replica (sharded mode): the actor stops without cleaning anything up,
/// once its running work is done, and then answers through the sender.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Release(pub tokio::sync::oneshot::Sender<()>);

/// Whether this replica works on an object (always, unless sharded).
enum ShardState {
    Ours,
    /// Labelled for another replica, or not yet labelled; `drained` when it was ours and the coordinator
    /// asked us to let it go.
    NotOurs {
        drained: bool,
    },
}

/// An actor that owns one object of a watched kind.
pub trait FeedTarget:
    Actor<Context = Context<Self>> + Handler<Observed<Self::Object>> + Handler<Gone> + Handler<Release>
{
    /// The engine's view of the object (both the namespaced and the Cluster kind map to it).
    type Object: Send + 'static;
    fn start_for(context: &ManagerContext) -> Addr<Self>;
    /// Whether this manager reconciles the object at all.
    fn wants(_object: &Self::Object) -> bool {
        true
    }
    fn key(object: &Self::Object) -> ObjectRef;
    /// What the feed keeps of an object to hand its tap when a re-list finds it deleted: what taps read
    /// (metadata), not the whole object, which can be large.
    fn tombstone(object: &Self::Object) -> Self::Object;
}

/// A kind a feed can watch.
pub trait WatchedKind:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + Unpin + 'static
{
}

impl<K> WatchedKind for K where
    K: Resource<DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + Unpin
        + 'static
{
}

/// Called for every observed object before it is routed, with whether it was deleted (lets other actors
/// follow a kind).
pub type Tap<T> = Arc<dyn Fn(&T, bool) + Send + Sync>;

/// What one feed has routed, by key: the UID it last saw there and, when a tap follows the kind, the last
/// state (a deletion found by a re-list has no event to hand the tap).
struct KnownObjects<O> {
    objects: HashMap<ObjectRef, (String, Option<O>)>,
    keep_state: bool,
    /// The keys listed since the current re-list began; `None` outside a re-list.
    relisted: Option<HashSet<ObjectRef>>,
}

impl<O: Clone> KnownObjects<O> {
    fn new(keep_state: bool) -> Self {
        Self {
            objects: HashMap::new(),
            keep_state,
            relisted: None,
        }
    }

    /// Records a sighting. Returns the former incarnation when `key` held an object of another UID (it
    /// was deleted and created again while the watch looked away): `Some(None)` when no state was kept.
    fn seen(&mut self, key: &ObjectRef, uid: &str, state: impl FnOnce() -> O) -> Option<Option<O>> {
        if let Some(relisted) = &mut self.relisted {
            relisted.insert(key.clone());
        }
        // Made only for feeds whose taps need it: this runs on every watch event.
        let state = self.keep_state.then(state);
        match self.objects.insert(key.clone(), (uid.to_owned(), state)) {
            Some((former_uid, former)) if former_uid != uid => Some(former),
            _ => None,
        }
    }

    fn deleted(&mut self, key: &ObjectRef) {
        self.objects.remove(key);
    }

    fn relist_started(&mut self) {
        self.relisted = Some(HashSet::new());
    }

    /// Ends a re-list: the objects it did not list, forgotten, with their last state if kept.
    fn relist_done(&mut self) -> Vec<(ObjectRef, Option<O>)> {
        let Some(listed) = self.relisted.take() else {
            return Vec::new();
        };
        let vanished: Vec<ObjectRef> = self
            .objects
            .keys()
            .filter(|key| !listed.contains(*key))
            .cloned()
            .collect();
        vanished
            .into_iter()
            .filter_map(|key| {
                let (_, state) = self.objects.remove(&key)?;
                Some((key, state))
            })
            .collect()
    }
}

/// Whether every feed of the manager has listed its kind once: until then its actors have not seen
/// everything, and the manager does not call itself ready.
#[derive(Debug, Clone, Default)]
pub struct FeedSync {
    feeds: Arc<AtomicUsize>,
    synced: Arc<AtomicUsize>,
}

impl FeedSync {
    /// Feeds created, and feeds that finished their first list.
    pub fn progress(&self) -> (usize, usize) {
        (
            self.feeds.load(Ordering::SeqCst),
            self.synced.load(Ordering::SeqCst),
        )
    }

    /// Whether at least one feed runs and every feed listed once.
    pub fn all_synced(&self) -> bool {
        let (feeds, synced) = self.progress();
        feeds > 0 && synced >= feeds
    }
}

/// Feeds one kind `K` into the actors of type `A`.
pub struct KindFeed<K, A: FeedTarget> {
    context: ManagerContext,
    registry: Arc<Registry<A>>,
    tap: Option<Tap<A::Object>>,
    known: KnownObjects<A::Object>,
    /// Whether the first list finished (counted once in [`FeedSync`]).
    synced: bool,
    /// Sharded: watch every object (the taps need them all) and start actors only for this replica's;
    /// otherwise a sharded feed watches only the objects labelled for this replica.
    gated: bool,
    /// Objects this replica let go of whose departure from its label-selected watch is still to come (a
    /// delete event that is not a deletion).
    released: HashSet<ObjectRef>,
    /// The members as this replica sees them (sharded); the running watch selects the objects of the
    /// departed members taken over in it besides this replica's.
    view: ShardView,
    /// The running watch.
    watching: Option<SpawnHandle>,
    /// When the running watch was restarted, until its list is done.
    restarted_at: Option<std::time::Instant>,
    /// The objects this replica works on (sharded; counted in `pko_shard_objects`).
    working: HashSet<ObjectRef>,
    _kind: std::marker::PhantomData<K>,
}

/// The members changed (sharded).
#[derive(Message)]
#[rtype(result = "()")]
struct ViewChanged(ShardView);

impl<K, A> KindFeed<K, A>
where
    A: FeedTarget,
    A::Object: From<K> + Clone + Unpin,
    K: WatchedKind,
    A::Context: ToEnvelope<A, Observed<A::Object>> + ToEnvelope<A, Gone>,
{
    pub fn new(
        context: ManagerContext,
        registry: Arc<Registry<A>>,
        tap: Option<Tap<A::Object>>,
    ) -> Self {
        let known = KnownObjects::new(tap.is_some());
        context.feeds.feeds.fetch_add(1, Ordering::SeqCst);
        Self {
            context,
            registry,
            tap,
            known,
            synced: false,
            gated: false,
            released: HashSet::new(),
            view: ShardView::default(),
            watching: None,
            restarted_at: None,
            working: HashSet::new(),
            _kind: std::marker::PhantomData,
        }
    }

    /// Sharded, this feed watches every object (its tap follows them all) and starts actors only for the
    /// objects labelled for this replica.
    pub fn gated(mut self) -> Self {
        self.gated = true;
        self
    }

    /// Objects the feed's owner already knows of (read by a LIST before the feed starts): the watch's first
    /// list then tells which of them went in between.
    pub fn knowing(mut self, objects: Vec<K>) -> Self {
        for object in objects {
            let uid = object.meta().uid.clone().unwrap_or_default();
            let object = A::Object::from(object);
            self.known
                .seen(&A::key(&object), &uid, || A::tombstone(&object));
        }
        self
    }

    fn route(&mut self, object: K, deleted: bool) {
        let uid = object.meta().uid.clone().unwrap_or_default();
        let shard = self.shard_of(object.meta());
        let (name, namespace) = (object.meta().name.clone(), object.meta().namespace.clone());
        let object = A::Object::from(object);
        let key = A::key(&object);
        if deleted {
            if self.released.remove(&key) {
                // It left this replica's watch when we let it go; its new owner has it.
                return;
            }
            self.known.deleted(&key);
            self.deliver_gone(&key, Some(&object));
            return;
        }
        if let ShardState::NotOurs { drained } = shard {
            if self.gated {
                self.known.seen(&key, &uid, || A::tombstone(&object));
                if let Some(tap) = &self.tap {
                    tap(&object, false);
                }
            } else {
                self.known.deleted(&key);
                self.released.insert(key.clone());
            }
            let actor = self.registry.remove(&key);
            self.stop_working(&key);
            if actor.is_some() || (drained && A::wants(&object)) {
                self.release(
                    actor,
                    key.kind,
                    name.unwrap_or_default(),
                    namespace,
                    drained,
                );
            }
            return;
        }
        if let Some(former) = self.known.seen(&key, &uid, || A::tombstone(&object)) {
            info!(kind = %K::kind(&()), object = ?key, "object replaced by a new one of the same name");
            self.deliver_gone(&key, Some(former.as_ref().unwrap_or(&object)));
        }
        if let Some(tap) = &self.tap {
            tap(&object, false);
        }
        if !A::wants(&object) {
            return;
        }
        if self.context.shard.is_some() && self.working.insert(key.clone()) {
            self.context.metrics.shard_objects(key.kind, 1);
        }
        let addr = self
            .registry
            .get_or_start(&key, || A::start_for(&self.context));
        addr.do_send(Observed(object));
    }

    /// Whether this replica works on an object with these labels (the engine's `works_on`).
    fn shard_of(&self, meta: &kube::api::ObjectMeta) -> ShardState {
        let Some(shard) = &self.context.shard else {
            return ShardState::Ours;
        };
        let key = ShardKey::of_kind(
            &K::kind(&()),
            meta.namespace.as_deref(),
            meta.name.as_deref().unwrap_or_default(),
        );
        let placement = Placement::from_labels(meta.labels.as_ref());
        if works_on(&shard.member, &key, &placement, &self.view) {
            ShardState::Ours
        } else {
            ShardState::NotOurs {
                drained: drained(&shard.member, &key, &placement, &self.view),
            }
        }
    }

    /// (Re)starts the watch: sharded and not gated, on the objects labelled for this replica or for a
    /// departed member it may take over from. A restart that selects less than before (`narrowed`) lists
    /// consistently (`MostRecent`): an object relabelled from a departed member to this replica just
    /// before must show in the list, or it would look deleted. A wider selection lists from the
    /// apiserver's watch cache (cheap while a take-over loads it): whatever a stale list misses arrives
    /// as a watch event, and everything it lacks is still selected.
    fn watch(&mut self, ctx: &mut Context<Self>, restart: bool, narrowed: bool) {
        if let Some(running) = self.watching.take() {
            ctx.cancel_future(running);
        }
        // What a departure event would have told is in the new list.
        self.released.clear();
        let api: Api<K> = Api::all(self.context.client.clone());
        let mut config = match (&self.context.shard, self.gated) {
            // Only this replica's share is watched: the cache holds only what it works on.
            (Some(shard), false) => {
                let holders: Vec<&str> = std::iter::once(&*shard.member)
                    .chain(self.view.takeovers.keys().map(String::as_str))
                    .collect();
                watcher::Config::default()
                    .labels(&format!("{SHARD_OWNER_LABEL} in ({})", holders.join(",")))
            }
            _ => watcher::Config::default(),
        };
        if narrowed {
            config.list_semantic = ListSemantic::MostRecent;
        }
        if restart {
            self.restarted_at = Some(std::time::Instant::now());
        }
        self.watching =
            Some(ctx.add_stream(watcher::watcher(api, config).default_backoff().boxed()));
    }

    /// Lets an object go: its actor (if any) stops once its running reconcile is done, then, when the
    /// coordinator asked for it (`drained`), the shard labels are removed so the new owner may start.
    fn release(
        &self,
        actor: Option<Addr<A>>,
        kind: &'static str,
        name: String,
        namespace: Option<String>,
        drained: bool,
    ) {
        let resource = kube::api::ApiResource::erase::<K>(&());
        let api: Api<kube::api::DynamicObject> = match &namespace {
            Some(ns) => Api::namespaced_with(self.context.client.clone(), ns, &resource),
            None => Api::all_with(self.context.client.clone(), &resource),
        };
        let metrics = self.context.metrics.clone();
        actix::spawn(async move {
            if let Some(actor) = actor {
                let (done, stopped) = tokio::sync::oneshot::channel();
                if actor.send(Release(done)).await.is_ok() {
                    let _ = stopped.await;
                }
            }
            if !drained {
                return;
            }
            let patch = serde_json::json!({"metadata": {"labels": {
                SHARD_OWNER_LABEL: null, SHARD_DRAIN_LABEL: null,
            }}});
            match api
                .patch(
                    &name,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&patch),
                )
                .await
            {
                Ok(_) => metrics.shard_released(kind),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(error) => warn!(%kind, %name, %error, "releasing to another replica failed"),
            }
        });
    }

    /// The object last seen under `key` is deleted: the tap hears of it (when its state is known) and its
    /// actor stops.
    fn deliver_gone(&mut self, key: &ObjectRef, object: Option<&A::Object>) {
        if let (Some(tap), Some(object)) = (&self.tap, object) {
            tap(object, true);
        }
        if object.is_some_and(|o| !A::wants(o)) {
            return;
        }
        self.stop_working(key);
        if let Some(addr) = self.registry.remove(key) {
            addr.do_send(Gone);
        }
    }

    fn stop_working(&mut self, key: &ObjectRef) {
        if self.working.remove(key) {
            self.context.metrics.shard_objects(key.kind, -1);
        }
    }

    /// A re-list ended: whatever it did not list was deleted while the watch was down.
    fn relisted(&mut self) {
        for (key, state) in self.known.relist_done() {
            info!(kind = %K::kind(&()), object = ?key, "deleted while the watch was down");
            self.context.metrics.deleted_in_watch_gap(key.kind);
            self.deliver_gone(&key, state.as_ref());
        }
    }
}

impl<K, A> Actor for KindFeed<K, A>
where
    A: FeedTarget,
    A::Object: From<K> + Clone + Unpin,
    K: WatchedKind,
    A::Context: ToEnvelope<A, Observed<A::Object>> + ToEnvelope<A, Gone>,
{
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(shard) = &self.context.shard {
            let view = shard.view.clone();
            self.view = view.borrow().clone();
            let changes = futures::stream::unfold(view, |mut view| async move {
                view.changed().await.ok()?;
                let seen = view.borrow_and_update().clone();
                Some((ViewChanged(seen), view))
            });
            ctx.add_stream(changes);
        }
        self.watch(ctx, false, false);
    }
}

impl<K, A> StreamHandler<ViewChanged> for KindFeed<K, A>
where
    A: FeedTarget,
    A::Object: From<K> + Clone + Unpin,
    K: WatchedKind,
    A::Context: ToEnvelope<A, Observed<A::Object>> + ToEnvelope<A, Gone>,
{
    fn handle(&mut self, ViewChanged(view): ViewChanged, ctx: &mut Context<Self>) {
        let changed = !self.view.takeovers.keys().eq(view.takeovers.keys());
        let narrowed = self
            .view
            .takeovers
            .keys()
            .any(|m| !view.takeovers.contains_key(m));
        self.view = view;
        if changed {
            let departed: Vec<&Member> = self.view.takeovers.keys().collect();
            info!(kind = %K::kind(&()), ?departed, "take-overs changed; watching again");
            // A gated feed watches everything already; its re-list routes every object under the new view.
            self.watch(ctx, true, narrowed);
        }
    }

    /// The view ends only when the process does; the feed keeps its last view until then.
    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl<K, A> StreamHandler<Result<Event<K>, watcher::Error>> for KindFeed<K, A>
where
    A: FeedTarget,
    A::Object: From<K> + Clone + Unpin,
    K: WatchedKind,
    A::Context: ToEnvelope<A, Observed<A::Object>> + ToEnvelope<A, Gone>,
{
    fn handle(&mut self, event: Result<Event<K>, watcher::Error>, _: &mut Context<Self>) {
        match event {
            Ok(Event::Apply(o)) | Ok(Event::InitApply(o)) => self.route(o, false),
            Ok(Event::Delete(o)) => self.route(o, true),
            Ok(Event::Init) => self.known.relist_started(),
            Ok(Event::InitDone) => {
                self.relisted();
                if let Some(since) = self.restarted_at.take() {
                    info!(kind = %K::kind(&()), seconds = since.elapsed().as_secs_f64(), working = self.working.len(), "listed again");
                }
                if !std::mem::replace(&mut self.synced, true) {
                    self.context.feeds.synced.fetch_add(1, Ordering::SeqCst);
                }
            }
            Err(e) => warn!(kind = %K::kind(&()), error = %e, "watch error; retrying"),
        }
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

    #[test]
    fn a_relist_reports_exactly_the_objects_it_did_not_list() {
        let mut known = KnownObjects::new(true);
        known.seen(&key("a"), "uid-a", || "a1");
        known.seen(&key("b"), "uid-b", || "b1");
        known.seen(&key("c"), "uid-c", || "c1");
        known.deleted(&key("c"));
        known.relist_started();
        assert_eq!(known.seen(&key("a"), "uid-a", || "a2"), None);
        assert_eq!(known.relist_done(), vec![(key("b"), Some("b1"))]);
        // Outside a re-list nothing vanishes, and b is forgotten.
        assert!(known.relist_done().is_empty());
        known.relist_started();
        assert!(known.relist_done() == vec![(key("a"), Some("a2"))]);
    }

    #[test]
    fn a_new_uid_under_a_known_name_is_a_replacement() {
        let mut known = KnownObjects::new(false);
        assert_eq!(known.seen(&key("a"), "uid-1", || ()), None);
        assert_eq!(known.seen(&key("a"), "uid-1", || ()), None);
        assert_eq!(known.seen(&key("a"), "uid-2", || ()), Some(None));
        assert_eq!(known.seen(&key("a"), "uid-2", || ()), None);
        let mut kept = KnownObjects::new(true);
        kept.seen(&key("a"), "uid-1", || "old");
        assert_eq!(kept.seen(&key("a"), "uid-2", || "new"), Some(Some("old")));
    }
}

//! Watch feeds for the package-operator kinds: one watch per kind for the whole manager, routing each event
//! to the actor that owns the object (started on first sight, told when the object is gone).
//!
//! A watch that was down long enough re-lists instead of replaying events: an object deleted meanwhile
//! sends no delete event, and one deleted and created again under its name shows up as an update. The
//! feed keeps what it routed (key and UID) so it can tell both: after a re-list every object missing from
//! it is gone, and an object with a new UID is a new object whose predecessor is gone.
//!
//! Sharded, a feed works on the objects the engine's `works_on` gives this replica under the current
//! [`ShardView`]: those labelled for it, and those of departed members it takes over. One watch selects
//! its own label and keeps running through a take-over; each departed member taken over from gets a watch
//! of its own, so a take-over lists only the departed member's objects. Such a watch cannot tell an
//! object relabelled from one deleted (both leave its selection), so unless the own watch has the object
//! already, a read decides. When a take-over ends (every object relabelled) its watch stops and the own
//! watch lists again. A gated feed sees every object and routes what it holds under the new view. Both
//! wait until every feed of the replica listed the departed member's objects
//! ([`TakeoverLists`](crate::runtime::takeover_lists::TakeoverLists)), so
//! the adopted objects' reconciles do not slow the lists still loading.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
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

use crate::runtime::registry::{ObjectRef, Registry};
use crate::runtime::runtime_context::{RuntimeContext, SharedContext};
use crate::runtime::takeover_lists::HOLD_LIMIT;

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
    /// What the actors share; the feed hands it to each actor it starts.
    type Shared: SharedContext;
    fn start_for(context: &Self::Shared) -> Addr<Self>;
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

/// Which watch of a feed saw an object: the one on this replica's label (on every object unsharded or
/// gated), or one on a departed member's label for as long as this replica takes over from it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum WatchSource {
    Own,
    Departed(Member),
}

/// The last sighting of an object: its UID, the watch that saw it and, when a tap follows the kind, its
/// state (a deletion found by a re-list has no event to hand the tap).
struct Sighting<O> {
    uid: String,
    source: WatchSource,
    state: Option<O>,
}

/// What one feed has routed, by key.
struct KnownObjects<O> {
    objects: HashMap<ObjectRef, Sighting<O>>,
    keep_state: bool,
    /// For each watch re-listing now, the keys it listed so far.
    relisting: HashMap<WatchSource, HashSet<ObjectRef>>,
}

impl<O: Clone> KnownObjects<O> {
    fn new(keep_state: bool) -> Self {
        Self {
            objects: HashMap::new(),
            keep_state,
            relisting: HashMap::new(),
        }
    }

    /// Records a sighting by `source`. Returns the former incarnation when `key` held an object of another
    /// UID (it was deleted and created again while the watch looked away): `Some(None)` when no state was
    /// kept.
    fn seen(
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

    fn sighting(&self, key: &ObjectRef) -> Option<&Sighting<O>> {
        self.objects.get(key)
    }

    /// The object under `key` is now followed by `source`'s watch.
    fn moved(&mut self, key: &ObjectRef, source: WatchSource) {
        if let Some(sighting) = self.objects.get_mut(key) {
            sighting.source = source;
        }
    }

    /// `from`'s watch ends: the own watch's next re-list answers for what it saw.
    fn hand_to_own(&mut self, from: &WatchSource) {
        self.relisting.remove(from);
        for sighting in self.objects.values_mut() {
            if sighting.source == *from {
                sighting.source = WatchSource::Own;
            }
        }
    }

    fn deleted(&mut self, key: &ObjectRef) {
        self.objects.remove(key);
    }

    fn relist_started(&mut self, source: &WatchSource) {
        self.relisting.insert(source.clone(), HashSet::new());
    }

    /// Ends `source`'s re-list: the objects it saw before and did not list now, forgotten, with their
    /// last state if kept.
    fn relist_done(&mut self, source: &WatchSource) -> Vec<(ObjectRef, Option<O>)> {
        let Some(listed) = self.relisting.remove(source) else {
            return Vec::new();
        };
        let vanished: Vec<ObjectRef> = self
            .objects
            .iter()
            .filter(|(key, sighting)| sighting.source == *source && !listed.contains(*key))
            .map(|(key, _)| key.clone())
            .collect();
        vanished
            .into_iter()
            .filter_map(|key| {
                let sighting = self.objects.remove(&key)?;
                Some((key, sighting.state))
            })
            .collect()
    }
}

/// Feeds one kind `K` into the actors of type `A`.
pub struct KindFeed<K, A: FeedTarget> {
    context: A::Shared,
    /// The runtime's part of `context`.
    runtime: RuntimeContext,
    registry: Arc<Registry<A>>,
    tap: Option<Tap<A::Object>>,
    known: KnownObjects<A::Object>,
    /// Whether the first list finished (counted once in `context.feeds`).
    synced: bool,
    /// Sharded: watch every object (the taps need them all) and start actors only for this replica's;
    /// otherwise a sharded feed watches only the objects labelled for this replica.
    gated: bool,
    /// Gated: the latest state of every object, routed again when the take-overs change (a gated feed
    /// sees every object already; what changes is which of them this replica works on).
    latest: HashMap<ObjectRef, K>,
    /// Objects this replica let go of whose departure from a label-selected watch is still to come (a
    /// delete event that is not a deletion), with the watch that will tell it.
    released: HashMap<ObjectRef, WatchSource>,
    /// The members as this replica sees them (sharded).
    view: ShardView,
    /// The watch on this replica's label (on every object unsharded or gated).
    watching: Option<SpawnHandle>,
    /// Sharded and not gated: a watch on each departed member's label this replica takes over from. The
    /// own watch keeps running meanwhile, so a take-over lists only the departed member's objects.
    departed: HashMap<Member, SpawnHandle>,
    /// When a watch started that is still listing.
    listing_since: HashMap<WatchSource, std::time::Instant>,
    /// The events of departed members' watches held until every feed listed their objects (or
    /// [`HOLD_LIMIT`] passed): the adopted objects' reconciles start after the take-over's lists.
    held: HashMap<Member, Vec<Result<Event<K>, watcher::Error>>>,
    /// Departed members whose objects this feed listed once (told to the take-over lists).
    counted: HashSet<Member>,
    /// Gated: routing under a new view waits for the take-overs' lists.
    reroute_pending: bool,
    /// The objects this replica works on (sharded; counted in `pko_shard_objects`).
    working: HashSet<ObjectRef>,
}

/// How long a feed waits before reading again an object whose read failed.
const LOST_READ_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// The watch on a departed member's label. Its list is served from the apiserver's watch cache (whatever
/// a stale list misses arrives as an event): a consistent list of a label selection reads every object of
/// the kind from etcd and filters after, seconds for thousands of ObjectSets with every successor listing
/// at once. The client sends `resourceVersion=0` only on an unpaged list, hence no page size.
fn departed_watch_config(departed: &str) -> watcher::Config {
    let mut config = watcher::Config::default()
        .labels(&format!("{SHARD_OWNER_LABEL}={departed}"))
        .any_semantic();
    config.page_size = None;
    config
}

/// What a sharded feed hears of the replica besides its watches.
enum ShardSignal {
    /// The members changed.
    ViewChanged(ShardView),
    /// Every feed listed a departed member's objects.
    TakeoverListed,
}

/// An event of one of the feed's watches.
type WatchEvent<K> = (WatchSource, Result<Event<K>, watcher::Error>);

impl<K, A> KindFeed<K, A>
where
    A: FeedTarget,
    A::Object: From<K> + Clone + Unpin,
    K: WatchedKind,
    A::Context: ToEnvelope<A, Observed<A::Object>> + ToEnvelope<A, Gone>,
{
    pub fn new(
        context: A::Shared,
        registry: Arc<Registry<A>>,
        tap: Option<Tap<A::Object>>,
    ) -> Self {
        let known = KnownObjects::new(tap.is_some());
        let runtime = context.runtime().clone();
        runtime.feeds.feed_started();
        if let Some(shard) = &runtime.shard {
            shard.lists.register_feed();
        }
        Self {
            context,
            runtime,
            registry,
            tap,
            known,
            synced: false,
            gated: false,
            latest: HashMap::new(),
            released: HashMap::new(),
            view: ShardView::default(),
            watching: None,
            departed: HashMap::new(),
            listing_since: HashMap::new(),
            held: HashMap::new(),
            counted: HashSet::new(),
            reroute_pending: false,
            working: HashSet::new(),
        }
    }

    /// Sharded, this feed watches every object (its tap follows them all) and starts actors only for the
    /// objects labelled for this replica.
    pub fn gated(mut self) -> Self {
        if let (Some(shard), false) = (&self.runtime.shard, self.gated) {
            // It watches no departed member's label.
            shard.lists.unregister_feed();
        }
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
                .seen(&A::key(&object), &uid, &WatchSource::Own, || {
                    A::tombstone(&object)
                });
        }
        self
    }

    fn route(&mut self, ctx: &mut Context<Self>, source: &WatchSource, object: K, deleted: bool) {
        let uid = object.meta().uid.clone().unwrap_or_default();
        let shard = self.shard_of(object.meta());
        let (name, namespace) = (object.meta().name.clone(), object.meta().namespace.clone());
        let latest = (self.gated && !deleted).then(|| object.clone());
        let object = A::Object::from(object);
        let key = A::key(&object);
        if self.gated {
            match latest {
                Some(latest) => self.latest.insert(key.clone(), latest),
                None => self.latest.remove(&key),
            };
        }
        if deleted {
            if self.released.remove(&key).is_some() {
                // It left this replica's watch when we let it go; its new owner has it.
                return;
            }
            if let WatchSource::Departed(_) = source {
                // Relabelled for this replica (the label follows the work) or for another, or deleted:
                // the departed member's watch cannot tell, and the own watch's event for a relabelling
                // may come before or after. Unless another watch saw it since, a read decides.
                if self.last_seen_by(&key, source, &uid) {
                    self.check_lost(ctx, source.clone(), key, uid, object);
                }
                return;
            }
            self.known.deleted(&key);
            self.deliver_gone(&key, Some(&object));
            return;
        }
        if let ShardState::NotOurs { drained } = shard {
            if self.gated {
                self.known
                    .seen(&key, &uid, source, || A::tombstone(&object));
                if let Some(tap) = &self.tap {
                    tap(&object, false);
                }
            } else {
                self.known.deleted(&key);
                self.released.insert(key.clone(), source.clone());
            }
            self.let_go(&key, &object, name, namespace, drained);
            return;
        }
        if let Some(former) = self
            .known
            .seen(&key, &uid, source, || A::tombstone(&object))
        {
            info!(kind = %K::kind(&()), object = ?key, "object replaced by a new one of the same name");
            self.deliver_gone(&key, Some(former.as_ref().unwrap_or(&object)));
        }
        if let Some(tap) = &self.tap {
            tap(&object, false);
        }
        if !A::wants(&object) {
            return;
        }
        if self.runtime.shard.is_some() && self.working.insert(key.clone()) {
            self.runtime.metrics.shard_objects(key.kind, 1);
        }
        let addr = self
            .registry
            .get_or_start(&key, || A::start_for(&self.context));
        addr.do_send(Observed(object));
    }

    /// An object this replica works on is labelled for another: its actor stops, and when the coordinator
    /// drained it, the labels go so the new owner may start.
    fn let_go(
        &mut self,
        key: &ObjectRef,
        object: &A::Object,
        name: Option<String>,
        namespace: Option<String>,
        drained: bool,
    ) {
        let actor = self.registry.remove(key);
        self.stop_working(key);
        if actor.is_some() || (drained && A::wants(object)) {
            self.release(
                actor,
                key.kind,
                name.unwrap_or_default(),
                namespace,
                drained,
            );
        }
    }

    /// Whether the object under `key` was last seen by `source`'s watch as `uid` (not seen since by
    /// another watch of this feed, and followed here at all).
    fn last_seen_by(&self, key: &ObjectRef, source: &WatchSource, uid: &str) -> bool {
        self.known
            .sighting(key)
            .is_some_and(|sighting| sighting.source == *source && sighting.uid == uid)
    }

    fn check_lost(
        &self,
        ctx: &mut Context<Self>,
        source: WatchSource,
        key: ObjectRef,
        uid: String,
        object: A::Object,
    ) {
        let namespace = (!key.namespace.is_empty()).then_some(key.namespace.as_str());
        let api = self.dynamic_api(&self.runtime.watch_client, namespace);
        let name = key.name.clone();
        let read = async move { api.get_opt(&name).await };
        // Answered on the feed, in order with its watch events.
        ctx.spawn(read.into_actor(self).map(move |found, feed, ctx| match found {
            Ok(found) => feed.lost_checked(source, key, uid, object, found),
            Err(error) => {
                // Until a read answers, the object keeps its actor.
                warn!(kind = %K::kind(&()), object = ?key, %error, "reading an object a departed member's watch lost failed; reading again");
                ctx.run_later(LOST_READ_RETRY, move |feed, ctx| {
                    feed.check_lost(ctx, source, key, uid, object)
                });
            }
        }));
    }

    /// What a read after a departed watch's delete found: the object itself (moved: it stays with this
    /// replica if labelled for it, else its actor stops) or nothing of that UID (deleted).
    fn lost_checked(
        &mut self,
        source: WatchSource,
        key: ObjectRef,
        uid: String,
        object: A::Object,
        found: Option<kube::api::DynamicObject>,
    ) {
        if !self.last_seen_by(&key, &source, &uid) {
            // Another event about it came meanwhile and was routed.
            return;
        }
        match found {
            Some(found) if found.metadata.uid.as_deref() == Some(uid.as_str()) => {
                match self.shard_of(&found.metadata) {
                    ShardState::Ours => {
                        // Labelled for this replica now: its own watch delivers it (or did).
                        self.known.moved(&key, WatchSource::Own);
                    }
                    ShardState::NotOurs { drained } => {
                        self.known.deleted(&key);
                        let (name, namespace) = (found.metadata.name, found.metadata.namespace);
                        self.let_go(&key, &object, name, namespace, drained);
                    }
                }
            }
            _ => {
                info!(kind = %K::kind(&()), object = ?key, "deleted while taken over");
                self.known.deleted(&key);
                self.deliver_gone(&key, Some(&object));
            }
        }
    }

    /// Whether this replica works on an object with these labels (the engine's `works_on`).
    fn shard_of(&self, meta: &kube::api::ObjectMeta) -> ShardState {
        let Some(shard) = &self.runtime.shard else {
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

    /// (Re)starts the own watch: sharded and not gated, on the objects labelled for this replica. A
    /// restart lists consistently (`MostRecent`): it follows the end of a take-over, and an object
    /// relabelled from the departed member to this replica just before must show in the list, or it
    /// would look deleted.
    fn watch_own(&mut self, ctx: &mut Context<Self>, restart: bool) {
        if let Some(running) = self.watching.take() {
            ctx.cancel_future(running);
        }
        // What a departure event would have told is in the new list.
        self.released
            .retain(|_, source| *source != WatchSource::Own);
        let mut config = match (&self.runtime.shard, self.gated) {
            // Only this replica's share is watched: the cache holds only what it works on.
            (Some(shard), false) => {
                watcher::Config::default().labels(&format!("{SHARD_OWNER_LABEL}={}", shard.member))
            }
            _ => watcher::Config::default(),
        };
        if restart {
            config.list_semantic = ListSemantic::MostRecent;
            self.listing_since
                .insert(WatchSource::Own, std::time::Instant::now());
        }
        self.watching = Some(self.start_watch(ctx, WatchSource::Own, config));
    }

    /// Starts a watch of the objects labelled for `departed`, which this replica takes over from.
    fn watch_departed(&mut self, ctx: &mut Context<Self>, departed: &Member) {
        if let Some(shard) = &self.runtime.shard {
            shard.lists.watching(departed);
            if !shard.lists.complete(departed) {
                self.held.insert(departed.clone(), Vec::new());
                let member = departed.clone();
                ctx.run_later(HOLD_LIMIT, move |feed, ctx| feed.replay(ctx, &member));
            }
        }
        let source = WatchSource::Departed(departed.clone());
        let config = departed_watch_config(departed);
        self.listing_since
            .insert(source.clone(), std::time::Instant::now());
        let handle = self.start_watch(ctx, source, config);
        self.departed.insert(departed.clone(), handle);
    }

    fn start_watch(
        &self,
        ctx: &mut Context<Self>,
        source: WatchSource,
        config: watcher::Config,
    ) -> SpawnHandle {
        let api: Api<K> = Api::all(self.runtime.watch_client.clone());
        let events = watcher::watcher(api, config)
            .default_backoff()
            .map(move |event| (source.clone(), event));
        ctx.add_stream(events.boxed())
    }

    /// The take-overs changed: a watch for each departed member newly taken over from; for each whose
    /// record went (every object relabelled), its watch stops and the own watch lists again, which
    /// tells what of its objects went elsewhere. A gated feed routes what it holds under the new view.
    fn takeovers_changed(&mut self, ctx: &mut Context<Self>) {
        if self.gated {
            self.reroute_pending = true;
            if self.takeovers_listed() {
                self.reroute(ctx);
            } else {
                ctx.run_later(HOLD_LIMIT, |feed, ctx| feed.reroute(ctx));
            }
            return;
        }
        let ended: Vec<Member> = self
            .departed
            .keys()
            .filter(|m| !self.view.takeovers.contains_key(*m))
            .cloned()
            .collect();
        for member in &ended {
            if let Some(handle) = self.departed.remove(member) {
                ctx.cancel_future(handle);
            }
            let source = WatchSource::Departed(member.clone());
            self.known.hand_to_own(&source);
            self.released.retain(|_, s| *s != source);
            self.listing_since.remove(&source);
            // The own watch's list answers for whatever was still held.
            self.held.remove(member);
            self.counted.remove(member);
            if let Some(shard) = &self.runtime.shard {
                shard.lists.ended(member);
            }
        }
        let started: Vec<Member> = self
            .view
            .takeovers
            .keys()
            .filter(|m| !self.departed.contains_key(*m))
            .cloned()
            .collect();
        for member in &started {
            self.watch_departed(ctx, member);
        }
        info!(kind = %K::kind(&()), ?started, ?ended, "take-overs changed");
        if !ended.is_empty() {
            self.watch_own(ctx, true);
        }
    }

    /// Some take-over was listed by every feed: the events held for it are routed, and a gated feed
    /// waiting for the lists routes what it holds.
    fn takeovers_listed_by_all(&mut self, ctx: &mut Context<Self>) {
        let Some(shard) = self.runtime.shard.clone() else {
            return;
        };
        let listed: Vec<Member> = self
            .held
            .keys()
            .filter(|member| shard.lists.complete(member))
            .cloned()
            .collect();
        for member in &listed {
            self.replay(ctx, member);
        }
        if self.reroute_pending && self.takeovers_listed() {
            self.reroute(ctx);
        }
    }

    /// Whether every feed listed the objects of every departed member taken over from.
    fn takeovers_listed(&self) -> bool {
        let Some(shard) = &self.runtime.shard else {
            return true;
        };
        self.view
            .takeovers
            .keys()
            .all(|member| shard.lists.complete(member))
    }

    /// Gated: routes what the feed holds under the current view, where that changes who works on it.
    fn reroute(&mut self, ctx: &mut Context<Self>) {
        if !std::mem::take(&mut self.reroute_pending) {
            // Done already, when the lists completed.
            return;
        }
        let moved: Vec<K> = self
            .latest
            .iter()
            .filter(|(key, object)| {
                matches!(self.shard_of(object.meta()), ShardState::Ours)
                    != self.working.contains(*key)
            })
            .map(|(_, object)| object.clone())
            .collect();
        info!(kind = %K::kind(&()), objects = moved.len(), "take-overs changed; routing what moved");
        for object in moved {
            self.route(ctx, &WatchSource::Own, object, false);
        }
    }

    /// Routes the held events of `departed`'s watch, in order (every feed listed its objects, or the
    /// hold's limit passed); from then on its events are routed as they come.
    fn replay(&mut self, ctx: &mut Context<Self>, departed: &Member) {
        let Some(events) = self.held.remove(departed) else {
            return;
        };
        let source = WatchSource::Departed(departed.clone());
        for event in events {
            self.dispatch(ctx, &source, event);
        }
    }

    /// Handles one watch event (after any hold).
    fn dispatch(
        &mut self,
        ctx: &mut Context<Self>,
        source: &WatchSource,
        event: Result<Event<K>, watcher::Error>,
    ) {
        match event {
            Ok(Event::Apply(o)) | Ok(Event::InitApply(o)) => self.route(ctx, source, o, false),
            Ok(Event::Delete(o)) => self.route(ctx, source, o, true),
            Ok(Event::Init) => self.known.relist_started(source),
            Ok(Event::InitDone) => {
                self.relisted(source);
                if let Some(since) = self.listing_since.remove(source) {
                    info!(kind = %K::kind(&()), ?source, seconds = since.elapsed().as_secs_f64(), working = self.working.len(), "listed");
                }
                if *source == WatchSource::Own && !std::mem::replace(&mut self.synced, true) {
                    self.runtime.feeds.feed_listed();
                }
            }
            Err(e) => warn!(kind = %K::kind(&()), ?source, error = %e, "watch error; retrying"),
        }
    }

    fn dynamic_api(
        &self,
        client: &kube::Client,
        namespace: Option<&str>,
    ) -> Api<kube::api::DynamicObject> {
        let resource = kube::api::ApiResource::erase::<K>(&());
        match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        }
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
        let api = self.dynamic_api(&self.runtime.client, namespace.as_deref());
        let metrics = self.runtime.metrics.clone();
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
            self.runtime.metrics.shard_objects(key.kind, -1);
        }
    }

    /// `source`'s re-list ended: whatever it saw before and did not list now was deleted while the watch
    /// was down.
    fn relisted(&mut self, source: &WatchSource) {
        for (key, state) in self.known.relist_done(source) {
            info!(kind = %K::kind(&()), object = ?key, "deleted while the watch was down");
            self.latest.remove(&key);
            self.runtime.metrics.deleted_in_watch_gap(key.kind);
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
        if let Some(shard) = &self.runtime.shard {
            let view = shard.view.clone();
            self.view = view.borrow().clone();
            let changes = futures::stream::unfold(view, |mut view| async move {
                view.changed().await.ok()?;
                let seen = view.borrow_and_update().clone();
                Some((ShardSignal::ViewChanged(seen), view))
            });
            let listed = futures::stream::unfold(shard.lists.subscribe(), |mut lists| async move {
                lists.changed().await.ok()?;
                Some((ShardSignal::TakeoverListed, lists))
            });
            ctx.add_stream(futures::stream::select(changes, listed));
        }
        self.watch_own(ctx, false);
        if !self.gated {
            let departed: Vec<Member> = self.view.takeovers.keys().cloned().collect();
            for member in &departed {
                self.watch_departed(ctx, member);
            }
        }
    }
}

impl<K, A> StreamHandler<ShardSignal> for KindFeed<K, A>
where
    A: FeedTarget,
    A::Object: From<K> + Clone + Unpin,
    K: WatchedKind,
    A::Context: ToEnvelope<A, Observed<A::Object>> + ToEnvelope<A, Gone>,
{
    fn handle(&mut self, signal: ShardSignal, ctx: &mut Context<Self>) {
        match signal {
            ShardSignal::ViewChanged(view) => {
                let changed = !self.view.takeovers.keys().eq(view.takeovers.keys());
                self.view = view;
                if changed {
                    self.takeovers_changed(ctx);
                }
            }
            ShardSignal::TakeoverListed => self.takeovers_listed_by_all(ctx),
        }
    }

    /// The view ends only when the process does; the feed keeps its last view until then.
    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl<K, A> StreamHandler<WatchEvent<K>> for KindFeed<K, A>
where
    A: FeedTarget,
    A::Object: From<K> + Clone + Unpin,
    K: WatchedKind,
    A::Context: ToEnvelope<A, Observed<A::Object>> + ToEnvelope<A, Gone>,
{
    fn handle(&mut self, (source, event): WatchEvent<K>, ctx: &mut Context<Self>) {
        if let (WatchSource::Departed(member), Some(shard)) = (&source, &self.runtime.shard) {
            if matches!(event, Ok(Event::InitDone)) && self.counted.insert(member.clone()) {
                shard.lists.listed(member);
            }
            // Routed when every feed listed the member's objects (a `TakeoverListed` signal, this
            // feed's own last list included) or the hold's limit passed.
            if let Some(held) = self.held.get_mut(member) {
                held.push(event);
                return;
            }
        }
        self.dispatch(ctx, &source, event);
    }

    /// A watch ends only when the feed cancels it; the feed goes on with its other watches.
    fn finished(&mut self, _: &mut Context<Self>) {}
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
    fn a_departed_watch_lists_from_the_watch_cache() {
        let config = departed_watch_config("b-1");
        // kube sends resourceVersion=0 (the watch cache) only with Any and no page size.
        assert_eq!(config.list_semantic, ListSemantic::Any);
        assert_eq!(config.page_size, None);
        assert_eq!(
            config.label_selector.as_deref(),
            Some(format!("{SHARD_OWNER_LABEL}=b-1").as_str())
        );
    }

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

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
use pko_proto::well_known::SHARD_OWNER_LABEL;
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use crate::engine::sharding::shard_assignment::{Member, ShardView};

use crate::runtime::initial_lists::InitialLists;
use crate::runtime::registry::{ObjectRef, Registry};
use crate::runtime::runtime_context::{RuntimeContext, SharedContext};

use crate::runtime::known_objects::{KnownObjects, WatchSource};

/// The sharded part of the feed: `impl` blocks of [`KindFeed`] of their own.
pub mod shard_release;
mod shard_takeover;

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

/// What is done once the actor of an object this replica let go of has stopped: decided by the latest
/// event about the object, which may come while it stops.
enum AfterStop<T> {
    /// The coordinator drained it: the shard labels go, if they still say what they said then.
    RemoveLabels(LabelledAs),
    /// Labelled for this replica again meanwhile: a new actor takes this state.
    Resume(T),
    /// Labelled for another replica, or deleted.
    Nothing,
}

/// What an object's shard labels said when the feed decided to let it go.
struct LabelledAs {
    name: String,
    namespace: Option<String>,
    /// The owner label (a departed member's, for an object taken over).
    holder: Option<String>,
}

impl LabelledAs {
    fn of(meta: &kube::api::ObjectMeta) -> Self {
        Self {
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone(),
            holder: meta
                .labels
                .as_ref()
                .and_then(|labels| labels.get(SHARD_OWNER_LABEL))
                .cloned(),
        }
    }
}

/// What a sharded feed hears of the replica besides its watches.
enum ShardSignal {
    /// The members changed.
    ViewChanged(ShardView),
    /// Every feed listed a departed member's objects.
    TakeoverListed,
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
    /// [`HOLD_LIMIT`](crate::runtime::takeover_lists::HOLD_LIMIT) passed): the adopted objects' reconciles start after the take-over's lists.
    held: HashMap<Member, Vec<Result<Event<K>, watcher::Error>>>,
    /// Departed members whose objects this feed listed once (told to the take-over lists).
    counted: HashSet<Member>,
    /// Gated: routing under a new view waits for the take-overs' lists.
    reroute_pending: bool,
    /// The objects this replica works on (sharded; counted in `pko_shard_objects`).
    working: HashSet<ObjectRef>,
    /// Objects let go of whose actor is still stopping: one stop per object, and what follows it waits
    /// for it (`shard_release.rs`).
    stopping: HashMap<ObjectRef, AfterStop<A::Object>>,
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
            stopping: HashMap::new(),
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
        // Only an object let go of needs its labels kept (most events are of this replica's own).
        let labelled =
            matches!(shard, ShardState::NotOurs { .. }).then(|| LabelledAs::of(object.meta()));
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
                // It left this replica's watch when we let it go; its new owner has it. While its actor
                // still stops, no release was sent: another replica or the coordinator moved it.
                if let Some(after) = self.stopping.get_mut(&key) {
                    *after = AfterStop::Nothing;
                }
                return;
            }
            if let WatchSource::Departed(_) = source {
                // Relabelled for this replica (the label follows the work) or for another, or deleted:
                // the departed member's watch cannot tell, and the own watch's event for a relabelling
                // may come before or after. Unless another watch saw it since, a read decides.
                if self.last_seen_by(&key, source, &uid) {
                    self.check_lost(ctx, source.clone(), key, uid, Some(object));
                }
                return;
            }
            self.known.deleted(&key);
            self.deliver_gone(&key, Some(&object));
            return;
        }
        if let (ShardState::NotOurs { drained }, Some(labelled)) = (shard, labelled) {
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
            self.let_go(ctx, &key, &object, labelled, drained);
            return;
        }
        // Ours (again): no departure from a watch is to come.
        self.released.remove(&key);
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
        if let Some(after) = self.stopping.get_mut(&key) {
            // Its former actor is still stopping; a second one must not start beside it.
            *after = AfterStop::Resume(object);
            return;
        }
        self.deliver(&key, object);
    }

    /// Hands the object's latest state to its actor (started if there is none).
    fn deliver(&self, key: &ObjectRef, object: A::Object) {
        let addr = self
            .registry
            .get_or_start(key, || A::start_for(&self.context));
        addr.do_send(Observed(object));
    }

    /// (Re)starts the own watch: sharded and not gated, on the objects labelled for this replica. A
    /// restart lists consistently (a paged `MostRecent` list, never a streaming one, which reads the
    /// watch cache at any age): it follows the end of a take-over, and an object relabelled from the
    /// departed member to this replica just before must show in the list, or it would look deleted.
    fn watch_own(&mut self, ctx: &mut Context<Self>, restart: bool) {
        if let Some(running) = self.watching.take() {
            ctx.cancel_future(running);
        }
        // What a departure event would have told is in the new list.
        self.released
            .retain(|_, source| *source != WatchSource::Own);
        let lists = if restart {
            InitialLists::Paged
        } else {
            self.runtime.initial_lists
        };
        let mut config = match (&self.runtime.shard, self.gated) {
            // Only this replica's share is watched: the cache holds only what it works on.
            (Some(shard), false) => lists
                .config()
                .labels(&format!("{SHARD_OWNER_LABEL}={}", shard.member)),
            _ => lists.config(),
        };
        if restart {
            config.list_semantic = ListSemantic::MostRecent;
            self.listing_since
                .insert(WatchSource::Own, std::time::Instant::now());
        }
        self.watching = Some(self.start_watch(ctx, WatchSource::Own, config));
    }

    fn start_watch(
        &self,
        ctx: &mut Context<Self>,
        source: WatchSource,
        config: watcher::Config,
    ) -> SpawnHandle {
        let api: Api<K> = Api::all(self.runtime.watch_client.clone());
        // Nothing pko does with its own kinds reads their field records, and they are often the bulk of
        // an object's metadata: dropped on arrival, before the actor, the feed's state and the taps'
        // indexes keep a copy (issue 42: 13 MB of 116 at 500 HostedClusters).
        let events = watcher::watcher(api, config)
            .modify(|object: &mut K| object.meta_mut().managed_fields = None)
            .default_backoff()
            .map(move |event| (source.clone(), event));
        ctx.add_stream(events.boxed())
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
                self.relisted(ctx, source);
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

    /// The object last seen under `key` is deleted: the tap hears of it (when its state is known) and its
    /// actor stops.
    fn deliver_gone(&mut self, key: &ObjectRef, object: Option<&A::Object>) {
        if let Some(after) = self.stopping.get_mut(key) {
            *after = AfterStop::Nothing;
        }
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
    /// was down. A departed member's watch cannot tell that from a relabelling: a read decides, as for
    /// its delete events.
    fn relisted(&mut self, ctx: &mut Context<Self>, source: &WatchSource) {
        if let WatchSource::Departed(_) = source {
            for (key, uid, last) in self.known.relist_done_unsure(source) {
                self.check_lost(ctx, source.clone(), key, uid, last);
            }
            return;
        }
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

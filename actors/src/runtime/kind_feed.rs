//! Watch feeds for the package-operator kinds: one watch per kind for the whole manager, routing each event
//! to the actor that owns the object (started on first sight, told when the object is gone).

use std::fmt::Debug;
use std::sync::Arc;

use actix::dev::ToEnvelope;
use actix::prelude::*;
use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tracing::warn;

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

/// An actor that owns one object of a watched kind.
pub trait FeedTarget:
    Actor<Context = Context<Self>> + Handler<Observed<Self::Object>> + Handler<Gone>
{
    /// The engine's view of the object (both the namespaced and the Cluster kind map to it).
    type Object: Send + 'static;
    fn start_for(context: &ManagerContext) -> Addr<Self>;
    /// Whether this manager reconciles the object at all.
    fn wants(_object: &Self::Object) -> bool {
        true
    }
    fn key(object: &Self::Object) -> ObjectRef;
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
    context: ManagerContext,
    registry: Arc<Registry<A>>,
    tap: Option<Tap<A::Object>>,
    _kind: std::marker::PhantomData<K>,
}

impl<K, A> KindFeed<K, A>
where
    A: FeedTarget,
    A::Object: From<K>,
    K: WatchedKind,
    A::Context: ToEnvelope<A, Observed<A::Object>> + ToEnvelope<A, Gone>,
{
    pub fn new(
        context: ManagerContext,
        registry: Arc<Registry<A>>,
        tap: Option<Tap<A::Object>>,
    ) -> Self {
        Self {
            context,
            registry,
            tap,
            _kind: std::marker::PhantomData,
        }
    }

    fn route(&self, object: K, deleted: bool) {
        let object = A::Object::from(object);
        if let Some(tap) = &self.tap {
            tap(&object, deleted);
        }
        if !A::wants(&object) {
            return;
        }
        let key = A::key(&object);
        if deleted {
            if let Some(addr) = self.registry.remove(&key) {
                addr.do_send(Gone);
            }
            return;
        }
        let addr = self
            .registry
            .get_or_start(&key, || A::start_for(&self.context));
        addr.do_send(Observed(object));
    }
}

impl<K, A> Actor for KindFeed<K, A>
where
    A: FeedTarget,
    A::Object: From<K>,
    K: WatchedKind,
    A::Context: ToEnvelope<A, Observed<A::Object>> + ToEnvelope<A, Gone>,
{
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let api: Api<K> = Api::all(self.context.client.clone());
        ctx.add_stream(
            watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed(),
        );
    }
}

impl<K, A> StreamHandler<Result<Event<K>, watcher::Error>> for KindFeed<K, A>
where
    A: FeedTarget,
    A::Object: From<K>,
    K: WatchedKind,
    A::Context: ToEnvelope<A, Observed<A::Object>> + ToEnvelope<A, Gone>,
{
    fn handle(&mut self, event: Result<Event<K>, watcher::Error>, _: &mut Context<Self>) {
        match event {
            Ok(Event::Apply(o)) | Ok(Event::InitApply(o)) => self.route(o, false),
            Ok(Event::Delete(o)) => self.route(o, true),
            Ok(Event::Init) | Ok(Event::InitDone) => {}
            Err(e) => warn!(kind = %K::kind(&()), error = %e, "watch error; retrying"),
        }
    }
}

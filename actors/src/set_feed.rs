//! The watch feed for ObjectSets and ClusterObjectSets: one watch per kind for the whole manager, routing
//! each event to the set's actor (started on first sight, stopped when the set is deleted).

use std::fmt::Debug;
use std::sync::Arc;

use actix::prelude::*;
use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tracing::warn;

use crate::context::ManagerContext;
use crate::object_set_actor::{ObjectSetActor, SetGone, SetObserved};
use crate::registry::{ObjectRef, Registry};
use crate::set_object::SetObject;

/// Feeds one kind of set into the registry's actors.
pub struct SetFeed<K> {
    context: ManagerContext,
    registry: Arc<Registry<ObjectSetActor>>,
    _kind: std::marker::PhantomData<K>,
}

impl<K> SetFeed<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + Unpin + 'static,
    SetObject: From<K>,
{
    pub fn new(context: ManagerContext, registry: Arc<Registry<ObjectSetActor>>) -> Self {
        Self { context, registry, _kind: std::marker::PhantomData }
    }

    fn route(&self, object: K, deleted: bool) {
        let set = SetObject::from(object);
        let key = ObjectRef {
            kind: set.kind.kind(),
            namespace: set.namespace().to_owned(),
            name: set.name().to_owned(),
        };
        if deleted {
            if let Some(addr) = self.registry.remove(&key) {
                addr.do_send(SetGone);
            }
            return;
        }
        let context = self.context.clone();
        let addr = self.registry.get_or_start(&key, || ObjectSetActor::new(context).start());
        addr.do_send(SetObserved(set));
    }
}

impl<K> Actor for SetFeed<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + Unpin + 'static,
    SetObject: From<K>,
{
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let api: Api<K> = Api::all(self.context.client.clone());
        ctx.add_stream(watcher::watcher(api, watcher::Config::default()).boxed());
    }
}

impl<K> StreamHandler<Result<Event<K>, watcher::Error>> for SetFeed<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + Unpin + 'static,
    SetObject: From<K>,
{
    fn handle(&mut self, event: Result<Event<K>, watcher::Error>, _: &mut Context<Self>) {
        match event {
            Ok(Event::Apply(o)) | Ok(Event::InitApply(o)) => self.route(o, false),
            Ok(Event::Delete(o)) => self.route(o, true),
            Ok(Event::Init) | Ok(Event::InitDone) => {}
            Err(e) => warn!(error = %e, "ObjectSet watch error; retrying"),
        }
    }
}

//! Relations between kinds, declared once where the actor tree is wired: "objects of this kind wake the
//! actor of the object that controls them". A relation is a watch feed's tap; it reads the changed
//! object's controller reference (`MetaView::controller`) and sends the owner's actor a message, if that
//! actor runs here. It must not decide anything about the objects: what a message means is the owner's.

use std::sync::Arc;

use actix::dev::ToEnvelope;
use actix::prelude::*;

use crate::runtime::kind_feed::Tap;
use crate::runtime::meta_view::MetaView;
use crate::runtime::registry::{ObjectRef, Registry};

/// A tap on kind `C` that wakes the controller of each observed object: an object whose controller
/// reference names an object of kind `owner_kind(object)` in its own namespace gets that owner's actor
/// (in `owners`) sent `message(object, deleted)`. Objects controlled by another kind, or by nothing, wake
/// nobody.
pub fn wake_controller<C, A, M>(
    owners: Arc<Registry<A>>,
    owner_kind: fn(&C) -> Option<&'static str>,
    message: impl Fn(&C, bool) -> M + Send + Sync + 'static,
) -> Tap<C>
where
    C: MetaView + 'static,
    A: Actor + Handler<M>,
    A::Context: ToEnvelope<A, M>,
    M: Message<Result = ()> + Send + 'static,
{
    Arc::new(move |object: &C, deleted| {
        let Some(owner) = object.controller() else {
            return;
        };
        let Some(kind) = owner_kind(object).filter(|kind| owner.kind == *kind) else {
            return;
        };
        let key = ObjectRef {
            kind,
            namespace: object.namespace().to_owned(),
            name: owner.name.clone(),
        };
        if let Some(addr) = owners.get(&key) {
            addr.do_send(message(object, deleted));
        }
    })
}

//! Starts the manager's actor tree: the feeds for each kind pko reconciles and the registries behind them.

use std::sync::Arc;

use actix::{Actor, Addr, System};
use pko_proto::core::object_set::{ClusterObjectSet, ObjectSet};

use crate::context::ManagerContext;
use crate::object_set_actor::ObjectSetActor;
use crate::registry::Registry;
use crate::set_feed::SetFeed;

/// The running engine; dropping it leaves the actors running until the System stops.
pub struct Engine {
    pub sets: Arc<Registry<ObjectSetActor>>,
    _object_sets: Addr<SetFeed<ObjectSet>>,
    _cluster_object_sets: Addr<SetFeed<ClusterObjectSet>>,
}

impl Engine {
    /// Stops every actor of this System.
    pub fn stop(&self) {
        System::current().stop();
    }
}

/// Starts the feeds on the current actix System.
pub fn start(context: ManagerContext) -> Engine {
    let sets: Arc<Registry<ObjectSetActor>> = Arc::default();
    Engine {
        _object_sets: SetFeed::<ObjectSet>::new(context.clone(), sets.clone()).start(),
        _cluster_object_sets: SetFeed::<ClusterObjectSet>::new(context, sets.clone()).start(),
        sets,
    }
}

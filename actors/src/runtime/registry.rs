//! Actor addresses keyed by object reference, so every event for an object reaches the one actor that owns
//! it (and a sharded deployment can later route by the same key).

use std::hash::Hash;

use actix::{Actor, Addr};
use dashmap::DashMap;

use crate::runtime::meta_view::MetaView;

/// `kind/namespace/name` of a package-operator object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
}

impl ObjectRef {
    /// The reference of `object`, a `kind`.
    pub fn of(kind: &'static str, object: &impl MetaView) -> Self {
        Self {
            kind,
            namespace: object.namespace().to_owned(),
            name: object.name().to_owned(),
        }
    }
}

/// Live actors of one type, by the object they own.
pub struct Registry<A: Actor, K: Eq + Hash = ObjectRef> {
    actors: DashMap<K, Addr<A>>,
}

impl<A: Actor, K: Eq + Hash + Clone> Default for Registry<A, K> {
    fn default() -> Self {
        Self {
            actors: DashMap::new(),
        }
    }
}

impl<A: Actor, K: Eq + Hash + Clone> Registry<A, K> {
    /// The actor for `key`, started with `start` if there is none (or the old one stopped).
    pub fn get_or_start(&self, key: &K, start: impl FnOnce() -> Addr<A>) -> Addr<A> {
        if let Some(addr) = self.actors.get(key) {
            if addr.connected() {
                return addr.clone();
            }
        }
        let addr = start();
        self.actors.insert(key.clone(), addr.clone());
        addr
    }

    pub fn get(&self, key: &K) -> Option<Addr<A>> {
        self.actors.get(key).map(|a| a.clone())
    }

    pub fn remove(&self, key: &K) -> Option<Addr<A>> {
        self.actors.remove(key).map(|(_, a)| a)
    }

    pub fn len(&self) -> usize {
        self.actors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.actors.is_empty()
    }

    /// Every live actor.
    pub fn all(&self) -> Vec<Addr<A>> {
        self.actors
            .iter()
            .map(|entry| entry.value().clone())
            .collect()
    }
}

impl<A: Actor> Registry<A, ObjectRef> {
    /// The actors of the objects in `namespace`.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Addr<A>> {
        self.actors
            .iter()
            .filter(|entry| entry.key().namespace == namespace)
            .map(|entry| entry.value().clone())
            .collect()
    }
}

//! What every actor of the manager shares: the apiserver client, the applier and the managed-object cache.

use kube::Client;

use crate::applier::Applier;
use crate::object_cache::ObjectCache;

/// Shared handles; cheap to clone.
#[derive(Clone)]
pub struct ManagerContext {
    pub client: Client,
    pub applier: Applier,
    pub cache: ObjectCache,
}

impl ManagerContext {
    pub fn new(client: Client) -> Self {
        Self {
            applier: Applier::new(client.clone()),
            cache: ObjectCache::new(client.clone()),
            client,
        }
    }
}

//! What every actor of the manager shares: the apiserver client, the applier and the managed-object cache.

use std::sync::Arc;

use kube::Client;

use crate::applier::Applier;
use crate::object_cache::ObjectCache;
use crate::package::image::ImageStore;
use crate::pull_secrets::PullSecretSource;

/// Shared handles; cheap to clone.
#[derive(Clone)]
pub struct ManagerContext {
    pub client: Client,
    pub applier: Applier,
    pub cache: ObjectCache,
    /// Package images, cached by digest for the whole manager.
    pub images: Arc<ImageStore>,
    /// Whose pull secrets authenticate package pulls.
    pub pull_secrets: PullSecretSource,
}

impl ManagerContext {
    /// `plain_http_registries` are reached over HTTP instead of HTTPS (local registries).
    pub fn new(
        client: Client,
        plain_http_registries: Vec<String>,
        pull_secrets: PullSecretSource,
    ) -> Self {
        Self {
            applier: Applier::new(client.clone()),
            cache: ObjectCache::new(client.clone()),
            images: Arc::new(ImageStore::new(plain_http_registries)),
            pull_secrets,
            client,
        }
    }
}

//! What every actor of the manager shares: the apiserver client, the applier, the managed-object cache, the
//! package image store and, with NATS, the link to the hosted-cluster connectors.

use std::sync::Arc;

use kube::Client;

use crate::applier::Applier;
use crate::connector_link::ConnectorLink;
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
    /// NATS and the connector credentials; `None` when the manager runs without NATS (hosted-cluster
    /// phases then report that they cannot be delivered).
    pub connectors: Option<ConnectorLink>,
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
            connectors: None,
        }
    }

    /// This context, delivering hosted-cluster phases through `link`.
    pub fn with_connectors(self, link: ConnectorLink) -> Self {
        Self {
            connectors: Some(link),
            ..self
        }
    }
}

//! What every actor of the manager shares: the runtime's part (apiserver clients, feeds, Events, shard
//! membership), the applier, the managed-object cache, the package image store, every metric and, with
//! NATS, the link to the hosted-cluster connectors.

use std::sync::Arc;

use kube::Client;

use crate::engine::notifications::notification_sink::NotificationSink;
use crate::engine::notifications::sink_address::SinkAddressPolicy;
use crate::fleet::hub_link::{FleetMember, HubLink};
use crate::hypershift::connector_link::ConnectorLink;
use crate::metrics::managed_cache::ManagedCacheCollector;
use crate::metrics::manager_metrics::ManagerMetrics;
use crate::metrics::package_images::ImageStoreCollector;
use crate::notifications::notification_sinks::NotificationSinks;
use crate::objects::applier::Applier;
use crate::objects::object_cache::ObjectCache;
use crate::objects::revision_index::RevisionIndex;
use crate::packages::cluster_facts::ClusterFacts;
use crate::packages::pull_secrets::PullSecretSource;
use crate::rollout::health_queries::PrometheusQueries;
use crate::rollout::hosted_cluster_index::{PreflightSettings, RolloutShared};
use crate::rollout::rollout_publisher::RolloutPublisher;
use crate::runtime::event_sink::EventSink;
use crate::runtime::feed_sync::FeedSync;
use crate::runtime::initial_lists::InitialLists;
use crate::runtime::runtime_context::{RuntimeContext, ShardContext, SharedContext};
use crate::runtime::takeover_lists::TakeoverLists;
use pko_package::image::ImageStore;
use pko_package::image_limits::ImageLimits;

/// Shared handles; cheap to clone.
#[derive(Clone)]
pub struct ManagerContext {
    /// What the runtime (the shell and the feeds) reads.
    pub runtime: RuntimeContext,
    pub applier: Applier,
    pub cache: ObjectCache,
    /// Every ObjectDeployment's ObjectSets as its reconcile reads them, fed by the ObjectSet watches.
    pub revisions: RevisionIndex,
    /// Package images, cached by digest for the whole manager.
    pub images: Arc<ImageStore>,
    /// Whose pull secrets authenticate package pulls.
    pub pull_secrets: PullSecretSource,
    /// What the cluster says about itself for `.environment`, shared by every render.
    pub cluster_facts: ClusterFacts,
    /// NATS and the connector credentials; `None` when the manager runs without NATS (hosted-cluster
    /// phases then report that they cannot be delivered).
    pub connectors: Option<ConnectorLink>,
    /// The HostedClusters and event publisher every HostedClusterPackage actor shares.
    pub rollouts: RolloutShared,
    /// Every metric the manager exposes.
    pub metrics: ManagerMetrics,
    /// `--default-service-account`: the ServiceAccount namespaced owners act as unless they name their own
    /// (`objects::owner_identity`); `None` keeps the manager's identity for them.
    pub default_service_account: Option<Arc<str>>,
}

impl ManagerContext {
    /// `plain_http_registries` are reached over HTTP instead of HTTPS (local registries); package images
    /// are unpacked within `image_limits`.
    /// `metrics` is the registry the process serves; the cache, the image store and the applier add
    /// their metrics to it here.
    pub fn new(
        client: Client,
        plain_http_registries: Vec<String>,
        image_limits: ImageLimits,
        pull_secrets: PullSecretSource,
        metrics: ManagerMetrics,
    ) -> Self {
        let applier = Applier::new(client.clone());
        let cache = ObjectCache::new(client.clone());
        let images = Arc::new(ImageStore::with_limits(plain_http_registries, image_limits));
        applier.register_metrics(&metrics);
        metrics.add_collector(Box::new(ManagedCacheCollector(cache.clone())));
        metrics.register(
            "pko_managed_cache_foreign_objects",
            "Watched objects with pko's cache label that were not held: no owner running here controls them.",
            cache.foreign_objects(),
        );
        metrics.add_collector(Box::new(ImageStoreCollector(images.clone())));
        let events = EventSink::start(client.clone());
        metrics.register(
            "pko_events_dropped",
            "Kubernetes Events dropped because the queue of Events waiting to be published was full.",
            events.dropped(),
        );
        Self {
            runtime: RuntimeContext {
                events,
                watch_client: client.clone(),
                initial_lists: InitialLists::default(),
                client,
                feeds: FeedSync::default(),
                shard: None,
                metrics: metrics.runtime.clone(),
            },
            applier,
            cache,
            revisions: RevisionIndex::default(),
            images,
            pull_secrets,
            cluster_facts: ClusterFacts::default(),
            connectors: None,
            rollouts: RolloutShared::default(),
            metrics,
            default_service_account: None,
        }
    }

    /// This context, acting for namespaced owners as their namespace's ServiceAccount `name`.
    pub fn with_default_service_account(self, name: Option<String>) -> Self {
        Self {
            default_service_account: name.map(Arc::from),
            ..self
        }
    }

    /// This context, listing and watching through `client` (by default the actors' client).
    pub fn with_watch_client(self, client: Client) -> Self {
        Self {
            runtime: RuntimeContext {
                watch_client: client,
                ..self.runtime
            },
            ..self
        }
    }

    /// This context, its watches starting with `lists` (the feeds' and the managed-object cache's).
    pub fn with_initial_lists(self, lists: InitialLists) -> Self {
        Self {
            runtime: RuntimeContext {
                initial_lists: lists,
                ..self.runtime
            },
            cache: self.cache.with_initial_lists(lists),
            ..self
        }
    }

    /// This context for a sharded replica named `member`, seeing the members through `view`.
    pub fn sharded(
        self,
        member: &str,
        view: tokio::sync::watch::Receiver<crate::engine::sharding::shard_assignment::ShardView>,
    ) -> Self {
        Self {
            runtime: RuntimeContext {
                shard: Some(ShardContext {
                    member: Arc::from(member),
                    view,
                    lists: TakeoverLists::new(self.metrics.shards.clone()),
                }),
                ..self.runtime
            },
            ..self
        }
    }

    /// This context, delivering hosted-cluster phases through `link`.
    /// Rollout events go to JetStream on the same NATS, named as coming from `source`, through an outbox
    /// of `outbox_capacity` events.
    pub fn with_connectors(
        self,
        link: ConnectorLink,
        source: String,
        outbox_capacity: usize,
    ) -> Self {
        let publisher =
            RolloutPublisher::start(link.nats.clone(), outbox_capacity, self.metrics.clone());
        let rollouts = RolloutShared {
            publisher: Some(publisher),
            source,
            ..self.rollouts
        };
        Self {
            connectors: Some(link),
            rollouts,
            ..self
        }
    }

    /// This context in a fleet of management clusters: `member` names it, and its NATS (the connectors'
    /// one, a leaf node of the fleet's hub) reaches the hub. Call after [`ManagerContext::with_connectors`].
    pub fn in_fleet(self, member: FleetMember) -> Self {
        let Some(link) = &self.connectors else {
            return self;
        };
        let hub = HubLink::start(link.nats.clone(), member, self.metrics.fleet.clone());
        let rollouts = RolloutShared {
            hub: Some(hub),
            ..self.rollouts
        };
        Self { rollouts, ..self }
    }

    /// This context, running HostedClusterPackage release preflights with `settings`.
    pub fn with_preflight(self, settings: PreflightSettings) -> Self {
        let rollouts = RolloutShared {
            preflight: settings,
            ..self.rollouts
        };
        Self { rollouts, ..self }
    }

    /// This context, delivering rollout events to CloudEvents sinks (those of HostedClusterPackages and,
    /// if given, `manager_wide`), with credentials from the Secrets of `namespace`, reaching only the
    /// addresses `addresses` allows. Call after [`ManagerContext::with_connectors`]; without NATS there
    /// is no stream to deliver from.
    pub fn with_notifications(
        self,
        namespace: &str,
        manager_wide: Option<NotificationSink>,
        addresses: SinkAddressPolicy,
    ) -> Result<Self, String> {
        let Some(link) = &self.connectors else {
            return match manager_wide {
                Some(_) => Err("--cloudevents-sink needs NATS (--nats-url): sinks read the rollout event stream".to_owned()),
                None => Ok(self),
            };
        };
        let sinks = NotificationSinks::new(
            link.nats.clone(),
            self.runtime.client.clone(),
            namespace,
            self.metrics.notifications.clone(),
            addresses,
        )?;
        if let Some(sink) = manager_wide {
            sinks.serve_manager_wide(sink);
        }
        let rollouts = RolloutShared {
            sinks: Some(sinks),
            ..self.rollouts
        };
        Ok(Self { rollouts, ..self })
    }

    /// This context, evaluating rollout health checks against `prometheus`.
    pub fn with_health_checks(self, prometheus: PrometheusQueries) -> Self {
        let rollouts = RolloutShared {
            prometheus: Some(prometheus),
            ..self.rollouts
        };
        Self { rollouts, ..self }
    }
}

impl SharedContext for ManagerContext {
    fn runtime(&self) -> &RuntimeContext {
        &self.runtime
    }
}

//! The shard coordinator (sharded mode; one replica runs it, the holder of the manager's Lease): it keeps
//! the shard labels of every object pko reconciles as `engine::shard_assignment::coordinate` says for the
//! live members — labels new objects for their key's owner, drains keys whose owner changed, and labels
//! them for the new owner once the old one let go. It reads metadata only (no specs or statuses in its
//! cache) and writes nothing but the two shard labels. Which replica works on what is decided by the labels
//! alone; the replicas' feeds follow them.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use futures::stream::{self, BoxStream, StreamExt};
use futures::FutureExt;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource};
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::core::object_deployment::{ClusterObjectDeployment, ObjectDeployment};
use pko_proto::core::object_set::{ClusterObjectSet, ObjectSet};
use pko_proto::core::object_set_phase::{ClusterObjectSetPhase, ObjectSetPhase};
use pko_proto::core::object_template::{ClusterObjectTemplate, ObjectTemplate};
use pko_proto::core::package::{ClusterPackage, Package};
use pko_proto::hypershift::HostedCluster;
use pko_proto::well_known::{PHASE_CLASS_LABEL, SHARD_DRAIN_LABEL, SHARD_OWNER_LABEL};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::engine::shard_assignment::{coordinate, LabelAction, Member, Placement, ShardKey};
use crate::metrics::shard_metrics::ShardMetrics;

/// Label writes in flight at once: a take-over relabels a departed replica's whole share, and the
/// manager's client allows 32 requests at once (`--max-in-flight-requests`).
const WRITE_CONCURRENCY: usize = 32;

/// One object the coordinator keeps labelled.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct ObjectId {
    /// Index into the watched kinds.
    kind: usize,
    namespace: Option<String>,
    name: String,
}

/// A kind whose objects are sharded, and how an object of it maps to its shard key.
struct ShardedKind {
    resource: ApiResource,
    /// HostedClusters belong to their HCP namespace's key, not to their own namespace's.
    hosted_cluster: bool,
}

fn kinds() -> Vec<ShardedKind> {
    let kind = |resource: ApiResource| ShardedKind {
        resource,
        hosted_cluster: false,
    };
    vec![
        kind(ApiResource::erase::<Package>(&())),
        kind(ApiResource::erase::<ClusterPackage>(&())),
        kind(ApiResource::erase::<ObjectDeployment>(&())),
        kind(ApiResource::erase::<ClusterObjectDeployment>(&())),
        kind(ApiResource::erase::<ObjectSet>(&())),
        kind(ApiResource::erase::<ClusterObjectSet>(&())),
        kind(ApiResource::erase::<ObjectSetPhase>(&())),
        kind(ApiResource::erase::<ClusterObjectSetPhase>(&())),
        kind(ApiResource::erase::<ObjectTemplate>(&())),
        kind(ApiResource::erase::<ClusterObjectTemplate>(&())),
        kind(ApiResource::erase::<HostedClusterPackage>(&())),
        ShardedKind {
            resource: ApiResource::erase::<HostedCluster>(&()),
            hosted_cluster: true,
        },
    ]
}

type Meta = PartialObjectMeta<DynamicObject>;

/// One watch event of the kind at this index into [`kinds`].
type KindEvent = (usize, Result<Event<Meta>, watcher::Error>);

/// The objects of each key and their labels.
#[derive(Default)]
struct Placements {
    keys: BTreeMap<ShardKey, BTreeMap<ObjectId, Placement>>,
    by_object: BTreeMap<ObjectId, ShardKey>,
    /// Objects listed since a kind's re-list began.
    relisted: BTreeMap<usize, HashSet<ObjectId>>,
}

impl Placements {
    fn upsert(&mut self, id: ObjectId, key: ShardKey, placement: Placement) -> ShardKey {
        if let Some(listed) = self.relisted.get_mut(&id.kind) {
            listed.insert(id.clone());
        }
        self.by_object.insert(id.clone(), key.clone());
        self.keys
            .entry(key.clone())
            .or_default()
            .insert(id, placement);
        key
    }

    fn remove(&mut self, id: &ObjectId) -> Option<ShardKey> {
        let key = self.by_object.remove(id)?;
        if let Some(objects) = self.keys.get_mut(&key) {
            objects.remove(id);
            if objects.is_empty() {
                self.keys.remove(&key);
            }
        }
        Some(key)
    }

    /// Keys labelled for each member (a key counts for every member one of its objects is labelled for).
    fn held_by_member(&self) -> BTreeMap<Member, usize> {
        let mut held = BTreeMap::new();
        for objects in self.keys.values() {
            let holders: BTreeSet<&Member> =
                objects.values().filter_map(|p| p.holder.as_ref()).collect();
            for holder in holders {
                *held.entry(holder.clone()).or_default() += 1;
            }
        }
        held
    }

    /// Ends a kind's re-list: what it did not list is gone.
    fn relist_done(&mut self, kind: usize) -> Vec<ShardKey> {
        let Some(listed) = self.relisted.remove(&kind) else {
            return Vec::new();
        };
        let gone: Vec<ObjectId> = self
            .by_object
            .keys()
            .filter(|id| id.kind == kind && !listed.contains(*id))
            .cloned()
            .collect();
        gone.iter().filter_map(|id| self.remove(id)).collect()
    }
}

/// Runs the coordinator until the process ends.
pub async fn run(
    client: Client,
    members: watch::Receiver<BTreeSet<Member>>,
    metrics: ShardMetrics,
) {
    let kinds = kinds();
    let streams: Vec<BoxStream<'static, KindEvent>> = kinds
        .iter()
        .enumerate()
        .map(|(index, kind)| {
            // Metadata only: the coordinator's cache holds no specs or statuses.
            let api: Api<Meta> = Api::all_with(client.clone(), &kind.resource);
            watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .map(move |event| (index, event))
                .boxed()
        })
        .collect();
    let mut events = stream::select_all(streams);
    let mut members = members;
    let mut placements = Placements::default();
    let mut dirty: BTreeSet<ShardKey> = BTreeSet::new();
    let mut known_members = members.borrow().clone();
    // Members that left, since when: their take-over ends when no key is labelled for them any more.
    let mut departed: BTreeMap<Member, Instant> = BTreeMap::new();
    info!("coordinating shards");
    loop {
        tokio::select! {
            event = events.next() => {
                let Some((kind, event)) = event else { return };
                absorb(&kinds, &mut placements, &mut dirty, kind, event);
                // A burst of events (a re-list, a rollout) is coordinated in one pass.
                while let Some(Some((kind, event))) = events.next().now_or_never() {
                    absorb(&kinds, &mut placements, &mut dirty, kind, event);
                }
            }
            changed = members.changed() => {
                if changed.is_err() {
                    return;
                }
                let now = members.borrow().clone();
                info!(members = ?now, "shard members changed");
                for gone in known_members.difference(&now) {
                    departed.insert(gone.clone(), Instant::now());
                }
                for back in &now {
                    departed.remove(back);
                }
                known_members = now;
                dirty.extend(placements.keys.keys().cloned());
            }
        }
        let live = members.borrow().clone();
        let writes: Vec<(ObjectId, LabelAction)> = std::mem::take(&mut dirty)
            .into_iter()
            .filter_map(|key| {
                let objects = placements.keys.get(&key)?;
                let current: Vec<Placement> = objects.values().cloned().collect();
                let actions = coordinate(&key, &current, &live);
                Some(
                    objects
                        .keys()
                        .cloned()
                        .zip(actions)
                        .filter_map(|(id, action)| Some((id, action?)))
                        .collect::<Vec<_>>(),
                )
            })
            .flatten()
            .collect();
        write_labels(&client, &kinds, writes, &metrics).await;
        let held = placements.held_by_member();
        metrics.keys_held(&held);
        departed.retain(|member, since| {
            let still_held = held.contains_key(member);
            if !still_held {
                metrics.taken_over(since.elapsed().as_secs_f64());
            }
            still_held
        });
    }
}

/// Takes one watch event into the placements; the keys it touched become dirty.
fn absorb(
    kinds: &[ShardedKind],
    placements: &mut Placements,
    dirty: &mut BTreeSet<ShardKey>,
    kind: usize,
    event: Result<Event<Meta>, watcher::Error>,
) {
    match event {
        Ok(Event::Apply(meta) | Event::InitApply(meta)) => {
            if let Some((id, key, placement)) = observed(kinds, kind, &meta) {
                dirty.insert(placements.upsert(id, key, placement));
            }
        }
        Ok(Event::Delete(meta)) => {
            if let Some((id, _, _)) = observed(kinds, kind, &meta) {
                dirty.extend(placements.remove(&id));
            }
        }
        Ok(Event::Init) => {
            placements.relisted.insert(kind, HashSet::new());
        }
        Ok(Event::InitDone) => dirty.extend(placements.relist_done(kind)),
        Err(error) => warn!(%error, "shard coordinator watch"),
    }
}

/// The object, its key and its labels, for the objects the coordinator keeps labelled.
fn observed(
    kinds: &[ShardedKind],
    kind: usize,
    meta: &Meta,
) -> Option<(ObjectId, ShardKey, Placement)> {
    let sharded = &kinds[kind];
    let name = meta.meta().name.clone()?;
    let namespace = meta.meta().namespace.clone();
    let labels = meta.meta().labels.as_ref();
    let label = |l: &str| labels.and_then(|ls| ls.get(l)).cloned();
    // ObjectSetPhases of other classes belong to other controllers.
    if sharded.resource.kind.ends_with("ObjectSetPhase")
        && !matches!(
            label(PHASE_CLASS_LABEL).as_deref(),
            None | Some("default" | "hosted-cluster")
        )
    {
        return None;
    }
    let key = match (&namespace, sharded.hosted_cluster) {
        (Some(ns), true) => ShardKey::Namespace(format!("{ns}-{name}")),
        (Some(ns), false) => ShardKey::Namespace(ns.clone()),
        (None, _) => ShardKey::Cluster {
            kind: sharded.resource.kind.clone(),
            name: name.clone(),
        },
    };
    let placement = Placement::from_labels(labels);
    Some((
        ObjectId {
            kind,
            namespace,
            name,
        },
        key,
        placement,
    ))
}

async fn write_labels(
    client: &Client,
    kinds: &[ShardedKind],
    writes: Vec<(ObjectId, LabelAction)>,
    metrics: &ShardMetrics,
) {
    stream::iter(writes)
        .for_each_concurrent(WRITE_CONCURRENCY, |(id, action)| async move {
            let resource = &kinds[id.kind].resource;
            let api: Api<DynamicObject> = match &id.namespace {
                Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
                None => Api::all_with(client.clone(), resource),
            };
            let labels = match &action {
                LabelAction::Assign(member) => {
                    serde_json::json!({SHARD_OWNER_LABEL: member, SHARD_DRAIN_LABEL: null})
                }
                LabelAction::Drain => serde_json::json!({SHARD_DRAIN_LABEL: "true"}),
            };
            let patch = serde_json::json!({"metadata": {"labels": labels}});
            let written = tokio::time::timeout(
                Duration::from_secs(10),
                api.patch(&id.name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await;
            match written {
                Ok(Ok(_)) => metrics.label_written(matches!(action, LabelAction::Drain)),
                // Deleted meanwhile.
                Ok(Err(kube::Error::Api(e))) if e.code == 404 => {}
                Ok(Err(error)) => warn!(object = %id.name, %error, "writing shard labels"),
                Err(_) => warn!(object = %id.name, "writing shard labels timed out"),
            }
        })
        .await;
}

//! The coordinator's background relabelling of taken-over objects: each written, a few at a time, a
//! while after it was decided, and only over the labels it was decided from. It decides nothing itself:
//! the coordinator queues what `coordinate` says and drops what it decides otherwise.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use pko_proto::well_known::{SHARD_DRAIN_LABEL, SHARD_OWNER_LABEL};
use tracing::warn;

use crate::engine::sharding::shard_assignment::{Member, Placement};
use crate::runtime::shard_metrics::ShardMetrics;

/// How long any one request of the coordinator may take. Its client has no read timeout (watches stay
/// open), and one request hung on a stalled connection would otherwise hold its loop, and every label
/// with it, for good while the process keeps the coordinator's Lease.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Relabels of taken-over objects in flight at once: they move no work (the successor already works on
/// them), so they yield the apiserver to the successors' re-lists and reconciles.
const RELABEL_CONCURRENCY: usize = 4;
/// How long a relabel waits after it is queued: a take-over queues the departed member's whole share at
/// once, while the successors list that share; their lists come first (`takeover_lists`).
const RELABEL_DELAY: Duration = Duration::from_secs(10);

/// Relabels taken-over objects for their successor, a few at a time, off the coordinator's loop (so new
/// objects and drains are labelled meanwhile). An object is queued once, until the coordinator sees its
/// label settled (or its write failed: then the next pass over its key queues it again). Relabelling for
/// the member that works on an object moves no work: a label naming a successor that departed in turn
/// resolves to the same worker through that successor's own record.
///
/// A relabel is written [`RELABEL_DELAY`] after it was decided, and much can happen in between: a new
/// member joins, the key is drained, released and labelled for it. So a queued relabel is dropped once the
/// coordinator decided anything else for the object (its ticket is gone), and otherwise written only over
/// the labels it was decided from: it reads the object's metadata, checks the departed member's label
/// is still there without a drain mark, and writes with that resourceVersion as a precondition. A stale
/// relabel once handed a key back to the successor after it had gone to a new member, and two replicas
/// wrote the key (the chaos run, seed 113).
pub(super) struct BackgroundRelabel<K> {
    queue: tokio::sync::mpsc::UnboundedSender<QueuedRelabel<K>>,
    /// The ticket of each object's queued relabel.
    queued: std::sync::Arc<std::sync::Mutex<HashMap<K, u64>>>,
    tickets: std::sync::atomic::AtomicU64,
}

/// One relabel waiting its turn: the object, the departed member it is labelled for, its successor.
struct QueuedRelabel<K> {
    /// The coordinator's own key of the object.
    id: K,
    namespace: Option<String>,
    name: String,
    resource: ApiResource,
    departed: Member,
    successor: Member,
    ticket: u64,
    at: Instant,
}

impl<K: Clone + Eq + Hash + Send + Sync + 'static> BackgroundRelabel<K> {
    pub(super) fn start(client: Client, metrics: ShardMetrics) -> Self {
        let (queue, receiver) = tokio::sync::mpsc::unbounded_channel();
        let queued = std::sync::Arc::new(std::sync::Mutex::new(HashMap::new()));
        let done = queued.clone();
        let items = stream::unfold(receiver, |mut receiver| async move {
            let item = receiver.recv().await?;
            Some((item, receiver))
        });
        tokio::spawn(items.for_each_concurrent(
            RELABEL_CONCURRENCY,
            move |item: QueuedRelabel<K>| {
                let (client, metrics, done) = (client.clone(), metrics.clone(), done.clone());
                async move {
                    tokio::time::sleep_until((item.at + RELABEL_DELAY).into()).await;
                    let current = |done: &std::sync::Mutex<HashMap<K, u64>>| {
                        done.lock()
                            .is_ok_and(|q| q.get(&item.id) == Some(&item.ticket))
                    };
                    if !current(&done) {
                        return;
                    }
                    if !relabel_unchanged(&client, &item, &metrics).await {
                        if let Ok(mut queued) = done.lock() {
                            if queued.get(&item.id) == Some(&item.ticket) {
                                queued.remove(&item.id);
                            }
                        }
                    }
                }
            },
        ));
        Self {
            queue,
            queued,
            tickets: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The coordinator saw `id` needing no background relabel (any more): a queued one is dropped.
    pub(super) fn settled(&self, id: &K) {
        if let Ok(mut queued) = self.queued.lock() {
            queued.remove(id);
        }
    }

    /// Queues relabelling object `id` (`namespace`/`name` of `resource`), labelled for `departed`, for
    /// `successor`, unless one is queued already.
    pub(super) fn queue(
        &self,
        id: &K,
        (namespace, name): (Option<&str>, &str),
        resource: &ApiResource,
        departed: Member,
        successor: Member,
    ) {
        let Ok(mut queued) = self.queued.lock() else {
            return;
        };
        if queued.contains_key(id) {
            return;
        }
        let ticket = self
            .tickets
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        queued.insert(id.clone(), ticket);
        let item = QueuedRelabel {
            id: id.clone(),
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
            resource: resource.clone(),
            departed,
            successor,
            ticket,
            at: Instant::now(),
        };
        if self.queue.send(item).is_err() {
            queued.remove(id);
        }
    }
}

/// Writes a queued relabel if the object still carries the labels it was decided from; false when it
/// was not written and the coordinator's next pass over the key should decide again (the labels
/// changed, the precondition failed, or the request did).
async fn relabel_unchanged<K>(
    client: &Client,
    item: &QueuedRelabel<K>,
    metrics: &ShardMetrics,
) -> bool {
    let api: Api<DynamicObject> = match &item.namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &item.resource),
        None => Api::all_with(client.clone(), &item.resource),
    };
    let read = tokio::time::timeout(REQUEST_TIMEOUT, api.get_metadata_opt(&item.name)).await;
    let meta = match read {
        Ok(Ok(Some(meta))) => meta.metadata,
        // Deleted meanwhile: nothing to relabel.
        Ok(Ok(None)) => return true,
        Ok(Err(error)) => {
            warn!(object = %item.name, %error, "reading an object to relabel");
            return false;
        }
        Err(_) => {
            warn!(object = %item.name, "reading an object to relabel timed out");
            return false;
        }
    };
    let placement = Placement::from_labels(meta.labels.as_ref());
    if placement.holder.as_ref() != Some(&item.departed) || placement.draining {
        return false;
    }
    let patch = serde_json::json!({"metadata": {
        "resourceVersion": meta.resource_version,
        "labels": {SHARD_OWNER_LABEL: item.successor, SHARD_DRAIN_LABEL: null},
    }});
    let written = tokio::time::timeout(
        REQUEST_TIMEOUT,
        api.patch(&item.name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await;
    match written {
        Ok(Ok(_)) => {
            metrics.label_written(false);
            true
        }
        Ok(Err(kube::Error::Api(e))) if e.code == 404 => true,
        // Written by someone since it was read: the next pass decides from what it then sees.
        Ok(Err(kube::Error::Api(e))) if e.code == 409 => false,
        Ok(Err(error)) => {
            warn!(object = %item.name, %error, "relabelling a taken-over object");
            false
        }
        Err(_) => {
            warn!(object = %item.name, "relabelling a taken-over object timed out");
            false
        }
    }
}

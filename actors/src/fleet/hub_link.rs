//! This manager's link to the fleet's hub NATS, through its own NATS (a leaf node of the hub): it
//! announces the cluster (name and labels), writes the records of the rollouts it runs, and follows every
//! cluster's records for the promotion gates. The hub's buckets and aggregate stream belong to the fleet's
//! administrators (`pko-manager nats-bootstrap fleet`); the hub lets this cluster write only its own
//! records, into its own bucket, which the shared bucket it reads sources. Nothing here decides a gate (`engine::fleet::promotion_gate` does) or blocks a rollout on
//! the hub: readers get a snapshot of what was last read and whether the hub answers now.
//!
//! Everything goes through JetStream's domain prefix (`$JS.<hub>.API`), so the manager needs no
//! connection of its own to the hub: when the leaf's link to the hub is down, the rollout events still go
//! to the local stream and the hub's aggregate catches up from it once the link is back.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use pko_proto::fleet::{
    cluster_key, member_bucket, rollout_key, FleetRecords, FleetRolloutRecord,
    ManagementClusterRecord, RECORD_VERSION, STATE_BUCKET,
};
use tokio::sync::{watch, Notify};
use tracing::{info, warn};

use crate::engine::fleet::promotion_gate::{HubState, HubView, RecordSighting, RECORD_HEARTBEAT};
use crate::metrics::fleet_metrics::FleetMetrics;
use crate::runtime::observer_clock::ObserverClock;

/// How often the hub is asked whether it answers.
const PROBE_INTERVAL: Duration = Duration::from_secs(2);
/// How long one answer may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The least time between two passes writing records: a rollout's counts change with every Package, and
/// each write wakes every gated supervisor of the fleet that reads the record; what changed meanwhile
/// goes out together.
const RECORD_COALESCE: Duration = Duration::from_secs(1);

/// Who this manager is in the fleet.
#[derive(Debug, Clone)]
pub struct FleetMember {
    /// The management cluster's name: its JetStream domain and its name in every record and event.
    pub cluster: String,
    /// What promotion gates elsewhere select it by.
    pub labels: BTreeMap<String, String>,
    /// The hub's JetStream domain.
    pub hub_domain: String,
}

/// What was last read from the hub, and whether it answers.
struct HubRecords {
    state: HubState,
    read: FleetRecords,
    /// When this manager saw each rollout record written and settled, by (HostedClusterPackage,
    /// cluster): the gates' ages and soaks.
    sightings: BTreeMap<(String, String), RecordSighting>,
    /// This cluster's own bucket as the probe last found it; `None` while the hub does not answer. The
    /// writer uses it rather than looking the bucket up again on every pass.
    bucket: Option<kv::Store>,
}

/// A record this manager keeps at the hub, and when it was last written there.
struct OwnRecord {
    record: FleetRolloutRecord,
    written: Option<Instant>,
    /// The newest record is not at the hub yet.
    dirty: bool,
}

/// Shared by every HostedClusterPackage supervisor of the manager.
pub struct HubLink {
    member: FleetMember,
    records: Mutex<HubRecords>,
    own: Mutex<BTreeMap<String, OwnRecord>>,
    /// Bumped whenever what the gates read changes.
    changed: watch::Sender<u64>,
    /// A record was reported or forgotten.
    reported: Notify,
    metrics: FleetMetrics,
    /// When this manager saw records, for their ages and soaks.
    clock: ObserverClock,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under these locks is one call: a panic elsewhere cannot leave them half-changed.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl HubLink {
    /// Starts following the hub over `nats` (this cluster's own NATS) on the current runtime.
    pub fn start(
        nats: async_nats::Client,
        member: FleetMember,
        metrics: FleetMetrics,
    ) -> Arc<Self> {
        let (changed, _) = watch::channel(0);
        let link = Arc::new(Self {
            member,
            records: Mutex::new(HubRecords {
                state: HubState::Unreachable {
                    since: Timestamp::now(),
                    error: "not reached yet".to_owned(),
                },
                read: FleetRecords::default(),
                sightings: BTreeMap::new(),
                bucket: None,
            }),
            own: Mutex::new(BTreeMap::new()),
            changed,
            reported: Notify::new(),
            metrics,
            clock: ObserverClock::start(),
        });
        link.metrics.hub_reachable(false);
        tokio::spawn(link.clone().follow(nats.clone()));
        tokio::spawn(link.clone().write_records());
        link
    }

    pub fn cluster(&self) -> &str {
        &self.member.cluster
    }

    pub fn metrics(&self) -> &FleetMetrics {
        &self.metrics
    }

    /// What the hub holds of `hosted_cluster_package`'s rollouts, aged by when this manager saw them,
    /// and whether it answers.
    pub fn view(&self, hosted_cluster_package: &str) -> HubView {
        let now = self.clock.now_ms();
        let records = lock(&self.records);
        HubView {
            state: records.state.clone(),
            clusters: records.read.clusters.clone(),
            rollouts: records
                .read
                .rollouts
                .iter()
                .filter(|((name, _), _)| name == hosted_cluster_package)
                .filter_map(|(id, record)| {
                    let seen = records.sightings.get(id)?;
                    Some((id.1.clone(), seen.observed(record.clone(), now)))
                })
                .collect(),
        }
    }

    /// Wakes on every change of what [`HubLink::view`] returns.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// This manager's last record of `hosted_cluster_package`: at the hub, or reported and not there yet.
    pub fn own_record(&self, hosted_cluster_package: &str) -> Option<FleetRolloutRecord> {
        if let Some(own) = lock(&self.own).get(hosted_cluster_package) {
            return Some(own.record.clone());
        }
        lock(&self.records)
            .read
            .rollouts
            .get(&(
                hosted_cluster_package.to_owned(),
                self.member.cluster.clone(),
            ))
            .cloned()
    }

    /// Keeps `record` at the hub: written at once when it says something new, else at the heartbeat.
    pub fn report(&self, record: FleetRolloutRecord, changed: bool) {
        let mut own = lock(&self.own);
        let entry = own
            .entry(record.hosted_cluster_package.clone())
            .or_insert(OwnRecord {
                record: record.clone(),
                written: None,
                dirty: true,
            });
        entry.dirty |= changed;
        entry.record = record;
        drop(own);
        self.reported.notify_one();
    }

    /// The HostedClusterPackage is gone here: its record is no longer written (it ages out at the hub).
    pub fn forget(&self, hosted_cluster_package: &str) {
        lock(&self.own).remove(hosted_cluster_package);
    }

    fn notify(&self) {
        self.changed
            .send_modify(|version| *version = version.wrapping_add(1));
    }

    fn set_state(&self, state: HubState, bucket: Option<kv::Store>) {
        let mut records = lock(&self.records);
        records.bucket = bucket;
        let was_reachable = records.state == HubState::Reachable;
        let reachable = state == HubState::Reachable;
        if was_reachable == reachable {
            if !reachable {
                // Keep when it became unreachable; take the newest error.
                if let (
                    HubState::Unreachable { error: last, .. },
                    HubState::Unreachable { error, .. },
                ) = (&mut records.state, state)
                {
                    *last = error;
                }
            }
            return;
        }
        records.state = state;
        drop(records);
        self.metrics.hub_reachable(reachable);
        self.notify();
    }

    fn unreachable(&self, error: String) {
        let told = match &lock(&self.records).state {
            HubState::Reachable => false,
            HubState::Unreachable { error: last, .. } => *last == error,
        };
        if !told {
            warn!(hub = %self.member.hub_domain, %error, "the fleet's hub does not answer; promotion gates stay closed until it does");
        }
        self.set_state(
            HubState::Unreachable {
                since: Timestamp::now(),
                error,
            },
            None,
        );
    }

    /// Probes the hub; while it answers, keeps the aggregate stream's source and follows the records.
    async fn follow(self: Arc<Self>, nats: async_nats::Client) {
        let hub = jetstream::with_domain(nats, &self.member.hub_domain);
        let mut watching: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            match probe(&hub).await {
                Ok(()) => {
                    let back = lock(&self.records).state != HubState::Reachable;
                    if back || watching.as_ref().is_none_or(|w| w.is_finished()) {
                        if let Some(old) = watching.take() {
                            old.abort();
                        }
                        match buckets(&hub, &self.member.cluster).await {
                            Ok((shared, own)) => {
                                info!(hub = %self.member.hub_domain, "following the fleet's records at the hub");
                                self.set_state(HubState::Reachable, Some(own));
                                watching = Some(tokio::spawn(self.clone().watch_records(shared)));
                            }
                            Err(error) => self.unreachable(error),
                        }
                    }
                }
                Err(error) => {
                    if let Some(old) = watching.take() {
                        old.abort();
                    }
                    self.unreachable(error);
                }
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }

    /// Follows every record in the bucket (the last of each key first).
    async fn watch_records(self: Arc<Self>, store: kv::Store) {
        let mut entries = match store.watch_with_history(">").await {
            Ok(entries) => entries,
            Err(error) => {
                warn!(%error, "watching the fleet's records");
                return;
            }
        };
        while let Some(entry) = entries.next().await {
            match entry {
                Ok(entry) => self.record_seen(&entry),
                Err(error) => {
                    // The probe starts a new watch.
                    warn!(%error, "the watch of the fleet's records ended");
                    return;
                }
            }
        }
    }

    fn record_seen(&self, entry: &kv::Entry) {
        let now = self.clock.now_ms();
        let mut records = lock(&self.records);
        let changed = if matches!(entry.operation, kv::Operation::Put) {
            match records.read.put(&entry.key, &entry.value) {
                Ok(Some(id)) => {
                    let HubRecords {
                        read, sightings, ..
                    } = &mut *records;
                    if let Some(record) = read.rollouts.get(&id) {
                        match sightings.get_mut(&id) {
                            Some(seen) => seen.observe(record, entry.revision, now),
                            None => {
                                let seen = RecordSighting::new(record, entry.revision, now);
                                sightings.insert(id, seen);
                            }
                        }
                    }
                    true
                }
                Ok(None) => true,
                Err(error) => {
                    warn!(%error, "ignoring a fleet record");
                    false
                }
            }
        } else {
            let deleted = records.read.delete(&entry.key);
            let HubRecords {
                read, sightings, ..
            } = &mut *records;
            sightings.retain(|id, _| read.rollouts.contains_key(id));
            deleted
        };
        drop(records);
        if changed {
            self.notify();
        }
    }

    /// Writes this cluster's record and the rollout records when they change and at every heartbeat;
    /// what fails is written again at the next turn.
    async fn write_records(self: Arc<Self>) {
        let mut announced: Option<Instant> = None;
        loop {
            let due = announced.is_none_or(|at| at.elapsed() >= RECORD_HEARTBEAT);
            let bucket = lock(&self.records).bucket.clone();
            if let Some(store) = bucket {
                if due && self.announce(&store).await {
                    announced = Some(Instant::now());
                }
                self.write_rollouts(&store).await;
            }
            tokio::time::sleep(RECORD_COALESCE).await;
            // A report made meanwhile left its permit: this returns at once then.
            let reported = self.reported.notified();
            let _ = tokio::time::timeout(PROBE_INTERVAL, reported).await;
        }
    }

    async fn announce(&self, store: &kv::Store) -> bool {
        let record = ManagementClusterRecord {
            version: RECORD_VERSION,
            name: self.member.cluster.clone(),
            labels: self.member.labels.clone(),
            updated_at: Timestamp::now(),
        };
        self.put(store, &cluster_key(&self.member.cluster), &record)
            .await
    }

    async fn write_rollouts(&self, store: &kv::Store) {
        let due: Vec<FleetRolloutRecord> = lock(&self.own)
            .values()
            .filter(|own| {
                own.dirty
                    || own
                        .written
                        .is_none_or(|at| at.elapsed() >= RECORD_HEARTBEAT)
            })
            .map(|own| own.record.clone())
            .collect();
        for mut record in due {
            let name = record.hosted_cluster_package.clone();
            record.updated_at = Timestamp::now();
            let key = rollout_key(&name, &self.member.cluster);
            if self.put(store, &key, &record).await {
                if let Some(own) = lock(&self.own).get_mut(&name) {
                    own.written = Some(Instant::now());
                    own.dirty = false;
                }
            }
        }
    }

    async fn put<T: serde::Serialize>(&self, store: &kv::Store, key: &str, record: &T) -> bool {
        let body = match serde_json::to_vec(record) {
            Ok(body) => body,
            Err(error) => {
                warn!(%key, %error, "encoding a fleet record");
                return false;
            }
        };
        let written = tokio::time::timeout(REQUEST_TIMEOUT, store.put(key, body.into())).await;
        let ok = matches!(written, Ok(Ok(_)));
        self.metrics.record_written(ok);
        if !ok {
            let error = match written {
                Ok(Err(error)) => error.to_string(),
                _ => "timed out".to_owned(),
            };
            warn!(%key, %error, "writing a fleet record to the hub; trying again");
        }
        ok
    }
}

/// Asks the hub's JetStream whether it answers.
async fn probe(hub: &jetstream::Context) -> Result<(), String> {
    tokio::time::timeout(REQUEST_TIMEOUT, hub.query_account())
        .await
        .map_err(|_| "no answer within 2s".to_owned())?
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The hub's shared bucket of every cluster's records and this cluster's own bucket, which the shared
/// one sources. The fleet's administrators make both (`pko-manager nats-bootstrap fleet member`); a
/// manager may not create or change either.
async fn buckets(
    hub: &jetstream::Context,
    cluster: &str,
) -> Result<(kv::Store, kv::Store), String> {
    let open = |name: String| async move {
        tokio::time::timeout(REQUEST_TIMEOUT, hub.get_key_value(name.as_str()))
            .await
            .map_err(|_| format!("reading bucket {name}: no answer within 2s"))?
            .map_err(|e| {
                format!("bucket {name} (made by `pko-manager nats-bootstrap fleet member`): {e}")
            })
    };
    Ok((
        open(STATE_BUCKET.to_owned()).await?,
        open(member_bucket(cluster)).await?,
    ))
}

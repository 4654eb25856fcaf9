//! The sinks this manager serves: the manager-wide one (`--cloudevents-sink`) and those of the
//! HostedClusterPackages this replica supervises, one delivery task each. A supervisor says which sinks
//! its object names on every reconcile; a sink it no longer names is stopped and its consumer deleted,
//! one of an object that moved to another replica is only stopped (the consumer stays for the replica
//! that takes it over), and one of a deleted object goes with its consumer.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::engine::notifications::notification_sink::{NotificationSink, SinkScope};
use crate::engine::notifications::sink_address::SinkAddressPolicy;
use kube::Api;
use pko_proto::rollout_events::STREAM;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::metrics::notification_metrics::NotificationMetrics;
use crate::notifications::sink_delivery::{run_sink, sink_http_client, SinkServices, SinkTask};

struct RunningSink {
    task: SinkTask,
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
}

/// Shared by every HostedClusterPackage supervisor; cheap to clone behind an `Arc`.
pub struct NotificationSinks {
    services: Arc<SinkServices>,
    /// By consumer name.
    running: Mutex<BTreeMap<String, RunningSink>>,
}

impl NotificationSinks {
    /// Sinks over the rollout event stream of `nats`, reading credentials from the Secrets of
    /// `namespace` (the manager's) through `client`, reaching only the addresses `addresses` allows.
    pub fn new(
        nats: async_nats::Client,
        client: kube::Client,
        namespace: &str,
        metrics: NotificationMetrics,
        addresses: SinkAddressPolicy,
    ) -> Result<Arc<Self>, String> {
        let addresses = Arc::new(addresses);
        let http = sink_http_client(addresses.clone())
            .map_err(|e| format!("making the sinks' HTTP client: {e}"))?;
        Ok(Arc::new(Self {
            services: Arc::new(SinkServices {
                jetstream: async_nats::jetstream::new(nats),
                http,
                addresses,
                secrets: Api::namespaced(client, namespace),
                metrics,
            }),
            running: Mutex::new(BTreeMap::new()),
        }))
    }

    fn running(&self) -> MutexGuard<'_, BTreeMap<String, RunningSink>> {
        // Every change is one insert or remove: a panic elsewhere cannot leave it half-changed.
        self.running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn start(&self, task: SinkTask) -> RunningSink {
        let (stop, stopped) = watch::channel(false);
        let handle = tokio::spawn(run_sink(task.clone(), self.services.clone(), stopped));
        RunningSink { task, stop, handle }
    }

    /// Serves the manager-wide sink (every replica reads the same consumer, so each event goes once).
    pub fn serve_manager_wide(&self, sink: NotificationSink) {
        let task = SinkTask {
            label: SinkScope::Manager.label(0),
            scope: SinkScope::Manager,
            sink,
        };
        let running = self.start(task.clone());
        self.running().insert(task.consumer_name(), running);
    }

    /// HostedClusterPackage `name` (UID `uid`) names exactly `sinks`: missing ones start, changed ones
    /// restart, and those it no longer names stop and lose their consumer.
    pub fn ensure(&self, name: &str, uid: &str, sinks: &[NotificationSink]) {
        let scope = SinkScope::HostedClusterPackage {
            name: name.to_owned(),
            uid: uid.to_owned(),
        };
        let wanted: BTreeMap<String, SinkTask> = sinks
            .iter()
            .enumerate()
            .map(|(i, sink)| {
                let task = SinkTask {
                    label: scope.label(i),
                    scope: scope.clone(),
                    sink: sink.clone(),
                };
                (task.consumer_name(), task)
            })
            .collect();
        let mut running = self.running();
        for consumer in owned_by(&running, name) {
            let same = wanted.get(&consumer) == running.get(&consumer).map(|r| &r.task);
            if !same {
                if let Some(old) = running.remove(&consumer) {
                    let _ = old.stop.send(true);
                    self.services.metrics.forget(&old.task.label);
                    if !wanted.contains_key(&consumer) {
                        self.delete_consumer(consumer);
                    }
                }
            }
        }
        for (consumer, task) in wanted {
            if let std::collections::btree_map::Entry::Vacant(free) = running.entry(consumer) {
                free.insert(self.start(task));
            }
        }
    }

    /// This replica no longer supervises `name`: its sinks stop; their consumers stay for the next.
    pub fn release(&self, name: &str) {
        for stopped in self.take(name) {
            let _ = stopped.stop.send(true);
            self.services.metrics.forget(&stopped.task.label);
        }
    }

    /// `name` is deleted: its sinks stop and their consumers go.
    pub fn remove(&self, name: &str, uid: &str, sinks: &[NotificationSink]) {
        self.release(name);
        let scope = SinkScope::HostedClusterPackage {
            name: name.to_owned(),
            uid: uid.to_owned(),
        };
        for sink in sinks {
            self.delete_consumer(sink.consumer_name(&scope));
        }
    }

    fn take(&self, name: &str) -> Vec<RunningSink> {
        let mut running = self.running();
        owned_by(&running, name)
            .into_iter()
            .filter_map(|consumer| running.remove(&consumer))
            .collect()
    }

    fn delete_consumer(&self, consumer: String) {
        let jetstream = self.services.jetstream.clone();
        tokio::spawn(async move {
            let deleted = match jetstream.get_stream(STREAM).await {
                Ok(stream) => stream
                    .delete_consumer(&consumer)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(error) = deleted {
                // The server removes it after its inactivity threshold anyway.
                warn!(%consumer, %error, "deleting a CloudEvents sink's consumer");
            }
        });
    }

    /// Stops every sink, letting deliveries under way end, within `limit` (on shutdown); returns how
    /// many did not end in time.
    pub async fn drain(&self, limit: Duration) -> usize {
        let all: Vec<RunningSink> = std::mem::take(&mut *self.running()).into_values().collect();
        for sink in &all {
            let _ = sink.stop.send(true);
        }
        let deadline = tokio::time::Instant::now() + limit;
        let mut left = 0;
        for sink in all {
            if tokio::time::timeout_at(deadline, sink.handle)
                .await
                .is_err()
            {
                left += 1;
            }
        }
        left
    }
}

/// The consumers of the sinks of HostedClusterPackage `name`.
fn owned_by(running: &BTreeMap<String, RunningSink>, name: &str) -> Vec<String> {
    running
        .iter()
        .filter(|(_, r)| owner(&r.task) == Some(name))
        .map(|(consumer, _)| consumer.clone())
        .collect()
}

/// The HostedClusterPackage a sink belongs to, if not the manager's.
fn owner(task: &SinkTask) -> Option<&str> {
    match &task.scope {
        SinkScope::Manager => None,
        SinkScope::HostedClusterPackage { name, .. } => Some(name),
    }
}

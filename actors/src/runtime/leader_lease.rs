//! Leader election with a coordination.k8s.io/v1 Lease, for the manager and for replicated connectors: only
//! the holder works.
//!
//! What it must prevent is two holders writing at once. The holder renews every `retry_period` and gives
//! up `renew_deadline` after the start of its last successful renewal (client-go's defaults: 15 s Lease,
//! 10 s, 2 s). A standby times the Lease by its own monotonic clock from when it saw the Lease's record
//! last change, and takes it `duration` after that (`engine::sharding::lease_expiry`): never by comparing the
//! holder's renewTime with its own wall clock, so a skewed clock on either side cannot make two holders.
//! Giving up means two things at once: the [`WriteFence`] of the process's clients has closed (every
//! write after the deadline is refused, even by a thread that was stopped and runs again) and the process
//! exits with [`EXIT_LEASE_LOST`]. The Lease lives on a thread of its own, with its own client and a
//! timeout on every request, so busy actors and the reconciles' request queue cannot delay a renewal.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::oneshot;
use tracing::{error, info, warn};

use crate::engine::sharding::lease_expiry::{LeaseRecord, LeaseSighting};
use crate::runtime::lease_metrics::{LeaseAttempt, LeaseMetrics};
use crate::runtime::observer_clock::ObserverClock;
use crate::runtime::write_fence::WriteFence;

/// The exit code of a process that lost its Lease.
pub const EXIT_LEASE_LOST: i32 = 3;

/// Lease parameters.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// How long a Lease lasts after its renewTime.
    pub duration: Duration,
    /// How long after the start of its last successful renewal the holder gives up.
    pub renew_deadline: Duration,
    /// Time between renewals (and between attempts to acquire).
    pub retry_period: Duration,
    /// Labels the Lease is created with (a shard member's Lease is found by them).
    pub labels: std::collections::BTreeMap<String, String>,
    /// Where attempts and holding are counted.
    pub metrics: LeaseMetrics,
    /// An annotation that ends the holder's tenure once it is on the Lease: the holder neither renews nor
    /// takes it back, and gives up as if another replica held it (a shard member's take-over record: its
    /// keys went to its successors, who work on them from the moment they read it).
    pub ended_by: Option<String>,
    /// An annotation a release writes onto the Lease and the next take removes: a shard member stopping
    /// to come back under the same name keeps its Lease, released but marked, so the others wait for it
    /// instead of taking its keys over.
    pub released_mark: Option<String>,
}

/// The Lease could not be held.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("lease timing: renew deadline {deadline:?} must be shorter than the lease duration {duration:?}, and the retry period {retry:?} shorter than the deadline")]
    Timing {
        duration: Duration,
        deadline: Duration,
        retry: Duration,
    },
    #[error("lease client: {0}")]
    Client(#[source] kube::Error),
    #[error("lease thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("the lease thread ended before the lease was acquired")]
    Ended,
}

impl LeaseConfig {
    /// A Lease of `duration`, with client-go's proportions: renew deadline 2/3 of it, retry period 2/15.
    pub fn new(namespace: &str, name: &str, identity: &str, duration: Duration) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
            renew_deadline: duration * 2 / 3,
            retry_period: duration * 2 / 15,
            labels: std::collections::BTreeMap::new(),
            metrics: LeaseMetrics::default(),
            ended_by: None,
            released_mark: None,
        }
    }

    /// Whether `lease` carries the annotation that ends this holder's tenure.
    fn ended(&self, lease: &Lease) -> bool {
        self.ended_by.as_ref().is_some_and(|annotation| {
            lease
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(annotation))
        })
    }

    /// The timing is safe: the holder gives up before anyone may take over, and renews before it must.
    pub fn check(&self) -> Result<(), LeaseError> {
        if self.renew_deadline < self.duration
            && self.retry_period < self.renew_deadline
            && !self.retry_period.is_zero()
        {
            Ok(())
        } else {
            Err(LeaseError::Timing {
                duration: self.duration,
                deadline: self.renew_deadline,
                retry: self.retry_period,
            })
        }
    }
}

/// What a Lease says about its holder, as the expiry rule compares it.
pub fn lease_record(lease: &LeaseSpec) -> LeaseRecord {
    LeaseRecord {
        holder: lease.holder_identity.clone().unwrap_or_default(),
        renewed: lease
            .renew_time
            .as_ref()
            .map(|MicroTime(t)| t.to_string())
            .unwrap_or_default(),
    }
}

/// A Lease's duration in milliseconds (15 s when it names none).
pub fn lease_duration_ms(lease: &LeaseSpec) -> u64 {
    u64::try_from(lease.lease_duration_seconds.unwrap_or(15))
        .unwrap_or(15)
        .saturating_mul(1000)
}

/// Takes, renews and gives up one Lease; used on the Lease thread only.
struct LeaseClient {
    api: Api<Lease>,
    config: LeaseConfig,
    /// The Lease as last read, and when its record last changed on `clock`.
    seen: Mutex<Option<LeaseSighting>>,
    clock: ObserverClock,
}

impl LeaseClient {
    fn spec(&self, acquired: Option<MicroTime>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: i32::try_from(self.config.duration.as_secs()).ok(),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            ..LeaseSpec::default()
        }
    }

    /// One attempt to take or renew the Lease within `limit`; `Ok(false)` when another replica holds it.
    /// Counted as `success` when it succeeds.
    async fn attempt(&self, limit: Duration, success: LeaseAttempt) -> Result<bool, String> {
        let result = match tokio::time::timeout(limit, self.try_take()).await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {limit:?}")),
        };
        let outcome = match &result {
            Ok(true) => success,
            Ok(false) => LeaseAttempt::HeldElsewhere,
            Err(_) => LeaseAttempt::Failed,
        };
        self.config.metrics.attempted(&self.config.name, outcome);
        result
    }

    /// Notes the Lease as read now; whether this replica may take it (free, ours, or unchanged for its
    /// whole duration on this process's clock).
    fn may_take(&self, current: &LeaseSpec) -> bool {
        let now_ms = self.clock.now_ms();
        let record = lease_record(current);
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let sighting = seen.get_or_insert_with(|| LeaseSighting::new(record.clone(), now_ms));
        sighting.observe(record, now_ms);
        sighting.may_take(&self.config.identity, lease_duration_ms(current), now_ms)
    }

    async fn try_take(&self) -> Result<bool, kube::Error> {
        match self.api.get_opt(&self.config.name).await? {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        namespace: Some(self.config.namespace.clone()),
                        labels: (!self.config.labels.is_empty())
                            .then(|| self.config.labels.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(self.spec(None)),
                };
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(e),
                }
            }
            Some(mut lease) => {
                if self.config.ended(&lease) {
                    warn!(lease = %self.config.name, "a take-over of this replica was recorded on its Lease; giving it up");
                    return Ok(false);
                }
                let current = lease.spec.clone().unwrap_or_default();
                if !self.may_take(&current) {
                    return Ok(false);
                }
                let ours = current.holder_identity.as_deref() == Some(&self.config.identity);
                lease.spec = Some(self.spec(if ours { current.acquire_time } else { None }));
                if let (Some(mark), Some(annotations)) = (
                    self.config.released_mark.as_ref(),
                    lease.metadata.annotations.as_mut(),
                ) {
                    annotations.remove(mark);
                }
                // replace() carries the resourceVersion we read: a concurrent taker makes this fail.
                match self
                    .api
                    .replace(&self.config.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Gives the Lease up so a successor need not wait for it to expire.
    async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else {
            return;
        };
        let ours = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(&self.config.identity);
        if ours {
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = None;
            }
            if let Some(mark) = &self.config.released_mark {
                lease
                    .metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(mark.clone(), self.config.identity.clone());
            }
            let _ = self
                .api
                .replace(&self.config.name, &PostParams::default(), &lease)
                .await;
        }
    }

    /// Tries until the Lease is ours; returns the start of the successful attempt, or `None` when asked to
    /// stop first.
    async fn acquire(&self, stop: &mut oneshot::Receiver<oneshot::Sender<()>>) -> Option<Instant> {
        loop {
            let started = Instant::now();
            match self
                .attempt(self.config.retry_period, LeaseAttempt::Taken)
                .await
            {
                Ok(true) => return Some(started),
                Ok(false) => {}
                Err(e) => warn!(error = %e, "leader election attempt failed"),
            }
            tokio::select! {
                () = tokio::time::sleep(self.config.retry_period) => {}
                _ = &mut *stop => return None,
            }
        }
    }

    /// Renews until the Lease is lost (returns why) or a stop is asked for (releases it and answers).
    async fn renew(
        &self,
        mut renewed: Instant,
        fence: &WriteFence,
        stop: &mut oneshot::Receiver<oneshot::Sender<()>>,
    ) -> Option<String> {
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.config.retry_period) => {}
                asked = &mut *stop => {
                    fence.close();
                    self.config.metrics.holding(&self.config.name, false);
                    self.release().await;
                    if let Ok(done) = asked {
                        let _ = done.send(());
                    }
                    return None;
                }
            }
            let deadline = renewed + self.config.renew_deadline;
            let started = Instant::now();
            let Some(left) = deadline.checked_duration_since(started) else {
                return Some("the renew deadline passed before the next renewal".to_owned());
            };
            match self
                .attempt(left.min(self.config.retry_period), LeaseAttempt::Renewed)
                .await
            {
                Ok(true) => {
                    renewed = started;
                    fence.open_until(started + self.config.renew_deadline);
                }
                Ok(false) => {
                    return Some(
                        "another replica holds the lease, or it records this replica's end"
                            .to_owned(),
                    )
                }
                Err(e) if Instant::now() >= deadline => {
                    return Some(format!("no renewal within the renew deadline: {e}"))
                }
                Err(e) => warn!(error = %e, "lease renewal failed; retrying"),
            }
        }
    }
}

/// This replica holds the Lease; a thread of its own renews it.
pub struct LeaseHolder {
    stop: Option<oneshot::Sender<oneshot::Sender<()>>>,
}

impl LeaseHolder {
    /// Starts the Lease thread (with a client of its own from `kube`) and waits until this replica holds
    /// the Lease; `fence` is open from then until the renew deadline, moved on by every renewal. When the
    /// Lease is lost the fence closes and the process exits with [`EXIT_LEASE_LOST`].
    pub async fn acquire(
        mut kube: kube::Config,
        config: LeaseConfig,
        fence: WriteFence,
    ) -> Result<Self, LeaseError> {
        config.check()?;
        // A request that hangs must not hold a renewal past its deadline.
        kube.connect_timeout = Some(config.retry_period);
        kube.read_timeout = Some(config.retry_period);
        kube.write_timeout = Some(config.retry_period);
        let (acquired_tx, acquired) = oneshot::channel::<Result<(), LeaseError>>();
        let (stop, mut stop_rx) = oneshot::channel::<oneshot::Sender<()>>();
        let lease_name = config.name.clone();
        std::thread::Builder::new()
            .name("leader-lease".to_owned())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = acquired_tx.send(Err(LeaseError::Thread(e)));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let client = match Client::try_from(kube) {
                        Ok(client) => client,
                        Err(e) => {
                            let _ = acquired_tx.send(Err(LeaseError::Client(e)));
                            return;
                        }
                    };
                    let lease = LeaseClient {
                        api: Api::namespaced(client, &config.namespace),
                        config,
                        seen: Mutex::new(None),
                        clock: ObserverClock::start(),
                    };
                    let Some(renewed) = lease.acquire(&mut stop_rx).await else {
                        return;
                    };
                    fence.open_until(renewed + lease.config.renew_deadline);
                    lease.config.metrics.holding(&lease.config.name, true);
                    info!(lease = %lease.config.name, identity = %lease.config.identity, "became leader");
                    let _ = acquired_tx.send(Ok(()));
                    if let Some(reason) = lease.renew(renewed, &fence, &mut stop_rx).await {
                        fence.close();
                        lease.config.metrics.holding(&lease.config.name, false);
                        error!(lease = %lease.config.name, %reason, "lost the lease; exiting so another replica takes over");
                        std::process::exit(EXIT_LEASE_LOST);
                    }
                });
            })
            .map_err(LeaseError::Thread)?;
        info!(lease = %lease_name, "waiting for the lease");
        acquired.await.map_err(|_| LeaseError::Ended)??;
        Ok(Self { stop: Some(stop) })
    }

    /// Gives the Lease up (on shutdown) and waits until it is released, at most 5 s.
    pub async fn release(mut self) {
        let Some(stop) = self.stop.take() else {
            return;
        };
        let (done, released) = oneshot::channel();
        if stop.send(done).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(5), released).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_recorded_as_written_and_lasts_its_duration() {
        let spec = LeaseSpec {
            holder_identity: Some("other".into()),
            lease_duration_seconds: Some(6),
            renew_time: Some(MicroTime(Timestamp::from_second(100).unwrap())),
            ..Default::default()
        };
        let record = lease_record(&spec);
        assert_eq!(record.holder, "other");
        assert_eq!(record.renewed, "1970-01-01T00:01:40Z");
        assert_eq!(lease_duration_ms(&spec), 6_000);
        assert_eq!(lease_duration_ms(&LeaseSpec::default()), 15_000);
        assert!(lease_record(&LeaseSpec::default()).is_free());
    }

    #[test]
    fn the_holder_gives_up_before_anyone_may_take_over() {
        let config = LeaseConfig::new("ns", "lease", "me", Duration::from_secs(15));
        assert_eq!(config.renew_deadline, Duration::from_secs(10));
        assert_eq!(config.retry_period, Duration::from_secs(2));
        config.check().unwrap();
        let unsafe_deadline = LeaseConfig {
            renew_deadline: Duration::from_secs(15),
            ..config.clone()
        };
        assert!(unsafe_deadline.check().is_err());
        let no_retry = LeaseConfig {
            retry_period: Duration::ZERO,
            ..config
        };
        assert!(no_retry.check().is_err());
    }

    #[test]
    fn a_lease_carrying_the_end_annotation_ends_the_tenure() {
        let mut config = LeaseConfig::new("ns", "lease", "me", Duration::from_secs(15));
        let mut lease = Lease::default();
        lease.metadata.annotations = Some([("end/here".to_owned(), "b".to_owned())].into());
        assert!(!config.ended(&lease), "no annotation configured");
        config.ended_by = Some("end/here".to_owned());
        assert!(config.ended(&lease));
        assert!(!config.ended(&Lease::default()));
    }
}

//! Leader election with a coordination.k8s.io/v1 Lease, for the manager and for replicated connectors: only
//! the holder works. A replica that cannot renew within the lease duration exits rather than risk two
//! leaders writing the same objects.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::{Api, Client};
use tracing::{info, warn};

/// Lease parameters.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub duration: Duration,
}

impl LeaseConfig {
    fn retry_period(&self) -> Duration {
        self.duration / 3
    }
}

/// Whether `lease` may be taken by `identity` at `now`: free, ours, or expired.
pub fn may_acquire(lease: &LeaseSpec, identity: &str, now: Timestamp) -> bool {
    let holder = lease.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() || holder == identity {
        return true;
    }
    let duration = i64::from(lease.lease_duration_seconds.unwrap_or(15));
    match &lease.renew_time {
        Some(MicroTime(renewed)) => *renewed + SignedDuration::from_secs(duration) < now,
        None => true,
    }
}

/// Holds the lease once acquired; renews it in the background.
pub struct LeaderLease {
    api: Api<Lease>,
    config: LeaseConfig,
}

impl LeaderLease {
    /// Blocks until this replica holds the lease.
    pub async fn acquire(client: Client, config: LeaseConfig) -> Self {
        let api: Api<Lease> = Api::namespaced(client, &config.namespace);
        let lease = Self { api, config };
        loop {
            match lease.try_take().await {
                Ok(true) => {
                    info!(lease = %lease.config.name, identity = %lease.config.identity, "became leader");
                    return lease;
                }
                Ok(false) => {}
                Err(e) => warn!(error = %e, "leader election attempt failed"),
            }
            tokio::time::sleep(lease.config.retry_period()).await;
        }
    }

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

    /// One attempt to take or renew the lease; `Ok(false)` when another replica holds it.
    async fn try_take(&self) -> Result<bool, kube::Error> {
        match self.api.get_opt(&self.config.name).await? {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.config.name.clone()),
                        namespace: Some(self.config.namespace.clone()),
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
                let current = lease.spec.clone().unwrap_or_default();
                if !may_acquire(&current, &self.config.identity, Timestamp::now()) {
                    return Ok(false);
                }
                let ours = current.holder_identity.as_deref() == Some(&self.config.identity);
                lease.spec = Some(self.spec(if ours { current.acquire_time } else { None }));
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

    /// With a lease, renews it until it is lost and returns then (the caller exits); without one
    /// (leader election off), never returns.
    pub async fn renew_until_lost(lease: Option<&Self>) {
        match lease {
            Some(lease) => lease.keep_renewing().await,
            None => std::future::pending().await,
        }
    }

    /// Renews until the lease is lost; returns then (the caller exits).
    pub async fn keep_renewing(&self) {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.config.retry_period()).await;
            match self.try_take().await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => {
                    warn!("lease taken by another replica");
                    return;
                }
                Err(e) => {
                    warn!(error = %e, "lease renewal failed");
                    if last_renewal.elapsed() >= self.config.duration {
                        return;
                    }
                }
            }
        }
    }

    /// Gives the lease up on shutdown so a successor need not wait for it to expire.
    pub async fn release(&self) {
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await {
            let ours = lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                == Some(&self.config.identity);
            if ours {
                if let Some(spec) = lease.spec.as_mut() {
                    spec.holder_identity = None;
                }
                let _ = self
                    .api
                    .replace(&self.config.name, &PostParams::default(), &lease)
                    .await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn lease_rules() {
        let held = LeaseSpec {
            holder_identity: Some("other".into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(at(100))),
            ..Default::default()
        };
        assert!(!may_acquire(&held, "me", at(110)));
        assert!(may_acquire(&held, "me", at(116)));
        assert!(may_acquire(&held, "other", at(110)));
        assert!(may_acquire(&LeaseSpec::default(), "me", at(0)));
    }
}

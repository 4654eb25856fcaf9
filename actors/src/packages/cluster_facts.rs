//! What the cluster says about itself for `.environment` (its Kubernetes version, OpenShift's
//! ClusterVersion, the managed-OpenShift metadata and the Proxy), probed once for every render within
//! [`FACTS_MAX_AGE`] instead of once per Package and ObjectTemplate render (two to four reads each). It
//! holds no per-owner fact: the HostedCluster a render sees is added by the caller.
//!
//! The facts change with a cluster upgrade or a proxy change; upstream probes them once a minute, this
//! keeps them at most half that old, timed from when this process started the probe.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use pko_package::environment::EnvironmentFacts;
use pko_proto::hypershift::HostedCluster;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::{info_span, Instrument};

/// How old probed facts may be when a render uses them.
pub const FACTS_MAX_AGE: Duration = Duration::from_secs(30);

/// The last probe's facts, shared by every render of the manager; cheap to clone.
#[derive(Clone, Default)]
pub struct ClusterFacts {
    probed: Arc<Mutex<Option<(Instant, EnvironmentFacts)>>>,
}

impl ClusterFacts {
    /// The facts for one render, with `hosted_clusters` (the render's own HostedCluster, found by the
    /// caller in the manager's fleet: listing them per render cost N² reads for N Packages).
    pub async fn read(
        &self,
        client: &Client,
        hosted_clusters: Option<Vec<HostedCluster>>,
    ) -> Result<EnvironmentFacts, kube::Error> {
        let facts = self
            .cached(|| probe(client.clone()).instrument(info_span!("probe cluster facts")))
            .await?;
        Ok(EnvironmentFacts {
            hosted_clusters,
            ..facts
        })
    }

    /// The facts of a probe started less than [`FACTS_MAX_AGE`] ago, or of a new one. Renders that ask while a
    /// probe runs wait for it rather than probe again; a failed probe is not kept.
    async fn cached<F, Fut, E>(&self, probe: F) -> Result<EnvironmentFacts, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<EnvironmentFacts, E>>,
    {
        let mut probed = self.probed.lock().await;
        if let Some((at, facts)) = probed.as_ref() {
            if at.elapsed() < FACTS_MAX_AGE {
                return Ok(facts.clone());
            }
        }
        let started = Instant::now();
        let facts = probe().await?;
        *probed = Some((started, facts.clone()));
        Ok(facts)
    }
}

/// A 404 means the API is not served or the object does not exist: the fact is absent.
fn absent<T>(e: kube::Error) -> Result<Option<T>, kube::Error> {
    match e {
        kube::Error::Api(s) if s.code == 404 => Ok(None),
        other => Err(other),
    }
}

/// Reads the facts: each optional API that is not served (or object that does not exist) is simply
/// absent.
async fn probe(client: Client) -> Result<EnvironmentFacts, kube::Error> {
    let openshift = |kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("config.openshift.io", "v1", kind),
            plural,
        )
    };
    let cluster_version = Api::<DynamicObject>::all_with(
        client.clone(),
        &openshift("ClusterVersion", "clusterversions"),
    )
    .get("version")
    .await
    .map(|o| Some(o.data))
    .or_else(absent)?;
    let (managed_openshift, proxy) = if cluster_version.is_some() {
        let managed = Api::<ConfigMap>::namespaced(client.clone(), "openshift-config")
            .get("osd-cluster-metadata")
            .await
            .map(|cm| Some(cm.data.unwrap_or_default()))
            .or_else(absent)?;
        let proxy = Api::<DynamicObject>::all_with(client.clone(), &openshift("Proxy", "proxies"))
            .get("cluster")
            .await
            .map(|o| Some(o.data))
            .or_else(absent)?;
        (managed, proxy)
    } else {
        (None, None)
    };
    Ok(EnvironmentFacts {
        kubernetes_version: client.apiserver_version().await?.git_version,
        cluster_version,
        managed_openshift,
        proxy,
        hosted_clusters: None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn facts(version: &str) -> EnvironmentFacts {
        EnvironmentFacts {
            kubernetes_version: version.to_owned(),
            cluster_version: None,
            managed_openshift: None,
            proxy: None,
            hosted_clusters: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn renders_within_the_age_share_one_probe_and_a_failure_is_not_kept() {
        let cache = ClusterFacts::default();
        let probes = AtomicUsize::new(0);
        let probe = |version: &'static str| {
            let probes = &probes;
            move || async move {
                probes.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(facts(version))
            }
        };
        // Renders at once: the second waits for the first one's probe.
        let (a, b) = tokio::join!(cache.cached(probe("v1.30")), cache.cached(probe("v1.31")));
        assert_eq!(a.unwrap().kubernetes_version, "v1.30");
        assert_eq!(b.unwrap().kubernetes_version, "v1.30");
        assert_eq!(probes.load(Ordering::SeqCst), 1);
        tokio::time::advance(FACTS_MAX_AGE - Duration::from_millis(1)).await;
        let kept = cache.cached(probe("v1.31")).await.unwrap();
        assert_eq!(kept.kubernetes_version, "v1.30", "still young enough");
        assert_eq!(probes.load(Ordering::SeqCst), 1);
        // Once the age is reached the next render probes again and sees the upgrade.
        tokio::time::advance(Duration::from_millis(1)).await;
        let fresh = cache.cached(probe("v1.31")).await.unwrap();
        assert_eq!(fresh.kubernetes_version, "v1.31");
        assert_eq!(probes.load(Ordering::SeqCst), 2);
        // A failed probe answers its render with the error and leaves nothing behind: after the age
        // the next render probes again rather than reuse an old answer or the failure.
        tokio::time::advance(FACTS_MAX_AGE).await;
        let failed = cache
            .cached(|| async { Err::<EnvironmentFacts, _>("apiserver unreachable".to_owned()) })
            .await;
        assert_eq!(failed.unwrap_err(), "apiserver unreachable");
        let after = cache.cached(probe("v1.32")).await.unwrap();
        assert_eq!(after.kubernetes_version, "v1.32");
        assert_eq!(probes.load(Ordering::SeqCst), 3);
    }
}

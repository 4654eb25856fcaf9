//! The admission webhook's TLS identity: a private CA and a serving certificate it signs, kept in one
//! Secret that every replica shares, renewed well before expiry, and the CA published as the `caBundle`
//! of the webhook configuration so the apiserver trusts whichever replica answers.
//!
//! Owns the Secret's contents and the configuration's `caBundle`; it does not register the webhook (the
//! deploy manifests and the test environment do) and serves nothing itself (`webhook_server` does).

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use prometheus_client::metrics::counter::Counter;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::{Api, Client};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

use crate::admission::cert_material::{
    issue_all, issue_serving, unix_now, CertMaterial, Renewal, TLS_CERT, TLS_KEY,
};

/// Conflicting writers (replicas starting together) settle within a few rounds.
const SECRET_WRITE_ATTEMPTS: usize = 5;

/// Where the certificate lives and what it must be valid for.
#[derive(Debug, Clone)]
pub struct ServingCertConfig {
    pub namespace: String,
    pub secret: String,
    /// DNS names and IP addresses the apiserver dials (the Service's names, or 127.0.0.1 in tests).
    pub names: Vec<String>,
    /// The ValidatingWebhookConfiguration whose `caBundle` this CA fills, if any.
    pub webhook_configuration: Option<String>,
}

/// Why the serving certificate could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum ServingCertError {
    #[error("{action} Secret {namespace}/{name}: {source}")]
    Secret {
        action: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("{action} ValidatingWebhookConfiguration {name}: {source}")]
    WebhookConfiguration {
        action: &'static str,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("issuing a certificate: {0}")]
    Issue(#[from] rcgen::Error),
    #[error("loading the serving certificate: {0}")]
    Load(String),
    #[error("ValidatingWebhookConfiguration {name} kept changing under {attempts} attempts to write its caBundle")]
    ContendedConfiguration { name: String, attempts: usize },
    #[error("Secret {namespace}/{name} kept changing under {attempts} attempts to write it")]
    Contended {
        namespace: String,
        name: String,
        attempts: usize,
    },
}

fn certified_key(material: &CertMaterial) -> Result<Arc<CertifiedKey>, ServingCertError> {
    let load = |e: String| ServingCertError::Load(e);
    let chain = CertificateDer::pem_slice_iter(material.cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| load(format!("{TLS_CERT}: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(material.key.as_bytes())
        .map_err(|e| load(format!("{TLS_KEY}: {e}")))?;
    let signing = rustls::crypto::aws_lc_rs::sign::any_supported_type(&key)
        .map_err(|e| load(format!("{TLS_KEY}: {e}")))?;
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

/// Hands TLS handshakes the current serving certificate; swapped in place when it is renewed.
#[derive(Debug)]
pub struct CertSlot(RwLock<Arc<CertifiedKey>>);

impl CertSlot {
    fn current(&self) -> Arc<CertifiedKey> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn replace(&self, key: Arc<CertifiedKey>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = key;
    }
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// How soon a failed refresh is tried again: a replica that could not switch to a re-issued CA must
/// do so well within [`CA_OVERLAP`].
const REFRESH_RETRY: Duration = Duration::from_secs(5);

/// How long a CA this replica saw replaced stays in the `caBundle` beside the new one: until every replica
/// serves a certificate of the new CA (they notice a changed Secret within seconds), with a wide margin.
/// Timed from when this replica saw the change, never from a stamp another process wrote.
pub const CA_OVERLAP: Duration = Duration::from_secs(10 * 60);

/// A CA no longer in the Secret, and when this replica saw it replaced.
#[derive(Debug, Clone)]
struct RetiredCa {
    pem: String,
    since: Instant,
}

/// The PEM certificates of a bundle, each trimmed, in order.
fn pem_certificates(bundle: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    bundle
        .split_inclusive(END)
        .map(str::trim)
        .filter(|c| c.starts_with("-----BEGIN CERTIFICATE-----") && c.ends_with(END))
        .map(str::to_owned)
        .collect()
}

/// The `caBundle`: the current CA, then every retired one still within [`CA_OVERLAP`] at `now`.
fn ca_bundle(current: &str, retired: &[RetiredCa], now: Instant) -> String {
    let current = current.trim();
    let mut certificates = vec![current.to_owned()];
    for ca in retired {
        let fresh = now.saturating_duration_since(ca.since) < CA_OVERLAP;
        if fresh && ca.pem != current && !certificates.contains(&ca.pem) {
            certificates.push(ca.pem.clone());
        }
    }
    certificates.join("\n") + "\n"
}

/// What a publish does with the other CAs it finds in the `caBundle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OtherCas {
    /// Keep them for the overlap (a replica's first publish: others may present them).
    Keep,
    /// Drop those this replica did not retire itself.
    Drop,
}

/// A write that lost to a concurrent one (the read resourceVersion no longer current).
fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.code == 409)
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => std::future::pending().await,
    }
}

/// The serving certificate of this replica, kept in step with the shared Secret.
#[derive(Clone)]
pub struct ServingCert {
    client: Client,
    config: ServingCertConfig,
    slot: Arc<CertSlot>,
    loaded: Arc<RwLock<CertMaterial>>,
    /// CAs replaced while this replica ran (or found in the bundle at start), kept trusted for a while.
    retired: Arc<RwLock<Vec<RetiredCa>>>,
    /// Certificates loaded after the first (a renewal, or a re-issued CA).
    reloads: Counter,
}

impl ServingCert {
    /// Reads (or issues and stores) the certificate and publishes the CA. Every replica calls this;
    /// the first to write the Secret wins and the others load what it wrote.
    pub async fn ensure(
        client: Client,
        config: ServingCertConfig,
    ) -> Result<Self, ServingCertError> {
        let material = ensure_secret(&client, &config).await?;
        let slot = Arc::new(CertSlot(RwLock::new(certified_key(&material)?)));
        let cert = Self {
            client,
            config,
            slot,
            loaded: Arc::new(RwLock::new(material)),
            retired: Arc::default(),
            reloads: Counter::default(),
        };
        // At start, CAs already trusted beside ours (other replicas may still present one) stay for the
        // overlap, timed from now.
        cert.publish_ca(&cert.current_ca(), OtherCas::Keep).await?;
        Ok(cert)
    }

    /// The CA of the certificate this replica presents.
    fn current_ca(&self) -> String {
        self.loaded
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .ca_cert
            .clone()
    }

    /// Counts certificates loaded after the first, for the manager's metrics.
    pub fn reloads(&self) -> Counter {
        self.reloads.clone()
    }

    /// A rustls server configuration that always presents the current certificate. HTTP/1.1 only: the
    /// apiserver's webhook client needs nothing more.
    pub fn tls_config(&self) -> Result<Arc<rustls::ServerConfig>, ServingCertError> {
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| ServingCertError::Load(format!("TLS protocol versions: {e}")))?
        .with_no_client_auth()
        .with_cert_resolver(self.slot.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Re-reads the Secret, renews what is due, loads a changed certificate and republishes the CA.
    pub async fn refresh(&self) -> Result<(), ServingCertError> {
        let material = ensure_secret(&self.client, &self.config).await?;
        let previous = self
            .loaded
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if previous != material {
            let key = certified_key(&material)?;
            if previous.ca_cert != material.ca_cert {
                // Trust the new CA beside the old one before presenting a certificate of it: the
                // apiserver must accept whichever replica answers, switched or not. Until that is
                // published, this replica keeps the certificate it has (and tries again).
                self.retire(previous.ca_cert.trim().to_owned());
                self.publish_ca(&material.ca_cert, OtherCas::Drop).await?;
                warn!(secret = %self.config.secret, "the admission webhook CA was re-issued; both CAs are trusted while replicas switch");
            }
            self.slot.replace(key);
            self.reloads.inc();
            info!(
                secret = %self.config.secret,
                not_after = material.not_after,
                "loaded a renewed admission webhook serving certificate"
            );
            *self.loaded.write().unwrap_or_else(|e| e.into_inner()) = material;
        }
        self.publish_ca(&self.current_ca(), OtherCas::Drop).await
    }

    fn retire(&self, pem: String) {
        let mut retired = self.retired.write().unwrap_or_else(|e| e.into_inner());
        retired.retain(|ca| ca.pem != pem);
        retired.push(RetiredCa {
            pem,
            since: Instant::now(),
        });
    }

    /// Refreshes whenever the Secret changes (its watch: a deleted or re-issued certificate is noticed
    /// within seconds by every replica), when a retired CA's overlap ends, and every `period` for
    /// renewals; a failure is logged and tried again after [`REFRESH_RETRY`].
    pub async fn keep_fresh(self, period: Duration) {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.config.namespace);
        let config =
            watcher::Config::default().fields(&format!("metadata.name={}", self.config.secret));
        let mut changes = watcher::watcher(secrets, config).default_backoff().boxed();
        let mut renewal = tokio::time::interval(period);
        renewal.tick().await;
        let mut retry_at: Option<Instant> = None;
        loop {
            let wake_at = [self.next_overlap_end(), retry_at]
                .into_iter()
                .flatten()
                .min();
            let woken = tokio::select! {
                event = changes.next() => match event {
                    Some(Ok(Event::Apply(_) | Event::Delete(_) | Event::InitDone)) => true,
                    Some(Ok(_)) => false,
                    Some(Err(error)) => {
                        warn!(%error, "watching the admission webhook certificate Secret; retrying");
                        false
                    }
                    None => return,
                },
                _ = renewal.tick() => true,
                _ = sleep_until_some(wake_at) => true,
            };
            if !woken {
                continue;
            }
            self.drop_expired_overlaps();
            retry_at = match self.refresh().await {
                Ok(()) => None,
                Err(error) => {
                    warn!(%error, "refreshing the admission webhook serving certificate failed; retrying");
                    Some(Instant::now() + REFRESH_RETRY)
                }
            };
        }
    }

    /// When the first retired CA's overlap ends, if any is retired.
    fn next_overlap_end(&self) -> Option<Instant> {
        let retired = self.retired.read().unwrap_or_else(|e| e.into_inner());
        retired.iter().map(|ca| ca.since + CA_OVERLAP).min()
    }

    fn drop_expired_overlaps(&self) {
        let now = Instant::now();
        self.retired
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|ca| now.saturating_duration_since(ca.since) < CA_OVERLAP);
    }

    /// Writes `current` (and the CAs still overlapping) into every webhook of the configuration whose
    /// `caBundle` differs, settled against the other replicas writing it too; with [`OtherCas::Keep`]
    /// the other CAs found there first join those overlapping.
    async fn publish_ca(&self, current: &str, found: OtherCas) -> Result<(), ServingCertError> {
        let Some(name) = &self.config.webhook_configuration else {
            return Ok(());
        };
        let api: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let error = |action| {
            move |e| ServingCertError::WebhookConfiguration {
                action,
                name: name.clone(),
                source: Box::new(e),
            }
        };
        for _ in 0..SECRET_WRITE_ATTEMPTS {
            let Some(mut configuration) = api.get_opt(name).await.map_err(error("reading"))? else {
                warn!(configuration = %name, "the admission webhook is not registered; updates are not checked");
                return Ok(());
            };
            if found == OtherCas::Keep {
                self.keep_published(&configuration, current);
            }
            let ca = {
                let retired = self.retired.read().unwrap_or_else(|e| e.into_inner());
                ca_bundle(current, &retired, Instant::now()).into_bytes()
            };
            let mut changed = false;
            for webhook in configuration.webhooks.iter_mut().flatten() {
                if webhook.client_config.ca_bundle.as_ref().map(|b| &b.0) != Some(&ca) {
                    webhook.client_config.ca_bundle = Some(ByteString(ca.clone()));
                    changed = true;
                }
            }
            if !changed {
                return Ok(());
            }
            // The read resourceVersion rides along: of replicas writing together, one wins and the
            // others read again.
            match api
                .replace(name, &PostParams::default(), &configuration)
                .await
            {
                Ok(_) => {
                    info!(configuration = %name, "published the admission webhook CA");
                    return Ok(());
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(error("updating the caBundle of")(e)),
            }
        }
        Err(ServingCertError::ContendedConfiguration {
            name: name.clone(),
            attempts: SECRET_WRITE_ATTEMPTS,
        })
    }

    /// Retires, from now, the CAs `configuration` trusts beside `current`.
    fn keep_published(&self, configuration: &ValidatingWebhookConfiguration, current: &str) {
        for webhook in configuration.webhooks.iter().flatten() {
            let published = webhook.client_config.ca_bundle.as_ref().map(|b| &b.0);
            let text = published.map(|b| String::from_utf8_lossy(b).into_owned());
            for pem in pem_certificates(text.as_deref().unwrap_or_default()) {
                if pem != current.trim() {
                    self.retire(pem);
                }
            }
        }
    }
}

/// The Secret's material, issued or renewed as needed, settled against concurrent writers.
async fn ensure_secret(
    client: &Client,
    config: &ServingCertConfig,
) -> Result<CertMaterial, ServingCertError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &config.namespace);
    let error = |action| {
        move |e| ServingCertError::Secret {
            action,
            namespace: config.namespace.clone(),
            name: config.secret.clone(),
            source: Box::new(e),
        }
    };
    for _ in 0..SECRET_WRITE_ATTEMPTS {
        let now = unix_now();
        let existing = api
            .get_opt(&config.secret)
            .await
            .map_err(error("reading"))?;
        let Some(secret) = existing else {
            let material = issue_all(now, &config.names)?;
            let meta = ObjectMeta {
                name: Some(config.secret.clone()),
                namespace: Some(config.namespace.clone()),
                ..Default::default()
            };
            match api
                .create(&PostParams::default(), &material.to_secret(meta))
                .await
            {
                Ok(_) => {
                    info!(secret = %config.secret, "issued the admission webhook serving certificate");
                    return Ok(material);
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(error("creating")(e)),
            }
        };
        let stored = CertMaterial::from_secret(&secret);
        let renewal = stored
            .as_ref()
            .map_or(Renewal::All, |m| m.renewal(now, &config.names));
        let material = match (stored, renewal) {
            (Some(material), Renewal::None) => return Ok(material),
            (Some(m), Renewal::Serving) => {
                issue_serving(m.ca_cert, m.ca_key, m.ca_not_after, now, &config.names)?
            }
            _ => issue_all(now, &config.names)?,
        };
        // Replacing with the read resourceVersion: of replicas renewing together, one wins.
        let mut meta = secret.metadata.clone();
        meta.managed_fields = None;
        match api
            .replace(
                &config.secret,
                &PostParams::default(),
                &material.to_secret(meta),
            )
            .await
        {
            Ok(_) => {
                info!(secret = %config.secret, not_after = material.not_after, "renewed the admission webhook serving certificate");
                return Ok(material);
            }
            Err(e) if is_conflict(&e) => continue,
            Err(e) => return Err(error("updating")(e)),
        }
    }
    Err(ServingCertError::Contended {
        namespace: config.namespace.clone(),
        name: config.secret.clone(),
        attempts: SECRET_WRITE_ATTEMPTS,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["pko-webhook.pko.svc".to_owned(), "127.0.0.1".to_owned()]
    }

    #[test]
    fn issued_material_round_trips_through_a_secret_and_loads() {
        let material = issue_all(unix_now(), &names()).unwrap();
        let secret = material.to_secret(ObjectMeta::default());
        let read = CertMaterial::from_secret(&secret).unwrap();
        assert_eq!(read, material);
        certified_key(&read).unwrap();
    }

    #[test]
    fn the_bundle_trusts_a_replaced_ca_only_for_the_overlap() {
        let now = unix_now();
        let old = issue_all(now, &names()).unwrap().ca_cert;
        let new = issue_all(now, &names()).unwrap().ca_cert;
        let seen = Instant::now();
        let retired = [RetiredCa {
            pem: old.trim().to_owned(),
            since: seen,
        }];
        let during = pem_certificates(&ca_bundle(&new, &retired, seen));
        assert_eq!(during, [new.trim().to_owned(), old.trim().to_owned()]);
        let after = pem_certificates(&ca_bundle(&new, &retired, seen + CA_OVERLAP));
        assert_eq!(after, [new.trim().to_owned()]);
        // The current CA retired (a rotation back) is not listed twice.
        let back = [RetiredCa {
            pem: new.trim().to_owned(),
            since: seen,
        }];
        assert_eq!(pem_certificates(&ca_bundle(&new, &back, seen)).len(), 1);
    }
}

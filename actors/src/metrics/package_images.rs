//! Package images: how long fetching one takes (digest lookup, and download and unpack on a cache miss),
//! where its pull credentials came from, and the image store's own counts read at each scrape: downloads,
//! cache hits, bytes cached.

use std::sync::Arc;

use pko_package::image::ImageStore;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::metrics::source_labels::SourceLabels;
use crate::packages::pull_secrets::CredentialsSource;

/// The fetch latency histogram and the credentials' sources; cheap to clone.
#[derive(Clone)]
pub struct ImageFetchMetrics {
    duration: Histogram,
    credentials: Family<SourceLabels, Counter>,
}

impl Default for ImageFetchMetrics {
    fn default() -> Self {
        // 5 ms .. ~80 s: a cached digest lookup takes milliseconds, a large pull many seconds.
        Self {
            duration: Histogram::new(exponential_buckets(0.005, 2.0, 15)),
            credentials: Family::default(),
        }
    }
}

impl ImageFetchMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "pko_package_image_fetch_duration_seconds",
            "Time to fetch a package image: the digest lookup, plus download and unpack when the \
             digest is not cached.",
            self.duration.clone(),
        );
        registry.register(
            "pko_package_pull_credentials",
            "Package pulls by where their credentials came from: `read` (the ServiceAccount and its pull \
             secrets read from the apiserver) or `kept` (read by another pull in the last 10 s).",
            self.credentials.clone(),
        );
    }

    /// A pull's credentials came from `source`.
    pub fn credentials(&self, source: CredentialsSource) {
        let source = match source {
            CredentialsSource::Kept => "kept",
            CredentialsSource::Read => "read",
        };
        self.credentials
            .get_or_create(&SourceLabels { source })
            .inc();
    }

    /// A fetch ended (either way) after `seconds`.
    pub fn fetched(&self, seconds: f64) {
        self.duration.observe(seconds);
    }
}

/// Reads the store's counters when scraped.
pub struct ImageStoreCollector(pub Arc<ImageStore>);

impl std::fmt::Debug for ImageStoreCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ImageStoreCollector")
    }
}

impl Collector for ImageStoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let store = &self.0;
        ConstCounter::new(store.pulls()).encode(encoder.encode_descriptor(
            "pko_package_image_pulls",
            "Package images downloaded (cache misses).",
            None,
            MetricType::Counter,
        )?)?;
        ConstCounter::new(store.cache_hits()).encode(encoder.encode_descriptor(
            "pko_package_image_cache_hits",
            "Package image fetches answered from the cache (digest known).",
            None,
            MetricType::Counter,
        )?)?;
        ConstGauge::new(i64::try_from(store.cached_bytes()).unwrap_or(i64::MAX)).encode(
            encoder.encode_descriptor(
                "pko_package_image_cache_bytes",
                "Bytes of unpacked packages the image cache holds.",
                None,
                MetricType::Gauge,
            )?,
        )?;
        ConstGauge::new(i64::try_from(store.registry_operations_waiting()).unwrap_or(i64::MAX))
            .encode(encoder.encode_descriptor(
                "pko_package_registry_operations_waiting",
                "Registry operations (digest lookups, pulls) waiting for one of the 16 places in flight.",
                None,
                MetricType::Gauge,
            )?)
    }
}

//! Package images: how long fetching one takes (digest lookup, and download and unpack on a cache miss),
//! and the image store's own counts read at each scrape: downloads, cache hits, bytes cached.

use std::sync::Arc;

use pko_package::image::ImageStore;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The fetch latency histogram; cheap to clone.
#[derive(Clone)]
pub struct ImageFetchMetrics {
    duration: Histogram,
}

impl Default for ImageFetchMetrics {
    fn default() -> Self {
        // 5 ms .. ~80 s: a cached digest lookup takes milliseconds, a large pull many seconds.
        Self {
            duration: Histogram::new(exponential_buckets(0.005, 2.0, 15)),
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
        )
    }
}

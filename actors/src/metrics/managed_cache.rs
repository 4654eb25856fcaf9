//! The managed-object cache counted at each scrape, under upstream's names and labels:
//! `package_operator_managed_cache_informers_total{owner}` (kinds an owner has objects of; upstream runs
//! an informer per owner and kind, pko one shared watch per kind) and
//! `package_operator_managed_cache_objects_total{owner,gvk}` (its cached objects of each kind), with
//! `owner` the owner's UID as upstream labels it; plus pko's `pko_managed_cache_watches`, the shared
//! watches running, and `pko_external_object_watches`. Counting walks the cache once per scrape, on the
//! scraping thread, never an actor's.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::objects::object_cache::{CacheCensus, ObjectCache};

/// Counts the cache when scraped.
pub struct ManagedCacheCollector(pub ObjectCache);

impl std::fmt::Debug for ManagedCacheCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ManagedCacheCollector")
    }
}

impl Collector for ManagedCacheCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_census(&self.0.census(), encoder)
    }
}

fn encode_census(
    census: &CacheCensus,
    mut encoder: DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    {
        let mut family = encoder.encode_descriptor(
            "package_operator_managed_cache_informers_total",
            "Number of kinds per owner the managed cache holds objects of.",
            None,
            MetricType::Gauge,
        )?;
        for (owner, kinds) in census.owners.iter().filter(|(o, _)| !o.is_empty()) {
            let count = i64::try_from(kinds.len()).unwrap_or(i64::MAX);
            ConstGauge::new(count).encode(family.encode_family(&[("owner", owner.as_str())])?)?;
        }
    }
    {
        let mut family = encoder.encode_descriptor(
            "package_operator_managed_cache_objects_total",
            "Number of objects per GVK and owner in the managed cache.",
            None,
            MetricType::Gauge,
        )?;
        for (owner, kinds) in census.owners.iter().filter(|(o, _)| !o.is_empty()) {
            for (gvk, count) in kinds {
                let count = i64::try_from(*count).unwrap_or(i64::MAX);
                ConstGauge::new(count).encode(
                    family.encode_family(&[("owner", owner.as_str()), ("gvk", gvk.as_str())])?,
                )?;
            }
        }
    }
    {
        let family = encoder.encode_descriptor(
            "pko_managed_cache_watches",
            "Shared watches of managed kinds the cache runs (one per kind).",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(i64::try_from(census.watches).unwrap_or(i64::MAX)).encode(family)?;
    }
    let family = encoder.encode_descriptor(
        "pko_external_object_watches",
        "Watches of single external objects and ObjectTemplate sources; each ends with its last reader.",
        None,
        MetricType::Gauge,
    )?;
    ConstGauge::new(i64::try_from(census.external_watches).unwrap_or(i64::MAX)).encode(family)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Debug)]
    struct Fixed(CacheCensus);

    impl Collector for Fixed {
        fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            encode_census(&self.0, encoder)
        }
    }

    #[test]
    fn owners_and_kinds_are_counted_with_upstream_labels() {
        let kinds = BTreeMap::from([
            ("/v1, Kind=ConfigMap".to_owned(), 2),
            ("apps/v1, Kind=Deployment".to_owned(), 1),
        ]);
        let census = CacheCensus {
            watches: 2,
            owners: BTreeMap::from([
                ("uid-1".to_owned(), kinds),
                (String::new(), BTreeMap::new()),
            ]),
            external_watches: 3,
        };
        let text = crate::runtime::runtime_metrics::encoded(|registry| {
            registry.register_collector(Box::new(Fixed(census)))
        });
        for line in [
            r#"package_operator_managed_cache_informers_total{owner="uid-1"} 2"#,
            r#"package_operator_managed_cache_objects_total{owner="uid-1",gvk="/v1, Kind=ConfigMap"} 2"#,
            r#"package_operator_managed_cache_objects_total{owner="uid-1",gvk="apps/v1, Kind=Deployment"} 1"#,
            "pko_managed_cache_watches 2",
            "pko_external_object_watches 3",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(!text.contains(r#"owner="""#), "{text}");
    }
}

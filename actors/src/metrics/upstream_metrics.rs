//! Package Operator's metrics with upstream's names, labels and meanings, so dashboards and alerts
//! written for the Go operator keep working: package availability (0 Unavailable, 1 Available,
//! 2 Unknown), creation timestamp, revision and load duration per Package; creation and success
//! timestamps per ObjectSet. ClusterPackages and ClusterObjectSets carry an empty `pko_namespace`, as
//! upstream's do. Series go with their object (deletion, and for the success timestamp archival).

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::sync::PoisonError;

use dashmap::DashMap;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PackageLabels {
    pko_name: String,
    pko_namespace: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct AvailabilityLabels {
    pko_name: String,
    pko_namespace: String,
    image: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SetLabels {
    pko_name: String,
    pko_namespace: String,
    pko_package_instance: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SucceededLabels {
    pko_name: String,
    pko_namespace: String,
    pko_package_instance: String,
    image: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// What a Package's metrics are made of.
#[derive(Debug, Clone, PartialEq)]
pub struct PackageFacts<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub image: &'a str,
    /// The Available condition: `Some(true)`/`Some(false)`, `None` when absent or Unknown.
    pub available: Option<bool>,
    /// Unix seconds.
    pub created: i64,
    pub revision: i64,
}

/// What an ObjectSet's metrics are made of.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectSetFacts<'a> {
    pub name: &'a str,
    pub uid: &'a str,
    pub namespace: &'a str,
    /// The `package-operator.run/instance` label: the Package the set belongs to, or empty.
    pub package_instance: &'a str,
    /// The `package-operator.run/package-source-image` annotation, or empty.
    pub image: &'a str,
    /// Unix seconds.
    pub created: i64,
    /// When Succeeded last turned True (Unix seconds), if it is True.
    pub succeeded: Option<i64>,
    pub archived: bool,
}

/// The upstream metrics; cheap to clone.
#[derive(Clone, Default)]
pub struct UpstreamMetrics {
    package_availability: Family<AvailabilityLabels, Gauge>,
    package_created: Family<PackageLabels, Gauge>,
    package_load_duration: Family<PackageLabels, FloatGauge>,
    package_revision: Family<PackageLabels, Gauge>,
    object_set_created: Family<SetLabels, Gauge>,
    object_set_succeeded: Family<SucceededLabels, Gauge>,
    /// The image each Package's availability series carries, to replace it when the image changes.
    package_images: std::sync::Arc<DashMap<PackageLabels, String>>,
    /// The labels each ObjectSet's series carry, to remove them when it goes.
    object_sets: std::sync::Arc<DashMap<PackageLabels, (String, String)>>,
    /// UIDs of sets their deployment deleted, newest last: an observation of such a set from before its
    /// deletion, handled after it, does not bring its series back. Bounded: a set's own actor sees the
    /// deletion soon after and forgets it for good.
    retired: std::sync::Arc<std::sync::Mutex<VecDeque<String>>>,
}

/// How many deleted sets' UIDs [`UpstreamMetrics`] remembers.
const RETIRED_SETS: usize = 1024;

impl UpstreamMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "package_operator_package_availability",
            "Package availability 0=Unavailable,1=Available,2=Unknown.",
            self.package_availability.clone(),
        );
        registry.register(
            "package_operator_package_created_timestamp_seconds",
            "Package Unix creation timestamp.",
            self.package_created.clone(),
        );
        registry.register(
            "package_operator_package_load_duration_seconds",
            "Duration of the last package load, including download and parsing.",
            self.package_load_duration.clone(),
        );
        registry.register(
            "package_operator_package_revision",
            "Package revision.",
            self.package_revision.clone(),
        );
        registry.register(
            "package_operator_object_set_created_timestamp_seconds",
            "ObjectSet Unix creation timestamp.",
            self.object_set_created.clone(),
        );
        registry.register(
            "package_operator_object_set_succeeded_timestamp_seconds",
            "ObjectSet Unix success timestamp.",
            self.object_set_succeeded.clone(),
        );
    }

    /// A Package as observed.
    pub fn package(&self, facts: &PackageFacts) {
        let key = package_key(facts.name, facts.namespace);
        let availability = match facts.available {
            Some(false) => 0,
            Some(true) => 1,
            None => 2,
        };
        // One availability series per Package: a new image replaces the old series.
        if let Some(old) = self
            .package_images
            .insert(key.clone(), facts.image.to_owned())
            .filter(|old| old != facts.image)
        {
            self.package_availability
                .remove(&availability_labels(&key, old));
        }
        self.package_availability
            .get_or_create(&availability_labels(&key, facts.image.to_owned()))
            .set(availability);
        self.package_created.get_or_create(&key).set(facts.created);
        self.package_revision
            .get_or_create(&key)
            .set(facts.revision);
    }

    /// A Package's load (pull, unpack, render) took `seconds`.
    pub fn package_loaded(&self, name: &str, namespace: &str, seconds: f64) {
        self.package_load_duration
            .get_or_create(&package_key(name, namespace))
            .set(seconds);
    }

    /// A Package is being deleted or gone.
    pub fn forget_package(&self, name: &str, namespace: &str) {
        let key = package_key(name, namespace);
        if let Some((_, image)) = self.package_images.remove(&key) {
            self.package_availability
                .remove(&availability_labels(&key, image));
        }
        self.package_created.remove(&key);
        self.package_revision.remove(&key);
        self.package_load_duration.remove(&key);
    }

    /// An ObjectSet as observed.
    pub fn object_set(&self, facts: &ObjectSetFacts) {
        if self
            .retired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|uid| uid == facts.uid)
        {
            return;
        }
        let key = package_key(facts.name, facts.namespace);
        let labels = (facts.package_instance.to_owned(), facts.image.to_owned());
        if let Some(old) = self
            .object_sets
            .insert(key.clone(), labels.clone())
            .filter(|old| *old != labels)
        {
            self.remove_object_set(&key, &old);
        }
        let (set, succeeded) = set_labels(&key, &labels);
        self.object_set_created
            .get_or_create(&set)
            .set(facts.created);
        match facts.succeeded.filter(|_| !facts.archived) {
            Some(at) => {
                self.object_set_succeeded.get_or_create(&succeeded).set(at);
            }
            None => {
                self.object_set_succeeded.remove(&succeeded);
            }
        }
    }

    /// Its deployment deleted the ObjectSet `uid`: its series go now, and stay gone.
    pub fn retire_object_set(&self, name: &str, namespace: &str, uid: &str) {
        {
            let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
            if retired.len() == RETIRED_SETS {
                retired.pop_front();
            }
            retired.push_back(uid.to_owned());
        }
        self.forget_object_set(name, namespace);
    }

    /// An ObjectSet is being deleted or gone.
    pub fn forget_object_set(&self, name: &str, namespace: &str) {
        let key = package_key(name, namespace);
        if let Some((_, labels)) = self.object_sets.remove(&key) {
            self.remove_object_set(&key, &labels);
        }
    }

    fn remove_object_set(&self, key: &PackageLabels, labels: &(String, String)) {
        let (set, succeeded) = set_labels(key, labels);
        self.object_set_created.remove(&set);
        self.object_set_succeeded.remove(&succeeded);
    }
}

fn package_key(name: &str, namespace: &str) -> PackageLabels {
    PackageLabels {
        pko_name: name.to_owned(),
        pko_namespace: namespace.to_owned(),
    }
}

fn availability_labels(key: &PackageLabels, image: String) -> AvailabilityLabels {
    AvailabilityLabels {
        pko_name: key.pko_name.clone(),
        pko_namespace: key.pko_namespace.clone(),
        image,
    }
}

fn set_labels(
    key: &PackageLabels,
    (instance, image): &(String, String),
) -> (SetLabels, SucceededLabels) {
    (
        SetLabels {
            pko_name: key.pko_name.clone(),
            pko_namespace: key.pko_namespace.clone(),
            pko_package_instance: instance.clone(),
        },
        SucceededLabels {
            pko_name: key.pko_name.clone(),
            pko_namespace: key.pko_namespace.clone(),
            pko_package_instance: instance.clone(),
            image: image.clone(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(metrics: &UpstreamMetrics) -> String {
        crate::runtime::runtime_metrics::encoded(|registry| metrics.register(registry))
    }

    #[test]
    fn a_package_has_one_availability_series_and_loses_all_when_forgotten() {
        let metrics = UpstreamMetrics::default();
        let mut facts = PackageFacts {
            name: "p",
            namespace: "n",
            image: "r/p:v1",
            available: None,
            created: 1_700_000_000,
            revision: 1,
        };
        metrics.package(&facts);
        let text = encode(&metrics);
        assert!(text.contains(r#"package_operator_package_availability{pko_name="p",pko_namespace="n",image="r/p:v1"} 2"#), "{text}");
        facts.image = "r/p:v2";
        facts.available = Some(true);
        facts.revision = 2;
        metrics.package(&facts);
        metrics.package_loaded("p", "n", 0.25);
        let text = encode(&metrics);
        assert!(!text.contains("r/p:v1"), "{text}");
        assert!(text.contains(r#"package_operator_package_availability{pko_name="p",pko_namespace="n",image="r/p:v2"} 1"#), "{text}");
        assert!(
            text.contains(r#"package_operator_package_revision{pko_name="p",pko_namespace="n"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"package_operator_package_created_timestamp_seconds{pko_name="p",pko_namespace="n"} 1700000000"#), "{text}");
        assert!(text.contains(r#"package_operator_package_load_duration_seconds{pko_name="p",pko_namespace="n"} 0.25"#), "{text}");
        metrics.forget_package("p", "n");
        assert!(!encode(&metrics).contains("pko_name=\"p\""));
    }

    #[test]
    fn an_object_set_loses_its_success_when_archived_and_everything_when_forgotten() {
        let metrics = UpstreamMetrics::default();
        let mut facts = ObjectSetFacts {
            name: "s-1",
            uid: "uid-1",
            namespace: "n",
            package_instance: "p",
            image: "r/p:v1",
            created: 10,
            succeeded: Some(20),
            archived: false,
        };
        metrics.object_set(&facts);
        let text = encode(&metrics);
        assert!(text.contains(r#"package_operator_object_set_created_timestamp_seconds{pko_name="s-1",pko_namespace="n",pko_package_instance="p"} 10"#), "{text}");
        assert!(text.contains(r#"package_operator_object_set_succeeded_timestamp_seconds{pko_name="s-1",pko_namespace="n",pko_package_instance="p",image="r/p:v1"} 20"#), "{text}");
        facts.archived = true;
        metrics.object_set(&facts);
        let text = encode(&metrics);
        assert!(
            !text.contains("package_operator_object_set_succeeded_timestamp_seconds{"),
            "{text}"
        );
        assert!(
            text.contains("package_operator_object_set_created_timestamp_seconds{"),
            "{text}"
        );
        metrics.forget_object_set("s-1", "n");
        assert!(!encode(&metrics).contains("s-1"));
    }

    #[test]
    fn a_set_its_deployment_deleted_does_not_come_back_from_an_older_observation() {
        let metrics = UpstreamMetrics::default();
        let facts = |name, uid| ObjectSetFacts {
            name,
            uid,
            namespace: "n",
            package_instance: "",
            image: "",
            created: 10,
            succeeded: None,
            archived: true,
        };
        metrics.object_set(&facts("s-1", "uid-1"));
        metrics.retire_object_set("s-1", "n", "uid-1");
        metrics.object_set(&facts("s-1", "uid-1"));
        assert!(
            !encode(&metrics).contains("s-1"),
            "an observation from before the deletion"
        );
        // A new set of the same name (the same template again) is another object.
        metrics.object_set(&facts("s-1", "uid-2"));
        assert!(encode(&metrics).contains("s-1"));
    }
}

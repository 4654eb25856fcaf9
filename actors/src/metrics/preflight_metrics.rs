//! The preflight of HostedClusterPackage releases: how many ran and how they ended, how long they took,
//! the dry runs they asked for, and (read off the status, so a standby exports the same) how many HCP
//! namespaces the last one found changed, refused and unchecked. Labels: the HostedClusterPackage's
//! name and a fixed result or state; never a namespace.

use pko_proto::core::rollout_preflight::HostedClusterPackagePreflightStatus;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    hostedclusterpackage: String,
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct NamespaceLabels {
    hostedclusterpackage: String,
    state: &'static str,
}

/// Reads one count of a preflight.
type ReadCount = fn(&HostedClusterPackagePreflightStatus) -> i32;

/// The states of the last preflight's namespaces, with how to read each.
const STATES: [(&str, ReadCount); 4] = [
    ("total", |p| p.namespaces),
    ("changed", |p| p.changed),
    ("refused", |p| p.refused),
    ("unchecked", |p| p.unchecked),
];

const RESULTS: [&str; 3] = ["passed", "refused", "failed"];

/// Cheap to clone.
#[derive(Clone)]
pub struct PreflightMetrics {
    runs: Family<ResultLabels, Counter>,
    duration: Histogram,
    dry_runs: Counter,
    namespaces: Family<NamespaceLabels, Gauge>,
}

impl Default for PreflightMetrics {
    fn default() -> Self {
        Self {
            runs: Family::default(),
            // 50 ms .. ~14 min: one namespace to a large fleet on a busy apiserver.
            duration: Histogram::new(exponential_buckets(0.05, 2.0, 15)),
            dry_runs: Counter::default(),
            namespaces: Family::default(),
        }
    }
}

impl PreflightMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "pko_hostedclusterpackage_preflights",
            "Preflights of HostedClusterPackage releases by result: passed (nothing refused), \
             refused (the apiserver refused a change somewhere), failed (did not finish; run again).",
            self.runs.clone(),
        );
        registry.register(
            "pko_hostedclusterpackage_preflight_duration_seconds",
            "Time a preflight took: render, compare and dry-run every target namespace, and keep \
             the report.",
            self.duration.clone(),
        );
        registry.register(
            "pko_hostedclusterpackage_preflight_dry_runs",
            "Server-side dry runs the preflights asked of the management cluster's apiserver.",
            self.dry_runs.clone(),
        );
        registry.register(
            "pko_hostedclusterpackage_preflight_namespaces",
            "HCP namespaces of a HostedClusterPackage's last preflight by state: total, changed, \
             refused, unchecked.",
            self.namespaces.clone(),
        );
    }

    /// A preflight of `name` finished with `status`, after `seconds`.
    pub fn finished(&self, name: &str, status: &HostedClusterPackagePreflightStatus, seconds: f64) {
        let result = if status.refused > 0 {
            "refused"
        } else {
            "passed"
        };
        self.run(name, result);
        self.duration.observe(seconds);
    }

    /// A preflight of `name` did not finish.
    pub fn failed(&self, name: &str) {
        self.run(name, "failed");
    }

    fn run(&self, name: &str, result: &'static str) {
        self.runs
            .get_or_create(&ResultLabels {
                hostedclusterpackage: name.to_owned(),
                result,
            })
            .inc();
    }

    /// One dry run asked of the management cluster's apiserver.
    pub fn dry_run(&self) {
        self.dry_runs.inc();
    }

    /// The last preflight of `name` as its status keeps it (`None`: none yet).
    pub fn observed(&self, name: &str, last: Option<&HostedClusterPackagePreflightStatus>) {
        for (state, read) in STATES {
            let key = NamespaceLabels {
                hostedclusterpackage: name.to_owned(),
                state,
            };
            match last {
                Some(last) => {
                    self.namespaces
                        .get_or_create(&key)
                        .set(i64::from(read(last)));
                }
                None => {
                    self.namespaces.remove(&key);
                }
            }
        }
    }

    /// `name` is gone.
    pub fn forget(&self, name: &str) {
        self.observed(name, None);
        for result in RESULTS {
            self.runs.remove(&ResultLabels {
                hostedclusterpackage: name.to_owned(),
                result,
            });
        }
    }
}

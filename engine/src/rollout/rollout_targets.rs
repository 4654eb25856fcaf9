//! The selected HostedClusters as the planner sees them: each one's Package state against the template
//! rolled out, its partition label, and whether its maintenance window is open; the ones left out for now
//! (they keep their Package); and the namespaces whose Package goes.
//!
//! Pure: no I/O, no clock.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use pko_proto::core::package::{PackageSpec, PackageTemplateSpec};
use pko_proto::hypershift::HostedCluster;

use crate::rollout::hosted_cluster_package::{package_state, OwnedPackage};
use crate::rollout::rollout_calendar::RolloutCalendar;
use crate::rollout::rollout_plan::{PackageState, Target};

/// What the targets are read from (a decision's snapshot).
pub struct FleetView<'a> {
    pub clusters: &'a [Arc<HostedCluster>],
    pub packages: &'a BTreeMap<String, Arc<OwnedPackage>>,
    /// Namespaces whose Package write is on its way, with the spec it carries.
    pub writing: &'a BTreeMap<String, PackageSpec>,
}

/// The targets to roll `template` out to, and the namespaces that keep a Package (targets, and those the
/// calendar leaves out for now). A HostedCluster that is not Available gets no Package until it is; one
/// that has its Package keeps being counted.
pub fn rollout_targets(
    fleet: &FleetView<'_>,
    template: &PackageTemplateSpec,
    label_key: Option<&str>,
    calendar: &mut RolloutCalendar<'_>,
) -> (Vec<Target>, BTreeSet<String>) {
    let mut targets = Vec::new();
    let mut wanted = BTreeSet::new();
    for cluster in fleet.clusters {
        let Some(namespace) = cluster.hosted_control_plane_namespace() else {
            continue;
        };
        let package = fleet.packages.get(&namespace);
        if !cluster.is_available() && package.is_none() {
            continue;
        }
        wanted.insert(namespace.clone());
        if !calendar.place(&namespace, cluster) {
            if !package.is_some_and(|p| package_state(template, p).0.updated) {
                calendar.outstanding += 1;
            }
            continue;
        }
        let (state, failure) = match fleet.writing.get(&namespace) {
            Some(spec) if *spec == template.spec => (Some(PackageState::just_updated()), None),
            // Whatever is observed, that write may still land: not live, and not on this template.
            Some(_) => (Some(PackageState::default()), None),
            None => match package.map(|p| package_state(template, p)) {
                Some((state, failure)) => (Some(state), failure),
                None => (None, None),
            },
        };
        let label = label_key.and_then(|k| {
            cluster
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(k).cloned())
        });
        targets.push(Target {
            in_window: calendar.is_open(&namespace),
            namespace,
            label,
            package: state,
            failure,
        });
    }
    (targets, wanted)
}

/// The namespaces whose Package goes: their HostedCluster is gone or no longer selected.
pub fn unwanted(
    packages: &BTreeMap<String, Arc<OwnedPackage>>,
    wanted: &BTreeSet<String>,
) -> Vec<String> {
    packages
        .keys()
        .filter(|ns| !wanted.contains(*ns))
        .cloned()
        .collect()
}

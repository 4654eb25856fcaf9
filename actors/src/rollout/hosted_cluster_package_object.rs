//! The engine's view of a HostedClusterPackage: its spec checked and turned into planner settings, the
//! Package it wants in each HCP namespace, each Package's rollout state, and the status it reports. No I/O.

use pko_proto::well_known::HOSTED_CLUSTER_PACKAGE_LABEL;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use pko_proto::core::hosted_cluster_package::{
    HostedClusterPackage, HostedClusterPackageCounts, HostedClusterPackagePartitionStatus,
    HostedClusterPackageRefStatus, HostedClusterPackageStatus,
};
use pko_proto::core::package::PackageTemplateSpec;
use serde_json::{json, Value};

use crate::engine::conditions::{is_true_for, set_condition, ConditionUpdate};
use crate::engine::deployment_plan::LATEST_REVISION_UNAVAILABLE;
use crate::engine::label_selector::selector_matches;
use crate::engine::rollout_plan::{
    Counts, PackageState, PartitionOrder, RolloutInput, RolloutPlan, RolloutStrategy, UNKNOWN_GROUP,
};
use crate::engine::rollout_status::rollout_conditions;
use crate::packages::package_object::PackageObject;

/// How a HostedClusterPackage rolls out, from a valid spec.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutSettings {
    pub selector: LabelSelector,
    pub strategy: RolloutStrategy,
    /// The partition label key and order.
    pub partition: Option<(String, PartitionOrder)>,
}

/// Checks the spec; the error names the field and the problem.
pub fn rollout_settings(hcpkg: &HostedClusterPackage) -> Result<RolloutSettings, String> {
    let spec = &hcpkg.spec;
    let strategy = match (&spec.strategy.instant, &spec.strategy.rolling_upgrade) {
        (Some(_), None) => RolloutStrategy::Instant,
        (None, Some(rolling)) if rolling.max_unavailable >= 1 => RolloutStrategy::RollingUpgrade {
            max_unavailable: usize::try_from(rolling.max_unavailable).unwrap_or(1),
        },
        (None, Some(rolling)) => {
            return Err(format!(
                "spec.strategy.rollingUpgrade.maxUnavailable: must be at least 1, got {}",
                rolling.max_unavailable
            ))
        }
        _ => return Err("spec.strategy: set exactly one of instant and rollingUpgrade".into()),
    };
    selector_matches(&spec.hosted_cluster_selector, &BTreeMap::new())
        .map_err(|e| format!("spec.hostedClusterSelector.{e}"))?;
    let partition = match &spec.partition {
        None => None,
        Some(p) if p.label_key.is_empty() => {
            return Err("spec.partition.labelKey: must not be empty".into())
        }
        Some(p) => {
            let order =
                match &p.order {
                    None => PartitionOrder::AlphanumericAsc,
                    Some(o) => match (o.static_.is_empty(), &o.alphanumeric_asc) {
                        (false, None) => {
                            let mut seen = std::collections::BTreeSet::new();
                            if let Some(dup) = o.static_.iter().find(|v| !seen.insert(v.as_str())) {
                                return Err(format!(
                                    "spec.partition.order.static: {dup:?} is listed twice"
                                ));
                            }
                            PartitionOrder::Static(o.static_.clone())
                        }
                        (true, Some(_)) => PartitionOrder::AlphanumericAsc,
                        (true, None) => return Err(
                            "spec.partition.order: set a non-empty static list or alphanumericAsc"
                                .into(),
                        ),
                        (false, Some(_)) => {
                            return Err(
                                "spec.partition.order: set only one of static and alphanumericAsc"
                                    .into(),
                            )
                        }
                    },
                };
            Some((p.label_key.clone(), order))
        }
    };
    Ok(RolloutSettings {
        selector: spec.hosted_cluster_selector.clone(),
        strategy,
        partition,
    })
}

/// The Package the HostedClusterPackage wants in `namespace`, as a server-side apply body.
pub fn desired_package(hcpkg: &HostedClusterPackage, namespace: &str) -> Value {
    let name = hcpkg.metadata.name.clone().unwrap_or_default();
    let template: &PackageTemplateSpec = &hcpkg.spec.template;
    let mut labels = template.metadata.labels.clone().unwrap_or_default();
    labels.insert(HOSTED_CLUSTER_PACKAGE_LABEL.to_owned(), name.clone());
    json!({
        "apiVersion": "package-operator.run/v1alpha1",
        "kind": "Package",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": template.metadata.annotations.clone().unwrap_or_default(),
            "ownerReferences": [{
                "apiVersion": HostedClusterPackage::api_version(&()),
                "kind": HostedClusterPackage::kind(&()),
                "name": name,
                "uid": hcpkg.metadata.uid.clone().unwrap_or_default(),
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": template.spec,
    })
}

/// Where one Package stands against the template, and why it fails when it does.
///
/// Live: Progressing=False and Available=True, both for its current generation (the ObjectDeployment
/// sets Progressing=False only once its latest revision succeeded and the older ones are archived).
/// Failed: for its current generation it is Invalid, cannot be unpacked, its latest revision reports
/// why it is unavailable (Progressing reason `LatestRevisionUnavailable`), or it settled and is not
/// Available.
pub fn package_state(
    template: &PackageTemplateSpec,
    package: &PackageObject,
) -> (PackageState, Option<String>) {
    let generation = package.meta.generation.unwrap_or_default();
    let conditions = &package.status.conditions;
    let fresh = |type_: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_ && c.observed_generation.is_none_or(|g| g == generation))
    };
    let updated = package.spec == template.spec;
    let progressing = fresh("Progressing");
    let available = fresh("Available");
    let not_progressing = progressing.is_some_and(|c| c.status == "False");
    let is_available = available.is_some_and(|c| c.status == "True");
    let failure = if let Some(c) = fresh("Invalid").filter(|c| c.status == "True") {
        Some(format!("invalid: {}", c.message))
    } else if let Some(c) = fresh("Unpacked").filter(|c| c.status == "False") {
        Some(format!("cannot unpack: {}", c.message))
    } else if let Some(c) =
        progressing.filter(|c| c.status == "True" && c.reason == LATEST_REVISION_UNAVAILABLE)
    {
        Some(c.message.clone())
    } else if not_progressing && !is_available {
        available.map(|c| c.message.clone())
    } else {
        None
    };
    let state = PackageState {
        updated,
        available: is_available,
        live: not_progressing && is_available && failure.is_none(),
        failed: failure.is_some(),
        progressed: updated && not_progressing,
        paused: is_true_for(conditions, "Paused", generation),
    };
    (state, failure)
}

fn counts(c: &Counts) -> HostedClusterPackageCounts {
    let n = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
    HostedClusterPackageCounts {
        total_packages: n(c.total),
        updated_packages: n(c.updated),
        available_packages: n(c.available),
        unavailable_packages: n(c.unavailable),
        progressed_packages: n(c.progressed),
        in_flight_packages: n(c.in_flight),
        failed_packages: n(c.failed),
    }
}

/// The status for `plan`: counts, partitions, the in-flight Packages (`packages` by namespace gives their
/// names and UIDs) and the conditions, keeping transition times of unchanged conditions.
pub fn rollout_status(
    previous: &[Condition],
    generation: i64,
    input: &RolloutInput,
    plan: &RolloutPlan,
    strategy: RolloutStrategy,
    packages: &BTreeMap<String, Arc<PackageObject>>,
    now: Timestamp,
) -> HostedClusterPackageStatus {
    let mut conditions = previous.to_vec();
    for update in rollout_conditions(input, plan, strategy) {
        set_condition(&mut conditions, update, generation, now);
    }
    HostedClusterPackageStatus {
        conditions,
        observed_generation: generation,
        counts: counts(&plan.counts),
        partitions: plan
            .groups
            .iter()
            .map(|g| HostedClusterPackagePartitionStatus {
                name: g.name.clone().unwrap_or_else(|| UNKNOWN_GROUP.to_owned()),
                order: i32::try_from(g.order).unwrap_or(i32::MAX),
                counts: counts(&g.counts),
            })
            .collect(),
        processing: plan
            .processing
            .iter()
            .map(|ns| HostedClusterPackageRefStatus {
                uid: packages
                    .get(ns)
                    .and_then(|p| p.meta.uid.clone())
                    .unwrap_or_default(),
                name: packages
                    .get(ns)
                    .and_then(|p| p.meta.name.clone())
                    .unwrap_or_default(),
                namespace: ns.clone(),
            })
            .collect(),
    }
}

/// The status of a HostedClusterPackage whose spec is invalid: Available=False naming the field.
pub fn invalid_status(
    previous: &HostedClusterPackageStatus,
    generation: i64,
    problem: &str,
    now: Timestamp,
) -> HostedClusterPackageStatus {
    let mut status = previous.clone();
    set_condition(
        &mut status.conditions,
        ConditionUpdate::new("Available", false, "InvalidSpec", problem),
        generation,
        now,
    );
    set_condition(
        &mut status.conditions,
        ConditionUpdate::new(
            "Progressing",
            false,
            "InvalidSpec",
            "The spec cannot be rolled out; see Available.",
        ),
        generation,
        now,
    );
    status.observed_generation = generation;
    status
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn hcpkg(spec: Value) -> HostedClusterPackage {
        serde_json::from_value(json!({
            "apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
            "metadata": {"name": "addon", "uid": "u-1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn template() -> Value {
        json!({"metadata": {"labels": {"team": "sre"}}, "spec": {"image": "registry/addon:v2"}})
    }

    #[test]
    fn invalid_specs_name_the_field() {
        let cases = [
            (
                json!({"rollingUpgrade": {"maxUnavailable": 0}}),
                None,
                "spec.strategy.rollingUpgrade.maxUnavailable: must be at least 1, got 0",
            ),
            (
                json!({}),
                None,
                "spec.strategy: set exactly one of instant and rollingUpgrade",
            ),
            (
                json!({"instant": {}}),
                Some(json!({"labelKey": "risk", "order": {"static": []}})),
                "spec.partition.order: set a non-empty static list or alphanumericAsc",
            ),
            (
                json!({"instant": {}}),
                Some(json!({"labelKey": "risk", "order": {"static": ["a", "a"]}})),
                "spec.partition.order.static: \"a\" is listed twice",
            ),
            (
                json!({"instant": {}}),
                Some(json!({"labelKey": ""})),
                "spec.partition.labelKey: must not be empty",
            ),
        ];
        for (strategy, partition, want) in cases {
            let mut spec = json!({"strategy": strategy, "template": template()});
            if let Some(p) = partition {
                spec["partition"] = p;
            }
            assert_eq!(rollout_settings(&hcpkg(spec)).unwrap_err(), want);
        }
        let bad_selector = hcpkg(json!({"template": template(),
            "hostedClusterSelector": {"matchExpressions": [{"key": "k", "operator": "Maybe"}]}}));
        let err = rollout_settings(&bad_selector).unwrap_err();
        assert!(
            err.starts_with("spec.hostedClusterSelector.matchExpressions[0]"),
            "{err}"
        );
        let good = hcpkg(
            json!({"template": template(), "strategy": {"rollingUpgrade": {"maxUnavailable": 2}},
            "partition": {"labelKey": "risk", "order": {"static": ["early", "late"]}}}),
        );
        let settings = rollout_settings(&good).unwrap();
        assert_eq!(
            settings.strategy,
            RolloutStrategy::RollingUpgrade { max_unavailable: 2 }
        );
        assert_eq!(
            settings.partition,
            Some((
                "risk".into(),
                PartitionOrder::Static(vec!["early".into(), "late".into()])
            ))
        );
    }

    #[test]
    fn the_desired_package_carries_the_template_and_its_owner() {
        let p = desired_package(&hcpkg(json!({"template": template()})), "clusters-a");
        assert_eq!(p["metadata"]["name"], "addon");
        assert_eq!(p["metadata"]["namespace"], "clusters-a");
        assert_eq!(p["metadata"]["labels"]["team"], "sre");
        assert_eq!(
            p["metadata"]["labels"][HOSTED_CLUSTER_PACKAGE_LABEL],
            "addon"
        );
        assert_eq!(
            p["metadata"]["ownerReferences"][0]["kind"],
            "HostedClusterPackage"
        );
        assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(p["spec"]["image"], "registry/addon:v2");
    }

    #[test]
    fn package_state_reads_spec_and_current_conditions() {
        let h = hcpkg(json!({"template": template()}));
        let package = |image: &str, generation: i64, conditions: Value| -> PackageObject {
            let conditions: Vec<Value> = conditions
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    let mut c = c.clone();
                    c["lastTransitionTime"] = json!("2026-01-01T00:00:00Z");
                    c
                })
                .collect();
            let p: pko_proto::core::package::Package = serde_json::from_value(json!({
                "apiVersion": "package-operator.run/v1alpha1", "kind": "Package",
                "metadata": {"name": "addon", "namespace": "clusters-a", "generation": generation},
                "spec": {"image": image},
                "status": {"conditions": conditions},
            }))
            .unwrap();
            p.into()
        };
        let c = |type_: &str, status: &str, reason: &str, message: &str, observed: i64| {
            json!({"type": type_, "status": status, "reason": reason, "message": message,
                   "observedGeneration": observed})
        };
        let live = json!([
            c("Available", "True", "Available", "", 3),
            c("Progressing", "False", "Idle", "", 3)
        ]);
        let state = |image: &str, generation: i64, conditions: &Value| {
            package_state(
                &h.spec.template,
                &package(image, generation, conditions.clone()),
            )
        };
        assert_eq!(
            state("registry/addon:v2", 3, &live),
            (
                PackageState {
                    updated: true,
                    available: true,
                    live: true,
                    failed: false,
                    progressed: true,
                    paused: false
                },
                None
            )
        );
        // Just updated: the conditions are for the previous generation.
        assert_eq!(
            state("registry/addon:v2", 4, &live),
            (PackageState::just_updated(), None)
        );
        let (outdated, _) = state("registry/addon:v1", 3, &live);
        assert!(!outdated.updated && outdated.available && !outdated.progressed);

        // Available on the previous revision while the latest one is on its way: in flight.
        let on_previous = json!([
            c(
                "Available",
                "True",
                "Available",
                "Previous Revision 'a-1' is still Available.",
                4
            ),
            c(
                "Progressing",
                "True",
                "Progressing",
                "Latest revision is progressing.",
                4
            )
        ]);
        let (s, why) = state("registry/addon:v2", 4, &on_previous);
        assert!(
            s.available && !s.live && !s.failed && why.is_none(),
            "{s:?}"
        );
        // The latest revision says why it is unavailable: failed, with its message.
        let failing = json!([
            c(
                "Available",
                "False",
                "ObjectSetUnready",
                "No ObjectSet is available.",
                4
            ),
            c(
                "Progressing",
                "True",
                "LatestRevisionUnavailable",
                "Latest Revision is Unavailable: Phase \"deploy\" failed: probe",
                4
            )
        ]);
        let (s, why) = state("registry/addon:v2", 4, &failing);
        assert!(s.failed && !s.live);
        assert_eq!(
            why.as_deref(),
            Some("Latest Revision is Unavailable: Phase \"deploy\" failed: probe")
        );
        // Settled, then broke: failed with the Available message.
        let broke = json!([
            c(
                "Available",
                "False",
                "ObjectSetUnready",
                "No ObjectSet is available.",
                4
            ),
            c("Progressing", "False", "Idle", "Update concluded.", 4)
        ]);
        let (s, why) = state("registry/addon:v2", 4, &broke);
        assert!(s.failed && !s.live);
        assert_eq!(why.as_deref(), Some("No ObjectSet is available."));
        // Invalid or not unpacking: failed, whatever the deployment says.
        let invalid = json!([
            c("Invalid", "True", "LoadError", "manifest.yaml: bad", 4),
            c("Available", "True", "Available", "", 4),
            c(
                "Progressing",
                "True",
                "LoadError",
                "The current spec cannot be rolled out",
                4
            )
        ]);
        let (s, why) = state("registry/addon:v2", 4, &invalid);
        assert!(s.failed && !s.live);
        assert_eq!(why.as_deref(), Some("invalid: manifest.yaml: bad"));
        let pull = json!([c("Unpacked", "False", "ImagePullBackOff", "not found", 4)]);
        let (s, why) = state("registry/addon:v2", 4, &pull);
        assert!(s.failed);
        assert_eq!(why.as_deref(), Some("cannot unpack: not found"));
    }
}

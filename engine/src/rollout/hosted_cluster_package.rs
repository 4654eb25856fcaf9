//! The rules of a HostedClusterPackage around the rollout planner: its spec checked and turned into
//! planner settings, the Package it wants in each HCP namespace, each Package's rollout state, the
//! decision for one snapshot of the fleet ([`decide_rollout`]), and the status it reports. No I/O.

use pko_proto::well_known::HOSTED_CLUSTER_PACKAGE_LABEL;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use pko_proto::core::hosted_cluster_package::{
    HostedClusterPackage, HostedClusterPackageCounts, HostedClusterPackagePartitionStatus,
    HostedClusterPackageRefStatus, HostedClusterPackageStatus,
};
use pko_proto::core::package::{Package, PackageSpec, PackageStatus, PackageTemplateSpec};
use serde_json::{json, Value};

use crate::api_time::stamp;
use crate::conditions::{is_current, is_true_for, set_condition, ConditionUpdate};
use crate::label_selector::selector_matches;
use crate::notifications::notification_sink::notification_sinks;
use crate::objects::deployment_plan::LATEST_REVISION_UNAVAILABLE;
use crate::rollout::rollout_calendar::{calendar_policy, CalendarPolicy};
use crate::rollout::rollout_plan::{
    Counts, PackageState, PartitionOrder, RolloutInput, RolloutPlan, RolloutStrategy, UNKNOWN_GROUP,
};
use crate::rollout::rollout_policy::{budget, rollout_policy, Budget, RolloutPolicy};
use crate::rollout::rollout_status::rollout_conditions;

/// The Package conditions a rollout judges a Package on ([`package_state`]).
pub const JUDGED_CONDITIONS: [&str; 5] =
    ["Progressing", "Available", "Invalid", "Unpacked", "Paused"];

/// What the rollout reads of a Package it owns, and nothing else: its identity (namespace, name, UID),
/// generation, spec and the conditions of [`JUDGED_CONDITIONS`]. Two Packages that differ only in what is
/// left out (resource version, labels, annotations, other status fields) are equal, so a supervisor
/// decides again only when an event changes what its decision reads.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedPackage {
    pub meta: ObjectMeta,
    pub spec: PackageSpec,
    pub status: PackageStatus,
}

impl From<Package> for OwnedPackage {
    fn from(p: Package) -> Self {
        let conditions = p
            .status
            .map(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| JUDGED_CONDITIONS.contains(&c.type_.as_str()))
            .collect();
        Self {
            meta: ObjectMeta {
                namespace: p.metadata.namespace,
                name: p.metadata.name,
                uid: p.metadata.uid,
                generation: p.metadata.generation,
                ..ObjectMeta::default()
            },
            spec: p.spec,
            status: PackageStatus {
                conditions,
                ..PackageStatus::default()
            },
        }
    }
}

/// The strategy as the spec gives it: a rolling upgrade's budget may be a percentage of the selected
/// Packages, resolved once they are known ([`StrategySetting::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrategySetting {
    Instant,
    RollingUpgrade { max_unavailable: Budget },
}

impl StrategySetting {
    /// The planner's strategy for `total` selected Packages.
    pub fn resolve(self, total: usize) -> RolloutStrategy {
        match self {
            StrategySetting::Instant => RolloutStrategy::Instant,
            StrategySetting::RollingUpgrade { max_unavailable } => {
                RolloutStrategy::RollingUpgrade {
                    max_unavailable: crate::rollout::rollout_policy::max_unavailable(
                        max_unavailable,
                        total,
                    ),
                }
            }
        }
    }
}

/// How a HostedClusterPackage rolls out, from a valid spec.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutSettings {
    pub selector: LabelSelector,
    pub strategy: StrategySetting,
    /// The partition label key and order.
    pub partition: Option<(String, PartitionOrder)>,
    /// `spec.rolloutPolicy` (empty when unset).
    pub policy: RolloutPolicy,
    /// Its maintenance windows and skips.
    pub calendar: CalendarPolicy,
}

/// Checks the spec; the error names the field and the problem.
pub fn rollout_settings(hcpkg: &HostedClusterPackage) -> Result<RolloutSettings, String> {
    let spec = &hcpkg.spec;
    let strategy = match (&spec.strategy.instant, &spec.strategy.rolling_upgrade) {
        (Some(_), None) => StrategySetting::Instant,
        (None, Some(rolling)) => {
            let field = "spec.strategy.rollingUpgrade.maxUnavailable";
            match budget(&rolling.max_unavailable, field)? {
                Budget::Count(0) => {
                    return Err(format!("{field}: must be at least 1, got 0"));
                }
                Budget::Percent(0) => {
                    return Err(format!("{field}: must be more than 0%"));
                }
                b => StrategySetting::RollingUpgrade { max_unavailable: b },
            }
        }
        _ => return Err("spec.strategy: set exactly one of instant and rollingUpgrade".into()),
    };
    let policy = rollout_policy(spec.rollout_policy.as_ref())?;
    let calendar = calendar_policy(spec.rollout_policy.as_ref())?;
    // Checked here so that a bad sink makes the spec invalid; its supervisor serves the sinks.
    notification_sinks(spec.rollout_policy.as_ref())?;
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
        policy,
        calendar,
    })
}

/// The Package the HostedClusterPackage wants in `namespace` with `template` (the spec's, or a rollback's),
/// as a server-side apply body.
pub fn desired_package(
    hcpkg: &HostedClusterPackage,
    template: &PackageTemplateSpec,
    namespace: &str,
) -> Value {
    let name = hcpkg.metadata.name.clone().unwrap_or_default();
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
    package: &OwnedPackage,
) -> (PackageState, Option<String>) {
    let generation = package.meta.generation.unwrap_or_default();
    let conditions = &package.status.conditions;
    let fresh = |type_: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_ && is_current(c, generation))
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
/// names and UIDs; `since` when each was decided, new ones now) and the conditions, keeping transition
/// times of unchanged conditions.
#[allow(clippy::too_many_arguments)]
pub fn rollout_status(
    previous: &[Condition],
    generation: i64,
    input: &RolloutInput,
    plan: &RolloutPlan,
    strategy: RolloutStrategy,
    packages: &BTreeMap<String, Arc<OwnedPackage>>,
    since: &BTreeMap<String, Timestamp>,
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
                ..Default::default()
            })
            .collect(),
        promotion: None,
        last_succeeded: None,
        halted: None,
        preflight: None,
        skipped: Vec::new(),
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
                since: Some(stamp(since.get(ns).copied().unwrap_or(now))),
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
    use crate::conditions::find_condition;
    use crate::fleet::promotion_gate::{package_template_hash, HubView};
    use crate::rollout::preflight_gate::passed_preflight;
    use crate::rollout::rollout_decision::*;
    use pko_proto::hypershift::HostedCluster;

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
            StrategySetting::RollingUpgrade {
                max_unavailable: Budget::Count(2)
            }
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
        let h = hcpkg(json!({"template": template()}));
        let p = desired_package(&h, &h.spec.template, "clusters-a");
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
        let package = |image: &str, generation: i64, conditions: Value| -> OwnedPackage {
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

    #[test]
    fn an_owned_package_differs_only_in_what_the_rollout_reads() {
        let package = |edit: &dyn Fn(&mut Value)| -> OwnedPackage {
            let mut p = json!({
                "apiVersion": "package-operator.run/v1alpha1", "kind": "Package",
                "metadata": {"name": "addon", "namespace": "clusters-a", "uid": "u1",
                    "generation": 3, "resourceVersion": "10",
                    "labels": {"shard.package-operator.run/owner": "a"}},
                "spec": {"image": "registry/addon:v2"},
                "status": {"revision": 2, "unpackedHash": "h1", "conditions": [
                    {"type": "Available", "status": "True", "reason": "Available", "message": "",
                     "observedGeneration": 3, "lastTransitionTime": "2026-01-01T00:00:00Z"},
                    {"type": "example.com/Ready", "status": "True", "reason": "R", "message": "",
                     "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
            });
            edit(&mut p);
            serde_json::from_value::<Package>(p).unwrap().into()
        };
        let base = package(&|_| {});
        assert_eq!(
            base.status.conditions.len(),
            1,
            "only judged conditions are kept"
        );
        assert_eq!(base.meta.uid.as_deref(), Some("u1"));
        // What the rollout does not read: equal.
        for unread in [
            &(|p: &mut Value| p["metadata"]["resourceVersion"] = json!("11"))
                as &dyn Fn(&mut Value),
            &|p| p["metadata"]["labels"]["shard.package-operator.run/owner"] = json!("b"),
            &|p| p["metadata"]["annotations"] = json!({"traceparent": "00-a-b-01"}),
            &|p| p["status"]["revision"] = json!(3),
            &|p| p["status"]["unpackedHash"] = json!("h2"),
            &|p| p["status"]["conditions"][1]["status"] = json!("False"),
        ] {
            assert_eq!(package(unread), base);
        }
        // What it reads: different.
        for read in [
            &(|p: &mut Value| p["metadata"]["generation"] = json!(4)) as &dyn Fn(&mut Value),
            &|p| p["spec"]["image"] = json!("registry/addon:v3"),
            &|p| p["status"]["conditions"][0]["status"] = json!("False"),
            &|p| p["status"]["conditions"][0]["message"] = json!("1 of 2 objects"),
            &|p| p["status"]["conditions"][0]["observedGeneration"] = json!(2),
        ] {
            assert_ne!(package(read), base);
        }
    }

    fn cluster(name: &str, available: bool) -> Arc<HostedCluster> {
        let status = if available { "True" } else { "False" };
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
                "metadata": {"name": name, "namespace": "clusters"},
                "status": {"conditions": [{"type": "Available", "status": status, "reason": "R",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
            }))
            .unwrap(),
        )
    }

    fn owned(namespace: &str, image: &str) -> Arc<OwnedPackage> {
        owned_with_status(namespace, image, json!({}))
    }

    fn owned_with_status(namespace: &str, image: &str, status: Value) -> Arc<OwnedPackage> {
        let p: Package = serde_json::from_value(json!({
            "apiVersion": "package-operator.run/v1alpha1", "kind": "Package",
            "metadata": {"name": "addon", "namespace": namespace, "uid": format!("uid-{namespace}"),
                "generation": 1},
            "spec": {"image": image},
            "status": status,
        }))
        .unwrap();
        Arc::new(p.into())
    }

    /// A Package live on `image` for its generation.
    fn live(namespace: &str, image: &str) -> Arc<OwnedPackage> {
        let condition = |type_: &str, status: &str| {
            json!({"type": type_, "status": status, "reason": "R", "message": "",
                   "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"})
        };
        let conditions = [
            condition("Available", "True"),
            condition("Progressing", "False"),
        ];
        owned_with_status(namespace, image, json!({ "conditions": conditions }))
    }

    fn template_spec(image: &str) -> PackageSpec {
        serde_json::from_value(json!({"image": image})).unwrap()
    }

    fn snapshot(spec: Value, clusters: Vec<Arc<HostedCluster>>) -> RolloutSnapshot {
        let mut hcpkg = hcpkg(spec);
        hcpkg.metadata.generation = Some(2);
        let hash = package_template_hash(&hcpkg.spec);
        RolloutSnapshot {
            hcpkg,
            packages: BTreeMap::new(),
            writing: BTreeMap::new(),
            clusters,
            failures: BTreeMap::new(),
            gate: GateInput::Preview,
            health: BTreeMap::new(),
            // Every release passed its preflight (`preflight_gate` has the tests of holding for one).
            preflight: Some(passed_preflight(&hash)),
        }
    }

    fn now() -> Timestamp {
        "2026-02-01T00:00:00Z".parse().unwrap()
    }

    #[test]
    fn an_invalid_spec_decides_only_its_status() {
        let s = snapshot(
            json!({"template": template(), "strategy": {"rollingUpgrade": {"maxUnavailable": 0}}}),
            vec![cluster("a", true)],
        );
        let RolloutDecision::Invalid(status) = decide_rollout(&s, now()) else {
            panic!("expected an invalid spec");
        };
        let available = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Available")
            .unwrap();
        assert_eq!(available.status, "False");
        assert!(available
            .message
            .contains("spec.strategy.rollingUpgrade.maxUnavailable"));
        assert_eq!(status.observed_generation, 2);
    }

    #[test]
    fn unavailable_clusters_wait_and_packages_of_unselected_clusters_go() {
        let mut s = snapshot(
            json!({"template": template(), "strategy": {"instant": {}}}),
            vec![cluster("a", true), cluster("b", false), cluster("c", false)],
        );
        // c is not Available but already has its Package: it keeps being counted.
        s.packages.insert(
            "clusters-c".into(),
            owned("clusters-c", "registry/addon:v1"),
        );
        // d's HostedCluster is gone.
        s.packages.insert(
            "clusters-d".into(),
            owned("clusters-d", "registry/addon:v2"),
        );
        let RolloutDecision::Planned(step) = decide_rollout(&s, now()) else {
            panic!("expected a plan");
        };
        let targets: Vec<&str> = step
            .input
            .targets
            .iter()
            .map(|t| t.namespace.as_str())
            .collect();
        assert_eq!(targets, ["clusters-a", "clusters-c"]);
        assert_eq!(step.deletes, ["clusters-d"]);
        assert_eq!(step.plan.create, ["clusters-a"]);
        assert_eq!(step.plan.update, ["clusters-c"]);
        assert_eq!(step.status.observed_generation, 2);
    }

    /// Found by the chaos run (issue 41, seed 2): a HostedCluster joining a group the rollout had not
    /// reached got the template still on trial in the canary group.
    #[test]
    fn a_cluster_joining_a_later_group_is_created_with_the_last_template_that_finished() {
        let spec = json!({
            "template": template(),
            "partition": {"labelKey": "group", "order": {"static": ["canary", "rest"]}},
            "strategy": {"rollingUpgrade": {"maxUnavailable": 1}},
        });
        let labelled = |name: &str, group: &str| {
            let mut c = (*cluster(name, true)).clone();
            c.metadata.labels = Some([("group".to_owned(), group.to_owned())].into());
            Arc::new(c)
        };
        let mut s = snapshot(
            spec,
            vec![
                labelled("a", "canary"),
                labelled("b", "rest"),
                labelled("c", "rest"),
            ],
        );
        s.packages.insert(
            "clusters-a".into(),
            owned("clusters-a", "registry/addon:v2"),
        );
        s.packages.insert(
            "clusters-b".into(),
            owned("clusters-b", "registry/addon:v1"),
        );
        let proven: PackageTemplateSpec =
            serde_json::from_value(json!({"spec": {"image": "registry/addon:v1"}})).unwrap();
        s.hcpkg.status = Some(HostedClusterPackageStatus {
            last_succeeded: Some(
                pko_proto::core::hosted_cluster_package::HostedClusterPackageSucceededTemplate {
                    template_hash: "v1-hash".into(),
                    template: proven.clone(),
                    finished_at: "2026-01-31T00:00:00Z".into(),
                },
            ),
            ..HostedClusterPackageStatus::default()
        });
        let RolloutDecision::Planned(step) = decide_rollout(&s, now()) else {
            panic!("expected a plan");
        };
        assert_eq!(step.plan.current_group, Some(0), "{:?}", step.plan.groups);
        assert!(step.plan.create.is_empty());
        assert_eq!(step.plan.create_proven, ["clusters-c"]);
        assert_eq!(step.proven_template, Some(proven));
        assert_eq!(step.template.spec.image, "registry/addon:v2");
    }

    #[test]
    fn a_closed_promotion_gate_writes_nothing_and_says_why() {
        let spec = json!({"template": template(), "promotion": {"managementClusters": ["canary"]}});
        let mut s = snapshot(spec, vec![cluster("a", true), cluster("b", true)]);
        s.packages.insert(
            "clusters-b".into(),
            owned("clusters-b", "registry/addon:v1"),
        );
        s.gate = GateInput::Fleet {
            cluster: "prod".into(),
            hub: None,
        };
        let RolloutDecision::Planned(step) = decide_rollout(&s, now()) else {
            panic!("expected a plan");
        };
        assert!(step.plan.create.is_empty() && step.plan.update.is_empty());
        assert!(step.status.processing.is_empty());
        let gate = find_condition(&step.status.conditions, "PromotionGateOpen").unwrap();
        assert_eq!(
            (gate.status.as_str(), gate.reason.as_str()),
            ("False", "NotInFleet")
        );
        // Previews plan as if it were open.
        s.gate = GateInput::Preview;
        let RolloutDecision::Planned(step) = decide_rollout(&s, now()) else {
            panic!("expected a plan");
        };
        assert_eq!(step.plan.create, ["clusters-a"]);
        assert_eq!(step.plan.update, ["clusters-b"]);
    }

    #[test]
    fn a_release_halted_in_another_management_cluster_halts_here_too() {
        use crate::fleet::promotion_gate::{HubState, ObservedRollout, POISONED_RELEASE};
        use pko_proto::fleet::{FleetRolloutRecord, RECORD_VERSION};
        let spec = json!({"template": template(), "rolloutPolicy": {"rollback": "Automatic"}});
        let mut s = snapshot(spec, vec![cluster("a", true), cluster("b", true)]);
        let hash = package_template_hash(&s.hcpkg.spec);
        let canary = |poisoned: Vec<String>| FleetRolloutRecord {
            version: RECORD_VERSION,
            cluster: "canary".into(),
            hosted_cluster_package: "addon".into(),
            generation: 1,
            template_hash: "other".into(),
            partition: None,
            total: 3,
            updated: 3,
            available: 0,
            failed: 3,
            settled: false,
            settled_since: None,
            gate: None,
            last_event_at: None,
            poisoned,
            updated_at: now(),
        };
        let hub = |record| HubView {
            state: HubState::Reachable,
            clusters: BTreeMap::new(),
            rollouts: BTreeMap::from([(
                "canary".to_owned(),
                ObservedRollout {
                    record,
                    // Long stale: a poisoned release stays poisoned.
                    age: std::time::Duration::from_secs(3_600),
                    settled_for: None,
                },
            )]),
        };
        // Another template poisoned: nothing to do with this one.
        s.gate = GateInput::Fleet {
            cluster: "prod".into(),
            hub: Some(hub(canary(vec!["other".into()]))),
        };
        let RolloutDecision::Planned(step) = decide_rollout(&s, now()) else {
            panic!("expected a plan");
        };
        assert!(step.status.halted.is_none());
        assert_eq!(step.plan.create, ["clusters-a", "clusters-b"]);
        // This template poisoned by the canary: halted here before a Package is written, rolling back.
        s.gate = GateInput::Fleet {
            cluster: "prod".into(),
            hub: Some(hub(canary(vec!["other".into(), hash.clone()]))),
        };
        let RolloutDecision::Planned(step) = decide_rollout(&s, now()) else {
            panic!("expected a plan");
        };
        let halted = step.status.halted.as_ref().expect("halted");
        assert_eq!(halted.reason, POISONED_RELEASE);
        assert_eq!(halted.template_hash, hash);
        assert!(halted.rolling_back);
        assert!(halted.message.contains("canary"), "{}", halted.message);
        assert!(step.plan.create.is_empty() && step.plan.update.is_empty());
        // Its own poison does not count: the cluster that halted decides on its own halt.
        s.gate = GateInput::Fleet {
            cluster: "canary".into(),
            hub: Some(hub(canary(vec![hash]))),
        };
        let RolloutDecision::Planned(step) = decide_rollout(&s, now()) else {
            panic!("expected a plan");
        };
        assert!(step.status.halted.is_none());
    }

    #[test]
    fn writes_on_their_way_count_as_just_updated_and_failures_are_named() {
        let mut s = snapshot(
            json!({"template": template(), "strategy": {"rollingUpgrade": {"maxUnavailable": 1}}}),
            vec![cluster("a", true), cluster("b", true)],
        );
        s.packages.insert(
            "clusters-a".into(),
            owned("clusters-a", "registry/addon:v1"),
        );
        s.packages.insert(
            "clusters-b".into(),
            owned("clusters-b", "registry/addon:v1"),
        );
        s.writing
            .insert("clusters-a".into(), template_spec("registry/addon:v2"));
        s.failures
            .insert("clusters-b".into(), "quota exceeded".into());
        let RolloutDecision::Planned(step) = decide_rollout(&s, now()) else {
            panic!("expected a plan");
        };
        assert_eq!(
            step.input.targets[0].package,
            Some(PackageState::just_updated())
        );
        // The write on its way is not made again.
        assert_eq!(step.plan.update, ["clusters-b"]);
        let progressing = step
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Progressing")
            .unwrap();
        assert!(
            progressing
                .message
                .ends_with("Failing, retried with backoff: clusters-b: quota exceeded."),
            "{}",
            progressing.message
        );
    }

    /// A write retried after a failure may land whatever was observed since. Decided before the
    /// template changed (a rollback), it does not count as done on the new template: it is planned as
    /// outdated and unavailable, written again with the template (replacing the retried one), and
    /// holds its place in the budget.
    #[test]
    fn a_retried_write_of_another_template_is_replaced_and_holds_the_budget() {
        let mut s = snapshot(
            json!({"template": template(), "strategy": {"rollingUpgrade": {"maxUnavailable": 1}}}),
            vec![cluster("a", true), cluster("b", true)],
        );
        s.packages
            .insert("clusters-a".into(), live("clusters-a", "registry/addon:v2"));
        s.packages
            .insert("clusters-b".into(), live("clusters-b", "registry/addon:v1"));
        s.writing
            .insert("clusters-a".into(), template_spec("registry/addon:v1"));
        s.failures
            .insert("clusters-a".into(), "webhook refused".into());
        let RolloutDecision::Planned(step) = decide_rollout(&s, now()) else {
            panic!("expected a plan");
        };
        assert_eq!(step.input.targets[0].package, Some(PackageState::default()));
        assert_eq!(step.plan.update, ["clusters-a"]);
        assert_eq!(step.status.counts.unavailable_packages, 1);
    }
}

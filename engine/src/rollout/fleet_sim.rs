//! A fleet under one HostedClusterPackage for the rollout's unit tests, stepped by hand: decisions are
//! taken with `decide_rollout` and carried out, Packages settle when told, the clock moves when told.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use pko_proto::core::hosted_cluster_package::{HostedClusterPackage, HostedClusterPackageStatus};
use pko_proto::core::rollout_preflight::HostedClusterPackagePreflightStatus;
use pko_proto::hypershift::HostedCluster;
use serde_json::{json, Value};

use crate::fleet::promotion_gate::package_template_hash;
use crate::objects::deployment_plan::LATEST_REVISION_UNAVAILABLE;
use crate::rollout::hosted_cluster_package::OwnedPackage;
use crate::rollout::preflight_gate::{passed_preflight, preflight_inputs_hash};
use crate::rollout::rollout_decision::{
    decide_rollout, GateInput, RolloutDecision, RolloutSnapshot, RolloutStep,
};
use crate::rollout::rollout_guard::HealthObservations;

/// How a simulated Package stands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Pkg {
    Live,
    InFlight,
    Failed,
}

/// A fleet under one HostedClusterPackage, stepped by hand: decisions are applied, Packages settle
/// when told.
pub(crate) struct Sim {
    pub(crate) spec: Value,
    pub(crate) annotations: BTreeMap<String, String>,
    pub(crate) generation: i64,
    pub(crate) status: HostedClusterPackageStatus,
    /// (cluster name, group label)
    pub(crate) clusters: Vec<(String, String)>,
    /// More labels of some clusters, by cluster name.
    pub(crate) labels: BTreeMap<String, BTreeMap<String, String>>,
    /// By namespace: image and state.
    pub(crate) packages: BTreeMap<String, (String, Pkg)>,
    pub(crate) health: HealthObservations,
    /// The digest every preflight finds.
    pub(crate) preflight_digest: String,
    pub(crate) now: Timestamp,
}

pub(crate) fn t0() -> Timestamp {
    "2026-03-01T00:00:00Z".parse().unwrap()
}

impl Sim {
    pub(crate) fn new(groups: &[(&str, usize)], spec: Value) -> Self {
        let clusters = groups
            .iter()
            .flat_map(|(g, n)| (0..*n).map(move |i| (format!("{g}{i}"), (*g).to_owned())))
            .collect();
        Self {
            spec,
            annotations: BTreeMap::new(),
            generation: 1,
            status: HostedClusterPackageStatus::default(),
            clusters,
            labels: BTreeMap::new(),
            packages: BTreeMap::new(),
            health: BTreeMap::new(),
            preflight_digest: String::new(),
            now: t0(),
        }
    }

    pub(crate) fn hcpkg(&self) -> HostedClusterPackage {
        let mut h: HostedClusterPackage = serde_json::from_value(json!({
            "apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
            "metadata": {"name": "addon", "uid": "u-1", "generation": self.generation,
                "annotations": self.annotations},
            "spec": self.spec,
        }))
        .unwrap();
        h.status = Some(self.status.clone());
        h
    }

    pub(crate) fn set_image(&mut self, image: &str) {
        self.spec["template"]["spec"]["image"] = image.into();
        self.generation += 1;
    }

    pub(crate) fn hash(&self) -> String {
        package_template_hash(&self.hcpkg().spec)
    }

    pub(crate) fn snapshot(&self) -> RolloutSnapshot {
        let clusters: Vec<Arc<HostedCluster>> = self
            .clusters
            .iter()
            .map(|(name, group)| {
                let mut labels = self.labels.get(name).cloned().unwrap_or_default();
                labels.insert("group".to_owned(), group.clone());
                Arc::new(
                    serde_json::from_value::<HostedCluster>(json!({
                        "metadata": {"name": name, "namespace": "clusters",
                            "labels": labels},
                        "status": {"conditions": [{"type": "Available", "status": "True"}]},
                    }))
                    .unwrap(),
                )
            })
            .collect();
        let packages = self
            .packages
            .iter()
            .map(|(ns, (image, state))| {
                let (available, progressing, reason) = match state {
                    Pkg::Live => ("True", "False", "Idle"),
                    Pkg::InFlight => ("True", "True", "Progressing"),
                    Pkg::Failed => ("False", "True", LATEST_REVISION_UNAVAILABLE),
                };
                let p: pko_proto::core::package::Package = serde_json::from_value(json!({
                    "apiVersion": "package-operator.run/v1alpha1", "kind": "Package",
                    "metadata": {"name": "addon", "namespace": ns, "uid": format!("u-{ns}"),
                        "generation": 1},
                    "spec": {"image": image},
                    "status": {"conditions": [
                        {"type": "Available", "status": available, "reason": "R", "message": "m",
                         "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"},
                        {"type": "Progressing", "status": progressing, "reason": reason,
                         "message": "probe fails", "observedGeneration": 1,
                         "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
                }))
                .unwrap();
                (ns.clone(), Arc::new(OwnedPackage::from(p)))
            })
            .collect();
        // Every release passed its preflight on the current fleet: what these tests decide is
        // the policy's.
        let preflight = HostedClusterPackagePreflightStatus {
            inputs_hash: preflight_inputs_hash(&self.hash(), &clusters),
            digest: self.preflight_digest.clone(),
            ..passed_preflight(&self.hash())
        };
        RolloutSnapshot {
            hcpkg: self.hcpkg(),
            packages,
            writing: BTreeMap::new(),
            clusters,
            failures: BTreeMap::new(),
            gate: GateInput::Preview,
            health: self.health.clone(),
            preflight: Some(preflight),
        }
    }

    /// Decides and carries the decision out: the status is stored, written Packages are in flight.
    pub(crate) fn step(&mut self) -> RolloutStep {
        let RolloutDecision::Planned(step) = decide_rollout(&self.snapshot(), self.now) else {
            panic!("invalid spec");
        };
        self.status = step.status.clone();
        let image = step.template.spec.image.clone();
        for ns in step.plan.create.iter().chain(&step.plan.update) {
            self.packages
                .insert(ns.clone(), (image.clone(), Pkg::InFlight));
        }
        *step
    }

    pub(crate) fn settle(&mut self, state: Pkg) {
        for (_, s) in self.packages.values_mut() {
            if *s == Pkg::InFlight {
                *s = state;
            }
        }
    }

    pub(crate) fn later(&mut self, seconds: i64) {
        self.now = Timestamp::from_second(self.now.as_second() + seconds).unwrap();
    }

    pub(crate) fn on(&self, image: &str) -> usize {
        self.packages.values().filter(|(i, _)| i == image).count()
    }

    pub(crate) fn condition(&self, type_: &str) -> (String, String, String) {
        let c = self
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap();
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    /// Steps until nothing more is written, every Package settling `state` after each step.
    pub(crate) fn run(&mut self, state: Pkg) {
        for _ in 0..50 {
            let step = self.step();
            self.settle(state);
            if step.plan.create.is_empty() && step.plan.update.is_empty() {
                let again = self.step();
                if again.plan.update.is_empty() {
                    return;
                }
            }
        }
        panic!("the rollout did not come to rest");
    }
}

pub(crate) fn spec(policy: Value, max_unavailable: Value) -> Value {
    json!({
        "strategy": {"rollingUpgrade": {"maxUnavailable": max_unavailable}},
        "partition": {"labelKey": "group", "order": {"static": ["early", "late"]}},
        "template": {"spec": {"image": "registry/addon:v1"}},
        "rolloutPolicy": policy,
    })
}

//! The rollout simulator (pko extension, issue 43): the manager's own decision (`decide_rollout`) run
//! offline over a snapshot of a fleet on a virtual clock. Every decision's writes land at once; a
//! written Package turns live after its readiness time, or fails then (the failure model); soaks and
//! deadlines end when the decision says; approvals are given when asked (and said so). What comes out is
//! what the manager would do: the waves, when each group starts, soaks, waits for approval and finishes,
//! the peak of unavailable Packages the budget counts, and what a failure halts or rolls back.
//!
//! The preflight is taken as passed and health checks as passing: the simulator answers "how long and
//! how risky", the preflight "what changes where". Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use pko_proto::core::hosted_cluster_package::{HostedClusterPackageStatus, RolloutApproval};
use pko_proto::core::package::{PackageSpec, PackageStatus};
use pko_proto::core::rollout_preflight::HostedClusterPackagePreflightStatus;
use pko_proto::well_known::ROLLOUT_APPROVALS_ANNOTATION;

use crate::fleet::promotion_gate::package_template_hash;
use crate::objects::deployment_plan::LATEST_REVISION_UNAVAILABLE;
use crate::rollout::health_check::HealthState;
use crate::rollout::hosted_cluster_package::OwnedPackage;
use crate::rollout::preflight_gate::preflight_inputs_hash;
use crate::rollout::rollout_decision::{
    annotations_approvals, decide_rollout, RolloutDecision, RolloutSnapshot, RolloutStep,
};
use crate::rollout::rollout_guard::{group_state, HealthObservation};

/// Decisions a simulation makes at most: a fleet of thousands takes a few per Package.
const MAX_DECISIONS: usize = 100_000;

/// How the simulated fleet behaves.
#[derive(Debug, Clone, PartialEq)]
pub struct SimulationModel {
    /// How long a written Package takes to be live (or to fail).
    pub readiness: Duration,
    /// Per namespace, instead of `readiness` (the rollout event stream's history).
    pub readiness_of: BTreeMap<String, Duration>,
    /// Namespaces whose update fails: their latest revision reports why it cannot become live.
    pub failing: BTreeSet<String>,
    /// Every other written Package fails with this probability, drawn from `seed` (the same seed tells
    /// the same story).
    pub fail_rate: f64,
    pub seed: u64,
    /// Give an approval when a group asks for one; without, the simulation ends there.
    pub approve: bool,
    /// The simulation stops after this much simulated time.
    pub horizon: Duration,
}

impl Default for SimulationModel {
    fn default() -> Self {
        Self {
            readiness: Duration::from_secs(30),
            readiness_of: BTreeMap::new(),
            failing: BTreeSet::new(),
            fail_rate: 0.0,
            seed: 0,
            approve: true,
            horizon: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// The writes of one decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wave {
    /// Simulated time since the start.
    pub at: Duration,
    /// The group the updates are in (`None`: creations only, or no partitions).
    pub group: Option<String>,
    pub created: Vec<String>,
    pub updated: Vec<String>,
    /// The writes return Packages to the last good template (a rollback).
    pub rollback: bool,
}

/// One group's story.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupStory {
    pub name: String,
    /// When it first got an update, waited for approval, started soaking, and finished.
    pub started: Option<Duration>,
    pub awaiting_approval: Option<Duration>,
    /// When it first waited for its members' maintenance windows.
    pub waiting_for_window: Option<Duration>,
    pub soaking: Option<Duration>,
    pub finished: Option<Duration>,
}

/// How a simulation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Every Package updated and live, every group soaked.
    Finished,
    /// The rollout halted and stays there (`rollback: Manual`).
    Halted { reason: String, message: String },
    /// The rollout halted and every Package is back on the last good template.
    RolledBack { reason: String, message: String },
    /// Nothing more would happen (why).
    Stuck(String),
    /// The spec cannot be rolled out (why).
    Invalid(String),
    /// The horizon was reached first.
    Horizon,
}

/// What a simulated rollout did.
#[derive(Debug, Clone, PartialEq)]
pub struct Simulation {
    pub waves: Vec<Wave>,
    pub groups: Vec<GroupStory>,
    /// The most Packages the budget counted unavailable at once.
    pub peak_unavailable: i32,
    /// The budget (maxUnavailable as resolved; 0 for the instant strategy).
    pub budget: usize,
    /// Namespaces whose update failed.
    pub failed: Vec<String>,
    pub ending: Ending,
    /// When it ended, since the start.
    pub ended_at: Duration,
}

/// A written Package's next moment: live, or failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Live,
    Failed,
}

/// Deterministic draws for the failure rate (SplitMix64): the same seed, the same story.
struct Draws(u64);

impl Draws {
    fn next_unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    generation: i64,
    now: Timestamp,
) -> Condition {
    let message = if reason == LATEST_REVISION_UNAVAILABLE {
        "failed by the simulation's failure model"
    } else {
        ""
    };
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: Some(generation),
        last_transition_time: Time(now),
    }
}

/// A Package as the simulated fleet holds it: `spec` at `generation`, and its conditions. In flight,
/// Available still speaks of the previous generation (its status has not caught up with the update),
/// as a real Package's does right after the write.
fn package(
    was: Option<&OwnedPackage>,
    namespace: &str,
    name: &str,
    spec: &PackageSpec,
    (available, progressing, reason): (&str, &str, &str),
    generation: i64,
    now: Timestamp,
) -> Arc<OwnedPackage> {
    let available_at = if reason == "Progressing" {
        generation - 1
    } else {
        generation
    };
    let mut meta = was.map(|p| p.meta.clone()).unwrap_or_default();
    meta.namespace = Some(namespace.to_owned());
    meta.name = Some(name.to_owned());
    meta.uid
        .get_or_insert_with(|| format!("simulated-{namespace}"));
    meta.generation = Some(generation);
    Arc::new(OwnedPackage {
        meta,
        spec: spec.clone(),
        status: PackageStatus {
            conditions: vec![
                condition("Available", available, "Simulated", available_at, now),
                condition("Progressing", progressing, reason, generation, now),
            ],
            ..PackageStatus::default()
        },
    })
}

/// The moment `start + at`.
fn moment(start: Timestamp, at: Duration) -> Timestamp {
    let at = SignedDuration::try_from(at).unwrap_or(SignedDuration::MAX);
    start.checked_add(at).unwrap_or(Timestamp::MAX)
}

/// Runs the rollout of `snapshot` (its HostedClusterPackage with status, its clusters and Packages)
/// under `model`, from `start`.
pub fn simulate(
    snapshot: RolloutSnapshot,
    model: &SimulationModel,
    start: Timestamp,
) -> Simulation {
    let mut run = Run::new(snapshot, model, start);
    let ending = run.go();
    Simulation {
        waves: run.waves,
        groups: run.groups,
        peak_unavailable: run.peak_unavailable,
        budget: run.budget,
        failed: run.failed.into_iter().collect(),
        ending,
        ended_at: run.at,
    }
}

/// A simulation under way.
struct Run<'a> {
    snapshot: RolloutSnapshot,
    model: &'a SimulationModel,
    start: Timestamp,
    at: Duration,
    /// Written Packages waiting for their next moment, by namespace.
    pending: BTreeMap<String, (Duration, Outcome)>,
    draws: Draws,
    waves: Vec<Wave>,
    groups: Vec<GroupStory>,
    peak_unavailable: i32,
    budget: usize,
    failed: BTreeSet<String>,
}

impl<'a> Run<'a> {
    fn new(snapshot: RolloutSnapshot, model: &'a SimulationModel, start: Timestamp) -> Self {
        Self {
            snapshot,
            model,
            start,
            at: Duration::ZERO,
            pending: BTreeMap::new(),
            draws: Draws(model.seed),
            waves: Vec::new(),
            groups: Vec::new(),
            peak_unavailable: 0,
            budget: 0,
            failed: BTreeSet::new(),
        }
    }

    fn now(&self) -> Timestamp {
        moment(self.start, self.at)
    }

    fn go(&mut self) -> Ending {
        for _ in 0..MAX_DECISIONS {
            self.assume_preflight_passed();
            let step = match decide_rollout(&self.snapshot, self.now()) {
                RolloutDecision::Invalid(status) => {
                    return Ending::Invalid(invalid_reason(&status))
                }
                RolloutDecision::Planned(step) => *step,
            };
            self.record(&step);
            if let Some(ending) = ended(&step.status, &step) {
                return ending;
            }
            if self.approve_waiting(&step.status) {
                continue;
            }
            let wrote = self.carry_out(&step);
            self.pass_health_checks(&step);
            if wrote {
                // As the manager does on its writes' answers: decide again at once.
                continue;
            }
            let Some(next) = self.next_moment(step.recheck_after) else {
                return Ending::Stuck(stuck_reason(&step.status));
            };
            if next > self.model.horizon {
                self.at = self.model.horizon;
                return Ending::Horizon;
            }
            self.at = next;
            self.settle();
        }
        Ending::Stuck(format!("more than {MAX_DECISIONS} decisions"))
    }

    /// The simulated fleet has no apiserver to dry-run against: every release passed its preflight.
    fn assume_preflight_passed(&mut self) {
        let hash = package_template_hash(&self.snapshot.hcpkg.spec);
        self.snapshot.preflight = Some(HostedClusterPackagePreflightStatus {
            inputs_hash: preflight_inputs_hash(&hash, &self.snapshot.clusters),
            template_hash: hash,
            ..Default::default()
        });
    }

    /// Keeps the decision's status (as the manager writes it) and what it tells.
    fn record(&mut self, step: &RolloutStep) {
        let status = &step.status;
        self.peak_unavailable = self
            .peak_unavailable
            .max(status.counts.unavailable_packages);
        self.budget = match step.input.strategy {
            crate::rollout::rollout_plan::RolloutStrategy::RollingUpgrade { max_unavailable } => {
                max_unavailable
            }
            crate::rollout::rollout_plan::RolloutStrategy::Instant => 0,
        };
        // A group's story is the release's: a rollback's writes are told by its waves and the ending.
        let partitions = if status.halted.is_some() {
            &[][..]
        } else {
            &status.partitions[..]
        };
        for partition in partitions {
            let at = self.at;
            let story = match self.groups.iter_mut().find(|g| g.name == partition.name) {
                Some(story) => story,
                None => {
                    self.groups.push(GroupStory {
                        name: partition.name.clone(),
                        ..GroupStory::default()
                    });
                    let last = self.groups.len() - 1;
                    &mut self.groups[last]
                }
            };
            let state = partition.state.as_str();
            if partition.counts.updated_packages > 0 || state == group_state::PROGRESSING {
                story.started.get_or_insert(at);
            }
            match state {
                group_state::AWAITING_APPROVAL => {
                    story.awaiting_approval.get_or_insert(at);
                }
                group_state::WAITING_FOR_WINDOW => {
                    story.waiting_for_window.get_or_insert(at);
                }
                group_state::SOAKING => {
                    story.soaking.get_or_insert(at);
                }
                group_state::FINISHED => {
                    story.finished.get_or_insert(at);
                }
                _ => {}
            }
        }
        if let Some(hcpkg_status) = self.snapshot.hcpkg.status.as_mut() {
            *hcpkg_status = status.clone();
        } else {
            self.snapshot.hcpkg.status = Some(status.clone());
        }
    }

    /// Approves the groups that wait for it, as an SRE would (`model.approve`). Whether any was.
    fn approve_waiting(&mut self, status: &HostedClusterPackageStatus) -> bool {
        let waiting: Vec<String> = status
            .partitions
            .iter()
            .filter(|p| p.state == group_state::AWAITING_APPROVAL)
            .map(|p| p.name.clone())
            .collect();
        if waiting.is_empty() || !self.model.approve {
            return false;
        }
        let hcpkg = &mut self.snapshot.hcpkg;
        let hash = package_template_hash(&hcpkg.spec);
        let mut approvals = annotations_approvals(hcpkg);
        for group in waiting {
            approvals.insert(
                group,
                RolloutApproval {
                    template_hash: hash.clone(),
                    approved_by: "simulation".to_owned(),
                    ..RolloutApproval::default()
                },
            );
        }
        let text = serde_json::to_string(&approvals).unwrap_or_default();
        hcpkg
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ROLLOUT_APPROVALS_ANNOTATION.to_owned(), text);
        true
    }

    /// Lands the decision's writes: created and updated Packages go in flight, deleted ones go. Whether
    /// anything was written.
    fn carry_out(&mut self, step: &RolloutStep) -> bool {
        let plan = &step.plan;
        let now = self.now();
        let name = self
            .snapshot
            .hcpkg
            .metadata
            .name
            .clone()
            .unwrap_or_default();
        let proven = step.proven_template.as_ref().unwrap_or(&step.template);
        let writes = plan
            .create
            .iter()
            .map(|ns| (ns, &step.template))
            .chain(plan.create_proven.iter().map(|ns| (ns, proven)))
            .chain(plan.update.iter().map(|ns| (ns, &step.template)));
        for (namespace, template) in writes {
            let was = self.snapshot.packages.get(namespace).cloned();
            let generation = was
                .as_ref()
                .and_then(|p| p.meta.generation)
                .unwrap_or_default()
                + 1;
            let in_flight = ("True", "True", "Progressing");
            let written = package(
                was.as_deref(),
                namespace,
                &name,
                &template.spec,
                in_flight,
                generation,
                now,
            );
            self.snapshot.packages.insert(namespace.clone(), written);
            // The failure model is about the release on trial; a rollback returns to what ran.
            let on_trial = template.spec == self.snapshot.hcpkg.spec.template.spec;
            let outcome = if on_trial
                && (self.model.failing.contains(namespace)
                    || (self.model.fail_rate > 0.0
                        && self.draws.next_unit() < self.model.fail_rate))
            {
                Outcome::Failed
            } else {
                Outcome::Live
            };
            let readiness = self
                .model
                .readiness_of
                .get(namespace)
                .copied()
                .unwrap_or(self.model.readiness);
            self.pending
                .insert(namespace.clone(), (self.at + readiness, outcome));
        }
        for namespace in &step.deletes {
            self.snapshot.packages.remove(namespace);
            self.pending.remove(namespace);
        }
        let created: Vec<String> = plan
            .create
            .iter()
            .chain(&plan.create_proven)
            .cloned()
            .collect();
        let wrote = !created.is_empty() || !plan.update.is_empty();
        if wrote {
            let group = plan
                .current_group
                .and_then(|i| plan.groups.get(i))
                .and_then(|g| g.name.clone())
                .filter(|_| !plan.update.is_empty());
            self.waves.push(Wave {
                at: self.at,
                group,
                created,
                updated: plan.update.clone(),
                rollback: step.template.spec != self.snapshot.hcpkg.spec.template.spec,
            });
        }
        wrote || !step.deletes.is_empty()
    }

    /// Health checks due now pass.
    fn pass_health_checks(&mut self, step: &RolloutStep) {
        let now = self.now();
        for (group, check) in &step.health_due {
            self.snapshot.health.insert(
                (group.clone(), check.name.clone()),
                HealthObservation {
                    state: HealthState::Passing,
                    message: "simulated".to_owned(),
                    at: now,
                },
            );
        }
    }

    /// The next moment anything happens: a written Package's, or the decision's own recheck.
    fn next_moment(&self, recheck_after: Option<Duration>) -> Option<Duration> {
        let pending = self.pending.values().map(|(at, _)| *at).min();
        let recheck = recheck_after.map(|d| self.at + d);
        pending.into_iter().chain(recheck).min()
    }

    /// Written Packages whose moment came turn live or failed.
    fn settle(&mut self) {
        let now = self.now();
        let due: Vec<(String, Outcome)> = self
            .pending
            .iter()
            .filter(|(_, (at, _))| *at <= self.at)
            .map(|(ns, (_, outcome))| (ns.clone(), *outcome))
            .collect();
        for (namespace, outcome) in due {
            self.pending.remove(&namespace);
            let Some(was) = self.snapshot.packages.get(&namespace).cloned() else {
                continue;
            };
            let generation = was.meta.generation.unwrap_or_default();
            let name = was.meta.name.clone().unwrap_or_default();
            let conditions = match outcome {
                Outcome::Live => ("True", "False", "Idle"),
                Outcome::Failed => {
                    self.failed.insert(namespace.clone());
                    ("False", "True", LATEST_REVISION_UNAVAILABLE)
                }
            };
            let settled = package(
                Some(&was),
                &namespace,
                &name,
                &was.spec,
                conditions,
                generation,
                now,
            );
            self.snapshot.packages.insert(namespace, settled);
        }
    }
}

/// How the rollout ended, if it did.
fn ended(status: &HostedClusterPackageStatus, step: &RolloutStep) -> Option<Ending> {
    if let Some(halt) = &status.halted {
        let (reason, message) = (halt.reason.clone(), halt.message.clone());
        return match (halt.rolling_back, &halt.rolled_back_at) {
            (true, Some(_)) => Some(Ending::RolledBack { reason, message }),
            (true, None) => None,
            (false, _) => Some(Ending::Halted { reason, message }),
        };
    }
    let finished = status
        .last_succeeded
        .as_ref()
        .is_some_and(|l| l.template_hash == step.template_hash);
    finished.then_some(Ending::Finished)
}

fn invalid_reason(status: &HostedClusterPackageStatus) -> String {
    status
        .conditions
        .iter()
        .find(|c| c.reason == "InvalidSpec")
        .map(|c| c.message.clone())
        .unwrap_or_else(|| "the spec is invalid".to_owned())
}

/// Why nothing more happens: an approval or pause the rollout waits for, else what Progressing says.
fn stuck_reason(status: &HostedClusterPackageStatus) -> String {
    let holding = |type_: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")
    };
    holding("AwaitingApproval")
        .or_else(|| holding("RolloutPaused"))
        .or_else(|| status.conditions.iter().find(|c| c.type_ == "Progressing"))
        .map(|c| c.message.clone())
        .unwrap_or_else(|| "nothing more happens".to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::rollout::rollout_decision::GateInput;
    use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
    use pko_proto::hypershift::HostedCluster;
    use serde_json::{json, Value};

    fn t0() -> Timestamp {
        "2026-11-01T00:00:00Z".parse().unwrap()
    }

    /// A fleet of `groups` (name, size) whose Packages are all live on v1, and a HostedClusterPackage
    /// that now rolls out v2 with `policy` and `max_unavailable`.
    fn fleet(groups: &[(&str, usize)], policy: Value, max_unavailable: usize) -> RolloutSnapshot {
        let names: Vec<&str> = groups.iter().map(|(g, _)| *g).collect();
        let hcpkg: HostedClusterPackage = serde_json::from_value(json!({
            "apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
            "metadata": {"name": "addon", "uid": "u", "generation": 2},
            "spec": {
                "strategy": {"rollingUpgrade": {"maxUnavailable": max_unavailable}},
                "partition": {"labelKey": "group", "order": {"static": names}},
                "template": {"spec": {"image": "registry/addon:v2"}},
                "rolloutPolicy": policy,
            },
        }))
        .unwrap();
        let mut clusters = Vec::new();
        let mut packages = BTreeMap::new();
        let v1 = PackageSpec {
            image: "registry/addon:v1".into(),
            ..PackageSpec::default()
        };
        // v1 finished rolling out everywhere: what a rollback returns to.
        let mut finished = hcpkg.spec.clone();
        finished.template.spec = v1.clone();
        let mut hcpkg = hcpkg;
        hcpkg.status = Some(HostedClusterPackageStatus {
            last_succeeded: Some(
                pko_proto::core::hosted_cluster_package::HostedClusterPackageSucceededTemplate {
                    template_hash: package_template_hash(&finished),
                    template: finished.template,
                    finished_at: "2026-10-01T00:00:00Z".into(),
                },
            ),
            ..HostedClusterPackageStatus::default()
        });
        for (group, size) in groups {
            for i in 0..*size {
                let name = format!("{group}{i}");
                clusters.push(Arc::new(
                    serde_json::from_value::<HostedCluster>(json!({
                        "metadata": {"name": name, "namespace": "clusters", "labels": {"group": group}},
                        "status": {"conditions": [{"type": "Available", "status": "True"}]},
                    }))
                    .unwrap(),
                ));
                let ns = format!("clusters-{name}");
                let live = ("True", "False", "Idle");
                packages.insert(ns.clone(), package(None, &ns, "addon", &v1, live, 1, t0()));
            }
        }
        RolloutSnapshot {
            hcpkg,
            packages,
            writing: BTreeMap::new(),
            clusters,
            failures: BTreeMap::new(),
            gate: GateInput::Preview,
            health: BTreeMap::new(),
            preflight: None,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn waves(s: &Simulation) -> Vec<(u64, Vec<&str>)> {
        s.waves
            .iter()
            .map(|w| {
                (
                    w.at.as_secs(),
                    w.updated.iter().map(String::as_str).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn a_rolling_update_goes_wave_by_wave_within_the_budget() {
        let snapshot = fleet(&[("a", 3), ("b", 3)], json!({}), 2);
        let s = simulate(snapshot, &SimulationModel::default(), t0());
        assert_eq!(s.ending, Ending::Finished);
        assert_eq!(
            waves(&s),
            [
                (0, vec!["clusters-a0", "clusters-a1"]),
                (30, vec!["clusters-a2"]),
                (60, vec!["clusters-b0", "clusters-b1"]),
                (90, vec!["clusters-b2"]),
            ]
        );
        assert_eq!(s.ended_at, secs(120));
        assert_eq!((s.peak_unavailable, s.budget), (2, 2));
        let a = &s.groups[0];
        assert_eq!((a.started, a.finished), (Some(secs(0)), Some(secs(60))));
    }

    /// A group whose windows are closed waits in the simulation as in the manager, and starts when
    /// the first opens (t0 is Sunday 00:00 UTC; b's window opens at 02:00).
    #[test]
    fn a_group_waits_for_its_maintenance_window() {
        let policy = json!({"maintenanceWindows": [
            {"name": "night", "schedule": "0 2 * * *", "duration": "1h"}],
            "groups": []});
        let mut snapshot = fleet(&[("a", 1), ("b", 2)], policy, 1);
        for cluster in snapshot.clusters.iter_mut() {
            let mut c = (**cluster).clone();
            if c.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with('b'))
            {
                c.metadata.labels.get_or_insert_default().insert(
                    pko_proto::well_known::MAINTENANCE_WINDOW_LABEL.to_owned(),
                    "night".to_owned(),
                );
            }
            *cluster = Arc::new(c);
        }
        let s = simulate(snapshot, &SimulationModel::default(), t0());
        assert_eq!(s.ending, Ending::Finished);
        let b = &s.groups[1];
        assert_eq!(b.waiting_for_window, Some(secs(30)));
        assert_eq!(b.started, Some(secs(7200)));
        assert_eq!(
            waves(&s)[1..],
            [(7200, vec!["clusters-b0"]), (7230, vec!["clusters-b1"])]
        );
    }

    #[test]
    fn soaks_and_approvals_wait_where_the_policy_says() {
        let policy = json!({"defaults": {"minSuccessTime": "10m"},
            "groups": [{"name": "b", "requireApproval": true}]});
        let s = simulate(
            fleet(&[("a", 1), ("b", 1)], policy.clone(), 1),
            &SimulationModel::default(),
            t0(),
        );
        assert_eq!(s.ending, Ending::Finished);
        let (a, b) = (&s.groups[0], &s.groups[1]);
        assert_eq!(a.soaking, Some(secs(30)));
        assert_eq!(
            a.finished,
            Some(secs(630)),
            "30 s to be live, then a 10 min soak"
        );
        assert_eq!(b.awaiting_approval, Some(secs(630)));
        assert_eq!(b.started, Some(secs(630)));
        assert_eq!(s.ended_at, secs(1260));
        let model = SimulationModel {
            approve: false,
            ..SimulationModel::default()
        };
        let waiting = simulate(fleet(&[("a", 1), ("b", 1)], policy, 1), &model, t0());
        assert!(
            matches!(&waiting.ending, Ending::Stuck(why) if why.starts_with("Group b waits for approval")),
            "{:?}",
            waiting.ending
        );
        assert_eq!(
            waiting.waves.len(),
            1,
            "b never gets the release without its approval"
        );
    }

    #[test]
    fn a_failure_halts_and_rolls_the_fleet_back_as_the_policy_says() {
        let policy = json!({"defaults": {"maxFailures": 0}, "rollback": "Automatic"});
        let model = SimulationModel {
            failing: ["clusters-a1".to_owned()].into(),
            ..SimulationModel::default()
        };
        let s = simulate(fleet(&[("a", 3), ("b", 2)], policy, 2), &model, t0());
        let Ending::RolledBack { reason, .. } = &s.ending else {
            panic!("{:?}", s.ending);
        };
        assert_eq!(reason, "MaxFailuresExceeded");
        assert_eq!(s.failed, ["clusters-a1"]);
        assert!(
            s.waves
                .iter()
                .all(|w| w.group.as_deref() != Some("b") || w.updated.is_empty()),
            "b never got the failing release: {:?}",
            s.waves
        );
        let manual = json!({"defaults": {"maxFailures": 0}});
        let halted = simulate(fleet(&[("a", 3), ("b", 2)], manual, 2), &model, t0());
        assert!(
            matches!(halted.ending, Ending::Halted { .. }),
            "{:?}",
            halted.ending
        );
        assert_eq!(halted.ended_at, secs(30));
    }

    #[test]
    fn the_same_seed_tells_the_same_story() {
        let model = SimulationModel {
            fail_rate: 0.3,
            seed: 7,
            ..SimulationModel::default()
        };
        let policy = json!({"defaults": {"maxFailures": "50%"}});
        let one = simulate(
            fleet(&[("a", 6), ("b", 6)], policy.clone(), 3),
            &model,
            t0(),
        );
        let two = simulate(fleet(&[("a", 6), ("b", 6)], policy, 3), &model, t0());
        assert_eq!(one, two);
        assert!(!one.failed.is_empty(), "30% of 12 fail with this seed");
    }
}

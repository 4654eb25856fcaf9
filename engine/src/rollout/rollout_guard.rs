//! The rollout policy's rules (issue 22) around the planner: pause, progress deadlines, failure budgets,
//! soak and health checks, approvals bound to the template hash, halting, and rollback to the last
//! template that finished rolling out everywhere.
//!
//! - Every time is measured from what the status keeps (an update's `since`, a group's `doneSince`, the
//!   halt), so a restarted manager resumes a soak or a deadline where it stood.
//! - A halted rollout writes nothing new unless it rolls back; a rollback rolls the groups back in
//!   reverse order within the same budget, with no soak, approval or deadline.
//! - A failed template stays marked in `status.halted` until the spec's template changes.
//!
//! Pure: no I/O, no clock (`now` is given).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use pko_proto::core::hosted_cluster_package::{
    HostedClusterPackageHalt, HostedClusterPackageHealthCheckStatus,
    HostedClusterPackagePartitionStatus, HostedClusterPackageStatus, RolloutApprovals,
};

use crate::api_time::stamp;
use crate::conditions::ConditionUpdate;
use crate::rollout::health_check::HealthState;
use crate::rollout::rollout_plan::{
    group_key, GroupRules, PartitionOrder, RolloutInput, RolloutPlan, RolloutState,
    RolloutStrategy, Target, UNKNOWN_GROUP,
};
use crate::rollout::rollout_policy::{HealthCheck, RolloutPolicy};

pub const HALTED: &str = "Halted";
pub const AWAITING_APPROVAL: &str = "AwaitingApproval";
pub const ROLLOUT_PAUSED: &str = "RolloutPaused";

/// Halt reasons (`status.halted.reason` and the Halted condition's).
pub const MAX_FAILURES_EXCEEDED: &str = "MaxFailuresExceeded";
pub const HEALTH_CHECK_FAILED: &str = "HealthCheckFailed";
pub const ROLLBACK_REQUESTED: &str = "RollbackRequested";

/// Group states in `status.partitions[].state`.
pub mod group_state {
    pub const PENDING: &str = "Pending";
    pub const AWAITING_APPROVAL: &str = "AwaitingApproval";
    pub const AWAITING_PREFLIGHT: &str = "AwaitingPreflight";
    pub const WAITING_FOR_WINDOW: &str = "WaitingForWindow";
    pub const PROGRESSING: &str = "Progressing";
    pub const SOAKING: &str = "Soaking";
    pub const FINISHED: &str = "Finished";
    pub const FAILED: &str = "Failed";
    pub const ROLLING_BACK: &str = "RollingBack";
}

/// At most this many failed Packages are named per group in status.
const NAMED_FAILING: usize = 20;

/// One evaluation of a health check.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthObservation {
    pub state: HealthState,
    pub message: String,
    pub at: Timestamp,
}

/// Health observations by (group name as status names it, check name).
pub type HealthObservations = BTreeMap<(String, String), HealthObservation>;

/// The last evaluation of each health check as the status keeps it: what a manager that starts (or a
/// preview) knows before it evaluates anything itself.
pub fn stored_observations(status: &HostedClusterPackageStatus) -> HealthObservations {
    status
        .partitions
        .iter()
        .flat_map(|p| {
            p.health_checks.iter().filter_map(|c| {
                let observation = HealthObservation {
                    state: HealthState::from_label(&c.state),
                    message: c.message.clone(),
                    at: c.checked_at.parse().ok()?,
                };
                Some(((p.name.clone(), c.name.clone()), observation))
            })
        })
        .collect()
}

/// A group's name as status, policy and approvals name it.
pub fn group_name(key: &Option<String>) -> &str {
    key.as_deref().unwrap_or(UNKNOWN_GROUP)
}

fn at(text: Option<&str>) -> Option<Timestamp> {
    text.and_then(|t| t.parse::<Timestamp>().ok())
}

/// The halt that holds for the spec's template: the stored one while the template is the one that
/// halted, or a new one when `kubectl package rollout undo` asked (`undo`) for this template. An undo
/// turns a halt into a rollback.
pub fn carried_halt(
    previous: Option<&HostedClusterPackageHalt>,
    spec_hash: &str,
    undo: bool,
    now: Timestamp,
) -> Option<HostedClusterPackageHalt> {
    match previous.filter(|h| h.template_hash == spec_hash) {
        Some(h) => {
            let mut h = h.clone();
            if undo && !h.rolling_back {
                h.rolling_back = true;
                h.message = format!("{} Rollback requested.", h.message);
            }
            Some(h)
        }
        None if undo => Some(HostedClusterPackageHalt {
            template_hash: spec_hash.to_owned(),
            reason: ROLLBACK_REQUESTED.to_owned(),
            message: "Rollback requested (kubectl package rollout undo).".to_owned(),
            halted_at: stamp(now),
            rolling_back: true,
            rolled_back_at: None,
        }),
        None => None,
    }
}

/// Marks in-flight Packages as failed, saying so, whose time since their update (`since`), as `counted`
/// measures it for their namespace (the open time of their maintenance window), reached their group's
/// progress deadline.
pub fn apply_deadlines(
    targets: &mut [Target],
    input_partition: Option<&crate::rollout::rollout_plan::PartitionOrder>,
    policy: &RolloutPolicy,
    since: &BTreeMap<String, Timestamp>,
    counted: &dyn Fn(&str, Timestamp) -> Duration,
) {
    for t in targets.iter_mut() {
        let key = group_key(t.label.as_deref(), input_partition);
        let Some(deadline) = policy.group(key.as_deref()).progress_deadline else {
            continue;
        };
        let Some(state) = t.package.as_mut() else {
            continue;
        };
        if state.rollout_state() != RolloutState::InFlight {
            continue;
        }
        let Some(updated_at) = since.get(&t.namespace) else {
            continue;
        };
        if counted(&t.namespace, *updated_at) >= deadline {
            state.failed = true;
            t.failure = Some(format!(
                "not live within progressDeadline {}s of its update at {}",
                deadline.as_secs(),
                stamp(*updated_at)
            ));
        }
    }
}

/// The budget rules that do not depend on soaking: tolerated failures, groups awaiting approval, and
/// the order of a rollback.
/// An approval counts for template `spec_hash` only, and one that names a preflight digest only while
/// `preflight_digest` (the preflight of this template on the current targets) is that digest.
pub fn base_rules(
    policy: &RolloutPolicy,
    input: &RolloutInput,
    approvals: &RolloutApprovals,
    (spec_hash, preflight_digest): (&str, Option<&str>),
    rolling_back: bool,
) -> GroupRules {
    let mut keys: BTreeSet<Option<String>> = input
        .targets
        .iter()
        .map(|t| group_key(t.label.as_deref(), input.partition.as_ref()))
        .collect();
    if rolling_back {
        return GroupRules {
            reverse: true,
            ..GroupRules::default()
        };
    }
    let mut rules = GroupRules {
        kept_empty: named_groups(policy, input.partition.as_ref()),
        ..GroupRules::default()
    };
    keys.extend(rules.kept_empty.iter().cloned());
    for key in keys {
        let group = policy.group(key.as_deref());
        if let Some(max) = group.max_failures {
            let total = input
                .targets
                .iter()
                .filter(|t| group_key(t.label.as_deref(), input.partition.as_ref()) == key)
                .count();
            rules.tolerated_failures.insert(key.clone(), max.of(total));
        }
        let approved = approvals.get(group_name(&key)).is_some_and(|a| {
            a.template_hash == spec_hash
                && (a.preflight_digest.is_empty()
                    || Some(a.preflight_digest.as_str()) == preflight_digest)
        });
        if group.require_approval && !approved {
            rules.awaiting_approval.insert(key);
        }
    }
    rules
}

/// The groups a rollout has whatever its members: with a static order every value listed; with either
/// order every group the policy gives an approval or a soak of its own. A cluster's owner can empty a
/// group by relabelling or skipping, but not remove its approval and soak from the rollout.
fn named_groups(
    policy: &RolloutPolicy,
    order: Option<&PartitionOrder>,
) -> BTreeSet<Option<String>> {
    let Some(order) = order else {
        return BTreeSet::new();
    };
    let mut named: BTreeSet<Option<String>> = BTreeSet::new();
    if let PartitionOrder::Static(values) = order {
        named.extend(values.iter().cloned().map(Some));
    }
    for (name, group) in &policy.groups {
        let gating = group.require_approval || !group.min_success_time.is_zero();
        let key = group_key(Some(name), Some(order));
        if gating && name != UNKNOWN_GROUP && key.is_some() {
            named.insert(key);
        }
    }
    named
}

/// What the guard remembers of one group across steps (kept in `status.partitions`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GroupMemory {
    pub done_since: Option<Timestamp>,
    /// Its soak is over and its checks held: it counts as finished while it stays done.
    pub soaked: bool,
    pub health: Vec<(HealthCheck, Option<HealthObservation>)>,
}

/// Why a rollout halts now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaltCause {
    pub reason: &'static str,
    pub message: String,
}

/// Soak and health of every group of `plan` (planned without soaking): which groups still soak, what
/// to remember, when to decide again, which checks to evaluate now, and a failing check. The default is
/// no soak at all (instant rollouts and rollbacks).
#[derive(Default)]
pub struct Soak {
    pub soaking: BTreeSet<Option<String>>,
    pub memory: BTreeMap<Option<String>, GroupMemory>,
    pub recheck_after: Option<Duration>,
    /// Checks of soaking groups to evaluate, with their group's name.
    pub due: Vec<(String, HealthCheck)>,
    pub failed_check: Option<HaltCause>,
}

/// How long a group (by key) counts as soaked since an instant.
pub type GroupClock<'a> = dyn Fn(&Option<String>, Timestamp) -> Duration + 'a;

/// Soak and health of the groups of `plan`. `template_hash` is what the group's Packages are on;
/// `previous` the stored group states.
/// `clock` is now and how a group's soak time is counted since an instant (the open time of its members'
/// maintenance windows).
pub fn soak(
    plan: &RolloutPlan,
    policy: &RolloutPolicy,
    previous: &[HostedClusterPackagePartitionStatus],
    template_hash: &str,
    health: &HealthObservations,
    (now, counted): (Timestamp, &GroupClock<'_>),
) -> Soak {
    let mut out = Soak::default();
    // Whether a group before this one has not finished (soak included).
    let mut earlier_open = false;
    for g in &plan.groups {
        let name = group_name(&g.name).to_owned();
        let policy = policy.group(g.name.as_deref());
        let before = previous
            .iter()
            .find(|p| p.name == name)
            .filter(|p| p.template_hash.as_deref() == Some(template_hash));
        if !g.done {
            out.memory.insert(g.name.clone(), GroupMemory::default());
            earlier_open = true;
            continue;
        }
        // A group without members is done at once; its soak starts when the rollout reaches it and
        // its approval is given (planned without soaking, only an approval keeps a done group open).
        if g.counts.total == 0 && (earlier_open || !g.finished) {
            out.memory.insert(g.name.clone(), GroupMemory::default());
            if g.finished {
                out.soaking.insert(g.name.clone());
            }
            earlier_open = true;
            continue;
        }
        let done_since = before
            .and_then(|p| at(p.done_since.as_deref()))
            .unwrap_or(now);
        let was_soaked = before.is_some_and(|p| p.state == group_state::FINISHED);
        let observed: Vec<(HealthCheck, Option<HealthObservation>)> = policy
            .health_checks
            .iter()
            .map(|c| {
                let seen = health
                    .get(&(name.clone(), c.name.clone()))
                    .filter(|o| o.at >= done_since)
                    .cloned();
                (c.clone(), seen)
            })
            .collect();
        let soak_left = policy
            .min_success_time
            .saturating_sub(counted(&g.name, done_since));
        let checks_hold = observed
            .iter()
            .all(|(_, o)| o.as_ref().is_some_and(|o| o.state == HealthState::Passing));
        let soaked = was_soaked || (soak_left.is_zero() && checks_hold);
        if !soaked {
            if let Some((check, o)) = observed
                .iter()
                .find(|(_, o)| o.as_ref().is_some_and(|o| o.state == HealthState::Failing))
            {
                out.failed_check.get_or_insert(HaltCause {
                    reason: HEALTH_CHECK_FAILED,
                    message: format!(
                        "Health check {} of group {name} failed during its soak: {}",
                        check.name,
                        o.as_ref().map(|o| o.message.as_str()).unwrap_or_default()
                    ),
                });
            }
            out.soaking.insert(g.name.clone());
            earlier_open = true;
            out.due
                .extend(observed.iter().map(|(c, _)| (name.clone(), c.clone())));
            if !soak_left.is_zero() {
                out.recheck_after = Some(
                    out.recheck_after
                        .map_or(soak_left, |r: Duration| r.min(soak_left)),
                );
            }
        }
        out.memory.insert(
            g.name.clone(),
            GroupMemory {
                done_since: Some(done_since),
                soaked,
                health: observed,
            },
        );
    }
    out
}

/// The first group whose failed Packages exceed its maxFailures, naming them.
pub fn failure_halt(
    input: &RolloutInput,
    plan: &RolloutPlan,
    policy: &RolloutPolicy,
) -> Option<HaltCause> {
    plan.groups.iter().find_map(|g| {
        let max = policy.group(g.name.as_deref()).max_failures?;
        let allowed = max.of(g.counts.total);
        (g.counts.failed > allowed).then(|| {
            let named: Vec<String> = failing_in(input, plan, &g.name)
                .into_iter()
                .take(5)
                .map(|t| {
                    format!(
                        "{}: {}",
                        t.namespace,
                        t.failure.as_deref().unwrap_or("failing")
                    )
                })
                .collect();
            HaltCause {
                reason: MAX_FAILURES_EXCEEDED,
                message: format!(
                    "Group {}: {} failed, maxFailures {allowed}: {}.",
                    group_name(&g.name),
                    g.counts.failed,
                    named.join("; ")
                ),
            }
        })
    })
}

fn failing_in<'a>(
    input: &'a RolloutInput,
    plan: &RolloutPlan,
    key: &Option<String>,
) -> Vec<&'a Target> {
    plan.failed
        .iter()
        .filter_map(|ns| input.targets.iter().find(|t| &t.namespace == ns))
        .filter(|t| &group_key(t.label.as_deref(), input.partition.as_ref()) == key)
        .collect()
}

/// A new halt of the spec's template.
pub fn new_halt(
    cause: HaltCause,
    spec_hash: &str,
    automatic_rollback: bool,
    now: Timestamp,
) -> HostedClusterPackageHalt {
    HostedClusterPackageHalt {
        template_hash: spec_hash.to_owned(),
        reason: cause.reason.to_owned(),
        message: cause.message,
        halted_at: stamp(now),
        rolling_back: automatic_rollback,
        rolled_back_at: None,
    }
}

/// Why nothing may be created or updated now, if so.
pub fn hold(
    paused: bool,
    halt: Option<&HostedClusterPackageHalt>,
    can_roll_back: bool,
) -> Option<String> {
    match halt {
        _ if paused => Some("The rollout is paused (spec.paused).".to_owned()),
        Some(h) if !h.rolling_back => Some(format!(
            "Halted ({}); nothing is updated until `kubectl package rollout undo` or a new template.",
            h.reason
        )),
        Some(_) if !can_roll_back => Some(
            "Halted; no earlier template finished rolling out everywhere, so there is nothing to roll back to."
                .to_owned(),
        ),
        _ => None,
    }
}

/// What the guard says, for the status.
pub struct GuardReport<'a> {
    pub input: &'a RolloutInput,
    pub plan: &'a RolloutPlan,
    pub memory: &'a BTreeMap<Option<String>, GroupMemory>,
    /// The template the Packages are being rolled to.
    pub template_hash: &'a str,
    pub halt: Option<&'a HostedClusterPackageHalt>,
    pub paused: bool,
    pub strategy: RolloutStrategy,
}

/// Fills in the partitions' pko fields (state, doneSince, failing, health checks).
pub fn annotate_partitions(
    report: &GuardReport<'_>,
    partitions: &mut [HostedClusterPackagePartitionStatus],
) {
    let rolling_back = report.halt.is_some_and(|h| h.rolling_back);
    for (g, p) in report.plan.groups.iter().zip(partitions.iter_mut()) {
        let memory = report.memory.get(&g.name).cloned().unwrap_or_default();
        let current = report
            .plan
            .current_group
            .is_some_and(|i| report.plan.groups.get(i).map(|c| &c.name) == Some(&g.name));
        // A group without members awaits its approval as one with outdated members does.
        let awaiting = report.input.rules.awaiting_approval.contains(&g.name)
            && (g.counts.updated < g.counts.total || g.counts.total == 0);
        p.state = match () {
            _ if g.counts.failed > 0 && report.halt.is_some() && !rolling_back => {
                group_state::FAILED
            }
            _ if g.finished => group_state::FINISHED,
            _ if current && rolling_back => group_state::ROLLING_BACK,
            _ if g.done && !(awaiting && g.counts.total == 0) => group_state::SOAKING,
            _ if current
                && report.input.rules.preflight_hold
                && g.counts.updated < g.counts.total =>
            {
                group_state::AWAITING_PREFLIGHT
            }
            _ if current
                && awaiting
                && matches!(report.strategy, RolloutStrategy::RollingUpgrade { .. }) =>
            {
                group_state::AWAITING_APPROVAL
            }
            _ if current || g.counts.updated > 0 => group_state::PROGRESSING,
            _ => group_state::PENDING,
        }
        .to_owned();
        p.done_since = memory.done_since.map(stamp);
        p.template_hash = memory.done_since.map(|_| report.template_hash.to_owned());
        p.failing = failing_in(report.input, report.plan, &g.name)
            .into_iter()
            .take(NAMED_FAILING)
            .map(|t| t.namespace.clone())
            .collect();
        p.health_checks = memory
            .health
            .iter()
            .filter_map(|(c, o)| {
                o.as_ref().map(|o| HostedClusterPackageHealthCheckStatus {
                    name: c.name.clone(),
                    state: o.state.label().to_owned(),
                    message: o.message.clone(),
                    checked_at: stamp(o.at),
                })
            })
            .collect();
    }
}

/// The conditions of the rollout policy: Halted, AwaitingApproval and RolloutPaused.
pub fn guard_conditions(
    report: &GuardReport<'_>,
    status: &HostedClusterPackageStatus,
) -> Vec<ConditionUpdate> {
    let halted = match report.halt {
        Some(h) => {
            let mut message = h.message.clone();
            match (&status.last_succeeded, h.rolling_back, &h.rolled_back_at) {
                (Some(last), true, Some(done)) => message.push_str(&format!(
                    " Rolled back to template {} at {done}.",
                    last.template_hash
                )),
                (Some(last), true, None) => message.push_str(&format!(
                    " Rolling back to template {}.",
                    last.template_hash
                )),
                (None, true, _) => message.push_str(" Nothing to roll back to."),
                _ => {}
            }
            ConditionUpdate::new(HALTED, true, &h.reason, message)
        }
        None => ConditionUpdate::new(HALTED, false, "NotHalted", "The rollout is not halted."),
    };
    let waiting: Vec<&str> = report
        .plan
        .groups
        .iter()
        .zip(&status.partitions)
        .filter(|(_, p)| p.state == group_state::AWAITING_APPROVAL)
        .map(|(g, _)| group_name(&g.name))
        .collect();
    let approval = if waiting.is_empty() {
        ConditionUpdate::new(
            AWAITING_APPROVAL,
            false,
            "NoApprovalPending",
            "No group waits for approval.",
        )
    } else {
        ConditionUpdate::new(
            AWAITING_APPROVAL,
            true,
            "ApprovalRequired",
            format!(
                "Group {} waits for approval of template {}: kubectl package rollout approve hostedclusterpackage/<name> --group {}.",
                waiting.join(", "),
                report.template_hash,
                waiting[0]
            ),
        )
    };
    let paused = if report.paused {
        ConditionUpdate::new(
            ROLLOUT_PAUSED,
            true,
            "PausedBySpec",
            "spec.paused is set: nothing is created or updated.",
        )
    } else {
        ConditionUpdate::new(
            ROLLOUT_PAUSED,
            false,
            "NotPaused",
            "The rollout is not paused.",
        )
    };
    vec![halted, approval, paused]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::rollout::fleet_sim::{spec, Pkg, Sim};
    use crate::rollout::rollout_decision::undo_request;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn a_percentage_budget_rounds_down_over_the_selected_packages() {
        let mut sim = Sim::new(&[("early", 10)], spec(json!({}), json!("25%")));
        sim.run(Pkg::Live);
        sim.set_image("registry/addon:v2");
        let step = sim.step();
        assert_eq!(step.plan.update.len(), 2, "25% of 10, rounded down");
        assert_eq!(
            step.input.strategy,
            RolloutStrategy::RollingUpgrade { max_unavailable: 2 }
        );
    }

    #[test]
    fn a_soak_holds_the_next_group_from_the_time_kept_in_status() {
        let mut sim = Sim::new(
            &[("early", 2), ("late", 2)],
            spec(json!({"defaults": {"minSuccessTime": "10m"}}), json!(4)),
        );
        sim.run(Pkg::Live);
        sim.later(3600);
        sim.run(Pkg::Live);
        assert!(sim.status.last_succeeded.is_some());
        sim.set_image("registry/addon:v2");
        let step = sim.step();
        assert_eq!(step.plan.update.len(), 2, "early first");
        sim.settle(Pkg::Live);
        let step = sim.step();
        assert!(step.plan.update.is_empty(), "late waits for early's soak");
        assert_eq!(sim.status.partitions[0].state, group_state::SOAKING);
        assert_eq!(step.recheck_after, Some(Duration::from_secs(600)));
        let since = sim.status.partitions[0].done_since.clone();
        sim.later(599);
        assert!(sim.step().plan.update.is_empty(), "one second short");
        assert_eq!(
            sim.status.partitions[0].done_since, since,
            "kept, not restarted"
        );
        sim.later(1);
        let step = sim.step();
        assert_eq!(step.plan.update.len(), 2, "late goes once early soaked");
        assert_eq!(sim.status.partitions[0].state, group_state::FINISHED);
    }

    #[test]
    fn a_missed_deadline_halts_and_rolls_back_to_the_last_good_template() {
        let mut sim = Sim::new(
            &[("early", 2), ("late", 2)],
            spec(
                json!({"defaults": {"progressDeadline": "5m", "maxFailures": 0}, "rollback": "Automatic"}),
                json!(1),
            ),
        );
        sim.run(Pkg::Live);
        let good = sim.hash();
        sim.set_image("registry/addon:v2");
        let step = sim.step();
        assert_eq!(step.plan.update.len(), 1);
        sim.later(299);
        assert!(sim.step().plan.update.is_empty(), "in flight, budget used");
        assert!(sim.status.halted.is_none());
        sim.later(1);
        let step = sim.step();
        let halted = sim.status.halted.clone().unwrap();
        assert_eq!(halted.reason, MAX_FAILURES_EXCEEDED);
        assert!(
            halted
                .message
                .contains("not live within progressDeadline 300s"),
            "{}",
            halted.message
        );
        assert!(halted.rolling_back);
        assert_eq!(step.template.spec.image, "registry/addon:v1");
        assert_eq!(
            step.plan.update.len(),
            1,
            "the stuck Package goes back first"
        );
        sim.settle(Pkg::Live);
        sim.run(Pkg::Live);
        assert_eq!(sim.on("registry/addon:v1"), 4);
        let halted = sim.status.halted.clone().unwrap();
        assert!(halted.rolled_back_at.is_some());
        assert_eq!(
            sim.status.last_succeeded.as_ref().unwrap().template_hash,
            good
        );
        let (status, reason, message) = sim.condition(HALTED);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", MAX_FAILURES_EXCEEDED)
        );
        assert!(message.contains("Rolled back to template"), "{message}");
        // Not retried while the spec stays; a new template clears the halt.
        sim.later(3600);
        assert!(sim.step().plan.update.is_empty());
        sim.set_image("registry/addon:v3");
        assert_eq!(sim.step().plan.update.len(), 1);
        assert!(sim.status.halted.is_none());
    }

    #[test]
    fn a_new_template_restarts_the_deadline_of_a_package_in_flight() {
        let mut sim = Sim::new(
            &[("early", 2)],
            spec(
                json!({"defaults": {"progressDeadline": "5m", "maxFailures": 0}}),
                json!(1),
            ),
        );
        sim.run(Pkg::Live);
        sim.set_image("registry/addon:v2");
        let first = sim.step().plan.update;
        sim.later(200);
        sim.set_image("registry/addon:v3");
        let step = sim.step();
        assert_eq!(
            step.plan.update, first,
            "the in-flight Package goes first, for free"
        );
        sim.later(200);
        sim.step();
        assert!(
            sim.status.halted.is_none(),
            "400 s after its first update but 200 s after its second: {:?}",
            sim.status.halted
        );
        sim.later(100);
        sim.step();
        assert_eq!(sim.status.halted.unwrap().reason, MAX_FAILURES_EXCEEDED);
    }

    #[test]
    fn an_approval_counts_only_for_its_template() {
        let mut sim = Sim::new(
            &[("early", 1), ("late", 1)],
            spec(
                json!({"groups": [{"name": "late", "requireApproval": true}]}),
                json!(1),
            ),
        );
        let approve = |sim: &mut Sim, hash: &str| {
            sim.annotations.insert(
                pko_proto::well_known::ROLLOUT_APPROVALS_ANNOTATION.into(),
                json!({"late": {"templateHash": hash}}).to_string(),
            );
        };
        // New clusters get their Package at once; approvals hold updates only.
        sim.run(Pkg::Live);
        let v1 = sim.hash();
        approve(&mut sim, &v1);
        sim.set_image("registry/addon:v2");
        sim.run(Pkg::Live);
        assert_eq!(
            sim.on("registry/addon:v2"),
            1,
            "the v1 approval does not count for v2"
        );
        assert_eq!(
            sim.status.partitions[1].state,
            group_state::AWAITING_APPROVAL
        );
        let (status, reason, message) = sim.condition(AWAITING_APPROVAL);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", "ApprovalRequired")
        );
        assert!(message.contains(&sim.hash()), "{message}");
        let v2 = sim.hash();
        approve(&mut sim, &v2);
        sim.run(Pkg::Live);
        assert_eq!(sim.on("registry/addon:v2"), 2);
        assert_eq!(sim.condition(AWAITING_APPROVAL).0, "False");
    }

    #[test]
    fn an_approval_naming_a_preflight_digest_counts_only_for_that_change() {
        let mut sim = Sim::new(
            &[("early", 1), ("late", 1)],
            spec(
                json!({"groups": [{"name": "late", "requireApproval": true}]}),
                json!(1),
            ),
        );
        sim.run(Pkg::Live);
        sim.set_image("registry/addon:v2");
        sim.preflight_digest = "reviewed".into();
        let approval = json!({"late": {"templateHash": sim.hash(), "preflightDigest": "reviewed"}});
        sim.annotations.insert(
            pko_proto::well_known::ROLLOUT_APPROVALS_ANNOTATION.into(),
            approval.to_string(),
        );
        // A config source changed after the review: the preflight now finds another change.
        sim.preflight_digest = "changed-since".into();
        sim.run(Pkg::Live);
        assert_eq!(
            sim.on("registry/addon:v2"),
            1,
            "the reviewed digest is not this change"
        );
        assert_eq!(
            sim.status.partitions[1].state,
            group_state::AWAITING_APPROVAL
        );
        sim.preflight_digest = "reviewed".into();
        sim.run(Pkg::Live);
        assert_eq!(sim.on("registry/addon:v2"), 2);
    }

    #[test]
    fn a_paused_rollout_writes_nothing_and_resumes_where_it_stood() {
        let mut sim = Sim::new(&[("early", 3)], spec(json!({}), json!(1)));
        sim.run(Pkg::Live);
        sim.set_image("registry/addon:v2");
        sim.step();
        sim.settle(Pkg::Live);
        sim.spec["paused"] = true.into();
        sim.run(Pkg::Live);
        assert_eq!(sim.on("registry/addon:v2"), 1);
        assert_eq!(sim.condition(ROLLOUT_PAUSED).1, "PausedBySpec");
        sim.spec["paused"] = false.into();
        sim.run(Pkg::Live);
        assert_eq!(sim.on("registry/addon:v2"), 3);
    }

    #[test]
    fn a_failing_health_check_during_the_soak_halts() {
        let mut sim = Sim::new(
            &[("early", 1), ("late", 1)],
            spec(
                json!({"defaults": {"minSuccessTime": "1m",
                    "healthChecks": [{"name": "errors", "query": "q", "max": 0.1}]}}),
                json!(1),
            ),
        );
        let observe = |sim: &mut Sim, group: &str, state: HealthState| {
            sim.health.insert(
                (group.into(), "errors".into()),
                HealthObservation {
                    state,
                    message: "0.5 above max 0.1".into(),
                    at: sim.now,
                },
            );
        };
        sim.step();
        sim.settle(Pkg::Live);
        let step = sim.step();
        let due: Vec<&str> = step.health_due.iter().map(|(g, _)| g.as_str()).collect();
        assert_eq!(
            due,
            ["early", "late"],
            "both groups got their Package at once and soak"
        );
        sim.later(61);
        sim.step();
        assert_eq!(
            sim.status.partitions[0].state,
            group_state::SOAKING,
            "no evidence yet: the soak goes on"
        );
        observe(&mut sim, "early", HealthState::Passing);
        observe(&mut sim, "late", HealthState::Passing);
        sim.step();
        assert_eq!(sim.status.partitions[0].state, group_state::FINISHED);
        // What the status keeps is what a restarted manager starts from.
        let stored = stored_observations(&sim.status);
        assert_eq!(
            stored
                .get(&("late".to_owned(), "errors".to_owned()))
                .map(|o| o.state),
            Some(HealthState::Passing)
        );
        sim.health = stored;
        sim.run(Pkg::Live);
        assert!(sim.status.last_succeeded.is_some());
        sim.set_image("registry/addon:v2");
        sim.step();
        sim.settle(Pkg::Live);
        sim.later(1);
        observe(&mut sim, "early", HealthState::Failing);
        let step = sim.step();
        assert!(step.plan.update.is_empty());
        let halted = sim.status.halted.clone().unwrap();
        assert_eq!(halted.reason, HEALTH_CHECK_FAILED);
        assert!(!halted.rolling_back, "manual rollback by default");
        assert_eq!(sim.status.partitions[0].health_checks[0].state, "Failing");
        // Undo asks for the rollback.
        let undo = undo_request(&sim.hash(), sim.generation);
        sim.annotations
            .insert(pko_proto::well_known::ROLLOUT_UNDO_ANNOTATION.into(), undo);
        sim.run(Pkg::Live);
        assert_eq!(sim.on("registry/addon:v1"), 2);
        assert!(sim.status.halted.as_ref().unwrap().rolled_back_at.is_some());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Random rollouts with a failure budget and automatic rollback: the budget holds at every
        /// step, a halted rollout that cannot roll back writes nothing, and every rollout ends with
        /// every Package either on the new template or, after a halt, on the last good one.
        #[test]
        fn halts_and_rollbacks_keep_the_budget_and_end_on_one_template(
            early in 1usize..5,
            late in 1usize..5,
            max in 1usize..4,
            fails in proptest::collection::vec(any::<bool>(), 40),
            max_failures in 0usize..2,
        ) {
            let mut sim = Sim::new(
                &[("early", early), ("late", late)],
                spec(json!({"defaults": {"maxFailures": max_failures}, "rollback": "Automatic"}), json!(max)),
            );
            sim.run(Pkg::Live);
            sim.set_image("registry/addon:v2");
            let mut fails = fails.into_iter();
            for _ in 0..60 {
                let step = sim.step();
                let halted = sim.status.halted.clone();
                if halted.as_ref().is_some_and(|h| !h.rolling_back) {
                    prop_assert!(step.plan.update.is_empty() && step.plan.create.is_empty());
                }
                let disrupted = sim.packages.values().filter(|(_, s)| *s != Pkg::Live).count();
                prop_assert!(disrupted <= max, "{disrupted} disrupted, maxUnavailable {max}");
                // A v2 Package fails or goes live at random; rollbacks to v1 always go live.
                for (image, s) in sim.packages.values_mut() {
                    if *s == Pkg::InFlight {
                        let fail = image == "registry/addon:v2" && fails.next().unwrap_or(false);
                        *s = if fail { Pkg::Failed } else { Pkg::Live };
                    }
                }
            }
            let total = early + late;
            match &sim.status.halted {
                Some(h) => {
                    prop_assert!(h.rolling_back);
                    prop_assert_eq!(sim.on("registry/addon:v1"), total);
                }
                None => {
                    // Not halted: no group holds more failures than it tolerates, and without any the
                    // rollout finished. (Tolerated failures that are unavailable keep their budget slot,
                    // so with maxUnavailable <= maxFailures the rollout may wait on them.)
                    for group in &sim.status.partitions {
                        prop_assert!(group.counts.failed_packages as usize <= max_failures);
                    }
                    if sim.status.counts.failed_packages == 0 {
                        prop_assert_eq!(sim.on("registry/addon:v2"), total);
                    }
                }
            }
        }

        /// The simulator (`rollout_simulation`) writes what the manager writes: the same Packages at
        /// the same moments, against a driver that steps the same fleet second by second (each written
        /// Package live 30 s after its write), deciding again after every write as the manager does.
        #[test]
        fn the_simulator_writes_what_the_stepped_manager_writes(
            early in 1usize..5,
            late in 1usize..4,
            unlisted in 0usize..3,
            max in 1usize..4,
            soak in any::<bool>(),
        ) {
            use crate::rollout::rollout_simulation::{simulate, Ending, SimulationModel};
            let policy = if soak { json!({"defaults": {"minSuccessTime": "45s"}}) } else { json!({}) };
            let mut sim = Sim::new(&[("early", early), ("late", late), ("other", unlisted)], spec(policy, json!(max)));
            sim.run(Pkg::Live);
            sim.set_image("registry/addon:v2");
            let start = sim.now;
            let model = SimulationModel { readiness: std::time::Duration::from_secs(30), ..SimulationModel::default() };
            let simulated = simulate(sim.snapshot(), &model, start);
            prop_assert_eq!(&simulated.ending, &Ending::Finished);
            let predicted: Vec<(i64, Vec<String>)> = simulated
                .waves
                .iter()
                .map(|w| (w.at.as_secs() as i64, w.updated.clone()))
                .collect();

            let mut written_at: BTreeMap<String, i64> = BTreeMap::new();
            let mut stepped: Vec<(i64, Vec<String>)> = Vec::new();
            let total = early + late + unlisted;
            for second in 0..3600 {
                // Packages written 30 s ago are live now.
                for (ns, at) in &written_at {
                    if second - at >= 30 {
                        if let Some(p) = sim.packages.get_mut(ns) {
                            if p.1 == Pkg::InFlight {
                                p.1 = Pkg::Live;
                            }
                        }
                    }
                }
                loop {
                    let step = sim.step();
                    if step.plan.update.is_empty() {
                        break;
                    }
                    for ns in &step.plan.update {
                        written_at.insert(ns.clone(), second);
                    }
                    stepped.push((second, step.plan.update.clone()));
                }
                if sim.status.last_succeeded.as_ref().is_some_and(|l| l.template_hash == sim.hash()) {
                    break;
                }
                sim.later(1);
            }
            prop_assert_eq!(sim.on("registry/addon:v2"), total);
            prop_assert_eq!(predicted, stepped);
        }
    }
}

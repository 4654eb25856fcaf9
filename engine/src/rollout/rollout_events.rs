//! The steps of a rollout worth telling the world, from two consecutive plans of one HostedClusterPackage
//! (see `proto::rollout_events` for the stream), and the whole story so far for a manager that takes over a
//! rollout under way. The stream stores each step once by its message id, so telling a step again is
//! harmless and telling the story again loses nothing. Pure.

use std::collections::BTreeMap;

use pko_proto::rollout_events::RolloutEventKind;

use pko_proto::core::hosted_cluster_package::HostedClusterPackageStatus;

use crate::conditions::find_condition;
use crate::rollout::rollout_guard::{group_state, AWAITING_APPROVAL, ROLLOUT_PAUSED};
use crate::rollout::rollout_plan::{
    group_key, PackageState, RolloutInput, RolloutPlan, RolloutState, UNKNOWN_GROUP,
};

/// What was planned for one generation, as the events compare it.
#[derive(Debug, Clone)]
pub struct RolloutView<'a> {
    pub generation: i64,
    pub input: &'a RolloutInput,
    pub plan: &'a RolloutPlan,
}

/// One event, without the HostedClusterPackage's identity (the actor adds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutStep {
    pub kind: RolloutEventKind,
    pub group: Option<String>,
    pub namespace: Option<String>,
    pub message: String,
}

fn step(kind: RolloutEventKind, group: Option<String>, namespace: Option<String>) -> RolloutStep {
    RolloutStep {
        kind,
        group,
        namespace,
        message: String::new(),
    }
}

/// Per namespace: its group, its Package's state and why it fails.
type PackageViews<'a> = BTreeMap<&'a str, (Option<String>, Option<PackageState>, Option<&'a str>)>;

fn packages<'a>(view: &RolloutView<'a>) -> PackageViews<'a> {
    let order = view.input.partition.as_ref();
    view.input
        .targets
        .iter()
        .map(|t| {
            (
                t.namespace.as_str(),
                (
                    group_key(t.label.as_deref(), order),
                    t.package,
                    t.failure.as_deref(),
                ),
            )
        })
        .collect()
}

/// The events between `previous` (none at the first plan) and `next`, in a stable order.
pub fn rollout_steps(
    previous: Option<&RolloutView<'_>>,
    next: &RolloutView<'_>,
) -> Vec<RolloutStep> {
    use RolloutEventKind::*;
    let mut steps = Vec::new();
    let new_generation = previous.is_none_or(|p| p.generation != next.generation);
    let current = |v: &RolloutView<'_>| v.plan.current_group.map(|i| v.plan.groups[i].name.clone());
    let next_current = current(next);
    let previous_current = previous.and_then(current);
    let was_running = previous.is_some_and(|p| p.plan.current_group.is_some()) && !new_generation;
    // A generation's rollout starts when a group first has work: at once, or, for one first planned
    // over no clusters (HyperShift installed after pko, a selector nothing matched yet), when they come.
    let had_started = |p: &RolloutView<'_>| {
        p.plan.current_group.is_some() || p.plan.groups.iter().any(|g| g.finished)
    };
    if next_current.is_some() && (new_generation || previous.is_some_and(|p| !had_started(p))) {
        steps.push(step(RolloutStarted, None, None));
    }
    if let Some(group) = &next_current {
        if !was_running || previous_current.as_ref() != Some(group) {
            steps.push(step(GroupStarted, group.clone(), None));
        }
    }
    let finished_before: Vec<&Option<String>> = previous
        .filter(|_| !new_generation)
        .map(|p| {
            p.plan
                .groups
                .iter()
                .filter(|g| g.finished)
                .map(|g| &g.name)
                .collect()
        })
        .unwrap_or_default();
    if previous.is_some() {
        for g in next.plan.groups.iter().filter(|g| g.finished) {
            if !finished_before.contains(&&g.name) {
                // A group that finished without ever being the current one (its Packages were created
                // and came up together with an earlier group's) still starts before it finishes.
                let was_current = was_running && previous_current.as_ref() == Some(&g.name);
                if !was_current && next_current.as_ref() != Some(&g.name) {
                    steps.push(step(GroupStarted, g.name.clone(), None));
                }
                steps.push(step(GroupFinished, g.name.clone(), None));
            }
        }
    }
    let before = previous.map(packages).unwrap_or_default();
    for (ns, (group, state, failure)) in packages(next) {
        let old = before.get(ns).and_then(|(_, s, _)| *s);
        let namespace = Some(ns.to_owned());
        if next
            .plan
            .update
            .iter()
            .chain(&next.plan.create)
            .any(|u| u == ns)
        {
            steps.push(step(PackageUpdated, group.clone(), namespace.clone()));
        }
        let Some(state) = state else { continue };
        let was = old.map(|o| o.rollout_state());
        let now = state.rollout_state();
        let was_done = was == Some(RolloutState::Done);
        if now == RolloutState::Done && !was_done && previous.is_some() {
            steps.push(step(PackageAvailable, group.clone(), namespace.clone()));
        }
        let broke = was_done && !state.available;
        if (now == RolloutState::Failed || broke) && was != Some(RolloutState::Failed) {
            steps.push(RolloutStep {
                message: failure.unwrap_or("not available any more").to_owned(),
                ..step(PackageFailed, group.clone(), namespace.clone())
            });
        }
        if state.paused && !old.is_some_and(|o| o.paused) {
            steps.push(step(PackagePaused, group, namespace));
        }
    }
    if let Some(blocked) = &next.plan.blocked {
        if previous.is_none_or(|p| p.plan.blocked.as_ref() != Some(blocked)) {
            steps.push(RolloutStep {
                message: format!(
                    "maxUnavailable {} is used by {}",
                    blocked.max_unavailable,
                    blocked.holders.join(", ")
                ),
                ..step(Blocked, next_current.clone().flatten(), None)
            });
        }
    }
    if next.plan.current_group.is_none()
        && next.plan.create.is_empty()
        && (was_running || new_generation && previous.is_some())
    {
        steps.push(step(RolloutFinished, None, None));
    }
    steps
}

/// The story of `next`'s generation so far, for a manager that takes over a rollout under way and does
/// not know what was told before it: every step the current state shows happened, in rollout order.
/// Published with their message ids, the steps told already are stored once; the ones lost with the
/// previous manager (told to no one before it stopped) are told now.
pub fn story_so_far(next: &RolloutView<'_>) -> Vec<RolloutStep> {
    use RolloutEventKind::*;
    let mut steps = vec![step(RolloutStarted, None, None)];
    let views = packages(next);
    let planned = |ns: &str| {
        next.plan
            .update
            .iter()
            .chain(&next.plan.create)
            .any(|u| u == ns)
    };
    for (index, group) in next.plan.groups.iter().enumerate() {
        let started = group.finished || next.plan.current_group == Some(index);
        if !started {
            continue;
        }
        steps.push(step(GroupStarted, group.name.clone(), None));
        for (ns, (_, state, failure)) in views.iter().filter(|(_, (g, _, _))| *g == group.name) {
            let namespace = Some((*ns).to_owned());
            let state = state.map(|s| s.rollout_state());
            let updated = matches!(
                state,
                Some(RolloutState::InFlight | RolloutState::Failed | RolloutState::Done)
            );
            if updated || planned(ns) {
                steps.push(step(PackageUpdated, group.name.clone(), namespace.clone()));
            }
            match state {
                Some(RolloutState::Done) => {
                    steps.push(step(PackageAvailable, group.name.clone(), namespace))
                }
                Some(RolloutState::Failed) => steps.push(RolloutStep {
                    message: failure.unwrap_or("not available any more").to_owned(),
                    ..step(PackageFailed, group.name.clone(), namespace)
                }),
                Some(RolloutState::Paused) => {
                    steps.push(step(PackagePaused, group.name.clone(), namespace))
                }
                _ => {}
            }
        }
        if group.finished {
            steps.push(step(GroupFinished, group.name.clone(), None));
        }
    }
    if let Some(blocked) = &next.plan.blocked {
        let current = next
            .plan
            .current_group
            .and_then(|i| next.plan.groups[i].name.clone());
        steps.push(RolloutStep {
            message: format!(
                "maxUnavailable {} is used by {}",
                blocked.max_unavailable,
                blocked.holders.join(", ")
            ),
            ..step(Blocked, current, None)
        });
    }
    if next.plan.current_group.is_none() && next.plan.create.is_empty() {
        steps.push(step(RolloutFinished, None, None));
    }
    steps
}

/// The rollout policy's steps between the stored status `previous` and the status about to be written:
/// groups that start waiting for approval, for a maintenance window or soaking, HostedClusters left out,
/// a halt, a finished rollback, pause and resume.
/// Told from status, so a restarted manager does not tell them again.
pub fn policy_steps(
    previous: &HostedClusterPackageStatus,
    next: &HostedClusterPackageStatus,
) -> Vec<RolloutStep> {
    use RolloutEventKind::*;
    let mut steps = Vec::new();
    let paused = |s: &HostedClusterPackageStatus| {
        find_condition(&s.conditions, ROLLOUT_PAUSED).is_some_and(|c| c.status == "True")
    };
    match (paused(previous), paused(next)) {
        (false, true) => steps.push(step(RolloutPaused, None, None)),
        (true, false) => steps.push(step(RolloutResumed, None, None)),
        _ => {}
    }
    for group in &next.partitions {
        let before = previous
            .partitions
            .iter()
            .find(|p| p.name == group.name)
            .map(|p| p.state.as_str());
        let name = (group.name != UNKNOWN_GROUP).then(|| group.name.clone());
        if before != Some(group.state.as_str()) {
            match group.state.as_str() {
                group_state::AWAITING_APPROVAL => {
                    let message = find_condition(&next.conditions, AWAITING_APPROVAL)
                        .map(|c| c.message.clone())
                        .unwrap_or_default();
                    steps.push(RolloutStep {
                        message,
                        ..step(GroupAwaitingApproval, name, None)
                    });
                }
                group_state::SOAKING => steps.push(step(GroupSoaking, name, None)),
                group_state::WAITING_FOR_WINDOW => steps.push(RolloutStep {
                    message: group.next_window_start.as_ref().map_or_else(
                        || "No maintenance window of its members opens.".to_owned(),
                        |at| format!("The first maintenance window of its members opens at {at}."),
                    ),
                    ..step(GroupWaitingForWindow, name, None)
                }),
                _ => {}
            }
        }
    }
    for skipped in &next.skipped {
        if !previous.skipped.contains(skipped) {
            steps.push(RolloutStep {
                message: format!("Left out {}: {}", skipped.comes_back(), skipped.reason),
                ..step(PackageSkipped, None, Some(skipped.namespace.clone()))
            });
        }
    }
    if let Some(now) = &next.halted {
        let before = previous.halted.as_ref();
        let new = before.is_none_or(|b| {
            b.template_hash != now.template_hash || b.rolling_back != now.rolling_back
        });
        if new {
            steps.push(RolloutStep {
                message: now.message.clone(),
                ..step(RolloutHalted, None, None)
            });
        }
        if now.rolled_back_at.is_some() && before.is_none_or(|b| b.rolled_back_at.is_none()) {
            let to = next
                .last_succeeded
                .as_ref()
                .map(|l| l.template_hash.as_str())
                .unwrap_or_default();
            steps.push(RolloutStep {
                message: format!(
                    "Every Package is back on template {to}; template {} stays halted until the spec changes.",
                    now.template_hash
                ),
                ..step(RollbackFinished, None, None)
            });
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::rollout_plan::{plan_rollout, PartitionOrder, RolloutStrategy, Target};
    use std::collections::BTreeSet;

    fn input(states: &[(&str, &str, bool, bool)]) -> RolloutInput {
        RolloutInput {
            targets: states
                .iter()
                .map(|&(ns, label, updated, available)| Target {
                    namespace: ns.into(),
                    label: Some(label.into()),
                    package: Some(PackageState {
                        updated,
                        available,
                        live: available,
                        progressed: updated && available,
                        ..PackageState::default()
                    }),
                    failure: None,
                    in_window: true,
                })
                .collect(),
            partition: Some(PartitionOrder::Static(vec!["early".into(), "late".into()])),
            strategy: RolloutStrategy::RollingUpgrade { max_unavailable: 1 },
            processing: BTreeSet::new(),
            rules: Default::default(),
        }
    }

    fn kinds(steps: &[RolloutStep]) -> Vec<(RolloutEventKind, Option<&str>)> {
        steps
            .iter()
            .map(|s| (s.kind, s.namespace.as_deref().or(s.group.as_deref())))
            .collect()
    }

    /// A Package created with the last template that finished (its group not reached yet) did not take
    /// this generation's template: its update comes at its group's turn and is told then, once (the
    /// stream keeps one event per message id, so telling it at creation would drop the real one).
    #[test]
    fn a_package_created_with_the_proven_template_is_updated_once_at_its_groups_turn() {
        use RolloutEventKind::*;
        let mut a = input(&[("e", "early", true, false), ("l", "late", false, true)]);
        a.targets.push(Target {
            namespace: "joined".into(),
            label: Some("late".into()),
            package: None,
            failure: None,
            in_window: true,
        });
        a.rules.proven_template = true;
        let pa = plan_rollout(&a);
        assert_eq!(pa.create_proven, ["joined"]);
        let view = |input, plan| RolloutView {
            generation: 2,
            input,
            plan,
        };
        let told = rollout_steps(None, &view(&a, &pa));
        assert!(
            !kinds(&told).contains(&(PackageUpdated, Some("joined"))),
            "{:?}",
            kinds(&told)
        );
        assert!(!kinds(&story_so_far(&view(&a, &pa))).contains(&(PackageUpdated, Some("joined"))));
        // Its group's turn: the outdated Package it got is updated, and that is told.
        let b = input(&[
            ("e", "early", true, true),
            ("l", "late", true, true),
            ("joined", "late", false, true),
        ]);
        let pb = plan_rollout(&b);
        assert_eq!(pb.update, ["joined"]);
        let told = rollout_steps(Some(&view(&a, &pa)), &view(&b, &pb));
        assert!(kinds(&told).contains(&(PackageUpdated, Some("joined"))));
    }

    /// A rollout first planned over no clusters starts, and says so, when its clusters come.
    #[test]
    fn a_rollout_planned_over_no_clusters_starts_when_they_come() {
        use RolloutEventKind::*;
        let empty = input(&[]);
        let pe = plan_rollout(&empty);
        let ve = RolloutView {
            generation: 1,
            input: &empty,
            plan: &pe,
        };
        assert!(kinds(&rollout_steps(None, &ve)).is_empty());
        let a = input(&[("e", "early", false, true)]);
        let pa = plan_rollout(&a);
        let va = RolloutView {
            generation: 1,
            input: &a,
            plan: &pa,
        };
        let steps = rollout_steps(Some(&ve), &va);
        let told = kinds(&steps);
        assert_eq!(
            told[..2],
            [(RolloutStarted, None), (GroupStarted, Some("early"))]
        );
        // Once started, a later step does not start it again.
        assert!(!kinds(&rollout_steps(Some(&va), &va)).contains(&(RolloutStarted, None)));
    }

    #[test]
    fn a_two_group_rollout_tells_its_story() {
        use RolloutEventKind::*;
        // Generation 2 arrives: everything outdated.
        let a = input(&[("e", "early", false, true), ("l", "late", false, true)]);
        let pa = plan_rollout(&a);
        let va = RolloutView {
            generation: 2,
            input: &a,
            plan: &pa,
        };
        assert_eq!(
            kinds(&rollout_steps(None, &va)),
            [
                (RolloutStarted, None),
                (GroupStarted, Some("early")),
                (PackageUpdated, Some("e"))
            ]
        );
        // e is updated and available: early finishes, late starts.
        let b = input(&[("e", "early", true, true), ("l", "late", false, true)]);
        let pb = plan_rollout(&b);
        let vb = RolloutView {
            generation: 2,
            input: &b,
            plan: &pb,
        };
        assert_eq!(
            kinds(&rollout_steps(Some(&va), &vb)),
            [
                (GroupStarted, Some("late")),
                (GroupFinished, Some("early")),
                (PackageAvailable, Some("e")),
                (PackageUpdated, Some("l"))
            ]
        );
        // l fails to come up after its update... then recovers: the rollout finishes.
        let c = input(&[("e", "early", true, true), ("l", "late", true, true)]);
        let pc = plan_rollout(&c);
        let vc = RolloutView {
            generation: 2,
            input: &c,
            plan: &pc,
        };
        assert_eq!(
            kinds(&rollout_steps(Some(&vb), &vc)),
            [
                (GroupFinished, Some("late")),
                (PackageAvailable, Some("l")),
                (RolloutFinished, None)
            ]
        );
        // e breaks later: a failure, and the early group is open again.
        let d = input(&[("e", "early", true, false), ("l", "late", true, true)]);
        let pd = plan_rollout(&d);
        let vd = RolloutView {
            generation: 2,
            input: &d,
            plan: &pd,
        };
        assert_eq!(
            kinds(&rollout_steps(Some(&vc), &vd)),
            [(GroupStarted, Some("early")), (PackageFailed, Some("e"))]
        );
    }

    #[test]
    fn a_group_that_finishes_with_an_earlier_one_starts_first() {
        use RolloutEventKind::*;
        // Release 1: both Packages are created at once; early is current.
        let mut a = input(&[("e", "early", true, false), ("l", "late", true, false)]);
        for t in &mut a.targets {
            t.package = None;
        }
        let pa = plan_rollout(&a);
        let va = RolloutView {
            generation: 1,
            input: &a,
            plan: &pa,
        };
        // Both come up together: early and late finish in one step.
        let b = input(&[("e", "early", true, true), ("l", "late", true, true)]);
        let pb = plan_rollout(&b);
        let vb = RolloutView {
            generation: 1,
            input: &b,
            plan: &pb,
        };
        let steps = rollout_steps(Some(&va), &vb);
        let told = kinds(&steps);
        assert_eq!(
            told[..3],
            [
                (GroupFinished, Some("early")),
                (GroupStarted, Some("late")),
                (GroupFinished, Some("late"))
            ]
        );
        assert_eq!(told.last(), Some(&(RolloutFinished, None)));
    }

    #[test]
    fn a_manager_taking_over_tells_everything_told_before_and_what_it_missed() {
        use RolloutEventKind::*;
        let a = input(&[("e", "early", false, true), ("l", "late", false, true)]);
        let pa = plan_rollout(&a);
        let va = RolloutView {
            generation: 2,
            input: &a,
            plan: &pa,
        };
        let b = input(&[("e", "early", true, true), ("l", "late", false, true)]);
        let pb = plan_rollout(&b);
        let vb = RolloutView {
            generation: 2,
            input: &b,
            plan: &pb,
        };
        // What one manager told over the whole way to vb; a successor taking over at vb says all of it.
        let told_before = rollout_steps(None, &va);
        let told_after = rollout_steps(Some(&va), &vb);
        let told: Vec<_> = kinds(&told_before)
            .into_iter()
            .chain(kinds(&told_after))
            .collect();
        let story = story_so_far(&vb);
        assert_eq!(
            kinds(&story),
            [
                (RolloutStarted, None),
                (GroupStarted, Some("early")),
                (PackageUpdated, Some("e")),
                (PackageAvailable, Some("e")),
                (GroupFinished, Some("early")),
                (GroupStarted, Some("late")),
                (PackageUpdated, Some("l")),
            ]
        );
        let retold = kinds(&story);
        assert!(
            told.iter().all(|step| retold.contains(step)),
            "{told:?} not in {retold:?}"
        );
        // Everything done while no manager ran is told too, up to the end.
        let c = input(&[("e", "early", true, true), ("l", "late", true, true)]);
        let pc = plan_rollout(&c);
        let vc = RolloutView {
            generation: 2,
            input: &c,
            plan: &pc,
        };
        let whole = story_so_far(&vc);
        let end = kinds(&whole);
        assert!(end.contains(&(PackageAvailable, Some("l"))));
        assert!(end.contains(&(GroupFinished, Some("late"))));
        assert_eq!(end.last(), Some(&(RolloutFinished, None)));
    }

    #[test]
    fn a_failing_package_is_told_once_with_why() {
        use RolloutEventKind::*;
        let mut a = input(&[("e", "early", true, false), ("l", "late", false, true)]);
        let pa = plan_rollout(&a);
        let va = RolloutView {
            generation: 4,
            input: &a,
            plan: &pa,
        };
        // The latest revision reports its probe failing.
        let mut b = a.clone();
        b.targets[0].package = Some(PackageState {
            updated: true,
            failed: true,
            ..PackageState::default()
        });
        b.targets[0].failure = Some("Widget e/w: condition \"Available\" is \"False\"".into());
        let pb = plan_rollout(&b);
        let vb = RolloutView {
            generation: 4,
            input: &b,
            plan: &pb,
        };
        let steps = rollout_steps(Some(&va), &vb);
        assert_eq!(kinds(&steps), [(PackageFailed, Some("e"))]);
        assert_eq!(
            steps[0].message,
            "Widget e/w: condition \"Available\" is \"False\""
        );
        assert!(rollout_steps(Some(&vb), &vb).is_empty(), "told once");
        // Available on an older revision is not live: no packageAvailable for it.
        a.targets[0].package = Some(PackageState {
            updated: true,
            available: true,
            ..PackageState::default()
        });
        let pc = plan_rollout(&a);
        let vc = RolloutView {
            generation: 4,
            input: &a,
            plan: &pc,
        };
        assert!(kinds(&rollout_steps(Some(&vb), &vc))
            .iter()
            .all(|(k, _)| *k != PackageAvailable));
    }

    #[test]
    fn a_used_up_budget_is_told_once() {
        use RolloutEventKind::*;
        let a = input(&[("x", "early", true, false), ("y", "early", false, true)]);
        let pa = plan_rollout(&a);
        let va = RolloutView {
            generation: 3,
            input: &a,
            plan: &pa,
        };
        let first = rollout_steps(None, &va);
        let blocked: Vec<&RolloutStep> = first.iter().filter(|s| s.kind == Blocked).collect();
        assert_eq!(blocked.len(), 1);
        assert_eq!(blocked[0].message, "maxUnavailable 1 is used by x");
        assert!(rollout_steps(Some(&va), &va)
            .iter()
            .all(|s| s.kind != Blocked));
    }
}

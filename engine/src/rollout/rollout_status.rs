//! The HostedClusterPackage's conditions from a rollout plan, with seed 000's reasons and messages:
//! Available (`EnoughPackagesAvailable` / `NotEnoughPackagesAvailable`, "3/3 packages available."),
//! Progressing (`AllPackagesProgressed` False / `NotAllPackagesProgressed` True), HasPausedPackage
//! (`NoPackagePaused` False / `AtLeastOnePackagePaused` True). While updated Packages fail, Progressing
//! names them and why, and says which group the rollout is halted in. Pure.

use crate::conditions::{find_condition, ConditionUpdate};
use crate::rollout::rollout_plan::{RolloutInput, RolloutPlan, RolloutStrategy, UNKNOWN_GROUP};
use pko_proto::core::hosted_cluster_package::{
    HostedClusterPackageCounts, HostedClusterPackageStatus,
};

/// At most this many failing Packages are named in a condition message; the rest are counted.
const NAMED_FAILURES: usize = 5;
/// A failure message longer than this is cut, so one Package cannot flood the condition.
const FAILURE_MESSAGE_CHARS: usize = 300;

/// "ns: why; ns: why; and 3 more", in rollout order.
pub fn failing_packages(input: &RolloutInput, plan: &RolloutPlan) -> String {
    let mut named: Vec<String> = plan
        .failed
        .iter()
        .take(NAMED_FAILURES)
        .map(|ns| {
            let full = input
                .targets
                .iter()
                .find(|t| &t.namespace == ns)
                .and_then(|t| t.failure.as_deref())
                .unwrap_or("failing");
            let mut why: String = full.chars().take(FAILURE_MESSAGE_CHARS).collect();
            if why.len() < full.len() {
                why.push('…');
            }
            format!("{ns}: {why}")
        })
        .collect();
    if plan.failed.len() > NAMED_FAILURES {
        named.push(format!("and {} more", plan.failed.len() - NAMED_FAILURES));
    }
    named.join("; ")
}

pub const AVAILABLE: &str = "Available";
pub const PROGRESSING: &str = "Progressing";
pub const HAS_PAUSED_PACKAGE: &str = "HasPausedPackage";

/// Available holds while no more Packages are unavailable than the strategy allows (none for `instant`).
pub fn rollout_conditions(
    input: &RolloutInput,
    plan: &RolloutPlan,
    strategy: RolloutStrategy,
) -> Vec<ConditionUpdate> {
    let c = &plan.counts;
    let allowed = match strategy {
        RolloutStrategy::Instant => 0,
        RolloutStrategy::RollingUpgrade { max_unavailable } => max_unavailable,
    };
    let available = c.unavailable <= allowed;
    let mut available_message = format!("{}/{} packages available.", c.available, c.total);
    if let Some(blocked) = &plan.blocked {
        available_message.push_str(&format!(
            " Rollout waits: maxUnavailable {} is used by {}.",
            blocked.max_unavailable,
            blocked.holders.join(", ")
        ));
    }
    let progressed = c.progressed == c.total;
    let mut progressing_message = format!("{}/{} packages progressed.", c.progressed, c.total);
    if !plan.failed.is_empty() {
        let group = plan
            .current_group
            .and_then(|i| plan.groups.get(i))
            .map(|g| g.name.as_deref().unwrap_or(UNKNOWN_GROUP))
            .unwrap_or(UNKNOWN_GROUP);
        progressing_message.push_str(&format!(
            " Rollout halted in group {group}: {} failing: {}.",
            plan.failed.len(),
            failing_packages(input, plan)
        ));
    }
    let paused_message = format!("{}/{} packages paused.", c.paused, c.total);
    vec![
        ConditionUpdate::new(
            AVAILABLE,
            available,
            if available {
                "EnoughPackagesAvailable"
            } else {
                "NotEnoughPackagesAvailable"
            },
            available_message,
        ),
        ConditionUpdate::new(
            PROGRESSING,
            !progressed,
            if progressed {
                "AllPackagesProgressed"
            } else {
                "NotAllPackagesProgressed"
            },
            progressing_message,
        ),
        ConditionUpdate::new(
            HAS_PAUSED_PACKAGE,
            c.paused > 0,
            if c.paused > 0 {
                "AtLeastOnePackagePaused"
            } else {
                "NoPackagePaused"
            },
            paused_message,
        ),
    ]
}

/// Where a rollout stands, read off its stored status (for metrics and dashboards).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutState {
    /// Packages are being updated or becoming live.
    Progressing,
    /// Every Package progressed.
    Finished,
    /// Outdated Packages wait and none is moving: updated Packages fail, or unavailable ones use up
    /// maxUnavailable.
    Blocked,
    /// Nothing moves but paused Packages keep the rollout from finishing, or the rollout is paused.
    Paused,
    /// The rollout policy halted the template (rolling back or not).
    Halted,
    /// Nothing moves and the group being rolled out waits for its members' maintenance windows.
    WaitingForWindow,
}

impl RolloutState {
    pub const ALL: [RolloutState; 6] = [
        RolloutState::Progressing,
        RolloutState::Finished,
        RolloutState::Blocked,
        RolloutState::Paused,
        RolloutState::Halted,
        RolloutState::WaitingForWindow,
    ];

    pub fn label(self) -> &'static str {
        match self {
            RolloutState::Progressing => "progressing",
            RolloutState::Finished => "finished",
            RolloutState::Blocked => "blocked",
            RolloutState::Paused => "paused",
            RolloutState::Halted => "halted",
            RolloutState::WaitingForWindow => "waiting_for_window",
        }
    }
}

/// The state of the rollout `status` describes.
pub fn rollout_state(status: &HostedClusterPackageStatus) -> RolloutState {
    let holds =
        |type_: &str| find_condition(&status.conditions, type_).is_some_and(|c| c.status == "True");
    let c = &status.counts;
    let moving = c.in_flight_packages > 0 || !status.processing.is_empty();
    if status.halted.is_some() {
        RolloutState::Halted
    } else if holds(crate::rollout::rollout_guard::ROLLOUT_PAUSED) {
        RolloutState::Paused
    } else if !holds(PROGRESSING) {
        RolloutState::Finished
    } else if c.failed_packages > 0 {
        RolloutState::Blocked
    } else if moving {
        RolloutState::Progressing
    } else if holds(HAS_PAUSED_PACKAGE) {
        RolloutState::Paused
    } else if status
        .partitions
        .iter()
        .any(|p| p.state == crate::rollout::rollout_guard::group_state::WAITING_FOR_WINDOW)
    {
        RolloutState::WaitingForWindow
    } else if c.updated_packages < c.total_packages {
        RolloutState::Blocked
    } else {
        RolloutState::Progressing
    }
}

/// Whether writing `next` over `previous` may wait a moment to be merged with the next write: true when
/// they differ only in progress within the same state — counts other than failed Packages, condition
/// messages (which carry those counts), and Packages leaving `processing`. Anything else is written at
/// once: a condition's status or reason, a state change, a failure, a new generation, a group's state or
/// soak, and every Package entering `processing` (it must be stored before that Package is written).
/// Pure; the caller bounds the wait.
pub fn progress_only(
    previous: &HostedClusterPackageStatus,
    next: &HostedClusterPackageStatus,
) -> bool {
    if rollout_state(previous) != rollout_state(next)
        || !next
            .processing
            .iter()
            .all(|p| previous.processing.contains(p))
    {
        return false;
    }
    let without_progress = |status: &HostedClusterPackageStatus| {
        let mut status = status.clone();
        status.counts = HostedClusterPackageCounts {
            failed_packages: status.counts.failed_packages,
            ..HostedClusterPackageCounts::default()
        };
        for partition in &mut status.partitions {
            partition.counts = HostedClusterPackageCounts {
                failed_packages: partition.counts.failed_packages,
                ..HostedClusterPackageCounts::default()
            };
        }
        for condition in &mut status.conditions {
            condition.message.clear();
        }
        status.processing.clear();
        status
    };
    without_progress(previous) == without_progress(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::rollout_plan::{plan_rollout, PackageState, RolloutInput, Target};

    fn fleet(states: &[(bool, bool, bool)]) -> RolloutInput {
        RolloutInput {
            targets: states
                .iter()
                .enumerate()
                .map(|(i, &(updated, available, paused))| Target {
                    namespace: format!("clusters-{i}"),
                    label: None,
                    package: Some(PackageState {
                        updated,
                        available,
                        live: available,
                        progressed: updated && available,
                        paused,
                        failed: false,
                    }),
                    failure: None,
                    in_window: true,
                })
                .collect(),
            partition: None,
            strategy: RolloutStrategy::RollingUpgrade { max_unavailable: 1 },
            processing: Default::default(),
            rules: Default::default(),
        }
    }

    fn rendered(updates: &[ConditionUpdate]) -> Vec<(String, bool, String, String)> {
        updates
            .iter()
            .map(|u| {
                (
                    u.type_.clone(),
                    u.status,
                    u.reason.clone(),
                    u.message.clone(),
                )
            })
            .collect()
    }

    #[test]
    fn seed_000s_example_status() {
        let input = fleet(&[(true, true, false); 3]);
        let plan = plan_rollout(&input);
        assert_eq!(
            rendered(&rollout_conditions(&input, &plan, input.strategy)),
            [
                (
                    "Available".into(),
                    true,
                    "EnoughPackagesAvailable".into(),
                    "3/3 packages available.".into()
                ),
                (
                    "Progressing".into(),
                    false,
                    "AllPackagesProgressed".into(),
                    "3/3 packages progressed.".into()
                ),
                (
                    "HasPausedPackage".into(),
                    false,
                    "NoPackagePaused".into(),
                    "0/3 packages paused.".into()
                ),
            ]
        );
    }

    #[test]
    fn failing_packages_are_named_with_why_and_capped() {
        let mut input = fleet(&[(true, false, false); 8]);
        for (i, t) in input.targets.iter_mut().enumerate() {
            t.package = Some(PackageState {
                updated: true,
                failed: true,
                ..PackageState::default()
            });
            t.failure = Some(if i == 0 {
                "x".repeat(400)
            } else {
                format!("probe {i}")
            });
        }
        let plan = plan_rollout(&input);
        let got = rendered(&rollout_conditions(&input, &plan, input.strategy));
        let message = &got[1].3;
        assert!(
            message.starts_with("0/8 packages progressed. Rollout halted in group unknown: 8 failing: clusters-0: xxx"),
            "{message}"
        );
        assert!(
            message.contains(&format!("{}…; clusters-1: probe 1", "x".repeat(10))),
            "{message}"
        );
        assert!(
            message.ends_with("clusters-4: probe 4; and 3 more."),
            "{message}"
        );
        assert!(!message.contains(&"x".repeat(301)), "long messages are cut");
    }

    #[test]
    fn a_stuck_rollout_says_who_holds_the_budget() {
        let input = fleet(&[
            (true, false, false),
            (false, true, false),
            (true, true, true),
        ]);
        let plan = plan_rollout(&input);
        let got = rendered(&rollout_conditions(&input, &plan, input.strategy));
        assert_eq!(
            got[0],
            (
                "Available".into(),
                true,
                "EnoughPackagesAvailable".into(),
                "2/3 packages available. Rollout waits: maxUnavailable 1 is used by clusters-0."
                    .into()
            )
        );
        assert!(
            got[1].1,
            "Progressing is True while a package has not progressed"
        );
        assert_eq!(got[1].2, "NotAllPackagesProgressed");
        assert_eq!(
            got[2],
            (
                "HasPausedPackage".into(),
                true,
                "AtLeastOnePackagePaused".into(),
                "1/3 packages paused.".into()
            )
        );
    }
    #[test]
    fn the_rollout_state_is_read_off_the_stored_status() {
        use pko_proto::core::hosted_cluster_package::{
            HostedClusterPackageCounts, HostedClusterPackageRefStatus,
        };
        let status = |progressing: bool, paused: bool, counts: HostedClusterPackageCounts| {
            let condition = |type_: &str, holds: bool| {
                serde_json::from_value(serde_json::json!({"type": type_,
                    "status": if holds { "True" } else { "False" }, "reason": "R", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}))
                .unwrap()
            };
            HostedClusterPackageStatus {
                conditions: vec![
                    condition(PROGRESSING, progressing),
                    condition(HAS_PAUSED_PACKAGE, paused),
                ],
                counts,
                ..Default::default()
            }
        };
        let counts = |total, updated, in_flight, failed| HostedClusterPackageCounts {
            total_packages: total,
            updated_packages: updated,
            in_flight_packages: in_flight,
            failed_packages: failed,
            ..Default::default()
        };
        assert_eq!(
            rollout_state(&status(false, false, counts(3, 3, 0, 0))),
            RolloutState::Finished
        );
        assert_eq!(
            rollout_state(&status(true, false, counts(3, 1, 1, 0))),
            RolloutState::Progressing
        );
        assert_eq!(
            rollout_state(&status(true, false, counts(3, 2, 1, 1))),
            RolloutState::Blocked
        );
        assert_eq!(
            rollout_state(&status(true, false, counts(3, 1, 0, 0))),
            RolloutState::Blocked
        );
        assert_eq!(
            rollout_state(&status(true, true, counts(3, 1, 0, 0))),
            RolloutState::Paused
        );
        let mut writing = status(true, false, counts(3, 1, 0, 0));
        writing
            .processing
            .push(HostedClusterPackageRefStatus::default());
        assert_eq!(rollout_state(&writing), RolloutState::Progressing);
    }

    #[test]
    fn only_progress_within_the_same_state_may_wait_to_be_written() {
        use serde_json::json;
        let status = |updated: i32, failed: i32, processing: &[&str], progressing: &str| {
            let processing: Vec<_> = processing
                .iter()
                .map(|n| json!({"uid": n, "name": "p", "namespace": n}))
                .collect();
            serde_json::from_value::<HostedClusterPackageStatus>(json!({
                "observedGeneration": 2,
                "totalPackages": 10, "updatedPackages": updated, "failedPackages": failed,
                "availablePackages": updated,
                "conditions": [{
                    "type": "Progressing", "status": progressing, "reason": "NotAllPackagesProgressed",
                    "message": format!("{updated}/10 packages progressed."),
                    "lastTransitionTime": "2026-11-26T10:00:00Z",
                }],
                "partitions": [{"name": "a", "order": 0, "updatedPackages": updated, "state": "Progressing"}],
                "processing": processing,
            }))
            .unwrap()
        };
        let now = status(3, 0, &["ns-1", "ns-2"], "True");
        // Counts, their messages and a Package leaving `processing`: may wait.
        assert!(progress_only(&now, &status(4, 0, &["ns-2"], "True")));
        assert!(progress_only(&now, &now));
        // A Package entering `processing` must be stored before it is written.
        assert!(!progress_only(
            &now,
            &status(3, 0, &["ns-1", "ns-2", "ns-3"], "True")
        ));
        assert!(!progress_only(&now, &status(4, 0, &["ns-3"], "True")));
        // A failure, a condition's status, a new generation, a group's state: at once.
        assert!(!progress_only(
            &now,
            &status(3, 1, &["ns-1", "ns-2"], "True")
        ));
        assert!(!progress_only(&now, &status(10, 0, &[], "False")));
        let mut next_generation = now.clone();
        next_generation.observed_generation = 3;
        assert!(!progress_only(&now, &next_generation));
        let mut soaking = now.clone();
        soaking.partitions[0].state = "Soaking".to_owned();
        assert!(!progress_only(&now, &soaking));
    }
}

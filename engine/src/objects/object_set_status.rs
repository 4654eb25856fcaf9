//! Status computation for ObjectSets (and the ObjectSetPhases that report back into them): from what the
//! phases observed to the conditions PKO users know (Available, Succeeded, InTransition, Paused, Archived),
//! plus when the success delay will have passed.
//!
//! Pure: the caller passes the current time and writes the result only if it differs.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use pko_proto::core::common::LifecycleState;

use crate::conditions::{
    find_condition, foreign_text, remove_condition, set_condition, ConditionUpdate,
    FOREIGN_TEXT_LIMIT,
};

pub const AVAILABLE: &str = "Available";
pub const SUCCEEDED: &str = "Succeeded";
pub const IN_TRANSITION: &str = "InTransition";
pub const PAUSED: &str = "Paused";
pub const ARCHIVED: &str = "Archived";

/// Why a phase is not available yet; the names are PKO's condition reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockReason {
    ProbeFailure,
    /// Probes fail only because objects' status does not speak for their current generation yet.
    AwaitingStatus,
    CollisionDetected,
    /// A newer revision took over some of the phase's objects.
    HandedOver,
    PreflightError,
    /// A delegated phase whose ObjectSetPhase reported nothing current yet.
    PhaseNotReported,
    /// A delegated phase whose ObjectSetPhase has no `Available` condition for its generation yet: the
    /// set has nothing to say of the phase's objects, so it writes no `Available` of its own for it
    /// (upstream's first word on such a set is the phase's verdict).
    AwaitingReport,
    /// A hosted-cluster phase larger than a NATS message may be: it cannot be delivered.
    TooLarge,
}

impl BlockReason {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockReason::ProbeFailure => "ProbeFailure",
            BlockReason::AwaitingStatus => "AwaitingStatus",
            BlockReason::CollisionDetected => "CollisionDetected",
            BlockReason::HandedOver => "HandedOver",
            BlockReason::PreflightError => "PreflightError",
            BlockReason::PhaseNotReported => "PhaseNotReported",
            BlockReason::AwaitingReport => "AwaitingReport",
            BlockReason::TooLarge => "TooLarge",
        }
    }
}

/// Where one phase stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PhaseProgress {
    /// All objects applied and every probe passed.
    Available,
    /// The phase stopped here; later phases are not applied.
    Blocked {
        reason: BlockReason,
        message: String,
    },
}

/// A condition copied from a managed object through a conditionMapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedCondition {
    pub type_: String,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// The longest reason a mapped condition carries: whoever may write the mapped object (a tenant, a
/// hosted cluster's customer) writes its conditions, and each set and its owners repeat them.
pub const MAX_MAPPED_REASON: usize = 128;
/// The longest message a mapped condition carries (a longer one ends in `…`): another party's text.
pub const MAX_MAPPED_MESSAGE: usize = FOREIGN_TEXT_LIMIT;

impl MappedCondition {
    /// A mapped condition with its text bounded: a reason that is not a condition reason (letters,
    /// digits, `_`, `,`, `:`, starting with a letter) or longer than [`MAX_MAPPED_REASON`] becomes
    /// `Mapped`, and the message is [`foreign_text`]: without control characters, cut to
    /// [`MAX_MAPPED_MESSAGE`] bytes.
    pub fn bounded(type_: &str, status: bool, reason: &str, message: &str) -> Self {
        let valid_reason = reason.len() <= MAX_MAPPED_REASON
            && reason.starts_with(|c: char| c.is_ascii_alphabetic())
            && reason
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ':'))
            && !reason.ends_with([',', ':']);
        Self {
            type_: type_.to_owned(),
            status,
            reason: if valid_reason { reason } else { "Mapped" }.to_owned(),
            message: foreign_text(message),
        }
    }
}

/// What the reconcile observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetObservation {
    pub lifecycle: LifecycleState,
    pub generation: i64,
    /// Phase outcomes in order; it ends at the first blocked phase.
    pub phases: Vec<(String, PhaseProgress)>,
    pub total_phases: usize,
    pub success_delay_seconds: i32,
    /// For Archived sets: whether every object is gone.
    pub teardown_complete: bool,
    /// Why the set could not be planned at all (the message names the field).
    pub plan_error: Option<String>,
    pub mapped: Vec<MappedCondition>,
}

/// New conditions and, when Succeeded is pending on the success delay, how long until it is due.
#[derive(Debug, Clone, PartialEq)]
pub struct SetStatusDecision {
    pub conditions: Vec<Condition>,
    pub phase: &'static str,
    pub recheck_after: Option<Duration>,
}

/// Computes the ObjectSet's conditions from the previous ones and the observation.
pub fn object_set_conditions(
    previous: &[Condition],
    obs: &SetObservation,
    now: Timestamp,
) -> SetStatusDecision {
    let mut conditions = previous.to_vec();
    let generation = obs.generation;
    let set =
        |conds: &mut Vec<Condition>, u: ConditionUpdate| set_condition(conds, u, generation, now);

    if obs.lifecycle == LifecycleState::Archived {
        remove_condition(&mut conditions, PAUSED);
        remove_condition(&mut conditions, IN_TRANSITION);
        let update = if obs.teardown_complete {
            ConditionUpdate::new(ARCHIVED, true, "Archived", "ObjectSet is archived.")
        } else {
            ConditionUpdate::new(
                ARCHIVED,
                false,
                "ArchivalInProgress",
                "ObjectSet is being archived.",
            )
        };
        set(&mut conditions, update);
        return SetStatusDecision {
            conditions,
            phase: "Archived",
            recheck_after: None,
        };
    }
    remove_condition(&mut conditions, ARCHIVED);

    let paused = obs.lifecycle == LifecycleState::Paused;
    if paused {
        set(
            &mut conditions,
            ConditionUpdate::new(PAUSED, true, "Paused", "Lifecycle state set to paused."),
        );
    } else {
        remove_condition(&mut conditions, PAUSED);
    }

    let (all_available, available, in_transition) = availability(obs);
    if let Some(available) = available {
        set(&mut conditions, available);
    }
    match in_transition {
        Some(update) => set(&mut conditions, update),
        None => remove_condition(&mut conditions, IN_TRANSITION),
    }

    for mapped in &obs.mapped {
        set(
            &mut conditions,
            ConditionUpdate::new(
                &mapped.type_,
                mapped.status,
                &mapped.reason,
                mapped.message.clone(),
            ),
        );
    }

    let recheck_after = settle_success(&mut conditions, obs, all_available, now);

    let phase = if paused {
        "Paused"
    } else if all_available {
        "Available"
    } else {
        "NotReady"
    };
    SetStatusDecision {
        conditions,
        phase,
        recheck_after,
    }
}

/// Whether every phase is available, the Available condition that says so or why not (`None`: keep the
/// one written before), and the InTransition condition while the set is not there yet (`None`: remove
/// it).
fn availability(obs: &SetObservation) -> (bool, Option<ConditionUpdate>, Option<ConditionUpdate>) {
    let blocked = obs.phases.iter().find_map(|(name, p)| match p {
        PhaseProgress::Blocked { reason, message } => Some((name, *reason, message)),
        PhaseProgress::Available => None,
    });
    let transition = |message: String| {
        Some(ConditionUpdate::new(
            IN_TRANSITION,
            true,
            "InTransition",
            message,
        ))
    };
    match (&obs.plan_error, blocked) {
        (Some(message), _) => {
            let reason = BlockReason::PreflightError.as_str();
            (
                false,
                Some(ConditionUpdate::new(
                    AVAILABLE,
                    false,
                    reason,
                    message.clone(),
                )),
                transition("The spec cannot be reconciled; see Available.".to_owned()),
            )
        }
        (None, Some((name, BlockReason::AwaitingReport, message))) => (
            false,
            None,
            transition(format!(
                "Phase {name:?} awaits its first report: {}",
                bounded_message(message)
            )),
        ),
        (None, Some((name, reason, message))) => {
            let msg = format!("Phase {name:?} failed: {}", bounded_message(message));
            (
                false,
                Some(ConditionUpdate::new(AVAILABLE, false, reason.as_str(), msg)),
                transition(format!("Phase {name:?} has not passed its probes yet.")),
            )
        }
        (None, None) if obs.phases.len() == obs.total_phases => (
            true,
            Some(ConditionUpdate::new(
                AVAILABLE,
                true,
                "Available",
                "Object is available and passes all probes.",
            )),
            None,
        ),
        // Fewer outcomes than phases without a blocked one: the caller stopped early (e.g. paused
        // mid-way).
        (None, None) => (
            false,
            Some(ConditionUpdate::new(
                AVAILABLE,
                false,
                "Pending",
                "Not all phases reconciled yet.",
            )),
            transition("Not all phases reconciled yet.".to_owned()),
        ),
    }
}

/// Sets Succeeded once every phase has been available for the set's success delay; returns how long
/// is left of it otherwise.
fn settle_success(
    conditions: &mut Vec<Condition>,
    obs: &SetObservation,
    all_available: bool,
    now: Timestamp,
) -> Option<Duration> {
    let already_succeeded =
        find_condition(conditions, SUCCEEDED).is_some_and(|c| c.status == "True");
    if !all_available || already_succeeded {
        return None;
    }
    let since = find_condition(conditions, AVAILABLE)
        .map(|c| c.last_transition_time.0)
        .unwrap_or(now);
    let delay = Duration::from_secs(u64::try_from(obs.success_delay_seconds.max(0)).unwrap_or(0));
    let held = now.duration_since(since);
    let held = Duration::try_from(held).unwrap_or(Duration::ZERO);
    if held < delay {
        return Some(delay - held);
    }
    set_condition(
        conditions,
        ConditionUpdate::new(
            SUCCEEDED,
            true,
            "RolloutSuccess",
            "ObjectSet completed its rollout.",
        ),
        obs.generation,
        now,
    );
    None
}

/// How far a set's phases may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhaseReach {
    /// Phases up to this index (inclusive) are reconciled when their objects change; later ones are not
    /// applied yet. `len` when every phase may run.
    pub frontier: usize,
    /// The phase to start now: the first one not run yet for the current plan, if it may run.
    pub next: Option<usize>,
}

/// Where a set's phases may run, from each phase's last progress (`None`: not run for the current plan).
/// Phases run in order while each earlier one is available. A phase whose objects went to a newer
/// revision (`HandedOver`) does not hold back the later phases the set had already reached: they keep
/// being reconciled, so the set's status says what it still controls rather than what it last saw. A
/// phase never reached stays unreached behind a handover, so a superseded revision never rolls out
/// more of itself.
pub fn phase_reach(progress: &[Option<&PhaseProgress>]) -> PhaseReach {
    let mut behind_handover = false;
    for (index, phase) in progress.iter().enumerate() {
        match phase {
            None if behind_handover => {
                return PhaseReach {
                    frontier: index.saturating_sub(1),
                    next: None,
                }
            }
            None => {
                return PhaseReach {
                    frontier: index,
                    next: Some(index),
                }
            }
            Some(PhaseProgress::Available) => {}
            Some(PhaseProgress::Blocked {
                reason: BlockReason::HandedOver,
                ..
            }) => behind_handover = true,
            Some(PhaseProgress::Blocked { .. }) => {
                return PhaseReach {
                    frontier: index,
                    next: None,
                }
            }
        }
    }
    PhaseReach {
        frontier: progress.len(),
        next: None,
    }
}

/// A phase's message in a condition keeps at most this many bytes of its `; `-separated findings.
const CONDITION_MESSAGE_BYTES: usize = 4096;

/// `message` (findings joined by `; `) cut after the last whole finding within
/// [`CONDITION_MESSAGE_BYTES`], with how many more there are: a phase of thousands of failing objects
/// must not write a status of megabytes. A first finding longer than that is cut itself.
fn bounded_message(message: &str) -> String {
    if message.len() <= CONDITION_MESSAGE_BYTES {
        return message.to_owned();
    }
    let mut end = CONDITION_MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let (kept, rest) = match message[..end].rfind("; ") {
        Some(at) => (&message[..at], &message[at + 2..]),
        None => (&message[..end], &message[end..]),
    };
    let more = rest.split("; ").count();
    format!("{kept}… and {more} more")
}

#[cfg(test)]
mod mapped_text_tests {
    use super::*;
    use crate::conditions::bounded_text;
    use proptest::prelude::*;

    #[test]
    fn mapped_text_is_bounded_and_reasons_are_reasons() {
        let long = "é".repeat(5000);
        let mapped = MappedCondition::bounded("my/Ready", true, &"R".repeat(500), &long);
        assert_eq!(mapped.reason, "Mapped");
        assert!(mapped.message.len() <= MAX_MAPPED_MESSAGE);
        assert!(mapped.message.ends_with('…'));
        let forged = MappedCondition::bounded("my/Ready", false, "R", "a\n\u{1b}[2KReady=True\r");
        assert_eq!(forged.message, "a  [2KReady=True ");
        assert_eq!(
            MappedCondition::bounded("t", false, "Ok:1,b", "m").reason,
            "Ok:1,b"
        );
        for bad in ["", "1st", "has space", "new\nline", "Trailing:"] {
            assert_eq!(
                MappedCondition::bounded("t", false, bad, "").reason,
                "Mapped",
                "{bad:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn bounded_text_never_exceeds_its_bound(text in "\\PC{0,300}", max in 3usize..200) {
            let cut = bounded_text(text.clone(), max);
            prop_assert!(cut.len() <= max || cut == text);
            prop_assert!(text.starts_with(cut.trim_end_matches('…')) || cut == text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked(reason: BlockReason) -> PhaseProgress {
        PhaseProgress::Blocked {
            reason,
            message: String::new(),
        }
    }

    #[test]
    fn phases_run_in_order_until_one_is_not_available() {
        let available = PhaseProgress::Available;
        let failing = blocked(BlockReason::ProbeFailure);
        assert_eq!(
            phase_reach(&[Some(&available), None, None]),
            PhaseReach {
                frontier: 1,
                next: Some(1)
            }
        );
        assert_eq!(
            phase_reach(&[Some(&failing), Some(&available)]),
            PhaseReach {
                frontier: 0,
                next: None
            }
        );
        assert_eq!(
            phase_reach(&[Some(&available), Some(&available)]),
            PhaseReach {
                frontier: 2,
                next: None
            }
        );
    }

    #[test]
    fn a_handed_over_phase_lets_reached_phases_run_but_starts_no_new_one() {
        let available = PhaseProgress::Available;
        let handed_over = blocked(BlockReason::HandedOver);
        let failing = blocked(BlockReason::ProbeFailure);
        assert_eq!(
            phase_reach(&[Some(&handed_over), Some(&available), Some(&available)]),
            PhaseReach {
                frontier: 3,
                next: None
            }
        );
        assert_eq!(
            phase_reach(&[Some(&handed_over), Some(&failing), Some(&available)]),
            PhaseReach {
                frontier: 1,
                next: None
            }
        );
        assert_eq!(
            phase_reach(&[Some(&available), Some(&handed_over), None]),
            PhaseReach {
                frontier: 1,
                next: None
            }
        );
    }
    use crate::conditions::is_true_for;

    fn obs(phases: Vec<(String, PhaseProgress)>, delay: i32) -> SetObservation {
        SetObservation {
            lifecycle: LifecycleState::Active,
            generation: 1,
            total_phases: 2,
            phases,
            success_delay_seconds: delay,
            teardown_complete: false,
            plan_error: None,
            mapped: vec![],
        }
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn a_delegated_phase_not_reported_yet_writes_no_availability_of_its_own() {
        let waiting = obs(
            vec![(
                "deploy".into(),
                PhaseProgress::Blocked {
                    reason: BlockReason::AwaitingReport,
                    message: "ObjectSetPhase ns/set-deploy: no Available condition".into(),
                },
            )],
            0,
        );
        let fresh = object_set_conditions(&[], &waiting, at(10));
        assert!(find_condition(&fresh.conditions, AVAILABLE).is_none());
        let transition = find_condition(&fresh.conditions, IN_TRANSITION).unwrap();
        assert!(transition.message.contains("awaits its first report"));
        // What was said before stays, with the generation it was said for.
        let mut reported = waiting.clone();
        reported.phases[0].1 = PhaseProgress::Blocked {
            reason: BlockReason::ProbeFailure,
            message: "cm/a: bad".into(),
        };
        let failing = object_set_conditions(&[], &reported, at(11)).conditions;
        let held = object_set_conditions(&failing, &waiting, at(12)).conditions;
        assert_eq!(
            find_condition(&held, AVAILABLE).map(|c| c.reason.as_str()),
            Some("ProbeFailure")
        );
    }

    #[test]
    fn blocked_phase_sets_in_transition_and_reason() {
        let o = obs(
            vec![(
                "deploy".into(),
                PhaseProgress::Blocked {
                    reason: BlockReason::ProbeFailure,
                    message: "core ConfigMap ns/a: missing".into(),
                },
            )],
            0,
        );
        let d = object_set_conditions(&[], &o, at(10));
        let avail = find_condition(&d.conditions, AVAILABLE).unwrap();
        assert_eq!(avail.status, "False");
        assert_eq!(avail.reason, "ProbeFailure");
        assert_eq!(
            avail.message,
            "Phase \"deploy\" failed: core ConfigMap ns/a: missing"
        );
        assert!(is_true_for(&d.conditions, IN_TRANSITION, 1));
        assert!(find_condition(&d.conditions, SUCCEEDED).is_none());
        assert_eq!(d.phase, "NotReady");
    }

    #[test]
    fn success_waits_for_the_delay_then_sticks() {
        let all = vec![
            ("a".into(), PhaseProgress::Available),
            ("b".into(), PhaseProgress::Available),
        ];
        let d = object_set_conditions(&[], &obs(all.clone(), 5), at(100));
        assert!(is_true_for(&d.conditions, AVAILABLE, 1));
        assert!(find_condition(&d.conditions, SUCCEEDED).is_none());
        assert_eq!(d.recheck_after, Some(Duration::from_secs(5)));

        let d2 = object_set_conditions(&d.conditions, &obs(all.clone(), 5), at(103));
        assert_eq!(d2.recheck_after, Some(Duration::from_secs(2)));
        let d3 = object_set_conditions(&d2.conditions, &obs(all, 5), at(105));
        assert!(is_true_for(&d3.conditions, SUCCEEDED, 1));
        assert_eq!(d3.recheck_after, None);

        // Losing availability later does not revoke Succeeded.
        let blocked = vec![(
            "a".into(),
            PhaseProgress::Blocked {
                reason: BlockReason::ProbeFailure,
                message: "x".into(),
            },
        )];
        let d4 = object_set_conditions(&d3.conditions, &obs(blocked, 5), at(200));
        assert!(is_true_for(&d4.conditions, SUCCEEDED, 1));
        assert!(!is_true_for(&d4.conditions, AVAILABLE, 1));
    }

    #[test]
    fn unchanged_observation_gives_identical_conditions() {
        let all = vec![
            ("a".into(), PhaseProgress::Available),
            ("b".into(), PhaseProgress::Available),
        ];
        let d = object_set_conditions(&[], &obs(all.clone(), 0), at(100));
        let again = object_set_conditions(&d.conditions, &obs(all, 0), at(500));
        assert_eq!(d.conditions, again.conditions);
    }

    #[test]
    fn plan_errors_are_reported_as_they_are() {
        let mut o = obs(vec![], 0);
        o.plan_error = Some("spec.phases[0].objects[0].object.kind: is required".into());
        let d = object_set_conditions(&[], &o, at(1));
        let avail = find_condition(&d.conditions, AVAILABLE).unwrap();
        assert_eq!(avail.reason, "PreflightError");
        assert_eq!(
            avail.message,
            "spec.phases[0].objects[0].object.kind: is required"
        );
        assert_eq!(d.phase, "NotReady");
    }

    #[test]
    fn archived_and_paused() {
        let mut o = obs(vec![], 0);
        o.lifecycle = LifecycleState::Archived;
        let d = object_set_conditions(&[], &o, at(1));
        assert_eq!(
            find_condition(&d.conditions, ARCHIVED).unwrap().reason,
            "ArchivalInProgress"
        );
        o.teardown_complete = true;
        let d = object_set_conditions(&d.conditions, &o, at(2));
        assert!(is_true_for(&d.conditions, ARCHIVED, 1));

        let mut p = obs(
            vec![
                ("a".into(), PhaseProgress::Available),
                ("b".into(), PhaseProgress::Available),
            ],
            0,
        );
        p.lifecycle = LifecycleState::Paused;
        let d = object_set_conditions(&[], &p, at(1));
        assert!(is_true_for(&d.conditions, PAUSED, 1));
        assert_eq!(d.phase, "Paused");
    }
    #[test]
    fn a_long_phase_message_keeps_whole_findings_and_counts_the_rest() {
        let findings: Vec<String> = (0..1000)
            .map(|i| format!("cm/{i}: {}", "x".repeat(40)))
            .collect();
        let message = bounded_message(&findings.join("; "));
        assert!(
            message.len() <= CONDITION_MESSAGE_BYTES + 32,
            "{}",
            message.len()
        );
        let kept = message.matches("cm/").count();
        assert!(
            message.ends_with(&format!("… and {} more", 1000 - kept)),
            "{message}"
        );
        assert!(
            message.contains(&format!("cm/{}: {}…", kept - 1, "x".repeat(40))),
            "{message}"
        );
        let one = "é".repeat(5000);
        assert!(bounded_message(&one).ends_with("… and 1 more"));
        assert_eq!(bounded_message("short; list"), "short; list");
    }
}

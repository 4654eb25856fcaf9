//! Which Kubernetes Events an observed change raises: one per transition (a condition that turned, a
//! new revision, a rollout step), never one per reconcile, so an object that stays failed raises its
//! Event once. Compares two observed versions of an object, or reads rollout steps; pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use pko_proto::rollout_events::{RolloutEvent, RolloutEventKind};

use crate::conditions::{bounded_text, find_condition};
use crate::objects::object_set_status::{BlockReason, AVAILABLE};

/// The apiserver keeps an Event's note to 1 KiB.
const EVENT_NOTE_BYTES: usize = 1024;

/// One Event to raise about the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransitionEvent {
    pub warning: bool,
    /// CamelCase, machine-readable.
    pub reason: &'static str,
    /// What pko did or tried (events.k8s.io `action`).
    pub action: &'static str,
    pub note: String,
}

/// `text` cut to what an Event's note may hold.
pub fn event_note(text: String) -> String {
    bounded_text(text, EVENT_NOTE_BYTES)
}

/// The condition `type_` of `current` if it differs in status or reason from the one in `previous`.
fn turned<'a>(
    previous: &[Condition],
    current: &'a [Condition],
    type_: &str,
) -> Option<&'a Condition> {
    let now = find_condition(current, type_)?;
    let before = find_condition(previous, type_);
    let same = before.is_some_and(|b| b.status == now.status && b.reason == now.reason);
    (!same).then_some(now)
}

/// A Package: `Unpacked` when its image was unpacked and applied, `UnpackFailed` when the pull, the
/// image's limits or the package itself failed (`Unpacked` False or `Invalid` True).
pub fn package_transitions(previous: &[Condition], current: &[Condition]) -> Vec<TransitionEvent> {
    let mut events = Vec::new();
    if let Some(c) = turned(previous, current, "Unpacked") {
        events.push(TransitionEvent {
            warning: c.status != "True",
            reason: if c.status == "True" {
                "Unpacked"
            } else {
                "UnpackFailed"
            },
            action: "Unpack",
            note: event_note(c.message.clone()),
        });
    }
    if let Some(c) = turned(previous, current, "Invalid").filter(|c| c.status == "True") {
        events.push(TransitionEvent {
            warning: true,
            reason: "UnpackFailed",
            action: "Load",
            note: event_note(c.message.clone()),
        });
    }
    events
}

/// An ObjectDeployment: `NewRevision` when its revision moved on.
pub fn deployment_transitions(previous: Option<i64>, current: Option<i64>) -> Vec<TransitionEvent> {
    match current {
        Some(revision) if current > previous => vec![TransitionEvent {
            warning: false,
            reason: "NewRevision",
            action: "Rollout",
            note: format!("Revision {revision} created."),
        }],
        _ => Vec::new(),
    }
}

/// Why an ObjectSet is not available that is a failure, not a wait.
const FAILURES: [BlockReason; 5] = [
    BlockReason::ProbeFailure,
    BlockReason::CollisionDetected,
    BlockReason::PreflightError,
    BlockReason::TooLarge,
    BlockReason::PhaseNotReported,
];

/// An ObjectSet or ObjectSetPhase: `PhaseFailed` when it stopped being available for a failure (probes,
/// collisions, preflight, size, an unreported hosted phase).
pub fn object_set_transitions(
    previous: &[Condition],
    current: &[Condition],
) -> Vec<TransitionEvent> {
    let failed = turned(previous, current, AVAILABLE)
        .filter(|c| c.status == "False" && FAILURES.iter().any(|f| f.as_str() == c.reason));
    failed
        .map(|c| TransitionEvent {
            warning: true,
            reason: "PhaseFailed",
            action: "Reconcile",
            note: event_note(c.message.clone()),
        })
        .into_iter()
        .collect()
}

/// A HostedClusterPackage: its rollout steps, except those of single Packages that went well (a fleet
/// of hundreds would drown the object's Events; the rollout event stream has them all).
pub fn rollout_transition(event: &RolloutEvent) -> Option<TransitionEvent> {
    let group = event.group.as_deref().unwrap_or("unknown");
    let (warning, reason, note) = match event.kind {
        RolloutEventKind::RolloutStarted => (
            false,
            "RolloutStarted",
            format!("Rolling out generation {}.", event.generation),
        ),
        RolloutEventKind::GroupStarted => {
            (false, "PartitionStarted", format!("Group {group} started."))
        }
        RolloutEventKind::GroupFinished => (
            false,
            "PartitionFinished",
            format!("Group {group} finished."),
        ),
        RolloutEventKind::Blocked => (true, "RolloutBlocked", event.message.clone()),
        RolloutEventKind::PromotionWaiting => (false, "PromotionWaiting", event.message.clone()),
        RolloutEventKind::PromotionOpened => (
            false,
            "PromotionOpened",
            format!("Promotion gate opened for generation {}.", event.generation),
        ),
        RolloutEventKind::RolloutFinished => (
            false,
            "RolloutFinished",
            format!("Generation {} rolled out.", event.generation),
        ),
        RolloutEventKind::PackageFailed => (
            true,
            "PackageFailed",
            failure_note(
                event.namespace.as_deref().unwrap_or_default(),
                &event.hosted_cluster_package,
                group,
                &event.message,
            ),
        ),
        RolloutEventKind::GroupAwaitingApproval => (
            false,
            "PartitionAwaitingApproval",
            format!("Group {group} waits for approval. {}", event.message),
        ),
        RolloutEventKind::GroupSoaking => (
            false,
            "PartitionSoaking",
            format!("Group {group} is updated and live; its soak runs."),
        ),
        RolloutEventKind::GroupWaitingForWindow => (
            false,
            "PartitionWaitingForWindow",
            format!(
                "Group {group} waits for maintenance windows. {}",
                event.message
            ),
        ),
        RolloutEventKind::PackageSkipped => (
            false,
            "PackageSkipped",
            format!(
                "{} is left out of the rollout. {}",
                event.namespace.as_deref().unwrap_or_default(),
                event.message
            ),
        ),
        RolloutEventKind::RolloutHalted => (true, "RolloutHalted", event.message.clone()),
        RolloutEventKind::RollbackFinished => (true, "RollbackFinished", event.message.clone()),
        RolloutEventKind::RolloutPaused => (
            false,
            "RolloutPaused",
            "The rollout is paused (spec.paused).".to_owned(),
        ),
        RolloutEventKind::RolloutResumed => {
            (false, "RolloutResumed", "The rollout resumed.".to_owned())
        }
        // A preflight raises its own Event (`PreflightPassed`/`PreflightRefused`) when it ends.
        RolloutEventKind::PackageUpdated
        | RolloutEventKind::PackageAvailable
        | RolloutEventKind::PackagePaused
        | RolloutEventKind::PreflightFinished => return None,
    };
    Some(TransitionEvent {
        warning,
        reason,
        action: "RolloutPackage",
        note: event_note(note),
    })
}

/// The note of a Package failing in a rollout.
pub fn failure_note(namespace: &str, name: &str, group: &str, why: &str) -> String {
    event_note(format!(
        "Package {namespace}/{name} (group {group}) fails: {why}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(type_: &str, status: &str, reason: &str) -> Condition {
        serde_json::from_value(
            serde_json::json!({"type": type_, "status": status, "reason": reason,
            "message": format!("{type_} {reason}"), "lastTransitionTime": "2026-01-01T00:00:00Z"}),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_package_raises_once_per_unpack_transition() {
        let pulling = [condition("Unpacked", "False", "ImagePullBackOff")];
        let unpacked = [condition("Unpacked", "True", "UnpackSuccess")];
        let got = package_transitions(&[], &pulling);
        assert_eq!(
            (got.len(), got[0].reason, got[0].warning),
            (1, "UnpackFailed", true)
        );
        assert!(
            package_transitions(&pulling, &pulling).is_empty(),
            "no repeat"
        );
        let got = package_transitions(&pulling, &unpacked);
        assert_eq!((got[0].reason, got[0].warning), ("Unpacked", false));
        assert!(package_transitions(&unpacked, &unpacked).is_empty());
        let invalid = [
            unpacked[0].clone(),
            condition("Invalid", "True", "LoadError"),
        ];
        assert_eq!(package_transitions(&unpacked, &invalid)[0].action, "Load");
    }

    #[test]
    fn a_deployment_raises_for_a_newer_revision_only() {
        assert_eq!(
            deployment_transitions(None, Some(1))[0].note,
            "Revision 1 created."
        );
        assert_eq!(deployment_transitions(Some(1), Some(2)).len(), 1);
        assert!(deployment_transitions(Some(2), Some(2)).is_empty());
        assert!(deployment_transitions(Some(2), None).is_empty());
    }

    #[test]
    fn a_set_raises_when_it_fails_not_while_it_waits() {
        let probing = [condition(AVAILABLE, "False", "ProbeFailure")];
        let waiting = [condition(AVAILABLE, "False", "InTransition")];
        let available = [condition(AVAILABLE, "True", "Available")];
        assert!(object_set_transitions(&[], &waiting).is_empty());
        assert_eq!(
            object_set_transitions(&available, &probing)[0].reason,
            "PhaseFailed"
        );
        assert!(object_set_transitions(&probing, &probing).is_empty());
    }

    #[test]
    fn notes_are_cut_to_the_event_limit_on_a_char_boundary() {
        let note = event_note("é".repeat(1000));
        assert!(
            note.len() <= EVENT_NOTE_BYTES && note.ends_with('…'),
            "{}",
            note.len()
        );
    }
}

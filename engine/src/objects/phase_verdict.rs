//! The verdict on one run of a phase: from what each of its objects showed to where the phase stands
//! ([`PhaseProgress`]). Pure; the phase runner gathers the findings and does the writes.

use crate::objects::object_set_status::{BlockReason, PhaseProgress};
use crate::objects::probe::ProbeResult;

/// What one object of the phase showed in this run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectFinding {
    /// Applied (or observed) and every probe passed.
    Passed,
    /// Writing it failed.
    Failed(String),
    /// Someone else controls it and the collision protection forbids taking it.
    Collision(String),
    /// A newer revision controls it now.
    HandedOver(String),
    /// Its probes failed. `pending`: only because its status does not speak for the change yet.
    ProbeFailed { message: String, pending: bool },
    /// Someone else's object the phase reads is missing: nothing of ours is on its way to create it.
    Missing(String),
    /// A delegated phase's ObjectSetPhase that has not reported for its generation yet.
    Unreported(String),
}

/// The finding for an object that is in place. `delegated` is `None` for an inline phase's object, and
/// for a delegated phase's ObjectSetPhase the (reason, message) of its `Available` for its generation,
/// `None` inside when it has not reported yet.
pub fn object_finding(
    object: &str,
    probes: ProbeResult,
    delegated: Option<Option<(String, String)>>,
) -> ObjectFinding {
    match delegated {
        Some(None) => ObjectFinding::Unreported(format!(
            "{object}: no Available condition for its generation yet"
        )),
        Some(report) => probed_finding(object, probes, report),
        None => probed_finding(object, probes, None),
    }
}

/// The finding for an object that is in place, from its probe result. `delegated` is the (reason,
/// message) of the `Available` condition of a delegated phase's ObjectSetPhase, for its generation.
pub fn probed_finding(
    object: &str,
    probes: ProbeResult,
    delegated: Option<(String, String)>,
) -> ObjectFinding {
    let (messages, pending) = match probes {
        ProbeResult::Passed => return ObjectFinding::Passed,
        // A delegated phase still waiting (on its objects' status or its connector's first report) is
        // on its way, not failing.
        ProbeResult::Failed(m) => (
            m,
            delegated.as_ref().is_some_and(|(reason, _)| {
                reason == BlockReason::AwaitingStatus.as_str()
                    || reason == BlockReason::PhaseNotReported.as_str()
            }),
        ),
        ProbeResult::Pending(m) => (m, true),
    };
    match delegated {
        // Its objects went to a newer revision: the set says so, as for inline phases.
        Some((reason, message)) if reason == BlockReason::HandedOver.as_str() => {
            ObjectFinding::HandedOver(format!("{object}: {message}"))
        }
        _ => ObjectFinding::ProbeFailed {
            message: format!("{object}: {}", messages.join(", ")),
            pending,
        },
    }
}

/// Where the phase stands: a failed write first, then collisions, objects handed over, failing probes
/// (awaiting status while every failure is only pending), else available.
pub fn phase_progress(findings: &[ObjectFinding]) -> PhaseProgress {
    let mut failures = Vec::new();
    let mut collisions = Vec::new();
    let mut handed_over = Vec::new();
    let mut probe_failures = Vec::new();
    let mut unreported = Vec::new();
    let mut probes_pending = true;
    for finding in findings {
        match finding {
            ObjectFinding::Passed => {}
            ObjectFinding::Failed(m) => failures.push(m.as_str()),
            ObjectFinding::Collision(m) => collisions.push(m.as_str()),
            ObjectFinding::HandedOver(m) => handed_over.push(m.as_str()),
            ObjectFinding::ProbeFailed { message, pending } => {
                probe_failures.push(message.as_str());
                probes_pending &= pending;
            }
            ObjectFinding::Unreported(m) => unreported.push(m.as_str()),
            ObjectFinding::Missing(m) => {
                probe_failures.push(m.as_str());
                probes_pending = false;
            }
        }
    }
    if !failures.is_empty() {
        blocked(BlockReason::PreflightError, &failures)
    } else if !collisions.is_empty() {
        blocked(BlockReason::CollisionDetected, &collisions)
    } else if !handed_over.is_empty() {
        // Part of what this revision rolled out belongs to a newer one: it cannot vouch for the whole.
        blocked(BlockReason::HandedOver, &handed_over)
    } else if !unreported.is_empty() {
        blocked(BlockReason::AwaitingReport, &unreported)
    } else if !probe_failures.is_empty() && probes_pending {
        blocked(BlockReason::AwaitingStatus, &probe_failures)
    } else if !probe_failures.is_empty() {
        blocked(BlockReason::ProbeFailure, &probe_failures)
    } else {
        PhaseProgress::Available
    }
}

/// A phase stopped for `reason`, with every message.
pub fn blocked(reason: BlockReason, messages: &[impl AsRef<str>]) -> PhaseProgress {
    PhaseProgress::Blocked {
        reason,
        message: messages
            .iter()
            .map(AsRef::as_ref)
            .collect::<Vec<_>>()
            .join("; "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe_failed(message: &str, pending: bool) -> ObjectFinding {
        ObjectFinding::ProbeFailed {
            message: message.to_owned(),
            pending,
        }
    }

    #[test]
    fn the_worst_finding_decides_and_every_message_of_its_kind_is_kept() {
        let findings = [
            ObjectFinding::Passed,
            probe_failed("cm/a: not ready", false),
            ObjectFinding::Collision("cm/b: owned by x".into()),
            ObjectFinding::Collision("cm/c: owned by y".into()),
        ];
        assert_eq!(
            phase_progress(&findings),
            PhaseProgress::Blocked {
                reason: BlockReason::CollisionDetected,
                message: "cm/b: owned by x; cm/c: owned by y".into()
            }
        );
        let mut with_failure = findings.to_vec();
        with_failure.push(ObjectFinding::Failed("cm/d: forbidden".into()));
        assert!(matches!(
            phase_progress(&with_failure),
            PhaseProgress::Blocked {
                reason: BlockReason::PreflightError,
                ..
            }
        ));
        assert_eq!(
            phase_progress(&[ObjectFinding::Passed]),
            PhaseProgress::Available
        );
    }

    #[test]
    fn an_unreported_delegated_phase_awaits_its_report() {
        let finding = object_finding("phase/p", ProbeResult::Passed, Some(None));
        assert!(matches!(finding, ObjectFinding::Unreported(_)));
        let findings = [finding];
        assert!(matches!(
            phase_progress(&findings),
            PhaseProgress::Blocked {
                reason: BlockReason::AwaitingReport,
                ..
            }
        ));
    }

    #[test]
    fn probes_await_status_only_while_every_failure_is_pending() {
        let pending = [probe_failed("a", true), probe_failed("b", true)];
        assert!(matches!(
            phase_progress(&pending),
            PhaseProgress::Blocked {
                reason: BlockReason::AwaitingStatus,
                ..
            }
        ));
        for settled in [
            probe_failed("c", false),
            ObjectFinding::Missing("d: object not found".into()),
        ] {
            let mut findings = pending.to_vec();
            findings.push(settled);
            assert!(matches!(
                phase_progress(&findings),
                PhaseProgress::Blocked {
                    reason: BlockReason::ProbeFailure,
                    ..
                }
            ));
        }
    }

    #[test]
    fn a_delegated_phase_waiting_on_its_report_is_pending_and_one_handed_over_says_so() {
        let failed = || ProbeResult::Failed(vec!["Available is False".into()]);
        let waiting = Some(("PhaseNotReported".to_owned(), "no report yet".to_owned()));
        assert_eq!(
            probed_finding("phase/p", failed(), waiting),
            probe_failed("phase/p: Available is False", true)
        );
        let probe = Some(("ProbeFailure".to_owned(), "cm/a: bad".to_owned()));
        assert_eq!(
            probed_finding("phase/p", failed(), probe),
            probe_failed("phase/p: Available is False", false)
        );
        let handed = Some(("HandedOver".to_owned(), "cm/a: taken by rev 3".to_owned()));
        assert_eq!(
            probed_finding("phase/p", failed(), handed),
            ObjectFinding::HandedOver("phase/p: cm/a: taken by rev 3".into())
        );
        assert_eq!(
            probed_finding("cm/a", ProbeResult::Passed, None),
            ObjectFinding::Passed
        );
        assert_eq!(
            probed_finding("cm/a", ProbeResult::Pending(vec!["no status".into()]), None),
            probe_failed("cm/a: no status", true)
        );
    }
}

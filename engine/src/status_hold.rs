//! Holding back a status write that only says "not reported yet". An owner that just changed what it
//! depends on (an ObjectDeployment that created a revision, a Package that applied a new deployment spec)
//! would otherwise write a status from the dependent's old report, and a second one a moment later when
//! the dependent reports; every owner above it mirrors both. The owner waits instead for that first
//! report, never longer than [`HOLD_LIMIT`], then writes whatever it knows. The HostedClusterPackage
//! supervisor holds its progress-only status changes the same way, awaiting a write that stores them along.
//!
//! Pure: the caller keeps the hold and passes the time; nothing here writes or schedules.

use std::time::{Duration, Instant};

/// How long a status write waits at most for the dependent's first report.
pub const HOLD_LIMIT: Duration = Duration::from_secs(1);

/// One owner's hold: the report it waits for and since when.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StatusHold {
    waiting: Option<(String, Instant)>,
}

impl StatusHold {
    /// Whether to hold the status write back at `now`, and if so for how long at most. `awaited` names
    /// the report still missing (the new revision, the deployment generation), `None` when none is.
    /// The first hold for a report starts its clock; once [`HOLD_LIMIT`] has passed for it the write goes
    /// ahead, and that report is not waited for again.
    pub fn hold(&mut self, awaited: Option<&str>, now: Instant) -> Option<Duration> {
        let Some(awaited) = awaited else {
            self.waiting = None;
            return None;
        };
        match &self.waiting {
            Some((waiting, since)) if waiting == awaited => HOLD_LIMIT
                .checked_sub(now.saturating_duration_since(*since))
                .filter(|left| !left.is_zero()),
            _ => {
                self.waiting = Some((awaited.to_owned(), now));
                Some(HOLD_LIMIT)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_waits_for_a_report_at_most_the_limit_and_once() {
        let t0 = Instant::now();
        let mut hold = StatusHold::default();
        assert_eq!(hold.hold(None, t0), None, "nothing awaited: write");
        assert_eq!(hold.hold(Some("rev-2"), t0), Some(HOLD_LIMIT));
        let later = t0 + Duration::from_millis(300);
        assert_eq!(
            hold.hold(Some("rev-2"), later),
            Some(HOLD_LIMIT - Duration::from_millis(300)),
            "the clock runs from the first hold"
        );
        assert_eq!(
            hold.hold(Some("rev-2"), t0 + HOLD_LIMIT),
            None,
            "waited long enough"
        );
        assert_eq!(
            hold.hold(Some("rev-2"), t0 + HOLD_LIMIT * 5),
            None,
            "not waited for again"
        );
        // Another report restarts it; the report arriving clears it.
        let t1 = t0 + HOLD_LIMIT * 6;
        assert_eq!(hold.hold(Some("rev-3"), t1), Some(HOLD_LIMIT));
        assert_eq!(hold.hold(None, t1), None);
        assert_eq!(hold.hold(Some("rev-3"), t1), Some(HOLD_LIMIT));
    }
}

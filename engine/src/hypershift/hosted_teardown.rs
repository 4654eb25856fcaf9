//! When the hosted-cluster teardown of a deleted ObjectSetPhase is given up, so its finalizer cannot hold
//! an HCP namespace forever. Pure.

use std::time::Duration;

/// What the fleet says of the HostedCluster behind an HCP namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostedClusterPresence {
    /// A HostedCluster has this HCP namespace.
    Present,
    /// The HostedCluster API is served and no HostedCluster has it: the hosted cluster is gone, and its
    /// objects with it.
    Gone,
    /// Not known (no HostedCluster API, or its list not read yet).
    Unknown,
}

/// Why a teardown was given up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    HostedClusterGone,
    /// No connector answered for this long.
    ConnectorUnreachable(Duration),
}

impl SkipReason {
    /// The Event and condition reason, and the metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            SkipReason::HostedClusterGone => "HostedClusterGone",
            SkipReason::ConnectorUnreachable(_) => "ConnectorUnreachable",
        }
    }

    /// What the Event and the condition say.
    pub fn message(&self, why: &str) -> String {
        match self {
            SkipReason::HostedClusterGone => format!(
                "Hosted teardown skipped: no HostedCluster has this HCP namespace any more, so its \
                 hosted objects went with it (last attempt: {why})"
            ),
            SkipReason::ConnectorUnreachable(for_how_long) => format!(
                "Hosted teardown skipped: the connector did not answer for {}s, the limit; hosted \
                 objects may be left in the hosted cluster (last attempt: {why})",
                for_how_long.as_secs()
            ),
        }
    }
}

/// What to do after a teardown request no connector answered, unanswered since `unreachable_for`.
pub fn after_unanswered_teardown(
    presence: HostedClusterPresence,
    unreachable_for: Duration,
    limit: Duration,
) -> Option<SkipReason> {
    match presence {
        HostedClusterPresence::Gone => Some(SkipReason::HostedClusterGone),
        _ if unreachable_for >= limit => Some(SkipReason::ConnectorUnreachable(unreachable_for)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_teardown_is_given_up_only_when_the_cluster_is_gone_or_the_limit_passed() {
        let limit = Duration::from_secs(600);
        let short = Duration::from_secs(5);
        assert_eq!(
            after_unanswered_teardown(HostedClusterPresence::Gone, Duration::ZERO, limit),
            Some(SkipReason::HostedClusterGone)
        );
        for presence in [
            HostedClusterPresence::Present,
            HostedClusterPresence::Unknown,
        ] {
            assert_eq!(after_unanswered_teardown(presence, short, limit), None);
            assert_eq!(
                after_unanswered_teardown(presence, limit, limit),
                Some(SkipReason::ConnectorUnreachable(limit))
            );
        }
        let message = SkipReason::ConnectorUnreachable(limit).message("no responders");
        assert!(message.contains("600s"), "{message}");
        assert!(message.ends_with("(last attempt: no responders)"));
    }
}

//! The rollout event stream (version 4; version 2 added the rollout policy's kinds, from
//! `groupAwaitingApproval` on, version 3 `preflightFinished`, version 4 `groupWaitingForWindow` and
//! `packageSkipped`): every step of a HostedClusterPackage rollout is published to the
//! JetStream stream [`STREAM`], so dashboards and other management clusters can follow along.
//!
//! Subjects: `pko.v1.rollout.<hcpkg>.<kind>`, where `<hcpkg>` is the HostedClusterPackage's name with dots
//! replaced by `_` (Kubernetes names have no `_`, so the mapping is reversible) and `<kind>` is the event's
//! kind in snake case. Messages are JSON with `version`; receivers accept their own version and older ones
//! and ignore fields they do not know.

use serde::{Deserialize, Serialize};

/// The JetStream stream holding rollout events.
pub const STREAM: &str = "PKO_ROLLOUTS";
/// Subjects of every rollout event.
pub const SUBJECT_PREFIX: &str = "pko.v1.rollout";
/// The version this build writes.
pub const EVENT_VERSION: u32 = 4;
/// How long the stream keeps an event.
pub const STREAM_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 60 * 60);
/// The most the stream stores; the oldest events go first beyond it.
pub const STREAM_MAX_BYTES: i64 = 1 << 30;
/// The largest event the stream takes.
pub const STREAM_MAX_MESSAGE_BYTES: i32 = 64 * 1024;
/// How long the stream remembers a message id: an event published again within it (a retry whose
/// acknowledgement was lost, a restarted manager telling the story of a rollout under way) is stored once.
pub const STREAM_DUPLICATE_WINDOW: std::time::Duration =
    std::time::Duration::from_secs(24 * 60 * 60);

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RolloutEventKind {
    /// A new template generation started rolling out.
    RolloutStarted,
    /// A partition group started getting updates.
    GroupStarted,
    /// Every Package of a group is updated and live (or paused).
    GroupFinished,
    /// A Package was created or updated to the current template.
    PackageUpdated,
    /// An updated Package's latest revision became live: Available=True and Progressing=False for the
    /// Package's current generation.
    PackageAvailable,
    /// An updated Package fails: it reports why its latest revision cannot become live (the message
    /// says why), or it was live and is not available any more.
    PackageFailed,
    /// A Package was paused.
    PackagePaused,
    /// Outdated Packages wait because maxUnavailable is used up.
    Blocked,
    /// Every Package is updated and live (or paused).
    RolloutFinished,
    /// The promotion gate holds the template back: the message names the management clusters it waits
    /// for and why (pko extension `spec.promotion`).
    PromotionWaiting,
    /// The promotion gate opened for the template: the rollout may start.
    PromotionOpened,
    /// A group that requires approval is next and waits for it (version 2).
    GroupAwaitingApproval,
    /// Every Package of a group is updated and live; its soak (minSuccessTime, health checks) runs
    /// (version 2).
    GroupSoaking,
    /// The rollout policy halted the template: the message says why (version 2).
    RolloutHalted,
    /// Every Package is back on the last template that finished rolling out everywhere (version 2).
    RollbackFinished,
    /// `spec.paused` was set (version 2).
    RolloutPaused,
    /// `spec.paused` was cleared (version 2).
    RolloutResumed,
    /// A preflight of the release finished: the message gives its counts, what was refused first, and
    /// its digest (version 3).
    PreflightFinished,
    /// The group being rolled out waits for its members' maintenance windows: the message says when the
    /// first opens (version 4).
    GroupWaitingForWindow,
    /// A HostedCluster is left out of the rollout (`spec.rolloutPolicy.skip`): the message gives the
    /// reason and until when (version 4).
    PackageSkipped,
}

impl RolloutEventKind {
    /// The last token of the event's subject.
    pub fn token(self) -> &'static str {
        match self {
            Self::RolloutStarted => "rollout_started",
            Self::GroupStarted => "group_started",
            Self::GroupFinished => "group_finished",
            Self::PackageUpdated => "package_updated",
            Self::PackageAvailable => "package_available",
            Self::PackageFailed => "package_failed",
            Self::PackagePaused => "package_paused",
            Self::Blocked => "blocked",
            Self::RolloutFinished => "rollout_finished",
            Self::PromotionWaiting => "promotion_waiting",
            Self::PromotionOpened => "promotion_opened",
            Self::GroupAwaitingApproval => "group_awaiting_approval",
            Self::GroupSoaking => "group_soaking",
            Self::RolloutHalted => "rollout_halted",
            Self::RollbackFinished => "rollback_finished",
            Self::RolloutPaused => "rollout_paused",
            Self::RolloutResumed => "rollout_resumed",
            Self::PreflightFinished => "preflight_finished",
            Self::GroupWaitingForWindow => "group_waiting_for_window",
            Self::PackageSkipped => "package_skipped",
        }
    }
}

/// One step of a rollout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutEvent {
    pub version: u32,
    pub kind: RolloutEventKind,
    /// The HostedClusterPackage's name and UID.
    pub hosted_cluster_package: String,
    pub uid: String,
    /// Its generation: which template the event is about.
    pub generation: i64,
    /// The partition group, when the event is about one (absent for the unknown group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The HCP namespace, when the event is about one Package.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Human-readable detail (for `Blocked`: who holds the budget).
    #[serde(default)]
    pub message: String,
    /// Which management cluster published it.
    #[serde(default)]
    pub source: String,
    /// The OpenTelemetry trace of the step (32 hex digits), when traces are exported: a
    /// `packageUpdated` names the trace of that Package's update, the others the trace of the decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The W3C `traceparent` of the step: sent as the message's `traceparent` header, not in the body.
    #[serde(skip)]
    pub traceparent: Option<String>,
}

impl RolloutEvent {
    /// The `Nats-Msg-Id` of the event: the same step of the same rollout always gets the same id, so
    /// the stream stores it once however often it is published. A `blocked` step names who holds the
    /// budget, a `promotionWaiting` step whom the gate waits for, a `preflightFinished` step what a
    /// preflight found (run again when the targets change), a `groupWaitingForWindow` step which window
    /// opening it waits for, and a `packageSkipped` step until when; all change within one rollout, so
    /// their message is part of their id.
    pub fn message_id(&self) -> String {
        let part = |p: &Option<String>| p.clone().unwrap_or_else(|| "-".to_owned());
        let mut id = format!(
            "{}/{}/{}/{}/{}",
            self.uid,
            self.generation,
            self.kind.token(),
            part(&self.group),
            part(&self.namespace)
        );
        if matches!(
            self.kind,
            RolloutEventKind::Blocked
                | RolloutEventKind::PromotionWaiting
                | RolloutEventKind::PreflightFinished
                | RolloutEventKind::GroupWaitingForWindow
                | RolloutEventKind::PackageSkipped
        ) {
            id.push('/');
            id.push_str(&self.message);
        }
        id
    }

    /// The subject the event is published on.
    pub fn subject(&self) -> String {
        format!(
            "{SUBJECT_PREFIX}.{}.{}",
            self.hosted_cluster_package.replace('.', "_"),
            self.kind.token()
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn event(kind: RolloutEventKind) -> RolloutEvent {
        RolloutEvent {
            version: EVENT_VERSION,
            kind,
            hosted_cluster_package: "metrics.addon".into(),
            uid: "u1".into(),
            generation: 2,
            group: Some("early".into()),
            namespace: Some("clusters-a".into()),
            message: String::new(),
            source: "mc-1".into(),
            trace_id: None,
            traceparent: None,
        }
    }

    #[test]
    fn subjects_are_one_token_per_name_and_kind() {
        let e = event(RolloutEventKind::PackageUpdated);
        assert_eq!(e.subject(), "pko.v1.rollout.metrics_addon.package_updated");
        assert_eq!(
            event(RolloutEventKind::RolloutFinished).subject(),
            "pko.v1.rollout.metrics_addon.rollout_finished"
        );
    }

    #[test]
    fn message_ids_name_the_step_and_nothing_else() {
        let e = event(RolloutEventKind::PackageUpdated);
        assert_eq!(e.message_id(), "u1/2/package_updated/early/clusters-a");
        let told_again = RolloutEvent {
            message: "other words".into(),
            source: "another-replica".into(),
            ..e.clone()
        };
        assert_eq!(told_again.message_id(), e.message_id());
        let next_generation = RolloutEvent {
            generation: 3,
            ..e.clone()
        };
        assert_ne!(next_generation.message_id(), e.message_id());
        let mut started = event(RolloutEventKind::RolloutStarted);
        started.group = None;
        started.namespace = None;
        assert_eq!(started.message_id(), "u1/2/rollout_started/-/-");
        let blocked = |holders: &str| RolloutEvent {
            message: format!("maxUnavailable 1 is used by {holders}"),
            ..event(RolloutEventKind::Blocked)
        };
        assert_ne!(blocked("a").message_id(), blocked("b").message_id());
        assert_eq!(blocked("a").message_id(), blocked("a").message_id());
    }

    #[test]
    fn events_round_trip_and_tolerate_unknown_fields() {
        let e = event(RolloutEventKind::Blocked);
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["kind"], "blocked");
        assert_eq!(json["hostedClusterPackage"], "metrics.addon");
        assert_eq!(serde_json::from_value::<RolloutEvent>(json).unwrap(), e);
        let minimal: RolloutEvent = serde_json::from_str(
            r#"{"version":1,"kind":"rolloutStarted","hostedClusterPackage":"p","uid":"u","generation":1,"later":true}"#,
        )
        .unwrap();
        assert_eq!(minimal.group, None);
        assert_eq!(minimal.kind, RolloutEventKind::RolloutStarted);
    }
}

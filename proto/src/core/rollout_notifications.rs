//! Where a HostedClusterPackage's rollout events are sent as CloudEvents (pko extension): HTTP sinks in
//! its rollout policy, and the CloudEvents attributes every event gets on the way (binary content mode,
//! the data being the rollout event as the JetStream stream holds it).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::rollout_events::RolloutEvent;

/// An HTTP endpoint that receives the rollout's events as CloudEvents 1.0 in binary content mode, each
/// once and in order, retried with backoff while it does not take them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostedClusterPackageNotificationSink {
    /// `https://` (or `http://`) URL events are POSTed to; no credentials in it.
    pub url: String,
    /// A Secret in the manager's namespace labelled `rollout.package-operator.run/sink-credentials:
    /// "true"`, with key `token` (sent as a bearer token) or keys `username` and `password` (basic auth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
    /// The event kinds to send (`rolloutStarted`, `packageFailed`, …); empty sends every kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
}

/// The CloudEvents `type` of every rollout event kind: this prefix and the kind (`…packageUpdated`).
pub const CLOUDEVENT_TYPE_PREFIX: &str = "run.package-operator.rollout.";

/// The CloudEvents spec version sinks receive.
pub const CLOUDEVENT_SPEC_VERSION: &str = "1.0";

/// The CloudEvents attributes of a rollout event (binary content mode puts each in a `ce-` header).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloudEventAttributes {
    /// The event's message id: the same step of the same rollout always has the same id.
    pub id: String,
    /// `/management-clusters/<cluster>/hostedclusterpackages/<name>`.
    pub source: String,
    /// [`CLOUDEVENT_TYPE_PREFIX`] and the kind.
    pub type_: String,
    /// The HCP namespace the event is about, else the partition group, if any.
    pub subject: Option<String>,
}

impl CloudEventAttributes {
    pub fn of(event: &RolloutEvent) -> Self {
        let kind = serde_json::to_value(event.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        Self {
            id: event.message_id(),
            source: format!(
                "/management-clusters/{}/hostedclusterpackages/{}",
                event.source, event.hosted_cluster_package
            ),
            type_: format!("{CLOUDEVENT_TYPE_PREFIX}{kind}"),
            subject: event.namespace.clone().or_else(|| event.group.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::rollout_events::{RolloutEventKind, EVENT_VERSION};

    #[test]
    fn attributes_name_the_step_its_origin_and_its_kind() {
        let event = RolloutEvent {
            version: EVENT_VERSION,
            kind: RolloutEventKind::PackageFailed,
            hosted_cluster_package: "addon".into(),
            uid: "u1".into(),
            generation: 3,
            group: Some("early".into()),
            namespace: Some("clusters-a".into()),
            message: "probe fails".into(),
            source: "mc-1".into(),
            trace_id: None,
            traceparent: None,
        };
        let a = CloudEventAttributes::of(&event);
        assert_eq!(a.id, "u1/3/package_failed/early/clusters-a");
        assert_eq!(
            a.source,
            "/management-clusters/mc-1/hostedclusterpackages/addon"
        );
        assert_eq!(a.type_, "run.package-operator.rollout.packageFailed");
        assert_eq!(a.subject.as_deref(), Some("clusters-a"));
    }
}

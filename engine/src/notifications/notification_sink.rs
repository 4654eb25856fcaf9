//! A notification sink checked and named: its URL (http or https, no credentials in it), the Secret its
//! credentials come from, the event kinds it wants, and the durable consumer of the rollout event stream
//! it reads through. Also what an HTTP answer means for one delivery. Errors name the field.
//!
//! Pure: no I/O. Delivering is `actors::notifications`'.

use std::collections::BTreeSet;

use crate::objects::apply_identity::is_dns1123_subdomain;
use pko_package::canonical_hash::{hex, value_digest};
use pko_proto::core::hosted_cluster_package::HostedClusterPackageRolloutPolicy;
use pko_proto::core::rollout_notifications::HostedClusterPackageNotificationSink;
use pko_proto::rollout_events::{RolloutEventKind, SUBJECT_PREFIX};
use serde_json::json;

/// A checked sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotificationSink {
    pub url: String,
    /// The Secret (in the manager's namespace) its credentials come from.
    pub credentials_secret: Option<String>,
    /// The kinds it wants; empty: every kind.
    pub kinds: BTreeSet<RolloutEventKind>,
}

/// Whose events a sink receives.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SinkScope {
    /// Every HostedClusterPackage's (`--cloudevents-sink`).
    Manager,
    /// One HostedClusterPackage's, by name and UID (a new object of the same name is another scope).
    HostedClusterPackage { name: String, uid: String },
}

impl SinkScope {
    /// The stream subjects the scope's events are on.
    pub fn filter_subject(&self) -> String {
        match self {
            SinkScope::Manager => format!("{SUBJECT_PREFIX}.>"),
            SinkScope::HostedClusterPackage { name, .. } => {
                format!("{SUBJECT_PREFIX}.{}.>", name.replace('.', "_"))
            }
        }
    }

    /// Whether an event of the HostedClusterPackage with `uid` is this scope's. The stream's subjects
    /// name objects by name only, so a new object of an old name finds its predecessor's events there;
    /// they are not its to send.
    pub fn carries(&self, uid: &str) -> bool {
        match self {
            SinkScope::Manager => true,
            SinkScope::HostedClusterPackage { uid: own, .. } => own == uid,
        }
    }

    /// How metrics and logs name a sink of this scope (`index`: its place in the list).
    pub fn label(&self, index: usize) -> String {
        match self {
            SinkScope::Manager => "manager".to_owned(),
            SinkScope::HostedClusterPackage { name, .. } => format!("{name}/{index}"),
        }
    }
}

impl NotificationSink {
    /// Checks one sink; `field` is its path (`spec.rolloutPolicy.notifications[0]`).
    pub fn parse(spec: &HostedClusterPackageNotificationSink, field: &str) -> Result<Self, String> {
        let url = url::Url::parse(&spec.url)
            .map_err(|e| format!("{field}.url: not a URL ({e}), got {:?}", spec.url))?;
        if !matches!(url.scheme(), "https" | "http") || url.host_str().is_none() {
            return Err(format!(
                "{field}.url: want an https:// or http:// URL with a host, got {:?}",
                spec.url
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!(
                "{field}.url: credentials belong in credentialsSecret, not in the URL"
            ));
        }
        if let Some(secret) = &spec.credentials_secret {
            if !is_dns1123_subdomain(secret) {
                return Err(format!(
                    "{field}.credentialsSecret: {secret:?} is not a Secret name (a DNS-1123 subdomain)"
                ));
            }
            // Anyone on the path would read them.
            if url.scheme() != "https" {
                return Err(format!(
                    "{field}.credentialsSecret: credentials are sent only over https://, and the url is {:?}",
                    spec.url
                ));
            }
        }
        let kinds = spec
            .kinds
            .iter()
            .enumerate()
            .map(|(i, k)| {
                serde_json::from_value(json!(k)).map_err(|_| {
                    format!("{field}.kinds[{i}]: {k:?} is not a rollout event kind (rolloutStarted, packageFailed, …)")
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Self {
            url: spec.url.clone(),
            credentials_secret: spec.credentials_secret.clone(),
            kinds,
        })
    }

    /// Whether it wants events of `kind`.
    pub fn wants(&self, kind: RolloutEventKind) -> bool {
        self.kinds.is_empty() || self.kinds.contains(&kind)
    }

    /// The name of the durable consumer this sink of `scope` reads the stream through: the same for
    /// the same scope and URL on every replica and after every restart, so deliveries resume where
    /// they stood and no two replicas deliver the same event.
    pub fn consumer_name(&self, scope: &SinkScope) -> String {
        let scope = match scope {
            SinkScope::Manager => json!("manager"),
            SinkScope::HostedClusterPackage { name, uid } => json!({"name": name, "uid": uid}),
        };
        let digest = value_digest(&json!({"scope": scope, "url": self.url}));
        format!("pko-sink-{}", hex(&digest[..8]))
    }
}

/// Checks `spec.rolloutPolicy.notifications`.
pub fn notification_sinks(
    spec: Option<&HostedClusterPackageRolloutPolicy>,
) -> Result<Vec<NotificationSink>, String> {
    let Some(spec) = spec else {
        return Ok(Vec::new());
    };
    let mut sinks: Vec<NotificationSink> = Vec::new();
    for (i, s) in spec.notifications.iter().enumerate() {
        let field = format!("spec.rolloutPolicy.notifications[{i}]");
        let sink = NotificationSink::parse(s, &field)?;
        if sinks.iter().any(|known| known.url == sink.url) {
            return Err(format!("{field}.url: {:?} is listed twice", sink.url));
        }
        sinks.push(sink);
    }
    Ok(sinks)
}

/// What one HTTP answer means for a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryVerdict {
    /// 2xx: the sink has it.
    Delivered,
    /// Try again after a backoff: the sink is away or busy (5xx, 408, 429), or refuses who we are or
    /// where we knock (401, 403, 404), which its owner fixes without the event changing.
    Retry,
    /// The sink refuses the event itself (any other 4xx, or a redirect, which is not followed):
    /// sending it again cannot help. It is counted as failed and the next event goes.
    Refused,
}

/// What an HTTP status means for a delivery.
pub fn delivery_verdict(status: u16) -> DeliveryVerdict {
    match status {
        200..=299 => DeliveryVerdict::Delivered,
        401 | 403 | 404 | 408 | 429 | 500..=599 => DeliveryVerdict::Retry,
        _ => DeliveryVerdict::Refused,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sink(url: &str, kinds: &[&str]) -> Result<NotificationSink, String> {
        NotificationSink::parse(
            &HostedClusterPackageNotificationSink {
                url: url.into(),
                credentials_secret: None,
                kinds: kinds.iter().map(|k| (*k).to_owned()).collect(),
            },
            "spec.rolloutPolicy.notifications[0]",
        )
    }

    #[test]
    fn a_sink_wants_its_kinds_or_every_kind() {
        let all = sink("https://hooks.example.com/pko", &[]).unwrap();
        assert!(all.wants(RolloutEventKind::PackageUpdated));
        let some = sink(
            "https://hooks.example.com/pko",
            &["rolloutHalted", "packageFailed"],
        )
        .unwrap();
        assert!(some.wants(RolloutEventKind::RolloutHalted));
        assert!(!some.wants(RolloutEventKind::PackageUpdated));
    }

    #[test]
    fn invalid_sinks_name_the_field() {
        let at = "spec.rolloutPolicy.notifications[0]";
        assert_eq!(
            sink("ftp://example.com/x", &[]).unwrap_err(),
            format!("{at}.url: want an https:// or http:// URL with a host, got \"ftp://example.com/x\"")
        );
        assert_eq!(
            sink("https://me:secret@example.com/x", &[]).unwrap_err(),
            format!("{at}.url: credentials belong in credentialsSecret, not in the URL")
        );
        assert!(sink("not a url", &[])
            .unwrap_err()
            .starts_with(&format!("{at}.url: not a URL")));
        assert_eq!(
            sink("https://example.com", &["packageExploded"]).unwrap_err(),
            format!("{at}.kinds[0]: \"packageExploded\" is not a rollout event kind (rolloutStarted, packageFailed, …)")
        );
        let named = |secret: &str| {
            NotificationSink::parse(
                &HostedClusterPackageNotificationSink {
                    url: "https://example.com".into(),
                    credentials_secret: Some(secret.into()),
                    kinds: Vec::new(),
                },
                at,
            )
        };
        assert!(named("acme-hook").is_ok());
        let over_http = NotificationSink::parse(
            &HostedClusterPackageNotificationSink {
                url: "http://hooks.example.com/x".into(),
                credentials_secret: Some("acme-hook".into()),
                kinds: Vec::new(),
            },
            at,
        );
        assert_eq!(
            over_http.unwrap_err(),
            format!("{at}.credentialsSecret: credentials are sent only over https://, and the url is \"http://hooks.example.com/x\"")
        );
        assert_eq!(
            named("../kube-system/x").unwrap_err(),
            format!("{at}.credentialsSecret: \"../kube-system/x\" is not a Secret name (a DNS-1123 subdomain)")
        );
        let twice: HostedClusterPackageRolloutPolicy = serde_json::from_value(json!({
            "notifications": [{"url": "https://a.example/x"}, {"url": "https://a.example/x"}]
        }))
        .unwrap();
        assert_eq!(
            notification_sinks(Some(&twice)).unwrap_err(),
            "spec.rolloutPolicy.notifications[1].url: \"https://a.example/x\" is listed twice"
        );
    }

    #[test]
    fn a_scope_carries_only_its_own_objects_events() {
        let scope = SinkScope::HostedClusterPackage {
            name: "addon".into(),
            uid: "new".into(),
        };
        assert!(scope.carries("new"));
        assert!(!scope.carries("old"), "the predecessor of the same name");
        assert!(SinkScope::Manager.carries("old"));
    }

    #[test]
    fn a_consumer_is_named_by_scope_and_url_alone() {
        let a = sink("https://hooks.example.com/pko", &[]).unwrap();
        let scope = SinkScope::HostedClusterPackage {
            name: "addon".into(),
            uid: "u1".into(),
        };
        let name = a.consumer_name(&scope);
        assert!(name.starts_with("pko-sink-") && name.len() == 25, "{name}");
        let fewer_kinds = sink("https://hooks.example.com/pko", &["rolloutHalted"]).unwrap();
        assert_eq!(fewer_kinds.consumer_name(&scope), name);
        let recreated = SinkScope::HostedClusterPackage {
            name: "addon".into(),
            uid: "u2".into(),
        };
        assert_ne!(a.consumer_name(&recreated), name);
        assert_ne!(a.consumer_name(&SinkScope::Manager), name);
        assert_eq!(scope.filter_subject(), "pko.v1.rollout.addon.>");
    }

    #[test]
    fn answers_decide_whether_to_try_again() {
        assert_eq!(delivery_verdict(202), DeliveryVerdict::Delivered);
        for status in [401, 403, 404, 408, 429, 500, 503] {
            assert_eq!(delivery_verdict(status), DeliveryVerdict::Retry, "{status}");
        }
        for status in [301, 400, 413, 422] {
            assert_eq!(
                delivery_verdict(status),
                DeliveryVerdict::Refused,
                "{status}"
            );
        }
    }
}

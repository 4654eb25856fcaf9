//! What each of pko's NATS identities may publish and subscribe to, apart from the connectors (whose
//! permissions live with their subjects in [`crate::connector_wire`]):
//! - the manager's own user on its management cluster's NATS ([`manager_permissions`]);
//! - a management cluster's leaf-node link into the fleet's hub ([`member_link_permissions`]): the hub
//!   enforces it on everything the link carries, so a management cluster speaks at the hub only for
//!   itself whoever runs its NATS;
//! - a reader of the hub (`kubectl package fleet`, dashboards: [`fleet_viewer_permissions`]).
//!
//! Plain data built from the subject names; nothing here talks to NATS.

use crate::connector_wire::SUBJECT_PREFIX as CONNECTOR_PREFIX;
use crate::fleet::{cluster_key, domain_api_prefix, member_bucket, AGGREGATE_STREAM, STATE_BUCKET};
use crate::nats_credentials::NatsPermissions;
use crate::rollout_events::{STREAM, SUBJECT_PREFIX as EVENT_PREFIX};

/// The inbox prefix of a management cluster's manager in a fleet: the hub sends replies across a link
/// only under that cluster's own prefix, so one cluster never receives another's answers.
pub fn member_inbox_prefix(cluster: &str) -> String {
    format!("_INBOX_{cluster}")
}

/// The subject prefix the hub's aggregate stream receives `cluster`'s rollout events under: only that
/// cluster's link may publish there.
pub fn source_delivery_prefix(cluster: &str) -> String {
    format!("pko.fleet.source.{cluster}")
}

/// What `cluster` may do with its records through the hub's domain API `hub` (`$JS.<hub>.API`: a
/// key-value put from another JetStream domain is published as `<hub>.$KV.<bucket>.<key>`): look up its
/// own bucket and put its announcement and its rollouts there. The hub's shared bucket only sources it.
fn own_record_subjects(hub: &str, cluster: &str) -> Vec<String> {
    let bucket = member_bucket(cluster);
    vec![
        format!("{hub}.STREAM.INFO.KV_{bucket}"),
        format!("{hub}.$KV.{bucket}.{}", cluster_key(cluster)),
        format!("{hub}.$KV.{bucket}.rollout.*.{cluster}"),
    ]
}

/// The JetStream API calls (under `api`, e.g. `$JS.hub.API`) that read stream `stream`: its info, an
/// ordered consumer (created, read, deleted) and direct gets. Nothing that changes or deletes it.
fn stream_reading(api: &str, stream: &str) -> Vec<String> {
    vec![
        format!("{api}.STREAM.INFO.{stream}"),
        format!("{api}.CONSUMER.CREATE.{stream}"),
        format!("{api}.CONSUMER.CREATE.{stream}.>"),
        format!("{api}.CONSUMER.INFO.{stream}.>"),
        format!("{api}.CONSUMER.DELETE.{stream}.>"),
        format!("{api}.CONSUMER.MSG.NEXT.{stream}.>"),
        format!("{api}.DIRECT.GET.{stream}"),
        format!("{api}.DIRECT.GET.{stream}.>"),
        format!("{api}.STREAM.MSG.GET.{stream}"),
        // Flow-control answers of a push consumer on the stream.
        format!("$JS.FC.{stream}.>"),
    ]
}

/// The manager's own user on its management cluster's NATS: requests to its connectors and their
/// reports, its rollout event stream (with the durable consumers its notification sinks read), and, in a fleet whose hub has JetStream domain `hub_domain`, its
/// own records at the hub and reads of everyone's. `fleet` is (this cluster, hub domain).
pub fn manager_permissions(fleet: Option<(&str, &str)>) -> NatsPermissions {
    let connectors = format!("{CONNECTOR_PREFIX}.>");
    let mut publish = vec![
        connectors.clone(),
        format!("{EVENT_PREFIX}.>"),
        "$JS.API.INFO".to_owned(),
        format!("$JS.API.STREAM.CREATE.{STREAM}"),
        format!("$JS.API.STREAM.UPDATE.{STREAM}"),
        format!("$JS.API.STREAM.INFO.{STREAM}"),
        // Whether a finished rollout's story is stored already (the last message of a subject).
        format!("$JS.API.STREAM.MSG.GET.{STREAM}"),
        // The notification sinks' durable consumers of the stream, and their acknowledgements.
        format!("$JS.API.CONSUMER.CREATE.{STREAM}.>"),
        format!("$JS.API.CONSUMER.INFO.{STREAM}.>"),
        format!("$JS.API.CONSUMER.DELETE.{STREAM}.>"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{STREAM}.>"),
        format!("$JS.ACK.{STREAM}.>"),
    ];
    let mut subscribe = vec![connectors];
    match fleet {
        Some((cluster, hub_domain)) => {
            let hub = domain_api_prefix(hub_domain);
            publish.push(format!("{hub}.INFO"));
            publish.extend(stream_reading(&hub, &format!("KV_{STATE_BUCKET}")));
            publish.extend(own_record_subjects(&hub, cluster));
            subscribe.push(format!("{}.>", member_inbox_prefix(cluster)));
        }
        None => subscribe.push("_INBOX.>".to_owned()),
    }
    NatsPermissions {
        publish,
        subscribe,
        allow_responses: false,
    }
}

/// A management cluster's leaf-node link into the hub, as the hub sees it. What the link may send:
/// `cluster`'s own records, reads of the bucket, and its rollout events for the aggregate stream (under
/// [`source_delivery_prefix`]). What the hub sends it: the hub's requests to the cluster's JetStream
/// domain (the aggregate stream sourcing its events) and replies under the cluster's own inbox prefix.
pub fn member_link_permissions(cluster: &str, hub_domain: &str) -> NatsPermissions {
    let hub = domain_api_prefix(hub_domain);
    let mut publish = vec![format!("{hub}.INFO")];
    publish.extend(stream_reading(&hub, &format!("KV_{STATE_BUCKET}")));
    publish.extend(own_record_subjects(&hub, cluster));
    publish.push(format!("{}.>", source_delivery_prefix(cluster)));
    // The answers of the cluster's JetStream to the hub's requests (the source's consumer). A leaf link's
    // answers are not covered by `allow_responses`; another cluster could forge one, which at worst
    // makes the hub re-create this cluster's source consumer: events are delivered only under the
    // cluster's own prefix above.
    publish.push("$JSC.R.>".to_owned());
    NatsPermissions {
        publish,
        subscribe: vec![
            format!("{}.>", domain_api_prefix(cluster)),
            format!("{}.>", member_inbox_prefix(cluster)),
            format!("$JS.FC.{STREAM}.>"),
        ],
        allow_responses: false,
    }
}

/// A reader connected to the hub itself: the records and the aggregate stream, nothing it can change.
pub fn fleet_viewer_permissions() -> NatsPermissions {
    let mut publish = vec!["$JS.API.INFO".to_owned()];
    publish.extend(stream_reading("$JS.API", &format!("KV_{STATE_BUCKET}")));
    publish.extend(stream_reading("$JS.API", AGGREGATE_STREAM));
    NatsPermissions {
        publish,
        subscribe: vec!["_INBOX.>".to_owned()],
        allow_responses: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::rollout_key;

    /// Whether NATS subject `subject` matches pattern `pattern` (`*` one token, `>` the rest).
    fn matches(pattern: &str, subject: &str) -> bool {
        let (mut p, mut s) = (pattern.split('.'), subject.split('.'));
        loop {
            match (p.next(), s.next()) {
                (Some(">"), Some(_)) => return true,
                (Some("*"), Some(_)) => {}
                (Some(a), Some(b)) if a == b => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }

    fn may(allowed: &[String], subject: &str) -> bool {
        allowed.iter().any(|p| matches(p, subject))
    }

    #[test]
    fn a_member_link_writes_only_its_own_records() {
        let link = member_link_permissions("prod-a", "hub");
        let own = format!(
            "$JS.hub.API.$KV.PKO_FLEET_prod-a.{}",
            rollout_key("addon", "prod-a")
        );
        assert!(may(&link.publish, &own));
        assert!(may(
            &link.publish,
            "$JS.hub.API.$KV.PKO_FLEET_prod-a.cluster.prod-a"
        ));
        assert!(may(
            &link.publish,
            "$JS.hub.API.STREAM.INFO.KV_PKO_FLEET_prod-a"
        ));
        for foreign in [
            // Another cluster's keys, in its own bucket or in prod-a's.
            format!(
                "$JS.hub.API.$KV.PKO_FLEET_canary.{}",
                rollout_key("addon", "canary")
            ),
            format!(
                "$JS.hub.API.$KV.PKO_FLEET_prod-a.{}",
                rollout_key("addon", "canary")
            ),
            "$JS.hub.API.$KV.PKO_FLEET_prod-a.cluster.canary".to_owned(),
            // The shared bucket takes no writes, not even of prod-a's own keys.
            format!(
                "$JS.hub.API.$KV.{STATE_BUCKET}.{}",
                rollout_key("addon", "prod-a")
            ),
            "$JS.hub.API.$KV.PKO_FLEET.cluster.prod-a".to_owned(),
            "$KV.PKO_FLEET.cluster.prod-a".to_owned(),
            "$JS.hub.API.STREAM.UPDATE.KV_PKO_FLEET_prod-a".to_owned(),
            "$JS.hub.API.STREAM.PURGE.KV_PKO_FLEET_prod-a".to_owned(),
        ] {
            assert!(!may(&link.publish, &foreign), "{foreign}");
        }
        for forbidden in [
            "$JS.hub.API.STREAM.PURGE.KV_PKO_FLEET",
            "$JS.hub.API.STREAM.DELETE.KV_PKO_FLEET",
            "$JS.hub.API.STREAM.UPDATE.PKO_FLEET_ROLLOUTS",
            "$JS.hub.API.STREAM.MSG.DELETE.KV_PKO_FLEET",
            "pko.fleet.source.canary.x",
            "_INBOX_canary.abc",
        ] {
            assert!(!may(&link.publish, forbidden), "{forbidden}");
        }
        assert!(may(&link.subscribe, "_INBOX_prod-a.abc.1"));
        assert!(!may(&link.subscribe, "_INBOX_canary.abc.1"));
        assert!(!may(
            &link.subscribe,
            "$JS.canary.API.CONSUMER.CREATE.PKO_ROLLOUTS"
        ));
    }

    #[test]
    fn the_manager_reaches_its_connectors_and_only_its_own_records() {
        let manager = manager_permissions(Some(("prod-a", "hub")));
        assert!(may(&manager.publish, "pko.v1.hc.ns-1_uid.phase.apply"));
        assert!(may(&manager.publish, "pko.v1.rollout.addon.x"));
        assert!(may(
            &manager.publish,
            "$JS.hub.API.$KV.PKO_FLEET_prod-a.rollout.addon.prod-a"
        ));
        for foreign in [
            "$JS.hub.API.$KV.PKO_FLEET_prod-a.rollout.addon.canary",
            "$JS.hub.API.$KV.PKO_FLEET.rollout.addon.prod-a",
        ] {
            assert!(!may(&manager.publish, foreign), "{foreign}");
        }
        assert!(!may(&manager.publish, "$JS.API.STREAM.DELETE.PKO_ROLLOUTS"));
        assert!(may(&manager.publish, "$JS.API.STREAM.MSG.GET.PKO_ROLLOUTS"));
        assert!(!may(
            &manager.publish,
            "$JS.API.STREAM.MSG.DELETE.PKO_ROLLOUTS"
        ));
        // Its CloudEvents sinks read the stream through durable consumers, nothing more.
        for sink in [
            "$JS.API.CONSUMER.CREATE.PKO_ROLLOUTS.pko-sink-0123456789abcdef.pko.v1.rollout.>",
            "$JS.API.CONSUMER.MSG.NEXT.PKO_ROLLOUTS.pko-sink-0123456789abcdef",
            "$JS.API.CONSUMER.DELETE.PKO_ROLLOUTS.pko-sink-0123456789abcdef",
            "$JS.ACK.PKO_ROLLOUTS.pko-sink-0123456789abcdef.1.2.3.4.5",
        ] {
            assert!(may(&manager.publish, sink), "{sink}");
        }
        assert!(!may(&manager.publish, "$JS.API.STREAM.PURGE.PKO_ROLLOUTS"));
        assert!(!may(
            &manager.publish,
            "$JS.API.CONSUMER.CREATE.KV_PKO_FLEET.x"
        ));
        assert!(may(&manager.subscribe, "pko.v1.hc.ns-1_uid.hello"));
        assert!(may(&manager.subscribe, "_INBOX_prod-a.x"));
        assert!(!may(&manager.subscribe, "_INBOX.x"));
        let alone = manager_permissions(None);
        assert!(may(&alone.subscribe, "_INBOX.x"));
        assert!(!may(
            &alone.publish,
            "$JS.hub.API.$KV.PKO_FLEET.cluster.management"
        ));
    }

    #[test]
    fn a_viewer_changes_nothing() {
        let viewer = fleet_viewer_permissions();
        assert!(may(&viewer.publish, "$JS.API.STREAM.INFO.KV_PKO_FLEET"));
        assert!(!may(&viewer.publish, "$KV.PKO_FLEET.cluster.canary"));
        assert!(!may(
            &viewer.publish,
            "$JS.API.STREAM.PURGE.PKO_FLEET_ROLLOUTS"
        ));
    }
}

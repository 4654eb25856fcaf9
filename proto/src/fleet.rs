//! The fleet of management clusters (version 1): what every management cluster's manager shares at the
//! hub NATS, and how it is named there.
//!
//! Each management cluster runs its own NATS, a leaf node of the hub with the JetStream domain named after
//! the cluster. Its rollout events stay in its own stream ([`crate::rollout_events::STREAM`]); the hub's
//! stream [`AGGREGATE_STREAM`] sources every cluster's, so the hub reads them all in one place, in each
//! cluster's order. The hub's key-value bucket [`STATE_BUCKET`] holds one [`ManagementClusterRecord`] per
//! cluster and one [`FleetRolloutRecord`] per cluster and HostedClusterPackage: promotion gates and
//! `kubectl package fleet status` read them. Nobody writes it directly: each cluster writes its records
//! to a bucket of its own at the hub ([`member_bucket`], at most [`MEMBER_RECORDS_MAX_BYTES`]), which
//! [`STATE_BUCKET`] sources, so one cluster's writes can neither fill the hub's store for the others nor
//! touch their records. Values are JSON with `version`; readers ignore fields they
//! do not know.

use crate::nats_credentials::{AccountLimits, JetStreamLimits};
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The JetStream domain of the hub when the manager is not told otherwise.
pub const DEFAULT_HUB_DOMAIN: &str = "hub";
/// The hub's stream that sources every management cluster's rollout events.
pub const AGGREGATE_STREAM: &str = "PKO_FLEET_ROLLOUTS";
/// The hub's key-value bucket of cluster and rollout records.
pub const STATE_BUCKET: &str = "PKO_FLEET";
/// The most management clusters one hub takes (its leaf links; a records bucket each).
pub const MAX_MEMBERS: i64 = 1_000;
/// What one management cluster may keep in its own records bucket at the hub: ≈ 2,000 rollout records
/// of the half KiB a record takes, and within the hub account's store for [`MAX_MEMBERS`] clusters.
pub const MEMBER_RECORDS_MAX_BYTES: i64 = 1 << 20;

/// The bucket at the hub that only `cluster` writes its records to (its keys are those of
/// [`STATE_BUCKET`]); bucket names take `-`, and cluster names are checked by [`check_cluster_name`].
pub fn member_bucket(cluster: &str) -> String {
    format!("{STATE_BUCKET}_{cluster}")
}

/// The version of the records this build writes.
pub const RECORD_VERSION: u32 = 1;
/// How long the hub keeps a record nobody writes again: a management cluster gone for good drops out.
pub const RECORD_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 60 * 60);

/// The longest management cluster name: it is a JetStream domain and a key token.
pub const MAX_CLUSTER_NAME: usize = 63;

/// Whether `name` can name a management cluster in the fleet: lowercase letters, digits and `-`, starting
/// and ending with a letter or digit (a JetStream domain and one key token).
pub fn check_cluster_name(name: &str) -> Result<(), String> {
    let valid_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    if name.is_empty() || name.len() > MAX_CLUSTER_NAME {
        return Err(format!(
            "management cluster name {name:?}: 1 to {MAX_CLUSTER_NAME} characters"
        ));
    }
    if !name.chars().all(valid_char) || name.starts_with('-') || name.ends_with('-') {
        return Err(format!(
            "management cluster name {name:?}: lowercase letters, digits and '-', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// The JetStream API prefix of a management cluster's domain: the hub sources its events through it.
pub fn domain_api_prefix(domain: &str) -> String {
    format!("$JS.{domain}.API")
}

/// Where the hub's aggregate stream keeps a management cluster's rollout events: the hub rewrites each
/// sourced subject `pko.v1.rollout.<hcpkg>.<kind>` to `pko.fleet.from.<cluster>.rollout.<hcpkg>.<kind>`
/// as it takes it from that cluster's domain. The cluster is the hub's word, not the event's `source`
/// (which the sending manager writes), so readers attribute events by the subject.
pub const FLEET_EVENTS_PREFIX: &str = "pko.fleet.from";

/// The subject the hub stores `cluster`'s events under, without the HostedClusterPackage and kind tokens.
pub fn fleet_events_subject(cluster: &str) -> String {
    format!("{FLEET_EVENTS_PREFIX}.{cluster}.rollout")
}

/// A filter on the aggregate stream for one HostedClusterPackage's events (its name as in its rollout
/// subjects, dots as `_`) from every cluster, or for every event with `None`.
pub fn fleet_events_filter(hosted_cluster_package: Option<&str>) -> String {
    match hosted_cluster_package {
        Some(name) => format!(
            "{FLEET_EVENTS_PREFIX}.*.rollout.{}.>",
            name.replace('.', "_")
        ),
        None => format!("{FLEET_EVENTS_PREFIX}.*.rollout.>"),
    }
}

/// The management cluster the hub took a stored event from, by its subject in the aggregate stream.
pub fn event_origin(subject: &str) -> Option<&str> {
    let rest = subject
        .strip_prefix(FLEET_EVENTS_PREFIX)?
        .strip_prefix('.')?;
    let (cluster, rest) = rest.split_once('.')?;
    rest.starts_with("rollout.").then_some(cluster)
}

/// The key of a management cluster's record.
pub fn cluster_key(cluster: &str) -> String {
    format!("cluster.{cluster}")
}

/// The key of a management cluster's record of a HostedClusterPackage's rollout. Dots in the name become
/// `_` (Kubernetes names have no `_`), so a rollout's records are `rollout.<name>.*`.
pub fn rollout_key(hosted_cluster_package: &str, cluster: &str) -> String {
    format!("{}.{cluster}", rollout_key_prefix(hosted_cluster_package))
}

/// The keys of every cluster's record of one HostedClusterPackage's rollout, without the last token.
pub fn rollout_key_prefix(hosted_cluster_package: &str) -> String {
    format!("rollout.{}", hosted_cluster_package.replace('.', "_"))
}

/// The largest record the hub's bucket takes.
pub const RECORD_MAX_BYTES: i32 = 64 * 1024;

/// What the fleet account may use at the hub: a leaf link per management cluster, a few direct clients
/// (viewers, the bootstrap), the records bucket sourcing one bucket per cluster and the aggregate stream
/// (at most 1 GiB) with a watch per manager; within the hub's store (deploy/nats/fleet/hub.conf). The
/// store holds every cluster's bucket ([`MAX_MEMBERS`] × [`MEMBER_RECORDS_MAX_BYTES`], reserved), the
/// aggregate stream (reserved) and the records bucket (at most what it sources).
pub const HUB_ACCOUNT_LIMITS: AccountLimits = AccountLimits {
    connections: 64,
    leaf_nodes: MAX_MEMBERS,
    subscriptions: 100_000,
    payload_bytes: 1 << 20,
    jetstream: Some(JetStreamLimits {
        memory_bytes: 64 << 20,
        disk_bytes: 4 << 30,
        streams: MAX_MEMBERS + 2,
        consumers: 10_000,
    }),
};

/// Subscriptions one management cluster's link may hold at the hub (its inboxes, the hub's requests to
/// its domain and the consumers delivering to it).
pub const MEMBER_LINK_SUBSCRIPTIONS: i64 = 1_000;
/// The largest message one management cluster's link may send to the hub (records and events are at
/// most 64 KiB).
pub const MEMBER_LINK_PAYLOAD_BYTES: i64 = 1 << 20;

/// What a key of the bucket names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordKey {
    Cluster(String),
    /// (HostedClusterPackage with `.` as `_`, cluster).
    Rollout(String, String),
}

impl RecordKey {
    /// The key's meaning, if it is one of this schema's.
    pub fn parse(key: &str) -> Option<Self> {
        if let Some(cluster) = key.strip_prefix("cluster.") {
            return check_cluster_name(cluster)
                .ok()
                .map(|()| Self::Cluster(cluster.to_owned()));
        }
        let rest = key.strip_prefix("rollout.")?;
        let (name, cluster) = rest.rsplit_once('.')?;
        (!name.is_empty() && !name.contains('.') && check_cluster_name(cluster).is_ok())
            .then(|| Self::Rollout(name.to_owned(), cluster.to_owned()))
    }
}

/// One record read from the bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetRecord {
    Cluster(ManagementClusterRecord),
    Rollout(FleetRolloutRecord),
}

/// Reads the value under `key`. A record must say what its key says (the cluster, the
/// HostedClusterPackage): a value written under another cluster's key is refused, so no manager speaks
/// for another cluster by mistake.
pub fn parse_record(key: &str, value: &[u8]) -> Result<FleetRecord, String> {
    let kind = RecordKey::parse(key).ok_or_else(|| format!("{key}: not a fleet record key"))?;
    match kind {
        RecordKey::Cluster(cluster) => {
            let record: ManagementClusterRecord =
                serde_json::from_slice(value).map_err(|e| format!("{key}: {e}"))?;
            if record.name != cluster {
                return Err(format!("{key}: the record names cluster {:?}", record.name));
            }
            Ok(FleetRecord::Cluster(record))
        }
        RecordKey::Rollout(name, cluster) => {
            let record: FleetRolloutRecord =
                serde_json::from_slice(value).map_err(|e| format!("{key}: {e}"))?;
            if record.cluster != cluster || record.hosted_cluster_package.replace('.', "_") != name
            {
                return Err(format!(
                    "{key}: the record is of {:?} in cluster {:?}",
                    record.hosted_cluster_package, record.cluster
                ));
            }
            Ok(FleetRecord::Rollout(record))
        }
    }
}

/// What a reader of the bucket holds: every cluster's record by name, every rollout record by
/// (HostedClusterPackage, cluster).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetRecords {
    pub clusters: BTreeMap<String, ManagementClusterRecord>,
    pub rollouts: BTreeMap<(String, String), FleetRolloutRecord>,
}

impl FleetRecords {
    /// Takes the value written under `key` in; a value that does not parse or says another cluster than
    /// its key is refused (and changes nothing). Returns the (HostedClusterPackage, cluster) of a rollout
    /// record.
    pub fn put(&mut self, key: &str, value: &[u8]) -> Result<Option<(String, String)>, String> {
        match parse_record(key, value)? {
            FleetRecord::Cluster(record) => {
                self.clusters.insert(record.name.clone(), record);
                Ok(None)
            }
            FleetRecord::Rollout(record) => {
                let id = (
                    record.hosted_cluster_package.clone(),
                    record.cluster.clone(),
                );
                self.rollouts.insert(id.clone(), record);
                Ok(Some(id))
            }
        }
    }

    /// `key` was deleted or purged; whether it named a record.
    pub fn delete(&mut self, key: &str) -> bool {
        match RecordKey::parse(key) {
            Some(RecordKey::Cluster(cluster)) => self.clusters.remove(&cluster).is_some(),
            Some(RecordKey::Rollout(name, cluster)) => {
                let before = self.rollouts.len();
                self.rollouts
                    .retain(|(h, c), _| !(*c == cluster && h.replace('.', "_") == name));
                before != self.rollouts.len()
            }
            None => false,
        }
    }
}

/// A management cluster in the fleet, written by its manager while it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagementClusterRecord {
    pub version: u32,
    pub name: String,
    /// What promotion gates select management clusters by (`--cluster-labels`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// When the manager last wrote it.
    pub updated_at: Timestamp,
}

/// Where one management cluster's rollout of a HostedClusterPackage stands, written by the manager that
/// runs it whenever it changes and at least every heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetRolloutRecord {
    pub version: u32,
    /// The management cluster.
    pub cluster: String,
    pub hosted_cluster_package: String,
    pub generation: i64,
    /// The hash of the Package template being rolled out: the same release has the same hash in every
    /// management cluster.
    pub template_hash: String,
    /// The partition group being rolled out, when the rollout is partitioned and under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    pub total: i32,
    pub updated: i32,
    pub available: i32,
    pub failed: i32,
    /// Every Package is updated to the template and live (or paused), and the rollout is Available.
    pub settled: bool,
    /// Since when it has been settled on this template without interruption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_since: Option<Timestamp>,
    /// The cluster's own promotion gate, when it has one: open, or what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<String>,
    /// When the manager last published a rollout event of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_event_at: Option<Timestamp>,
    /// Templates (by hash) this cluster's rollout halted on, newest first (at most
    /// [`POISONED_TEMPLATES`]): releases no other cluster of the fleet rolls out. A template leaves the
    /// list once this cluster settles on it after all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub poisoned: Vec<String>,
    /// When the manager last wrote it.
    pub updated_at: Timestamp,
}

/// How many poisoned templates a rollout record keeps.
pub const POISONED_TEMPLATES: usize = 16;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_stored_events_origin_is_its_subjects_cluster_token() {
        let stored = format!("{}.addon_x.package_updated", fleet_events_subject("prod-a"));
        assert_eq!(
            stored,
            "pko.fleet.from.prod-a.rollout.addon_x.package_updated"
        );
        assert_eq!(event_origin(&stored), Some("prod-a"));
        assert_eq!(event_origin("pko.v1.rollout.addon_x.package_updated"), None);
        assert_eq!(event_origin("pko.fleet.from.prod-a.records.x"), None);
        assert_eq!(
            fleet_events_filter(Some("addon.x")),
            "pko.fleet.from.*.rollout.addon_x.>"
        );
        assert_eq!(fleet_events_filter(None), "pko.fleet.from.*.rollout.>");
    }

    #[test]
    fn cluster_names_are_domain_and_key_safe() {
        assert!(check_cluster_name("prod-a").is_ok());
        assert!(check_cluster_name("canary1").is_ok());
        for bad in ["", "Prod", "prod.a", "-a", "a-", "a_b", &"a".repeat(64)] {
            let error = check_cluster_name(bad).unwrap_err();
            assert!(error.contains("management cluster name"), "{error}");
        }
    }

    #[test]
    fn rollout_keys_keep_one_token_per_name() {
        assert_eq!(
            rollout_key("metrics.addon", "prod-a"),
            "rollout.metrics_addon.prod-a"
        );
        assert!(rollout_key("metrics.addon", "prod-a")
            .starts_with(&format!("{}.", rollout_key_prefix("metrics.addon"))));
        assert_eq!(cluster_key("canary"), "cluster.canary");
        assert_eq!(domain_api_prefix("canary"), "$JS.canary.API");
    }

    #[test]
    fn a_record_must_say_what_its_key_says() {
        let cluster = |name: &str| {
            serde_json::to_vec(&ManagementClusterRecord {
                version: RECORD_VERSION,
                name: name.into(),
                labels: BTreeMap::new(),
                updated_at: Timestamp::from_second(1).unwrap(),
            })
            .unwrap()
        };
        assert!(matches!(
            parse_record("cluster.canary", &cluster("canary")),
            Ok(FleetRecord::Cluster(_))
        ));
        let error = parse_record("cluster.canary", &cluster("prod-a")).unwrap_err();
        assert!(error.contains("names cluster \"prod-a\""), "{error}");
        assert!(parse_record("cluster.canary", b"{not json").is_err());
        assert!(parse_record("something.else", &cluster("canary")).is_err());
        assert_eq!(
            RecordKey::parse(&rollout_key("metrics.addon", "prod-a")),
            Some(RecordKey::Rollout("metrics_addon".into(), "prod-a".into()))
        );
        assert_eq!(RecordKey::parse("rollout.x.Bad_Cluster"), None);
        let mut records = FleetRecords::default();
        assert!(records.put("cluster.canary", &cluster("prod-a")).is_err());
        assert!(records.clusters.is_empty());
        records.put("cluster.canary", &cluster("canary")).unwrap();
        assert!(records.delete("cluster.canary"));
        assert!(!records.delete("cluster.canary"));
    }

    #[test]
    fn records_round_trip_and_tolerate_unknown_fields() {
        let record = FleetRolloutRecord {
            version: RECORD_VERSION,
            cluster: "canary".into(),
            hosted_cluster_package: "addon".into(),
            generation: 3,
            template_hash: "bcdf".into(),
            partition: None,
            total: 10,
            updated: 10,
            available: 10,
            failed: 0,
            settled: true,
            settled_since: Some(Timestamp::from_second(1_700_000_000).unwrap()),
            gate: None,
            last_event_at: None,
            poisoned: vec!["0a1b".into()],
            updated_at: Timestamp::from_second(1_700_000_100).unwrap(),
        };
        let mut value = serde_json::to_value(&record).unwrap();
        assert_eq!(value["settledSince"], "2023-11-14T22:13:20Z");
        value["somethingNew"] = serde_json::json!(1);
        let back: FleetRolloutRecord = serde_json::from_value(value).unwrap();
        assert_eq!(back, record);
    }
}

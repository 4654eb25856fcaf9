//! Who wrote what, from an apiserver's audit log (`ApiServer::audit_log_path`): the check sharded
//! managers are held to. Each manager replica names itself in its User-Agent (`pko-manager/<version>
//! (<identity>)`, the shard coordinator `(<identity>; shard-coordinator)`). A tenure of a shard key (a
//! namespace, or one cluster-scoped object) runs between two label writes of the coordinator on the key's
//! objects; within one, at most one replica may write. The coordinator's take-over record for a departed
//! replica (a patch of its member Lease) ends that replica's tenures everywhere: its successors start on
//! its keys from then on. Package specs are left out: a HostedClusterPackage's supervisor writes them from
//! whichever replica owns the HostedClusterPackage.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::error::{io_error, TestEnvError};

/// What the audit found.
#[derive(Debug, Default)]
pub struct WriteAudit {
    /// Successful writes of manager replicas and the coordinator counted.
    pub writes: usize,
    /// Shard keys written by two replicas in one tenure, with the writers.
    pub overlaps: Vec<String>,
}

/// When, by which replica (`None`: the coordinator's label write), and what (verb, subresource).
type AuditedWrite = (String, Option<String>, String);

/// Writes of a key shown before an overlap, to tell how it came about.
const OVERLAP_HISTORY: usize = 8;

/// Reads `audit_log` (JSON lines) and checks every shard key's tenures.
pub fn shard_write_audit(audit_log: &Path) -> Result<WriteAudit, TestEnvError> {
    let text = std::fs::read_to_string(audit_log).map_err(io_error("read", audit_log))?;
    let mut writes: BTreeMap<(String, String), Vec<AuditedWrite>> = BTreeMap::new();
    // When the coordinator recorded a take-over, and of which member Lease.
    let mut takeovers: Vec<(String, String)> = Vec::new();
    let mut audit = WriteAudit::default();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let agent = event["userAgent"].as_str().unwrap_or_default();
        let code = event["responseStatus"]["code"].as_i64().unwrap_or_default();
        if event["stage"] != "ResponseComplete" || !agent.starts_with("pko-manager/") || code >= 300 {
            continue;
        }
        let object = &event["objectRef"];
        let resource = object["resource"].as_str().unwrap_or_default().to_owned();
        let coordinator = agent.contains("shard-coordinator");
        if resource == "leases" {
            if coordinator {
                let lease = object["name"].as_str().unwrap_or_default().to_owned();
                let at = event["stageTimestamp"].as_str().unwrap_or_default().to_owned();
                takeovers.push((at, lease));
            }
            continue;
        }
        if resource == "packages" && object["subresource"].is_null() && !coordinator {
            continue;
        }
        let name = object["name"].as_str().unwrap_or_default().to_owned();
        let key = match object["namespace"].as_str() {
            Some(namespace) if !namespace.is_empty() => (String::new(), namespace.to_owned()),
            _ => (resource, name),
        };
        let at = event["stageTimestamp"].as_str().unwrap_or_default().to_owned();
        let what = format!(
            "{} {}{}",
            event["verb"].as_str().unwrap_or_default(),
            object["name"].as_str().unwrap_or_default(),
            object["subresource"]
                .as_str()
                .map(|s| format!("/{s}"))
                .unwrap_or_default()
        );
        audit.writes += 1;
        writes
            .entry(key)
            .or_default()
            .push((at, (!coordinator).then(|| agent.to_owned()), what));
    }
    takeovers.sort();
    for (key, mut events) in writes {
        events.sort();
        let mut tenure: BTreeSet<String> = BTreeSet::new();
        let mut recorded = takeovers.iter().peekable();
        let mut history: Vec<String> = Vec::new();
        for (at, writer, what) in events {
            while let Some((taken_at, lease)) =
                recorded.next_if(|(recorded_at, _)| *recorded_at <= at)
            {
                if tenure.iter().any(|agent| member_lease(agent) == *lease) {
                    history.push(format!("{taken_at} take-over of {lease}"));
                }
                tenure.retain(|agent| member_lease(agent) != *lease);
            }
            history.push(format!(
                "{at} {} {what}",
                writer.as_deref().unwrap_or("coordinator")
            ));
            match writer {
                None => tenure.clear(),
                Some(writer) => {
                    tenure.insert(writer);
                    if tenure.len() > 1 {
                        let recent = &history[history.len().saturating_sub(OVERLAP_HISTORY)..];
                        audit
                            .overlaps
                            .push(format!("{key:?}: {tenure:?}; {}", recent.join(" | ")));
                        break;
                    }
                }
            }
        }
    }
    Ok(audit)
}

/// The names of the `resource` objects a manager made in `namespace` (successful creates), in the order
/// the audit log has them.
pub fn manager_creates(
    audit_log: &Path,
    resource: &str,
    namespace: &str,
) -> Result<Vec<String>, TestEnvError> {
    let text = std::fs::read_to_string(audit_log).map_err(io_error("read", audit_log))?;
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| {
            let object = &event["objectRef"];
            event["stage"] == "ResponseComplete"
                && event["verb"] == "create"
                && event["responseStatus"]["code"] == 201
                && event["userAgent"]
                    .as_str()
                    .is_some_and(|agent| agent.starts_with("pko-manager/"))
                && object["resource"] == resource
                && object["namespace"] == namespace
        })
        .map(|event| {
            event["objectRef"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect())
}

/// The member Lease of the replica behind a user agent `pko-manager/<version> (<identity>)`.
fn member_lease(agent: &str) -> String {
    let identity = agent
        .split_once('(')
        .map(|(_, rest)| rest.trim_end_matches(')'))
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_default();
    pko_proto::well_known::shard_member_lease(identity)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(at: &str, agent: &str, resource: &str, namespace: &str, name: &str) -> String {
        serde_json::json!({
            "stage": "ResponseComplete",
            "userAgent": agent,
            "responseStatus": {"code": 200},
            "stageTimestamp": at,
            "objectRef": {"resource": resource, "namespace": namespace, "name": name},
        })
        .to_string()
    }

    #[test]
    fn a_recorded_take_over_ends_the_departed_replicas_tenure_and_nothing_else_does() {
        let a = "pko-manager/0.1.0 (host-a-1)";
        let b = "pko-manager/0.1.0 (host-b-2)";
        let coordinator = "pko-manager/0.1.0 (host-b-2; shard-coordinator)";
        let dir = std::env::temp_dir().join(format!("pko-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("audit.log");
        let lines = [
            line("2026-01-01T00:00:01Z", a, "objectsets", "ns-1", "x"),
            line("2026-01-01T00:00:02Z", coordinator, "leases", "leases", "pko-shard-host-a-1"),
            line("2026-01-01T00:00:03Z", b, "objectsets", "ns-1", "x"),
            line("2026-01-01T00:00:01Z", a, "objectsets", "ns-2", "y"),
            line("2026-01-01T00:00:03Z", b, "objectsets", "ns-2", "y"),
        ];
        std::fs::write(&log, lines.join("\n")).unwrap();
        let audit = shard_write_audit(&log).unwrap();
        // ns-1 and ns-2 alike: the record came before b's writes; so both pass.
        assert!(audit.overlaps.is_empty(), "{:?}", audit.overlaps);
        assert_eq!(audit.writes, 4);
        // Without the record, b writing after a is an overlap.
        std::fs::write(&log, [lines[0].clone(), lines[2].clone()].join("\n")).unwrap();
        assert_eq!(shard_write_audit(&log).unwrap().overlaps.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

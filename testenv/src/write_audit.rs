//! Who wrote what, from an apiserver's audit log (`ApiServer::audit_log_path`): the check sharded
//! managers are held to. Each manager replica names itself in its User-Agent (`pko-manager/<version>
//! (<identity>)`, the shard coordinator `(<identity>; shard-coordinator)`). A tenure of a shard key (a
//! namespace, or one cluster-scoped object) runs between two label writes of the coordinator on the key's
//! objects; within one, at most one replica may write. Package specs are left out: a HostedClusterPackage's
//! supervisor writes them from whichever replica owns the HostedClusterPackage.

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

/// When, and by which replica (`None`: the coordinator's label write).
type AuditedWrite = (String, Option<String>);

/// Reads `audit_log` (JSON lines) and checks every shard key's tenures.
pub fn shard_write_audit(audit_log: &Path) -> Result<WriteAudit, TestEnvError> {
    let text = std::fs::read_to_string(audit_log).map_err(io_error("read", audit_log))?;
    let mut writes: BTreeMap<(String, String), Vec<AuditedWrite>> = BTreeMap::new();
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
        if resource == "packages" && object["subresource"].is_null() && !coordinator {
            continue;
        }
        let name = object["name"].as_str().unwrap_or_default().to_owned();
        let key = match object["namespace"].as_str() {
            Some(namespace) if !namespace.is_empty() => (String::new(), namespace.to_owned()),
            _ => (resource, name),
        };
        let at = event["stageTimestamp"].as_str().unwrap_or_default().to_owned();
        audit.writes += 1;
        writes
            .entry(key)
            .or_default()
            .push((at, (!coordinator).then(|| agent.to_owned())));
    }
    for (key, mut events) in writes {
        events.sort();
        let mut tenure: BTreeSet<String> = BTreeSet::new();
        for (_, writer) in events {
            match writer {
                None => tenure.clear(),
                Some(writer) => {
                    tenure.insert(writer);
                    if tenure.len() > 1 {
                        audit.overlaps.push(format!("{key:?}: {tenure:?}"));
                        break;
                    }
                }
            }
        }
    }
    Ok(audit)
}

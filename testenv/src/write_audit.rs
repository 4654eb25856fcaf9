//! Who wrote what, from an apiserver's audit log (`ApiServer::audit_log_path`): the check sharded
//! managers are held to. Each manager replica names itself in its User-Agent (`pko-manager/<version>
//! (<identity>)`, the shard coordinator `(<identity>; shard-coordinator)`). A tenure of a shard key (a
//! namespace, or one cluster-scoped object) runs between two label writes of the coordinator on the key's
//! objects; within one, at most one replica may write. The coordinator's take-over record for a departed
//! replica (a patch of its member Lease) ends that replica's tenures everywhere: its successors start on
//! its keys from then on. Package specs are left out: a HostedClusterPackage's supervisor writes them from
//! whichever replica owns the HostedClusterPackage.
//!
//! The log does not say in which order etcd stored two writes, only when each request came in and when
//! its answer was done; a write is stored between the two. A holder's release can be answered after the
//! coordinator's label write that it made possible, so ordering by either time alone accuses the holder
//! (the chaos run did). So a write is placed in a tenure only when every label write of its key was
//! surely before it or surely after it; a write whose request overlaps a label write's cannot be placed,
//! and is counted, not judged.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::error::{io_error, TestEnvError};
use pko_proto::well_known::{holder_member, shard_member_lease};

/// What the audit found.
#[derive(Debug, Default)]
pub struct WriteAudit {
    /// Successful writes of manager replicas and the coordinator counted.
    pub writes: usize,
    /// Replica writes whose request overlapped a label write of their key: which tenure they fell in is
    /// not known from the log, so they are not judged.
    pub unplaced: usize,
    /// Shard keys written by two replicas in one tenure, with the writers.
    pub overlaps: Vec<String>,
}

/// When the apiserver received a request and when it was done with it (RFC 3339, microseconds): the
/// write was stored in between.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Span {
    received: String,
    done: String,
}

impl Span {
    /// Surely stored before `other` was.
    fn before(&self, other: &Span) -> bool {
        self.done < other.received
    }
}

/// One successful write of a key: when, by which replica (`None`: the coordinator's label write), and
/// what (verb, name, subresource).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct AuditedWrite {
    at: Span,
    writer: Option<String>,
    what: String,
}

/// Writes of a key shown before an overlap, to tell how it came about.
const OVERLAP_HISTORY: usize = 8;

/// Reads `audit_log` (JSON lines) and checks every shard key's tenures.
pub fn shard_write_audit(audit_log: &Path) -> Result<WriteAudit, TestEnvError> {
    let text = std::fs::read_to_string(audit_log).map_err(io_error("read", audit_log))?;
    let mut writes: BTreeMap<(String, String), Vec<AuditedWrite>> = BTreeMap::new();
    // When the coordinator recorded a take-over, and of which member Lease.
    let mut takeovers: Vec<(Span, String)> = Vec::new();
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
        let at = Span {
            received: event["requestReceivedTimestamp"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            done: event["stageTimestamp"].as_str().unwrap_or_default().to_owned(),
        };
        if resource == "leases" {
            if coordinator {
                let lease = object["name"].as_str().unwrap_or_default().to_owned();
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
        writes.entry(key).or_default().push(AuditedWrite {
            at,
            writer: (!coordinator).then(|| agent.to_owned()),
            what,
        });
    }
    takeovers.sort();
    for (key, mut events) in writes {
        events.sort();
        let labels: Vec<&Span> = events
            .iter()
            .filter(|w| w.writer.is_none())
            .map(|w| &w.at)
            .collect();
        // Each placeable replica write under the number of label writes surely before it: its tenure.
        let mut tenures: BTreeMap<usize, Vec<&AuditedWrite>> = BTreeMap::new();
        for write in events.iter().filter(|w| w.writer.is_some()) {
            let surely_before = labels.iter().filter(|l| l.before(&write.at)).count();
            let maybe_before = labels.iter().filter(|l| !write.at.before(l)).count();
            if surely_before == maybe_before {
                tenures.entry(surely_before).or_default().push(write);
            } else {
                audit.unplaced += 1;
            }
        }
        if let Some(overlap) = tenures
            .values()
            .find_map(|tenure| overlap_in(tenure, &takeovers))
        {
            let shown: Vec<String> = events
                .iter()
                .filter(|w| w.at.received <= overlap.last.received)
                .map(|w| {
                    format!(
                        "{}..{} {} {}",
                        w.at.received,
                        w.at.done,
                        w.writer.as_deref().unwrap_or("coordinator"),
                        w.what
                    )
                })
                .collect();
            let recent = &shown[shown.len().saturating_sub(OVERLAP_HISTORY)..];
            audit.overlaps.push(format!(
                "{key:?}: {:?}; {}",
                overlap.writers,
                recent.join(" | ")
            ));
        }
    }
    Ok(audit)
}

/// Two replicas writing within one tenure: who, and the write that made them two.
struct Overlap<'a> {
    writers: BTreeSet<&'a str>,
    last: &'a Span,
}

/// The first write of `tenure` (one tenure's writes, in order) by a second replica, unless a take-over
/// record that may have come before it ended the first replica's tenure.
fn overlap_in<'a>(
    tenure: &[&'a AuditedWrite],
    takeovers: &[(Span, String)],
) -> Option<Overlap<'a>> {
    let mut writers: BTreeSet<&str> = BTreeSet::new();
    let mut recorded = takeovers.iter().peekable();
    for write in tenure {
        let writer = member_of(write.writer.as_deref()?);
        while let Some((_, lease)) = recorded.next_if(|(at, _)| !write.at.before(at)) {
            writers.retain(|member| shard_member_lease(member) != *lease);
        }
        writers.insert(writer);
        if writers.len() > 1 {
            return Some(Overlap {
                writers,
                last: &write.at,
            });
        }
    }
    None
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

/// The shard member behind a user agent `pko-manager/<version> (<identity>[; <role>])`: the identity, or
/// for a member name that outlives the process (`<member>/<process>`) the member. A member's processes
/// follow each other on its Lease (a process takes it only once its predecessor released it or it ran
/// out), which [`member_processes`] lets a test check.
fn member_of(agent: &str) -> &str {
    let identity = agent
        .split_once('(')
        .map(|(_, rest)| rest.trim_end_matches(')'))
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_default();
    holder_member(identity)
}

/// The processes of shard member `member` that wrote through the apiserver, each with when its first
/// request came in and its last was done, in the order they started.
pub fn member_processes(
    audit_log: &Path,
    member: &str,
) -> Result<Vec<(String, String, String)>, TestEnvError> {
    let text = std::fs::read_to_string(audit_log).map_err(io_error("read", audit_log))?;
    let mut processes: BTreeMap<String, (String, String)> = BTreeMap::new();
    for event in text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["stage"] == "ResponseComplete")
    {
        let agent = event["userAgent"].as_str().unwrap_or_default();
        if !agent.starts_with("pko-manager/") || member_of(agent) != member {
            continue;
        }
        let received = event["requestReceivedTimestamp"].as_str().unwrap_or_default();
        let done = event["stageTimestamp"].as_str().unwrap_or_default();
        let span = processes
            .entry(agent.to_owned())
            .or_insert_with(|| (received.to_owned(), done.to_owned()));
        span.0 = span.0.clone().min(received.to_owned());
        span.1 = span.1.clone().max(done.to_owned());
    }
    let mut ordered: Vec<(String, String, String)> = processes
        .into_iter()
        .map(|(agent, (first, last))| (agent, first, last))
        .collect();
    ordered.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(ordered)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A successful write received at `received` and answered at `done` (seconds of one minute).
    fn line(at: (f64, f64), agent: &str, resource: &str, namespace: &str, name: &str) -> String {
        let time = |s: f64| format!("2026-01-01T00:00:{s:09.6}Z");
        serde_json::json!({
            "stage": "ResponseComplete",
            "userAgent": agent,
            "responseStatus": {"code": 200},
            "requestReceivedTimestamp": time(at.0),
            "stageTimestamp": time(at.1),
            "objectRef": {"resource": resource, "namespace": namespace, "name": name},
        })
        .to_string()
    }

    const A: &str = "pko-manager/0.1.0 (host-a-1)";
    const B: &str = "pko-manager/0.1.0 (host-b-2)";
    const COORDINATOR: &str = "pko-manager/0.1.0 (host-b-2; shard-coordinator)";

    fn audit_of(name: &str, lines: &[String]) -> WriteAudit {
        let dir = std::env::temp_dir().join(format!("pko-audit-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("audit.log");
        std::fs::write(&log, lines.join("\n")).unwrap();
        let audit = shard_write_audit(&log).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        audit
    }

    #[test]
    fn a_recorded_take_over_ends_the_departed_replicas_tenure_and_nothing_else_does() {
        let lines = [
            line((1.0, 1.01), A, "objectsets", "ns-1", "x"),
            line((2.0, 2.01), COORDINATOR, "leases", "leases", "pko-shard-host-a-1"),
            line((3.0, 3.01), B, "objectsets", "ns-1", "x"),
            line((1.0, 1.01), A, "objectsets", "ns-2", "y"),
            line((3.0, 3.01), B, "objectsets", "ns-2", "y"),
        ];
        let audit = audit_of("takeover", &lines);
        // ns-1 and ns-2 alike: the record came before b's writes; so both pass.
        assert!(audit.overlaps.is_empty(), "{:?}", audit.overlaps);
        assert_eq!(audit.writes, 4);
        // Without the record, b writing after a is an overlap.
        let audit = audit_of("no-takeover", &[lines[0].clone(), lines[2].clone()]);
        assert_eq!(audit.overlaps.len(), 1, "{:?}", audit.overlaps);
    }

    /// The chaos run's case: the holder's release was answered 7 ms after the coordinator's label write
    /// for the newcomer, which the release made possible (so was stored after it).
    #[test]
    fn a_release_answered_after_the_label_write_it_allowed_is_not_an_overlap() {
        let key = ("hostedclusterpackages", "", "chaos");
        let write = |at, agent| line(at, agent, key.0, key.1, key.2);
        let drain = write((0.018, 0.020), COORDINATOR);
        let release = write((0.040, 0.059), A);
        let label_for_b = write((0.048, 0.052), COORDINATOR);
        let status_of_b = write((1.210, 1.222), B);
        let audit = audit_of(
            "release",
            &[drain.clone(), release, label_for_b, status_of_b.clone()],
        );
        assert!(audit.overlaps.is_empty(), "{:?}", audit.overlaps);
        assert_eq!(audit.unplaced, 1);
        // The holder still writing well after the label write for the newcomer is one.
        let late = write((0.100, 0.110), A);
        let audit = audit_of(
            "late-holder",
            &[drain, write((0.048, 0.052), COORDINATOR), late, status_of_b],
        );
        assert_eq!(audit.overlaps.len(), 1, "{:?}", audit.overlaps);
        assert_eq!(audit.unplaced, 0);
    }

    /// Two processes of one member name (a restart) are one member: the restarted process writing its
    /// keys is no overlap, another member is, and each process's span is told apart.
    #[test]
    fn the_processes_of_one_member_name_are_one_member_and_follow_each_other() {
        let first = "pko-manager/0.1.0 (pko-0/0a1b2c-7)";
        let restarted = "pko-manager/0.1.0 (pko-0/3d4e5f-9)";
        let lines = [
            line((1.0, 1.01), first, "objectsets", "ns-1", "x"),
            line((4.0, 4.01), restarted, "objectsets", "ns-1", "x"),
        ];
        assert!(audit_of("restart", &lines).overlaps.is_empty());
        let other = audit_of("other", &[lines[0].clone(), line((4.0, 4.01), A, "objectsets", "ns-1", "x")]);
        assert_eq!(other.overlaps.len(), 1, "{:?}", other.overlaps);
        let dir = std::env::temp_dir().join(format!("pko-audit-{}-processes", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("audit.log");
        std::fs::write(&log, lines.join("\n")).unwrap();
        let processes = member_processes(&log, "pko-0").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let agents: Vec<&str> = processes.iter().map(|(agent, _, _)| agent.as_str()).collect();
        assert_eq!(agents, [first, restarted]);
        assert!(processes[0].2 < processes[1].1, "{processes:?}");
    }
}

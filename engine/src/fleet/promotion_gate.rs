//! Promotion gates: whether a HostedClusterPackage may start rolling out its template in this management
//! cluster, from what the fleet's hub reports of the other management clusters, and the record of its own
//! rollout it reports back. A gate opens once every management cluster it names or selects has settled on
//! the same template (by hash) and stayed settled for the soak time; it never opens on what it cannot
//! read. Once open for a template it stays open for it (kept in `status.promotion`): a rollout under way
//! does not stop because the hub went away. Pure: the actors bring the hub's records.
//!
//! Ages and soaks are this manager's own: how long ago it saw a record written, and how long it has seen
//! it settled ([`RecordSighting`]), never the times the writer put in the record, which come from another
//! machine's clock (and from a writer that could say anything).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use pko_proto::core::hosted_cluster_package::{
    HostedClusterPackagePromotion, HostedClusterPackagePromotionStatus, HostedClusterPackageSpec,
};
use pko_proto::fleet::{
    FleetRolloutRecord, ManagementClusterRecord, POISONED_TEMPLATES, RECORD_VERSION,
};

use crate::conditions::ConditionUpdate;
use crate::label_selector::selector_matches;
use crate::rollout::rollout_guard::HaltCause;
use crate::rollout::rollout_plan::Counts;
use crate::sighting::Sighting;
use pko_package::canonical_hash::CanonicalHasher;

/// The condition a gated HostedClusterPackage reports.
pub const PROMOTION_GATE: &str = "PromotionGateOpen";
/// The halt reason of a release another management cluster halted on.
pub const POISONED_RELEASE: &str = "PoisonedRelease";
/// A record older than this says nothing about now: its manager is gone or cut off from the hub.
pub const RECORD_STALE_AFTER: Duration = Duration::from_secs(90);
/// How often a manager writes its records again when nothing changed (well within
/// [`RECORD_STALE_AFTER`]).
pub const RECORD_HEARTBEAT: Duration = Duration::from_secs(30);

/// The hash of a HostedClusterPackage's Package template: equal for equal templates in every management
/// cluster, whatever the field order.
pub fn package_template_hash(spec: &HostedClusterPackageSpec) -> String {
    let value = serde_json::to_value(&spec.template).unwrap_or_default();
    let mut hasher = CanonicalHasher::default();
    hasher.write_value(&value);
    format!("{:016x}", hasher.finish())
}

/// How this manager stands with the hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HubState {
    /// The hub answered its last probe; the records are current as of its watch.
    Reachable,
    /// Not reached since `since` (or never, when the manager started then).
    Unreachable { since: Timestamp, error: String },
}

/// What the hub holds that a gate reads.
#[derive(Debug, Clone, PartialEq)]
pub struct HubView {
    pub state: HubState,
    /// Every management cluster's own record, by name.
    pub clusters: BTreeMap<String, ManagementClusterRecord>,
    /// The rollout records of the HostedClusterPackage in question, by management cluster.
    pub rollouts: BTreeMap<String, ObservedRollout>,
}

/// Another management cluster's rollout record as this manager saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct ObservedRollout {
    pub record: FleetRolloutRecord,
    /// Since this manager last saw the record written (heartbeats included).
    pub age: Duration,
    /// Since this manager first saw it settled as it is (same template, same settledSince), while it is.
    pub settled_for: Option<Duration>,
}

/// What this manager saw of one rollout record at the hub: each write (told apart by the bucket's
/// revision) and the settled state it says (template and settledSince, compared as written).
#[derive(Debug, Clone)]
pub struct RecordSighting {
    written: Sighting<u64>,
    settled: Option<Sighting<(String, String)>>,
}

fn settled_state(record: &FleetRolloutRecord) -> Option<(String, String)> {
    record.settled.then(|| {
        (
            record.template_hash.clone(),
            record
                .settled_since
                .map(|t| t.to_string())
                .unwrap_or_default(),
        )
    })
}

impl RecordSighting {
    /// The first sight of `record`, written at bucket revision `revision`, at `now_ms`.
    pub fn new(record: &FleetRolloutRecord, revision: u64, now_ms: u64) -> Self {
        Self {
            written: Sighting::new(revision, now_ms),
            settled: settled_state(record).map(|s| Sighting::new(s, now_ms)),
        }
    }

    /// Notes `record` seen at `revision` at `now_ms`. A revision seen before (a watch started again
    /// delivers the last one) is no new write.
    pub fn observe(&mut self, record: &FleetRolloutRecord, revision: u64, now_ms: u64) {
        self.written.observe(revision, now_ms);
        self.settled = match (self.settled.take(), settled_state(record)) {
            (Some(mut seen), Some(state)) => {
                seen.observe(state, now_ms);
                Some(seen)
            }
            (None, Some(state)) => Some(Sighting::new(state, now_ms)),
            (_, None) => None,
        };
    }

    /// `record` with its age and settled time at `now_ms`.
    pub fn observed(&self, record: FleetRolloutRecord, now_ms: u64) -> ObservedRollout {
        ObservedRollout {
            record,
            age: Duration::from_millis(self.written.age_ms(now_ms)),
            settled_for: self
                .settled
                .as_ref()
                .map(|s| Duration::from_millis(s.age_ms(now_ms))),
        }
    }
}

/// What the gate lets the rollout do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateVerdict {
    /// No promotion gate in the spec.
    Ungated,
    /// Open for the template: the rollout may go on; `opened` is set when it opened just now.
    Open {
        opened: Option<HostedClusterPackagePromotionStatus>,
    },
    /// Closed: no Package is created or updated to the template.
    Closed(ClosedGate),
}

/// Why a gate is closed, for the condition and the rollout event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosedGate {
    pub reason: &'static str,
    /// The management clusters waited for, and why each, without times (stable while nothing changes).
    pub waiting_for: String,
    /// The whole message, with times.
    pub message: String,
    /// When the answer changes by itself (a soak ends) if nothing else does.
    pub recheck_after: Option<Duration>,
}

impl GateVerdict {
    /// The condition for the gate; none when ungated.
    pub fn condition(&self) -> Option<ConditionUpdate> {
        match self {
            Self::Ungated => None,
            Self::Open { .. } => Some(ConditionUpdate::new(
                PROMOTION_GATE,
                true,
                "Promoted",
                "Every management cluster the gate waits for settled on this template and soaked."
                    .to_owned(),
            )),
            Self::Closed(closed) => Some(ConditionUpdate::new(
                PROMOTION_GATE,
                false,
                closed.reason,
                closed.message.clone(),
            )),
        }
    }

    pub fn is_closed(&self) -> bool {
        matches!(self, Self::Closed(_))
    }
}

fn closed(reason: &'static str, waiting_for: String, message: String) -> GateVerdict {
    GateVerdict::Closed(ClosedGate {
        reason,
        waiting_for,
        message,
        recheck_after: None,
    })
}

/// The gate of a HostedClusterPackage with `promotion` whose template hashes to `template_hash`, in
/// management cluster `me`, at `now`. `opened` is the status' record of the template the gate opened for;
/// `hub` is `None` when this manager is not in a fleet.
pub fn promotion_gate(
    promotion: Option<&HostedClusterPackagePromotion>,
    template_hash: &str,
    opened: Option<&HostedClusterPackagePromotionStatus>,
    me: &str,
    hub: Option<&HubView>,
    now: Timestamp,
) -> GateVerdict {
    let Some(promotion) = promotion else {
        return GateVerdict::Ungated;
    };
    if opened.is_some_and(|o| o.template_hash == template_hash) {
        return GateVerdict::Open { opened: None };
    }
    let Some(hub) = hub else {
        return closed(
            "NotInFleet",
            String::new(),
            "spec.promotion needs the manager in a fleet (--fleet-hub-domain): the gate stays closed"
                .to_owned(),
        );
    };
    if let HubState::Unreachable { since, error } = &hub.state {
        return closed(
            "HubUnreachable",
            String::new(),
            format!("The fleet's hub is unreachable since {since} ({error}): the gate stays closed until it answers."),
        );
    }
    let required = match required_clusters(promotion, me, &hub.clusters) {
        Ok(required) => required,
        Err(problem) => {
            return closed(
                "InvalidSelector",
                String::new(),
                format!("spec.promotion.managementClusterSelector: {problem}"),
            )
        }
    };
    if required.is_empty() {
        return closed(
            "NoClusterSelected",
            String::new(),
            "spec.promotion names or selects no other management cluster of the fleet: the gate stays closed."
                .to_owned(),
        );
    }
    let soak = Duration::from_secs(u64::try_from(promotion.soak_seconds).unwrap_or(0));
    let mut waits = Vec::new();
    let mut reasons = Vec::new();
    let mut recheck: Option<Duration> = None;
    for cluster in &required {
        let Some(wait) = cluster_wait(cluster, hub.rollouts.get(*cluster), template_hash, soak)
        else {
            continue;
        };
        reasons.push(format!("{cluster} ({})", wait.why));
        waits.push(format!("{cluster}: {}", wait.detail));
        if let Some(left) = wait.soak_left {
            recheck = Some(recheck.map_or(left, |r| r.min(left)));
        }
    }
    if waits.is_empty() {
        return GateVerdict::Open {
            opened: Some(HostedClusterPackagePromotionStatus {
                template_hash: template_hash.to_owned(),
                opened_at: now.to_string(),
            }),
        };
    }
    GateVerdict::Closed(ClosedGate {
        reason: "WaitingForClusters",
        waiting_for: reasons.join(", "),
        message: format!("Waiting for {}.", waits.join("; ")),
        recheck_after: recheck,
    })
}

/// The clusters a gate waits for: named ones (whether or not they announced themselves: a named cluster
/// that never reports keeps the gate closed) and those whose announced labels the selector matches, never
/// this one.
fn required_clusters<'a>(
    promotion: &'a HostedClusterPackagePromotion,
    me: &str,
    clusters: &'a BTreeMap<String, ManagementClusterRecord>,
) -> Result<BTreeSet<&'a str>, String> {
    let mut required: BTreeSet<&str> = promotion
        .management_clusters
        .iter()
        .map(String::as_str)
        .collect();
    if let Some(selector) = &promotion.management_cluster_selector {
        for (name, record) in clusters {
            if selector_matches(selector, &record.labels).map_err(|e| e.to_string())? {
                required.insert(name);
            }
        }
    }
    required.remove(me);
    Ok(required)
}

/// Why the gate waits for one cluster.
struct ClusterWait {
    /// Short, without times.
    why: &'static str,
    detail: String,
    soak_left: Option<Duration>,
}

fn cluster_wait(
    cluster: &str,
    observed: Option<&ObservedRollout>,
    template_hash: &str,
    soak: Duration,
) -> Option<ClusterWait> {
    let wait = |why, detail| {
        Some(ClusterWait {
            why,
            detail,
            soak_left: None,
        })
    };
    let Some(observed) = observed else {
        return wait(
            "no report",
            format!("no report of this rollout from {cluster}"),
        );
    };
    let record = &observed.record;
    if observed.age > RECORD_STALE_AFTER {
        return wait(
            "stale report",
            format!("its last report was seen {}s ago", observed.age.as_secs()),
        );
    }
    if record.template_hash != template_hash {
        return wait(
            "another template",
            format!(
                "it rolls out template {} (generation {}), not {template_hash}",
                record.template_hash, record.generation
            ),
        );
    }
    let soaked = match (record.settled, observed.settled_for) {
        (true, Some(soaked)) => soaked,
        _ => {
            return wait(
                "not settled",
                format!(
                    "not settled: {}/{} updated, {} available, {} failed",
                    record.updated, record.total, record.available, record.failed
                ),
            )
        }
    };
    if soaked < soak {
        let left = soak - soaked;
        return Some(ClusterWait {
            why: "soaking",
            detail: format!(
                "settled for {}s as seen here, soaking {}s more",
                soaked.as_secs(),
                left.as_secs().max(1)
            ),
            soak_left: Some(left),
        });
    }
    None
}

/// What a manager reports of its own rollout of a HostedClusterPackage, for the gates of the others and
/// the fleet status.
pub struct OwnRollout<'a> {
    pub cluster: &'a str,
    pub name: &'a str,
    pub generation: i64,
    pub template_hash: &'a str,
    /// The partition group being rolled out, if partitioned and under way.
    pub partition: Option<String>,
    pub counts: &'a Counts,
    /// The rollout's Available condition holds.
    pub available: bool,
    /// Its own gate, when it has one.
    pub gate: &'a GateVerdict,
    pub last_event_at: Option<Timestamp>,
    /// The template the rollout is halted on (`status.halted`), if halted.
    pub halted: Option<&'a str>,
}

/// The record of `own`, continuing `previous` (this manager's last record of it): `settledSince` is kept
/// while the rollout stays settled on the same template, set to `now` when it settles, and cleared when it
/// is not settled.
pub fn rollout_record(
    own: &OwnRollout<'_>,
    previous: Option<&FleetRolloutRecord>,
    now: Timestamp,
) -> FleetRolloutRecord {
    let c = own.counts;
    // A rollout over no HostedCluster has proved nothing: it never counts as settled.
    let settled = !own.gate.is_closed()
        && own.available
        && c.total > 0
        && c.failed == 0
        && c.updated == c.total
        && c.progressed + c.paused >= c.total;
    let settled_since = settled.then(|| {
        previous
            .filter(|p| p.template_hash == own.template_hash && p.settled)
            .and_then(|p| p.settled_since)
            .unwrap_or(now)
    });
    // Poisoned: halted here once and not settled here since, newest first.
    let mut poisoned: Vec<String> = own.halted.map(str::to_owned).into_iter().collect();
    for hash in previous.map(|p| p.poisoned.as_slice()).unwrap_or_default() {
        let settled_here = settled && hash == own.template_hash;
        if !settled_here && !poisoned.contains(hash) {
            poisoned.push(hash.clone());
        }
    }
    poisoned.truncate(POISONED_TEMPLATES);
    let n = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
    FleetRolloutRecord {
        version: RECORD_VERSION,
        cluster: own.cluster.to_owned(),
        hosted_cluster_package: own.name.to_owned(),
        generation: own.generation,
        template_hash: own.template_hash.to_owned(),
        partition: own.partition.clone(),
        total: n(c.total),
        updated: n(c.updated),
        available: n(c.available),
        failed: n(c.failed),
        settled,
        settled_since,
        gate: match own.gate {
            GateVerdict::Ungated => None,
            GateVerdict::Open { .. } => Some("open".to_owned()),
            GateVerdict::Closed(closed) => Some(format!("waiting: {}", closed.message)),
        },
        last_event_at: own.last_event_at,
        poisoned,
        updated_at: now,
    }
}

/// Why the release `template_hash` may not roll out here: another management cluster's rollout of the
/// same HostedClusterPackage halted on it (whatever its record's age: a poisoned release stays poisoned).
pub fn poisoned_release(hub: &HubView, template_hash: &str, me: &str) -> Option<HaltCause> {
    let (cluster, _) = hub.rollouts.iter().find(|(cluster, observed)| {
        *cluster != me && observed.record.poisoned.iter().any(|h| h == template_hash)
    })?;
    Some(HaltCause {
        reason: POISONED_RELEASE,
        message: format!(
            "Template {template_hash} halted in management cluster {cluster}: no other cluster rolls it out."
        ),
    })
}

/// Whether `next` says something `previous` did not, besides the time it was written: a record that
/// changed is written at once, an unchanged one at the next heartbeat.
pub fn record_changed(previous: &FleetRolloutRecord, next: &FleetRolloutRecord) -> bool {
    let strip = |r: &FleetRolloutRecord| FleetRolloutRecord {
        updated_at: Timestamp::UNIX_EPOCH,
        last_event_at: None,
        ..r.clone()
    };
    strip(previous) != strip(next)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use proptest::prelude::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    fn promotion(clusters: &[&str], soak: i64) -> HostedClusterPackagePromotion {
        HostedClusterPackagePromotion {
            management_clusters: clusters.iter().map(|c| c.to_string()).collect(),
            management_cluster_selector: None,
            soak_seconds: soak,
        }
    }

    fn record(
        cluster: &str,
        hash: &str,
        settled_since: Option<i64>,
        written: i64,
    ) -> FleetRolloutRecord {
        FleetRolloutRecord {
            version: RECORD_VERSION,
            cluster: cluster.into(),
            hosted_cluster_package: "addon".into(),
            generation: 1,
            template_hash: hash.into(),
            partition: None,
            total: 3,
            updated: 3,
            available: 3,
            failed: 0,
            settled: settled_since.is_some(),
            settled_since: settled_since.map(at),
            gate: None,
            last_event_at: None,
            poisoned: Vec::new(),
            updated_at: at(written),
        }
    }

    /// The hub as an observer sees it at `now` (seconds) that saw each record when it was written and
    /// settled when it says: the records' times are the test's script, never read by the gate.
    fn hub(records: Vec<FleetRolloutRecord>, now: i64) -> HubView {
        let ago = |t: Timestamp| {
            Duration::from_secs(u64::try_from(now - t.as_second() + 1_800_000_000).unwrap_or(0))
        };
        HubView {
            state: HubState::Reachable,
            clusters: BTreeMap::new(),
            rollouts: records
                .into_iter()
                .map(|r| {
                    let observed = ObservedRollout {
                        age: ago(r.updated_at),
                        settled_for: r.settled_since.filter(|_| r.settled).map(ago),
                        record: r,
                    };
                    (observed.record.cluster.clone(), observed)
                })
                .collect(),
        }
    }

    fn reason(verdict: &GateVerdict) -> &'static str {
        match verdict {
            GateVerdict::Closed(c) => c.reason,
            GateVerdict::Open { .. } => "open",
            GateVerdict::Ungated => "ungated",
        }
    }

    #[test]
    fn the_gate_opens_only_after_the_soak_on_the_same_template() {
        let p = promotion(&["canary"], 600);
        let view = hub(vec![record("canary", "h1", Some(0), 100)], 120);
        let early = promotion_gate(Some(&p), "h1", None, "prod-a", Some(&view), at(120));
        let GateVerdict::Closed(c) = &early else {
            panic!("{early:?}")
        };
        assert_eq!(c.reason, "WaitingForClusters");
        assert_eq!(c.recheck_after, Some(Duration::from_secs(480)));
        assert!(
            c.message.contains("canary: settled for 120s as seen here"),
            "{}",
            c.message
        );
        let view = hub(vec![record("canary", "h1", Some(0), 590)], 600);
        let open = promotion_gate(Some(&p), "h1", None, "prod-a", Some(&view), at(600));
        let GateVerdict::Open {
            opened: Some(opened),
        } = open
        else {
            panic!("{open:?}")
        };
        assert_eq!(opened.template_hash, "h1");
        // Another template in the canary keeps it closed.
        let other = promotion_gate(Some(&p), "h2", None, "prod-a", Some(&view), at(600));
        assert_eq!(reason(&other), "WaitingForClusters");
    }

    #[test]
    fn nothing_read_never_opens_the_gate() {
        let p = promotion(&["canary"], 0);
        assert_eq!(
            reason(&promotion_gate(Some(&p), "h", None, "a", None, at(0))),
            "NotInFleet"
        );
        let mut view = hub(vec![record("canary", "h", Some(0), 0)], 10);
        view.state = HubState::Unreachable {
            since: at(5),
            error: "timed out".into(),
        };
        assert_eq!(
            reason(&promotion_gate(
                Some(&p),
                "h",
                None,
                "a",
                Some(&view),
                at(10)
            )),
            "HubUnreachable"
        );
        // No report, and a stale one.
        let empty = hub(vec![], 10);
        assert_eq!(
            reason(&promotion_gate(
                Some(&p),
                "h",
                None,
                "a",
                Some(&empty),
                at(10)
            )),
            "WaitingForClusters"
        );
        let stale = hub(vec![record("canary", "h", Some(0), 0)], 1000);
        let verdict = promotion_gate(Some(&p), "h", None, "a", Some(&stale), at(1000));
        let GateVerdict::Closed(c) = verdict else {
            panic!()
        };
        assert!(c.waiting_for.contains("stale report"), "{}", c.waiting_for);
        // Only itself selected.
        let me = promotion(&["a"], 0);
        assert_eq!(
            reason(&promotion_gate(
                Some(&me),
                "h",
                None,
                "a",
                Some(&empty),
                at(0)
            )),
            "NoClusterSelected"
        );
    }

    #[test]
    fn an_opened_gate_stays_open_for_its_template() {
        let p = promotion(&["canary"], 0);
        let opened = HostedClusterPackagePromotionStatus {
            template_hash: "h".into(),
            opened_at: at(0).to_string(),
        };
        let verdict = promotion_gate(Some(&p), "h", Some(&opened), "a", None, at(10));
        assert_eq!(verdict, GateVerdict::Open { opened: None });
        let next = promotion_gate(Some(&p), "h2", Some(&opened), "a", None, at(10));
        assert!(next.is_closed());
        assert_eq!(
            promotion_gate(None, "h", None, "a", None, at(0)),
            GateVerdict::Ungated
        );
    }

    #[test]
    fn a_selector_picks_clusters_by_their_announced_labels() {
        let mut p = promotion(&[], 0);
        p.management_cluster_selector = Some(LabelSelector {
            match_labels: Some([("env".to_owned(), "canary".to_owned())].into()),
            ..Default::default()
        });
        let mut view = hub(vec![record("c1", "h", Some(0), 5)], 10);
        for (name, env) in [("c1", "canary"), ("c2", "canary"), ("p1", "prod")] {
            view.clusters.insert(
                name.into(),
                ManagementClusterRecord {
                    version: RECORD_VERSION,
                    name: name.into(),
                    labels: [("env".to_owned(), env.to_owned())].into(),
                    updated_at: at(0),
                },
            );
        }
        let verdict = promotion_gate(Some(&p), "h", None, "p1", Some(&view), at(10));
        let GateVerdict::Closed(c) = verdict else {
            panic!()
        };
        assert_eq!(c.waiting_for, "c2 (no report)");
    }

    fn counts(total: usize, updated: usize, progressed: usize, failed: usize) -> Counts {
        Counts {
            total,
            updated,
            available: progressed,
            progressed,
            failed,
            ..Default::default()
        }
    }

    /// Canary's own rollout of `hash` with `counts`, halted on `halted` if given.
    fn own<'a>(hash: &'a str, counts: &'a Counts, halted: Option<&'a str>) -> OwnRollout<'a> {
        OwnRollout {
            cluster: "canary",
            name: "addon",
            generation: 1,
            template_hash: hash,
            partition: None,
            counts,
            available: true,
            gate: &GateVerdict::Ungated,
            last_event_at: None,
            halted,
        }
    }

    #[test]
    fn a_record_keeps_its_settled_time_while_settled_on_the_template() {
        let settled = counts(3, 3, 3, 0);
        let first = rollout_record(&own("h", &settled, None), None, at(10));
        assert_eq!(first.settled_since, Some(at(10)));
        let again = rollout_record(&own("h", &settled, None), Some(&first), at(50));
        assert_eq!(again.settled_since, Some(at(10)));
        assert!(!record_changed(&first, &again));
        let moving = counts(3, 2, 2, 0);
        let broke = rollout_record(&own("h", &moving, None), Some(&again), at(60));
        assert_eq!(broke.settled_since, None);
        assert!(record_changed(&again, &broke));
        let new_template = rollout_record(&own("h2", &settled, None), Some(&again), at(70));
        assert_eq!(new_template.settled_since, Some(at(70)));
    }

    #[test]
    fn a_rollout_over_no_hosted_cluster_never_settles() {
        let record = rollout_record(&own("h", &counts(0, 0, 0, 0), None), None, at(10));
        assert!(!record.settled);
        assert_eq!(record.settled_since, None);
    }

    #[test]
    fn a_template_halted_here_stays_poisoned_until_it_settles_here() {
        let failing = counts(3, 3, 0, 3);
        let settled = counts(3, 3, 3, 0);
        let halted = rollout_record(&own("h1", &failing, Some("h1")), None, at(10));
        assert_eq!(halted.poisoned, ["h1"]);
        assert!(record_changed(
            &rollout_record(&own("h1", &failing, None), None, at(10)),
            &halted
        ));
        // Moved on to h2 (the halt cleared with the new template): h1 stays poisoned.
        let moved = rollout_record(&own("h2", &settled, None), Some(&halted), at(20));
        assert_eq!(moved.poisoned, ["h1"]);
        // h2 halts too: newest first.
        let both = rollout_record(&own("h2", &failing, Some("h2")), Some(&moved), at(30));
        assert_eq!(both.poisoned, ["h2", "h1"]);
        // h1 rolled out again after an undo and settled here: no longer poisoned.
        let cleared = rollout_record(&own("h1", &settled, None), Some(&both), at(40));
        assert_eq!(cleared.poisoned, ["h2"]);
        // Bounded.
        let mut record = cleared;
        for i in 0..40 {
            let hash = format!("x{i}");
            record = rollout_record(
                &own(&hash, &failing, Some(&hash)),
                Some(&record),
                at(50 + i),
            );
        }
        assert_eq!(record.poisoned.len(), POISONED_TEMPLATES);
        assert_eq!(record.poisoned[0], "x39");
    }

    #[test]
    fn ages_and_soaks_are_the_observers_own() {
        // The writer's clock is an hour ahead of everyone's, and another record says it settled a day
        // ago: neither time counts here, only when this manager saw the writes.
        let mut written = record("canary", "h", Some(-86_400), 3_600);
        let mut seen = RecordSighting::new(&written, 7, 1_000);
        let observed = seen.observed(written.clone(), 61_000);
        assert_eq!(observed.age, Duration::from_secs(60));
        assert_eq!(observed.settled_for, Some(Duration::from_secs(60)));
        // A watch started again delivers revision 7 again: no new write, nothing restarts.
        seen.observe(&written, 7, 95_000);
        let observed = seen.observed(written.clone(), 95_000);
        assert_eq!(observed.age, Duration::from_secs(94));
        assert!(observed.age > RECORD_STALE_AFTER);
        // A heartbeat (new revision, same settled state) freshens it and keeps the soak going.
        written.updated_at = at(3_700);
        seen.observe(&written, 8, 100_000);
        let observed = seen.observed(written.clone(), 100_000);
        assert_eq!(observed.age, Duration::ZERO);
        assert_eq!(observed.settled_for, Some(Duration::from_secs(99)));
        // Settled again since another time (it was unsettled in between): the soak starts over.
        written.settled_since = Some(at(3_650));
        seen.observe(&written, 9, 101_000);
        assert_eq!(
            seen.observed(written.clone(), 102_000).settled_for,
            Some(Duration::from_secs(1))
        );
        // Not settled: no soak at all.
        written.settled = false;
        written.settled_since = None;
        seen.observe(&written, 10, 103_000);
        assert_eq!(seen.observed(written, 104_000).settled_for, None);
    }

    proptest! {
        /// Whatever the records say, the gate opens only when every required cluster reported the same
        /// template, fresh, settled for at least the soak.
        #[test]
        fn the_gate_opens_only_on_fresh_settled_soaked_reports(
            soak in 0i64..1000,
            reports in proptest::collection::vec(
                (0usize..3, proptest::bool::ANY, proptest::option::of(0i64..2000), 0i64..2000),
                0..4,
            ),
            now in 0i64..2500,
        ) {
            let names = ["c0", "c1", "c2"];
            let p = promotion(&["c0", "c1"], soak);
            let records: Vec<FleetRolloutRecord> = reports
                .iter()
                .map(|(i, same, since, written)| {
                    record(names[*i], if *same { "h" } else { "x" }, *since, *written)
                })
                .collect();
            let view = hub(records, now);
            let verdict = promotion_gate(Some(&p), "h", None, "me", Some(&view), at(now));
            let ok = |name: &str| view.rollouts.get(name).is_some_and(|o| {
                o.record.template_hash == "h"
                    && o.age <= RECORD_STALE_AFTER
                    && o.settled_for.is_some_and(|s| s.as_secs() >= soak as u64)
            });
            let should_open = ok("c0") && ok("c1");
            prop_assert_eq!(matches!(verdict, GateVerdict::Open { .. }), should_open, "{:?}", verdict);
        }
    }
}

//! Shard membership (docs in `engine::sharding::shard_assignment`): this replica's own Lease, held and renewed by a
//! [`LeaseHolder`] like the leader Lease (so a replica that cannot renew closes its write fence and exits
//! before the Lease runs out), and the [`ShardView`] read from every member Lease in the namespace: the
//! live members, the departed ones, and the take-over records the coordinator wrote onto departed
//! members' Leases. It owns no assignment: which replica works on what is the engine's rule over the view.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client};
use pko_proto::well_known::{holder_member, shard_member_lease};
use tokio::sync::watch;
use tracing::{error, warn};

use crate::engine::sharding::lease_expiry::{LeaseRecord, LeaseSightings};
use crate::engine::sharding::shard_assignment::{Member, MemberLease, ShardView};
use crate::runtime::leader_lease::{
    lease_duration_ms, lease_record, LeaseConfig, LeaseError, LeaseHolder,
};
use crate::runtime::lease_metrics::LeaseMetrics;
use crate::runtime::observer_clock::ObserverClock;
use crate::runtime::write_fence::WriteFence;
use pko_proto::well_known::{
    SHARD_MEMBER_LABEL, SHARD_RESTARTING_ANNOTATION, SHARD_SUCCESSORS_ANNOTATION,
};

/// The longest the view goes without being recomputed; it is recomputed sooner when a Lease runs out
/// (Leases expire by time, not by event).
const EXPIRY_CHECK: Duration = Duration::from_secs(5);

/// This replica's membership; the member set follows every member's Lease.
pub struct ShardMembership {
    holder: LeaseHolder,
    view: watch::Receiver<ShardView>,
    follower: tokio::task::JoinHandle<()>,
}

/// Who a sharded replica is: the member name its objects are labelled with, and the holder identity its
/// Lease names (one process's, so a process that still runs can never renew a Lease its successor
/// under the same name took).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberIdentity {
    pub member: Member,
    pub holder: String,
}

/// A member name given to the manager is not usable as a label value and Lease name.
#[derive(Debug, thiserror::Error)]
#[error("member name {name:?}: at most {MAX_MEMBER_NAME} characters of lowercase letters, digits and '-', starting and ending with a letter or digit (a pod name fits)")]
pub struct MemberNameError {
    pub name: String,
}

/// The longest member name: a label value holds 63 characters, and the Lease adds `pko-shard-`.
const MAX_MEMBER_NAME: usize = 53;

impl MemberIdentity {
    /// A member of one process: the host (the pod), a nonce of this process's start and the pid. A
    /// restarted container is a new member and never comes back to keys its successors took over.
    pub fn per_process(host: &str, pid: u32) -> Self {
        let member = identity_of(host, pid, start_nonce());
        Self {
            holder: member.clone(),
            member,
        }
    }

    /// A member name that outlives the process (a StatefulSet's pod name): a restart keeps the share.
    /// The holder is `<name>/<nonce>-<pid>`.
    pub fn named(name: &str, pid: u32) -> Result<Self, MemberNameError> {
        let valid = !name.is_empty()
            && name.len() <= MAX_MEMBER_NAME
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if !valid {
            return Err(MemberNameError {
                name: name.to_owned(),
            });
        }
        Ok(Self {
            member: name.to_owned(),
            holder: format!("{name}/{:06x}-{pid}", start_nonce()),
        })
    }

    /// An unsharded manager's identity (the host and the pid): it names the process in the audit log
    /// and holds no member Lease.
    pub fn unsharded(host: &str, pid: u32) -> Self {
        let identity = format!("{host}-{pid}");
        Self {
            member: identity.clone(),
            holder: identity,
        }
    }

    /// Whether stopping keeps the Lease for the restarted process (a member name that outlives it).
    pub fn keeps_share(&self) -> bool {
        self.member != self.holder
    }
}

/// 24 bits of this process's start time (in microseconds): two incarnations of one pod a few
/// milliseconds apart still differ.
fn start_nonce() -> u128 {
    nonce_of(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    )
}

fn nonce_of(started_nanos: u128) -> u128 {
    (started_nanos / 1_000) & 0xff_ffff
}

fn identity_of(host: &str, pid: u32, nonce: u128) -> Member {
    let host: String = host
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    let host = host.trim_matches('-');
    let host = if host.is_empty() { "pko-manager" } else { host };
    format!("{host}-{nonce:06x}-{pid}")
}

impl ShardMembership {
    /// Takes this replica's member Lease in `namespace` (`kube` for the Lease thread's own client) and
    /// starts following the members through `client`. Returns once the Lease is held.
    pub async fn join(
        kube: kube::Config,
        client: Client,
        namespace: &str,
        identity: &MemberIdentity,
        duration: Duration,
        fence: WriteFence,
        metrics: LeaseMetrics,
    ) -> Result<Self, LeaseError> {
        let mut config = LeaseConfig::new(
            namespace,
            &shard_member_lease(&identity.member),
            &identity.holder,
            duration,
        );
        config.metrics = metrics;
        config
            .labels
            .insert(SHARD_MEMBER_LABEL.to_owned(), identity.member.clone());
        // Once a coordinator recorded this member's take-over, every replica counts it departed and its
        // successors work on its keys: it stops at its next renewal, and a restarted process under the
        // same name waits until the record is retired with the Lease.
        config.ended_by = Some(SHARD_SUCCESSORS_ANNOTATION.to_owned());
        if identity.keeps_share() {
            config.released_mark = Some(SHARD_RESTARTING_ANNOTATION.to_owned());
        }
        let holder = LeaseHolder::acquire(kube, config, fence.clone()).await?;
        let (sender, view) = watch::channel(ShardView::default());
        let follower = tokio::spawn(follow_members(
            Api::namespaced(client, namespace),
            sender,
            Ended {
                member: identity.member.clone(),
                fence,
            },
        ));
        Ok(Self {
            holder,
            view,
            follower,
        })
    }

    /// The members, updated as Leases come, go, run out and carry take-over records.
    pub fn view(&self) -> watch::Receiver<ShardView> {
        self.view.clone()
    }

    /// Gives the member Lease up (on shutdown), so the others take this replica's share without waiting
    /// for it to run out; a member whose name outlives the process marks the Lease instead, and the others
    /// wait for its restart as long as the Lease lasts.
    pub async fn leave(self) {
        self.follower.abort();
        self.holder.release().await;
    }
}

/// The member a Lease belongs to (its member label), and what it says about the holder.
fn member_record(lease: &Lease) -> Option<(Member, LeaseRecord)> {
    let member = lease
        .metadata
        .labels
        .as_ref()?
        .get(SHARD_MEMBER_LABEL)?
        .clone();
    Some((member, lease_record(lease.spec.as_ref()?)))
}

/// A member Lease as the view reads it, its renewal timed by when this process saw it (`sightings`).
fn member_lease(lease: &Lease, sightings: &LeaseSightings<Member>) -> Option<MemberLease> {
    let (member, record) = member_record(lease)?;
    let seen = sightings.get(&member)?;
    let annotations = lease.metadata.annotations.as_ref();
    let successors = annotations
        .and_then(|a| a.get(SHARD_SUCCESSORS_ANNOTATION))
        .map(|list| parse_successors(list));
    // Released for a restart under the same name: still the member's, timed from when the release was
    // seen, until the restarted process takes it back or it runs out.
    let restarting = record.holder.is_empty()
        && annotations.is_some_and(|a| a.contains_key(SHARD_RESTARTING_ANNOTATION));
    let holder = if restarting {
        member.clone()
    } else {
        holder_member(&record.holder).to_owned()
    };
    Some(MemberLease {
        member,
        holder,
        renewal_seen_ms: i64::try_from(seen.changed_at_ms()).unwrap_or(i64::MAX),
        duration_ms: i64::try_from(lease_duration_ms(lease.spec.as_ref()?)).unwrap_or(i64::MAX),
        successors,
        version: lease.metadata.resource_version.clone().unwrap_or_default(),
    })
}

/// The members of a successors annotation.
pub fn parse_successors(list: &str) -> BTreeSet<Member> {
    list.split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
        .collect()
}

/// This member's own end: a take-over recorded on its Lease. Its successors work on its keys from the
/// moment their watches show the record, so its writes stop when its own watch does; the Lease thread
/// then gives the Lease up at its next renewal and the process exits.
struct Ended {
    member: Member,
    fence: WriteFence,
}

impl Ended {
    fn check(&self, view: &ShardView) {
        if let Some(successors) = view.takeovers.get(&self.member) {
            if self.fence.seal() {
                error!(member = %self.member, ?successors, "a take-over of this replica was recorded; it stops writing");
            }
        }
    }
}

/// Keeps `view` equal to what the member Leases say (a reflector keeps the Leases, re-lists included). A
/// Lease's renewals are timed by this process's monotonic clock from when the watch delivered them.
async fn follow_members(api: Api<Lease>, view: watch::Sender<ShardView>, ended: Ended) {
    let config = watcher::Config::default().labels(SHARD_MEMBER_LABEL);
    let (leases, writer) = reflector::store();
    let mut events = reflector(writer, watcher::watcher(api, config))
        .default_backoff()
        .boxed();
    let clock = ObserverClock::start();
    let mut sightings = LeaseSightings::default();
    let mut next_expiry = EXPIRY_CHECK;
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(_)) => {}
                Some(Err(error)) => warn!(%error, "watching member Leases"),
                None => return,
            },
            _ = tokio::time::sleep(next_expiry) => {}
        }
        let now_ms = clock.now_ms();
        let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
        let state = leases.state();
        sightings.observe_all(state.iter().filter_map(|l| member_record(l)), now_ms);
        let known: Vec<MemberLease> = state
            .iter()
            .filter_map(|l| member_lease(l, &sightings))
            .collect();
        let seen = ShardView::of(&known, now);
        ended.check(&seen);
        // Wake just after the first live Lease would run out unrenewed.
        next_expiry = known
            .iter()
            .map(|l| l.renewal_seen_ms.saturating_add(l.duration_ms))
            .filter(|expiry| *expiry > now)
            .min()
            .and_then(|expiry| u64::try_from(expiry - now + 1).ok())
            .map_or(EXPIRY_CHECK, |ms| {
                Duration::from_millis(ms).min(EXPIRY_CHECK)
            });
        view.send_if_modified(|current| {
            let changed = *current != seen;
            if changed {
                *current = seen;
            }
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_names_are_unique_per_process_and_valid_label_values() {
        let a = identity_of("pko-manager-7d9f8c6b5d-x2abc", 1, nonce_of(1_000_000_000));
        let b = identity_of("pko-manager-7d9f8c6b5d-x2abc", 1, nonce_of(1_000_005_000));
        assert_ne!(a, b, "a restarted container is a new member");
        assert!(a.ends_with("-1"), "{a}");
        let long = identity_of(
            &format!("{}_", "h".repeat(80)),
            4_194_304,
            nonce_of(u128::MAX),
        );
        assert!(long.len() <= 63, "{long}");
        assert!(long.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        assert!(long.starts_with('h') && long.ends_with('4'), "{long}");
        assert!(identity_of("--", 7, 0).starts_with("pko-manager-"));
    }

    #[test]
    fn a_given_member_name_outlives_the_process_and_each_process_holds_it_as_itself() {
        let first = MemberIdentity::named("pko-manager-0", 7).unwrap();
        let second = MemberIdentity::named("pko-manager-0", 8).unwrap();
        assert_eq!(first.member, "pko-manager-0");
        assert_eq!(first.member, second.member);
        assert_ne!(
            first.holder, second.holder,
            "each process holds it as itself"
        );
        assert!(first.holder.starts_with("pko-manager-0/") && first.holder.ends_with("-7"));
        assert_eq!(holder_member(&first.holder), "pko-manager-0");
        assert!(first.keeps_share());
        assert!(!MemberIdentity::per_process("pod", 7).keeps_share());
        for bad in ["", "Pko-0", "-a", "a-", "a/b", "a_b", &"a".repeat(54)] {
            let error = MemberIdentity::named(bad, 1).unwrap_err();
            assert!(
                error.to_string().contains("at most 53 characters"),
                "{error}"
            );
        }
        assert!(MemberIdentity::named(&"a".repeat(53), 1).is_ok());
    }

    fn member_lease_of(holder: Option<&str>, annotations: &[(&str, &str)]) -> Lease {
        let mut lease = Lease::default();
        lease.metadata.labels = Some([(SHARD_MEMBER_LABEL.to_owned(), "m-0".to_owned())].into());
        lease.metadata.resource_version = Some("41".to_owned());
        lease.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        lease.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: Some(15),
            ..Default::default()
        });
        lease
    }

    fn view_at(lease: &Lease, seen_ms: u64, now_ms: u64) -> ShardView {
        let mut sightings = LeaseSightings::default();
        sightings.observe_all(member_record(lease), seen_ms);
        let known: Vec<MemberLease> = member_lease(lease, &sightings).into_iter().collect();
        ShardView::of(&known, i64::try_from(now_ms).unwrap())
    }

    #[test]
    fn a_lease_released_for_a_restart_stays_its_members_until_it_runs_out() {
        let restarting = member_lease_of(None, &[(SHARD_RESTARTING_ANNOTATION, "m-0/abc-1")]);
        let waiting = view_at(&restarting, 1_000, 15_999);
        assert!(waiting.live.contains("m-0"), "{waiting:?}");
        let ran_out = view_at(&restarting, 1_000, 16_000);
        assert!(ran_out.departed.contains("m-0"), "{ran_out:?}");
        assert_eq!(
            ran_out.departed_versions.get("m-0").map(String::as_str),
            Some("41")
        );
        // Taken back by the next process under the name: held by the member.
        let taken_back = member_lease_of(Some("m-0/def-2"), &[]);
        assert!(view_at(&taken_back, 1_000, 2_000).live.contains("m-0"));
        // Released without the mark (a member of one process): departed at once.
        let released = member_lease_of(None, &[]);
        assert!(view_at(&released, 1_000, 1_001).departed.contains("m-0"));
        // Held by a process of another member name: not this member's.
        let foreign = member_lease_of(Some("other/abc-1"), &[]);
        assert!(view_at(&foreign, 1_000, 1_001).departed.contains("m-0"));
    }

    #[test]
    fn successors_are_read_from_a_comma_separated_list() {
        assert_eq!(
            parse_successors("b-1, c-2,,"),
            ["b-1".to_owned(), "c-2".to_owned()].into()
        );
        assert!(parse_successors("").is_empty());
    }
}

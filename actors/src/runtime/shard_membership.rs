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
use pko_proto::well_known::shard_member_lease;
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
use pko_proto::well_known::{SHARD_MEMBER_LABEL, SHARD_SUCCESSORS_ANNOTATION};

/// The longest the view goes without being recomputed; it is recomputed sooner when a Lease runs out
/// (Leases expire by time, not by event).
const EXPIRY_CHECK: Duration = Duration::from_secs(5);

/// This replica's membership; the member set follows every member's Lease.
pub struct ShardMembership {
    holder: LeaseHolder,
    view: watch::Receiver<ShardView>,
    follower: tokio::task::JoinHandle<()>,
}

/// A sharded replica's name: the host (the pod), a nonce of this process's start and the pid. Unique per
/// process, so a restarted container is a new member and never comes back to keys its successors took
/// over; valid as a label value (at most 63 characters of letters, digits, '-', starting and ending
/// with a letter or digit).
pub fn member_identity(host: &str, pid: u32) -> Member {
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    identity_of(host, pid, started)
}

fn identity_of(host: &str, pid: u32, started_nanos: u128) -> Member {
    let host: String = host
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    let host = host.trim_matches('-');
    let host = if host.is_empty() { "pko-manager" } else { host };
    // 24 bits of the start time: two incarnations of one pod a few milliseconds apart still differ.
    let nonce = (started_nanos / 1_000) & 0xff_ffff;
    format!("{host}-{nonce:06x}-{pid}")
}

impl ShardMembership {
    /// Takes this replica's member Lease in `namespace` (`kube` for the Lease thread's own client) and
    /// starts following the members through `client`. Returns once the Lease is held.
    pub async fn join(
        kube: kube::Config,
        client: Client,
        namespace: &str,
        identity: &str,
        duration: Duration,
        fence: WriteFence,
        metrics: LeaseMetrics,
    ) -> Result<Self, LeaseError> {
        let mut config =
            LeaseConfig::new(namespace, &shard_member_lease(identity), identity, duration);
        config.metrics = metrics;
        config
            .labels
            .insert(SHARD_MEMBER_LABEL.to_owned(), identity.to_owned());
        // Once a coordinator recorded this member's take-over, every replica counts it departed and its
        // successors work on its keys: it stops at its next renewal.
        config.ended_by = Some(SHARD_SUCCESSORS_ANNOTATION.to_owned());
        let holder = LeaseHolder::acquire(kube, config, fence.clone()).await?;
        let (sender, view) = watch::channel(ShardView::default());
        let follower = tokio::spawn(follow_members(
            Api::namespaced(client, namespace),
            sender,
            Ended {
                member: identity.to_owned(),
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
    /// for it to run out.
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
    let successors = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SHARD_SUCCESSORS_ANNOTATION))
        .map(|list| parse_successors(list));
    Some(MemberLease {
        member,
        holder: record.holder,
        renewal_seen_ms: i64::try_from(seen.changed_at_ms()).unwrap_or(i64::MAX),
        duration_ms: i64::try_from(lease_duration_ms(lease.spec.as_ref()?)).unwrap_or(i64::MAX),
        successors,
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
        let a = identity_of("pko-manager-7d9f8c6b5d-x2abc", 1, 1_000_000_000);
        let b = identity_of("pko-manager-7d9f8c6b5d-x2abc", 1, 1_000_005_000);
        assert_ne!(a, b, "a restarted container is a new member");
        assert!(a.ends_with("-1"), "{a}");
        let long = identity_of(&format!("{}_", "h".repeat(80)), 4_194_304, u128::MAX);
        assert!(long.len() <= 63, "{long}");
        assert!(long.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        assert!(long.starts_with('h') && long.ends_with('4'), "{long}");
        assert!(identity_of("--", 7, 0).starts_with("pko-manager-"));
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

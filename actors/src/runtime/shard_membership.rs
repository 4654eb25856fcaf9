//! Shard membership (docs in `engine::shard_assignment`): this replica's own Lease, held and renewed by a
//! [`LeaseHolder`] like the leader Lease (so a replica that cannot renew closes its write fence and exits
//! before the Lease runs out), and the set of live members, read from every member Lease in the namespace.
//! It owns no assignment: which replica works on what is the engine's rule over this set.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::warn;

use crate::engine::shard_assignment::{live_members, Member, MemberLease};
use crate::runtime::leader_lease::{LeaseConfig, LeaseError, LeaseHolder};
use crate::runtime::write_fence::WriteFence;

/// Label on every member Lease.
pub const MEMBER_LABEL: &str = "package-operator.run/shard-member";
/// Member Leases are named this plus the replica's identity.
const LEASE_PREFIX: &str = "pko-shard-";
/// How often the member set is recomputed without a Lease event: Leases expire by time, not by event.
const EXPIRY_CHECK: Duration = Duration::from_millis(500);

/// This replica's membership; the member set follows every member's Lease.
pub struct ShardMembership {
    identity: Member,
    holder: LeaseHolder,
    members: watch::Receiver<BTreeSet<Member>>,
    follower: tokio::task::JoinHandle<()>,
}

/// A Lease name for `identity`: lower-case letters, digits and '-' only.
fn lease_name(identity: &str) -> String {
    let suffix: String = identity
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-') => c,
            _ => '-',
        })
        .collect();
    format!("{LEASE_PREFIX}{suffix}")
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
    ) -> Result<Self, LeaseError> {
        let mut config = LeaseConfig::new(namespace, &lease_name(identity), identity, duration);
        config
            .labels
            .insert(MEMBER_LABEL.to_owned(), "true".to_owned());
        let holder = LeaseHolder::acquire(kube, config, fence).await?;
        let (sender, members) = watch::channel(BTreeSet::new());
        let follower = tokio::spawn(follow_members(Api::namespaced(client, namespace), sender));
        Ok(Self {
            identity: identity.to_owned(),
            holder,
            members,
            follower,
        })
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The live members, updated as Leases come, go and run out.
    pub fn members(&self) -> watch::Receiver<BTreeSet<Member>> {
        self.members.clone()
    }

    /// Gives the member Lease up (on shutdown), so the others take this replica's share without waiting
    /// for it to run out.
    pub async fn leave(self) {
        self.follower.abort();
        self.holder.release().await;
    }
}

fn member_lease(lease: &Lease) -> Option<MemberLease> {
    let spec = lease.spec.as_ref()?;
    let renewed: Timestamp = spec.renew_time.as_ref()?.0;
    Some(MemberLease {
        holder: spec.holder_identity.clone().unwrap_or_default(),
        renewed_at_ms: renewed.as_millisecond(),
        duration_ms: i64::from(spec.lease_duration_seconds.unwrap_or(15)) * 1000,
    })
}

/// Keeps `members` equal to the holders of the live member Leases (a reflector keeps the Leases,
/// re-lists included).
async fn follow_members(api: Api<Lease>, members: watch::Sender<BTreeSet<Member>>) {
    let config = watcher::Config::default().labels(&format!("{MEMBER_LABEL}=true"));
    let (leases, writer) = reflector::store();
    let mut events = reflector(writer, watcher::watcher(api, config))
        .default_backoff()
        .boxed();
    let mut tick = tokio::time::interval(EXPIRY_CHECK);
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(_)) => {}
                Some(Err(error)) => warn!(%error, "watching member Leases"),
                None => return,
            },
            _ = tick.tick() => {}
        }
        let now = Timestamp::now().as_millisecond();
        let known: Vec<MemberLease> = leases
            .state()
            .iter()
            .filter_map(|l| member_lease(l))
            .collect();
        let live = live_members(&known, now);
        members.send_if_modified(|current| {
            let changed = *current != live;
            if changed {
                *current = live;
            }
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_valid_object_names() {
        assert_eq!(
            lease_name("pko-manager-7d9f-x2"),
            "pko-shard-pko-manager-7d9f-x2"
        );
        assert_eq!(lease_name("Host_Name.1-42"), "pko-shard-host-name-1-42");
    }
}

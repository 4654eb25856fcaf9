//! Which manager replica owns what, when the manager runs sharded (docs/sharding.md), and how an object
//! moves from one replica to another without two of them working on it at once.
//!
//! - A replica is a member while its own Lease is live: renewed within its duration. A replica that cannot
//!   renew stops working before its Lease runs out (the write fence of `runtime::leader_lease`), so an
//!   expired Lease means a stopped replica.
//! - Work is keyed by shard key: the HCP namespace for namespaced objects (a namespace's Packages,
//!   ObjectDeployments, ObjectSets, its connector link and remote phases all live on one replica) and
//!   kind + name for cluster-scoped objects.
//! - The owner of a key is chosen by rendezvous hashing over the members: every member scores the key,
//!   the highest score owns it. A member joining takes only the keys it now scores highest on; a member
//!   leaving gives away only its own keys. No table is kept: any replica computes the same owner from the
//!   same membership.
//! - Moving a key is a hand-off. Objects carry the owner's name in a shard label (the replica's watches
//!   select on it). The coordinator never relabels a key a live replica holds: it first marks it draining;
//!   the holder stops its actors for it and clears the label; only then is the new owner labelled. A key
//!   whose holder is no longer a member is relabelled at once (the holder stopped when its Lease ran out).
//!
//! Pure: no I/O, no clock; times come in as arguments.

use std::collections::BTreeSet;

/// A replica's name: its Lease's holder identity.
pub type Member = String;

/// The unit that moves between replicas: a namespace, or one cluster-scoped object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ShardKey {
    /// Every namespaced object of this namespace.
    Namespace(String),
    /// One cluster-scoped object, by kind and name.
    Cluster { kind: String, name: String },
}

impl ShardKey {
    /// The key of an object: its namespace when it has one.
    pub fn of(kind: &str, namespace: Option<&str>, name: &str) -> Self {
        match namespace.filter(|ns| !ns.is_empty()) {
            Some(namespace) => Self::Namespace(namespace.to_owned()),
            None => Self::Cluster {
                kind: kind.to_owned(),
                name: name.to_owned(),
            },
        }
    }

    /// Bytes the rendezvous hash reads; distinct for distinct keys.
    fn hashed(&self) -> String {
        match self {
            Self::Namespace(namespace) => format!("ns/{namespace}"),
            Self::Cluster { kind, name } => format!("cluster/{kind}/{name}"),
        }
    }
}

/// What a replica's Lease says, as read from the apiserver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberLease {
    pub holder: Member,
    /// renewTime, in milliseconds since the epoch.
    pub renewed_at_ms: i64,
    pub duration_ms: i64,
}

/// The members at `now_ms`: holders whose Lease has not run out.
pub fn live_members(leases: &[MemberLease], now_ms: i64) -> BTreeSet<Member> {
    leases
        .iter()
        .filter(|l| !l.holder.is_empty() && l.renewed_at_ms.saturating_add(l.duration_ms) > now_ms)
        .map(|l| l.holder.clone())
        .collect()
}

/// 64-bit FNV-1a over `parts` (with a separator), then a SplitMix64 finish so that members differing in
/// one character spread apart. Stable across builds and platforms, unlike std's hasher.
fn score(member: &str, key: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in member.bytes().chain([0u8]).chain(key.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

/// The member that owns `key`, or None without members. Ties (astronomically unlikely) go to the smaller
/// name, so every replica agrees.
pub fn owner<'a>(key: &ShardKey, members: &'a BTreeSet<Member>) -> Option<&'a Member> {
    let hashed = key.hashed();
    members.iter().max_by(|a, b| {
        score(a, &hashed)
            .cmp(&score(b, &hashed))
            .then_with(|| b.cmp(a))
    })
}

/// The shard labels of one key's objects as observed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    /// The replica the objects are labelled for, if any.
    pub holder: Option<Member>,
    /// The coordinator asked the holder to let go.
    pub draining: bool,
}

/// What the coordinator does to a key's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelAction {
    /// Labelled as it should be, or waiting for the holder to let go.
    Keep,
    /// Label the objects for this member (and clear any drain mark).
    Assign(Member),
    /// Ask the live holder to let go.
    Drain,
}

/// The coordinator's rule for one key: assign it to its owner directly when nobody live holds it, and
/// through a drain when a live replica does. Without members nothing is assigned.
pub fn label_action(
    key: &ShardKey,
    placement: &Placement,
    members: &BTreeSet<Member>,
) -> LabelAction {
    let Some(wanted) = owner(key, members) else {
        return LabelAction::Keep;
    };
    match &placement.holder {
        Some(holder) if holder == wanted => {
            if placement.draining {
                // Drained towards another owner, then the membership changed back: keep it where it is.
                LabelAction::Assign(wanted.clone())
            } else {
                LabelAction::Keep
            }
        }
        Some(holder) if members.contains(holder) => {
            if placement.draining {
                LabelAction::Keep
            } else {
                LabelAction::Drain
            }
        }
        // Unlabelled, or held by a replica whose Lease ran out (it stopped when it did).
        _ => LabelAction::Assign(wanted.clone()),
    }
}

/// Whether `me` works on a key with this placement: it is labelled for `me` and not draining. A replica
/// that sees its key draining stops its actors for it and then clears the label ([`release`]).
pub fn works_on(me: &str, placement: &Placement) -> bool {
    placement.holder.as_deref() == Some(me) && !placement.draining
}

/// The placement after its holder let go of a draining key: unlabelled, ready for the new owner. A key
/// that is not draining stays as it is (a holder lets go only when asked).
pub fn release(placement: &Placement) -> Placement {
    if placement.draining {
        Placement::default()
    } else {
        placement.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn members(names: &[&str]) -> BTreeSet<Member> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    fn keys(n: usize) -> Vec<ShardKey> {
        (0..n)
            .map(|i| ShardKey::Namespace(format!("clusters-hc-{i:04}")))
            .collect()
    }

    #[test]
    fn a_namespaced_object_goes_with_its_namespace_and_a_cluster_scoped_one_by_name() {
        assert_eq!(
            ShardKey::of("Package", Some("clusters-a"), "addon"),
            ShardKey::of("ObjectSet", Some("clusters-a"), "addon-x1")
        );
        assert_ne!(
            ShardKey::of("HostedClusterPackage", None, "a"),
            ShardKey::of("HostedClusterPackage", None, "b")
        );
        assert_ne!(
            ShardKey::of("ClusterPackage", None, "a"),
            ShardKey::of("HostedClusterPackage", None, "a")
        );
    }

    #[test]
    fn members_are_the_holders_of_live_leases() {
        let lease = |holder: &str, renewed_at_ms| MemberLease {
            holder: holder.into(),
            renewed_at_ms,
            duration_ms: 15_000,
        };
        let leases = [lease("a", 100_000), lease("b", 84_000), lease("", 100_000)];
        assert_eq!(live_members(&leases, 98_999), members(&["a", "b"]));
        assert_eq!(live_members(&leases, 99_000), members(&["a"]));
        assert!(live_members(&leases, 115_000).is_empty());
    }

    #[test]
    fn four_replicas_share_a_thousand_namespaces_evenly() {
        let replicas = members(&["pko-0", "pko-1", "pko-2", "pko-3"]);
        let mut shares: BTreeMap<&Member, usize> = BTreeMap::new();
        for key in keys(1000) {
            *shares
                .entry(owner(&key, &replicas).unwrap_or_else(|| unreachable!()))
                .or_default() += 1;
        }
        assert_eq!(shares.len(), 4, "{shares:?}");
        for (member, share) in &shares {
            assert!((180..=320).contains(share), "{member}: {share} of 1000");
        }
    }

    #[test]
    fn a_drained_key_is_relabelled_only_after_its_holder_let_go() {
        let key = ShardKey::Namespace("clusters-x".into());
        let before = members(&["a"]);
        let mut after = members(&["a", "b"]);
        // Find a membership where the key moves to the newcomer.
        let newcomer = (0..100)
            .map(|i| format!("b{i}"))
            .find(|b| {
                after = members(&["a", b]);
                owner(&key, &after) == Some(b)
            })
            .unwrap_or_else(|| unreachable!("some name takes the key"));
        let held = Placement {
            holder: Some("a".into()),
            draining: false,
        };
        assert_eq!(label_action(&key, &held, &before), LabelAction::Keep);
        assert_eq!(label_action(&key, &held, &after), LabelAction::Drain);
        let draining = Placement {
            draining: true,
            ..held.clone()
        };
        assert!(!works_on("a", &draining));
        assert_eq!(label_action(&key, &draining, &after), LabelAction::Keep);
        assert_eq!(
            label_action(&key, &release(&draining), &after),
            LabelAction::Assign(newcomer.clone())
        );
        // The holder's Lease ran out instead: relabelled at once.
        let without_a: BTreeSet<Member> = [newcomer.clone()].into();
        assert_eq!(
            label_action(&key, &held, &without_a),
            LabelAction::Assign(newcomer)
        );
        // Nobody to assign to.
        assert_eq!(
            label_action(&key, &held, &BTreeSet::new()),
            LabelAction::Keep
        );
    }

    fn membership() -> impl Strategy<Value = BTreeSet<Member>> {
        prop::collection::btree_set("[a-z]{1,6}-[0-9]{1,2}", 1..8)
    }

    /// One step of the world: the coordinator labels, a replica lets go, or membership changes.
    #[derive(Debug, Clone)]
    enum Step {
        Coordinate,
        Release(usize),
        Join(String),
        /// A member's Lease runs out (it stopped working when it could not renew).
        Expire(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => Just(Step::Coordinate),
            3 => (0usize..8).prop_map(Step::Release),
            1 => "[a-z]{1,6}-[0-9]{1,2}".prop_map(Step::Join),
            1 => (0usize..8).prop_map(Step::Expire),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn every_key_has_exactly_one_owner_and_it_is_a_member(
            replicas in membership(),
            namespaces in prop::collection::vec("[a-z0-9-]{1,20}", 1..50),
        ) {
            for namespace in namespaces {
                let key = ShardKey::Namespace(namespace);
                let owners: Vec<&Member> = replicas
                    .iter()
                    .filter(|m| owner(&key, &replicas) == Some(*m))
                    .collect();
                prop_assert_eq!(owners.len(), 1);
            }
        }

        #[test]
        fn a_join_moves_keys_only_to_the_newcomer_and_a_leave_only_from_the_leaver(
            replicas in membership(),
            newcomer in "[a-z]{1,6}-[0-9]{1,2}",
        ) {
            prop_assume!(!replicas.contains(&newcomer));
            let mut joined = replicas.clone();
            joined.insert(newcomer.clone());
            for key in keys(200) {
                let before = owner(&key, &replicas);
                let after = owner(&key, &joined);
                prop_assert!(before == after || after == Some(&newcomer), "{key:?}: {before:?} -> {after:?}");
                // And leaving again restores exactly the old owner.
                prop_assert_eq!(owner(&key, &replicas), before);
            }
        }

        /// Random interleavings of coordination, releases and membership changes never let two live
        /// replicas work on a key at once, and once membership settles and the coordinator and the
        /// replicas have done their part, every key is labelled for its owner.
        #[test]
        fn hand_offs_never_overlap_and_converge(
            initial in membership(),
            steps in prop::collection::vec(step(), 0..60),
        ) {
            let keys = keys(24);
            let mut live = initial;
            let mut placements: BTreeMap<ShardKey, Placement> =
                keys.iter().map(|k| (k.clone(), Placement::default())).collect();
            let coordinate = |live: &BTreeSet<Member>, placements: &mut BTreeMap<ShardKey, Placement>| {
                for (key, placement) in placements.iter_mut() {
                    match label_action(key, placement, live) {
                        LabelAction::Keep => {}
                        LabelAction::Drain => placement.draining = true,
                        LabelAction::Assign(member) => {
                            *placement = Placement { holder: Some(member), draining: false }
                        }
                    }
                }
            };
            let release_all = |member: &str, placements: &mut BTreeMap<ShardKey, Placement>| {
                for placement in placements.values_mut() {
                    if placement.holder.as_deref() == Some(member) {
                        *placement = release(placement);
                    }
                }
            };
            for step in steps {
                let before = placements.clone();
                match step {
                    Step::Coordinate => coordinate(&live, &mut placements),
                    Step::Release(i) => {
                        if let Some(member) = live.iter().nth(i % live.len().max(1)).cloned() {
                            release_all(&member, &mut placements);
                        }
                    }
                    Step::Join(name) => {
                        live.insert(name);
                    }
                    Step::Expire(i) => {
                        if live.len() > 1 {
                            if let Some(member) = live.iter().nth(i % live.len()).cloned() {
                                live.remove(&member);
                            }
                        }
                    }
                }
                // A key goes from one replica straight to another only when the first is gone (its
                // Lease ran out, so it stopped); otherwise it passes through "released" first, which the
                // holder writes after stopping its actors.
                for (key, placement) in &placements {
                    let was = &before[key];
                    if let (Some(old), Some(new)) = (&was.holder, &placement.holder) {
                        if old != new {
                            prop_assert!(!live.contains(old), "{key:?} moved from live {old} to {new}");
                        }
                    }
                    let working: Vec<&Member> = live.iter().filter(|m| works_on(m, placement)).collect();
                    prop_assert!(working.len() <= 1);
                }
            }
            // Settle: the coordinator and every live replica do their part until nothing changes.
            for _ in 0..4 {
                coordinate(&live, &mut placements);
                for member in live.clone() {
                    release_all(&member, &mut placements);
                }
            }
            for (key, placement) in &placements {
                let wanted = owner(key, &live);
                prop_assert_eq!(placement.holder.as_ref(), wanted);
                prop_assert!(!placement.draining);
                prop_assert!(wanted.is_some_and(|w| works_on(w, placement)));
            }
        }
    }
}

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

use pko_proto::well_known::{SHARD_DRAIN_LABEL, SHARD_OWNER_LABEL};

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

/// The shard labels of one object as observed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    /// The replica the object is labelled for, if any.
    pub holder: Option<Member>,
    /// The coordinator asked the holder to let go.
    pub draining: bool,
}

impl Placement {
    /// The placement an object's labels say (`SHARD_OWNER_LABEL`, `SHARD_DRAIN_LABEL`).
    pub fn from_labels(labels: Option<&std::collections::BTreeMap<String, String>>) -> Self {
        let label = |name: &str| labels.and_then(|l| l.get(name));
        Self {
            holder: label(SHARD_OWNER_LABEL).cloned(),
            draining: label(SHARD_DRAIN_LABEL).is_some_and(|v| v == "true"),
        }
    }
}

/// What the coordinator writes to one object's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelAction {
    /// Label the object for this member (and clear any drain mark).
    Assign(Member),
    /// Ask the live holder to let go.
    Drain,
}

/// The coordinator's rule for the objects of one key (all of a namespace's objects move together), one
/// action or none per object, in order:
/// - while a live replica other than the owner holds any of them, or two live replicas do, every object a
///   live replica holds is drained and nothing is labelled: the owner starts only once nobody else works
///   on the key (a replica that drains stops its actors before it clears the label);
/// - otherwise every object not labelled for the owner (new, released, or held by a replica whose Lease
///   ran out, which stopped when it did) is labelled for it, and a drain mark the owner carries is lifted.
///
/// Without members nothing changes.
pub fn coordinate(
    key: &ShardKey,
    objects: &[Placement],
    members: &BTreeSet<Member>,
) -> Vec<Option<LabelAction>> {
    let Some(wanted) = owner(key, members) else {
        return vec![None; objects.len()];
    };
    let live_holders: BTreeSet<&Member> = objects
        .iter()
        .filter_map(|o| o.holder.as_ref())
        .filter(|h| members.contains(*h))
        .collect();
    let settled = live_holders.iter().all(|h| *h == wanted);
    objects
        .iter()
        .map(|object| {
            let live = object.holder.as_ref().filter(|h| members.contains(*h));
            match (settled, live) {
                (false, Some(_)) if !object.draining => Some(LabelAction::Drain),
                (false, _) => None,
                (true, Some(h)) if h == wanted && !object.draining => None,
                (true, _) => Some(LabelAction::Assign(wanted.clone())),
            }
        })
        .collect()
}

/// Whether `me` works on an object with this placement: it is labelled for `me` and not draining. A
/// replica that sees its object draining stops its actor for it and then clears the label ([`release`]).
pub fn works_on(me: &str, placement: &Placement) -> bool {
    placement.holder.as_deref() == Some(me) && !placement.draining
}

/// The placement after its holder let go of a draining object: unlabelled, ready for the new owner. An
/// object that is not draining stays as it is (a holder lets go only when asked).
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
    fn labels_name_the_holder_and_the_drain() {
        let labels: BTreeMap<String, String> = [
            (SHARD_OWNER_LABEL.to_owned(), "a".to_owned()),
            (SHARD_DRAIN_LABEL.to_owned(), "true".to_owned()),
        ]
        .into();
        assert_eq!(Placement::from_labels(Some(&labels)), held("a", true));
        assert!(!works_on("a", &Placement::from_labels(Some(&labels))));
        assert_eq!(Placement::from_labels(None), Placement::default());
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

    fn held(holder: &str, draining: bool) -> Placement {
        Placement {
            holder: Some(holder.into()),
            draining,
        }
    }

    #[test]
    fn a_key_moves_only_after_every_live_holder_let_go() {
        let key = ShardKey::Namespace("clusters-x".into());
        // A membership where the key moves from "a" to the newcomer.
        let newcomer = (0..100)
            .map(|i| format!("b{i}"))
            .find(|b| owner(&key, &members(&["a", b])) == Some(b))
            .unwrap_or_else(|| unreachable!("some name takes the key"));
        let before = members(&["a"]);
        let after = members(&["a", &newcomer]);
        let objects = [held("a", false), held("a", false), Placement::default()];
        // Settled on "a": the new, unlabelled object joins it.
        assert_eq!(
            coordinate(&key, &objects, &before),
            [None, None, Some(LabelAction::Assign("a".into()))]
        );
        // The newcomer owns it now: "a" is asked to let go of both; the new object waits.
        assert_eq!(
            coordinate(&key, &objects, &after),
            [Some(LabelAction::Drain), Some(LabelAction::Drain), None]
        );
        let draining = [held("a", true), held("a", true), Placement::default()];
        assert!(!works_on("a", &draining[0]));
        assert_eq!(coordinate(&key, &draining, &after), [None, None, None]);
        // One released, one not yet: still nothing for the newcomer.
        let half = [Placement::default(), held("a", true), Placement::default()];
        assert_eq!(coordinate(&key, &half, &after), [None, None, None]);
        let released: Vec<Placement> = draining.iter().map(release).collect();
        let assign = Some(LabelAction::Assign(newcomer.clone()));
        assert_eq!(
            coordinate(&key, &released, &after),
            [assign.clone(), assign.clone(), assign.clone()]
        );
        // "a"'s Lease ran out instead: relabelled at once.
        let without_a: BTreeSet<Member> = [newcomer.clone()].into();
        assert_eq!(
            coordinate(&key, &objects, &without_a),
            [assign.clone(), assign.clone(), assign]
        );
        // Nobody to assign to.
        assert_eq!(
            coordinate(&key, &objects, &BTreeSet::new()),
            [None, None, None]
        );
    }

    fn membership() -> impl Strategy<Value = BTreeSet<Member>> {
        prop::collection::btree_set("[a-z]{1,6}-[0-9]{1,2}", 1..8)
    }

    /// One step of the world: the coordinator labels, a replica lets go, membership changes, or an
    /// object of some key is created.
    #[derive(Debug, Clone)]
    enum Step {
        Coordinate,
        Release(usize),
        Join(String),
        /// A member's Lease runs out (it stopped working when it could not renew).
        Expire(usize),
        Create(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => Just(Step::Coordinate),
            3 => (0usize..8).prop_map(Step::Release),
            1 => "[a-z]{1,6}-[0-9]{1,2}".prop_map(Step::Join),
            1 => (0usize..8).prop_map(Step::Expire),
            2 => (0usize..KEYS).prop_map(Step::Create),
        ]
    }

    const KEYS: usize = 12;

    /// Each key's objects.
    type World = BTreeMap<ShardKey, Vec<Placement>>;

    fn coordinate_all(live: &BTreeSet<Member>, world: &mut World) {
        for (key, objects) in world.iter_mut() {
            let actions = coordinate(key, objects, live);
            for (object, action) in objects.iter_mut().zip(actions) {
                match action {
                    None => {}
                    Some(LabelAction::Drain) => object.draining = true,
                    Some(LabelAction::Assign(member)) => {
                        *object = Placement {
                            holder: Some(member),
                            draining: false,
                        }
                    }
                }
            }
        }
    }

    fn release_all(member: &str, world: &mut World) {
        for object in world.values_mut().flatten() {
            if object.holder.as_deref() == Some(member) {
                *object = release(object);
            }
        }
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

        /// Random interleavings of coordination, releases, new objects and membership changes never let
        /// two live replicas work on objects of one key at once, and once membership settles and the
        /// coordinator and the replicas have done their part, every object is labelled for its key's owner.
        #[test]
        fn hand_offs_never_overlap_and_converge(
            initial in membership(),
            steps in prop::collection::vec(step(), 0..80),
        ) {
            let keys = keys(KEYS);
            let mut live = initial;
            let mut world: World = keys.iter().map(|k| (k.clone(), vec![Placement::default()])).collect();
            for step in steps {
                match step {
                    Step::Coordinate => coordinate_all(&live, &mut world),
                    Step::Release(i) => {
                        if let Some(member) = live.iter().nth(i % live.len().max(1)).cloned() {
                            release_all(&member, &mut world);
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
                    Step::Create(k) => {
                        if let Some(objects) = world.get_mut(&keys[k]) {
                            objects.push(Placement::default());
                        }
                    }
                }
                for (key, objects) in &world {
                    let working: BTreeSet<&Member> = live
                        .iter()
                        .filter(|m| objects.iter().any(|o| works_on(m, o)))
                        .collect();
                    prop_assert!(working.len() <= 1, "{key:?} worked on by {working:?}");
                }
            }
            // Settle: the coordinator and every live replica do their part until nothing changes.
            for _ in 0..4 {
                coordinate_all(&live, &mut world);
                for member in live.clone() {
                    release_all(&member, &mut world);
                }
            }
            coordinate_all(&live, &mut world);
            for (key, objects) in &world {
                let wanted = owner(key, &live);
                for object in objects {
                    prop_assert_eq!(object.holder.as_ref(), wanted);
                    prop_assert!(wanted.is_some_and(|w| works_on(w, object)));
                }
            }
        }
    }
}

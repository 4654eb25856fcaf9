//! Which manager replica owns what, when the manager runs sharded (docs/sharding.md), and how an object
//! moves from one replica to another without two of them working on it at once.
//!
//! - A replica is a member while its own Lease is live: a renewal seen within its duration, timed by the
//!   observer's own clock from when it saw the renewal (`lease_expiry`), never from the renewTime the
//!   member wrote, and no take-over recorded on it. A replica that cannot renew stops working before its Lease runs out (the write fence
//!   of `runtime::leader_lease`), so an expired Lease means a stopped replica, whatever the clocks say.
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
//! - A departed member's keys are taken over before they are relabelled: the coordinator writes a
//!   take-over record (the members live when it saw the departure) onto the departed member's Lease, and
//!   each successor at once works on the objects still labelled for the departed member whose key it owns
//!   among those members ([`ShardView::worker`]). Relabelling then proceeds in the background without
//!   moving any work; the record goes (with the Lease) once no object carries the departed member's label
//!   and no object's worker is found through it ([`ShardView::records_needed`]).
//!   A departed member never comes back to keys its successors hold: its Lease carries the record until
//!   it is retired, and a process that finds a record on its Lease does not take it.
//! - A member that stops to restart under the same name (a StatefulSet's pod) keeps its Lease, released
//!   but marked for the restart: it stays a member for the Lease's duration from when each observer saw
//!   the release, its keys unserved and unmoved, and the restarted process takes the Lease back. A take-over
//!   record is written only over the Lease version that showed the departure, so a restart that takes the
//!   Lease back first voids it.
//!
//! Pure: no I/O, no clock; times come in as arguments.

use std::collections::{BTreeMap, BTreeSet};

use pko_proto::well_known::{SHARD_DRAIN_LABEL, SHARD_OWNER_LABEL};

/// A replica's member name: its Lease's member label (the holder identity names the process holding it).
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

    /// The key of an object of `kind`: a HostedCluster's is its HCP namespace's, any other's
    /// [`ShardKey::of`].
    pub fn of_kind(kind: &str, namespace: Option<&str>, name: &str) -> Self {
        match namespace.filter(|ns| !ns.is_empty()) {
            Some(namespace) if kind == "HostedCluster" => Self::of_hosted_cluster(namespace, name),
            _ => Self::of(kind, namespace, name),
        }
    }

    /// The key of a HostedCluster: its HCP namespace (`<namespace>-<name>`), whose objects it goes with.
    fn of_hosted_cluster(namespace: &str, name: &str) -> Self {
        Self::Namespace(format!("{namespace}-{name}"))
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
    /// The member the Lease belongs to (its member label; the holder is cleared when it leaves).
    pub member: Member,
    pub holder: Member,
    /// When the observer first saw the Lease's current renewal, in its own monotonic milliseconds.
    pub renewal_seen_ms: i64,
    pub duration_ms: i64,
    /// The take-over record the coordinator wrote once the member had left.
    pub successors: Option<BTreeSet<Member>>,
    /// The Lease's resourceVersion as read.
    pub version: String,
}

impl MemberLease {
    /// Held by its member, renewed within its duration as this observer timed it, and no take-over
    /// recorded on it. A record is a coordinator's decision that the member left (its Lease ran out or was
    /// released as that coordinator saw it), and every observer must agree on it: an observer that started
    /// after the member's last renewal times the Lease from its own first sight, and a newcomer
    /// coordinator that counted such a member live gave it keys and named it a successor (CI: a Package
    /// labelled for a dead member was never reconciled again). The member itself gives up its Lease when
    /// it finds the record on it (`runtime::leader_lease`).
    fn live(&self, now_ms: i64) -> bool {
        !self.holder.is_empty()
            && self.holder == self.member
            && self.successors.is_none()
            && self.renewal_seen_ms.saturating_add(self.duration_ms) > now_ms
    }
}

/// The members at `now_ms`: holders whose Lease has not run out.
pub fn live_members(leases: &[MemberLease], now_ms: i64) -> BTreeSet<Member> {
    leases
        .iter()
        .filter(|l| l.live(now_ms))
        .map(|l| l.member.clone())
        .collect()
}

/// The members as a replica sees them at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardView {
    /// Members whose Lease is live.
    pub live: BTreeSet<Member>,
    /// Members whose Lease ran out or was given up, and is still there.
    pub departed: BTreeSet<Member>,
    /// For departed members whose keys are being taken over: the members live when the coordinator saw
    /// the departure, among which each of its keys goes to its rendezvous owner.
    pub takeovers: BTreeMap<Member, BTreeSet<Member>>,
    /// The Lease version each departed member was seen departed at. A take-over record is written only
    /// over it: a replica restarted under the same member name that took its Lease back meanwhile is
    /// live, and a record landing on its Lease would let its successors work beside it until its own
    /// watch showed the record.
    pub departed_versions: BTreeMap<Member, String>,
}

impl ShardView {
    /// The view of the member Leases at `now_ms`.
    pub fn of(leases: &[MemberLease], now_ms: i64) -> Self {
        let mut view = Self::default();
        for lease in leases {
            if lease.live(now_ms) {
                view.live.insert(lease.member.clone());
                continue;
            }
            view.departed.insert(lease.member.clone());
            view.departed_versions
                .insert(lease.member.clone(), lease.version.clone());
            if let Some(successors) = &lease.successors {
                view.takeovers
                    .insert(lease.member.clone(), successors.clone());
            }
        }
        view
    }

    /// A view with these live members and nothing departed.
    pub fn live(members: BTreeSet<Member>) -> Self {
        Self {
            live: members,
            ..Self::default()
        }
    }

    /// The member that works on `key`'s objects labelled for `holder`: the holder while it is live; for a
    /// departed holder with a take-over record, the successor owning the key (following successors that
    /// departed in turn); nobody otherwise (a departed holder whose take-over is not recorded yet).
    pub fn worker<'a>(&'a self, key: &ShardKey, holder: Option<&'a Member>) -> Option<&'a Member> {
        let mut worker = None;
        self.resolve(key, holder?, |member| worker = Some(member));
        worker.filter(|member| self.live.contains(*member))
    }

    /// The departed members whose take-over records an object of `key` labelled for `holder` is resolved
    /// through, from the holder to the last before its live worker. Each must keep its Lease (and the
    /// record with it) while such an object exists: once one record goes, the object has no worker, and
    /// the coordinator would label it for the owner while the successor still works on it.
    pub fn records_needed<'a>(&'a self, key: &ShardKey, holder: &'a Member) -> Vec<&'a Member> {
        let mut chain = Vec::new();
        self.resolve(key, holder, |member| chain.push(member));
        chain.retain(|member| !self.live.contains(*member));
        chain
    }

    /// Calls `visit` with `holder` and each successor the records hand its key on to, until a live member
    /// or a member without a record.
    fn resolve<'a>(
        &'a self,
        key: &ShardKey,
        holder: &'a Member,
        mut visit: impl FnMut(&'a Member),
    ) {
        let mut holder = holder;
        // Each record is followed at most once: successors are chosen among members live at the time,
        // so a chain cannot loop, but a hostile or corrupt record must not spin.
        for _ in 0..=self.takeovers.len() {
            visit(holder);
            if self.live.contains(holder) {
                return;
            }
            let Some(next) = self.takeovers.get(holder).and_then(|s| owner(key, s)) else {
                return;
            };
            holder = next;
        }
    }

    /// Departed members whose keys nobody takes over yet: the coordinator records their successors.
    pub fn unrecorded_departures(&self) -> impl Iterator<Item = &Member> {
        self.departed
            .iter()
            .filter(|m| !self.takeovers.contains_key(*m))
    }
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
    /// Label an object taken over from a departed member for the successor already working on it (and
    /// clear any drain mark): the label catches up with the work and moves none, so it may wait.
    Follow(Member),
    /// Ask the live holder to let go.
    Drain,
}

/// The coordinator's rule for the objects of one key (all of a namespace's objects move together), one
/// action or none per object, in order. An object's worker is its holder, or the successor taking it over
/// when the holder departed ([`ShardView::worker`]).
/// - while a member other than the owner works on any of them, or two members do, every object a member
///   works on is drained and nothing is labelled: the owner starts only once nobody else works on the key
///   (a replica that drains stops its actors before it clears the label);
/// - otherwise every object not labelled for the owner (new, released, or held by a departed member nobody
///   took over, which stopped when its Lease ran out) is labelled for it, one the owner already works on
///   as a departed member's successor follows it ([`LabelAction::Follow`]), and a drain mark the owner
///   carries is lifted.
///
/// Without live members nothing changes.
pub fn coordinate(
    key: &ShardKey,
    objects: &[Placement],
    view: &ShardView,
) -> Vec<Option<LabelAction>> {
    let Some(wanted) = owner(key, &view.live) else {
        return vec![None; objects.len()];
    };
    let settled = objects
        .iter()
        .filter_map(|o| view.worker(key, o.holder.as_ref()))
        .all(|w| w == wanted);
    objects
        .iter()
        .map(|object| {
            let worker = view.worker(key, object.holder.as_ref());
            match (settled, worker) {
                (false, Some(_)) if !object.draining => Some(LabelAction::Drain),
                (false, _) => None,
                (true, _) if object.holder.as_ref() == Some(wanted) && !object.draining => None,
                // Settled: the worker is the owner.
                (true, Some(_))
                    if object
                        .holder
                        .as_ref()
                        .is_some_and(|h| !view.live.contains(h)) =>
                {
                    Some(LabelAction::Follow(wanted.clone()))
                }
                (true, _) => Some(LabelAction::Assign(wanted.clone())),
            }
        })
        .collect()
}

/// Whether `me` works on an object of `key` with this placement: `me` is its worker (its holder, or the
/// successor taking it over) and it is not draining. A replica that sees its object draining stops its
/// actor for it and then clears the label ([`release`]).
pub fn works_on(me: &str, key: &ShardKey, placement: &Placement, view: &ShardView) -> bool {
    !placement.draining
        && view
            .worker(key, placement.holder.as_ref())
            .map(String::as_str)
            == Some(me)
}

/// Whether `me` must let go of an object of `key`: the coordinator marked it draining while `me` works on
/// it.
pub fn drained(me: &str, key: &ShardKey, placement: &Placement, view: &ShardView) -> bool {
    placement.draining
        && view
            .worker(key, placement.holder.as_ref())
            .map(String::as_str)
            == Some(me)
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
        assert_eq!(
            ShardKey::of_kind("HostedCluster", Some("clusters"), "a"),
            ShardKey::of_kind("Package", Some("clusters-a"), "addon")
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
        let key = ShardKey::Namespace("clusters-a".into());
        let view = ShardView::live(members(&["a"]));
        assert!(!works_on(
            "a",
            &key,
            &Placement::from_labels(Some(&labels)),
            &view
        ));
        assert!(drained(
            "a",
            &key,
            &Placement::from_labels(Some(&labels)),
            &view
        ));
        assert_eq!(Placement::from_labels(None), Placement::default());
    }

    #[test]
    fn members_are_the_holders_of_live_leases() {
        let lease = |member: &str, holder: &str, renewal_seen_ms| MemberLease {
            member: member.into(),
            holder: holder.into(),
            renewal_seen_ms,
            duration_ms: 15_000,
            successors: None,
            version: String::new(),
        };
        let leases = [
            lease("a", "a", 100_000),
            lease("b", "b", 84_000),
            lease("c", "", 100_000),
        ];
        assert_eq!(live_members(&leases, 98_999), members(&["a", "b"]));
        assert_eq!(live_members(&leases, 99_000), members(&["a"]));
        assert!(live_members(&leases, 115_000).is_empty());
        let mut recorded = lease("b", "b", 84_000);
        recorded.successors = Some(members(&["a"]));
        let view = ShardView::of(&[leases[0].clone(), recorded, leases[2].clone()], 99_000);
        assert_eq!(view.live, members(&["a"]));
        assert_eq!(view.departed, members(&["b", "c"]));
        assert_eq!(view.takeovers.len(), 1);
        assert_eq!(
            view.unrecorded_departures().collect::<Vec<_>>(),
            vec![&"c".to_owned()]
        );
    }

    #[test]
    fn a_recorded_take_over_makes_the_member_departed_for_an_observer_that_just_saw_it_renewed() {
        // An observer that started after the member's last renewal times the Lease from its first sight:
        // by its clock the Lease has most of its duration left, but a coordinator recorded the departure.
        let recorded = MemberLease {
            member: "a".into(),
            holder: "a".into(),
            renewal_seen_ms: 99_000,
            duration_ms: 15_000,
            successors: Some(members(&["b"])),
            version: "7".into(),
        };
        let b = MemberLease {
            member: "b".into(),
            holder: "b".into(),
            successors: None,
            ..recorded.clone()
        };
        let view = ShardView::of(&[recorded.clone(), b.clone()], 100_000);
        assert_eq!(view.live, members(&["b"]));
        assert_eq!(view.departed, members(&["a"]));
        assert_eq!(view.takeovers.get("a"), Some(&members(&["b"])));
        // So no key goes to it, and it is no successor of a member departing after it.
        let key = ShardKey::Namespace("clusters-x".into());
        assert_eq!(
            view.worker(&key, Some(&"a".to_owned())),
            Some(&"b".to_owned())
        );
        assert_eq!(
            coordinate(&key, &[Placement::default()], &view),
            [Some(LabelAction::Assign("b".into()))]
        );
        assert_eq!(live_members(&[recorded, b], 100_000), members(&["b"]));
    }

    #[test]
    fn a_chain_of_take_overs_needs_every_record_up_to_the_live_worker() {
        let view = ShardView {
            live: members(&["c"]),
            departed: members(&["a", "b", "x"]),
            takeovers: [
                ("a".to_owned(), members(&["b"])),
                ("b".to_owned(), members(&["c"])),
                ("x".to_owned(), members(&["c"])),
            ]
            .into(),
            ..ShardView::default()
        };
        let key = ShardKey::Namespace("clusters-x".into());
        let (a, b, c) = ("a".to_owned(), "b".to_owned(), "c".to_owned());
        assert_eq!(view.records_needed(&key, &a), [&a, &b]);
        assert_eq!(view.records_needed(&key, &b), [&b]);
        assert!(view.records_needed(&key, &c).is_empty());
        // Unrecorded: the holder's own Lease is needed (its record is still to come).
        let unrecorded = ShardView {
            takeovers: BTreeMap::new(),
            ..view.clone()
        };
        assert_eq!(unrecorded.records_needed(&key, &a), [&a]);
    }

    #[test]
    fn a_departed_members_keys_are_worked_on_by_its_successors_before_any_relabel() {
        let view = ShardView {
            live: members(&["b", "c"]),
            departed: members(&["a"]),
            takeovers: [("a".to_owned(), members(&["b", "c"]))].into(),
            ..ShardView::default()
        };
        let a = "a".to_owned();
        let mut workers: BTreeMap<Member, usize> = BTreeMap::new();
        for key in keys(100) {
            let worker = view
                .worker(&key, Some(&a))
                .unwrap_or_else(|| unreachable!("every key has a successor"));
            assert_eq!(Some(worker), owner(&key, &view.live));
            assert!(works_on(worker, &key, &held("a", false), &view));
            // Relabelling it for its worker is all the coordinator does: no drain, no gap.
            assert_eq!(
                coordinate(&key, &[held("a", false)], &view),
                [Some(LabelAction::Follow(worker.clone()))]
            );
            *workers.entry(worker.clone()).or_default() += 1;
        }
        assert_eq!(workers.len(), 2, "{workers:?}");
        // Unrecorded, nobody works on them; a successor that departed in turn hands on through its own
        // record.
        let unrecorded = ShardView {
            takeovers: BTreeMap::new(),
            ..view.clone()
        };
        let key = ShardKey::Namespace("clusters-x".into());
        assert_eq!(unrecorded.worker(&key, Some(&a)), None);
        let chained = ShardView {
            live: members(&["d"]),
            departed: members(&["a", "b", "c"]),
            takeovers: [
                ("a".to_owned(), members(&["b", "c"])),
                ("b".to_owned(), members(&["c", "d"])),
                ("c".to_owned(), members(&["d"])),
            ]
            .into(),
            ..ShardView::default()
        };
        assert_eq!(chained.worker(&key, Some(&a)), Some(&"d".to_owned()));
        // A corrupt record naming each other does not spin.
        let looped = ShardView {
            live: members(&["z"]),
            departed: members(&["a", "b"]),
            takeovers: [
                ("a".to_owned(), members(&["b"])),
                ("b".to_owned(), members(&["a"])),
            ]
            .into(),
            ..ShardView::default()
        };
        assert_eq!(looped.worker(&key, Some(&a)), None);
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
        let before = ShardView::live(members(&["a"]));
        let after = ShardView::live(members(&["a", &newcomer]));
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
        assert!(!works_on("a", &key, &draining[0], &after));
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
        let without_a = ShardView::live([newcomer.clone()].into());
        assert_eq!(
            coordinate(&key, &objects, &without_a),
            [assign.clone(), assign.clone(), assign]
        );
        // Nobody to assign to.
        assert_eq!(
            coordinate(&key, &objects, &ShardView::default()),
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
        /// The coordinator records who takes over the departed members.
        Record,
        /// The coordinator removes the Leases of departed members no object is labelled for.
        Retire,
        Create(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => Just(Step::Coordinate),
            3 => (0usize..8).prop_map(Step::Release),
            1 => "[a-z]{1,6}-[0-9]{1,2}".prop_map(Step::Join),
            1 => (0usize..8).prop_map(Step::Expire),
            2 => Just(Step::Record),
            1 => Just(Step::Retire),
            2 => (0usize..KEYS).prop_map(Step::Create),
        ]
    }

    const KEYS: usize = 12;

    /// Each key's objects.
    type World = BTreeMap<ShardKey, Vec<Placement>>;

    /// Applies the coordinator's actions; returns the objects whose label moved away from a member that
    /// worked on them (it would keep working until it saw the label change: two at once).
    fn coordinate_all(view: &ShardView, world: &mut World) -> Vec<String> {
        let mut taken_from_a_worker = Vec::new();
        for (key, objects) in world.iter_mut() {
            let actions = coordinate(key, objects, view);
            for (object, action) in objects.iter_mut().zip(actions) {
                match action {
                    None => {}
                    Some(LabelAction::Drain) => object.draining = true,
                    Some(LabelAction::Assign(member) | LabelAction::Follow(member)) => {
                        let worker = view.worker(key, object.holder.as_ref());
                        if worker.is_some_and(|w| *w != member) && !object.draining {
                            taken_from_a_worker.push(format!("{key:?}: {object:?} -> {member}"));
                        }
                        *object = Placement {
                            holder: Some(member),
                            draining: false,
                        }
                    }
                }
            }
        }
        taken_from_a_worker
    }

    /// `member` lets go of what it was asked to drain.
    fn release_all(member: &str, view: &ShardView, world: &mut World) {
        for (key, objects) in world.iter_mut() {
            for object in objects {
                if drained(member, key, object, view) {
                    *object = release(object);
                }
            }
        }
    }

    fn record(view: &mut ShardView) {
        let unrecorded: Vec<Member> = view.unrecorded_departures().cloned().collect();
        for member in unrecorded {
            view.takeovers.insert(member, view.live.clone());
        }
    }

    /// The coordinator's rule: a departed member's Lease goes once no object needs its record.
    fn retire(view: &mut ShardView, world: &World) {
        let needed: BTreeSet<Member> = world
            .iter()
            .flat_map(|(key, objects)| {
                objects
                    .iter()
                    .filter_map(|o| o.holder.as_ref())
                    .flat_map(|holder| view.records_needed(key, holder))
            })
            .cloned()
            .collect();
        let retired: Vec<Member> = view
            .departed
            .iter()
            .filter(|m| view.takeovers.contains_key(*m) && !needed.contains(*m))
            .cloned()
            .collect();
        for member in retired {
            view.departed.remove(&member);
            view.takeovers.remove(&member);
        }
    }

    /// Each object's worker.
    fn workers(view: &ShardView, world: &World) -> Vec<Option<Member>> {
        world
            .iter()
            .flat_map(|(key, objects)| {
                objects
                    .iter()
                    .map(|o| view.worker(key, o.holder.as_ref()).cloned())
            })
            .collect()
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
            let mut view = ShardView::live(initial);
            let mut world: World = keys.iter().map(|k| (k.clone(), vec![Placement::default()])).collect();
            for step in steps {
                match step {
                    Step::Coordinate => {
                        let moved = coordinate_all(&view, &mut world);
                        prop_assert!(moved.is_empty(), "relabelled under a worker: {moved:?}");
                    }
                    Step::Release(i) => {
                        if let Some(member) = view.live.iter().nth(i % view.live.len().max(1)).cloned() {
                            release_all(&member, &view, &mut world);
                        }
                    }
                    // Member names are one process's: a departed member never joins again.
                    Step::Join(name) => {
                        if !view.departed.contains(&name) {
                            view.live.insert(name);
                        }
                    }
                    Step::Expire(i) => {
                        if view.live.len() > 1 {
                            if let Some(member) = view.live.iter().nth(i % view.live.len()).cloned() {
                                view.live.remove(&member);
                                view.departed.insert(member);
                            }
                        }
                    }
                    Step::Record => record(&mut view),
                    Step::Retire => {
                        // A replica's feed sees no event when a record goes: retiring one must not
                        // change any object's worker, or the coordinator labels it for another while
                        // the successor still works on it.
                        let before = workers(&view, &world);
                        retire(&mut view, &world);
                        prop_assert_eq!(workers(&view, &world), before, "{:?}", view);
                    }
                    Step::Create(k) => {
                        if let Some(objects) = world.get_mut(&keys[k]) {
                            objects.push(Placement::default());
                        }
                    }
                }
                for (key, objects) in &world {
                    let working: BTreeSet<&Member> = view
                        .live
                        .iter()
                        .filter(|m| objects.iter().any(|o| works_on(m, key, o, &view)))
                        .collect();
                    prop_assert!(working.len() <= 1, "{key:?} worked on by {working:?}");
                    // Once recorded, a departed member's objects have a live worker at once.
                    for object in objects {
                        let recorded_chain = object.holder.as_ref().is_some_and(|h| {
                            view.takeovers.contains_key(h)
                                && view.takeovers.values().flatten().all(|s| {
                                    view.live.contains(s) || view.takeovers.contains_key(s)
                                })
                        });
                        if recorded_chain && !object.draining {
                            prop_assert!(view.worker(key, object.holder.as_ref()).is_some(), "{key:?}: {object:?} in {view:?}");
                        }
                    }
                }
            }
            // Settle: the coordinator and every live replica do their part until nothing changes.
            record(&mut view);
            for _ in 0..4 {
                prop_assert!(coordinate_all(&view, &mut world).is_empty());
                for member in view.live.clone() {
                    release_all(&member, &view, &mut world);
                }
            }
            prop_assert!(coordinate_all(&view, &mut world).is_empty());
            retire(&mut view, &world);
            prop_assert!(view.departed.is_empty(), "{view:?}");
            for (key, objects) in &world {
                let wanted = owner(key, &view.live);
                for object in objects {
                    prop_assert_eq!(object.holder.as_ref(), wanted);
                    prop_assert!(wanted.is_some_and(|w| works_on(w, key, object, &view)));
                }
            }
        }
    }
}

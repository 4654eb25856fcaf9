//! The independent judge of a chaos run: rollout invariants decided from what the observer's own Package
//! watches saw, in each apiserver's order, with no pko code in the judgement. Pure: the observer feeds it
//! and the run prints what it found.
//!
//! What it holds pko to, per management cluster:
//! - **budget**: Packages updated to a template and not yet live on it never exceed maxUnavailable
//!   (Packages created for a new HostedCluster, ones updated while not live already, and ones that were
//!   live on their template and then broke, are not pko's doing and are left out);
//! - **containment**: a release broken on the canary HostedCluster never reaches another Package;
//! - **gate**: a release reaches the gated cluster only after the canary cluster had every Package live on
//!   it;
//! - **convergence** (at the end): every Package live on the final release, none left for a HostedCluster
//!   that left.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// One look at a Package, as a watch delivered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageSeen {
    /// When the observer saw it, from the run's start.
    pub at: Duration,
    pub cluster: usize,
    pub namespace: String,
    /// Its template's release; `None`: the Package is gone.
    pub release: Option<String>,
    /// Available=True and Progressing=False for its generation.
    pub live: bool,
    /// Delivered by a watch's (re-)list: changes in the gap are collapsed, so no transition is judged.
    pub listed: bool,
}

/// What the judge knows of the run besides the watches.
#[derive(Debug, Clone)]
pub struct Rules {
    pub max_unavailable: usize,
    /// (cluster, HCP namespace) of the canary HostedCluster, the one place a broken release may go.
    pub canary: (usize, String),
    /// The cluster whose rollouts are gated on the canary cluster (`gated.1`) finishing.
    pub gated: Option<(usize, usize)>,
}

/// A broken invariant, with the history around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub at: Duration,
    pub invariant: &'static str,
    pub what: String,
    pub history: Vec<String>,
}

#[derive(Debug, Clone, Default)]
struct PackageState {
    release: String,
    live: bool,
    /// Live on `release` since it last changed.
    was_live: bool,
    /// Created on `release` (a new HostedCluster's Package: not an update the budget covers).
    created: bool,
    /// Not live when it was updated to `release`: the update took nothing away that was there, so it costs
    /// no budget (pko updates such Packages first, for free).
    disrupted_before: bool,
}

impl std::fmt::Display for Violation {
    /// The invariant, when and what, then the observations before it, one per line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} at {:.1} s: {}\n      {}",
            self.invariant,
            self.at.as_secs_f64(),
            self.what,
            self.history.join("\n      ")
        )
    }
}

/// What became of the broken releases: set, taken by the canary, rolled back (after how long), or left
/// for a later release first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackTally {
    pub broken: usize,
    pub reached: usize,
    pub rolled_back: Vec<Duration>,
    pub superseded: usize,
}

/// How long the canary may run a broken release before it must have been rolled back: the failure shows
/// within seconds, but a fault may hold the replica supervising it for a Lease and more.
const ROLLBACK_BOUND: Duration = Duration::from_secs(120);

/// Last observations kept to explain a violation.
const HISTORY: usize = 12;

/// Consumes observations in each cluster's order and records what breaks an invariant.
#[derive(Debug)]
pub struct Judge {
    rules: Rules,
    broken: BTreeSet<String>,
    packages: BTreeMap<usize, BTreeMap<String, PackageState>>,
    /// Releases every Package of a cluster was seen live on at once.
    finished: BTreeMap<usize, BTreeSet<String>>,
    /// Broken releases the canary Package took, and when it first showed them.
    reached: BTreeMap<String, Duration>,
    /// How long after that the canary Package went back to an earlier release (rolled back), per release.
    rolled_back: BTreeMap<String, Duration>,
    /// Broken releases the canary Package left for a later release before any rollback.
    superseded: BTreeSet<String>,
    releases: Vec<String>,
    /// HCP namespaces whose HostedCluster the run deleted: their Packages are pko's to remove.
    left: BTreeSet<(usize, String)>,
    /// Releases that reached the gated cluster before the observer saw the canary cluster finish them.
    gate_checks: Vec<(Duration, usize, String, String)>,
    /// When each Package was first seen live on a release.
    first_live: BTreeMap<(usize, String, String), Duration>,
    recent: Vec<String>,
    pub violations: Vec<Violation>,
}

impl Judge {
    pub fn new(rules: Rules) -> Self {
        Self {
            rules,
            broken: BTreeSet::new(),
            packages: BTreeMap::new(),
            finished: BTreeMap::new(),
            reached: BTreeMap::new(),
            rolled_back: BTreeMap::new(),
            superseded: BTreeSet::new(),
            releases: Vec::new(),
            left: BTreeSet::new(),
            gate_checks: Vec::new(),
            first_live: BTreeMap::new(),
            recent: Vec::new(),
            violations: Vec::new(),
        }
    }

    /// A release is about to be set; `broken`: it fails on the canary HostedCluster.
    pub fn release(&mut self, name: &str, broken: bool) {
        self.releases.push(name.to_owned());
        if broken {
            self.broken.insert(name.to_owned());
        }
    }

    /// The run deleted the HostedCluster of `namespace`.
    pub fn left(&mut self, cluster: usize, namespace: &str) {
        self.left.insert((cluster, namespace.to_owned()));
    }

    pub fn observe(&mut self, seen: PackageSeen) {
        self.remember(&seen);
        let PackageSeen {
            at,
            cluster,
            namespace,
            release,
            live,
            listed,
        } = seen;
        let packages = self.packages.entry(cluster).or_default();
        let Some(release) = release else {
            packages.remove(&namespace);
            return;
        };
        let previous = packages.get(&namespace).cloned();
        let changed = previous.as_ref().is_none_or(|p| p.release != release);
        let state = PackageState {
            live,
            was_live: live || (!changed && previous.as_ref().is_some_and(|p| p.was_live)),
            created: match &previous {
                None => true,
                Some(p) => p.created && !changed,
            },
            disrupted_before: match &previous {
                Some(p) if changed => !p.live,
                Some(p) => p.disrupted_before,
                None => false,
            },
            release: release.clone(),
        };
        packages.insert(namespace.clone(), state);
        if live {
            self.first_live
                .entry((cluster, namespace.clone(), release.clone()))
                .or_insert(at);
        }
        if self.broken.contains(&release) && (cluster, namespace.clone()) != self.rules.canary {
            self.violate(
                at,
                "containment",
                format!("broken release {release} reached {namespace} in cluster {cluster}"),
            );
        }
        self.check_rollbacks(at);
        if changed {
            self.note_rollback(
                at,
                (cluster, &namespace),
                previous.map(|p| p.release),
                &release,
            );
            if let Some((gated, canary)) = self.rules.gated {
                let canary_finished = self
                    .finished
                    .get(&canary)
                    .is_some_and(|f| f.contains(&release));
                if cluster == gated && !canary_finished && !listed {
                    self.pending_gate(at, cluster, &namespace, &release);
                }
            }
        }
        if changed && !listed {
            let in_flight = self.in_flight(cluster);
            if in_flight.len() > self.rules.max_unavailable {
                self.violate(
                    at,
                    "budget",
                    format!(
                        "cluster {cluster}: {} Packages updated and not live (maxUnavailable {}): {}",
                        in_flight.len(),
                        self.rules.max_unavailable,
                        in_flight.join(", ")
                    ),
                );
            }
        }
        self.note_finished(cluster);
    }

    /// The gate is judged at the end: the canary cluster may still finish the release later in the
    /// observer's view (its watch may lag the hub the gated manager reads).
    fn pending_gate(&mut self, at: Duration, cluster: usize, namespace: &str, release: &str) {
        self.gate_checks
            .push((at, cluster, namespace.to_owned(), release.to_owned()));
    }

    /// Follows the canary Package onto and off broken releases.
    fn note_rollback(
        &mut self,
        at: Duration,
        (cluster, namespace): (usize, &str),
        from: Option<String>,
        to: &str,
    ) {
        if (cluster, namespace.to_owned()) != self.rules.canary {
            return;
        }
        if self.broken.contains(to) {
            self.reached.entry(to.to_owned()).or_insert(at);
        }
        let Some(from) = from.filter(|f| self.broken.contains(f)) else {
            return;
        };
        let order = |r: &str| self.releases.iter().position(|x| x == r);
        if order(to) < order(&from) {
            let since = self.reached.get(&from).copied().unwrap_or(at);
            self.rolled_back.insert(from, at.saturating_sub(since));
        } else {
            self.superseded.insert(from);
        }
    }

    /// A broken release the canary Package still shows `ROLLBACK_BOUND` after it took it was not rolled
    /// back (maxFailures 0 and automatic rollback promise it).
    fn check_rollbacks(&mut self, at: Duration) {
        let canary = self.rules.canary.clone();
        let Some(current) = self
            .packages
            .get(&canary.0)
            .and_then(|p| p.get(&canary.1))
            .map(|p| p.release.clone())
        else {
            return;
        };
        let Some(since) = self.reached.get(&current).copied() else {
            return;
        };
        let overdue = at.saturating_sub(since) > ROLLBACK_BOUND;
        let told = self
            .violations
            .iter()
            .any(|v| v.invariant == "rollback" && v.what.contains(&format!(" {current} ")));
        if overdue && !told {
            self.violate(
                at,
                "rollback",
                format!(
                    "the canary still runs broken release {current} {:.0} s after taking it",
                    at.saturating_sub(since).as_secs_f64()
                ),
            );
        }
    }

    /// The Packages of `cluster` whose HostedCluster is still there.
    fn staying(&self, cluster: usize) -> impl Iterator<Item = (&String, &PackageState)> {
        self.packages
            .get(&cluster)
            .into_iter()
            .flatten()
            .filter(move |(ns, _)| !self.left.contains(&(cluster, (*ns).clone())))
    }

    fn note_finished(&mut self, cluster: usize) {
        let everywhere = {
            let mut releases = self.staying(cluster).map(|(_, p)| (&p.release, p.live));
            match releases.next() {
                Some((release, true)) => releases
                    .all(|(r, live)| r == release && live)
                    .then(|| release.clone()),
                _ => None,
            }
        };
        if let Some(release) = everywhere {
            self.finished.entry(cluster).or_default().insert(release);
        }
    }

    fn in_flight(&self, cluster: usize) -> Vec<String> {
        self.staying(cluster)
            .filter(|(_, p)| !p.live && !p.was_live && !p.created && !p.disrupted_before)
            .map(|(ns, p)| format!("{ns} ({})", p.release))
            .collect()
    }

    /// The end of the run: the gate checks still open, and convergence on `final_release` for the
    /// HostedClusters each cluster has now (`expected`: cluster → HCP namespaces). Returns, per Package,
    /// the time from `quiet_from` (the last fault's end, or the final release if later) to live on it.
    pub fn finish(
        &mut self,
        at: Duration,
        final_release: &str,
        quiet_from: Duration,
        expected: &BTreeMap<usize, BTreeSet<String>>,
    ) -> Vec<Duration> {
        self.check_rollbacks(at);
        for (seen_at, cluster, namespace, release) in std::mem::take(&mut self.gate_checks) {
            let canary = self
                .rules
                .gated
                .map(|(_, canary)| canary)
                .unwrap_or_default();
            if !self
                .finished
                .get(&canary)
                .is_some_and(|f| f.contains(&release))
            {
                self.violate(
                    seen_at,
                    "gate",
                    format!("{release} reached {namespace} in cluster {cluster}, and cluster {canary} never had it live everywhere"),
                );
            }
        }
        let mut times = Vec::new();
        for (cluster, namespaces) in expected {
            let packages = self.packages.get(cluster).cloned().unwrap_or_default();
            for namespace in namespaces {
                match packages.get(namespace) {
                    Some(p) if p.live && p.release == final_release => {
                        let key = (*cluster, namespace.clone(), final_release.to_owned());
                        let live_at = self.first_live.get(&key).copied().unwrap_or(at);
                        times.push(live_at.saturating_sub(quiet_from));
                    }
                    other => self.violate(
                        at,
                        "convergence",
                        format!(
                            "cluster {cluster} {namespace}: {other:?}, not live on {final_release}"
                        ),
                    ),
                }
            }
            for namespace in packages.keys().filter(|ns| !namespaces.contains(*ns)) {
                self.violate(
                    at,
                    "leftover",
                    format!("cluster {cluster}: Package in {namespace} outlived its HostedCluster"),
                );
            }
        }
        times
    }

    /// The expected Packages not live on `release` now, for waiting on convergence.
    pub fn not_live_on(
        &self,
        expected: &BTreeMap<usize, BTreeSet<String>>,
        release: &str,
    ) -> Vec<String> {
        expected
            .iter()
            .flat_map(|(cluster, namespaces)| namespaces.iter().map(move |ns| (*cluster, ns)))
            .filter(|(cluster, ns)| {
                !self
                    .packages
                    .get(cluster)
                    .and_then(|p| p.get(*ns))
                    .is_some_and(|p| p.live && p.release == release)
            })
            .map(|(cluster, ns)| format!("{cluster}/{ns}"))
            .collect()
    }

    /// What became of the broken releases.
    pub fn rollbacks(&self) -> RollbackTally {
        RollbackTally {
            broken: self.broken.len(),
            reached: self.reached.len(),
            rolled_back: self.rolled_back.values().copied().collect(),
            superseded: self.superseded.len(),
        }
    }

    fn remember(&mut self, seen: &PackageSeen) {
        if self.recent.len() == HISTORY {
            self.recent.remove(0);
        }
        self.recent.push(format!(
            "{:>8.1}s cluster {} {}: {}{}{}",
            seen.at.as_secs_f64(),
            seen.cluster,
            seen.namespace,
            seen.release.as_deref().unwrap_or("(gone)"),
            if seen.live { " live" } else { "" },
            if seen.listed { " (listed)" } else { "" },
        ));
    }

    /// Records a violation, once: the same finding seen again (each event of one Package) adds nothing.
    fn violate(&mut self, at: Duration, invariant: &'static str, what: String) {
        if self
            .violations
            .iter()
            .any(|v| v.invariant == invariant && v.what == what)
        {
            return;
        }
        self.violations.push(Violation {
            at,
            invariant,
            what,
            history: self.recent.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules {
            max_unavailable: 1,
            canary: (0, "c-canary".into()),
            gated: Some((1, 0)),
        }
    }

    fn seen(at: u64, cluster: usize, namespace: &str, release: &str, live: bool) -> PackageSeen {
        PackageSeen {
            at: Duration::from_secs(at),
            cluster,
            namespace: namespace.into(),
            release: Some(release.into()),
            live,
            listed: false,
        }
    }

    fn invariants(judge: &Judge) -> Vec<&'static str> {
        judge.violations.iter().map(|v| v.invariant).collect()
    }

    #[test]
    fn two_updates_in_flight_break_a_budget_of_one_and_new_or_broken_packages_do_not_count() {
        let mut judge = Judge::new(rules());
        judge.release("r1", false);
        for ns in ["a", "b", "c"] {
            judge.observe(seen(1, 0, ns, "r1", false));
        }
        // Created on r1: not updates, nothing is in flight.
        assert!(judge.violations.is_empty());
        for ns in ["a", "b", "c"] {
            judge.observe(seen(2, 0, ns, "r1", true));
        }
        judge.release("r2", false);
        judge.observe(seen(3, 0, "a", "r2", false));
        // a was live on r1 and broke: not pko's update.
        judge.observe(seen(3, 0, "c", "r1", false));
        assert!(judge.violations.is_empty(), "{:?}", judge.violations);
        // c was not live when it got r2: updating it took nothing away.
        judge.observe(seen(4, 0, "c", "r2", false));
        assert!(judge.violations.is_empty(), "{:?}", judge.violations);
        judge.observe(seen(4, 0, "b", "r2", false));
        assert_eq!(invariants(&judge), ["budget"]);
        assert!(judge.violations[0].what.contains("a (r2), b (r2)"));
        assert_eq!(judge.violations[0].history.len(), 10);
    }

    #[test]
    fn a_relist_judges_no_transition_and_a_deleted_package_leaves_the_count() {
        let mut judge = Judge::new(rules());
        judge.release("r1", false);
        judge.observe(seen(1, 0, "a", "r1", true));
        judge.observe(seen(1, 0, "b", "r1", true));
        judge.release("r2", false);
        judge.observe(seen(2, 0, "a", "r2", false));
        judge.observe(PackageSeen {
            listed: true,
            ..seen(3, 0, "b", "r2", false)
        });
        assert!(judge.violations.is_empty());
        judge.observe(PackageSeen {
            release: None,
            ..seen(4, 0, "b", "", false)
        });
        judge.release("r3", false);
        judge.observe(seen(5, 0, "a", "r3", false));
        assert!(judge.violations.is_empty(), "{:?}", judge.violations);
    }

    #[test]
    fn a_broken_release_stays_on_the_canary_and_its_rollback_is_counted() {
        let mut judge = Judge::new(rules());
        judge.release("r1", false);
        judge.observe(seen(1, 0, "c-canary", "r1", true));
        judge.observe(seen(1, 0, "b", "r1", true));
        judge.release("r2", true);
        judge.observe(seen(2, 0, "c-canary", "r2", false));
        assert!(judge.violations.is_empty());
        judge.observe(seen(3, 0, "c-canary", "r1", true));
        let tally = judge.rollbacks();
        assert_eq!((tally.broken, tally.reached, tally.superseded), (1, 1, 0));
        assert_eq!(tally.rolled_back, [Duration::from_secs(1)]);
        judge.observe(seen(4, 0, "b", "r2", false));
        judge.observe(seen(4, 1, "p", "r2", false));
        assert_eq!(invariants(&judge), ["containment", "containment"]);
    }

    #[test]
    fn a_broken_release_the_canary_keeps_past_the_bound_is_a_missed_rollback() {
        let mut judge = Judge::new(rules());
        judge.release("r1", false);
        judge.observe(seen(1, 0, "c-canary", "r1", true));
        judge.release("r2", true);
        judge.observe(seen(10, 0, "c-canary", "r2", false));
        judge.observe(seen(100, 0, "b", "r1", true));
        assert!(judge.violations.is_empty());
        judge.observe(seen(131, 0, "b", "r1", true));
        judge.observe(seen(140, 0, "b", "r1", true));
        assert_eq!(invariants(&judge), ["rollback"]);
        // A later release taking over is no rollback, and no violation either.
        judge.release("r3", false);
        judge.observe(seen(141, 0, "c-canary", "r3", false));
        assert_eq!(judge.rollbacks().superseded, 1);
    }

    #[test]
    fn the_gated_cluster_follows_only_what_the_canary_cluster_finished() {
        let mut judge = Judge::new(rules());
        judge.release("r1", false);
        judge.observe(seen(1, 0, "c-canary", "r1", false));
        judge.observe(seen(1, 0, "b", "r1", true));
        // Seen on the gated cluster before the canary cluster finished in the observer's view: judged
        // at the end, when it has.
        judge.observe(seen(2, 1, "p", "r1", false));
        judge.observe(seen(3, 0, "c-canary", "r1", true));
        judge.release("r2", false);
        judge.observe(seen(4, 1, "p", "r2", false));
        let expected = BTreeMap::from([
            (0, BTreeSet::from(["c-canary".to_owned(), "b".to_owned()])),
            (1, BTreeSet::from(["p".to_owned()])),
        ]);
        judge.finish(Duration::from_secs(9), "r1", Duration::ZERO, &expected);
        assert_eq!(invariants(&judge), ["gate", "convergence"]);
        assert!(judge.violations[0].what.contains("r2"));
    }

    #[test]
    fn convergence_times_count_from_the_quiet_start_and_leftovers_are_named() {
        let mut judge = Judge::new(rules());
        judge.release("r1", false);
        judge.observe(seen(10, 0, "a", "r1", true));
        judge.observe(seen(14, 0, "b", "r1", true));
        judge.observe(seen(15, 0, "gone", "r1", true));
        judge.left(0, "gone");
        let expected = BTreeMap::from([(0, BTreeSet::from(["a".to_owned(), "b".to_owned()]))]);
        let times = judge.finish(
            Duration::from_secs(20),
            "r1",
            Duration::from_secs(12),
            &expected,
        );
        assert_eq!(times, [Duration::ZERO, Duration::from_secs(2)]);
        assert_eq!(invariants(&judge), ["leftover"]);
    }
}

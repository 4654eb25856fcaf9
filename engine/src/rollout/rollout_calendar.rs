//! When a rollout may touch each HostedCluster: the policy's maintenance windows, the one a HostedCluster
//! names (or the default), and the HostedClusters left out until an expiry. Per decision it says which
//! targets are inside their window now, how much open time has passed since an instant (what deadlines
//! and soaks count), when the next window of a waiting group opens, and when to decide again.
//!
//! Pure: no I/O, no clock (`now` is given). The window arithmetic is `engine::rollout::maintenance_window`'s;
//! what the planner does with a closed window is `engine::rollout::rollout_plan`'s.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use pko_proto::core::hosted_cluster_package::{
    HostedClusterPackagePartitionStatus, HostedClusterPackageRolloutPolicy,
};
use pko_proto::core::rollout_calendar::HostedClusterPackageSkippedStatus;
use pko_proto::hypershift::HostedCluster;
use pko_proto::well_known::MAINTENANCE_WINDOW_LABEL;

use crate::api_time::stamp;
use crate::label_selector::selector_matches;
use crate::rollout::maintenance_window::{next_change, open_time, MaintenanceWindow};
use crate::rollout::rollout_guard::group_state;
use crate::rollout::rollout_plan::{group_key, RolloutInput, RolloutPlan};

/// The calendar part of `spec.rolloutPolicy`, checked.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CalendarPolicy {
    pub windows: Vec<MaintenanceWindow>,
    /// Index into `windows` of the window of HostedClusters that name none.
    pub default_window: Option<usize>,
    pub skips: Vec<SkipRule>,
}

/// HostedClusters left out until `until`.
#[derive(Debug, Clone, PartialEq)]
pub struct SkipRule {
    pub namespaces: BTreeSet<String>,
    pub selector: Option<LabelSelector>,
    pub until: Timestamp,
    pub reason: String,
}

/// The window a HostedCluster is updated in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowChoice {
    /// No window applies: any time.
    Always,
    /// Index into the policy's windows.
    Window(usize),
    /// It names a window the policy does not define: never, until the policy or the label changes (a
    /// cluster's owner asked for a window; guessing another would break that promise).
    Unknown(String),
}

/// Checks the windows and skips of `spec.rolloutPolicy`; errors name the field.
pub fn calendar_policy(
    spec: Option<&HostedClusterPackageRolloutPolicy>,
) -> Result<CalendarPolicy, String> {
    let Some(spec) = spec else {
        return Ok(CalendarPolicy::default());
    };
    let field = "spec.rolloutPolicy";
    let mut windows: Vec<MaintenanceWindow> = Vec::new();
    for (i, w) in spec.maintenance_windows.iter().enumerate() {
        let at = format!("{field}.maintenanceWindows[{i}]");
        let window = MaintenanceWindow::parse(w, &at)?;
        if windows.iter().any(|known| known.name == window.name) {
            return Err(format!("{at}.name: {:?} is listed twice", window.name));
        }
        windows.push(window);
    }
    let default_window = match &spec.default_maintenance_window {
        None => None,
        Some(name) => Some(windows.iter().position(|w| w.name == *name).ok_or_else(|| {
            format!("{field}.defaultMaintenanceWindow: {name:?} is not one of maintenanceWindows")
        })?),
    };
    let skips = spec
        .skip
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let at = format!("{field}.skip[{i}]");
            if s.namespaces.is_empty() && s.selector.is_none() {
                return Err(format!("{at}: set namespaces, selector or both"));
            }
            if s.reason.trim().is_empty() {
                return Err(format!("{at}.reason: must not be empty"));
            }
            if let Some(selector) = &s.selector {
                selector_matches(selector, &BTreeMap::new())
                    .map_err(|e| format!("{at}.selector.{e}"))?;
            }
            let until = s.until.parse::<Timestamp>().map_err(|_| {
                format!(
                    "{at}.until: want an RFC 3339 time such as 2026-12-01T06:00:00Z, got {:?}",
                    s.until
                )
            })?;
            Ok(SkipRule {
                namespaces: s.namespaces.iter().cloned().collect(),
                selector: s.selector.clone(),
                until,
                reason: s.reason.clone(),
            })
        })
        .collect::<Result<_, String>>()?;
    Ok(CalendarPolicy {
        windows,
        default_window,
        skips,
    })
}

impl CalendarPolicy {
    /// The window `cluster` is updated in: the one its label names, else the default, else any time.
    pub fn window_of(&self, cluster: &HostedCluster) -> WindowChoice {
        let named = cluster
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(MAINTENANCE_WINDOW_LABEL));
        match (named, self.default_window) {
            (Some(name), _) => match self.windows.iter().position(|w| w.name == *name) {
                Some(i) => WindowChoice::Window(i),
                None => WindowChoice::Unknown(name.clone()),
            },
            (None, Some(i)) => WindowChoice::Window(i),
            (None, None) => WindowChoice::Always,
        }
    }

    /// The skip that leaves `cluster` (in HCP namespace `namespace`) out at `now`, if any; of several,
    /// the one that lasts longest.
    pub fn skip_of(
        &self,
        namespace: &str,
        cluster: &HostedCluster,
        now: Timestamp,
    ) -> Option<&SkipRule> {
        let no_labels = BTreeMap::new();
        let labels = cluster.metadata.labels.as_ref().unwrap_or(&no_labels);
        self.skips
            .iter()
            .filter(|s| now < s.until)
            .filter(|s| {
                s.namespaces.contains(namespace)
                    || s.selector
                        .as_ref()
                        .is_some_and(|sel| selector_matches(sel, labels).unwrap_or(false))
            })
            .max_by_key(|s| s.until)
    }
}

/// The calendar of one decision at `now`: each target's window.
#[derive(Debug, Clone)]
pub struct RolloutCalendar<'a> {
    policy: &'a CalendarPolicy,
    now: Timestamp,
    /// By window index: whether it is open now, and when it next opens. Worked out once per decision,
    /// not once per target that names the window.
    open_now: Vec<bool>,
    next_starts: Vec<Option<Timestamp>>,
    windows: BTreeMap<String, WindowChoice>,
    /// The HostedClusters left out now, by namespace.
    pub skipped: Vec<HostedClusterPackageSkippedStatus>,
    /// Of them, those whose Package is not on the template rolled out: until they are, the template has
    /// not finished rolling out everywhere (`status.lastSucceeded`, what a rollback returns to).
    pub outstanding: usize,
}

impl<'a> RolloutCalendar<'a> {
    pub fn new(policy: &'a CalendarPolicy, now: Timestamp) -> Self {
        Self {
            policy,
            now,
            open_now: policy
                .windows
                .iter()
                .map(|w| w.open_until(now).is_some())
                .collect(),
            next_starts: policy.windows.iter().map(|w| w.next_start(now)).collect(),
            windows: BTreeMap::new(),
            skipped: Vec::new(),
            outstanding: 0,
        }
    }

    /// Places `cluster` (its HCP namespace `namespace`): `false` when it is left out now (and listed in
    /// `skipped`), else its window is noted. A cluster naming a window the policy does not define is
    /// left out as a skip is, not held in its group: its owner's label must not hold other clusters'
    /// rollout, and the listing (with its alert) tells whoever can fix the label or the policy.
    pub fn place(&mut self, namespace: &str, cluster: &HostedCluster) -> bool {
        if let Some(skip) = self.policy.skip_of(namespace, cluster, self.now) {
            self.skipped.push(HostedClusterPackageSkippedStatus {
                namespace: namespace.to_owned(),
                until: Some(stamp(skip.until)),
                reason: skip.reason.clone(),
            });
            return false;
        }
        let choice = self.policy.window_of(cluster);
        if let WindowChoice::Unknown(name) = &choice {
            self.skipped.push(HostedClusterPackageSkippedStatus {
                namespace: namespace.to_owned(),
                until: None,
                reason: format!(
                    "its label {MAINTENANCE_WINDOW_LABEL} names maintenance window {name:?}, which \
                     spec.rolloutPolicy.maintenanceWindows does not define"
                ),
            });
        }
        self.windows.insert(namespace.to_owned(), choice);
        !matches!(self.windows.get(namespace), Some(WindowChoice::Unknown(_)))
    }

    /// The instant this calendar is for.
    pub fn now(&self) -> Timestamp {
        self.now
    }

    fn choice(&self, namespace: &str) -> &WindowChoice {
        self.windows.get(namespace).unwrap_or(&WindowChoice::Always)
    }

    /// Whether `namespace`'s window is open now.
    pub fn is_open(&self, namespace: &str) -> bool {
        match self.choice(namespace) {
            WindowChoice::Always => true,
            WindowChoice::Window(i) => self.open_now[*i],
            WindowChoice::Unknown(_) => false,
        }
    }

    /// The distinct windows of `namespaces`, and whether one of them may be updated at any time.
    fn windows_of<'n>(
        &self,
        namespaces: impl IntoIterator<Item = &'n str>,
    ) -> (Vec<&MaintenanceWindow>, bool) {
        let mut out: Vec<&MaintenanceWindow> = Vec::new();
        let mut always = false;
        for ns in namespaces {
            match self.choice(ns) {
                WindowChoice::Always => always = true,
                WindowChoice::Window(i) => {
                    let w = &self.policy.windows[*i];
                    if !out.iter().any(|known| known.name == w.name) {
                        out.push(w);
                    }
                }
                WindowChoice::Unknown(_) => {}
            }
        }
        (out, always)
    }

    /// How long, from `from` until now, the window of any of `namespaces` was open: what a progress
    /// deadline (one namespace) or a group's soak (its members) counts. Wall time when one of them has no
    /// window.
    pub fn counted<'n>(
        &self,
        namespaces: impl IntoIterator<Item = &'n str>,
        from: Timestamp,
    ) -> Duration {
        match self.windows_of(namespaces) {
            (_, true) => open_time(&[], from, self.now),
            (windows, false) if windows.is_empty() => Duration::ZERO,
            (windows, false) => open_time(&windows, from, self.now),
        }
    }

    /// When `namespace`'s window opens next (`None`: always open, or never).
    pub fn next_start(&self, namespace: &str) -> Option<Timestamp> {
        match self.choice(namespace) {
            WindowChoice::Window(i) => self.next_starts[*i],
            WindowChoice::Always | WindowChoice::Unknown(_) => None,
        }
    }

    /// How long until something the calendar decides changes for `namespaces`: one of their windows
    /// opens or closes, or a skip expires.
    pub fn recheck_after<'n>(
        &self,
        namespaces: impl IntoIterator<Item = &'n str>,
    ) -> Option<Duration> {
        // Each window on its own: one closing matters to its clusters even while another is open.
        let (windows, _) = self.windows_of(namespaces);
        let window_change = windows
            .iter()
            .filter_map(|w| next_change(&[w], self.now))
            .min();
        let skip_expiry = self
            .policy
            .skips
            .iter()
            .map(|s| s.until)
            .filter(|until| *until > self.now)
            .min();
        [window_change, skip_expiry]
            .into_iter()
            .flatten()
            .min()
            .map(|at| crate::api_time::elapsed(self.now, at))
    }

    /// The namespaces naming a window the policy does not define, with the name.
    pub fn unknown_windows(&self) -> Vec<(&str, &str)> {
        self.windows
            .iter()
            .filter_map(|(ns, c)| match c {
                WindowChoice::Unknown(name) => Some((ns.as_str(), name.as_str())),
                _ => None,
            })
            .collect()
    }
}

/// Fills in each partition's members waiting for their window, when the first of those windows opens,
/// and `WaitingForWindow` for the group being rolled out when its windows are all that holds it.
pub fn annotate_windows(
    calendar: &RolloutCalendar<'_>,
    input: &RolloutInput,
    plan: &RolloutPlan,
    partitions: &mut [HostedClusterPackagePartitionStatus],
) {
    let waiting: BTreeSet<&str> = plan.waiting_for_window.iter().map(String::as_str).collect();
    // By group: its members waiting for their window, and whether any member is being updated.
    let mut by_group: BTreeMap<Option<String>, Vec<&str>> = BTreeMap::new();
    let mut busy: BTreeSet<Option<String>> = BTreeSet::new();
    for t in &input.targets {
        let key = || group_key(t.label.as_deref(), input.partition.as_ref());
        if waiting.contains(t.namespace.as_str()) {
            by_group.entry(key()).or_default().push(&t.namespace);
        }
        if plan.processing.contains(&t.namespace) {
            busy.insert(key());
        }
    }
    for (i, (g, p)) in plan.groups.iter().zip(partitions.iter_mut()).enumerate() {
        let Some(members) = by_group.get(&g.name) else {
            continue;
        };
        p.waiting_for_window = i32::try_from(members.len()).unwrap_or(i32::MAX);
        p.next_window_start = members
            .iter()
            .filter_map(|ns| calendar.next_start(ns))
            .min()
            .map(stamp);
        let idle = g.counts.failed == 0 && !busy.contains(&g.name);
        if plan.current_group == Some(i) && idle && p.state == group_state::PROGRESSING {
            p.state = group_state::WAITING_FOR_WINDOW.to_owned();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::rollout::fleet_sim::{spec, Pkg, Sim};
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    /// A fleet on v1 (t0 is Sunday 2026-03-01 00:00 UTC), then given `policy` and v2.
    fn on_v1_then(groups: &[(&str, usize)], policy: Value, max: usize) -> Sim {
        let mut sim = Sim::new(groups, spec(json!({}), json!(max)));
        sim.run(Pkg::Live);
        sim.spec["rolloutPolicy"] = policy;
        sim.set_image("registry/addon:v2");
        sim
    }

    fn in_window(sim: &mut Sim, cluster: &str, window: &str) {
        sim.labels.entry(cluster.to_owned()).or_default().insert(
            pko_proto::well_known::MAINTENANCE_WINDOW_LABEL.to_owned(),
            window.to_owned(),
        );
    }

    fn nightly() -> Value {
        json!({"name": "nightly", "schedule": "0 2 * * *", "duration": "1h"})
    }

    fn partition<'s>(sim: &'s Sim, name: &str) -> &'s HostedClusterPackagePartitionStatus {
        sim.status
            .partitions
            .iter()
            .find(|p| p.name == name)
            .unwrap()
    }

    #[test]
    fn a_group_waits_for_its_window_and_proceeds_when_it_opens() {
        let mut sim = on_v1_then(
            &[("early", 1), ("late", 2)],
            json!({"maintenanceWindows": [nightly()]}),
            1,
        );
        in_window(&mut sim, "late0", "nightly");
        in_window(&mut sim, "late1", "nightly");
        sim.run(Pkg::Live);
        assert_eq!(
            sim.on("registry/addon:v2"),
            1,
            "only early, which has no window"
        );
        let late = partition(&sim, "late");
        assert_eq!(late.state, group_state::WAITING_FOR_WINDOW);
        assert_eq!(late.waiting_for_window, 2);
        assert_eq!(
            late.next_window_start.as_deref(),
            Some("2026-03-01T02:00:00Z")
        );
        let step = sim.step();
        assert!(step.plan.update.is_empty());
        assert_eq!(
            step.recheck_after,
            Some(std::time::Duration::from_secs(2 * 3600))
        );
        let (_, _, message) = sim.condition("Progressing");
        assert!(
            message.contains(
                "2 waiting for their maintenance window; the first opens at 2026-03-01T02:00:00Z."
            ),
            "{message}"
        );

        sim.later(2 * 3600);
        let step = sim.step();
        assert_eq!(
            step.plan.update,
            ["clusters-late0"],
            "one at a time, as the budget says"
        );
        assert_eq!(partition(&sim, "late").state, group_state::PROGRESSING);
        sim.settle(Pkg::Live);
        sim.run(Pkg::Live);
        assert_eq!(sim.on("registry/addon:v2"), 3);
    }

    /// The rollout events tell a group starting to wait for its window, and a cluster left out, once.
    #[test]
    fn waiting_for_a_window_and_being_left_out_are_told_once() {
        use crate::rollout::rollout_events::policy_steps;
        use pko_proto::rollout_events::RolloutEventKind;
        let mut sim = on_v1_then(
            &[("early", 1), ("late", 1)],
            json!({"maintenanceWindows": [nightly()],
                   "skip": [{"namespaces": ["clusters-early0"], "until": "2026-03-01T01:00:00Z",
                             "reason": "customer freeze"}]}),
            1,
        );
        in_window(&mut sim, "late0", "nightly");
        let before = sim.status.clone();
        sim.step();
        let told: Vec<(RolloutEventKind, String)> = policy_steps(&before, &sim.status)
            .into_iter()
            .map(|s| (s.kind, s.message))
            .collect();
        assert_eq!(
            told,
            [
                (
                    RolloutEventKind::GroupWaitingForWindow,
                    "The first maintenance window of its members opens at 2026-03-01T02:00:00Z."
                        .to_owned()
                ),
                (
                    RolloutEventKind::PackageSkipped,
                    "Left out until 2026-03-01T01:00:00Z: customer freeze".to_owned()
                ),
            ]
        );
        let before = sim.status.clone();
        sim.step();
        assert!(policy_steps(&before, &sim.status).is_empty());
        assert_eq!(
            crate::rollout::rollout_status::rollout_state(&sim.status),
            crate::rollout::rollout_status::RolloutState::WaitingForWindow
        );
    }

    #[test]
    fn a_default_window_applies_to_clusters_naming_none_and_creations_wait_too() {
        let policy =
            json!({"maintenanceWindows": [nightly()], "defaultMaintenanceWindow": "nightly"});
        let mut sim = Sim::new(&[("early", 1)], spec(policy, json!(1)));
        let step = sim.step();
        assert!(
            step.plan.create.is_empty(),
            "no Package outside the window, not even a new one"
        );
        assert_eq!(step.plan.waiting_for_window, ["clusters-early0"]);
        sim.later(2 * 3600 + 60);
        assert_eq!(sim.step().plan.create, ["clusters-early0"]);
    }

    #[test]
    fn a_progress_deadline_counts_only_open_time() {
        let mut sim = on_v1_then(
            &[("early", 1)],
            json!({"maintenanceWindows": [nightly()], "defaultMaintenanceWindow": "nightly",
                   "defaults": {"progressDeadline": "40m"}}),
            1,
        );
        sim.now = at("2026-03-01T02:30:00Z");
        assert_eq!(sim.step().plan.update, ["clusters-early0"]);
        // 50 minutes later the window has been open 30 of them: not failed.
        sim.now = at("2026-03-01T03:20:00Z");
        let step = sim.step();
        assert!(step.plan.failed.is_empty());
        // The next night, 15 more open minutes make 45: failed.
        sim.now = at("2026-03-02T02:15:00Z");
        let step = sim.step();
        assert_eq!(step.plan.failed, ["clusters-early0"]);
    }

    #[test]
    fn a_soak_counts_only_open_time() {
        let mut sim = on_v1_then(
            &[("early", 1), ("late", 1)],
            json!({"maintenanceWindows": [nightly()], "defaultMaintenanceWindow": "nightly",
                   "defaults": {"minSuccessTime": "30m"}}),
            1,
        );
        sim.now = at("2026-03-01T02:40:00Z");
        sim.step();
        sim.settle(Pkg::Live);
        sim.now = at("2026-03-01T02:50:00Z");
        sim.step();
        assert_eq!(partition(&sim, "early").state, group_state::SOAKING);
        // 20 minutes of wall time, 10 of them open.
        sim.now = at("2026-03-01T03:10:00Z");
        sim.step();
        assert_eq!(partition(&sim, "early").state, group_state::SOAKING);
        sim.now = at("2026-03-02T02:19:00Z");
        sim.step();
        assert_eq!(
            partition(&sim, "early").state,
            group_state::SOAKING,
            "29 open minutes"
        );
        sim.now = at("2026-03-02T02:20:00Z");
        let step = sim.step();
        assert_eq!(partition(&sim, "early").state, group_state::FINISHED);
        assert_eq!(step.plan.update, ["clusters-late0"]);
    }

    #[test]
    fn a_skipped_cluster_holds_nothing_and_is_rolled_when_it_comes_back() {
        let mut sim = on_v1_then(
            &[("early", 2), ("late", 1)],
            json!({"skip": [{"namespaces": ["clusters-early0"], "until": "2026-03-01T01:00:00Z",
                             "reason": "customer freeze"}]}),
            1,
        );
        sim.run(Pkg::Live);
        assert_eq!(sim.packages["clusters-early0"].0, "registry/addon:v1");
        assert_eq!(
            sim.packages["clusters-late0"].0, "registry/addon:v2",
            "early did not wait for it"
        );
        assert_eq!(
            sim.status.skipped,
            [HostedClusterPackageSkippedStatus {
                namespace: "clusters-early0".into(),
                until: Some("2026-03-01T01:00:00Z".into()),
                reason: "customer freeze".into(),
            }]
        );
        assert_eq!(sim.status.counts.failed_packages, 0);
        assert_ne!(
            sim.status
                .last_succeeded
                .as_ref()
                .map(|l| l.template_hash.clone()),
            Some(sim.hash()),
            "not finished everywhere while a cluster left out is on the old template"
        );
        let step = sim.step();
        assert_eq!(
            step.recheck_after,
            Some(std::time::Duration::from_secs(3600))
        );
        sim.later(3600);
        let step = sim.step();
        assert_eq!(step.plan.update, ["clusters-early0"]);
        assert!(sim.status.skipped.is_empty());
        sim.settle(Pkg::Live);
        sim.run(Pkg::Live);
        assert_eq!(sim.on("registry/addon:v2"), 3);
        assert_eq!(
            sim.status
                .last_succeeded
                .as_ref()
                .map(|l| l.template_hash.clone()),
            Some(sim.hash())
        );
    }

    /// A selector leaves out the clusters it matches; of two skips, the later expiry holds.
    #[test]
    fn a_skip_by_selector_leaves_out_what_it_matches_until_the_later_expiry() {
        let mut sim = on_v1_then(
            &[("early", 2)],
            json!({"skip": [
                {"selector": {"matchLabels": {"tier": "migrating"}}, "until": "2026-03-01T02:00:00Z",
                 "reason": "moving"},
                {"namespaces": ["clusters-early1"], "until": "2026-03-01T01:00:00Z", "reason": "freeze"}]}),
            2,
        );
        sim.labels
            .entry("early1".to_owned())
            .or_default()
            .insert("tier".to_owned(), "migrating".to_owned());
        sim.run(Pkg::Live);
        assert_eq!(sim.packages["clusters-early0"].0, "registry/addon:v2");
        assert_eq!(sim.packages["clusters-early1"].0, "registry/addon:v1");
        assert_eq!(
            sim.status.skipped,
            [HostedClusterPackageSkippedStatus {
                namespace: "clusters-early1".into(),
                until: Some("2026-03-01T02:00:00Z".into()),
                reason: "moving".into(),
            }]
        );
        sim.later(3600);
        sim.run(Pkg::Live);
        assert_eq!(
            sim.packages["clusters-early1"].0, "registry/addon:v1",
            "still moving"
        );
        sim.later(3600);
        sim.run(Pkg::Live);
        assert_eq!(sim.packages["clusters-early1"].0, "registry/addon:v2");
    }

    /// A HostedCluster's owner names a window the policy does not define: the cluster is left out,
    /// listed, and holds neither its group nor the groups after it (issue 63, item 5).
    #[test]
    fn a_cluster_naming_an_undefined_window_is_left_out_and_holds_no_group() {
        let mut sim = on_v1_then(
            &[("early", 2), ("late", 1)],
            json!({"maintenanceWindows": [nightly()]}),
            1,
        );
        in_window(&mut sim, "early1", "weekend");
        sim.run(Pkg::Live);
        assert_eq!(sim.packages["clusters-early1"].0, "registry/addon:v1");
        assert_eq!(sim.packages["clusters-early0"].0, "registry/addon:v2");
        assert_eq!(
            sim.packages["clusters-late0"].0, "registry/addon:v2",
            "the later group was not held"
        );
        assert_eq!(sim.status.skipped.len(), 1);
        let left_out = &sim.status.skipped[0];
        assert_eq!(left_out.namespace, "clusters-early1");
        assert_eq!(left_out.until, None);
        assert!(
            left_out.reason.contains("\"weekend\""),
            "{}",
            left_out.reason
        );
        let (_, _, message) = sim.condition("Progressing");
        assert!(
            message.contains("clusters-early1 (\"weekend\")"),
            "{message}"
        );
        assert!(
            sim.status.last_succeeded.as_ref().map(|l| &l.template_hash) != Some(&sim.hash()),
            "not finished everywhere while it is left out"
        );
    }

    /// Every member of a group that needs an approval is left out: the group stays in the plan, and
    /// the groups after it wait for that approval as before.
    #[test]
    fn a_group_emptied_by_skips_keeps_its_approval() {
        let mut sim = on_v1_then(
            &[("early", 2), ("late", 1)],
            json!({"groups": [{"name": "early", "requireApproval": true}],
                   "skip": [{"namespaces": ["clusters-early0", "clusters-early1"],
                             "until": "2026-04-01T00:00:00Z", "reason": "freeze"}]}),
            1,
        );
        sim.run(Pkg::Live);
        assert_eq!(
            sim.packages["clusters-late0"].0, "registry/addon:v1",
            "late started without early's approval"
        );
        assert_eq!(
            partition(&sim, "early").state,
            group_state::AWAITING_APPROVAL
        );
        let hash = sim.hash();
        sim.annotations.insert(
            pko_proto::well_known::ROLLOUT_APPROVALS_ANNOTATION.into(),
            json!({"early": {"templateHash": hash}}).to_string(),
        );
        sim.run(Pkg::Live);
        assert_eq!(sim.packages["clusters-late0"].0, "registry/addon:v2");
    }

    /// Every member of a soaking group relabels itself away: the group keeps its soak, counted from
    /// when the rollout reaches it.
    #[test]
    fn a_group_emptied_by_relabelling_keeps_its_soak() {
        let mut sim = on_v1_then(
            &[("early", 2), ("late", 1)],
            json!({"groups": [{"name": "early", "minSuccessTime": "1h"}]}),
            1,
        );
        for cluster in ["early0", "early1"] {
            sim.labels
                .entry(cluster.to_owned())
                .or_default()
                .insert("group".to_owned(), "elsewhere".to_owned());
        }
        sim.run(Pkg::Live);
        assert_eq!(
            sim.packages["clusters-late0"].0, "registry/addon:v1",
            "late started without early's soak"
        );
        assert_eq!(partition(&sim, "early").state, group_state::SOAKING);
        sim.later(3600);
        sim.run(Pkg::Live);
        assert_eq!(sim.packages["clusters-late0"].0, "registry/addon:v2");
    }

    #[test]
    fn invalid_calendars_name_the_field() {
        let check = |policy: Value| {
            let spec: HostedClusterPackageRolloutPolicy = serde_json::from_value(policy).unwrap();
            calendar_policy(Some(&spec)).unwrap_err()
        };
        assert_eq!(
            check(json!({"maintenanceWindows": [nightly()], "defaultMaintenanceWindow": "weekend"})),
            "spec.rolloutPolicy.defaultMaintenanceWindow: \"weekend\" is not one of maintenanceWindows"
        );
        assert_eq!(
            check(json!({"maintenanceWindows": [nightly(), nightly()]})),
            "spec.rolloutPolicy.maintenanceWindows[1].name: \"nightly\" is listed twice"
        );
        assert_eq!(
            check(json!({"skip": [{"until": "2026-03-01T01:00:00Z", "reason": "r"}]})),
            "spec.rolloutPolicy.skip[0]: set namespaces, selector or both"
        );
        assert_eq!(
            check(json!({"skip": [{"namespaces": ["a"], "until": "tomorrow", "reason": "r"}]})),
            "spec.rolloutPolicy.skip[0].until: want an RFC 3339 time such as 2026-12-01T06:00:00Z, got \"tomorrow\""
        );
        assert_eq!(
            check(
                json!({"skip": [{"namespaces": ["a"], "until": "2026-03-01T01:00:00Z", "reason": " "}]})
            ),
            "spec.rolloutPolicy.skip[0].reason: must not be empty"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Random windows and skips over a rollout stepped through up to five days: no Package is written
        /// outside its window or while skipped, the budget holds at every step, late gets nothing
        /// before every early cluster not left out is live on the new template, and the rollout ends.
        #[test]
        fn windows_and_skips_keep_the_budget_and_the_barrier(
            early in 1usize..4,
            late in 1usize..4,
            max in 1usize..3,
            windows in proptest::collection::vec(0usize..3, 6),
            skipped in proptest::collection::vec(any::<bool>(), 6),
            step_minutes in 7i64..50,
        ) {
            let specs = [
                json!({"name": "a", "schedule": "0 1,13 * * *", "duration": "2h"}),
                json!({"name": "b", "schedule": "30 20 * * *", "duration": "90m", "timeZone": "Asia/Kolkata"}),
            ];
            let skips: Vec<String> = (0..early)
                .filter(|i| skipped[*i])
                .map(|i| format!("clusters-early{i}"))
                .collect();
            let policy = json!({"maintenanceWindows": specs,
                "skip": if skips.is_empty() { json!([]) } else {
                    json!([{"namespaces": skips, "until": "2026-03-01T20:00:00Z", "reason": "r"}]) }});
            let mut sim = on_v1_then(&[("early", early), ("late", late)], policy, max);
            let names: Vec<String> = sim.clusters.iter().map(|(n, _)| n.clone()).collect();
            let mut window_of = BTreeMap::new();
            for (i, name) in names.iter().enumerate() {
                if windows[i] > 0 {
                    let w = ["a", "b"][windows[i] - 1];
                    in_window(&mut sim, name, w);
                    window_of.insert(format!("clusters-{name}"), specs[windows[i] - 1].clone());
                }
            }
            let open = |ns: &str, now: Timestamp| {
                window_of.get(ns).is_none_or(|w| {
                    let w: pko_proto::core::rollout_calendar::HostedClusterPackageMaintenanceWindow =
                        serde_json::from_value(w.clone()).unwrap();
                    MaintenanceWindow::parse(&w, "w").unwrap().open_until(now).is_some()
                })
            };
            let skip_until = at("2026-03-01T20:00:00Z");
            for _ in 0..(5 * 24 * 60 / step_minutes) {
                if sim.on("registry/addon:v2") == early + late {
                    break;
                }
                let step = sim.step();
                for ns in step.plan.create.iter().chain(&step.plan.update) {
                    prop_assert!(open(ns, sim.now), "{ns} written outside its window at {}", sim.now);
                    prop_assert!(!(skips.contains(ns) && sim.now < skip_until), "{ns} written while skipped");
                    if ns.starts_with("clusters-late") {
                        for (early_ns, (image, state)) in sim.packages.iter().filter(|(n, _)| n.starts_with("clusters-early")) {
                            let left_out = skips.contains(early_ns) && sim.now < skip_until;
                            prop_assert!(left_out || (image == "registry/addon:v2" && *state == Pkg::Live),
                                "{ns} updated before {early_ns} was done");
                        }
                    }
                }
                let disrupted = sim.packages.values().filter(|(_, s)| *s != Pkg::Live).count();
                prop_assert!(disrupted <= max, "{disrupted} disrupted, maxUnavailable {max}");
                sim.settle(Pkg::Live);
                sim.later(step_minutes * 60);
            }
            prop_assert_eq!(sim.on("registry/addon:v2"), early + late);
        }
    }
}

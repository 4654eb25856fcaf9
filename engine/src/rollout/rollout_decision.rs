//! The decision for one snapshot of a HostedClusterPackage's fleet ([`decide_rollout`]): the targets and
//! their Packages' states, the rollout policy's guard (deadlines, soak, health, failures, halts and
//! rollback), the promotion gate and poisoned releases, the plan, and the status that says so. No I/O.

use pko_proto::well_known::{ROLLOUT_APPROVALS_ANNOTATION, ROLLOUT_UNDO_ANNOTATION};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use pko_proto::core::hosted_cluster_package::{
    HostedClusterPackage, HostedClusterPackageHalt, HostedClusterPackageStatus, RolloutApprovals,
};
use pko_proto::core::package::{PackageSpec, PackageTemplateSpec};
use pko_proto::core::rollout_preflight::HostedClusterPackagePreflightStatus;
use pko_proto::hypershift::HostedCluster;

use crate::fleet::promotion_gate::{
    package_template_hash, poisoned_release, promotion_gate, GateVerdict, HubView,
};
use crate::rollout::hosted_cluster_package::{
    invalid_status, rollout_settings, OwnedPackage, RolloutSettings,
};
use crate::rollout::preflight_gate::{step_preflight, PreflightRun, PreflightVerdict};
use crate::rollout::rollout_calendar::RolloutCalendar;
use crate::rollout::rollout_guard::{
    apply_deadlines, base_rules, carried_halt, failure_halt, hold, new_halt, soak, HaltCause,
    HealthObservations, Soak,
};
use crate::rollout::rollout_plan::{
    group_key, plan_rollout, GroupRules, RolloutInput, RolloutPlan, RolloutState, RolloutStrategy,
    Target,
};
use crate::rollout::rollout_policy::{HealthCheck, RolloutPolicy};
use crate::rollout::rollout_targets::{rollout_targets, unwanted, FleetView};
use crate::rollout::step_status::{step_status, StepFacts, StepFleet};

/// What one rollout decision works from.
#[derive(Debug, Clone)]
pub struct RolloutSnapshot {
    pub hcpkg: HostedClusterPackage,
    /// The owned Packages by namespace.
    pub packages: BTreeMap<String, Arc<OwnedPackage>>,
    /// Namespaces whose Package write is on its way (retried until it lands or a newer one replaces
    /// it), with the spec it carries: planned as updated and unavailable when that is the template's
    /// spec, and as outdated and unavailable otherwise (decided before a rollback), so a newer write
    /// replaces it.
    pub writing: BTreeMap<String, PackageSpec>,
    /// The selected HostedClusters.
    pub clusters: Vec<Arc<HostedCluster>>,
    /// Namespaces whose last Package write failed, with why.
    pub failures: BTreeMap<String, String>,
    /// How a promotion gate (`spec.promotion`) is decided.
    pub gate: GateInput,
    /// The latest evaluation of each health check of the rollout policy.
    pub health: HealthObservations,
    /// The newest finished preflight known (the status's, or a newer one not written yet).
    pub preflight: Option<HostedClusterPackagePreflightStatus>,
}

impl RolloutSnapshot {
    /// What of it the status reads.
    fn step_fleet(&self) -> StepFleet<'_> {
        StepFleet {
            hcpkg: &self.hcpkg,
            packages: &self.packages,
            failures: &self.failures,
            preflight: self.preflight.as_ref(),
        }
    }
}

/// What a promotion gate is decided on.
#[derive(Debug, Clone)]
pub enum GateInput {
    /// In management cluster `cluster`, on what the fleet's hub reports (`None`: the manager is in no
    /// fleet).
    Fleet {
        cluster: String,
        hub: Option<HubView>,
    },
    /// Not decided: the plan is what happens once the gate is open (previews).
    Preview,
}

/// What a rollout decision says to do.
#[derive(Debug, Clone, PartialEq)]
pub enum RolloutDecision {
    /// The spec cannot be rolled out: write this status, nothing else.
    Invalid(Box<HostedClusterPackageStatus>),
    Planned(Box<RolloutStep>),
}

/// A rollout step: the plan, the status to write, and the Packages to delete.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutStep {
    pub input: RolloutInput,
    pub plan: RolloutPlan,
    pub status: HostedClusterPackageStatus,
    /// Namespaces whose Package goes: their HostedCluster is gone or no longer selected.
    pub deletes: Vec<String>,
    /// The promotion gate: while closed the plan creates and updates nothing.
    pub gate: GateVerdict,
    /// The hash of the spec's Package template (what gates across the fleet compare).
    pub template_hash: String,
    /// The template Packages are created and updated with: the spec's, or while rolling back the last
    /// one that finished rolling out everywhere.
    pub template: PackageTemplateSpec,
    /// The last template that finished rolling out everywhere, which `plan.create_proven` creates with.
    pub proven_template: Option<PackageTemplateSpec>,
    /// Decide again after this long (a soak or a progress deadline ends), if nothing happens before.
    pub recheck_after: Option<std::time::Duration>,
    /// Health checks to evaluate now, with the name of the group that soaks.
    pub health_due: Vec<(String, HealthCheck)>,
    /// The preflight to run now, if one is due.
    pub preflight_run: Option<PreflightRun>,
}

/// The rollout step for `snapshot` at `now`: which Packages to create, update and delete (through
/// `engine::rollout::rollout_plan`, guarded by the rollout policy of `engine::rollout::rollout_guard`) and the status that
/// says so. A HostedCluster that is not Available gets no Package until it is; one that has its Package
/// keeps being counted.
pub fn decide_rollout(snapshot: &RolloutSnapshot, now: Timestamp) -> RolloutDecision {
    let hcpkg = &snapshot.hcpkg;
    let generation = hcpkg.metadata.generation.unwrap_or_default();
    let previous = hcpkg.status.clone().unwrap_or_default();
    let settings = match rollout_settings(hcpkg) {
        Ok(s) => s,
        Err(problem) => {
            return RolloutDecision::Invalid(Box::new(invalid_status(
                &previous, generation, &problem, now,
            )))
        }
    };
    let template_hash = package_template_hash(&hcpkg.spec);
    let annotations = hcpkg.metadata.annotations.clone().unwrap_or_default();
    // An undo names the template and the generation it was asked at: applying the same template again
    // later (a new generation) is a new rollout, not the old undo.
    let undo = annotations
        .get(ROLLOUT_UNDO_ANNOTATION)
        .is_some_and(|v| *v == undo_request(&template_hash, generation));
    let halt = carried_halt(previous.halted.as_ref(), &template_hash, undo, now);
    let step = guarded_step(snapshot, &settings, &template_hash, halt.clone(), now);
    // A halt found now is decided again with it, so this very step already holds (or rolls back).
    match (&halt, step.new_halt.clone()) {
        (None, Some(found)) => {
            let halt = new_halt(
                found,
                &template_hash,
                settings.policy.automatic_rollback,
                now,
            );
            guarded_step(snapshot, &settings, &template_hash, Some(halt), now).step
        }
        _ => step.step,
    }
}

struct GuardedStep {
    step: RolloutDecision,
    new_halt: Option<HaltCause>,
}

/// One decision with `halt` standing.
fn guarded_step(
    snapshot: &RolloutSnapshot,
    settings: &RolloutSettings,
    spec_hash: &str,
    halt: Option<HostedClusterPackageHalt>,
    now: Timestamp,
) -> GuardedStep {
    let hcpkg = &snapshot.hcpkg;
    let previous = hcpkg.status.clone().unwrap_or_default();
    let policy = &settings.policy;
    // Rolling back: to the last template that finished everywhere, if there is one.
    let rollback_to = previous
        .last_succeeded
        .as_ref()
        .filter(|_| halt.as_ref().is_some_and(|h| h.rolling_back))
        .filter(|last| last.template_hash != spec_hash);
    let rolling_back = rollback_to.is_some();
    let template = rollback_to.map_or(&hcpkg.spec.template, |last| &last.template);
    let effective_hash = rollback_to.map_or(spec_hash, |last| last.template_hash.as_str());
    let order = settings.partition.as_ref().map(|(_, order)| order.clone());
    let since = processing_since(&previous);
    let (calendar, targets, wanted) =
        step_targets(snapshot, settings, template, (&since, rolling_back), now);
    let strategy = settings.strategy.resolve(targets.len());
    let approvals: RolloutApprovals = annotations_approvals(hcpkg);
    let mut input = RolloutInput {
        targets,
        partition: order,
        strategy,
        processing: previous
            .processing
            .iter()
            .map(|p| p.namespace.clone())
            .collect(),
        rules: GroupRules::default(),
    };
    let (preflight, preflight_run) = snapshot_preflight(snapshot, &previous, rolling_back);
    let reviewed = (spec_hash, preflight.digest.as_deref());
    input.rules = base_rules(policy, &input, &approvals, reviewed, rolling_back);
    input.rules.preflight_hold = preflight.hold.is_some();
    let proven_template = proven_template(&previous, spec_hash, rolling_back);
    input.rules.proven_template = proven_template.is_some();
    let soaked = if rolling_back || !matches!(strategy, RolloutStrategy::RollingUpgrade { .. }) {
        Soak::default()
    } else {
        group_soak(
            &input,
            policy,
            (&previous, effective_hash),
            snapshot,
            &calendar,
        )
    };
    input.rules.soaking = soaked.soaking.clone();
    let (gate, poisoned) = fleet_verdicts(snapshot, spec_hash, now);
    let mut plan = plan_rollout(&input);
    let new_halt = if halt.is_none() {
        poisoned
            .or_else(|| failure_halt(&input, &plan, policy))
            .or(soaked.failed_check.clone())
    } else {
        None
    };
    let held = hold(hcpkg.spec.paused, halt.as_ref(), rollback_to.is_some());
    if gate.is_closed() || held.is_some() {
        hold_at_gate(&mut plan);
    }
    let status = step_status(StepFacts {
        fleet: snapshot.step_fleet(),
        previous: &previous,
        spec_hash,
        effective_hash,
        rolling_back,
        input: &input,
        plan: &plan,
        soaked: &soaked,
        gate: &gate,
        halt,
        held: held.as_deref(),
        preflight: &preflight,
        since: &since,
        calendar: &calendar,
        now,
    });
    let deletes = unwanted(&snapshot.packages, &wanted);
    let recheck_after = recheck_after(
        (&input, &plan),
        policy,
        &since,
        soaked.recheck_after,
        &calendar,
    );
    GuardedStep {
        step: RolloutDecision::Planned(Box::new(RolloutStep {
            input,
            plan,
            status,
            deletes,
            gate,
            template_hash: spec_hash.to_owned(),
            template: template.clone(),
            proven_template,
            recheck_after,
            health_due: if held.is_some() {
                Vec::new()
            } else {
                soaked.due
            },
            preflight_run,
        })),
        new_halt,
    }
}

/// The targets of a step with `template`, each with its window open or not, and with the progress
/// deadlines applied (not while rolling back): missed ones count as failed. Deadlines count only the time
/// a window was open. Also the calendar of the step, and the namespaces that keep a Package.
fn step_targets<'s>(
    snapshot: &RolloutSnapshot,
    settings: &'s RolloutSettings,
    template: &PackageTemplateSpec,
    (since, rolling_back): (&BTreeMap<String, Timestamp>, bool),
    now: Timestamp,
) -> (RolloutCalendar<'s>, Vec<Target>, BTreeSet<String>) {
    let mut calendar = RolloutCalendar::new(&settings.calendar, now);
    let fleet = FleetView {
        clusters: &snapshot.clusters,
        packages: &snapshot.packages,
        writing: &snapshot.writing,
    };
    let label_key = settings.partition.as_ref().map(|(key, _)| key.as_str());
    let (mut targets, wanted) = rollout_targets(&fleet, template, label_key, &mut calendar);
    if !rolling_back {
        let counted = |ns: &str, from: Timestamp| calendar.counted([ns], from);
        let order = settings.partition.as_ref().map(|(_, order)| order);
        apply_deadlines(&mut targets, order, &settings.policy, since, &counted);
    }
    (calendar, targets, wanted)
}

/// Since when each Package in flight has been, as the status keeps it.
fn processing_since(previous: &HostedClusterPackageStatus) -> BTreeMap<String, Timestamp> {
    previous
        .processing
        .iter()
        .filter_map(|p| Some((p.namespace.clone(), p.since.as_deref()?.parse().ok()?)))
        .collect()
}

/// Soak and health, measured on a plan without soaking (which groups have every Package done); a
/// group's soak counts only the time one of its members' windows was open.
fn group_soak(
    input: &RolloutInput,
    policy: &RolloutPolicy,
    (previous, effective_hash): (&HostedClusterPackageStatus, &str),
    snapshot: &RolloutSnapshot,
    calendar: &RolloutCalendar<'_>,
) -> Soak {
    let group_counted = |key: &Option<String>, from: Timestamp| {
        let members = input
            .targets
            .iter()
            .filter(|t| group_key(t.label.as_deref(), input.partition.as_ref()) == *key);
        calendar.counted(members.map(|t| t.namespace.as_str()), from)
    };
    soak(
        &plan_rollout(input),
        policy,
        &previous.partitions,
        effective_hash,
        &snapshot.health,
        (calendar.now(), &group_counted),
    )
}

/// The preflight's say in this decision, from the newest preflight known (the supervisor's, or the
/// status's).
fn snapshot_preflight(
    snapshot: &RolloutSnapshot,
    previous: &HostedClusterPackageStatus,
    rolling_back: bool,
) -> (PreflightVerdict, Option<PreflightRun>) {
    let last = snapshot.preflight.as_ref().or(previous.preflight.as_ref());
    step_preflight(
        &snapshot.hcpkg,
        &snapshot.clusters,
        &snapshot.packages,
        last,
        rolling_back,
    )
}

/// The last template that finished everywhere, when another one is on trial: what a HostedCluster joining
/// a group the rollout has not reached is created with. Not while rolling back: the template rolled out
/// then is that one.
fn proven_template(
    previous: &HostedClusterPackageStatus,
    spec_hash: &str,
    rolling_back: bool,
) -> Option<PackageTemplateSpec> {
    previous
        .last_succeeded
        .as_ref()
        .filter(|last| !rolling_back && last.template_hash != spec_hash)
        .map(|last| last.template.clone())
}

/// What the fleet says of this release: the promotion gate, and whether another management cluster
/// halted on it (a poisoned release halts here too, before anything else fails).
fn fleet_verdicts(
    snapshot: &RolloutSnapshot,
    spec_hash: &str,
    now: Timestamp,
) -> (GateVerdict, Option<HaltCause>) {
    let hcpkg = &snapshot.hcpkg;
    let previous_promotion = hcpkg.status.as_ref().and_then(|s| s.promotion.as_ref());
    match &snapshot.gate {
        GateInput::Fleet { cluster, hub } => (
            promotion_gate(
                hcpkg.spec.promotion.as_ref(),
                spec_hash,
                previous_promotion,
                cluster,
                hub.as_ref(),
                now,
            ),
            hub.as_ref()
                .and_then(|hub| poisoned_release(hub, spec_hash, cluster)),
        ),
        GateInput::Preview => (GateVerdict::Ungated, None),
    }
}

/// When to decide again even if nothing happens: a soak ends, a Package in flight reaches its group's
/// progress deadline, a maintenance window opens or closes, or a skip expires (at least a second from
/// now).
fn recheck_after(
    (input, plan): (&RolloutInput, &RolloutPlan),
    policy: &RolloutPolicy,
    since: &BTreeMap<String, Timestamp>,
    soak_ends: Option<std::time::Duration>,
    calendar: &RolloutCalendar<'_>,
) -> Option<std::time::Duration> {
    let deadline_left = input
        .targets
        .iter()
        .filter(|t| {
            t.package
                .is_some_and(|p| p.rollout_state() == RolloutState::InFlight)
        })
        .filter_map(|t| {
            let key = group_key(t.label.as_deref(), input.partition.as_ref());
            let deadline = policy.group(key.as_deref()).progress_deadline?;
            let started = since.get(&t.namespace)?;
            Some(deadline.saturating_sub(calendar.counted([t.namespace.as_str()], *started)))
        })
        .min();
    // While a group is being rolled out, every window of the fleet may change what is decided.
    let rolling = plan.current_group.is_some();
    let calendar_change = calendar.recheck_after(
        input
            .targets
            .iter()
            .filter(|_| rolling)
            .map(|t| t.namespace.as_str()),
    );
    [soak_ends, deadline_left, calendar_change]
        .into_iter()
        .flatten()
        .min()
        .map(|d| d.max(std::time::Duration::from_secs(1)))
}

/// The value of the undo annotation that asks to roll back template `hash` at `generation`.
pub fn undo_request(hash: &str, generation: i64) -> String {
    format!("{hash}@{generation}")
}

/// The approvals annotation; an unreadable one approves nothing.
pub fn annotations_approvals(hcpkg: &HostedClusterPackage) -> RolloutApprovals {
    hcpkg
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ROLLOUT_APPROVALS_ANNOTATION))
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}

/// A closed gate: no Package is created or updated; what is in flight already stays counted.
fn hold_at_gate(plan: &mut RolloutPlan) {
    plan.create.clear();
    plan.create_proven.clear();
    let held: BTreeSet<String> = plan.update.drain(..).collect();
    plan.processing.retain(|ns| !held.contains(ns));
    plan.blocked = None;
}

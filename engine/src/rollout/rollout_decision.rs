//! The decision for one snapshot of a HostedClusterPackage's fleet ([`decide_rollout`]): the targets and
//! their Packages' states, the rollout policy's guard (deadlines, soak, health, failures, halts and
//! rollback), the promotion gate and poisoned releases, the plan, and the status that says so. No I/O.

use pko_proto::well_known::{ROLLOUT_APPROVALS_ANNOTATION, ROLLOUT_UNDO_ANNOTATION};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use pko_proto::core::hosted_cluster_package::{
    HostedClusterPackage, HostedClusterPackageHalt, HostedClusterPackageStatus,
    HostedClusterPackageSucceededTemplate, RolloutApprovals,
};
use pko_proto::core::package::{PackageSpec, PackageTemplateSpec};
use pko_proto::core::rollout_preflight::HostedClusterPackagePreflightStatus;
use pko_proto::hypershift::HostedCluster;

use crate::api_time::{elapsed, stamp};
use crate::conditions::set_condition;
use crate::fleet::promotion_gate::{
    package_template_hash, poisoned_release, promotion_gate, GateVerdict, HubView,
};
use crate::rollout::hosted_cluster_package::{
    invalid_status, package_state, rollout_settings, rollout_status, OwnedPackage, RolloutSettings,
};
use crate::rollout::preflight_gate::{step_preflight, PreflightRun, PreflightVerdict};
use crate::rollout::rollout_guard::{
    annotate_partitions, apply_deadlines, base_rules, carried_halt, failure_halt, guard_conditions,
    hold, new_halt, soak, GuardReport, HaltCause, HealthObservations, Soak, HALTED,
};
use crate::rollout::rollout_plan::{
    group_key, plan_rollout, GroupRules, PackageState, PartitionOrder, RolloutInput, RolloutPlan,
    RolloutState, RolloutStrategy, Target,
};
use crate::rollout::rollout_policy::{HealthCheck, RolloutPolicy};

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
    let (label_key, order): (Option<&str>, Option<PartitionOrder>) = match &settings.partition {
        Some((key, order)) => (Some(key.as_str()), Some(order.clone())),
        None => (None, None),
    };
    let (mut targets, wanted) = rollout_targets(snapshot, template, label_key);
    let since: BTreeMap<String, Timestamp> = previous
        .processing
        .iter()
        .filter_map(|p| Some((p.namespace.clone(), p.since.as_deref()?.parse().ok()?)))
        .collect();
    if !rolling_back {
        apply_deadlines(&mut targets, order.as_ref(), policy, &since, now);
    }
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
    // Soak and health are measured on a plan without soaking: which groups have every Package done.
    let soaked = if rolling_back || !matches!(strategy, RolloutStrategy::RollingUpgrade { .. }) {
        Soak::default()
    } else {
        soak(
            &plan_rollout(&input),
            policy,
            &previous.partitions,
            effective_hash,
            &snapshot.health,
            now,
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
        snapshot,
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
        now,
    });
    let deletes = unwanted(snapshot, &wanted);
    let recheck_after = recheck_after(&input, policy, &since, soaked.recheck_after, now);
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

/// The namespaces whose Package goes: their HostedCluster is gone or no longer selected.
fn unwanted(snapshot: &RolloutSnapshot, wanted: &BTreeSet<String>) -> Vec<String> {
    snapshot
        .packages
        .keys()
        .filter(|ns| !wanted.contains(*ns))
        .cloned()
        .collect()
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

/// The selected HostedClusters to roll out to, as the planner sees them (their Package's state against
/// `template`, their partition label), and the namespaces that keep a Package.
fn rollout_targets(
    snapshot: &RolloutSnapshot,
    template: &PackageTemplateSpec,
    label_key: Option<&str>,
) -> (Vec<Target>, BTreeSet<String>) {
    let mut targets = Vec::new();
    let mut wanted = BTreeSet::new();
    for cluster in &snapshot.clusters {
        let Some(namespace) = cluster.hosted_control_plane_namespace() else {
            continue;
        };
        let package = snapshot.packages.get(&namespace);
        // Not Available yet: no Package until it is; one that has its Package keeps being counted.
        if !cluster.is_available() && package.is_none() {
            continue;
        }
        wanted.insert(namespace.clone());
        let (state, failure) = match snapshot.writing.get(&namespace) {
            Some(spec) if *spec == template.spec => (Some(PackageState::just_updated()), None),
            // Whatever is observed, that write may still land: not live, and not on this template.
            Some(_) => (Some(PackageState::default()), None),
            None => match package.map(|p| package_state(template, p)) {
                Some((state, failure)) => (Some(state), failure),
                None => (None, None),
            },
        };
        let label = label_key.and_then(|k| {
            cluster
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(k).cloned())
        });
        targets.push(Target {
            namespace,
            label,
            package: state,
            failure,
        });
    }
    (targets, wanted)
}

/// What one guarded step decided, for the status that says so.
struct StepFacts<'a> {
    snapshot: &'a RolloutSnapshot,
    /// The status the step was decided from.
    previous: &'a HostedClusterPackageStatus,
    spec_hash: &'a str,
    /// The template rolled out: the spec's, or the one rolled back to.
    effective_hash: &'a str,
    rolling_back: bool,
    input: &'a RolloutInput,
    plan: &'a RolloutPlan,
    soaked: &'a Soak,
    gate: &'a GateVerdict,
    halt: Option<HostedClusterPackageHalt>,
    /// Why nothing is created or updated (paused, halted), if so.
    held: Option<&'a str>,
    preflight: &'a PreflightVerdict,
    /// Since when each Package in flight has been.
    since: &'a BTreeMap<String, Timestamp>,
    now: Timestamp,
}

/// The status of a guarded step: counts and conditions, the last template that finished everywhere,
/// the halt, the policy's and the gate's conditions, and why progress is held.
fn step_status(facts: StepFacts<'_>) -> HostedClusterPackageStatus {
    let StepFacts {
        snapshot,
        previous,
        spec_hash,
        effective_hash,
        rolling_back,
        input,
        plan,
        soaked,
        gate,
        halt,
        held,
        preflight,
        since,
        now,
    } = facts;
    let hcpkg = &snapshot.hcpkg;
    let generation = hcpkg.metadata.generation.unwrap_or_default();
    let strategy = input.strategy;
    // An update written now starts its deadline now, even for a Package already in flight with an
    // earlier template.
    let mut decided = since.clone();
    for namespace in &plan.update {
        decided.remove(namespace);
    }
    let mut status = rollout_status(
        &previous.conditions,
        generation,
        input,
        plan,
        strategy,
        &snapshot.packages,
        &decided,
        now,
    );
    let everything_done = plan.current_group.is_none()
        && plan.counts.updated == plan.counts.total
        && plan.processing.is_empty();
    status.last_succeeded = match &previous.last_succeeded {
        Some(last) if last.template_hash == spec_hash => Some(last.clone()),
        _ if everything_done && halt.is_none() && !gate.is_closed() => {
            Some(HostedClusterPackageSucceededTemplate {
                template_hash: spec_hash.to_owned(),
                template: hcpkg.spec.template.clone(),
                finished_at: stamp(now),
            })
        }
        last => last.clone(),
    };
    status.halted = halt.map(|mut h| {
        if rolling_back && everything_done && h.rolled_back_at.is_none() {
            h.rolled_back_at = Some(stamp(now));
        }
        h
    });
    let report = GuardReport {
        input,
        plan,
        memory: &soaked.memory,
        template_hash: effective_hash,
        halt: status.halted.as_ref(),
        paused: hcpkg.spec.paused,
        strategy,
    };
    annotate_partitions(&report, &mut status.partitions);
    if uses_policy(hcpkg, &status) {
        for condition in guard_conditions(&report, &status) {
            set_condition(&mut status.conditions, condition, generation, now);
        }
    }
    if let Some(condition) = gate.condition() {
        set_condition(&mut status.conditions, condition, generation, now);
    }
    status.preflight = snapshot
        .preflight
        .clone()
        .or_else(|| previous.preflight.clone());
    if let Some(condition) = preflight.condition.clone() {
        set_condition(&mut status.conditions, condition, generation, now);
    }
    status.promotion = match gate {
        GateVerdict::Ungated => None,
        GateVerdict::Open {
            opened: Some(opened),
        } => Some(opened.clone()),
        GateVerdict::Open { opened: None } | GateVerdict::Closed(_) => previous.promotion.clone(),
    };
    let notes = progress_notes(gate, held.or(preflight.hold.as_deref()), &snapshot.failures);
    if let Some(c) = status
        .conditions
        .iter_mut()
        .find(|c| c.type_ == "Progressing")
    {
        for note in notes {
            c.message = format!("{} {note}", c.message);
        }
    }
    status
}

/// What the Progressing condition adds to its message: the gate holding, a pause or halt, and the
/// namespaces whose Package writes fail.
fn progress_notes(
    gate: &GateVerdict,
    held: Option<&str>,
    failures: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut notes = Vec::new();
    if let GateVerdict::Closed(closed) = gate {
        notes.push(format!("Held at the promotion gate: {}", closed.message));
    }
    if let Some(why) = held {
        notes.push(why.to_owned());
    }
    if !failures.is_empty() {
        let failing: Vec<String> = failures
            .iter()
            .map(|(ns, e)| format!("{ns}: {e}"))
            .collect();
        notes.push(format!(
            "Failing, retried with backoff: {}.",
            failing.join("; ")
        ));
    }
    notes
}

/// When to decide again even if nothing happens: a soak ends, or a Package in flight reaches its
/// group's progress deadline (at least a second from now).
fn recheck_after(
    input: &RolloutInput,
    policy: &RolloutPolicy,
    since: &BTreeMap<String, Timestamp>,
    soak_ends: Option<std::time::Duration>,
    now: Timestamp,
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
            Some(deadline.saturating_sub(elapsed(*started, now)))
        })
        .min();
    match (soak_ends, deadline_left) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
    .map(|d| d.max(std::time::Duration::from_secs(1)))
}

/// The value of the undo annotation that asks to roll back template `hash` at `generation`.
pub fn undo_request(hash: &str, generation: i64) -> String {
    format!("{hash}@{generation}")
}

/// Whether the policy's conditions belong in the status: a policy or pause is set, or was.
fn uses_policy(hcpkg: &HostedClusterPackage, status: &HostedClusterPackageStatus) -> bool {
    hcpkg.spec.rollout_policy.is_some()
        || hcpkg.spec.paused
        || status.halted.is_some()
        || status.conditions.iter().any(|c| c.type_ == HALTED)
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

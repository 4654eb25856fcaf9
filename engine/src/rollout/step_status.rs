//! The status a rollout step writes: counts and conditions, the last template that finished everywhere,
//! the halt, the policy's, gate's and preflight's conditions, the calendar's partitions and skips, and
//! why progress is held. Decided by `engine::rollout::rollout_decision`; this module only says so.
//!
//! Pure: no I/O, no clock (`now` is given).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use pko_proto::core::hosted_cluster_package::{
    HostedClusterPackage, HostedClusterPackageHalt, HostedClusterPackageStatus,
    HostedClusterPackageSucceededTemplate,
};
use pko_proto::core::rollout_preflight::HostedClusterPackagePreflightStatus;

use crate::api_time::stamp;
use crate::conditions::set_condition;
use crate::fleet::promotion_gate::GateVerdict;
use crate::rollout::hosted_cluster_package::{rollout_status, OwnedPackage};
use crate::rollout::preflight_gate::PreflightVerdict;
use crate::rollout::rollout_calendar::{annotate_windows, RolloutCalendar};
use crate::rollout::rollout_guard::{
    annotate_partitions, guard_conditions, GuardReport, Soak, HALTED,
};
use crate::rollout::rollout_plan::{RolloutInput, RolloutPlan};

/// What of the fleet's snapshot the status reads.
pub struct StepFleet<'a> {
    pub hcpkg: &'a HostedClusterPackage,
    pub packages: &'a BTreeMap<String, Arc<OwnedPackage>>,
    /// Namespaces whose last Package write failed, with why.
    pub failures: &'a BTreeMap<String, String>,
    /// The newest finished preflight the supervisor knows, if newer than the status's.
    pub preflight: Option<&'a HostedClusterPackagePreflightStatus>,
}

/// What one guarded step decided, for the status that says so.
pub struct StepFacts<'a> {
    pub fleet: StepFleet<'a>,
    /// The status the step was decided from.
    pub previous: &'a HostedClusterPackageStatus,
    pub spec_hash: &'a str,
    /// The template rolled out: the spec's, or the one rolled back to.
    pub effective_hash: &'a str,
    pub rolling_back: bool,
    pub input: &'a RolloutInput,
    pub plan: &'a RolloutPlan,
    pub soaked: &'a Soak,
    pub gate: &'a GateVerdict,
    pub halt: Option<HostedClusterPackageHalt>,
    /// Why nothing is created or updated (paused, halted), if so.
    pub held: Option<&'a str>,
    pub preflight: &'a PreflightVerdict,
    /// Since when each Package in flight has been.
    pub since: &'a BTreeMap<String, Timestamp>,
    pub calendar: &'a RolloutCalendar<'a>,
    pub now: Timestamp,
}

/// The status of a guarded step: counts and conditions, the last template that finished everywhere,
/// the halt, the policy's and the gate's conditions, and why progress is held.
pub fn step_status(facts: StepFacts<'_>) -> HostedClusterPackageStatus {
    let StepFacts {
        fleet,
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
        calendar,
        now,
    } = facts;
    let hcpkg = fleet.hcpkg;
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
        fleet.packages,
        &decided,
        now,
    );
    let everything_done = calendar.outstanding == 0
        && plan.current_group.is_none()
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
    annotate_windows(calendar, input, plan, &mut status.partitions);
    status.skipped = calendar.skipped.clone();
    if uses_policy(hcpkg, &status) {
        for condition in guard_conditions(&report, &status) {
            set_condition(&mut status.conditions, condition, generation, now);
        }
    }
    if let Some(condition) = gate.condition() {
        set_condition(&mut status.conditions, condition, generation, now);
    }
    status.preflight = fleet
        .preflight
        .cloned()
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
    let mut notes = progress_notes(gate, held.or(preflight.hold.as_deref()), fleet.failures);
    notes.extend(calendar_notes(calendar, plan));
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

/// What the Progressing condition adds for the calendar: who waits for a window and when the first
/// opens, who names a window the policy does not define, who is left out.
fn calendar_notes(calendar: &RolloutCalendar<'_>, plan: &RolloutPlan) -> Vec<String> {
    let mut notes = Vec::new();
    if !plan.waiting_for_window.is_empty() {
        let next = plan
            .waiting_for_window
            .iter()
            .filter_map(|ns| calendar.next_start(ns))
            .min()
            .map_or_else(String::new, |at| {
                format!("; the first opens at {}", stamp(at))
            });
        notes.push(format!(
            "{} waiting for their maintenance window{next}.",
            plan.waiting_for_window.len()
        ));
    }
    let unknown = calendar.unknown_windows();
    if !unknown.is_empty() {
        let named: Vec<String> = unknown
            .iter()
            .map(|(ns, name)| format!("{ns} ({name:?})"))
            .collect();
        notes.push(format!(
            "Naming a maintenance window spec.rolloutPolicy.maintenanceWindows does not define, so never updated: {}.",
            named.join(", ")
        ));
    }
    if !calendar.skipped.is_empty() {
        notes.push(format!(
            "{} left out of the rollout (status.skipped).",
            calendar.skipped.len()
        ));
    }
    notes
}

/// Whether the policy's conditions belong in the status: a policy or pause is set, or was.
fn uses_policy(hcpkg: &HostedClusterPackage, status: &HostedClusterPackageStatus) -> bool {
    hcpkg.spec.rollout_policy.is_some()
        || hcpkg.spec.paused
        || status.halted.is_some()
        || status.conditions.iter().any(|c| c.type_ == HALTED)
}

//! What a planned step tells: the rollout events since the last plan (or the story so far when this
//! supervisor takes over a rollout under way), the Events of their transitions, and a trace per Package
//! update, from the decision to the hosted cluster.

use std::collections::BTreeMap;

use opentelemetry::trace::TraceContextExt;
use pko_proto::core::hosted_cluster_package::{HostedClusterPackage, HostedClusterPackageStatus};
use pko_proto::rollout_events::{RolloutEvent, RolloutEventKind, EVENT_VERSION};
use tracing::{info_span, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{
    status_of_this_generation, under_way, Guard, HostedClusterPackageActor, HubReport, LastPlan,
    StepToCarry,
};
use crate::engine::fleet::promotion_gate::GateVerdict;
use crate::engine::rollout::rollout_decision::RolloutStep;
use crate::engine::rollout::rollout_events::{
    policy_steps, rollout_steps, story_so_far, RolloutView,
};
use crate::engine::rollout::rollout_plan::{group_key, UNKNOWN_GROUP};
use crate::engine::transition_events::rollout_transition;
use crate::runtime::telemetry::{current_traceparent, trace_id_of};

/// The root span of one rollout step (the decision to create or update one Package), linked to the
/// reconcile that decided it.
fn rollout_step_span(name: &str, generation: i64, namespace: &str, group: Option<String>) -> Span {
    let span = info_span!(
        parent: None,
        "rollout step",
        pko.hostedclusterpackage = %name,
        pko.revision = generation,
        pko.partition = group.as_deref().unwrap_or(UNKNOWN_GROUP),
        k8s.namespace.name = %namespace,
    );
    let decided_in = Span::current().context().span().span_context().clone();
    if decided_in.is_valid() {
        span.add_link(decided_in);
    }
    span
}

impl HostedClusterPackageActor {
    /// What a planned step asks to be done: the rollout's story told since the last plan (events and
    /// the traces of Package updates), the status, and the writes.
    pub(super) fn step_to_carry(
        &mut self,
        hcpkg: &HostedClusterPackage,
        previous_status: &HostedClusterPackageStatus,
        step: RolloutStep,
    ) -> StepToCarry {
        let RolloutStep {
            input,
            plan,
            status,
            deletes,
            gate,
            template_hash,
            template,
            proven_template,
            recheck_after,
            health_due,
            preflight_run,
        } = step;
        let name = self.name();
        let generation = hcpkg.metadata.generation.unwrap_or_default();
        let view = RolloutView {
            generation,
            input: &input,
            plan: &plan,
        };
        let previous = self.state.last.as_ref().map(|l| RolloutView {
            generation: l.generation,
            input: &l.input,
            plan: &l.plan,
        });
        // Taking over a rollout that another manager (or this one before a restart) planned: what was
        // told before is not known here, so the stream gets the story so far (it drops what it holds)
        // and no Event is raised again. Also when the stored status says it finished: the manager before
        // may have died between writing that status and publishing the end. That story is told only if
        // the stream lacks its `rolloutFinished`, so a restart long after a rollout repeats nothing.
        let taken_over = under_way(hcpkg)
            || status_of_this_generation(hcpkg).is_some() && plan.groups.iter().any(|g| g.finished);
        let (mut steps, story) = match (&gate, previous) {
            // Held at the gate: nothing of the new template happens; the steps are told against the
            // last plan once it opens.
            (GateVerdict::Closed(_), _) => (Vec::new(), Vec::new()),
            (_, Some(previous)) => (rollout_steps(Some(&previous), &view), Vec::new()),
            (_, None) if taken_over => (Vec::new(), story_so_far(&view)),
            (_, None) => (rollout_steps(None, &view), Vec::new()),
        };
        let retold = !story.is_empty();
        let gate_step = self.gate_step(&gate, generation);
        // The gate's step comes before the story it lets happen, the policy's after it.
        let before_story = usize::from(gate_step.is_some());
        steps.splice(0..0, gate_step);
        steps.extend(policy_steps(previous_status, &status));
        // Each Package update is a trace of its own, from this decision to the hosted cluster.
        let proven = proven_template.map(|t| (plan.create_proven.iter().cloned().collect(), t));
        // A guarded update goes out only with the version its Package was seen at (always known for a
        // Package seen; without one it waits for the next decision).
        let if_unchanged: BTreeMap<String, String> = plan
            .update_if_unchanged
            .iter()
            .filter_map(|ns| Some((ns.clone(), self.state.packages.version(ns)?.to_owned())))
            .collect();
        let writes: BTreeMap<String, Span> = plan
            .create
            .iter()
            .chain(&plan.create_proven)
            .chain(&plan.update)
            .filter(|ns| !plan.update_if_unchanged.contains(*ns) || if_unchanged.contains_key(*ns))
            .map(|namespace| {
                let group = input
                    .targets
                    .iter()
                    .find(|t| t.namespace == *namespace)
                    .and_then(|t| group_key(t.label.as_deref(), input.partition.as_ref()));
                let span = rollout_step_span(&name, generation, namespace, group);
                (namespace.clone(), span)
            })
            .collect();
        let events = self.rollout_events(hcpkg, steps, &writes);
        let story = self.rollout_events(hcpkg, story, &writes);
        let partition = plan
            .current_group
            .and_then(|i| plan.groups.get(i))
            .map(|g| g.name.clone().unwrap_or_else(|| UNKNOWN_GROUP.to_owned()));
        let hub = HubReport {
            gate: gate.clone(),
            template_hash,
            counts: plan.counts,
            partition,
        };
        let next = (!gate.is_closed()).then_some(LastPlan {
            generation,
            input,
            plan,
        });
        let transitions = if retold {
            Vec::new()
        } else {
            events.iter().filter_map(rollout_transition).collect()
        };
        StepToCarry {
            status,
            writes,
            deletes,
            events,
            story,
            before_story,
            transitions,
            next,
            hub: Some(hub),
            guard: Some(Guard {
                template,
                proven,
                recheck_after,
                health_due,
                if_unchanged,
                preflight_run,
            }),
        }
    }

    /// The rollout events of `steps`; a Package update carries the trace of its step.
    fn rollout_events(
        &self,
        hcpkg: &HostedClusterPackage,
        steps: Vec<crate::engine::rollout::rollout_events::RolloutStep>,
        traced: &BTreeMap<String, Span>,
    ) -> Vec<RolloutEvent> {
        let decision = current_traceparent();
        steps
            .into_iter()
            .map(|s| {
                let step_span = s
                    .namespace
                    .as_ref()
                    .filter(|_| s.kind == RolloutEventKind::PackageUpdated)
                    .and_then(|namespace| traced.get(namespace));
                let traceparent = match step_span {
                    Some(span) => span.in_scope(current_traceparent),
                    None => decision.clone(),
                };
                let trace_id = traceparent
                    .as_deref()
                    .and_then(trace_id_of)
                    .map(str::to_owned);
                RolloutEvent {
                    version: EVENT_VERSION,
                    kind: s.kind,
                    hosted_cluster_package: self.name(),
                    uid: hcpkg.metadata.uid.clone().unwrap_or_default(),
                    generation: hcpkg.metadata.generation.unwrap_or_default(),
                    group: s.group,
                    namespace: s.namespace,
                    message: s.message,
                    source: self.context.rollouts.source.clone(),
                    trace_id,
                    traceparent,
                }
            })
            .collect()
    }
}

//! `rollout plan`: what a rollout does next. It gathers what the manager's planner reads (the
//! HostedClusterPackage, the HostedClusters it selects, its Packages) and runs that planner,
//! `pko_engine`'s `decide_rollout`: the CLI never has rules of its own.

use std::path::PathBuf;

use k8s_openapi::jiff::Timestamp;
use pko_engine::rollout::rollout_decision::{decide_rollout, RolloutDecision};
use pko_engine::rollout::rollout_plan::{RolloutStrategy, UNKNOWN_GROUP};

use crate::args::RolloutPlanArgs;
use crate::cluster::{client, resource_and_name};
use crate::fleet_snapshot::FleetSnapshot;
use crate::rollout_follow::policy_lines;

/// `rollout plan`: the manager's planner on what it would read now.
pub async fn plan(args: &RolloutPlanArgs, kubeconfig: Option<&PathBuf>) -> Result<String, String> {
    let (res, name) = resource_and_name(&args.positionals.args)?;
    if !matches!(
        res.as_str(),
        "hostedclusterpackage" | "hostedclusterpackages" | "hcpkg"
    ) {
        return Err(format!(
            "rollout plan takes a hostedclusterpackage, not {res:?}"
        ));
    }
    let client = client(kubeconfig).await?;
    let snapshot = FleetSnapshot::read(&client, &name)
        .await?
        .rollout_snapshot();
    Ok(plan_text(
        &name,
        &decide_rollout(&snapshot, Timestamp::now()),
    ))
}

/// The plan as text: groups in order, the next wave, and why every other outdated Package waits.
pub fn plan_text(name: &str, decision: &RolloutDecision) -> String {
    let step = match decision {
        RolloutDecision::Invalid(status) => {
            let why = status
                .conditions
                .iter()
                .find(|c| c.status == "False" || c.type_ == "Invalid")
                .map(|c| c.message.clone())
                .unwrap_or_default();
            return format!("hostedclusterpackage/{name} cannot be rolled out: {why}");
        }
        RolloutDecision::Planned(step) => step,
    };
    let (input, plan) = (&step.input, &step.plan);
    let strategy = match input.strategy {
        RolloutStrategy::Instant => "instant".to_owned(),
        RolloutStrategy::RollingUpgrade { max_unavailable } => {
            format!("rollingUpgrade, maxUnavailable {max_unavailable}")
        }
    };
    let group_name = |g: &Option<String>| g.clone().unwrap_or_else(|| UNKNOWN_GROUP.to_owned());
    let mut lines = vec![
        format!("hostedclusterpackage/{name} ({strategy})"),
        "groups, in order:".to_owned(),
    ];
    for (index, group) in plan.groups.iter().enumerate() {
        let c = &group.counts;
        // The rollout policy's word for the group, when it has one.
        let policy_state = step
            .status
            .partitions
            .get(index)
            .map(|p| p.state.to_lowercase())
            .filter(|s| !s.is_empty() && s != "progressing" && s != "pending");
        let state = if let Some(s) = &policy_state {
            s.as_str()
        } else if group.finished {
            "finished"
        } else if plan.current_group == Some(index) {
            "rolling out"
        } else {
            "waiting"
        };
        lines.push(format!(
            "  {}. {}: {state}, {}/{} updated, {}/{} available",
            group.order + 1,
            group_name(&group.name),
            c.updated,
            c.total,
            c.available,
            c.total
        ));
    }
    let wave: Vec<String> = plan
        .create
        .iter()
        .map(|ns| format!("{ns} (create)"))
        .chain(
            plan.create_proven
                .iter()
                .map(|ns| format!("{ns} (create with the last template that finished)")),
        )
        .chain(plan.update.iter().map(|ns| format!("{ns} (update)")))
        .collect();
    lines.push(if wave.is_empty() {
        "next wave: nothing to write now".to_owned()
    } else {
        format!("next wave: {}", wave.join(", "))
    });
    let current = plan.current_group.and_then(|i| plan.groups.get(i));
    let mut waiting = Vec::new();
    for target in &input.targets {
        let group = pko_engine::rollout::rollout_plan::group_key(
            target.label.as_deref(),
            input.partition.as_ref(),
        );
        if plan.waiting_for_window.contains(&target.namespace) {
            let opens = step
                .status
                .partitions
                .iter()
                .find(|p| p.name == group_name(&group))
                .and_then(|p| p.next_window_start.as_deref())
                .map_or_else(String::new, |at| {
                    format!(" (the first of its group's opens at {at})")
                });
            waiting.push(format!(
                "  {}: its maintenance window is closed{opens}",
                target.namespace
            ));
            continue;
        }
        let Some(state) = target.package else {
            continue;
        };
        if state.updated || plan.update.contains(&target.namespace) {
            continue;
        }
        let why = if state.paused {
            "paused".to_owned()
        } else if current.is_some_and(|g| g.name != group) {
            format!(
                "group {} waits for group {}",
                group_name(&group),
                current.map(|g| group_name(&g.name)).unwrap_or_default()
            )
        } else if input.rules.preflight_hold {
            "the release's preflight holds every update (kubectl package rollout diff)".to_owned()
        } else if let Some(blocked) = &plan.blocked {
            format!(
                "maxUnavailable {} is used by {}",
                blocked.max_unavailable,
                blocked.holders.join(", ")
            )
        } else if !plan.failed.is_empty() {
            format!(
                "the rollout is halted by failing Packages: {}",
                plan.failed.join(", ")
            )
        } else {
            "waits for the in-flight Packages".to_owned()
        };
        waiting.push(format!("  {}: {why}", target.namespace));
    }
    if !waiting.is_empty() {
        lines.push("waiting:".to_owned());
        lines.extend(waiting);
    }
    if !plan.failed.is_empty() {
        lines.push(format!("failing: {}", plan.failed.join(", ")));
    }
    for skipped in &step.status.skipped {
        lines.push(format!(
            "skipped: {} {}: {}",
            skipped.namespace,
            skipped.comes_back(),
            skipped.reason
        ));
    }
    lines.extend(policy_lines(&step.status));
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pko_proto::core::hosted_cluster_package::HostedClusterPackageStatus;

    #[test]
    fn a_plan_names_the_next_wave_and_why_the_others_wait() {
        use pko_engine::rollout::rollout_decision::RolloutStep;
        use pko_engine::rollout::rollout_plan::{
            plan_rollout, PackageState, PartitionOrder, RolloutInput, Target,
        };
        let target = |namespace: &str, label: &str, updated: bool, live: bool| Target {
            namespace: namespace.into(),
            label: Some(label.into()),
            package: Some(PackageState {
                updated,
                available: live,
                live,
                progressed: updated && live,
                ..PackageState::default()
            }),
            failure: None,
            in_window: true,
        };
        // a-1 is in flight on the new template; a-2 and b-1 are live on the old one.
        let input = RolloutInput {
            targets: vec![
                target("a-1", "a", true, false),
                target("a-2", "a", false, true),
                target("b-1", "b", false, true),
            ],
            partition: Some(PartitionOrder::Static(vec!["a".into(), "b".into()])),
            strategy: RolloutStrategy::RollingUpgrade { max_unavailable: 1 },
            processing: ["a-1".to_owned()].into(),
            rules: Default::default(),
        };
        let plan = plan_rollout(&input);
        let decision = RolloutDecision::Planned(Box::new(RolloutStep {
            input,
            plan,
            status: HostedClusterPackageStatus::default(),
            deletes: Vec::new(),
            gate: pko_engine::fleet::promotion_gate::GateVerdict::Ungated,
            template_hash: String::new(),
            template: Default::default(),
            proven_template: None,
            recheck_after: None,
            health_due: Vec::new(),
            preflight_run: None,
        }));
        let text = plan_text("addon", &decision);
        assert!(text.contains("1. a: rolling out, 1/2 updated"), "{text}");
        assert!(text.contains("2. b: waiting, 0/1 updated"), "{text}");
        assert!(text.contains("next wave: nothing to write now"), "{text}");
        assert!(
            text.contains("a-2: maxUnavailable 1 is used by a-1"),
            "{text}"
        );
        assert!(text.contains("b-1: group b waits for group a"), "{text}");
    }
}

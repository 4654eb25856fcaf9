//! `rollout status` and `rollout plan`: where a rollout stands and what it does next.
//!
//! `status` reads a HostedClusterPackage's status (partitions in order with their counts, the Packages in
//! flight, why it is blocked) off an apiserver watch, or follows the rollout event stream on JetStream with
//! `--nats-url`; for a (Cluster)Package or (Cluster)ObjectDeployment it follows Available and Progressing
//! of the current generation. `plan` gathers what the manager's planner reads (the HostedClusterPackage,
//! the HostedClusters it selects, its Packages) and runs that planner, `pko_engine`'s `decide_rollout`: the
//! CLI never has rules of its own. Rollout states come from `pko_engine::rollout::rollout_status::rollout_state`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::{Api, Client};
use pko_engine::conditions::find_condition;
use pko_engine::label_selector::selector_matches;
use pko_engine::rollout::hosted_cluster_package::{package_state, OwnedPackage};
use pko_engine::rollout::rollout_decision::{
    decide_rollout, GateInput, RolloutDecision, RolloutSnapshot,
};
use pko_engine::rollout::rollout_guard;
use pko_engine::rollout::rollout_plan::{RolloutStrategy, UNKNOWN_GROUP};
use pko_engine::rollout::rollout_status::{rollout_state, RolloutState};
use pko_proto::core::hosted_cluster_package::{HostedClusterPackage, HostedClusterPackageStatus};
use pko_proto::core::package::{Package, PackageTemplateSpec};
use pko_proto::hypershift::HostedCluster;
use pko_proto::rollout_events::{RolloutEvent, RolloutEventKind, STREAM};
use pko_proto::well_known::HOSTED_CLUSTER_PACKAGE_LABEL;

use crate::args::{RolloutPlanArgs, RolloutStatusArgs};
use crate::cluster::{api, client, resource_and_name, revisioned_kind, RevisionedKind};

/// Where a followed rollout ended.
enum Verdict {
    Finished(String),
    /// Blocked by failing Packages: the command fails with this.
    Failing(String),
    /// `--watch=false` on a rollout under way.
    UnderWay,
}

/// `rollout status`: prints as it goes; the returned text is the final line.
pub async fn status(
    args: &RolloutStatusArgs,
    kubeconfig: Option<&PathBuf>,
) -> Result<String, String> {
    let (res, name) = resource_and_name(&args.positionals.args)?;
    let timeout = parse_duration(&args.timeout)?;
    let watch = args.watch.unwrap_or_else(|| {
        use std::io::IsTerminal;
        std::io::stdout().is_terminal()
    });
    let follow = async {
        match (res.as_str(), &args.nats_url) {
            (kind, Some(url)) if is_hosted_cluster_package(kind) => {
                follow_stream(url, args.nats_creds.as_ref(), &name, watch).await
            }
            (kind, None) if is_hosted_cluster_package(kind) => {
                follow_hosted_cluster_package(&client(kubeconfig).await?, &name, watch).await
            }
            (_, Some(_)) => Err("--nats-url follows HostedClusterPackages only".to_owned()),
            (kind, None) => {
                let kind = revisioned_kind(kind.trim_end_matches('s'), &args.namespace).ok_or_else(|| {
                    format!(
                        "rollout status takes hostedclusterpackage, package or objectdeployment, not {kind:?}"
                    )
                })?;
                follow_object(&client(kubeconfig).await?, &kind, &name, watch).await
            }
        }
    };
    let verdict = match timeout {
        Some(limit) => tokio::time::timeout(limit, follow)
            .await
            .map_err(|_| format!("timed out after {} waiting for {res}/{name}", args.timeout))??,
        None => follow.await?,
    };
    match verdict {
        Verdict::Finished(line) => Ok(line),
        Verdict::UnderWay => Ok(String::new()),
        Verdict::Failing(why) => Err(why),
    }
}

/// Go-style durations as kubectl takes them: `0`, `90s`, `5m`, `1h30m`, `500ms`. Zero means no limit.
fn parse_duration(text: &str) -> Result<Option<Duration>, String> {
    if text.is_empty() {
        return Ok(None);
    }
    let duration = pko_engine::rollout::rollout_policy::parse_duration(text).ok_or_else(|| {
        format!("invalid --timeout {text:?}: want a duration such as 30s, 5m or 1h")
    })?;
    Ok((!duration.is_zero()).then_some(duration))
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Whether `res` names a HostedClusterPackage (singular, plural or short).
pub(crate) fn is_hosted_cluster_package(res: &str) -> bool {
    matches!(
        res,
        "hostedclusterpackage" | "hostedclusterpackages" | "hcpkg"
    )
}

/// A (Cluster)Package or (Cluster)ObjectDeployment: done when its current generation is Available and
/// no longer Progressing; failing when a Package cannot unpack its image.
async fn follow_object(
    client: &Client,
    kind: &RevisionedKind,
    name: &str,
    watch: bool,
) -> Result<Verdict, String> {
    let api = api(client.clone(), &kind.owner, &kind.namespace);
    let what = format!("{}/{name}", kind.owner.kind.to_lowercase());
    let mut last = String::new();
    let mut objects = watcher::watch_object(api, name).boxed();
    while let Some(object) = objects.try_next().await.map_err(|e| e.to_string())? {
        let Some(object) = object else {
            return Err(format!("{what} not found"));
        };
        let generation = object.metadata.generation.unwrap_or_default();
        let conditions: Vec<Condition> = object
            .data
            .pointer("/status/conditions")
            .cloned()
            .and_then(|c| serde_json::from_value(c).ok())
            .unwrap_or_default();
        let current = |type_: &str| {
            find_condition(&conditions, type_).filter(|c| c.observed_generation == Some(generation))
        };
        let holds = |type_: &str, status: &str| current(type_).is_some_and(|c| c.status == status);
        if let Some(unpacked) = current("Unpacked").filter(|c| c.status == "False") {
            if unpacked.reason != "Unpacking" {
                return Ok(Verdict::Failing(format!(
                    "{what} cannot be unpacked ({}): {}",
                    unpacked.reason, unpacked.message
                )));
            }
        }
        if holds("Available", "True") && holds("Progressing", "False") {
            return Ok(Verdict::Finished(format!("{what} successfully rolled out")));
        }
        let line = format!(
            "Waiting for {what} generation {generation}: {}",
            ["Available", "Progressing"]
                .iter()
                .map(|t| match current(t) {
                    Some(c) => format!("{t}={} ({})", c.status, c.reason),
                    None => format!("{t} not yet observed"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
        if line != last {
            say(&line);
            last = line;
        }
        if !watch {
            return Ok(Verdict::UnderWay);
        }
    }
    Err(format!("the watch of {what} ended"))
}

/// A HostedClusterPackage, off its status as a watch delivers it.
async fn follow_hosted_cluster_package(
    client: &Client,
    name: &str,
    watch: bool,
) -> Result<Verdict, String> {
    let api: Api<HostedClusterPackage> = Api::all(client.clone());
    let packages: Api<Package> = Api::all(client.clone());
    let mut objects = watcher::watch_object(api, name).boxed();
    let mut last = String::new();
    while let Some(hcpkg) = objects.try_next().await.map_err(|e| e.to_string())? {
        let Some(hcpkg) = hcpkg else {
            return Err(format!("hostedclusterpackage/{name} not found"));
        };
        let generation = hcpkg.metadata.generation.unwrap_or_default();
        let status = hcpkg.status.clone().unwrap_or_default();
        let owned = packages
            .list(&ListParams::default().labels(&format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={name}")))
            .await
            .map_err(|e| format!("listing the Packages of {name}: {e}"))?
            .items;
        let report = status_report(
            name,
            generation,
            &hcpkg.spec.template,
            &status,
            &owned,
            Timestamp::now(),
        );
        if report != last {
            say(&report);
            last = report;
        }
        // Only a status written for the current generation says anything about it.
        if status.observed_generation == generation {
            match rollout_state(&status) {
                RolloutState::Finished => {
                    return Ok(Verdict::Finished(format!(
                    "hostedclusterpackage/{name} successfully rolled out (generation {generation})"
                )))
                }
                RolloutState::Halted => {
                    let why = status
                        .halted
                        .as_ref()
                        .map(|h| format!("{}: {}", h.reason, h.message))
                        .unwrap_or_default();
                    return Ok(Verdict::Failing(format!(
                        "hostedclusterpackage/{name} halted: {why}"
                    )));
                }
                RolloutState::Blocked if status.counts.failed_packages > 0 => {
                    let why = find_condition(&status.conditions, "Progressing")
                        .map(|c| c.message.clone())
                        .unwrap_or_default();
                    return Ok(Verdict::Failing(format!(
                        "hostedclusterpackage/{name} is blocked by failing Packages: {why}"
                    )));
                }
                _ => {}
            }
        }
        if !watch {
            return Ok(Verdict::UnderWay);
        }
    }
    Err(format!("the watch of hostedclusterpackage/{name} ended"))
}

/// The status as lines: the rollout's state, each partition in order, the Packages in flight or failing
/// with their phase and age, and why it is blocked.
fn status_report(
    name: &str,
    generation: i64,
    template: &PackageTemplateSpec,
    status: &HostedClusterPackageStatus,
    owned: &[Package],
    now: Timestamp,
) -> String {
    let c = &status.counts;
    let state = if status.observed_generation == generation {
        rollout_state(status).label()
    } else {
        "waiting for the manager"
    };
    let mut lines = vec![format!(
        "hostedclusterpackage/{name} generation {generation}: {state}, {}/{} updated, {}/{} available",
        c.updated_packages, c.total_packages, c.available_packages, c.total_packages
    )];
    let mut partitions = status.partitions.clone();
    partitions.sort_by_key(|p| p.order);
    for p in &partitions {
        let pc = &p.counts;
        let state = if p.state.is_empty() {
            String::new()
        } else {
            format!(" [{}]", p.state)
        };
        lines.push(format!(
            "  partition {} ({}){state}: {}/{} updated, {}/{} available",
            p.order,
            p.name,
            pc.updated_packages,
            pc.total_packages,
            pc.available_packages,
            pc.total_packages
        ));
        for check in &p.health_checks {
            lines.push(format!(
                "    health check {}: {} at {}: {}",
                check.name, check.state, check.checked_at, check.message
            ));
        }
    }
    // The manager's own rule says which of its Packages are in flight or failing.
    for package in owned {
        let owned = OwnedPackage::from(package.clone());
        let (state, failure) = package_state(template, &owned);
        if !state.updated || state.live || state.paused {
            continue;
        }
        let namespace = owned.meta.namespace.as_deref().unwrap_or_default();
        let since = package
            .status
            .as_ref()
            .and_then(|s| find_condition(&s.conditions, "Progressing"))
            .map(|c| c.last_transition_time.0);
        let age = since
            .and_then(|t| now.duration_since(t).try_into().ok())
            .map(|d: Duration| format!(", {}s", d.as_secs()))
            .unwrap_or_default();
        let phase = package
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("Pending");
        match failure {
            Some(why) => lines.push(format!("  failing: {namespace} ({phase}{age}): {why}")),
            None => lines.push(format!("  in flight: {namespace} ({phase}{age})")),
        }
    }
    if let Some(progressing) = find_condition(&status.conditions, "Progressing") {
        if status.observed_generation == generation
            && matches!(
                rollout_state(status),
                RolloutState::Blocked | RolloutState::Paused
            )
        {
            lines.push(format!("  {}: {}", progressing.reason, progressing.message));
        }
    }
    lines.extend(policy_lines(status).into_iter().map(|l| format!("  {l}")));
    lines.join("\n")
}

/// The rollout event stream: every event of the newest generation as it arrives; finished at its
/// `rolloutFinished`, failing at a `packageFailed`.
async fn follow_stream(
    url: &str,
    creds: Option<&PathBuf>,
    name: &str,
    watch: bool,
) -> Result<Verdict, String> {
    use async_nats::jetstream::{self, consumer::pull};
    let mut options = async_nats::ConnectOptions::new().name("kubectl-package");
    if let Some(path) = creds {
        options = async_nats::ConnectOptions::with_credentials_file(path)
            .await
            .map_err(|e| format!("reading {}: {e}", path.display()))?
            .name("kubectl-package");
    }
    let nats = options
        .connect(url)
        .await
        .map_err(|e| format!("connecting to {url}: {e}"))?;
    let stream = jetstream::new(nats)
        .get_stream(STREAM)
        .await
        .map_err(|e| format!("stream {STREAM}: {e}"))?;
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: format!(
                "{}.{}.>",
                pko_proto::rollout_events::SUBJECT_PREFIX,
                name.replace('.', "_")
            ),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("following {STREAM}: {e}"))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| format!("following {STREAM}: {e}"))?;
    // Events of older generations are history: only the newest generation's story decides.
    let mut newest: Option<(i64, Vec<RolloutEvent>)> = None;
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| format!("reading {STREAM}: {e}"))?;
        let caught_up = message.info().map(|i| i.pending == 0).unwrap_or(false);
        let Ok(event) = serde_json::from_slice::<RolloutEvent>(&message.payload) else {
            continue;
        };
        match &mut newest {
            Some((generation, events)) if *generation == event.generation => events.push(event),
            Some((generation, _)) if *generation > event.generation => {}
            _ => newest = Some((event.generation, vec![event])),
        }
        let Some((generation, events)) = &newest else {
            continue;
        };
        if let Some(event) = events.last() {
            say(&event_line(event));
        }
        // A failed Package that became available again since does not block.
        let failing = events.iter().enumerate().rev().find(|(at, e)| {
            e.kind == RolloutEventKind::PackageFailed
                && !events[at + 1..].iter().any(|later| {
                    later.kind == RolloutEventKind::PackageAvailable
                        && later.namespace == e.namespace
                })
        });
        if let (Some((_, failed)), true) = (failing, caught_up) {
            return Ok(Verdict::Failing(format!(
                "hostedclusterpackage/{name} generation {generation} is blocked by failing Package {}: {}",
                failed.namespace.as_deref().unwrap_or("?"),
                failed.message
            )));
        }
        if events
            .iter()
            .any(|e| e.kind == RolloutEventKind::RolloutFinished)
            && caught_up
        {
            return Ok(Verdict::Finished(format!(
                "hostedclusterpackage/{name} successfully rolled out (generation {generation})"
            )));
        }
        if caught_up && !watch {
            return Ok(Verdict::UnderWay);
        }
    }
    Err(format!("the stream {STREAM} ended"))
}

fn event_line(event: &RolloutEvent) -> String {
    let mut line = format!("generation {} {}", event.generation, event.kind.token());
    if let Some(group) = &event.group {
        line.push_str(&format!(" group={group}"));
    }
    if let Some(namespace) = &event.namespace {
        line.push_str(&format!(" namespace={namespace}"));
    }
    if !event.message.is_empty() {
        line.push_str(&format!(": {}", event.message));
    }
    line
}

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
    let hcpkg = Api::<HostedClusterPackage>::all(client.clone())
        .get(&name)
        .await
        .map_err(|e| format!("hostedclusterpackage/{name}: {e}"))?;
    let clusters = Api::<HostedCluster>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing HostedClusters: {e}"))?
        .items;
    let selector = &hcpkg.spec.hosted_cluster_selector;
    let empty = BTreeMap::new();
    let selected: Vec<Arc<HostedCluster>> = clusters
        .into_iter()
        .filter(|c| {
            selector_matches(selector, c.metadata.labels.as_ref().unwrap_or(&empty))
                .unwrap_or(false)
        })
        .map(Arc::new)
        .collect();
    let packages = Api::<Package>::all(client)
        .list(&ListParams::default().labels(&format!("{HOSTED_CLUSTER_PACKAGE_LABEL}={name}")))
        .await
        .map_err(|e| format!("listing the Packages of {name}: {e}"))?
        .items
        .into_iter()
        .map(OwnedPackage::from)
        .map(|p| (p.meta.namespace.clone().unwrap_or_default(), Arc::new(p)))
        .collect();
    let health = hcpkg
        .status
        .as_ref()
        .map(rollout_guard::stored_observations)
        .unwrap_or_default();
    let snapshot = RolloutSnapshot {
        hcpkg,
        packages,
        writing: Default::default(),
        clusters: selected,
        failures: BTreeMap::new(),
        // The plan is what happens once a promotion gate (if any) is open.
        gate: GateInput::Preview,
        // Health checks are the manager's to evaluate: the preview takes their last results.
        health,
    };
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
        let Some(state) = target.package else {
            continue;
        };
        if state.updated || plan.update.contains(&target.namespace) {
            continue;
        }
        let group = pko_engine::rollout::rollout_plan::group_key(
            target.label.as_deref(),
            input.partition.as_ref(),
        );
        let why = if state.paused {
            "paused".to_owned()
        } else if current.is_some_and(|g| g.name != group) {
            format!(
                "group {} waits for group {}",
                group_name(&group),
                current.map(|g| group_name(&g.name)).unwrap_or_default()
            )
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
    lines.extend(policy_lines(&step.status));
    lines.join("\n")
}

/// The rollout policy's conditions that hold, as lines: halted, awaiting approval, paused.
fn policy_lines(status: &HostedClusterPackageStatus) -> Vec<String> {
    [
        rollout_guard::HALTED,
        rollout_guard::AWAITING_APPROVAL,
        rollout_guard::ROLLOUT_PAUSED,
    ]
    .iter()
    .filter_map(|type_| find_condition(&status.conditions, type_))
    .filter(|c| c.status == "True")
    .map(|c| format!("{} ({}): {}", c.type_, c.reason, c.message))
    .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn timeouts_read_like_kubectl_durations() {
        assert_eq!(parse_duration("0").unwrap(), None);
        assert_eq!(
            parse_duration("90s").unwrap(),
            Some(Duration::from_secs(90))
        );
        assert_eq!(
            parse_duration("1h30m").unwrap(),
            Some(Duration::from_secs(5400))
        );
        assert_eq!(
            parse_duration("500ms").unwrap(),
            Some(Duration::from_millis(500))
        );
        for bad in ["5", "m", "5x", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

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
            recheck_after: None,
            health_due: Vec::new(),
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

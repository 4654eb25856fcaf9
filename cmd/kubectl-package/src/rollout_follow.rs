//! `rollout status`: where a rollout stands.
//!
//! `status` reads a HostedClusterPackage's status (partitions in order with their counts, the Packages in
//! flight, why it is blocked) off an apiserver watch, or follows the rollout event stream on JetStream with
//! `--nats-url`; for a (Cluster)Package or (Cluster)ObjectDeployment it follows Available and Progressing
//! of the current generation. Rollout states come from
//! `pko_engine::rollout::rollout_status::rollout_state`: the CLI never has rules of its own.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::watcher;
use kube::{Api, Client};
use pko_engine::conditions::find_condition;
use pko_engine::rollout::hosted_cluster_package::{package_state, OwnedPackage};
use pko_engine::rollout::rollout_guard;
use pko_engine::rollout::rollout_status::{rollout_state, RolloutState};
use pko_proto::core::hosted_cluster_package::{HostedClusterPackage, HostedClusterPackageStatus};
use pko_proto::core::package::{Package, PackageTemplateSpec};
use pko_proto::rollout_events::{RolloutEvent, RolloutEventKind, STREAM};
use pko_proto::well_known::HOSTED_CLUSTER_PACKAGE_LABEL;

use crate::args::RolloutStatusArgs;
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
        if p.waiting_for_window > 0 {
            let next = p
                .next_window_start
                .as_deref()
                .map_or_else(String::new, |at| format!(", the first opens at {at}"));
            lines.push(format!(
                "    {} waiting for their maintenance window{next}",
                p.waiting_for_window
            ));
        }
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
    for skipped in &status.skipped {
        lines.push(format!(
            "  skipped: {} {}: {}",
            skipped.namespace,
            skipped.comes_back(),
            skipped.reason
        ));
    }
    if let Some(progressing) = find_condition(&status.conditions, "Progressing") {
        if status.observed_generation == generation
            && matches!(
                rollout_state(status),
                RolloutState::Blocked | RolloutState::Paused | RolloutState::WaitingForWindow
            )
        {
            lines.push(format!("  {}: {}", progressing.reason, progressing.message));
        }
    }
    lines.extend(policy_lines(status).into_iter().map(|l| format!("  {l}")));
    lines.join("\n")
}

/// An ordered consumer of HostedClusterPackage `name`'s events on the rollout event stream, from its
/// oldest: how many events it held when it started, and its messages.
pub(crate) async fn rollout_stream(
    url: &str,
    creds: Option<&PathBuf>,
    name: &str,
) -> Result<(u64, async_nats::jetstream::consumer::pull::Ordered), String> {
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
    let held = consumer.cached_info().num_pending;
    let messages = consumer
        .messages()
        .await
        .map_err(|e| format!("following {STREAM}: {e}"))?;
    Ok((held, messages))
}

/// The rollout event stream: every event of the newest generation as it arrives; finished at its
/// `rolloutFinished`, failing at a `packageFailed`.
async fn follow_stream(
    url: &str,
    creds: Option<&PathBuf>,
    name: &str,
    watch: bool,
) -> Result<Verdict, String> {
    let (_, mut messages) = rollout_stream(url, creds, name).await?;
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

/// The rollout policy's conditions that hold, as lines: halted, awaiting approval, paused.
pub(crate) fn policy_lines(status: &HostedClusterPackageStatus) -> Vec<String> {
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
}

//! `rollout simulate hostedclusterpackage/NAME`: the manager's own planner run offline
//! (`pko_engine::rollout::rollout_simulation`) over the fleet as it is now, or as `--save` kept it, with
//! readiness times given or taken from the rollout event stream's history, a failure model, and policy
//! overrides to compare strategies before editing the object. It writes nothing (but `--save`'s file).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use pko_engine::fleet::promotion_gate::package_template_hash;
use pko_engine::rollout::preflight_gate::anything_to_update;
use pko_engine::rollout::rollout_decision::RolloutSnapshot;
use pko_engine::rollout::rollout_policy::parse_duration;
use pko_engine::rollout::rollout_simulation::{
    simulate as run, Ending, Simulation, SimulationModel,
};
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::rollout_events::{RolloutEvent, RolloutEventKind};
use serde_json::{json, Value};

use crate::args::RolloutSimulateArgs;
use crate::cluster::{client, resource_and_name};
use crate::fleet_snapshot::FleetSnapshot;
use crate::rollout_follow::{is_hosted_cluster_package, rollout_stream};

/// What a simulation ran on, as its heading says.
pub struct SimulationSetup {
    pub name: String,
    pub template_hash: String,
    pub clusters: usize,
    /// No release was under way: the next one was simulated.
    pub next_release: bool,
    /// Where the readiness time came from.
    pub readiness: String,
    pub model: SimulationModel,
}

pub async fn simulate(
    args: &RolloutSimulateArgs,
    kubeconfig: Option<&PathBuf>,
) -> Result<String, String> {
    let (res, name) = resource_and_name(&args.positionals.args)?;
    if !is_hosted_cluster_package(&res) {
        return Err(format!(
            "rollout simulate takes a hostedclusterpackage, not {res:?}"
        ));
    }
    if !matches!(args.output.as_str(), "" | "json") {
        return Err(format!("unknown output {:?}: want json", args.output));
    }
    let fleet = match &args.snapshot {
        Some(path) => FleetSnapshot::load(path)?,
        None => FleetSnapshot::read(&client(kubeconfig).await?, &name).await?,
    };
    if let Some(path) = &args.save {
        fleet.save(path)?;
        return Ok(format!(
            "hostedclusterpackage/{name}: {} HostedClusters and {} Packages saved to {}",
            fleet.hosted_clusters.len(),
            fleet.packages.len(),
            path.display()
        ));
    }
    let mut snapshot = fleet.rollout_snapshot();
    override_policy(&mut snapshot.hcpkg, &args.policy)?;
    // Nothing to roll out: what would the next release do?
    let next_release = !anything_to_update(&snapshot.hcpkg.spec.template, &snapshot.packages);
    if next_release {
        // Any other spec makes every Package outdated; nothing renders it.
        let image = &mut snapshot.hcpkg.spec.template.spec.image;
        *image = format!("{image} (the next release)");
    }
    let (readiness, readiness_of, source) = readiness(args, &name).await?;
    let model = SimulationModel {
        readiness,
        readiness_of,
        failing: failing(&args.fail, &snapshot)?,
        fail_rate: args.fail_rate,
        seed: args.seed,
        approve: !args.no_approve,
        ..SimulationModel::default()
    };
    if !(0.0..=1.0).contains(&model.fail_rate) {
        return Err(format!(
            "--fail-rate {} is not between 0 and 1",
            model.fail_rate
        ));
    }
    let setup = SimulationSetup {
        name,
        template_hash: package_template_hash(&snapshot.hcpkg.spec),
        clusters: snapshot.clusters.len(),
        next_release,
        readiness: source,
        model: model.clone(),
    };
    let simulation = run(snapshot, &model, Timestamp::now());
    if args.output == "json" {
        return serde_json::to_string_pretty(&simulation_json(&setup, &simulation))
            .map_err(|e| e.to_string());
    }
    Ok(simulation_text(&setup, &simulation))
}

/// `--policy key=value` applied to the spec: the strategy's budget and the policy's defaults.
fn override_policy(hcpkg: &mut HostedClusterPackage, overrides: &[String]) -> Result<(), String> {
    if overrides.is_empty() {
        return Ok(());
    }
    let mut spec = serde_json::to_value(&hcpkg.spec).map_err(|e| e.to_string())?;
    for text in overrides {
        let (key, value) = text
            .split_once('=')
            .ok_or_else(|| format!("--policy {text:?}: want key=value"))?;
        let number_or_text = |v: &str| v.parse::<i64>().map_or_else(|_| json!(v), |n| json!(n));
        match key {
            "maxUnavailable" => {
                spec["strategy"] = json!({"rollingUpgrade": {"maxUnavailable": number_or_text(value)}});
            }
            "minSuccessTime" | "progressDeadline" => {
                spec["rolloutPolicy"]["defaults"][key] = json!(value);
            }
            "maxFailures" => spec["rolloutPolicy"]["defaults"][key] = number_or_text(value),
            "rollback" => spec["rolloutPolicy"]["rollback"] = json!(value),
            _ => {
                return Err(format!(
                    "--policy {key}: want maxUnavailable, minSuccessTime, progressDeadline, maxFailures or rollback"
                ))
            }
        }
    }
    hcpkg.spec = serde_json::from_value(spec).map_err(|e| format!("--policy: {e}"))?;
    Ok(())
}

/// The namespaces of `--fail clusters=...` (HostedCluster names or their HCP namespaces).
fn failing(
    fails: &[String],
    snapshot: &RolloutSnapshot,
) -> Result<std::collections::BTreeSet<String>, String> {
    let namespace_of: BTreeMap<String, String> = snapshot
        .clusters
        .iter()
        .filter_map(|c| {
            let ns = c.hosted_control_plane_namespace()?;
            Some([(c.metadata.name.clone()?, ns.clone()), (ns.clone(), ns)])
        })
        .flatten()
        .collect();
    let mut failing = std::collections::BTreeSet::new();
    for fail in fails {
        let names = fail
            .strip_prefix("clusters=")
            .ok_or_else(|| format!("--fail {fail:?}: want clusters=NAME,..."))?;
        for name in names.split(',').filter(|n| !n.is_empty()) {
            let ns = namespace_of.get(name).ok_or_else(|| {
                format!("--fail: {name} is no HostedCluster this rollout selects")
            })?;
            failing.insert(ns.clone());
        }
    }
    Ok(failing)
}

type Readiness = (Duration, BTreeMap<String, Duration>, String);

/// How long a written Package takes to be live: given, from the stream's history, or 30 s.
async fn readiness(args: &RolloutSimulateArgs, name: &str) -> Result<Readiness, String> {
    if let Some(text) = &args.readiness {
        let given = parse_duration(text).ok_or_else(|| {
            format!("invalid --readiness {text:?}: want a duration such as 30s or 5m")
        })?;
        return Ok((given, BTreeMap::new(), format!("{} (given)", clock(given))));
    }
    let default = SimulationModel::default().readiness;
    let Some(url) = &args.nats_url else {
        let note = format!(
            "{} (assumed: give --readiness, or --nats-url for the history)",
            clock(default)
        );
        return Ok((default, BTreeMap::new(), note));
    };
    let of = history(url, args.nats_creds.as_ref(), name).await?;
    let mut all: Vec<Duration> = of.values().copied().collect();
    all.sort();
    match all.get(all.len() / 2) {
        Some(median) => {
            let note = format!(
                "{} (median of {} Packages in the stream's history; each its own)",
                clock(*median),
                all.len()
            );
            Ok((*median, of, note))
        }
        None => Ok((
            default,
            of,
            format!("{} (assumed: the stream has no history)", clock(default)),
        )),
    }
}

/// From the rollout event stream: per namespace, the time from its last `packageUpdated` to the
/// `packageAvailable` after it (both stamped by the NATS server: one clock).
async fn history(
    url: &str,
    creds: Option<&PathBuf>,
    name: &str,
) -> Result<BTreeMap<String, Duration>, String> {
    let (held, mut messages) = rollout_stream(url, creds, name).await?;
    let mut took = BTreeMap::new();
    if held == 0 {
        return Ok(took);
    }
    let mut updated = BTreeMap::new();
    while let Some(message) = messages.next().await {
        let message = message.map_err(|e| format!("reading the rollout event stream: {e}"))?;
        let Ok(info) = message.info() else {
            continue;
        };
        let (published, pending) = (info.published, info.pending);
        if let Ok(event) = serde_json::from_slice::<RolloutEvent>(&message.payload) {
            if let Some(ns) = event.namespace.clone() {
                match event.kind {
                    RolloutEventKind::PackageUpdated => {
                        updated.insert((event.generation, ns), published);
                    }
                    RolloutEventKind::PackageAvailable => {
                        if let Some(at) = updated.remove(&(event.generation, ns.clone())) {
                            let ms = (published - at).whole_milliseconds().max(0);
                            took.insert(ns, Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
                        }
                    }
                    _ => {}
                }
            }
        }
        if pending == 0 {
            break;
        }
    }
    Ok(took)
}

/// A simulated time: `0s`, `45s`, `10m30s`, `2h5m`.
pub fn clock(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    let mut out = String::new();
    if h > 0 {
        let _ = write!(out, "{h}h");
    }
    if m > 0 {
        let _ = write!(out, "{m}m");
    }
    if s > 0 || out.is_empty() {
        let _ = write!(out, "{s}s");
    }
    out
}

fn at(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_owned(), |d| format!("+{}", clock(d)))
}

fn ending_text(ending: &Ending, ended_at: Duration) -> String {
    let when = format!("+{}", clock(ended_at));
    match ending {
        Ending::Finished => format!("finished at {when}: every Package updated and live, every group soaked"),
        Ending::Halted { reason, message } => format!(
            "halted at {when} ({reason}): {message} Nothing more is written until a new template or an undo."
        ),
        Ending::RolledBack { reason, message } => format!(
            "rolled back by {when} ({reason}): {message} Every Package is back on the last good template."
        ),
        Ending::Stuck(why) => format!("waits from {when}: {why}"),
        Ending::Invalid(why) => format!("cannot be rolled out: {why}"),
        Ending::Horizon => format!("still rolling out at {when}, the simulation's horizon"),
    }
}

/// The simulation as text: its setup, the waves, each group's moments, the peak, the ending.
pub fn simulation_text(setup: &SimulationSetup, s: &Simulation) -> String {
    let mut out = String::new();
    let release = if setup.next_release {
        "the next release (every Package is on the current template)".to_owned()
    } else {
        format!("template {}", setup.template_hash)
    };
    let _ = writeln!(
        out,
        "hostedclusterpackage/{}: {release}, simulated over {} HostedClusters",
        setup.name, setup.clusters
    );
    let strategy = match s.budget {
        0 => "instant".to_owned(),
        n => format!("rollingUpgrade, maxUnavailable {n}"),
    };
    let failing: Vec<&str> = setup.model.failing.iter().map(String::as_str).collect();
    let failures = match (failing.is_empty(), setup.model.fail_rate > 0.0) {
        (true, false) => "none".to_owned(),
        (false, false) => failing.join(", "),
        (true, true) => format!(
            "{}% at random (seed {})",
            setup.model.fail_rate * 100.0,
            setup.model.seed
        ),
        (false, true) => format!(
            "{} and {}% at random (seed {})",
            failing.join(", "),
            setup.model.fail_rate * 100.0,
            setup.model.seed
        ),
    };
    let approvals = if setup.model.approve {
        "given when asked"
    } else {
        "not given"
    };
    let _ = writeln!(
        out,
        "  {strategy} · readiness {} · failures: {failures} · approvals {approvals}",
        setup.readiness
    );
    let _ = writeln!(
        out,
        "\nwaves (time since the start, group, Packages written):"
    );
    if s.waves.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for wave in &s.waves {
        let group = wave.group.as_deref().unwrap_or("-");
        let mut writes = Vec::new();
        if !wave.created.is_empty() {
            writes.push(format!("create {}", wave.created.join(", ")));
        }
        if !wave.updated.is_empty() {
            let back = if wave.rollback {
                " (back to the last good template)"
            } else {
                ""
            };
            writes.push(format!("update {}{back}", wave.updated.join(", ")));
        }
        let _ = writeln!(
            out,
            "  {:<9} {group:<10} {}",
            at(Some(wave.at)),
            writes.join("; ")
        );
    }
    let _ = writeln!(out, "\ngroups (in order):");
    for g in &s.groups {
        let mut moments = Vec::new();
        if let Some(when) = g.awaiting_approval {
            moments.push(format!("awaits approval {}", at(Some(when))));
        }
        if let Some(when) = g.waiting_for_window {
            moments.push(format!("waits for its window {}", at(Some(when))));
        }
        moments.push(format!("started {}", at(g.started)));
        if let Some(when) = g.soaking {
            moments.push(format!("soaking {}", at(Some(when))));
        }
        moments.push(format!("finished {}", at(g.finished)));
        if let (Some(start), Some(end)) = (g.started, g.finished) {
            moments.push(format!("took {}", clock(end.saturating_sub(start))));
        }
        let _ = writeln!(out, "  {:<10} {}", g.name, moments.join(" · "));
    }
    let _ = writeln!(
        out,
        "\npeak unavailable: {} (maxUnavailable {})",
        s.peak_unavailable, s.budget
    );
    if !s.failed.is_empty() {
        let _ = writeln!(out, "failed: {}", s.failed.join(", "));
    }
    let _ = writeln!(out, "ends: {}", ending_text(&s.ending, s.ended_at));
    out
}

/// The simulation as data (`-o json`): times in seconds since the start.
fn simulation_json(setup: &SimulationSetup, s: &Simulation) -> Value {
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs());
    let (ending, reason, message) = match &s.ending {
        Ending::Finished => ("Finished", "", ""),
        Ending::Halted { reason, message } => ("Halted", reason.as_str(), message.as_str()),
        Ending::RolledBack { reason, message } => ("RolledBack", reason.as_str(), message.as_str()),
        Ending::Stuck(why) => ("Waits", "", why.as_str()),
        Ending::Invalid(why) => ("Invalid", "", why.as_str()),
        Ending::Horizon => ("Horizon", "", ""),
    };
    json!({
        "hostedClusterPackage": setup.name,
        "templateHash": setup.template_hash,
        "nextRelease": setup.next_release,
        "hostedClusters": setup.clusters,
        "readiness": setup.readiness,
        "maxUnavailable": s.budget,
        "waves": s.waves.iter().map(|w| json!({
            "atSeconds": w.at.as_secs(), "group": w.group, "created": w.created, "updated": w.updated,
            "rollback": w.rollback,
        })).collect::<Vec<_>>(),
        "groups": s.groups.iter().map(|g| json!({
            "name": g.name,
            "startedSeconds": secs(g.started),
            "awaitingApprovalSeconds": secs(g.awaiting_approval),
            "waitingForWindowSeconds": secs(g.waiting_for_window),
            "soakingSeconds": secs(g.soaking),
            "finishedSeconds": secs(g.finished),
        })).collect::<Vec<_>>(),
        "peakUnavailable": s.peak_unavailable,
        "failed": s.failed,
        "ending": {"kind": ending, "reason": reason, "message": message, "atSeconds": s.ended_at.as_secs()},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_times_read_like_durations() {
        assert_eq!(clock(Duration::ZERO), "0s");
        assert_eq!(clock(Duration::from_secs(45)), "45s");
        assert_eq!(clock(Duration::from_secs(630)), "10m30s");
        assert_eq!(clock(Duration::from_secs(7500)), "2h5m");
    }
}

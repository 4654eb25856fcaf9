//! What maintenance windows and skips cost a rollout decision: `decide_rollout` over fleets of N
//! HostedClusters, half their Packages in flight (so every progress deadline counts open time), without
//! a calendar (the baseline, in the same process) and with one: every cluster in one of ten windows in
//! several time zones, a soak, and 5 % of the clusters skipped. No servers: the decision is pure.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use pko_actors::engine::rollout::hosted_cluster_package::OwnedPackage;
use pko_actors::engine::rollout::rollout_decision::{
    decide_rollout, GateInput, RolloutDecision, RolloutSnapshot,
};
use pko_proto::core::hosted_cluster_package::HostedClusterPackage;
use pko_proto::hypershift::HostedCluster;
use pko_proto::well_known::MAINTENANCE_WINDOW_LABEL;
use serde_json::{json, Value};

const TIME_ZONES: [&str; 5] = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Asia/Tokyo",
    "Australia/Sydney",
];

fn snapshot(clusters: usize, calendar: bool, now: Timestamp) -> Result<RolloutSnapshot, String> {
    let windows: Vec<Value> = (0..10)
        .map(|i| {
            json!({"name": format!("w{i}"), "schedule": format!("{} {} * * Mon-Fri", i * 5, i * 2),
                   "duration": "3h", "timeZone": TIME_ZONES[i % TIME_ZONES.len()]})
        })
        .collect();
    let skipped: Vec<String> = (0..clusters / 20)
        .map(|i| format!("clusters-hc-{i}"))
        .collect();
    let policy = if calendar {
        json!({"maintenanceWindows": windows, "defaults": {"progressDeadline": "1h", "minSuccessTime": "30m"},
               "skip": [{"namespaces": skipped, "until": "2099-01-01T00:00:00Z", "reason": "bench"}]})
    } else {
        json!({"defaults": {"progressDeadline": "1h", "minSuccessTime": "30m"}})
    };
    let since = Timestamp::from_second(now.as_second() - 20 * 3600).map_err(|e| e.to_string())?;
    let processing: Vec<Value> = (0..clusters / 2)
        .map(|i| json!({"namespace": format!("clusters-hc-{i}"), "name": "addon", "uid": format!("p{i}"), "since": since.to_string()}))
        .collect();
    let hcpkg: HostedClusterPackage = serde_json::from_value(json!({
        "apiVersion": "package-operator.run/v1alpha1", "kind": "HostedClusterPackage",
        "metadata": {"name": "addon", "uid": "u", "generation": 2},
        "spec": {"strategy": {"rollingUpgrade": {"maxUnavailable": clusters / 2}},
                 "template": {"spec": {"image": "registry/addon:v2"}}, "rolloutPolicy": policy},
        "status": {"processing": processing},
    }))
    .map_err(|e| e.to_string())?;
    let mut hosted = Vec::new();
    let mut packages = BTreeMap::new();
    for i in 0..clusters {
        let mut labels = BTreeMap::new();
        if calendar {
            labels.insert(MAINTENANCE_WINDOW_LABEL.to_owned(), format!("w{}", i % 10));
        }
        let cluster: HostedCluster = serde_json::from_value(json!({
            "metadata": {"name": format!("hc-{i}"), "namespace": "clusters", "labels": labels},
            "status": {"conditions": [{"type": "Available", "status": "True"}]},
        }))
        .map_err(|e| e.to_string())?;
        hosted.push(Arc::new(cluster));
        let (image, progressing) = if i < clusters / 2 {
            ("registry/addon:v2", "True")
        } else {
            ("registry/addon:v1", "False")
        };
        let package: pko_proto::core::package::Package = serde_json::from_value(json!({
            "apiVersion": "package-operator.run/v1alpha1", "kind": "Package",
            "metadata": {"name": "addon", "namespace": format!("clusters-hc-{i}"), "uid": format!("p{i}"), "generation": 1},
            "spec": {"image": image},
            "status": {"conditions": [
                {"type": "Available", "status": "True", "reason": "R", "message": "m", "observedGeneration": 1,
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Progressing", "status": progressing, "reason": "R", "message": "m", "observedGeneration": 1,
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }))
        .map_err(|e| e.to_string())?;
        packages.insert(
            format!("clusters-hc-{i}"),
            Arc::new(OwnedPackage::from(package)),
        );
    }
    Ok(RolloutSnapshot {
        hcpkg,
        packages,
        writing: BTreeMap::new(),
        clusters: hosted,
        failures: BTreeMap::new(),
        gate: GateInput::Preview,
        health: BTreeMap::new(),
        preflight: None,
    })
}

/// The median time of `runs` decisions.
fn median_decision(
    snapshot: &RolloutSnapshot,
    now: Timestamp,
    runs: usize,
) -> Result<Duration, String> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        let decision = decide_rollout(snapshot, now);
        times.push(started.elapsed());
        if let RolloutDecision::Invalid(status) = decision {
            return Err(format!("invalid spec: {:?}", status.conditions));
        }
    }
    times.sort();
    Ok(times[times.len() / 2])
}

pub fn run(sizes: &[usize], runs: usize) -> Result<(), String> {
    // A Tuesday morning: some windows open, some closed.
    let now: Timestamp = "2026-12-01T09:30:00Z".parse().map_err(|e| format!("{e}"))?;
    println!("decide_rollout, median of {runs} (half the Packages in flight 20 h, deadlines counting open time):");
    println!(
        "{:>10} {:>14} {:>16} {:>7}",
        "clusters", "no calendar", "10 windows+skip", "ratio"
    );
    for &n in sizes {
        let plain = median_decision(&snapshot(n, false, now)?, now, runs)?;
        let calendar = median_decision(&snapshot(n, true, now)?, now, runs)?;
        println!(
            "{n:>10} {:>12.2}ms {:>14.2}ms {:>7.2}",
            plain.as_secs_f64() * 1e3,
            calendar.as_secs_f64() * 1e3,
            calendar.as_secs_f64() / plain.as_secs_f64()
        );
    }
    Ok(())
}
